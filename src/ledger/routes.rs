//! Routes: budgets and retry caps on a label value of a project's records, and their burn.
//! The alerts they fire are judged with the project's own in [`crate::ledger::alerting`].

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use utoipa::ToSchema;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::burn::{AlertKind, FORECAST_THRESHOLD};
use crate::domain::route::{RouteLabel, RouteLimits, RouteRef};
use crate::domain::values::Month;
use crate::domain::values::month_holding;
use crate::ledger::alerting::{ThresholdView, evaluate_route, route_burn};
use crate::ledger::{LedgerResult, audit};
use crate::store;
use crate::store::projects::ProjectRow;
use crate::store::routes::RoutePut;
pub use crate::store::routes::RouteRow;

/// A route as the audit log keeps it: as the API shows it.
fn snapshot(row: &RouteRow, currency: &str) -> Value {
    json!({
        "project": row.project_id,
        "label_key": row.label_key,
        "label_value": row.label_value,
        "currency": currency,
        "monthly_budget": row.monthly_budget.map(|b| b.normalize()),
        "max_attempts_per_task": row.max_attempts_per_task,
        "max_failed_spend_per_hour": row.max_failed_spend_per_hour.map(|c| c.normalize()),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })
}

fn route_id(row: &RouteRow) -> String {
    format!("{}/{}/{}", row.project_id, row.label_key, row.label_value)
}

/// Sets a route's limits (those left out are cleared) and judges the current month under
/// them at once, so a cap set below what already happened fires without waiting for the
/// next record. Changes of a project's routes are ordered by the project's row lock, so
/// `before` is the route this change replaces.
pub async fn put(
    pool: &PgPool,
    project: &ProjectRow,
    label: &RouteLabel,
    limits: &RouteLimits,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<RouteRow> {
    let now = settings.clock.now();
    let mut tx = pool.begin().await?;
    store::projects::get_for_change(&mut tx, &project.id).await?;
    let before = store::routes::get(&mut tx, &project.id, label.key(), label.value()).await?;
    let row = store::routes::put(
        &mut tx,
        &RoutePut {
            project_id: &project.id,
            label_key: label.key(),
            label_value: label.value(),
            monthly_budget: limits.monthly_budget,
            max_attempts_per_task: limits.max_attempts_per_task,
            max_failed_spend_per_hour: limits.max_failed_spend_per_hour,
            at: now,
        },
    )
    .await?;
    let change = Change::new(
        "route",
        route_id(&row),
        if before.is_some() { "update" } else { "create" },
        before.as_ref().map(|b| snapshot(b, &project.currency)),
        Some(snapshot(&row, &project.currency)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    let month = month_holding(now, settings.timezone);
    if let Err(error) = evaluate_route(pool, project, &row, month, settings).await {
        tracing::error!(project = %project.id, route = %row.label_value, error = ?error, "evaluating a route failed");
    }
    Ok(row)
}

pub async fn get(
    pool: &PgPool,
    project: &str,
    label: &RouteLabel,
) -> LedgerResult<Option<RouteRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::routes::get(&mut conn, project, label.key(), label.value()).await?)
}

pub async fn list(pool: &PgPool, project: &str) -> LedgerResult<Vec<RouteRow>> {
    Ok(store::routes::of_project(pool, project).await?)
}

/// Deletes a route; false when there was none. Alerts it fired stay.
pub async fn delete(
    pool: &PgPool,
    project: &ProjectRow,
    label: &RouteLabel,
    actor: &Actor,
) -> LedgerResult<bool> {
    let mut tx = pool.begin().await?;
    let Some(before) =
        store::routes::delete(&mut tx, &project.id, label.key(), label.value()).await?
    else {
        return Ok(false);
    };
    let change = Change::new(
        "route",
        route_id(&before),
        "delete",
        Some(snapshot(&before, &project.currency)),
        None,
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(true)
}

/// A route's burn: a project's burn ([`crate::ledger::alerting::BurnView`]) restricted to the
/// records carrying the route's label value.
#[derive(Debug, Serialize, ToSchema)]
pub struct RouteBurnView {
    pub project: String,
    pub route: RouteRef,
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    pub currency: String,
    /// The route's monthly budget; null when it has none.
    #[schema(value_type = Option<String>)]
    pub budget: Option<Decimal>,
    /// The cost of the month's records carrying the label, up to `as_of`.
    #[schema(value_type = String)]
    pub spend: Decimal,
    #[schema(value_type = Option<String>)]
    pub burn_pct: Option<Decimal>,
    /// spend × hours in the month / hours elapsed; null before 72 hours have passed.
    #[schema(value_type = Option<String>)]
    pub forecast: Option<Decimal>,
    #[schema(value_type = Option<String>)]
    pub forecast_pct: Option<Decimal>,
    /// The project's thresholds (`actual`) and the forecast alert at 100 %, with when the
    /// route's alert for each fired.
    pub thresholds: Vec<ThresholdView>,
    pub as_of: DateTime<Utc>,
}

/// A route's burn of a month as of an instant, with when each of its thresholds fired.
pub async fn burn_status(
    pool: &PgPool,
    project: ProjectRow,
    route: RouteRow,
    month: Month,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> LedgerResult<RouteBurnView> {
    let burn = {
        let mut conn = pool.acquire().await?;
        route_burn(&mut conn, &project, &route, month, as_of, tz).await?
    };
    let label = (route.label_key.as_str(), route.label_value.as_str());
    let fired =
        store::alerts::fired_for_route_in_month(pool, &project.id, label, month.first_day())
            .await?;
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
    Ok(RouteBurnView {
        project: project.id,
        route: RouteRef {
            key: route.label_key,
            value: route.label_value,
        },
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
