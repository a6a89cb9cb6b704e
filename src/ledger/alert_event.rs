//! An alert as it fired: what it is about and the figures it carries, as the API lists it,
//! as the project's signed webhook receives it, and as notification channels say it.

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::burn::AlertKind;
use crate::domain::idle::IdleMeasure;
use crate::domain::route::RouteRef;
use crate::domain::values::{Month, round_money};
use crate::ledger::efficiency::FactorsView;
use crate::store::alerts::AlertRow;

/// What an alert event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlertEventKind {
    /// The month's spend reached a threshold of its budget.
    Actual,
    /// The month's linear forecast reached its budget.
    Forecast,
    /// A finished record held GPUs that did next to nothing.
    IdleGpu,
    /// A node of a capacity pool has been up and paid with no job on it for longer than
    /// its pool allows.
    ZombieCapacity,
    /// A route's task went beyond its attempts cap, or its failed attempts cost more than
    /// its cap within one ledger hour.
    RetryStorm,
    /// A workload's daily cost per unit shifted above its baseline by the project's
    /// threshold.
    EfficiencyRegression,
}

impl AlertEventKind {
    fn parse(raw: &str) -> Option<Self> {
        match AlertKind::parse(raw) {
            Some(AlertKind::Actual) => Some(Self::Actual),
            Some(AlertKind::Forecast) => Some(Self::Forecast),
            None => match raw {
                "idle_gpu" => Some(Self::IdleGpu),
                "zombie_capacity" => Some(Self::ZombieCapacity),
                "retry_storm" => Some(Self::RetryStorm),
                "efficiency_regression" => Some(Self::EfficiencyRegression),
                _ => None,
            },
        }
    }
}

/// An alert as it fired; also the JSON document POSTed to the project's webhook. Budget
/// alerts (`actual`, `forecast`) carry `threshold`, `spend`, `budget` and `burn_pct`, and
/// `idle_gpu` is null; an `idle_gpu` alert carries `idle_gpu`, and those are null.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AlertEvent {
    /// Stable: receivers use it to drop repeats.
    pub id: Uuid,
    pub project: String,
    /// The budget's month; for an idle-GPU alert, the month holding the record's end.
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// Percent of the month's budget; null for an idle-GPU alert.
    pub threshold: Option<i32>,
    pub kind: AlertEventKind,
    pub currency: String,
    #[schema(value_type = Option<String>)]
    pub spend: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub budget: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub burn_pct: Option<Decimal>,
    /// The month's linear forecast when it fired, if there was one.
    #[schema(value_type = Option<String>)]
    pub forecast: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
    pub idle_gpu: Option<IdleGpuAlert>,
    /// The idle stretch of a `zombie_capacity` alert; null for the other kinds.
    pub zombie_capacity: Option<ZombieAlert>,
    /// The route (label key and value) of a route's budget alert or of a `retry_storm`;
    /// null for a project's own alerts.
    pub route: Option<RouteRef>,
    /// What a `retry_storm` alert found; null for the other kinds.
    pub retry_storm: Option<RetryStormAlert>,
    /// What an `efficiency_regression` alert found; null for the other kinds.
    pub efficiency_regression: Option<RegressionAlert>,
}

/// A level shift of a workload's daily direct cost per unit: the medians that moved, what
/// the shift costs a day, the rule it broke, and the three factors of the change from the
/// baseline's totals to the window's (the split of `GET /v1/projects/{id}/efficiency`, over
/// the attempts that ended in each span).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RegressionAlert {
    pub workload: String,
    pub unit: String,
    /// The first and last day of the window, and the first day of the baseline before it.
    pub window_from: NaiveDate,
    pub window_to: NaiveDate,
    pub baseline_from: NaiveDate,
    /// Median daily cost per unit over the baseline's days with output.
    #[schema(value_type = String, example = "0.01")]
    pub baseline_cost_per_unit: Decimal,
    /// The baseline's day-to-day noise: 1.4826 × the median absolute deviation of its days'
    /// cost per unit. The level must rise by more than three times it.
    #[schema(value_type = String, example = "0.0004")]
    pub baseline_noise: Decimal,
    /// Lower median daily cost per unit over the window's days with output.
    #[schema(value_type = String, example = "0.016")]
    pub window_cost_per_unit: Decimal,
    /// window ÷ baseline − 1.
    #[schema(value_type = Option<String>, example = "0.6")]
    pub change: Option<Decimal>,
    /// What the shift costs a day at the window's output per day, in `currency`.
    #[schema(value_type = String, example = "24")]
    pub extra_cost_per_day: Decimal,
    /// Completed records with output in the unit that ended in the window.
    pub records: u64,
    /// The project's rule when it fired.
    #[schema(value_type = String, example = "0.25")]
    pub threshold: Decimal,
    #[schema(value_type = String, example = "10")]
    pub min_extra_cost: Decimal,
    /// Window ÷ baseline of price, throughput and overhead over the two spans' totals; null
    /// when either span has no output in the unit.
    pub factors: Option<FactorsView>,
    /// `price`, `throughput` or `overhead`: the factor that moved most.
    pub largest: Option<String>,
}

