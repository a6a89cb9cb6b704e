//! The monthly report for finance (COST_MODEL.md §1.7, §2, §6): a row per project, the
//! `shared` unused commitment of unscoped contracts, prior-period adjustments and grand totals
//! per currency. A closed month's report is frozen as the JSON it had at close; what changes
//! a closed month afterwards is booked into the first open month after it as an adjustment.

mod adjustments;
mod csv;
mod lines;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::figures::{Figures, Grouping};
use crate::domain::ledger_time::month_bounds;
use crate::domain::values::Month;
use crate::ledger::cost::GroupView;
use crate::ledger::{LedgerError, LedgerResult};
use crate::store;

pub use self::csv::{round_money, to_csv};

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MonthlyReport {
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// A closed month's report never changes.
    pub closed: bool,
    pub closed_at: Option<DateTime<Utc>>,
    /// Unused commitment is accrued up to this instant: now, or the month's end once it ended.
    pub as_of: DateTime<Utc>,
    pub projects: Vec<ProjectLine>,
    /// Unused commitment of reserved contracts scoped to no project, per currency.
    pub shared: Vec<SharedLine>,
    /// Changes to closed months booked here, each with the month it belongs to.
    pub adjustments: Vec<AdjustmentLine>,
    pub totals: Vec<TotalLine>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProjectLine {
    pub project: String,
    pub name: String,
    pub team: Option<String>,
    pub currency: String,
    #[serde(flatten)]
    pub figures: Figures,
    /// The month's budget (its own, else the project's default).
    #[schema(value_type = Option<String>)]
    pub budget: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub burn_pct: Option<Decimal>,
    /// With `group_by`: the project's figures per group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupView>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SharedLine {
    pub currency: String,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
    #[schema(value_type = String)]
    pub unused_gpu_hours: Decimal,
    pub contracts: Vec<SharedContract>,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SharedContract {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    #[schema(value_type = String)]
    pub unused_gpu_hours: Decimal,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AdjustmentLine {
    /// The project; null for the shared unused commitment.
    pub project: Option<String>,
    /// The closed month the change belongs to.
    #[schema(value_type = String, example = "2026-10")]
    pub belongs_to: Month,
    pub currency: String,
    #[serde(flatten)]
    pub amounts: Amounts,
}

/// The money figures of a line; adjustments carry their differences.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Amounts {
    #[schema(value_type = String)]
    pub total: Decimal,
    #[schema(value_type = String)]
    pub productive: Decimal,
    #[schema(value_type = String)]
    pub idle: Decimal,
    #[schema(value_type = String)]
    pub unmeasured: Decimal,
    #[schema(value_type = String)]
    pub failed: Decimal,
    #[schema(value_type = String)]
    pub unused_commitment: Decimal,
}

impl Amounts {
    /// The amounts in the order of the CSV's money columns.
    fn values(&self) -> [Decimal; 6] {
        [
            self.total,
            self.productive,
            self.idle,
            self.unmeasured,
            self.failed,
            self.unused_commitment,
        ]
    }
}

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TotalLine {
    pub currency: String,
    /// The projects' totals.
    #[schema(value_type = String)]
    pub projects: Decimal,
    #[schema(value_type = String)]
    pub shared: Decimal,
    #[schema(value_type = String)]
    pub adjustments: Decimal,
    /// projects + shared + adjustments.
    #[schema(value_type = String)]
    pub total: Decimal,
}

/// The report of a month: the frozen JSON of a closed month, or the live figures of an open
/// one (`group_by` adds per-group figures to open months only).
pub enum Report {
    Frozen(String),
    Live(MonthlyReport),
}

impl Report {
    pub fn to_json(&self) -> LedgerResult<String> {
        match self {
            Report::Frozen(json) => Ok(json.clone()),
            Report::Live(report) => Ok(serde_json::to_string(report).map_err(anyhow::Error::from)?),
        }
    }
}

/// The report of a month. An open month's closes, lines and adjustments are read in one
/// snapshot, so that they agree with each other even while records are being rated.
pub async fn report(
    pool: &PgPool,
    month: Month,
    grouping: Grouping,
    settings: &Settings,
) -> LedgerResult<Report> {
    let mut snapshot = store::snapshot(pool).await?;
    let closes = store::closes::all(&mut snapshot).await?;
    if let Some(close) = closes.iter().find(|c| c.month == month.first_day()) {
        if grouping != Grouping::Whole {
            return Err(LedgerError::conflict(format!(
                "{month} is closed: its report is frozen without groups"
            )));
        }
        return Ok(Report::Frozen(close.report_json.clone()));
    }
    let report = live_report(&mut snapshot, month, grouping, settings, &closes).await?;
    snapshot.commit().await?;
    Ok(Report::Live(report))
}

/// Closes a month: computes its report as of the month's end and freezes it. The report is
/// computed in one snapshot, like a live one.
pub async fn close(
    pool: &PgPool,
    month: Month,
    closed_by: Uuid,
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
    let mut report = live_report(&mut snapshot, month, Grouping::Whole, settings, &closes).await?;
    snapshot.commit().await?;
    report.closed = true;
    report.closed_at = Some(now);
    let json = serde_json::to_string(&report).map_err(anyhow::Error::from)?;
    if !store::closes::close(pool, month.first_day(), now, closed_by, &json).await? {
        return Err(LedgerError::conflict(format!("{month} is already closed")));
    }
    tracing::info!(month = %month, "month closed");
    Ok(json)
}

async fn live_report(
    conn: &mut PgConnection,
    month: Month,
    grouping: Grouping,
    settings: &Settings,
    closes: &[store::closes::CloseRow],
) -> LedgerResult<MonthlyReport> {
    let tz = settings.timezone;
    let (_, end) = month_bounds(month.first_day(), tz);
    let as_of = settings.clock.now().min(end);
    let (projects, shared) = lines::month_lines(conn, month, grouping, as_of, settings).await?;
    let adjustments = adjustments::adjustments(conn, month, closes, settings).await?;
    let totals = totals(&projects, &shared, &adjustments);
    Ok(MonthlyReport {
        month,
        closed: false,
        closed_at: None,
        as_of,
        projects,
        shared,
        adjustments,
        totals,
    })
}

fn totals(
    projects: &[ProjectLine],
    shared: &[SharedLine],
    adjustments: &[AdjustmentLine],
) -> Vec<TotalLine> {
    fn entry<'a>(totals: &'a mut BTreeMap<String, TotalLine>, currency: &str) -> &'a mut TotalLine {
        totals
            .entry(currency.to_owned())
            .or_insert_with(|| TotalLine {
                currency: currency.to_owned(),
                projects: Decimal::ZERO,
                shared: Decimal::ZERO,
                adjustments: Decimal::ZERO,
                total: Decimal::ZERO,
            })
    }
    let mut totals: BTreeMap<String, TotalLine> = BTreeMap::new();
    for line in projects {
        entry(&mut totals, &line.currency).projects += line.figures.total;
    }
    for line in shared {
        entry(&mut totals, &line.currency).shared += line.unused_commitment;
    }
    for line in adjustments {
        entry(&mut totals, &line.currency).adjustments += line.amounts.total;
    }
    totals
        .into_values()
        .map(|mut line| {
            line.total = (line.projects + line.shared + line.adjustments).normalize();
            line.projects = line.projects.normalize();
            line.shared = line.shared.normalize();
            line.adjustments = line.adjustments.normalize();
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::domain::figures::{FigureSums, RecordCounts, SegmentSums};
    use crate::domain::rating::Outcome;

    fn d(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    /// Figures with every kind of field set: counts, unrated time, output and amounts carried
    /// to 20 decimal places.
    fn figures() -> Figures {
        let mut sums = FigureSums::default();
        sums.add_segments(&SegmentSums {
            outcome: Outcome::Completed,
            gpu_model: "H100".to_owned(),
            unrated_reason: None,
            output_unit: Some("tokens".to_owned()),
            gpu_seconds_held: d("7200"),
            gpu_seconds_busy: d("5400.5"),
            cost: d("84.60"),
            productive: d("63.45"),
            idle: d("21.15"),
            unmeasured: Decimal::ZERO,
            failed: Decimal::ZERO,
            output_quantity: d("1000000"),
        });
        sums.add_segments(&SegmentSums {
            outcome: Outcome::Failed,
            gpu_model: "A100".to_owned(),
            unrated_reason: Some("no_contract".to_owned()),
            output_unit: None,
            gpu_seconds_held: d("3600"),
            gpu_seconds_busy: Decimal::ZERO,
            cost: Decimal::ZERO,
            productive: Decimal::ZERO,
            idle: Decimal::ZERO,
            unmeasured: Decimal::ZERO,
            failed: Decimal::ZERO,
            output_quantity: Decimal::ZERO,
        });
        sums.add_records(&RecordCounts {
            retries: 2,
            failures: 1,
            tasks_completed: 3,
            tasks_failed: 1,
        });
        sums.add_unused_commitment(d("0.33333333333333333333"));
        sums.figures()
    }

    fn frozen_report() -> MonthlyReport {
        let closed_at = Utc.with_ymd_and_hms(2026, 12, 2, 9, 30, 0).unwrap();
        let figures = figures();
        MonthlyReport {
            month: Month::parse("2026-11").unwrap(),
            closed: true,
            closed_at: Some(closed_at),
            as_of: Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap(),
            projects: vec![ProjectLine {
                project: "vision".to_owned(),
                name: "Vision".to_owned(),
                team: None,
                currency: "USD".to_owned(),
                budget: Some(d("1000")),
                burn_pct: Some(d("8.493333333333333333")),
                groups: vec![
                    GroupView {
                        key: Some("H100".to_owned()),
                        figures: figures.clone(),
                    },
                    GroupView {
                        key: None,
                        figures: figures.clone(),
                    },
                ],
                figures,
            }],
            shared: vec![SharedLine {
                currency: "EUR".to_owned(),
                unused_commitment: d("1430"),
                unused_gpu_hours: d("715"),
                contracts: vec![SharedContract {
                    id: Uuid::nil(),
                    name: "pool".to_owned(),
                    gpu_model: "H100".to_owned(),
                    unused_gpu_hours: d("715"),
                    unused_commitment: d("1430"),
                }],
            }],
            adjustments: vec![AdjustmentLine {
                project: None,
                belongs_to: Month::parse("2026-10").unwrap(),
                currency: "EUR".to_owned(),
                amounts: Amounts {
                    total: d("-2.5"),
                    unused_commitment: d("-2.5"),
                    ..Amounts::default()
                },
            }],
            totals: vec![TotalLine {
                currency: "USD".to_owned(),
                projects: d("84.93333333333333333333"),
                shared: Decimal::ZERO,
                adjustments: Decimal::ZERO,
                total: d("84.93333333333333333333"),
            }],
        }
    }

    /// The flattened figures hold integers (task counts), which serde_json's
    /// `arbitrary_precision` could not read through `#[serde(flatten)]` before 1.0.75; the
    /// decimals must come back with every digit and their scale.
    #[test]
    fn a_frozen_report_reads_back_as_it_was_written() {
        let written = frozen_report();
        let json = serde_json::to_string(&written).unwrap();
        let read: MonthlyReport = serde_json::from_str(&json).unwrap();
        assert_eq!(read.projects[0].figures, written.projects[0].figures);
        assert_eq!(read.projects[0].figures.tasks_completed, 3);
        assert_eq!(read.projects[0].figures.tasks_failed, 1);
        assert_eq!(read.projects[0].groups[1].figures.retries, 2);
        assert_eq!(read.adjustments[0].amounts, written.adjustments[0].amounts);
        assert_eq!(serde_json::to_string(&read).unwrap(), json);
    }
}
