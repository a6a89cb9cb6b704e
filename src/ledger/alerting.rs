//! Firing budget alerts: each reached `(project, month, threshold, kind)` is stored once,
//! together with its outbox row, in one transaction; the webhook worker delivers it later.

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::burn::{self, AlertKind, Burn, FORECAST_THRESHOLD};
use crate::domain::values::Month;
use crate::ledger::LedgerResult;
use crate::ledger::cost::{CostOf, month_spend};
use crate::ledger::instruments;
use crate::store;
use crate::store::alerts::{AlertRow, NewAlert};
use crate::store::projects::ProjectRow;

/// An alert as it fired; also the JSON document POSTed to the project's webhook.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AlertEvent {
    /// Stable: receivers use it to drop repeats.
    pub id: Uuid,
    pub project: String,
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// Percent of the month's budget.
    pub threshold: i32,
    pub kind: AlertKind,
    pub currency: String,
    #[schema(value_type = String)]
    pub spend: Decimal,
    #[schema(value_type = String)]
    pub budget: Decimal,
    #[schema(value_type = String)]
    pub burn_pct: Decimal,
    /// The month's linear forecast when it fired, if there was one.
    #[schema(value_type = Option<String>)]
    pub forecast: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
}

impl AlertEvent {
    pub fn from_row(row: &AlertRow) -> anyhow::Result<Self> {
        Ok(Self {
            id: row.id,
            project: row.project_id.clone(),
            month: Month::from_first_day(row.month),
            threshold: row.threshold,
            kind: AlertKind::parse(&row.kind)
                .ok_or_else(|| anyhow::anyhow!("alert {} has unknown kind {}", row.id, row.kind))?,
            currency: row.currency.clone(),
            spend: row.spend.normalize(),
            budget: row.budget.normalize(),
            burn_pct: row.burn_pct.normalize(),
            forecast: row.forecast.map(|f| f.normalize()),
            fired_at: row.fired_at,
        })
    }
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

/// Re-evaluates a project's burn of a month now and fires what it reached. Every path that
/// changes spend calls this; firing is once-only, so calling it often is harmless.
pub async fn evaluate(
    pool: &PgPool,
    project_id: &str,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    let Some(project) = store::projects::get(pool, project_id).await? else {
        return Ok(Vec::new());
    };
    // Without a budget there is no burn, so nothing can fire: skip computing the spend.
    let Some(budget) = store::projects::budget_for(pool, &project, month.first_day()).await? else {
        return Ok(Vec::new());
    };
    let now = settings.clock.now();
    let burn = burn_of(pool, &project, month, Some(budget), now, settings.timezone).await?;
    let reached = burn::alerts_reached(&burn, &project.alert_thresholds);
    fire_reached(pool, &project, month, &burn, &reached, now).await
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

/// The months of the ledger that a period overlaps.
pub fn months_between(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Vec<Month> {
    let first = Month::from_first_day(from.with_timezone(&tz).date_naive());
    let last = Month::from_first_day(to.with_timezone(&tz).date_naive());
    let mut months = vec![first];
    while *months.last().expect("starts non-empty") < last {
        let next = months.last().expect("starts non-empty").next();
        months.push(next);
    }
    months
}

/// The ledger month holding `at`.
pub fn month_holding(at: DateTime<Utc>, tz: Tz) -> Month {
    Month::from_first_day(at.with_timezone(&tz).date_naive())
}

/// Evaluates the current month of every project with a budget: after a change that can move
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
    let fired = store::alerts::fired_in_month(pool, &project.id, month.first_day()).await?;
    let crossed = |percent: i32, kind: AlertKind| {
        fired
            .iter()
            .find(|a| a.threshold == percent && a.kind == kind.as_str() && a.fired_at <= as_of)
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
    })
}
