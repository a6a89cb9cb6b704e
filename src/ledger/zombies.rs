//! Zombie capacity (COST_MODEL.md §9): a node up, its GPUs paid, and no job on it for longer
//! than its pool allows. Each such idle stretch fires one `zombie_capacity` alert, through
//! the signed webhook outbox of the pool's owner project, and stays in the history even if
//! records that arrive later fill it.
//!
//! Stretches are judged when capacity arrives and on the burn tick's timer. A judge holds
//! the advisory lock of every node it judges (the lock writers of intervals take), so two
//! judges never fire the same stretch twice. A job still running has no record yet: its node
//! looks idle until the record arrives, which is why the default `zombie_after` is two hours.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::capacity::{
    CapacityInterval, IdleStretch, NodeState, PriceBook, capacity_figures, idle_stretches,
};
use crate::domain::figures::SUM_SCALE;
use crate::domain::ledger_time::{LedgerHour, SECONDS_PER_HOUR, seconds_between};
use crate::domain::rating::FxRates;
use crate::domain::what_if::WhatIf;
use crate::ledger::alerting;
use crate::ledger::capacity::{billed_capacity, contracts_for};
use crate::ledger::{LedgerResult, instruments};
use crate::store;
use crate::store::alerts::NewZombieAlert;
use crate::store::capacity::{IntervalsOf, NewStretch, PoolRow};

/// How far back a judge looks for idle stretches.
const LOOKBACK: TimeDelta = TimeDelta::days(7);
/// A node counts as up now while its known up time reaches this close to now: collectors
/// extend intervals on every run.
pub const UP_NOW_TOLERANCE: TimeDelta = TimeDelta::minutes(15);

/// A node idle past its pool's `zombie_after`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ZombieView {
    pub node: String,
    pub pool: String,
    pub gpu_model: String,
    pub gpus: i32,
    /// When the node was last seen running a job, or came up.
    pub since: DateTime<Utc>,
    /// How far its capacity is known idle.
    pub until: DateTime<Utc>,
    #[schema(value_type = String)]
    pub idle_hours: Decimal,
    /// The owner project's currency, or the contract's; null when no contract prices it.
    pub currency: Option<String>,
    /// What its GPUs cost per hour now.
    #[schema(value_type = Option<String>)]
    pub cost_per_hour: Option<Decimal>,
    /// What the stretch has cost so far.
    #[schema(value_type = Option<String>)]
    pub cost_so_far: Option<Decimal>,
}

/// A stretch past its pool's `zombie_after`, priced.
struct Zombie {
    node: String,
    stretch: IdleStretch,
    owner: Option<String>,
    view: ZombieView,
}

