//! Capacity (COST_MODEL.md §9): pools, the intervals their nodes are paid for, and where
//! every paid GPU-hour went — a job, the idle or down time of a named node, charged to a
//! project or kept on its pool's line.
//!
//! Figures are read in the reader's snapshot from the intervals and the capacity rollup
//! (GPU-seconds only; see [`crate::ledger::capacity_rollup`]), and priced by the contracts
//! and FX rates in force: a price, contract or rate change is seen by the next read, and
//! nothing is stored that a change could leave stale. Writers of intervals hold each node's
//! advisory lock while they check for overlaps and rewrite the node's rollup rows, so two
//! requests racing for one node cannot both store overlapping intervals.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::billed::{BilledCapacity, BilledPrice, ChargedRun, bill_capacity};
use crate::domain::capacity::{
    CapacityInterval, CapacitySeconds, PoolSettings, PriceBook, ShareIdle, allocate,
    contracts_pricing,
};
use crate::domain::capacity_plan::{Detail, Plan, RollupSums, WindowFigures};
use crate::domain::figures::{FigureSums, Grouping, SUM_SCALE};
use crate::domain::ledger_time::{LedgerHour, SECONDS_PER_HOUR, month_bounds};
use crate::domain::rating::{BillingMode, Contract, FxRates};
use crate::domain::record::format_time;
use crate::domain::validation::FieldError;
use crate::domain::values::Month;
use crate::domain::what_if::{Override, WhatIf};
use crate::ledger::{LedgerError, LedgerResult, audit, capacity_rollup};
use crate::store;
use crate::store::capacity::{IntervalsOf, NodeSpan, PoolRow};
use crate::store::fx_rates::RateTable;

