//! Cloud bills: storing a FOCUS bill (and the capacity of the GPU instances it shows that
//! nobody reported), and reconciling a month's bills with capacity.
//!
//! A bill is stored statement by statement (one provider's account in one billing period)
//! in one transaction holding each statement's advisory lock, taken in a fixed order: two
//! posts of the same statement run one after the other, and the second sees the first's
//! rows (a duplicate, or a correction that replaces them). The capacity a statement's rows
//! create is written under the nodes' advisory locks, as `POST /v1/capacity` writes it, and
//! the rollups of its nodes are refreshed in the same transaction. Prices are not stored:
//! a capacity read matches the bill's rows to nodes when it runs, so a bill, capacity and
//! records arriving in any order and at the same time leave the same figures.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Datelike, TimeDelta, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::bill::{self, Bill, BillRow, Statement};
use crate::domain::billed::{BilledPrice, RunId, RunPart, runs_of};
use crate::domain::capacity::{
    CapacityInterval, NodeState, PoolSettings, ShareIdle, pool_id as parse_pool_id,
};
use crate::domain::capacity_plan::Detail;
use crate::domain::ledger_time::seconds_between;
use crate::domain::rating::FxRates;
use crate::domain::record::format_time;
use crate::domain::validation::FieldError;
use crate::domain::values::Month;
use crate::domain::what_if::WhatIf;
use crate::ledger::capacity::CapacityWindow;
use crate::ledger::{LedgerError, LedgerResult, audit, capacity_rollup};
use crate::store;

/// How long a GPU instance the bill shows and no collector reported sits idle before it is
/// a zombie, in the pool a bill creates for it.
const BILLED_POOL_ZOMBIE_MINUTES: i32 = 120;

/// What `POST /v1/bills` did.
#[derive(Debug, Serialize, ToSchema)]
pub struct BillReceipt {
    /// The bill the rows are stored under (for a duplicate, the bill first posted).
    pub bill_id: Uuid,
    /// The providers of the bill, comma-separated.
    pub provider: String,
    /// The billing periods, `YYYY-MM`.
    pub months: Vec<String>,
    pub rows: usize,
    /// Rows whose resource is a node: one known before, or a GPU instance the bill created.
    pub matched_rows: usize,
    pub unmatched_rows: usize,
    /// The bill's total by currency, exact.
    #[schema(value_type = BTreeMap<String, String>)]
    pub billed_total: BTreeMap<String, Decimal>,
    /// Every statement was stored before with the same rows: nothing changed.
    pub duplicate: bool,
    /// Statements this bill corrected, and what moved.
    pub replaced: Vec<ReplacedStatement>,
    /// Capacity created from GPU instance rows no node was known for.
    pub capacity: CreatedCapacity,
}

/// A statement a bill replaced, and what moved by service and SKU.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReplacedStatement {
    pub provider: String,
    pub billing_account: String,
    pub billing_period: String,
    pub previous_bill_id: Uuid,
    pub moved: Vec<Moved>,
}

/// One service and SKU whose billed cost changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct Moved {
    pub service: String,
    pub sku: String,
    pub currency: String,
    #[schema(value_type = String)]
    pub before: Decimal,
    #[schema(value_type = String)]
    pub after: Decimal,
}

/// Capacity a bill created.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct CreatedCapacity {
    pub pool: Option<String>,
    pub nodes: usize,
    pub intervals: usize,
}

