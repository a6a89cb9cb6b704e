//! Firing alerts. Budget alerts: each reached `(project, month, threshold, kind)` is stored
//! once, together with its outbox row, in one transaction. Idle-GPU alerts: once per task,
//! in the transaction that stores (or corrects) and rates the idle record. A route's budget
//! alerts and retry storms are judged with the project's burn (see [`evaluate`]).
//! The webhook worker delivers them all later.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::burn::{self, AlertKind, Burn, FORECAST_THRESHOLD};
use crate::domain::idle::{IdleGpuRule, IdleMeasure};
use crate::domain::ledger_time::month_bounds;
use crate::domain::record::JobRecord;
use crate::domain::route::{RouteRef, storm_hours};
use crate::domain::values::Month;
use crate::domain::values::{month_holding, round_money};
use crate::ledger::LedgerResult;
use crate::ledger::cost::{
    CostOf, month_spend, month_spend_by_day, route_month_spend, spend_period,
};
use crate::ledger::efficiency::FactorsView;
use crate::ledger::instruments;
use crate::store;
pub use crate::store::alerts::{AlertRow, Attempt, AttemptRow, DeliveryRow, DueDelivery, NextStep};
use crate::store::alerts::{NewAlert, NewIdleGpuAlert, StormOf};
use crate::store::projects::ProjectRow;
use crate::store::routes::RouteRow;

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

