//! Budget alerts as they fired, with every delivery attempt.

use axum::extract::State;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::app::AppState;
use crate::domain::access::{Principal, Role};
use crate::domain::burn::AlertKind;
use crate::domain::values::Month;
use crate::error::{ApiError, ApiResult, Problem, Violations};
use crate::http::extract::ApiQuery;
use crate::http::pagination::{Page, PageParams};
use crate::http::projects::readable_project;
use crate::store;
use crate::store::alerts::{AlertRow, AttemptRow, DeliveryRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_alerts))
        .routes(routes!(get_burn))
}

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
    pub fn from_row(row: &AlertRow) -> ApiResult<Self> {
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

#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryAttempt {
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status, when it answered.
    pub status_code: Option<i32>,
    /// Why the attempt failed; null when it succeeded.
    pub error: Option<String>,
    pub duration_ms: i32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AlertView {
    #[serde(flatten)]
    pub event: AlertEvent,
    /// The webhook it goes to; null when the project had none when it fired.
    pub webhook_url: Option<String>,
    /// `pending`, `delivered` or `gave_up`; null without a webhook.
    pub delivery_state: Option<String>,
    /// When the next attempt is due while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Every delivery attempt, oldest first.
    pub deliveries: Vec<DeliveryAttempt>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AlertQuery {
    /// Only this project's alerts.
    pub project: Option<String>,
    /// Only this month's (`YYYY-MM`).
    pub month: Option<String>,
    /// Items per page, 1 to 1000 (default 100).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
}

/// Alerts, newest first, with their deliveries; limited to the projects the token may read.
#[utoipa::path(get, path = "/v1/alerts", tag = "alerts", params(AlertQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "A page of alerts", body = Page<AlertView>),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid filter", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_alerts(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<AlertQuery>,
) -> ApiResult<axum::Json<Page<AlertView>>> {
    let page = PageParams {
        limit: query.limit,
        cursor: query.cursor.clone(),
    };
    let limit = page.limit()?;
    let before: Option<(DateTime<Utc>, Uuid)> = page.cursor()?;
    let mut violations = Violations::default();
    let month = query
        .month
        .as_deref()
        .and_then(|raw| violations.check("query:month", Month::parse(raw)));
    violations.into_result()?;
    let scope: Option<Vec<String>> = match (&query.project, principal.role) {
        (Some(project), _) => {
            readable_project(&state, &principal, project).await?;
            Some(vec![project.clone()])
        }
        (None, Role::Admin | Role::Finance) => None,
        (None, Role::Reader) => Some(principal.projects.clone()),
        (None, Role::Ingest) => {
            return Err(ApiError::Forbidden(
                "ingest tokens only post job records".to_owned(),
            ));
        }
    };
    let (alerts, deliveries, attempts) = store::alerts::list(
        &state.pool,
        scope.as_deref(),
        month.map(|m| m.first_day()),
        before,
        limit + 1,
    )
    .await?;
    let views = alerts
        .iter()
        .map(|alert| view(alert, &deliveries, &attempts))
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(axum::Json(Page::from_rows(
        views,
        limit,
        |view| (view.event.fired_at, view.event.id),
        |view| view,
    )))
}

fn view(
    alert: &AlertRow,
    deliveries: &[DeliveryRow],
    attempts: &[AttemptRow],
) -> ApiResult<AlertView> {
    let delivery = deliveries
        .iter()
        .find(|d| d.project_id == alert.project_id && d.alert_id == alert.id);
    Ok(AlertView {
        event: AlertEvent::from_row(alert)?,
        webhook_url: delivery.map(|d| d.url.clone()),
        delivery_state: delivery.map(|d| d.state.clone()),
        next_attempt_at: delivery
            .filter(|d| d.state == "pending")
            .map(|d| d.next_attempt_at),
        deliveries: attempts
            .iter()
            .filter(|a| a.project_id == alert.project_id && a.alert_id == alert.id)
            .map(|a| DeliveryAttempt {
                attempt: a.attempt,
                attempted_at: a.attempted_at,
                status_code: a.status_code,
                error: a.error.clone(),
                duration_ms: a.duration_ms,
            })
            .collect(),
    })
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BurnQuery {
    /// `YYYY-MM`; default: the month holding `as_of`.
    pub month: Option<String>,
    /// RFC 3339; default: now. Spend and forecast are computed as of this instant.
    pub as_of: Option<String>,
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

/// How fast a project burns its monthly budget, and which alerts fired.
#[utoipa::path(get, path = "/v1/projects/{id}/burn", tag = "alerts",
    params(("id" = String, Path, description = "Project id"), BurnQuery),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Budget, spend, burn and forecast", body = BurnView),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month or as_of", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_burn(
    State(state): State<AppState>,
    principal: Principal,
    crate::http::extract::ApiPath(id): crate::http::extract::ApiPath<String>,
    ApiQuery(query): ApiQuery<BurnQuery>,
) -> ApiResult<axum::Json<BurnView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let mut violations = Violations::default();
    let as_of = match &query.as_of {
        Some(raw) => violations.check("query:as_of", crate::domain::values::parse_instant(raw)),
        None => Some(state.settings.clock.now()),
    };
    let month = match &query.month {
        Some(raw) => violations.check("query:month", Month::parse(raw)),
        None => as_of.map(|at| crate::alerting::month_holding(at, tz)),
    };
    violations.into_result()?;
    let (Some(as_of), Some(month)) = (as_of, month) else {
        unreachable!("both parsed or were reported")
    };
    let budget = store::projects::budget_for(&state.pool, &project, month.first_day()).await?;
    let burn = crate::alerting::burn_of(&state.pool, &project, month, budget, as_of, tz).await?;
    let fired = store::alerts::fired_in_month(&state.pool, &id, month.first_day()).await?;
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
        .chain([(crate::domain::burn::FORECAST_THRESHOLD, AlertKind::Forecast)])
        .map(|(percent, kind)| ThresholdView {
            percent,
            kind,
            crossed_at: crossed(percent, kind),
        })
        .collect();
    Ok(axum::Json(BurnView {
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
    }))
}
