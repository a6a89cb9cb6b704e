//! What a monthly report is made of: its lines, their amounts and totals. The same types
//! are written when a month closes and read back from its frozen JSON.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::figures::Figures;
use crate::domain::values::Month;
use crate::domain::what_if::PriceOverride;
use crate::ledger::LedgerResult;
use crate::ledger::capacity::PoolUtilisation;
use crate::ledger::cost::GroupView;

#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct MonthlyReport {
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// A closed month's report never changes.
    pub closed: bool,
    pub closed_at: Option<DateTime<Utc>>,
    /// Unused commitment is accrued up to this instant: now, or the month's end once it ended.
    pub as_of: DateTime<Utc>,
    /// The month's end in the ledger time zone: it can be closed once `as_of` reaches it.
    /// Absent from reports frozen before it was added.
    #[serde(default)]
    pub ends_at: Option<DateTime<Utc>>,
    pub projects: Vec<ProjectLine>,
    /// Unused commitment of reserved contracts scoped to no project, per currency.
    pub shared: Vec<SharedLine>,
    /// Every reserved contract that commits GPUs in the month, scoped or shared: what it
    /// committed up to `as_of` and how much of that was used. Absent from reports frozen
    /// before it was added.
    #[serde(default)]
    pub commitments: Vec<CommitmentLine>,
    /// Every capacity pool with intervals in the month: paid, used, idle and down, and who
    /// was charged its idle and down time. Absent from reports frozen before it was added.
    #[serde(default)]
    pub pools: Vec<PoolUtilisation>,
    /// Changes to closed months booked here, each with the month it belongs to.
    pub adjustments: Vec<AdjustmentLine>,
    pub totals: Vec<TotalLine>,
    /// Present and true when the report was asked with `what_if` prices: it shows what the
    /// month would have cost at them, and nothing was stored.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hypothetical: bool,
    /// The prices it was read with in place of those in force (with `what_if` only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<PriceOverride>,
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
    /// total × hours in the month / hours elapsed by `as_of` (the burn's linear forecast);
    /// null before 72 hours of the month have passed. Absent from reports frozen before it
    /// was added.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub forecast: Option<Decimal>,
    /// forecast / budget × 100; null without a budget or a forecast.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub forecast_pct: Option<Decimal>,
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

/// A reserved contract's commitment in the month, up to the report's `as_of`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct CommitmentLine {
    pub id: Uuid,
    pub name: String,
    /// The project its unused commitment is charged to; null for a shared contract.
    pub project: Option<String>,
    pub gpu_model: String,
    /// The contract's currency, that of `unused_commitment`.
    pub currency: String,
    #[schema(value_type = String)]
    pub committed_gpus: Decimal,
    /// committed GPUs × the hours of its validity in the month up to `as_of`.
    #[schema(value_type = String)]
    pub committed_gpu_hours: Decimal,
    /// The committed GPU-hours that rated GPU time used: per ledger hour, the lesser of the
    /// commitment and the use.
    #[schema(value_type = String)]
    pub used_gpu_hours: Decimal,
    /// committed − used.
    #[schema(value_type = String)]
    pub unused_gpu_hours: Decimal,
    /// The unused GPU-hours at the contract's price.
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
    /// Absent from reports frozen before capacity was reported.
    #[serde(default)]
    #[schema(value_type = String)]
    pub capacity_idle: Decimal,
    #[serde(default)]
    #[schema(value_type = String)]
    pub capacity_down: Decimal,
}

impl Amounts {
    /// The amounts in the order of the CSV's money columns.
    pub(super) fn values(&self) -> [Decimal; 8] {
        [
            self.total,
            self.productive,
            self.idle,
            self.unmeasured,
            self.failed,
            self.unused_commitment,
            self.capacity_idle,
            self.capacity_down,
        ]
    }

    pub(super) fn from_values(values: [Decimal; 8]) -> Self {
        let [
            total,
            productive,
            idle,
            unmeasured,
            failed,
            unused_commitment,
            capacity_idle,
            capacity_down,
        ] = values;
        Self {
            total,
            productive,
            idle,
            unmeasured,
            failed,
            unused_commitment,
            capacity_idle,
            capacity_down,
        }
    }

    /// `self + sign × other`, amount by amount.
    pub(super) fn combine(&self, other: &Amounts, sign: Decimal) -> Amounts {
        let (a, b) = (self.values(), other.values());
        Amounts::from_values(std::array::from_fn(|i| a[i] + sign * b[i]))
    }

