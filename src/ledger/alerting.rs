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
use serde::Serialize;
use sqlx::{PgConnection, PgPool};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::burn::{self, AlertKind, Burn, FORECAST_THRESHOLD};
use crate::domain::idle::IdleGpuRule;
use crate::domain::ledger_time::month_bounds;
use crate::domain::record::JobRecord;
use crate::domain::route::storm_hours;
use crate::domain::values::Month;
use crate::domain::values::month_holding;
use crate::ledger::LedgerResult;
pub use crate::ledger::alert_event::{
    AlertEvent, AlertEventKind, IdleGpuAlert, RegressionAlert, RetryStormAlert, RetryStormTrigger,
    ZombieAlert,
};
use crate::ledger::channels;
use crate::ledger::cost::{
    CostOf, month_spend, month_spend_by_day, route_month_spend, spend_period,
};
use crate::ledger::instruments;
use crate::store;
pub use crate::store::alerts::{AlertRow, Attempt, AttemptRow, DeliveryRow, DueDelivery, NextStep};
use crate::store::alerts::{NewAlert, NewIdleGpuAlert, StormOf};
use crate::store::projects::ProjectRow;
use crate::store::routes::RouteRow;

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
    let targets: Vec<(&AlertRow, Option<&str>)> = fired
        .iter()
        .map(|row| (row, settings[&row.project_id].webhook_url.as_deref()))
        .collect();
    queue_deliveries(conn, &targets).await?;
    for row in &fired {
        tracing::info!(project = %row.project_id, task = ?row.task_id, attempt = ?row.attempt, "idle-GPU alert fired");
    }
    if !fired.is_empty() {
        metrics::counter!(instruments::ALERTS_FIRED, "kind" => "idle_gpu")
            .increment(fired.len() as u64);
    }
    Ok(fired)
}

/// Puts fired alerts in the outboxes, in the transaction that fired them: each to its
/// project's webhook when it has one (`(alert, webhook URL)`), and to every notification
/// channel that subscribes to it.
pub async fn queue_deliveries(
    conn: &mut PgConnection,
    alerts: &[(&AlertRow, Option<&str>)],
) -> anyhow::Result<()> {
    let mut events = Vec::with_capacity(alerts.len());
    let mut deliveries = Vec::new();
    for &(row, url) in alerts {
        let event = AlertEvent::from_row(row)?;
        if let Some(url) = url {
            deliveries.push((row, url, serde_json::to_string(&event)?));
        }
        events.push(event);
    }
    store::alerts::enqueue_deliveries(conn, &deliveries).await?;
    channels::queue_alerts(conn, &events).await
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
        queue_deliveries(&mut tx, &[(&row, project.webhook_url.as_deref())]).await?;
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
    let targets: Vec<(&AlertRow, Option<&str>)> = fired
        .iter()
        .map(|row| (row, project.webhook_url.as_deref()))
        .collect();
    queue_deliveries(&mut tx, &targets).await?;
    tx.commit().await?;
    for row in &fired {
        tracing::info!(project = %row.project_id, route = %route.label_value, kind = %row.kind, threshold = ?row.threshold, task = ?row.task_id, hour = ?row.storm_hour, "route alert fired");
        metrics::counter!(instruments::ALERTS_FIRED, "kind" => row.kind.clone()).increment(1);
    }
    Ok(fired)
}
