//! The monthly report for finance (COST_MODEL.md §1.7, §2, §6): a row per project, the
//! `shared` unused commitment of unscoped contracts, prior-period adjustments and grand totals
//! per currency. A closed month's report is frozen as the JSON it had at close; what changes
//! a closed month afterwards is booked into the first open month after it as an adjustment.

mod adjustments;
mod csv;
mod lines;
mod model;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::figures::Grouping;
use crate::domain::ledger_time::month_bounds;
use crate::domain::values::Month;
use crate::domain::what_if::WhatIf;
use crate::ledger::channels;
use crate::ledger::{LedgerError, LedgerResult, audit};
use crate::store;

pub use self::csv::to_csv;
use self::model::totals;
pub use self::model::{
    AdjustmentLine, Amounts, CommitmentLine, MonthlyReport, ProjectLine, Report, SharedContract,
    SharedLine, TotalLine,
};

/// The report of a month. An open month's closes, lines and adjustments are read in one
/// snapshot, so that they agree with each other even while records are being rated.
///
/// With `what_if` prices the report is hypothetical: every month, a closed one too, is
/// computed at those prices from the rated data, and nothing is stored.
pub async fn report(
    pool: &PgPool,
    month: Month,
    grouping: Grouping,
    what_if: &WhatIf,
    settings: &Settings,
) -> LedgerResult<Report> {
    let mut snapshot = store::snapshot(pool).await?;
    let closes = store::closes::all(&mut snapshot).await?;
    if !what_if.is_empty() {
        let mut aside = store::snapshot_aside(pool, &mut snapshot).await?;
        let mut report = live_report(
            (&mut snapshot, aside.as_deref_mut()),
            month,
            grouping,
            what_if,
            settings,
            &closes,
        )
        .await?;
        snapshot.commit().await?;
        report.hypothetical = true;
        report.overrides = what_if.overrides();
        return Ok(Report::Live(report));
    }
    if let Some(close) = closes.iter().find(|c| c.month == month.first_day()) {
        if grouping != Grouping::Whole {
            return Err(LedgerError::conflict(format!(
                "{month} is closed: its report is frozen without groups"
            )));
        }
        return Ok(Report::Frozen(close.report_json.clone()));
    }
    let mut aside = store::snapshot_aside(pool, &mut snapshot).await?;
    let report = live_report(
        (&mut snapshot, aside.as_deref_mut()),
        month,
        grouping,
        &WhatIf::default(),
        settings,
        &closes,
    )
    .await?;
    snapshot.commit().await?;
    Ok(Report::Live(report))
}

/// Closes a month: computes its report as of the month's end and freezes it. The report is
/// computed in one snapshot, like a live one.
pub async fn close(
    pool: &PgPool,
    month: Month,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<String> {
    let now = settings.clock.now();
    let (_, end) = month_bounds(month.first_day(), settings.timezone);
    if now < end {
        return Err(LedgerError::conflict(format!(
            "{month} has not ended yet (it ends at {end}); only past months can be closed"
        )));
    }
    let mut snapshot = store::snapshot(pool).await?;
    let closes = store::closes::all(&mut snapshot).await?;
    if closes.iter().any(|c| c.month == month.first_day()) {
        return Err(LedgerError::conflict(format!("{month} is already closed")));
    }
    let mut aside = store::snapshot_aside(pool, &mut snapshot).await?;
    let mut report = live_report(
        (&mut snapshot, aside.as_deref_mut()),
        month,
        Grouping::Whole,
        &WhatIf::default(),
        settings,
        &closes,
    )
    .await?;
    snapshot.commit().await?;
    report.closed = true;
    report.closed_at = Some(now);
    let json = serde_json::to_string(&report).map_err(anyhow::Error::from)?;
    let mut tx = pool.begin().await?;
    if !store::closes::close(&mut tx, month.first_day(), now, actor.token_id(), &json).await? {
        return Err(LedgerError::conflict(format!("{month} is already closed")));
    }
    channels::queue_month_close(&mut tx, Uuid::new_v4(), month, now, &to_csv(&json)?).await?;
    // The frozen report is kept whole in `month_closes`; the log keeps what it came to.
    let after = serde_json::json!({
        "month": month.to_string(),
        "closed_at": now,
        "projects": report.projects.len(),
        "totals": audit::snapshot(&report.totals),
    });
    let change = Change::new("month_close", month.to_string(), "close", None, Some(after));
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    tracing::info!(month = %month, "month closed");
    Ok(json)
}

/// The report of an open month, read on `conn` and, where two statements can run at once,
/// on `aside` too (the same snapshot).
async fn live_report(
    (conn, mut aside): (&mut PgConnection, Option<&mut PgConnection>),
    month: Month,
    grouping: Grouping,
    what_if: &WhatIf,
    settings: &Settings,
    closes: &[store::closes::CloseRow],
) -> LedgerResult<MonthlyReport> {
    let tz = settings.timezone;
    let (_, end) = month_bounds(month.first_day(), tz);
    let as_of = settings.clock.now().min(end);
    let lines::MonthLines {
        projects,
        shared,
        commitments,
        pools,
    } = lines::month_lines(
        conn,
        aside.as_deref_mut(),
        month,
        grouping,
        as_of,
        what_if,
        settings,
    )
    .await?;
    let adjustments =
        adjustments::adjustments(conn, aside, month, closes, what_if, settings).await?;
    let totals = totals(&projects, &shared, &pools, &adjustments);
    Ok(MonthlyReport {
        month,
        closed: false,
        closed_at: None,
        as_of,
        ends_at: Some(end),
        projects,
        shared,
        commitments,
        pools,
        adjustments,
        totals,
        hypothetical: false,
        overrides: Vec::new(),
    })
}