/// Stores a parsed bill. GPU instance rows whose resource names no known node become
/// capacity of `pool` (by default `billed-<provider>`, created when missing). The audit log
/// keeps the receipt, a summary of what the bill stored, replaced and created, not its rows;
/// a duplicate changes nothing and is not recorded.
pub async fn post_bill(
    pool: &PgPool,
    bill: Bill,
    capacity_pool: Option<&str>,
    tz: Tz,
    actor: &Actor,
) -> LedgerResult<(BillReceipt, Vec<String>)> {
    let mut by_statement: BTreeMap<Statement, Vec<&BillRow>> = BTreeMap::new();
    for row in &bill.rows {
        by_statement.entry(row.statement()).or_default().push(row);
    }
    let keys: Vec<Statement> = by_statement.keys().cloned().collect();
    let mut billed_total: BTreeMap<String, Decimal> = BTreeMap::new();
    for row in &bill.rows {
        *billed_total.entry(row.currency.clone()).or_default() += row.billed_cost;
    }
    let providers: BTreeSet<&str> = keys.iter().map(|k| k.provider.as_str()).collect();
    let months: BTreeSet<String> = keys
        .iter()
        .map(|k| k.billing_period_start.format("%Y-%m").to_string())
        .collect();
    let mut receipt = BillReceipt {
        bill_id: Uuid::new_v4(),
        provider: providers.into_iter().collect::<Vec<_>>().join(", "),
        months: months.into_iter().collect(),
        rows: bill.rows.len(),
        matched_rows: 0,
        unmatched_rows: 0,
        billed_total: billed_total
            .into_iter()
            .map(|(c, t)| (c, t.normalize()))
            .collect(),
        duplicate: false,
        replaced: Vec::new(),
        capacity: CreatedCapacity::default(),
    };
    let mut tx = pool.begin().await?;
    store::bills::lock_statements(&mut tx, &keys).await?;
    let stored: HashMap<Statement, store::bills::StoredStatement> =
        store::bills::statements(&mut tx, &keys)
            .await?
            .into_iter()
            .map(|s| {
                (
                    Statement {
                        provider: s.provider.clone(),
                        billing_account: s.billing_account.clone(),
                        billing_period_start: s.billing_period_start,
                    },
                    s,
                )
            })
            .collect();
    let hashes: BTreeMap<&Statement, Vec<u8>> = by_statement
        .iter()
        .map(|(key, rows)| (key, rows_hash(rows)))
        .collect();
    let changed: Vec<&Statement> = by_statement
        .keys()
        .filter(|key| stored.get(*key).is_none_or(|s| s.rows_hash != hashes[key]))
        .collect();
    if changed.is_empty() {
        receipt.duplicate = true;
        if let Some(first) = keys.first().and_then(|k| stored.get(k)) {
            receipt.bill_id = first.bill_id;
        }
        receipt.matched_rows = count_matched(&mut tx, &bill.rows).await?;
        receipt.unmatched_rows = receipt.rows - receipt.matched_rows;
        tx.commit().await?;
        return Ok((receipt, Vec::new()));
    }
    store::bills::insert_bill(
        &mut tx,
        receipt.bill_id,
        &bill.content_hash,
        bill.rows.len(),
    )
    .await?;
    let mut spans = Vec::new();
    let mut statement_ids = BTreeMap::new();
    for key in &changed {
        let id = match stored.get(*key) {
            Some(previous) => {
                let before = store::bills::statement_totals(&mut tx, previous.id).await?;
                for (node, from, until) in
                    store::bills::statement_intervals(&mut tx, previous.id).await?
                {
                    spans.push((node, from, until));
                }
                store::bills::delete_statement_intervals(&mut tx, previous.id).await?;
                store::bills::delete_runs(&mut tx, previous.id).await?;
                store::bills::delete_rows(&mut tx, previous.id).await?;
                receipt.replaced.push(ReplacedStatement {
                    provider: key.provider.clone(),
                    billing_account: key.billing_account.clone(),
                    billing_period: key.billing_period_start.format("%Y-%m").to_string(),
                    previous_bill_id: previous.bill_id,
                    moved: moved(&before, &by_statement[*key]),
                });
                previous.id
            }
            None => Uuid::new_v4(),
        };
        store::bills::put_statement(&mut tx, id, key, receipt.bill_id, &hashes[key]).await?;
        let (runs, placed) = runs_of(&by_statement[*key]);
        store::bills::insert_rows(&mut tx, id, &by_statement[*key], &placed).await?;
        store::bills::insert_runs(&mut tx, id, &runs).await?;
        statement_ids.insert((*key).clone(), id);
    }
    // GPU instances the bill shows that no node is known for become capacity.
    let candidates: Vec<(&BillRow, Uuid)> = changed
        .iter()
        .flat_map(|key| {
            let id = statement_ids[*key];
            by_statement[*key].iter().map(move |row| (*row, id))
        })
        .filter(|(row, _)| row.instance.is_some() && row.resource_id.is_some())
        .filter(|(row, _)| row.charge_category.eq_ignore_ascii_case("Usage"))
        .collect();
    let mut created_nodes = Vec::new();
    let mut nodes_locked = false;
    if !candidates.is_empty() {
        let keys: Vec<String> = candidates
            .iter()
            .flat_map(|(row, _)| row_keys(row))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let replaced_ids: Vec<Uuid> = statement_ids.values().copied().collect();
        let known: BTreeSet<String> = store::bills::known_keys(&mut tx, &keys, &replaced_ids)
            .await?
            .into_iter()
            .collect();
        let unknown: Vec<(&BillRow, Uuid)> = candidates
            .into_iter()
            .filter(|(row, _)| !row_keys(row).iter().any(|k| known.contains(k)))
            .collect();
        if !unknown.is_empty() {
            let pool_id = match capacity_pool {
                Some(id) => id.to_owned(),
                None => default_pool(&unknown[0].0.provider),
            };
            ensure_pool(
                &mut tx,
                &pool_id,
                capacity_pool.is_some(),
                &unknown[0].0.provider,
            )
            .await?;
            let mut by_statement_intervals: BTreeMap<Uuid, Vec<CapacityInterval>> = BTreeMap::new();
            for (statement, intervals) in intervals_from_rows(&unknown, &pool_id) {
                by_statement_intervals.insert(statement, intervals);
            }
            let nodes: Vec<String> = by_statement_intervals
                .values()
                .flatten()
                .map(|i| i.node.clone())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            // Every node written, the old statements' and the new, locked in one call, in
            // name order.
            let mut locked: Vec<&str> = nodes.iter().map(String::as_str).collect();
            locked.extend(spans.iter().map(|s| s.0.as_str()));
            store::capacity::lock_nodes(&mut tx, &locked).await?;
            nodes_locked = true;
            for (statement, intervals) in by_statement_intervals {
                let clashing: BTreeSet<(String, DateTime<Utc>)> =
                    store::capacity::meeting(&mut tx, &intervals)
                        .await?
                        .into_iter()
                        .map(|s| {
                            let i = &intervals[s.position as usize];
                            (i.node.clone(), i.from)
                        })
                        .collect();
                let fresh: Vec<CapacityInterval> = intervals
                    .into_iter()
                    .filter(|i| !clashing.contains(&(i.node.clone(), i.from)))
                    .collect();
                if fresh.is_empty() {
                    continue;
                }
                let hashes: Vec<Vec<u8>> =
                    fresh.iter().map(CapacityInterval::content_hash).collect();
                store::capacity::upsert(&mut tx, &fresh, &hashes, Some(statement)).await?;
                receipt.capacity.intervals += fresh.len();
                spans.extend(fresh.iter().map(|i| (i.node.clone(), i.from, i.until)));
            }
            receipt.capacity.pool = Some(pool_id);
            receipt.capacity.nodes = nodes.len();
            created_nodes = nodes;
        }
    }
    if !spans.is_empty() {
        if !nodes_locked {
            let nodes: Vec<&str> = spans.iter().map(|s| s.0.as_str()).collect();
            store::capacity::lock_nodes(&mut tx, &nodes).await?;
        }
        capacity_rollup::refresh_spans(&mut tx, spans, tz).await?;
    }
    receipt.matched_rows = count_matched(&mut tx, &bill.rows).await?;
    receipt.unmatched_rows = receipt.rows - receipt.matched_rows;
    let change = Change::new(
        "bill",
        receipt.bill_id.to_string(),
        "import",
        None,
        Some(audit::snapshot(&receipt)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok((receipt, created_nodes))
}

/// The keys a row's resource may name a node by.
fn row_keys(row: &BillRow) -> Vec<String> {
    let Some(resource) = row.resource_id.as_deref() else {
        return Vec::new();
    };
    let (full, tail) = bill::resource_keys(resource);
    std::iter::once(full).chain(tail).collect()
}

/// How many of `rows` name a node with capacity known in their charge period.
async fn count_matched(conn: &mut PgConnection, rows: &[BillRow]) -> LedgerResult<usize> {
    let keys: Vec<String> = rows
        .iter()
        .flat_map(row_keys)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if keys.is_empty() {
        return Ok(0);
    }
    let (Some(since), Some(until)) = (
        rows.iter().map(|r| r.charge_from).min(),
        rows.iter().map(|r| r.charge_until).max(),
    ) else {
        return Ok(0);
    };
    let intervals = store::capacity::intervals_named(conn, &keys, since, until).await?;
    let mut intervals_of_key: HashMap<String, Vec<&CapacityInterval>> = HashMap::new();
    for interval in &intervals {
        for key in interval.resource_keys() {
            intervals_of_key.entry(key).or_default().push(interval);
        }
    }
    Ok(rows
        .iter()
        .filter(|row| {
            row_keys(row)
                .iter()
                .filter_map(|key| intervals_of_key.get(key))
                .flatten()
                .any(|interval| {
                    interval.from < row.charge_until && interval.until > row.charge_from
                })
        })
        .count())
}

/// The id of the pool a bill's instances of `provider` go to when none is named.
fn default_pool(provider: &str) -> String {
    let slug: String = provider
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let slug = slug.trim_matches('-');
    let slug: String = slug.chars().take(100).collect();
    format!("billed-{}", if slug.is_empty() { "cloud" } else { &slug })
}

async fn ensure_pool(
    conn: &mut PgConnection,
    id: &str,
    named: bool,
    provider: &str,
) -> LedgerResult<()> {
    if store::capacity::get_pool(conn, id).await?.is_some() {
        return Ok(());
    }
    if named {
        return Err(LedgerError::Invalid(vec![FieldError::new(
            "/pool",
            format!("no pool `{id}`; create it with PUT /v1/pools/{id}"),
        )]));
    }
    let id =
        parse_pool_id(id).map_err(|e| LedgerError::Invalid(vec![FieldError::new("/pool", e)]))?;
    let settings = PoolSettings {
        name: format!("{provider} GPU instances from the bill"),
        owner_project: None,
        share_idle: ShareIdle::Pool,
        zombie_after_minutes: Some(BILLED_POOL_ZOMBIE_MINUTES),
    };
    store::capacity::put_pool(conn, &id, &settings).await?;
    Ok(())
}

/// The capacity GPU instance rows show, by statement: one interval per row, or per run of
/// rows of one instance that follow each other, named by the instance's resource id.
///
/// A row that bills part of its charge period (`ConsumedQuantity` in hours) ran that long:
/// from the start of the period, or up to its end when the next period bills the instance
/// too (an instance that started within the hour).
fn intervals_from_rows(
    rows: &[(&BillRow, Uuid)],
    pool: &str,
) -> BTreeMap<Uuid, Vec<CapacityInterval>> {
    let mut by_resource: BTreeMap<(Uuid, String), Vec<&BillRow>> = BTreeMap::new();
    for (row, statement) in rows {
        if let Some(resource) = &row.resource_id {
            by_resource
                .entry((*statement, resource.clone()))
                .or_default()
                .push(row);
        }
    }
    let mut out: BTreeMap<Uuid, Vec<CapacityInterval>> = BTreeMap::new();
    for ((statement, resource), mut rows) in by_resource {
        rows.sort_by_key(|r| (r.charge_from, r.line));
        rows.dedup_by_key(|r| r.charge_from);
        let starts: BTreeSet<DateTime<Utc>> = rows.iter().map(|r| r.charge_from).collect();
        let node = node_name(&resource);
        let mut intervals: Vec<CapacityInterval> = Vec::new();
        for row in rows {
            let Some(instance) = row.instance else {
                continue;
            };
            let period = row.charge_until - row.charge_from;
            let ran = row
                .consumed_hours
                .and_then(|hours| {
                    let millis = (hours * Decimal::from(3_600_000)).round();
                    i64::try_from(millis).ok().map(TimeDelta::milliseconds)
                })
                .filter(|ran| *ran > TimeDelta::zero() && *ran < period)
                .unwrap_or(period);
            let (from, until) = if ran < period && starts.contains(&row.charge_until) {
                (row.charge_until - ran, row.charge_until)
            } else {
                (row.charge_from, row.charge_from + ran)
            };
            let mut labels = BTreeMap::new();
            labels.insert("provider_id".to_owned(), resource.clone());
            labels.insert("instance_type".to_owned(), instance.name.to_owned());
            labels.insert("source".to_owned(), "bill".to_owned());
            let interval = CapacityInterval {
                node: node.clone(),
                pool: pool.to_owned(),
                gpu_model: instance.gpu_model.to_owned(),
                gpus: instance.gpus as i32,
                billing_mode: row.billing_mode,
                provider: Some(row.provider.clone()),
                region: row.region.clone(),
                labels,
                from,
                until,
                state: NodeState::Up,
            };
            match intervals.last_mut() {
                Some(last)
                    if last.until == interval.from
                        && last.gpus == interval.gpus
                        && last.gpu_model == interval.gpu_model
                        && last.billing_mode == interval.billing_mode
                        && seconds_between(last.from, interval.until)
                            <= Decimal::from(MAX_BILLED_INTERVAL_SECONDS) =>
                {
                    last.until = interval.until;
                }
                _ => intervals.push(interval),
            }
        }
        out.entry(statement).or_default().extend(intervals);
    }
    out
}

/// The longest interval a bill writes in one piece: a month and a day.
const MAX_BILLED_INTERVAL_SECONDS: i64 = 32 * 24 * 3600;

/// The node a bill's instance is known by: its resource id, or its last segment where the
/// id has characters a node name may not.
fn node_name(resource: &str) -> String {
    let valid = crate::domain::values::node_name(resource);
    match valid {
        Ok(name) => name,
        Err(_) => bill::resource_keys(resource).1.unwrap_or_else(|| {
            resource
                .chars()
                .filter(|c| !c.is_whitespace())
                .take(200)
                .collect()
        }),
    }
}

/// The canonical hash of a statement's rows: the same rows hash the same.
fn rows_hash(rows: &[&BillRow]) -> Vec<u8> {
    let mut hasher = Sha256::new();
    for row in rows {
        hasher.update(
            format!(
                "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{:?}\u{1f}{:?}\u{1e}",
                row.line,
                row.charge_category,
                format_time(row.charge_from),
                format_time(row.charge_until),
                row.billed_cost.normalize(),
                row.currency,
                row.resource_id.as_deref().unwrap_or(""),
                row.service,
                row.sku,
                row.billing_mode.as_str(),
                row.consumed_hours.map(|h| h.normalize()),
                row.instance.map(|i| i.name),
            )
            .as_bytes(),
        );
    }
    hasher.finalize().to_vec()
}

/// What moved between a statement's stored totals and its new rows, by service and SKU.
fn moved(before: &[store::bills::ServiceTotal], rows: &[&BillRow]) -> Vec<Moved> {
    let mut totals: BTreeMap<(String, String, String), (Decimal, Decimal)> = BTreeMap::new();
    for total in before {
        totals
            .entry((
                total.service.clone(),
                total.sku.clone(),
                total.currency.clone(),
            ))
            .or_default()
            .0 += total.cost;
    }
    for row in rows {
        totals
            .entry((row.service.clone(), row.sku.clone(), row.currency.clone()))
            .or_default()
            .1 += row.billed_cost;
    }
    totals
        .into_iter()
        .filter(|(_, (before, after))| before != after)
        .map(|((service, sku, currency), (before, after))| Moved {
            service,
            sku,
            currency,
            before: before.normalize(),
            after: after.normalize(),
        })
        .collect()
}

/// The reconciliation of one provider's bills in one currency for a month.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProviderReconciliation {
    pub provider: String,
    pub currency: String,
    pub rows: i64,
    /// Everything billed: `capacity_billed` + the sum of `unmatched`, exactly.
    #[schema(value_type = String)]
    pub billed_total: Decimal,
    /// Billed cost of rows that priced nodes' time: `used + idle + down`, exactly.
    #[schema(value_type = String)]
    pub capacity_billed: Decimal,
    #[schema(value_type = String)]
    pub used: Decimal,
    #[schema(value_type = String)]
    pub idle: Decimal,
    #[schema(value_type = String)]
    pub down: Decimal,
    /// Paid GPU-hours the bill priced.
    #[schema(value_type = String)]
    pub capacity_gpu_hours: Decimal,
    /// What the rows that priced no node come to: `billed_total − capacity_billed`.
    #[schema(value_type = String)]
    pub unmatched_total: Decimal,
    /// Rows that priced no node, by service and SKU, costliest first.
    pub unmatched: Vec<UnmatchedCharge>,
    /// Jobs' cost under their contracts on the billed nodes − their used share of the
    /// billed cost: positive when contracts price the jobs above what the bill says.
    #[schema(value_type = String)]
    pub price_variance: Decimal,
    /// Jobs' cost under their contracts on billed nodes, in this currency.
    #[schema(value_type = String)]
    pub jobs_contract_cost: Decimal,
}

/// Billed rows of one service and SKU that priced no node.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnmatchedCharge {
    pub service: String,
    pub sku: String,
    pub rows: i64,
    #[schema(value_type = String)]
    pub cost: Decimal,
}