    pub(super) fn is_zero(&self) -> bool {
        self.values().iter().all(Decimal::is_zero)
    }

    pub(super) fn normalized(self) -> Amounts {
        Amounts::from_values(self.values().map(|v| v.normalize()))
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
    /// Idle and down cost of capacity kept on pools' own lines (charged to no project).
    #[serde(default)]
    #[schema(value_type = String)]
    pub pools: Decimal,
    #[schema(value_type = String)]
    pub adjustments: Decimal,
    /// projects + shared + pools + adjustments.
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

/// Grand totals per currency: the projects' totals, the shared unused commitment and the
/// adjustments, each summed unrounded.
pub(super) fn totals(
    projects: &[ProjectLine],
    shared: &[SharedLine],
    pools: &[PoolUtilisation],
    adjustments: &[AdjustmentLine],
) -> Vec<TotalLine> {
    fn entry<'a>(totals: &'a mut BTreeMap<String, TotalLine>, currency: &str) -> &'a mut TotalLine {
        totals
            .entry(currency.to_owned())
            .or_insert_with(|| TotalLine {
                currency: currency.to_owned(),
                projects: Decimal::ZERO,
                shared: Decimal::ZERO,
                pools: Decimal::ZERO,
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
    for line in pools {
        if let Some(currency) = &line.currency {
            let kept = &line.kept_on_pool;
            entry(&mut totals, currency).pools += kept.capacity_idle + kept.capacity_down;
        }
    }
    for line in adjustments {
        entry(&mut totals, &line.currency).adjustments += line.amounts.total;
    }
    totals
        .into_values()
        .map(|mut line| {
            line.total = (line.projects + line.shared + line.pools + line.adjustments).normalize();
            line.pools = line.pools.normalize();
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
    use uuid::Uuid;

    use super::*;
    use crate::domain::figures::{FigureSums, RecordCounts, SegmentSums};

    fn d(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    /// Figures with every kind of field set: counts, unrated time, output and amounts carried
    /// to 20 decimal places.
    fn figures() -> Figures {
        let mut sums = FigureSums::default();
        sums.add_segments(&SegmentSums {
            completed: true,
            unrated: None,
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
            completed: false,
            unrated: Some(("no_contract".to_owned(), "A100".to_owned())),
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
            ends_at: Some(Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap()),
            projects: vec![ProjectLine {
                project: "vision".to_owned(),
                name: "Vision".to_owned(),
                team: None,
                currency: "USD".to_owned(),
                budget: Some(d("1000")),
                burn_pct: Some(d("8.493333333333333333")),
                forecast: Some(d("84.93333333333333333333")),
                forecast_pct: Some(d("8.493333333333333333")),
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
            commitments: vec![CommitmentLine {
                id: Uuid::nil(),
                name: "pool".to_owned(),
                project: None,
                gpu_model: "H100".to_owned(),
                currency: "EUR".to_owned(),
                committed_gpus: d("1"),
                committed_gpu_hours: d("720"),
                used_gpu_hours: d("5"),
                unused_gpu_hours: d("715"),
                unused_commitment: d("1430"),
            }],
            pools: Vec::new(),
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
                pools: Decimal::ZERO,
                adjustments: Decimal::ZERO,
                total: d("84.93333333333333333333"),
            }],
            hypothetical: false,
            overrides: Vec::new(),
        }
    }

    /// A month frozen before the forecast and the commitments were reported reads back
    /// without them.
    #[test]
    fn a_report_frozen_without_the_newer_fields_reads_back() {
        let mut json = serde_json::to_value(frozen_report()).unwrap();
        json.as_object_mut().unwrap().remove("commitments");
        json.as_object_mut().unwrap().remove("ends_at");
        let project = json["projects"][0].as_object_mut().unwrap();
        project.remove("forecast");
        project.remove("forecast_pct");
        let read: MonthlyReport = serde_json::from_value(json).unwrap();
        assert!(read.commitments.is_empty());
        assert_eq!(read.projects[0].forecast, None);
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
        assert_eq!(read.projects[0].forecast, written.projects[0].forecast);
        assert_eq!(read.commitments[0].used_gpu_hours, d("5"));
        assert_eq!(serde_json::to_string(&read).unwrap(), json);
    }
}
