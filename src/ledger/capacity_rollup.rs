//! The capacity rollup (migration 0017): per node, ledger day and pool, the used time
//! capped at each hour's up time, the overbooked time and the `by_usage` weights, so that a
//! read takes a row per node-day instead of every job's hours.
//!
//! Whoever changes what a node-day's row is made of rewrites it in the same transaction,
//! holding the node's advisory lock: a capacity post for the days its intervals (and those
//! it replaces) cover, rating for the days whose hourly usage it changed. The rows are
//! worked out after the lock is taken, from what is committed then and the transaction's
//! own changes, so the last writer of a node always leaves the rows its data makes; a
//! reader's snapshot holds a node's data and its rows from the same commits.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use sqlx::{PgConnection, PgPool};

use crate::domain::capacity::{day_bounds, node_day_rollup};
use crate::store;
use crate::store::capacity::{IntervalsOf, NodeSpan};
use crate::store::rating::NodeHours;

/// The setting naming the ledger time zone the rollup's days are of.
const SETTING_TIMEZONE: &str = "capacity_rollup_timezone";

/// Spans of at most [`DAYS_PER_REBUILD_SPAN`] days rebuilt per step when the whole rollup is
/// rebuilt, which bounds the hourly usage held at once.
const SPANS_PER_REBUILD_STEP: usize = 100;
const DAYS_PER_REBUILD_SPAN: i64 = 31;

/// Rewrites the rollup rows of the node-days whose hourly usage a rating changed.
pub async fn refresh_rated(
    conn: &mut PgConnection,
    touched: NodeHours,
    tz: Tz,
) -> sqlx::Result<()> {
    if touched.is_empty() {
        return Ok(());
    }
    let days: BTreeSet<(String, NaiveDate)> = touched
        .0
        .into_iter()
        .map(|(node, hour)| (node, hour.with_timezone(&tz).date_naive()))
        .collect();
    let mut spans: Vec<(String, NaiveDate, NaiveDate)> = Vec::new();
    for (node, day) in days {
        let next = day.succ_opt().expect("a day before the end of time");
        match spans.last_mut() {
            Some((last_node, _, end)) if *last_node == node && *end == day => *end = next,
            _ => spans.push((node, day, next)),
        }
    }
    refresh(conn, spans, tz).await
}

/// Rewrites the rollup rows of every ledger day that `[from, to)` of each node touches.
pub async fn refresh_spans(
    conn: &mut PgConnection,
    spans: impl IntoIterator<Item = (String, DateTime<Utc>, DateTime<Utc>)>,
    tz: Tz,
) -> sqlx::Result<()> {
    let mut by_node: BTreeMap<String, Vec<(NaiveDate, NaiveDate)>> = BTreeMap::new();
    for (node, from, to) in spans {
        let first = from.with_timezone(&tz).date_naive();
        let last = (to - chrono::TimeDelta::nanoseconds(1))
            .with_timezone(&tz)
            .date_naive();
        let end = last.succ_opt().expect("a day before the end of time");
        by_node.entry(node).or_default().push((first, end));
    }
    let mut merged = Vec::new();
    for (node, mut days) in by_node {
        days.sort_unstable();
        let mut current: Option<(NaiveDate, NaiveDate)> = None;
        for (first, end) in days {
            current = match current {
                Some((f, e)) if first <= e => Some((f, e.max(end))),
                Some(done) => {
                    merged.push((node.clone(), done.0, done.1));
                    Some((first, end))
                }
                None => Some((first, end)),
            };
        }
        if let Some((first, end)) = current {
            merged.push((node, first, end));
        }
    }
    refresh(conn, merged, tz).await
}

/// Locks the nodes of `spans` (node, first day, day after the last; one span per node-day
/// at most) and rewrites their rows.
async fn refresh(
    conn: &mut PgConnection,
    spans: Vec<(String, NaiveDate, NaiveDate)>,
    tz: Tz,
) -> sqlx::Result<()> {
    if spans.is_empty() {
        return Ok(());
    }
    let nodes: Vec<&str> = spans.iter().map(|s| s.0.as_str()).collect();
    store::capacity::lock_nodes(conn, &nodes).await?;
    rewrite(conn, &spans, tz).await
}

/// Works out and stores the rows of `spans`; the caller holds their nodes' locks or the
/// rollup's.
async fn rewrite(
    conn: &mut PgConnection,
    spans: &[(String, NaiveDate, NaiveDate)],
    tz: Tz,
) -> sqlx::Result<()> {
    let instants: Vec<NodeSpan> = spans
        .iter()
        .map(|(node, first, end)| NodeSpan {
            node: node.clone(),
            from: day_bounds(*first, tz).0,
            to: day_bounds(*end, tz).0,
        })
        .collect();
    let usage = store::capacity::usage_hours(conn, &instants).await?;
    let (rows, unmatched) = if usage.is_empty() {
        (Vec::new(), Vec::new())
    } else {
        let from = instants.iter().map(|s| s.from).min().expect("spans");
        let to = instants.iter().map(|s| s.to).max().expect("spans");
        let mut nodes: Vec<String> = usage.iter().map(|u| u.node.clone()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let intervals =
            store::capacity::intervals(conn, IntervalsOf::Nodes(&nodes), from, to).await?;
        node_day_rollup(&intervals, &usage, tz)
    };
    store::capacity::replace_node_days(conn, spans, &rows, &unmatched).await
}

/// Rebuilds the whole rollup when it was built for another ledger time zone than `tz` (or
/// never), holding the rollup's lock exclusive meanwhile; true when it rebuilt it.
pub async fn align_to_time_zone(pool: &PgPool, tz: Tz) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    store::capacity::lock_rollup(&mut tx).await?;
    let built_for = store::settings::get(&mut tx, SETTING_TIMEZONE).await?;
    if built_for.as_deref() == Some(tz.name()) {
        return Ok(false);
    }
    rebuild(&mut tx, tz).await?;
    store::settings::put(&mut tx, SETTING_TIMEZONE, tz.name()).await?;
    tx.commit().await?;
    Ok(true)
}

/// Rebuilds every row of the rollup from the hourly usage and the intervals, for the
/// ledger time zone `tz`; the caller holds the rollup's lock exclusive.
pub async fn rebuild(conn: &mut PgConnection, tz: Tz) -> sqlx::Result<()> {
    store::capacity::clear_node_days(conn).await?;
    let mut spans: Vec<(String, NaiveDate, NaiveDate)> = Vec::new();
    for (node, first, last) in store::capacity::nodes_with_usage(conn).await? {
        let end = last
            .with_timezone(&tz)
            .date_naive()
            .succ_opt()
            .expect("a day before the end of time");
        let mut from = first.with_timezone(&tz).date_naive();
        while from < end {
            let to = (from + chrono::TimeDelta::days(DAYS_PER_REBUILD_SPAN)).min(end);
            spans.push((node.clone(), from, to));
            from = to;
        }
    }
    for step in spans.chunks(SPANS_PER_REBUILD_STEP) {
        rewrite(conn, step, tz).await?;
    }
    Ok(())
}