/// `GET /v1/reports/monthly/{month}/reconciliation`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Reconciliation {
    /// The billing period, `YYYY-MM`.
    pub month: String,
    pub providers: Vec<ProviderReconciliation>,
}

/// Reconciles the statements of billing period `month` with capacity: per provider and
/// currency, the billed total, the part that priced nodes' time split into used, idle and
/// down by the nodes' GPU-seconds, the rest by service and SKU, and the price variance.
pub async fn reconciliation(pool: &PgPool, month: Month, tz: Tz) -> LedgerResult<Reconciliation> {
    let first = month.first_day();
    let period_from = first.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let next = first
        .checked_add_months(chrono::Months::new(1))
        .expect("a month before the end of time");
    let period_to = next.and_hms_opt(0, 0, 0).expect("midnight").and_utc();
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let totals = store::bills::period_totals(&mut tx, period_from, period_to).await?;
    let node_runs = store::bills::period_runs_on_nodes(&mut tx, period_from, period_to).await?;
    let run_scale: HashMap<RunId, u32> = node_runs
        .iter()
        .map(|r| ((r.statement_id, r.run), r.cost_per_period.scale()))
        .collect();
    let range = (
        node_runs.iter().map(|r| r.charge_from).min(),
        node_runs.iter().map(|r| r.charge_until).max(),
    );
    let mut providers: BTreeMap<(String, String), ProviderReconciliation> = BTreeMap::new();
    for total in &totals {
        let entry = providers
            .entry((total.provider.clone(), total.currency.clone()))
            .or_insert_with(|| ProviderReconciliation {
                provider: total.provider.clone(),
                currency: total.currency.clone(),
                rows: 0,
                billed_total: Decimal::ZERO,
                capacity_billed: Decimal::ZERO,
                used: Decimal::ZERO,
                idle: Decimal::ZERO,
                down: Decimal::ZERO,
                capacity_gpu_hours: Decimal::ZERO,
                unmatched_total: Decimal::ZERO,
                unmatched: Vec::new(),
                price_variance: Decimal::ZERO,
                jobs_contract_cost: Decimal::ZERO,
            });
        entry.rows += total.rows;
        entry.billed_total += total.cost;
    }
    let mut matched_by_service: HashMap<(String, String, String, String), (i64, Decimal)> =
        HashMap::new();
    if let (Some(since), Some(until)) = range {
        let window = CapacityWindow::load(
            &mut tx,
            None,
            (since, until),
            tz,
            &WhatIf::default(),
            Detail::Nodes,
        )
        .await?;
        let prices: Vec<_> = window
            .billed
            .values()
            .filter(|price| {
                price
                    .parts
                    .iter()
                    .all(|(id, _, _)| run_scale.contains_key(id))
            })
            .collect();
        let mut seconds: HashMap<Uuid, (Decimal, Decimal, Decimal)> = HashMap::new();
        for day in &window.figures.days {
            if let Some(id) = day.contract_id {
                let entry = seconds.entry(id).or_default();
                entry.0 += day.seconds.paid;
                entry.1 += day.seconds.used;
                entry.2 += day.seconds.down;
            }
        }
        let parts: Vec<RunPart> = prices
            .iter()
            .flat_map(|p| p.parts.iter().copied())
            .collect();
        for matched in store::bills::part_totals(&mut tx, &parts).await? {
            let entry = matched_by_service
                .entry((
                    matched.provider,
                    matched.currency,
                    matched.service,
                    matched.sku,
                ))
                .or_default();
            entry.0 += matched.rows;
            entry.1 += matched.cost;
        }
        let variance = jobs_contract_cost(&mut tx, &prices, since, until).await?;
        for price in &prices {
            let Some(entry) = providers.get_mut(&(price.provider.clone(), price.currency.clone()))
            else {
                continue;
            };
            let (paid, used, down) = seconds.get(&price.id).copied().unwrap_or_default();
            let scale = price
                .parts
                .iter()
                .map(|(id, _, _)| run_scale[id])
                .max()
                .unwrap_or(0)
                .max(2);
            let share = |part: Decimal| {
                if paid.is_zero() {
                    Decimal::ZERO
                } else {
                    (price.billed * part / paid).round_dp(scale)
                }
            };
            let (used_cost, down_cost) = (share(used), share(down));
            entry.capacity_billed += price.billed;
            entry.used += used_cost;
            entry.down += down_cost;
            entry.idle += price.billed - used_cost - down_cost;
            entry.capacity_gpu_hours += paid / Decimal::from(3600);
            let contract_cost = variance.get(&price.id).copied().unwrap_or_default();
            entry.jobs_contract_cost += contract_cost;
            entry.price_variance += contract_cost - used_cost;
        }
    }
    for total in totals {
        let key = (total.provider, total.currency, total.service, total.sku);
        let (rows, cost) = matched_by_service.get(&key).copied().unwrap_or_default();
        let (provider, currency, service, sku) = key;
        if rows == total.rows && cost == total.cost {
            continue;
        }
        if let Some(entry) = providers.get_mut(&(provider, currency)) {
            entry.unmatched_total += total.cost - cost;
            entry.unmatched.push(UnmatchedCharge {
                service,
                sku,
                rows: total.rows - rows,
                cost: (total.cost - cost).normalize(),
            });
        }
    }
    tx.commit().await?;
    Ok(Reconciliation {
        month: format!("{:04}-{:02}", first.year(), first.month()),
        providers: providers
            .into_values()
            .map(|mut p| {
                p.unmatched.sort_by(|a, b| {
                    b.cost
                        .abs()
                        .cmp(&a.cost.abs())
                        .then_with(|| a.service.cmp(&b.service))
                });
                for value in [
                    &mut p.unmatched_total,
                    &mut p.billed_total,
                    &mut p.capacity_billed,
                    &mut p.used,
                    &mut p.idle,
                    &mut p.down,
                    &mut p.capacity_gpu_hours,
                    &mut p.price_variance,
                    &mut p.jobs_contract_cost,
                ] {
                    *value = value.normalize();
                }
                p
            })
            .collect(),
    })
}