impl RegressionAlert {
    fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        let stored = row
            .regression
            .clone()
            .ok_or_else(|| anyhow::anyhow!("regression alert {} lacks its findings", row.id))?;
        serde_json::from_value(stored)
            .with_context(|| format!("regression alert {} holds unreadable findings", row.id))
    }
}

/// Which cap of its route a retry storm went beyond.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RetryStormTrigger {
    /// An attempt numbered above `max_attempts_per_task`: `task_id` and `attempt` say which.
    MaxAttemptsPerTask,
    /// Failed attempts costing more than `max_failed_spend_per_hour` within the ledger hour
    /// starting at `hour`.
    MaxFailedSpendPerHour,
}

/// A retry storm: the task or ledger hour that went beyond its route's cap.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RetryStormAlert {
    pub trigger: RetryStormTrigger,
    pub task_id: Option<String>,
    /// The first attempt beyond the cap that was seen; the task's later ones fire nothing.
    pub attempt: Option<i32>,
    /// The start of the ledger hour whose failed spend went beyond the cap.
    pub hour: Option<DateTime<Utc>>,
    /// The cap: attempts per task, or failed spend per hour in `currency`.
    #[schema(value_type = String, example = "10")]
    pub cap: Decimal,
    /// What went beyond it: the attempt number, or the hour's failed spend in `currency`.
    #[schema(value_type = String, example = "14.4")]
    pub observed: Decimal,
}

impl RetryStormAlert {
    fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        let missing = || anyhow::anyhow!("retry-storm alert {} lacks its fields", row.id);
        let trigger = match row.storm_hour {
            Some(_) => RetryStormTrigger::MaxFailedSpendPerHour,
            None => RetryStormTrigger::MaxAttemptsPerTask,
        };
        Ok(Self {
            trigger,
            task_id: row.task_id.clone(),
            attempt: row.attempt,
            hour: row.storm_hour,
            cap: row.cap.ok_or_else(missing)?.normalize(),
            observed: row.observed.ok_or_else(missing)?.normalize(),
        })
    }
}

/// The node a zombie-capacity alert found idle, since when, and what its idle time costs.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ZombieAlert {
    pub node: String,
    pub pool: String,
    /// When the node was last seen running a job, or came up.
    pub since: DateTime<Utc>,
    pub gpu_model: String,
    pub gpus: i32,
    /// GPU-hours idle when it fired.
    #[schema(value_type = String)]
    pub idle_gpu_hours: Decimal,
    /// What the node's GPUs cost per hour, in `currency`; null when no contract prices them.
    #[schema(value_type = Option<String>)]
    pub cost_per_hour: Option<Decimal>,
    /// What the stretch cost until it fired; null when no contract prices it.
    #[schema(value_type = Option<String>)]
    pub cost_so_far: Option<Decimal>,
}

impl ZombieAlert {
    fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        let missing = || anyhow::anyhow!("zombie alert {} lacks its node's fields", row.id);
        let gpus = row.gpu_count.ok_or_else(missing)?;
        Ok(Self {
            node: row.node.clone().ok_or_else(missing)?,
            pool: row.pool_id.clone().ok_or_else(missing)?,
            since: row.since.ok_or_else(missing)?,
            gpu_model: row.gpu_model.clone().ok_or_else(missing)?,
            gpus: i32::try_from(gpus.trunc().mantissa()).unwrap_or(0),
            idle_gpu_hours: (row.gpu_seconds_held.ok_or_else(missing)? / Decimal::from(3600))
                .round_dp(6)
                .normalize(),
            cost_per_hour: row.cost_per_hour.map(|c| c.normalize()),
            cost_so_far: row.cost.map(|c| round_money(c, &row.currency)),
        })
    }
}