/// Judges freshly stored (or corrected) and rated records under their projects' idle-GPU
/// rules and fires an alert for each idle one whose task has none yet, with its outbox row,
/// in the caller's transaction. Records without activity figures cost no query; a batch with
/// some costs one to read the rules, and with idle records one to fire and one to enqueue.
pub async fn fire_idle_gpu(
    conn: &mut PgConnection,
    records: &[&JobRecord],
    now: DateTime<Utc>,
    tz: Tz,
) -> anyhow::Result<Vec<AlertRow>> {
    let evidenced: Vec<&JobRecord> = records
        .iter()
        .copied()
        .filter(|r| r.telemetry.sm_active.is_some() || r.gpu_seconds_busy.is_some())
        .collect();
    if evidenced.is_empty() {
        return Ok(Vec::new());
    }
    let projects: Vec<String> = evidenced
        .iter()
        .map(|r| r.key.project.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let settings: BTreeMap<String, store::projects::IdleGpuSettingsRow> =
        store::projects::idle_gpu_settings(conn, &projects)
            .await?
            .into_iter()
            .map(|row| (row.id.clone(), row))
            .collect();
    let mut seen_tasks = BTreeSet::new();
    let mut candidates = Vec::new();
    for record in evidenced {
        let Some(project) = settings.get(&record.key.project) else {
            continue;
        };
        let rule = IdleGpuRule {
            threshold: project.idle_gpu_threshold,
            min_gpu_hours: project.idle_gpu_min_gpu_hours,
        };
        let Some(activity) = rule.idle(
            record.gpu_seconds_held,
            record.gpu_seconds_busy,
            record.telemetry.sm_active,
        ) else {
            continue;
        };
        if !seen_tasks.insert((&record.key.project, &record.key.task_id)) {
            continue;
        }
        candidates.push(NewIdleGpuAlert {
            project_id: record.key.project.clone(),
            task_id: record.key.task_id.clone(),
            attempt: record.key.attempt,
            month: month_holding(record.ended_at, tz).first_day(),
            currency: project.currency.clone(),
            gpu_model: record.gpu_model.clone(),
            gpu_count: record.gpu_count,
            mig_profile: record.telemetry.mig_profile.clone(),
            gpu_seconds_held: record.gpu_seconds_held,
            idle_measure: activity.measure.as_str(),
            idle_value: activity.value,
            idle_threshold: rule.threshold.unwrap_or_default(),
            min_gpu_hours: rule.min_gpu_hours,
        });
    }
    let fired = store::alerts::fire_idle_gpu(conn, &candidates, now, tz.name()).await?;
    let mut deliveries = Vec::new();
    for row in &fired {
        if let Some(url) = settings[&row.project_id].webhook_url.as_deref() {
            let body = serde_json::to_string(&AlertEvent::from_row(row)?)?;
            deliveries.push((row, url, body));
        }
        tracing::info!(project = %row.project_id, task = ?row.task_id, attempt = ?row.attempt, "idle-GPU alert fired");
    }
    store::alerts::enqueue_deliveries(conn, &deliveries).await?;
    if !fired.is_empty() {
        metrics::counter!(instruments::ALERTS_FIRED, "kind" => "idle_gpu")
            .increment(fired.len() as u64);
    }
    Ok(fired)
}

/// Fires, at `now`, the reached alerts that have not fired yet and returns those it fired.
pub async fn fire_reached(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    burn: &Burn,
    reached: &[(i32, AlertKind)],
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<AlertRow>> {
    let Some(budget) = burn.budget else {
        return Ok(Vec::new());
    };
    if reached.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    let mut fired = Vec::new();
    for &(threshold, kind) in reached {
        let alert = NewAlert {
            project_id: project.id.clone(),
            month: month.first_day(),
            threshold,
            kind: kind.as_str(),
            currency: project.currency.clone(),
            spend: burn.spend,
            budget,
            burn_pct: burn.burn_pct.unwrap_or_default(),
            forecast: burn.forecast,
            fired_at: now,
        };
        let Some(row) = store::alerts::fire(&mut tx, &alert).await? else {
            continue;
        };
        if let Some(url) = &project.webhook_url {
            let event = AlertEvent::from_row(&row)?;
            let body = serde_json::to_string(&event)?;
            store::alerts::enqueue_delivery(&mut tx, &row, url, &body).await?;
        }
        tracing::info!(project = %row.project_id, month = %month, threshold, kind = kind.as_str(), "budget alert fired");
        metrics::counter!(instruments::ALERTS_FIRED, "kind" => kind.as_str()).increment(1);
        fired.push(row);
    }
    tx.commit().await?;
    Ok(fired)
}

/// A project's burn of a month as of an instant.
/// `budget` is the month's (see `store::projects::budget_for`).
pub async fn burn_of(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    budget: Option<rust_decimal::Decimal>,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> anyhow::Result<Burn> {
    let mut conn = pool.acquire().await?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let spend = month_spend(&mut conn, of, month.first_day(), as_of, tz)
        .await
        .map_err(anyhow::Error::from)
        .with_context(|| format!("computing the spend of {} failed", project.id))?;
    Ok(burn::burn(spend, budget, month.first_day(), as_of, tz))
}

/// Re-evaluates a project's burn of a month now, and its routes' (budgets and retry
/// storms), and fires what they reached. Every path that changes spend calls this; firing is
/// once-only, so calling it often is harmless.
pub async fn evaluate(
    pool: &PgPool,
    project_id: &str,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    let Some(project) = store::projects::get(pool, project_id).await? else {
        return Ok(Vec::new());
    };
    let mut fired = evaluate_budget(pool, &project, month, settings).await?;
    fired.extend(evaluate_routes(pool, &project, month, settings).await?);
    Ok(fired)
}

/// Re-evaluates a project's own burn of a month now and fires what it reached.
async fn evaluate_budget(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    // Without a budget there is no burn, so nothing can fire: skip computing the spend.
    let Some(budget) = store::projects::budget_for(pool, project, month.first_day()).await? else {
        return Ok(Vec::new());
    };
    let now = settings.clock.now();
    let burn = burn_of(pool, project, month, Some(budget), now, settings.timezone).await?;
    let reached = burn::alerts_reached(&burn, &project.alert_thresholds);
    fire_reached(pool, project, month, &burn, &reached, now).await
}

/// Evaluates each `(project, month)`, logging failures: the change that asked for it has
/// already been stored, and the periodic check will evaluate again.
pub async fn evaluate_all(
    pool: &PgPool,
    targets: impl IntoIterator<Item = (String, Month)>,
    settings: &Settings,
) {
    for (project, month) in targets {
        if let Err(error) = evaluate(pool, &project, month, settings).await {
            tracing::error!(project = %project, month = %month, error = ?error, "evaluating budget burn failed");
        }
    }
}

/// Evaluates the current month of every project with a budget or a route: after a change that can move
/// any project's spend (a contract or FX rate), and periodically, since unused commitment
/// accrues even when no record arrives.
pub async fn evaluate_current_month(pool: &PgPool, settings: &Settings) {
    let month = month_holding(settings.clock.now(), settings.timezone);
    match store::projects::budgeted_in(pool, month.first_day()).await {
        Ok(projects) => {
            let targets = projects.into_iter().map(|project| (project, month));
            evaluate_all(pool, targets, settings).await
        }
        Err(error) => tracing::error!(error = ?error, "listing budgeted projects failed"),
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ThresholdView {
    pub percent: i32,
    pub kind: AlertKind,
    /// When its alert fired; null while not reached (as of `as_of`).
    pub crossed_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BurnView {
    pub project: String,
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    pub currency: String,
    /// The month's own budget, else the project's default; null when neither is set.
    #[schema(value_type = Option<String>)]
    pub budget: Option<Decimal>,
    /// The project's total for the month up to `as_of`.
    #[schema(value_type = String)]
    pub spend: Decimal,
    #[schema(value_type = Option<String>)]
    pub burn_pct: Option<Decimal>,
    /// spend × hours in the month / hours elapsed; null before 72 hours have passed.
    #[schema(value_type = Option<String>)]
    pub forecast: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub forecast_pct: Option<Decimal>,
    /// The project's thresholds (`actual`) and the forecast alert at 100 %.
    pub thresholds: Vec<ThresholdView>,
    pub as_of: DateTime<Utc>,
    /// How the spend grew: one entry per ledger day from the month's first to the day holding
    /// `as_of`; the last one's `spend` is `spend` above.
    pub days: Vec<SpendDay>,
}

/// The spend of a month up to the end of one of its days.
#[derive(Debug, Serialize, ToSchema)]
pub struct SpendDay {
    pub day: NaiveDate,
    /// The month's spend up to the end of this day (or `as_of`, on its day).
    #[schema(value_type = String)]
    pub spend: Decimal,
}

/// A project's burn of a month as of an instant, with when each threshold's alert fired.
pub async fn burn_status(
    pool: &PgPool,
    project: ProjectRow,
    month: Month,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<BurnView> {
    let budget = store::projects::budget_for(pool, &project, month.first_day()).await?;
    let burn = burn_of(pool, &project, month, budget, as_of, tz).await?;
    let days = {
        let mut conn = pool.acquire().await?;
        let of = CostOf {
            project: &project.id,
            currency: &project.currency,
        };
        month_spend_by_day(&mut conn, of, month.first_day(), as_of, tz).await?
    };
    let fired = store::alerts::fired_in_month(pool, &project.id, month.first_day()).await?;
    let crossed = |percent: i32, kind: AlertKind| {
        fired
            .iter()
            .find(|a| {
                a.threshold == Some(percent) && a.kind == kind.as_str() && a.fired_at <= as_of
            })
            .map(|a| a.fired_at)
    };
    let thresholds = project
        .alert_thresholds
        .iter()
        .map(|&percent| (percent, AlertKind::Actual))
        .chain([(FORECAST_THRESHOLD, AlertKind::Forecast)])
        .map(|(percent, kind)| ThresholdView {
            percent,
            kind,
            crossed_at: crossed(percent, kind),
        })
        .collect();
    Ok(BurnView {
        project: project.id,
        month,
        currency: project.currency,
        budget: burn.budget.map(|b| b.normalize()),
        spend: burn.spend.normalize(),
        burn_pct: burn.burn_pct.map(|p| p.normalize()),
        forecast: burn.forecast.map(|f| f.normalize()),
        forecast_pct: burn.forecast_pct.map(|p| p.normalize()),
        thresholds,
        as_of,
        days: days
            .into_iter()
            .map(|(day, spend)| SpendDay { day, spend })
            .collect(),
    })
}

/// Alerts of the given projects (all when `None`), optionally of one month, newest first
/// (continuing before `before`), with their deliveries and attempts.
pub async fn history(
    pool: &PgPool,
    projects: Option<&[String]>,
    month: Option<NaiveDate>,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> LedgerResult<(Vec<AlertRow>, Vec<DeliveryRow>, Vec<AttemptRow>)> {
    Ok(store::alerts::list(pool, projects, month, before, limit).await?)
}

/// Makes one attempt at the alert delivery due first, with `attempt` (the worker's request),
/// and records it; `None` when nothing is due. The delivery stays locked while it is
/// attempted, so no other replica attempts it too.
pub async fn deliver_next(
    pool: &PgPool,
    attempt: impl AsyncFnOnce(&DueDelivery) -> (Attempt, NextStep),
) -> sqlx::Result<Option<(DueDelivery, NextStep)>> {
    let mut tx = pool.begin().await?;
    let Some(delivery) = store::alerts::claim_due(&mut tx).await? else {
        tx.rollback().await?;
        return Ok(None);
    };
    let (made, next) = attempt(&delivery).await;
    store::alerts::record_attempt(&mut tx, &delivery, &made, next).await?;
    tx.commit().await?;
    Ok(Some((delivery, next)))
}

/// A route's burn of a month: its spend against its monthly budget.
pub async fn route_burn(
    conn: &mut PgConnection,
    project: &ProjectRow,
    route: &RouteRow,
    month: Month,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<Burn> {
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let label = (route.label_key.as_str(), route.label_value.as_str());
    let spend = route_month_spend(conn, of, label, month.first_day(), as_of, tz).await?;
    Ok(burn::burn(
        spend,
        route.monthly_budget,
        month.first_day(),
        as_of,
        tz,
    ))
}

/// Judges every route of a project for a month now and fires what it calls for.
///
/// A route's alerts are judged on what is committed, after the change that could cause them
/// (an ingest, a correction, a route's limits, the burn tick), and fired by an
/// `INSERT … ON CONFLICT DO NOTHING` against a unique index: a budget alert once per
/// `(project, route, month, threshold, kind)`, a retry storm once per `(project, route, task)`
/// or `(project, route, ledger hour)`. Two ingests evaluating at the same time may both see a
/// cap crossed; the second insert of the same key waits for the first transaction and then
/// inserts nothing, so exactly one alert (and one outbox row) results. Judging after commit
/// means the later of two concurrent ingests sees both, so a crossing made only by the two
/// together is not missed.
async fn evaluate_routes(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    let mut fired = Vec::new();
    for route in store::routes::of_project(pool, &project.id).await? {
        fired.extend(evaluate_route(pool, project, &route, month, settings).await?);
    }
    Ok(fired)
}

/// Judges one route for a month, at the settings' clock: its budget against the project's
/// thresholds, its tasks' attempts that ended in the month against its attempts cap, and its
/// failed spend in each of the month's ledger hours so far against its hourly cap. What
/// fires is stored with its outbox rows in one transaction.
pub async fn evaluate_route(
    pool: &PgPool,
    project: &ProjectRow,
    route: &RouteRow,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    let now = settings.clock.now();
    let tz = settings.timezone;
    let label = (route.label_key.as_str(), route.label_value.as_str());
    let mut tx = pool.begin().await?;
    let mut fired = Vec::new();
    if route.monthly_budget.is_some() {
        let burn = route_burn(&mut tx, project, route, month, now, tz).await?;
        let budget = burn.budget.unwrap_or_default();
        for (threshold, kind) in burn::alerts_reached(&burn, &project.alert_thresholds) {
            let alert = NewAlert {
                project_id: project.id.clone(),
                month: month.first_day(),
                threshold,
                kind: kind.as_str(),
                currency: project.currency.clone(),
                spend: burn.spend,
                budget,
                burn_pct: burn.burn_pct.unwrap_or_default(),
                forecast: burn.forecast,
                fired_at: now,
            };
            if let Some(row) = store::alerts::fire_route_budget(&mut tx, &alert, label).await? {
                fired.push(row);
            }
        }
    }
    let storm = StormOf {
        project_id: &project.id,
        route: label,
        month: month.first_day(),
        currency: &project.currency,
        fired_at: now,
    };
    if let Some(cap) = route.max_attempts_per_task {
        let beyond = store::routes::attempts_beyond_cap(
            &mut tx,
            route,
            cap,
            month_bounds(month.first_day(), tz),
        )
        .await?;
        let attempts: Vec<(String, i32)> =
            beyond.into_iter().map(|a| (a.task_id, a.attempt)).collect();
        fired.extend(store::alerts::fire_retry_storm_tasks(&mut tx, storm, cap, &attempts).await?);
    }
    if let (Some(cap), Some(period)) = (
        route.max_failed_spend_per_hour,
        spend_period(month.first_day(), now, tz),
    ) {
        let by_hour: Vec<(DateTime<Utc>, Decimal)> =
            store::cost::failed_spend_by_hour(&mut tx, &project.id, label, period, tz)
                .await?
                .into_iter()
                .map(|h| (h.hour, h.failed))
                .collect();
        let storms: Vec<(DateTime<Utc>, Decimal)> = storm_hours(&by_hour, cap)
            .into_iter()
            .map(|s| (s.hour, s.failed_spend))
            .collect();
        fired.extend(store::alerts::fire_retry_storm_hours(&mut tx, storm, cap, &storms).await?);
    }
    let mut deliveries = Vec::new();
    if let Some(url) = project.webhook_url.as_deref() {
        for row in &fired {
            deliveries.push((
                row,
                url,
                serde_json::to_string(&AlertEvent::from_row(row)?)?,
            ));
        }
    }
    store::alerts::enqueue_deliveries(&mut tx, &deliveries).await?;
    tx.commit().await?;
    for row in &fired {
        tracing::info!(project = %row.project_id, route = %route.label_value, kind = %row.kind, threshold = ?row.threshold, task = ?row.task_id, hour = ?row.storm_hour, "route alert fired");
        metrics::counter!(instruments::ALERTS_FIRED, "kind" => row.kind.clone()).increment(1);
    }
    Ok(fired)
}