/// What the records on each price's nodes cost under their own contracts within the price's
/// period, in the price's currency (at the FX rate of each hour's month; records whose
/// contract's currency has no rate into it are left out).
async fn jobs_contract_cost(
    conn: &mut PgConnection,
    prices: &[&BilledPrice],
    since: DateTime<Utc>,
    until: DateTime<Utc>,
) -> LedgerResult<HashMap<Uuid, Decimal>> {
    let nodes: Vec<String> = prices
        .iter()
        .flat_map(|p| p.nodes.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut out = HashMap::new();
    if nodes.is_empty() {
        return Ok(out);
    }
    let uses = store::bills::contract_use_on_nodes(conn, &nodes, since, until).await?;
    let mut contracts = HashMap::new();
    for (_, _, contract, _) in &uses {
        if !contracts.contains_key(contract)
            && let Some(row) = store::contracts::get(conn, *contract, false).await?
        {
            contracts.insert(*contract, row.to_domain());
        }
    }
    let months: Vec<chrono::NaiveDate> = uses
        .iter()
        .map(|(_, hour, _, _)| crate::domain::ledger_time::first_of_month(hour.date_naive()))
        .collect();
    let currencies: Vec<String> = prices
        .iter()
        .map(|p| p.currency.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let fx = match (months.iter().min(), months.iter().max()) {
        (Some(first), Some(last)) => {
            store::fx_rates::table(conn, *first, *last, &currencies).await?
        }
        _ => return Ok(out),
    };
    let mut prices_of_node: HashMap<&str, Vec<&BilledPrice>> = HashMap::new();
    for price in prices {
        for node in &price.nodes {
            prices_of_node.entry(node).or_default().push(price);
        }
    }
    for (node, hour, contract, card_seconds) in uses {
        let Some(price) = prices_of_node
            .get(node.as_str())
            .and_then(|of_node| of_node.iter().find(|p| p.from <= hour && hour < p.until))
        else {
            continue;
        };
        let Some(contract) = contracts.get(&contract) else {
            continue;
        };
        let month = crate::domain::ledger_time::first_of_month(hour.date_naive());
        let Some(rate) = fx.conversion(month, &contract.currency, &price.currency) else {
            continue;
        };
        *out.entry(price.id).or_default() += card_seconds * contract.price_per_gpu_hour * rate
            / crate::domain::ledger_time::SECONDS_PER_HOUR;
    }
    Ok(out)
}