/// A pool as the API shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PoolView {
    pub id: String,
    pub name: String,
    /// The project its idle and down time is charged to under `owner`, and whose scope
    /// its nodes' contracts are matched with.
    pub owner_project: Option<String>,
    /// `owner`, `by_usage` or `pool`.
    #[schema(value_type = String, example = "owner")]
    pub share_idle: ShareIdle,
    /// Idle time after which a node up with no job fires a `zombie_capacity` alert; null
    /// when the pool fires none.
    pub zombie_after_minutes: Option<i32>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<PoolRow> for PoolView {
    fn from(row: PoolRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            owner_project: row.owner_project,
            share_idle: row.share_idle,
            zombie_after_minutes: row.zombie_after_minutes,
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

/// Creates or changes a pool; `true` with it when it was created.
pub async fn put_pool(
    pool: &PgPool,
    id: &str,
    settings: &PoolSettings,
    actor: &Actor,
) -> LedgerResult<(PoolView, bool)> {
    let mut tx = pool.begin().await?;
    let before = store::capacity::get_pool_for_update(&mut tx, id).await?;
    let (view, created) = match store::capacity::put_pool(&mut tx, id, settings).await {
        Ok((row, created)) => (PoolView::from(row), created),
        Err(error) if store::is_constraint_violation(&error, store::capacity::OWNER_CONSTRAINT) => {
            return Err(LedgerError::invalid("/owner_project", "no such project"));
        }
        Err(error) => return Err(error.into()),
    };
    let change = Change::new(
        "pool",
        id,
        if created { "create" } else { "update" },
        before.map(|row| audit::snapshot(&PoolView::from(row))),
        Some(audit::snapshot(&view)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok((view, created))
}

/// An interval as the audit log keeps it: as it was posted.
pub fn interval_snapshot(interval: &CapacityInterval) -> serde_json::Value {
    serde_json::json!({
        "node": interval.node,
        "pool": interval.pool,
        "gpu_model": interval.gpu_model,
        "gpus": interval.gpus,
        "billing_mode": interval.billing_mode.as_str(),
        "provider": interval.provider,
        "region": interval.region,
        "labels": interval.labels,
        "from": interval.from,
        "until": interval.until,
        "state": interval.state.as_str(),
    })
}

/// The key an interval is stored and audited under: its node and start.
fn interval_id(node: &str, from: DateTime<Utc>) -> String {
    format!("{node}@{}", format_time(from))
}

pub async fn get_pool(pool: &PgPool, id: &str) -> LedgerResult<PoolView> {
    let mut conn = pool.acquire().await?;
    store::capacity::get_pool(&mut conn, id)
        .await?
        .map(PoolView::from)
        .ok_or_else(|| LedgerError::NotFound(format!("no pool `{id}`")))
}

pub async fn list_pools(pool: &PgPool) -> LedgerResult<Vec<PoolView>> {
    let mut conn = pool.acquire().await?;
    Ok(store::capacity::list_pools(&mut conn)
        .await?
        .into_iter()
        .map(PoolView::from)
        .collect())
}

/// The owner project of each pool `intervals` name; a pool that does not exist is reported
/// at the first interval naming it.
pub async fn pool_owners(
    pool: &PgPool,
    intervals: &[CapacityInterval],
) -> LedgerResult<BTreeMap<String, Option<String>>> {
    let ids: Vec<String> = intervals
        .iter()
        .map(|i| i.pool.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut conn = pool.acquire().await?;
    let owners: BTreeMap<String, Option<String>> = store::capacity::pools_by_ids(&mut conn, &ids)
        .await?
        .into_iter()
        .map(|row| (row.id, row.owner_project))
        .collect();
    Ok(owners)
}

/// What `POST /v1/capacity` did.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CapacityReceipt {
    /// Intervals stored for the first time.
    pub inserted: usize,
    /// Intervals stored before with the same content: nothing changed.
    pub duplicates: usize,
    /// Intervals that replaced what was stored under their `(node, from)` (`PUT` only).
    pub replaced: usize,
}

/// Stores `intervals` (parsed, sorted by node and start), all or nothing. Each is
/// identified by `(node, from)`: sent again with the same content it is a duplicate; with
/// other content it is refused (409) unless `replace`. One that overlaps another interval
/// of its node is refused (422) with the other's extent.
pub async fn post_capacity(
    pool: &PgPool,
    intervals: Vec<CapacityInterval>,
    replace: bool,
    tz: Tz,
    actor: &Actor,
) -> LedgerResult<CapacityReceipt> {
    let mut tx = pool.begin().await?;
    let ids: Vec<String> = intervals
        .iter()
        .map(|i| i.pool.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let known: HashSet<String> = store::capacity::pools_by_ids(&mut tx, &ids)
        .await?
        .into_iter()
        .map(|row| row.id)
        .collect();
    let unknown: Vec<FieldError> = intervals
        .iter()
        .enumerate()
        .filter(|(_, interval)| !known.contains(&interval.pool))
        .map(|(index, interval)| {
            FieldError::new(
                format!("/{index}/pool"),
                format!(
                    "no pool `{}`; create it with PUT /v1/pools/{}",
                    interval.pool, interval.pool
                ),
            )
        })
        .collect();
    if !unknown.is_empty() {
        return Err(LedgerError::Invalid(unknown));
    }
    let nodes: Vec<&str> = intervals.iter().map(|i| i.node.as_str()).collect();
    store::capacity::lock_nodes(&mut tx, &nodes).await?;
    let hashes: Vec<Vec<u8>> = intervals
        .iter()
        .map(CapacityInterval::content_hash)
        .collect();
    let mut receipt = CapacityReceipt::default();
    let mut same_key: HashMap<usize, bool> = HashMap::new();
    let mut overlaps = Vec::new();
    let mut conflicts = Vec::new();
    let mut replaced_spans = Vec::new();
    for stored in store::capacity::meeting(&mut tx, &intervals).await? {
        let index = stored.position as usize;
        let interval = &intervals[index];
        if stored.from_at == interval.from {
            let unchanged = stored.content_hash == hashes[index];
            if !unchanged {
                replaced_spans.push((stored.node.clone(), stored.from_at, stored.until_at));
            }
            if !unchanged && !replace {
                conflicts.push(FieldError::new(
                    format!("/{index}"),
                    format!(
                        "node `{}` from {} is stored with other content; PUT /v1/capacity \
                         replaces it",
                        interval.node,
                        format_time(interval.from)
                    ),
                ));
            }
            same_key.insert(index, unchanged);
        } else {
            overlaps.push(FieldError::new(
                format!("/{index}/from"),
                format!(
                    "overlaps the stored interval of node `{}` from {} until {}",
                    stored.node,
                    format_time(stored.from_at),
                    format_time(stored.until_at)
                ),
            ));
        }
    }
    if !overlaps.is_empty() {
        return Err(LedgerError::Invalid(overlaps));
    }
    if !conflicts.is_empty() {
        return Err(LedgerError::Conflict(
            "an interval is stored under the same node and start with other content".to_owned(),
            conflicts,
        ));
    }
    let mut to_store = Vec::new();
    let mut to_hash = Vec::new();
    for (index, interval) in intervals.into_iter().enumerate() {
        match same_key.get(&index) {
            Some(true) => receipt.duplicates += 1,
            Some(false) => {
                receipt.replaced += 1;
                to_store.push(interval);
                to_hash.push(hashes[index].clone());
            }
            None => {
                receipt.inserted += 1;
                to_store.push(interval);
                to_hash.push(hashes[index].clone());
            }
        }
    }
    if !to_store.is_empty() {
        let keys: Vec<(String, DateTime<Utc>)> =
            to_store.iter().map(|i| (i.node.clone(), i.from)).collect();
        let replaced: HashMap<(String, DateTime<Utc>), CapacityInterval> =
            store::capacity::stored_under(&mut tx, &keys)
                .await?
                .into_iter()
                .map(|stored| ((stored.node.clone(), stored.from), stored))
                .collect();
        let changes: Vec<Change> = to_store
            .iter()
            .map(|interval| {
                let before = replaced.get(&(interval.node.clone(), interval.from));
                Change::new(
                    "capacity_interval",
                    interval_id(&interval.node, interval.from),
                    if before.is_some() {
                        "replace"
                    } else {
                        "create"
                    },
                    before.map(interval_snapshot),
                    Some(interval_snapshot(interval)),
                )
            })
            .collect();
        store::capacity::upsert(&mut tx, &to_store, &to_hash, None).await?;
        // The days the stored intervals cover, and those of the intervals they replaced.
        let spans: Vec<(String, DateTime<Utc>, DateTime<Utc>)> = to_store
            .iter()
            .map(|i| (i.node.clone(), i.from, i.until))
            .chain(replaced_spans)
            .collect();
        capacity_rollup::refresh_spans(&mut tx, spans, tz).await?;
        audit::record(&mut tx, actor, changes).await?;
    }
    tx.commit().await?;
    Ok(receipt)
}

/// Capacity of a window as read: its figures in GPU-seconds, and what prices them.
pub struct CapacityWindow {
    pub window: (DateTime<Utc>, DateTime<Utc>),
    pub figures: WindowFigures,
    pub pools: BTreeMap<String, PoolRow>,
    /// The contracts pricing the figures, at the prices asked for.
    contracts: HashMap<Uuid, Contract>,
    /// What bills give the nodes' time, by price id: billed wins over contracts.
    pub billed: BTreeMap<Uuid, BilledPrice>,
    /// FX rates of the window's months.
    fx: RateTable,
    /// The currency of every project the figures may charge.
    pub currencies: BTreeMap<String, String>,
    /// The idle and down time of every node-day as charged (see [`CapacityWindow::charges`]),
    /// worked out once when read.
    charges: Vec<Charge>,
}

/// One part of the idle or down time of one node-day, to charge.
#[derive(Debug, Clone)]
pub struct Charge {
    /// The project charged; `None` for time kept on the pool's line.
    pub project: Option<String>,
    pub pool: String,
    pub day: NaiveDate,
    pub month: NaiveDate,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    /// The contract pricing the time.
    pub contract_id: Option<Uuid>,
    /// In the contract's currency; `None` when no contract prices the time.
    pub price: Option<(Decimal, String)>,
    pub idle_seconds: Decimal,
    pub down_seconds: Decimal,
}

impl Charge {
    /// Idle and down cost in `currency`; `None` when unpriced or a rate is missing.
    fn cost_in(&self, currency: &str, fx: &RateTable) -> Option<(Decimal, Decimal)> {
        let (price, from) = self.price.as_ref()?;
        let rate = fx.conversion(self.month, from, currency)?;
        let cost =
            |seconds: Decimal| (seconds * *price * rate / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
        Some((cost(self.idle_seconds), cost(self.down_seconds)))
    }
}

impl CapacityWindow {
    /// Reads the capacity of `pools` (every pool when `None`) over `[from, to)`, per node
    /// as well with [`Detail::Nodes`].
    pub async fn load(
        conn: &mut PgConnection,
        pools: Option<&[String]>,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
        detail: Detail,
    ) -> LedgerResult<Self> {
        let mut window = Self {
            window: (from, to),
            figures: WindowFigures::default(),
            pools: BTreeMap::new(),
            contracts: HashMap::new(),
            billed: BTreeMap::new(),
            fx: RateTable::default(),
            currencies: BTreeMap::new(),
            charges: Vec::new(),
        };
        if to <= from {
            return Ok(window);
        }
        let intervals =
            store::capacity::intervals(conn, IntervalsOf::Pools(pools), from, to).await?;
        if intervals.is_empty() {
            return Ok(window);
        }
        let pool_ids: Vec<String> = distinct(intervals.iter().map(|i| i.pool.clone()));
        window.pools = store::capacity::pools_by_ids(conn, &pool_ids)
            .await?
            .into_iter()
            .map(|row| (row.id.clone(), row))
            .collect();
        let owners: HashMap<String, Option<String>> = window
            .pools
            .values()
            .map(|row| (row.id.clone(), row.owner_project.clone()))
            .collect();
        let contracts = contracts_for(conn, &intervals, what_if).await?;
        let billed = billed_capacity(conn, &intervals, (from, to)).await?;
        let book = PriceBook {
            owners: &owners,
            contracts: &contracts,
            billed: &billed.spans,
        };
        let plan = Plan::new(&intervals, &book, (from, to), tz, detail);
        let (mut sums, mut rows, mut unmatched) = (RollupSums::default(), Vec::new(), Vec::new());
        if let Some((first, end)) = plan.inside_days() {
            let (one_price, several) = plan.pools_by_pricing();
            if !one_price.is_empty() {
                sums = store::capacity::node_day_sums(conn, &one_price, first, end, detail).await?;
            }
            if !several.is_empty() {
                rows = store::capacity::node_days(conn, Some(&several), first, end).await?;
            }
            unmatched = store::capacity::unmatched_days(conn, plan.nodes(), first, end).await?;
        }
        // Node-days the rollup cannot give whole are set against every interval of their
        // nodes, hour by hour.
        let hourly: Vec<NodeSpan> = plan
            .hourly()
            .into_iter()
            .map(|(node, from, to)| NodeSpan { node, from, to })
            .collect();
        let (hour_intervals, hour_usage) = match (
            hourly.iter().map(|s| s.from).min(),
            hourly.iter().map(|s| s.to).max(),
        ) {
            (Some(since), Some(until)) => {
                let nodes = distinct(hourly.iter().map(|s| s.node.clone()));
                let intervals =
                    store::capacity::intervals(conn, IntervalsOf::Nodes(&nodes), since, until)
                        .await?;
                (
                    intervals,
                    store::capacity::usage_hours(conn, &hourly).await?,
                )
            }
            _ => (Vec::new(), Vec::new()),
        };
        window.figures = plan.finish(
            &sums,
            &rows,
            &unmatched,
            &hour_intervals,
            &hour_usage,
            &book,
        );
        // `by_usage` shares are of whole ledger months, however much of them the window has.
        let by_usage: Vec<String> = window
            .pools
            .values()
            .filter(|row| row.share_idle == ShareIdle::ByUsage)
            .map(|row| row.id.clone())
            .collect();
        if !by_usage.is_empty() {
            let months = (
                LedgerHour::holding(from, tz).month,
                LedgerHour::holding(to - chrono::TimeDelta::nanoseconds(1), tz)
                    .month
                    .checked_add_months(chrono::Months::new(1))
                    .expect("a month before the end of time"),
            );
            window.figures.usage =
                store::capacity::usage_weights(conn, &by_usage, months.0, months.1).await?;
        }
        window.contracts = contracts.into_iter().map(|c| (c.id, c)).collect();
        window.billed = billed.prices;
        let mut projects: Vec<String> = window
            .pools
            .values()
            .filter_map(|row| row.owner_project.clone())
            .collect();
        for shares in window.figures.usage.values() {
            projects.extend(shares.keys().cloned());
        }
        let projects = distinct(projects.into_iter());
        window.currencies = store::capacity::project_currencies(conn, &projects).await?;
        let mut to_currencies: Vec<String> = window.currencies.values().cloned().collect();
        to_currencies.extend(window.contracts.values().map(|c| c.currency.clone()));
        to_currencies.extend(window.billed.values().map(|p| p.currency.clone()));
        let to_currencies = distinct(to_currencies.into_iter());
        let months: Vec<NaiveDate> = window.figures.days.iter().map(|d| d.month).collect();
        if let (Some(first), Some(last)) = (months.iter().min(), months.iter().max()) {
            window.fx = store::fx_rates::table(conn, *first, *last, &to_currencies).await?;
        }
        window.charges = window.charged();
        Ok(window)
    }

    /// The capacity over `window` of the pools that may charge `project` (see
    /// [`CapacityWindow::charges`]); nothing is read when there are none.
    pub async fn charging(
        conn: &mut PgConnection,
        project: &str,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        let pools = store::capacity::pools_charging(conn, project).await?;
        let window = if pools.is_empty() {
            (window.0, window.0)
        } else {
            window
        };
        Self::load(conn, Some(&pools), window, tz, what_if, Detail::Pools).await
    }

    /// A charge's idle and down cost in `currency`; `None` when no contract prices it or
    /// the month has no FX rate into `currency`.
    pub fn cost_of(&self, charge: &Charge, currency: &str) -> Option<(Decimal, Decimal)> {
        charge.cost_in(currency, &self.fx)
    }

    /// The price of time under `contract` (or a bill's price), in its currency.
    fn price_of(&self, contract: Option<Uuid>) -> Option<(Decimal, String)> {
        let id = contract?;
        if let Some(billed) = self.billed.get(&id) {
            return Some((billed.per_gpu_hour(), billed.currency.clone()));
        }
        let contract = self.contracts.get(&id)?;
        Some((contract.price_per_gpu_hour, contract.currency.clone()))
    }

    /// The idle and down time of every node-day, charged as its pool's rule says: all to
    /// the owner, split over the projects by their use of the pool's nodes in the month
    /// (to the owner, or the pool's line, in a month nobody used them), or kept on the
    /// pool's line.
    pub fn charges(&self) -> &[Charge] {
        &self.charges
    }

    fn charged(&self) -> Vec<Charge> {
        let mut charges = Vec::new();
        for day in &self.figures.days {
            let Some(pool) = self.pools.get(&day.pool) else {
                continue;
            };
            let seconds = day.seconds;
            if seconds.idle.is_zero() && seconds.down.is_zero() {
                continue;
            }
            let charge = |project: Option<String>, idle: Decimal, down: Decimal| Charge {
                project,
                pool: day.pool.clone(),
                day: day.day,
                month: day.month,
                gpu_model: day.gpu_model.clone(),
                billing_mode: day.billing_mode,
                contract_id: day.contract_id,
                price: self.price_of(day.contract_id),
                idle_seconds: idle,
                down_seconds: down,
            };
            let weights = match pool.share_idle {
                ShareIdle::ByUsage => self
                    .figures
                    .usage
                    .get(&(day.pool.clone(), day.month))
                    .filter(|weights| weights.values().any(|w| !w.is_zero())),
                _ => None,
            };
            match (pool.share_idle, weights) {
                (ShareIdle::ByUsage, Some(weights)) => {
                    let idle = allocate(seconds.idle, weights);
                    let down: BTreeMap<String, Decimal> =
                        allocate(seconds.down, weights).into_iter().collect();
                    for (project, idle) in idle {
                        let down = down.get(&project).copied().unwrap_or_default();
                        charges.push(charge(Some(project), idle, down));
                    }
                }
                (ShareIdle::Pool, _) => charges.push(charge(None, seconds.idle, seconds.down)),
                _ => charges.push(charge(
                    pool.owner_project.clone(),
                    seconds.idle,
                    seconds.down,
                )),
            }
        }
        charges
    }

    /// Adds to `groups` the capacity idle and down time charged to the projects whose
    /// currency `currencies` gives, in that currency, in the group `group_of(project,
    /// charge)` names. Time no contract prices, or whose FX rate is missing, is counted as
    /// unrated GPU-seconds of its model.
    pub fn add_charges(
        &self,
        currencies: &BTreeMap<String, String>,
        group_of: impl Fn(&str, &Charge) -> Option<String>,
        groups: &mut BTreeMap<Option<String>, FigureSums>,
    ) {
        for charge in self.charges() {
            let Some((project, currency)) = charge
                .project
                .as_ref()
                .and_then(|project| currencies.get_key_value(project))
            else {
                continue;
            };
            let group = groups.entry(group_of(project, charge)).or_default();
            match charge.cost_in(currency, &self.fx) {
                Some((idle, down)) => group.add_capacity(idle, down),
                None => {
                    let reason = if charge.price.is_some() {
                        "no_fx_rate"
                    } else {
                        "no_contract"
                    };
                    group.add_unrated(
                        reason,
                        &charge.gpu_model,
                        charge.idle_seconds + charge.down_seconds,
                    );
                }
            }
        }
    }

    /// The currency a pool's figures are shown in: its owner's, or else that of the
    /// contract pricing most of its paid time (`None` when nothing prices it).
    fn currency_of(&self, pool: &str) -> Option<String> {
        if let Some(currency) = self
            .pools
            .get(pool)
            .and_then(|row| row.owner_project.as_ref())
            .and_then(|owner| self.currencies.get(owner))
        {
            return Some(currency.clone());
        }
        let mut paid: BTreeMap<String, Decimal> = BTreeMap::new();
        for day in self.figures.days.iter().filter(|d| d.pool == pool) {
            if let Some((_, currency)) = self.price_of(day.contract_id) {
                *paid.entry(currency).or_default() += day.seconds.paid;
            }
        }
        paid.into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(currency, _)| currency)
    }

    /// The figures of one pool.
    pub fn utilisation(&self, pool: &str, month: Month, with_nodes: bool) -> PoolUtilisation {
        let currency = self.currency_of(pool);
        let price_in = |contract: Option<Uuid>, month: NaiveDate| {
            self.price_of(contract).and_then(|(price, from)| {
                let rate = self.fx.conversion(month, &from, currency.as_deref()?)?;
                Some(price * rate)
            })
        };
        let mut whole = PricedSeconds::default();
        let mut days: BTreeMap<NaiveDate, CapacitySeconds> = BTreeMap::new();
        for day in self.figures.days.iter().filter(|d| d.pool == pool) {
            whole.add(&day.seconds, price_in(day.contract_id, day.month));
            days.entry(day.day).or_default().add(&day.seconds);
        }
        let mut nodes: BTreeMap<&str, (NodeSummary, PricedSeconds)> = BTreeMap::new();
        for node in self.figures.nodes.iter().filter(|n| n.pool == pool) {
            let (summary, priced) = nodes.entry(&node.node).or_insert_with(|| {
                (
                    NodeSummary {
                        gpu_model: node.gpu_model.clone(),
                        gpus: node.gpus,
                    },
                    PricedSeconds::default(),
                )
            });
            summary.gpu_model = node.gpu_model.clone();
            summary.gpus = node.gpus;
            priced.add(&node.seconds, price_in(node.contract_id, node.month));
        }
        let unmatched: Decimal = self
            .figures
            .unmatched
            .get(pool)
            .map(|nodes| nodes.values().copied().sum())
            .unwrap_or_default();
        let mut charged: BTreeMap<Option<String>, (Decimal, Decimal)> = BTreeMap::new();
        if let Some(currency) = &currency {
            for charge in self.charges.iter().filter(|c| c.pool == pool) {
                if let Some((idle, down)) = charge.cost_in(currency, &self.fx) {
                    let entry = charged.entry(charge.project.clone()).or_default();
                    entry.0 += idle;
                    entry.1 += down;
                }
            }
        }
        let kept = charged.remove(&None).unwrap_or_default();
        PoolUtilisation {
            pool: pool.to_owned(),
            month,
            currency,
            paid: whole.part(whole.seconds.paid, whole.paid_cost, whole.seconds.paid),
            used: whole.part(whole.seconds.used, whole.used_cost, whole.seconds.paid),
            idle: whole.part(whole.seconds.idle, whole.idle_cost, whole.seconds.paid),
            down: whole.part(whole.seconds.down, whole.down_cost, whole.seconds.paid),
            overbooked: whole.part(
                whole.seconds.overbooked,
                whole.overbooked_cost,
                whole.seconds.paid,
            ),
            unmatched_gpu_hours: hours(unmatched),
            unpriced_gpu_hours: hours(whole.unpriced),
            nodes: with_nodes.then(|| {
                nodes
                    .into_iter()
                    .map(|(node, (summary, priced))| NodeLine {
                        node: node.to_owned(),
                        gpu_model: summary.gpu_model,
                        gpus: summary.gpus,
                        paid: priced.part(
                            priced.seconds.paid,
                            priced.paid_cost,
                            priced.seconds.paid,
                        ),
                        used: priced.part(
                            priced.seconds.used,
                            priced.used_cost,
                            priced.seconds.paid,
                        ),
                        idle: priced.part(
                            priced.seconds.idle,
                            priced.idle_cost,
                            priced.seconds.paid,
                        ),
                        down: priced.part(
                            priced.seconds.down,
                            priced.down_cost,
                            priced.seconds.paid,
                        ),
                        overbooked: priced.part(
                            priced.seconds.overbooked,
                            priced.overbooked_cost,
                            priced.seconds.paid,
                        ),
                    })
                    .collect()
            }),
            days: with_nodes.then(|| {
                days.into_iter()
                    .map(|(day, seconds)| DayLine {
                        day: day.format("%Y-%m-%d").to_string(),
                        paid_gpu_hours: hours(seconds.paid),
                        used_gpu_hours: hours(seconds.used),
                        idle_gpu_hours: hours(seconds.idle),
                        down_gpu_hours: hours(seconds.down),
                    })
                    .collect()
            }),
            charged_to: charged
                .into_iter()
                .filter_map(|(project, (idle, down))| {
                    Some(ChargedTo {
                        project: project?,
                        capacity_idle: idle.normalize(),
                        capacity_down: down.normalize(),
                    })
                })
                .collect(),
            kept_on_pool: KeptOnPool {
                capacity_idle: kept.0.normalize(),
                capacity_down: kept.1.normalize(),
            },
        }
    }
}

/// The prices bills give the nodes of `intervals` within `[from, to)`: every run naming one
/// of them, set against every interval of every node those runs name over their whole
/// periods (a scale set's run names nodes of other pools too).
pub(crate) async fn billed_capacity(
    conn: &mut PgConnection,
    intervals: &[CapacityInterval],
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> LedgerResult<BilledCapacity> {
    let keys: Vec<String> = intervals
        .iter()
        .flat_map(CapacityInterval::resource_keys)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if keys.is_empty() {
        return Ok(BilledCapacity::default());
    }
    let runs = store::bills::runs_naming(conn, &keys, from, to).await?;
    billed_runs_capacity(conn, runs).await
}

/// The prices `runs` give the nodes they name.
pub(crate) async fn billed_runs_capacity(
    conn: &mut PgConnection,
    runs: Vec<store::bills::RunRow>,
) -> LedgerResult<BilledCapacity> {
    let charged: Vec<ChargedRun> = runs
        .into_iter()
        .map(store::bills::RunRow::into_charged)
        .collect();
    let (Some(since), Some(until)) = (
        charged.iter().map(|r| r.run.from).min(),
        charged.iter().map(|r| r.run.until()).max(),
    ) else {
        return Ok(BilledCapacity::default());
    };
    let run_keys: Vec<String> = charged
        .iter()
        .flat_map(|r| std::iter::once(r.run.keys.0.clone()).chain(r.run.keys.1.clone()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let named = store::capacity::intervals_named(conn, &run_keys, since, until).await?;
    Ok(bill_capacity(&charged, &named))
}

/// The contracts that could price `intervals`: those of their models and billing modes,
/// at the prices `what_if` asks for.
pub(crate) async fn contracts_for(
    conn: &mut PgConnection,
    intervals: &[CapacityInterval],
    what_if: &WhatIf,
) -> LedgerResult<Vec<Contract>> {
    let kinds: BTreeSet<(String, &'static str)> = intervals
        .iter()
        .map(|i| (i.gpu_model.clone(), i.billing_mode.as_str()))
        .collect();
    let (models, modes): (Vec<String>, Vec<String>) = kinds
        .into_iter()
        .map(|(model, mode)| (model, mode.to_owned()))
        .unzip();
    Ok(store::contracts::for_kinds(conn, &models, &modes)
        .await?
        .iter()
        .map(|row| {
            let mut contract = row.to_domain();
            if let Some(Override::InContractCurrency(price) | Override::InProjectCurrency(price)) =
                what_if.contract_price(contract.id, &contract.gpu_model, contract.billing_mode)
            {
                contract.price_per_gpu_hour = price;
            }
            contract
        })
        .collect())
}

/// The reserved contracts among `contracts` that price capacity over `window`: their waste
/// is the idle time of those nodes, so they report no unused commitment.
pub async fn reservations_pricing_capacity(
    conn: &mut PgConnection,
    contracts: &[Contract],
    window: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> LedgerResult<HashSet<Uuid>> {
    if contracts.is_empty() || !store::capacity::any_in(conn, window.0, window.1).await? {
        return Ok(HashSet::new());
    }
    let intervals: Vec<CapacityInterval> =
        store::capacity::intervals(conn, IntervalsOf::Pools(None), window.0, window.1)
            .await?
            .into_iter()
            .filter(|i| i.billing_mode == BillingMode::Reserved)
            .collect();
    if intervals.is_empty() {
        return Ok(HashSet::new());
    }
    let pool_ids = distinct(intervals.iter().map(|i| i.pool.clone()));
    let owners: HashMap<String, Option<String>> = store::capacity::pools_by_ids(conn, &pool_ids)
        .await?
        .into_iter()
        .map(|row| (row.id, row.owner_project))
        .collect();
    // Every contract that could price them, so that a more specific one wins as it would.
    let all = contracts_for(conn, &intervals, &WhatIf::default()).await?;
    let book = PriceBook {
        owners: &owners,
        contracts: &all,
        ..PriceBook::default()
    };
    let pricing = contracts_pricing(&intervals, &book, window, tz);
    Ok(contracts
        .iter()
        .map(|c| c.id)
        .filter(|id| pricing.contains(id))
        .collect())
}

fn distinct(values: impl Iterator<Item = String>) -> Vec<String> {
    values.collect::<BTreeSet<_>>().into_iter().collect()
}

fn hours(seconds: Decimal) -> Decimal {
    (seconds / SECONDS_PER_HOUR).round_dp(SUM_SCALE).normalize()
}

/// Seconds with their cost at a price per GPU-hour.
#[derive(Debug, Default)]
struct PricedSeconds {
    seconds: CapacitySeconds,
    paid_cost: Decimal,
    used_cost: Decimal,
    idle_cost: Decimal,
    down_cost: Decimal,
    overbooked_cost: Decimal,
    /// Paid GPU-seconds no contract (or no FX rate) prices.
    unpriced: Decimal,
}

impl PricedSeconds {
    fn add(&mut self, seconds: &CapacitySeconds, price: Option<Decimal>) {
        self.seconds.add(seconds);
        match price {
            Some(price) => {
                let cost = |s: Decimal| (s * price / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
                self.paid_cost += cost(seconds.paid);
                self.used_cost += cost(seconds.used);
                self.idle_cost += cost(seconds.idle);
                self.down_cost += cost(seconds.down);
                self.overbooked_cost += cost(seconds.overbooked);
            }
            None => self.unpriced += seconds.paid,
        }
    }

    fn part(&self, seconds: Decimal, cost: Decimal, paid: Decimal) -> CapacityPart {
        CapacityPart {
            gpu_hours: hours(seconds),
            cost: cost.normalize(),
            share: (!paid.is_zero()).then(|| (seconds / paid).round_dp(12).normalize()),
        }
    }
}

struct NodeSummary {
    gpu_model: String,
    gpus: i32,
}

/// GPU-hours of one part of capacity, their cost, and their share of the paid GPU-hours.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CapacityPart {
    pub gpu_hours: Decimal,
    /// In the view's currency, of the time a contract prices.
    pub cost: Decimal,
    /// Of paid GPU-hours; null when nothing was paid.
    pub share: Option<Decimal>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeLine {
    pub node: String,
    pub gpu_model: String,
    pub gpus: i32,
    pub paid: CapacityPart,
    pub used: CapacityPart,
    pub idle: CapacityPart,
    pub down: CapacityPart,
    pub overbooked: CapacityPart,
}

/// One ledger day of a pool, in GPU-hours.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DayLine {
    pub day: String,
    pub paid_gpu_hours: Decimal,
    pub used_gpu_hours: Decimal,
    pub idle_gpu_hours: Decimal,
    pub down_gpu_hours: Decimal,
}

/// What one project is charged of a pool's idle and down time, in the view's currency.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ChargedTo {
    pub project: String,
    pub capacity_idle: Decimal,
    pub capacity_down: Decimal,
}

/// Idle and down cost no project is charged: the pool's own line.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct KeptOnPool {
    pub capacity_idle: Decimal,
    pub capacity_down: Decimal,
}

/// A pool's month: `paid = used + idle + down`, in GPU-hours and cost.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolUtilisation {
    pub pool: String,
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// The owner project's currency, or that of the contract pricing most of the pool's
    /// time; null when no contract prices any of it.
    pub currency: Option<String>,
    pub paid: CapacityPart,
    pub used: CapacityPart,
    pub idle: CapacityPart,
    pub down: CapacityPart,
    /// What records put on the nodes beyond their up time: outside `paid`, and a sign of
    /// wrong input.
    pub overbooked: CapacityPart,
    /// GPU-hours records put on the pool's nodes in hours no interval covers.
    pub unmatched_gpu_hours: Decimal,
    /// Paid GPU-hours no contract (or no FX rate into the currency) prices.
    pub unpriced_gpu_hours: Decimal,
    /// Each node's month (the utilisation endpoint only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeLine>>,
    /// Each ledger day of the month (the utilisation endpoint only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days: Option<Vec<DayLine>>,
    /// Projects charged with idle and down cost.
    pub charged_to: Vec<ChargedTo>,
    pub kept_on_pool: KeptOnPool,
}

/// `GET /v1/pools/{id}/utilisation?month=`: the pool's month, node by node.
pub async fn pool_utilisation(
    pool: &PgPool,
    id: &str,
    month: Month,
    tz: Tz,
) -> LedgerResult<PoolUtilisation> {
    let mut tx = store::snapshot(pool).await?;
    if store::capacity::get_pool(&mut tx, id).await?.is_none() {
        return Err(LedgerError::NotFound(format!("no pool `{id}`")));
    }
    let window = month_bounds(month.first_day(), tz);
    let pools = [id.to_owned()];
    let capacity = CapacityWindow::load(
        &mut tx,
        Some(&pools),
        window,
        tz,
        &WhatIf::default(),
        Detail::Nodes,
    )
    .await?;
    tx.commit().await?;
    Ok(capacity.utilisation(id, month, true))
}

/// The group a capacity charge falls in, for a project's figures grouped by `grouping`.
pub fn charge_key(grouping: &Grouping, charge: &Charge) -> Option<String> {
    match grouping {
        Grouping::Whole | Grouping::Outcome | Grouping::Label(_) => None,
        Grouping::Day => Some(charge.day.format("%Y-%m-%d").to_string()),
        Grouping::Month => Some(charge.month.format("%Y-%m").to_string()),
        Grouping::GpuModel => Some(charge.gpu_model.clone()),
        Grouping::BillingMode => Some(charge.billing_mode.as_str().to_owned()),
        Grouping::GpuModelAndBillingMode => Some(format!(
            "{}/{}",
            charge.gpu_model,
            charge.billing_mode.as_str()
        )),
    }
}