/// The idle stretches past their pool's `zombie_after` of `nodes` (of every node of a pool
/// with zombie alerts that was up in the last week when `None`, or of `pool`'s), judged at
/// `now`.
async fn zombies(
    conn: &mut PgConnection,
    nodes: Option<Vec<String>>,
    pool: Option<&str>,
    now: DateTime<Utc>,
    tz: chrono_tz::Tz,
) -> LedgerResult<Vec<Zombie>> {
    let from = now - LOOKBACK;
    let to = now + TimeDelta::minutes(10);
    let nodes = match nodes {
        Some(nodes) => nodes,
        None => store::capacity::nodes_up_since(conn, pool, from).await?,
    };
    if nodes.is_empty() {
        return Ok(Vec::new());
    }
    let intervals = store::capacity::intervals(conn, IntervalsOf::Nodes(&nodes), from, to).await?;
    if intervals.is_empty() {
        return Ok(Vec::new());
    }
    let pool_ids: Vec<String> = {
        let mut ids: Vec<String> = intervals.iter().map(|i| i.pool.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let pools: HashMap<String, PoolRow> = store::capacity::pools_by_ids(conn, &pool_ids)
        .await?
        .into_iter()
        .map(|row| (row.id.clone(), row))
        .collect();
    let owners: HashMap<String, Option<String>> = pools
        .values()
        .map(|row| (row.id.clone(), row.owner_project.clone()))
        .collect();
    let owner_ids: Vec<String> = owners.values().flatten().cloned().collect();
    let currencies = store::capacity::project_currencies(conn, &owner_ids).await?;
    let contracts = contracts_for(conn, &intervals, &WhatIf::default()).await?;
    let billed = billed_capacity(conn, &intervals, (from, to)).await?;
    // The price of a GPU-hour under a contract or a bill, in its currency.
    let prices: HashMap<Uuid, (Decimal, String)> = contracts
        .iter()
        .map(|c| (c.id, (c.price_per_gpu_hour, c.currency.clone())))
        .chain(
            billed
                .prices
                .values()
                .map(|p| (p.id, (p.per_gpu_hour(), p.currency.clone()))),
        )
        .collect();
    let mut to_currencies: Vec<String> = currencies.values().cloned().collect();
    to_currencies.sort_unstable();
    to_currencies.dedup();
    let fx = store::fx_rates::table(
        conn,
        LedgerHour::holding(from, tz).month,
        LedgerHour::holding(to, tz).month,
        &to_currencies,
    )
    .await?;
    let jobs = store::capacity::jobs_on_nodes(conn, &nodes, from, to).await?;
    let mut jobs_of: HashMap<&str, Vec<_>> = HashMap::new();
    for (node, span) in &jobs {
        jobs_of.entry(node.as_str()).or_default().push(*span);
    }
    let mut intervals_of: BTreeMap<&str, Vec<CapacityInterval>> = BTreeMap::new();
    for interval in &intervals {
        intervals_of
            .entry(interval.node.as_str())
            .or_default()
            .push(interval.clone());
    }
    let mut found = Vec::new();
    for (node, node_intervals) in &intervals_of {
        let node_jobs = jobs_of.get(node).cloned().unwrap_or_default();
        for stretch in idle_stretches(node_intervals, &node_jobs) {
            let Some(row) = pools.get(&stretch.pool) else {
                continue;
            };
            if pool.is_some_and(|p| p != stretch.pool) {
                continue;
            }
            let Some(minutes) = row.zombie_after_minutes else {
                continue;
            };
            if stretch.until - stretch.since < TimeDelta::minutes(i64::from(minutes)) {
                continue;
            }
            // The stretch priced as an interval of its own, by its contracts.
            let alone = CapacityInterval {
                node: (*node).to_owned(),
                pool: stretch.pool.clone(),
                gpu_model: stretch.gpu_model.clone(),
                gpus: stretch.gpus,
                billing_mode: stretch.billing_mode,
                provider: stretch.provider.clone(),
                region: stretch.region.clone(),
                labels: BTreeMap::new(),
                from: stretch.since,
                until: stretch.until,
                state: NodeState::Up,
            };
            let days = capacity_figures(
                std::slice::from_ref(&alone),
                &[],
                &PriceBook {
                    owners: &owners,
                    contracts: &contracts,
                    billed: &billed.spans,
                },
                (stretch.since, stretch.until),
                tz,
            )
            .days;
            let owner_currency = row
                .owner_project
                .as_ref()
                .and_then(|owner| currencies.get(owner))
                .cloned();
            let mut currency = owner_currency.clone();
            let mut cost = Some(Decimal::ZERO);
            let mut per_hour = None;
            for day in &days {
                let price = day.contract_id.and_then(|id| prices.get(&id));
                let rate = price.and_then(|(per_gpu_hour, from)| {
                    let target = currency.get_or_insert_with(|| from.clone());
                    fx.conversion(day.month, from, target)
                        .map(|rate| *per_gpu_hour * rate)
                });
                match rate {
                    Some(price) => {
                        if let Some(sum) = cost.as_mut() {
                            *sum +=
                                (day.seconds.idle * price / SECONDS_PER_HOUR).round_dp(SUM_SCALE);
                        }
                        per_hour = Some(price * Decimal::from(stretch.gpus));
                    }
                    None => {
                        cost = None;
                        per_hour = None;
                    }
                }
            }
            if per_hour.is_none() {
                cost = None;
            }
            let idle_seconds = seconds_between(stretch.since, stretch.until);
            found.push(Zombie {
                node: (*node).to_owned(),
                owner: row.owner_project.clone(),
                view: ZombieView {
                    node: (*node).to_owned(),
                    pool: stretch.pool.clone(),
                    gpu_model: stretch.gpu_model.clone(),
                    gpus: stretch.gpus,
                    since: stretch.since,
                    until: stretch.until,
                    idle_hours: (idle_seconds / SECONDS_PER_HOUR).round_dp(6).normalize(),
                    currency: if per_hour.is_some() {
                        currency
                    } else {
                        owner_currency
                    },
                    cost_per_hour: per_hour.map(|p| p.normalize()),
                    cost_so_far: cost.map(|c| c.normalize()),
                },
                stretch,
            });
        }
    }
    Ok(found)
}

/// `GET /v1/capacity/zombies`: nodes idle right now past their pool's `zombie_after`,
/// longest idle first.
pub async fn now(
    pool: &PgPool,
    only: Option<&str>,
    settings: &Settings,
) -> LedgerResult<Vec<ZombieView>> {
    let now = settings.clock.now();
    let mut tx = store::snapshot(pool).await?;
    let found = zombies(&mut tx, None, only, now, settings.timezone).await?;
    tx.commit().await?;
    let mut views: Vec<ZombieView> = found
        .into_iter()
        .filter(|z| z.stretch.open && z.stretch.until >= now - UP_NOW_TOLERANCE)
        .map(|z| z.view)
        .collect();
    views.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.node.cmp(&b.node)));
    Ok(views)
}

