//! Alerts as they fired (budget and idle-GPU), with every delivery attempt.

use std::collections::HashMap;

use axum::extract::State;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::{Principal, Role};
use crate::domain::validation::Violations;
use crate::domain::values::month_holding;
use crate::domain::values::{Month, masked_url, masked_urls_in, parse_instant};
use crate::http::channels::{ChannelDeliveryView, DeliveryAttempt, delivery_views};
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::alerting::{self, AlertEvent, AlertRow, AttemptRow, BurnView, DeliveryRow};
use crate::ledger::channels;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_alerts))
        .routes(routes!(get_burn))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AlertView {
    #[serde(flatten)]
    pub event: AlertEvent,
    /// The webhook it goes to; null when the project had none when it fired. Admin tokens
    /// see it whole; other tokens see only its scheme and host.
    pub webhook_url: Option<String>,
    /// `pending`, `delivered` or `gave_up`; null without a webhook.
    pub delivery_state: Option<String>,
    /// When the next attempt is due while pending.
    pub next_attempt_at: Option<DateTime<Utc>>,
    /// Every delivery attempt, oldest first.
    pub deliveries: Vec<DeliveryAttempt>,
    /// Its delivery to each notification channel that subscribes to it, with their attempts.
    pub channels: Vec<ChannelDeliveryView>,
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
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of alerts", body = Page<AlertView>),
        (status = 403, description = "An ingest token, which only posts job records", body = Problem, content_type = "application/problem+json"),
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
    let (alerts, deliveries, attempts) = alerting::history(
        &state.pool,
        scope.as_deref(),
        month.map(|m| m.first_day()),
        before,
        limit + 1,
    )
    .await?;
    let keys: Vec<(String, Uuid)> = alerts
        .iter()
        .map(|a| (a.project_id.clone(), a.id))
        .collect();
    let (sent, tries) = channels::deliveries_of(&state.pool, &keys).await?;
    let mut by_alert: HashMap<(String, Uuid), Vec<ChannelDeliveryView>> = HashMap::new();
    for delivery in delivery_views(sent, &tries, principal.is_admin()) {
        let key = (
            delivery.project.clone().unwrap_or_default(),
            delivery.message_id,
        );
        by_alert.entry(key).or_default().push(delivery);
    }
    let views = alerts
        .iter()
        .map(|alert| {
            let mut view = view(alert, &deliveries, &attempts, principal.is_admin())?;
            view.channels = by_alert
                .remove(&(alert.project_id.clone(), alert.id))
                .unwrap_or_default();
            Ok(view)
        })
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
    whole_urls: bool,
) -> ApiResult<AlertView> {
    let delivery = deliveries
        .iter()
        .find(|d| d.project_id == alert.project_id && d.alert_id == alert.id);
    Ok(AlertView {
        event: AlertEvent::from_row(alert)?,
        webhook_url: delivery.map(|d| match whole_urls {
            true => d.url.clone(),
            false => masked_url(&d.url),
        }),
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
                error: match whole_urls {
                    true => a.error.clone(),
                    false => a.error.as_deref().map(masked_urls_in),
                },
                duration_ms: a.duration_ms,
            })
            .collect(),
        channels: Vec::new(),
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

/// How fast a project burns its monthly budget, and which alerts fired.
#[utoipa::path(get, path = "/v1/projects/{id}/burn", tag = "alerts",
    params(("id" = String, Path, description = "Project id"), BurnQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "Budget, spend, burn and forecast", body = BurnView),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month or as_of", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_burn(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<BurnQuery>,
) -> ApiResult<axum::Json<BurnView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let mut violations = Violations::default();
    let as_of = match &query.as_of {
        Some(raw) => violations.check("query:as_of", parse_instant(raw)),
        None => Some(state.settings.clock.now()),
    };
    let month = match &query.month {
        Some(raw) => violations.check("query:month", Month::parse(raw)),
        None => as_of.map(|at| month_holding(at, tz)),
    };
    violations.into_result()?;
    let (Some(as_of), Some(month)) = (as_of, month) else {
        unreachable!("both parsed or were reported")
    };
    let burn = alerting::burn_status(&state.pool, project, month, as_of, tz).await?;
    Ok(axum::Json(burn))
}