/// The record an idle-GPU alert judged, how idle it was and what it cost.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IdleGpuAlert {
    pub task_id: String,
    /// The attempt that was idle; the task's later attempts fire no more alerts.
    pub attempt: i32,
    pub gpu_model: String,
    /// GPUs, or slices of `mig_profile`.
    #[schema(value_type = String)]
    pub gpu_count: Decimal,
    pub mig_profile: Option<String>,
    #[schema(value_type = String)]
    pub gpu_seconds_held: Decimal,
    /// `sm_active` as reported, or else `busy_share` (gpu_seconds_busy / gpu_seconds_held).
    pub measure: IdleMeasure,
    /// The measure's value, from 0 to 1.
    #[schema(value_type = String)]
    pub activity: Decimal,
    /// The project's threshold the activity was under.
    #[schema(value_type = String)]
    pub threshold: Decimal,
    /// The project's minimum GPU-hours held for a record to be judged.
    #[schema(value_type = String)]
    pub min_gpu_hours: Decimal,
    /// The record's rated cost: its segments' costs summed in the project's currency and
    /// rounded to the currency's minor unit (held time without a contract adds nothing).
    #[schema(value_type = String, example = "36.00")]
    pub cost: Decimal,
}

impl AlertEvent {
    pub fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        let kind = AlertEventKind::parse(&row.kind)
            .ok_or_else(|| anyhow::anyhow!("alert {} has unknown kind {}", row.id, row.kind))?;
        let idle_gpu = match kind {
            AlertEventKind::IdleGpu => Some(IdleGpuAlert::from_row(row)?),
            _ => None,
        };
        let zombie_capacity = match kind {
            AlertEventKind::ZombieCapacity => Some(ZombieAlert::from_row(row)?),
            _ => None,
        };
        let retry_storm = match kind {
            AlertEventKind::RetryStorm => Some(RetryStormAlert::from_row(row)?),
            _ => None,
        };
        let efficiency_regression = match kind {
            AlertEventKind::EfficiencyRegression => Some(RegressionAlert::from_row(row)?),
            _ => None,
        };
        let route = row
            .route_key
            .clone()
            .zip(row.route_value.clone())
            .map(|(key, value)| RouteRef { key, value });
        Ok(Self {
            id: row.id,
            project: row.project_id.clone(),
            month: Month::from_first_day(row.month),
            threshold: row.threshold,
            kind,
            currency: row.currency.clone(),
            spend: row.spend.map(|s| s.normalize()),
            budget: row.budget.map(|b| b.normalize()),
            burn_pct: row.burn_pct.map(|p| p.normalize()),
            forecast: row.forecast.map(|f| f.normalize()),
            fired_at: row.fired_at,
            idle_gpu,
            zombie_capacity,
            route,
            retry_storm,
            efficiency_regression,
        })
    }
}

impl IdleGpuAlert {
    fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        let missing = || anyhow::anyhow!("idle-GPU alert {} lacks its record's fields", row.id);
        let measure = row.idle_measure.as_deref().and_then(IdleMeasure::parse);
        Ok(Self {
            task_id: row.task_id.clone().ok_or_else(missing)?,
            attempt: row.attempt.ok_or_else(missing)?,
            gpu_model: row.gpu_model.clone().ok_or_else(missing)?,
            gpu_count: row.gpu_count.ok_or_else(missing)?.normalize(),
            mig_profile: row.mig_profile.clone(),
            gpu_seconds_held: row.gpu_seconds_held.ok_or_else(missing)?.normalize(),
            measure: measure.ok_or_else(missing)?,
            activity: row.idle_value.ok_or_else(missing)?.normalize(),
            threshold: row.idle_threshold.ok_or_else(missing)?.normalize(),
            min_gpu_hours: row.min_gpu_hours.ok_or_else(missing)?.normalize(),
            cost: round_money(row.cost.ok_or_else(missing)?, &row.currency),
        })
    }
}