/// Fires one alert per idle stretch past its pool's `zombie_after` that has not fired yet,
/// for `nodes` (every node up in the last week when `None`). A stretch that overlaps one
/// that fired is the same stretch, seen with more data, and does not fire again. Returns
/// how many fired.
pub async fn judge(
    pool: &PgPool,
    nodes: Option<Vec<String>>,
    settings: &Settings,
) -> LedgerResult<usize> {
    let now = settings.clock.now();
    let mut tx = pool.begin().await?;
    let nodes = match nodes {
        Some(nodes) => nodes,
        None => store::capacity::nodes_up_since(&mut tx, None, now - LOOKBACK).await?,
    };
    if nodes.is_empty() {
        return Ok(0);
    }
    let refs: Vec<&str> = nodes.iter().map(String::as_str).collect();
    store::capacity::lock_nodes(&mut tx, &refs).await?;
    let found = zombies(&mut tx, Some(nodes.clone()), None, now, settings.timezone).await?;
    if found.is_empty() {
        return Ok(0);
    }
    let fired = store::capacity::fired_stretches(&mut tx, &nodes).await?;
    let mut count = 0;
    for zombie in &found {
        let stretch = &zombie.stretch;
        let seen = fired.iter().any(|f| {
            f.node == zombie.node && f.since < stretch.until && stretch.since <= f.judged_until
        });
        if seen {
            continue;
        }
        let view = &zombie.view;
        let inserted = store::capacity::insert_stretch(
            &mut tx,
            &NewStretch {
                node: &zombie.node,
                since: stretch.since,
                judged_until: stretch.until,
                pool: &stretch.pool,
                gpu_model: &stretch.gpu_model,
                gpus: stretch.gpus,
                currency: view.currency.as_deref(),
                cost_per_hour: view.cost_per_hour,
                cost_so_far: view.cost_so_far,
            },
        )
        .await?;
        if !inserted {
            continue;
        }
        count += 1;
        tracing::info!(node = %zombie.node, pool = %stretch.pool, since = %stretch.since, "zombie capacity found");
        let Some(owner) = &zombie.owner else {
            continue;
        };
        let Some(project) = store::projects::get(pool, owner).await? else {
            continue;
        };
        let alert = NewZombieAlert {
            project_id: owner.clone(),
            month: LedgerHour::holding(stretch.since, settings.timezone).month,
            currency: project.currency.clone(),
            node: zombie.node.clone(),
            pool_id: stretch.pool.clone(),
            since: stretch.since,
            gpu_model: stretch.gpu_model.clone(),
            gpus: stretch.gpus,
            idle_gpu_seconds: Decimal::from(stretch.gpus)
                * seconds_between(stretch.since, stretch.until),
            cost_per_hour: view
                .cost_per_hour
                .filter(|_| view.currency.as_deref() == Some(project.currency.as_str())),
            cost_so_far: view
                .cost_so_far
                .filter(|_| view.currency.as_deref() == Some(project.currency.as_str())),
            fired_at: now,
        };
        if let Some(row) = store::alerts::fire_zombie(&mut tx, &alert).await? {
            alerting::queue_deliveries(&mut tx, &[(&row, project.webhook_url.as_deref())]).await?;
            metrics::counter!(instruments::ALERTS_FIRED, "kind" => "zombie_capacity").increment(1);
        }
    }
    tx.commit().await?;
    Ok(count)
}
