//! Routes of a project: budgets and retry caps on one label value of its records, and their
//! burn.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::route::{RouteLabel, RouteLimits};
use crate::domain::validation::Violations;
use crate::domain::values::month_holding;
use crate::domain::values::{Month, parse_instant};
use crate::http::alerts::BurnQuery;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::routes::{self, RouteBurnView, RouteRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_routes))
        .routes(routes!(get_route, put_route, delete_route))
        .routes(routes!(get_route_burn))
}

/// A route's limits, replacing what was set (a field left out is cleared); at least one.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutRoute {
    /// The route's budget for every month in the project's currency (decimal string, > 0);
    /// it fires the project's thresholds for the route's spend.
    #[schema(value_type = Option<String>, example = "200.00")]
    pub monthly_budget: Option<Decimal>,
    /// An attempt numbered above it (≥ 1) fires one `retry_storm` alert for its task.
    pub max_attempts_per_task: Option<i64>,
    /// Failed attempts costing more than it (> 0, the project's currency) within one ledger
    /// hour fire one `retry_storm` alert for that hour.
    #[schema(value_type = Option<String>, example = "10.00")]
    pub max_failed_spend_per_hour: Option<Decimal>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteView {
    pub project: String,
    pub label_key: String,
    pub label_value: String,
    pub currency: String,
    #[schema(value_type = Option<String>)]
    pub monthly_budget: Option<Decimal>,
    pub max_attempts_per_task: Option<i32>,
    #[schema(value_type = Option<String>)]
    pub max_failed_spend_per_hour: Option<Decimal>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn route_view(row: RouteRow, currency: &str) -> RouteView {
    RouteView {
        project: row.project_id,
        label_key: row.label_key,
        label_value: row.label_value,
        currency: currency.to_owned(),
        monthly_budget: row.monthly_budget.map(|b| b.normalize()),
        max_attempts_per_task: row.max_attempts_per_task,
        max_failed_spend_per_hour: row.max_failed_spend_per_hour.map(|c| c.normalize()),
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

fn route_label(key: &str, value: &str) -> ApiResult<RouteLabel> {
    let mut violations = Violations::default();
    let label = RouteLabel::parse(key, value, &mut violations);
    violations.into_result()?;
    Ok(label.expect("parsed or reported"))
}

fn route_not_found(label: &RouteLabel) -> ApiError {
    ApiError::NotFound(format!(
        "no route `{}={}` in this project",
        label.key(),
        label.value()
    ))
}

/// The project's routes, in label key then value order.
#[utoipa::path(get, path = "/v1/projects/{id}/routes", tag = "routes",
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The project's routes", body = Vec<RouteView>),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_routes(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<Vec<RouteView>>> {
    let project = readable_project(&state, &principal, &id).await?;
    let rows = routes::list(&state.pool, &project.id).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|row| route_view(row, &project.currency))
            .collect(),
    ))
}

/// One route.
#[utoipa::path(get, path = "/v1/projects/{id}/routes/{label_key}/{label_value}", tag = "routes",
    params(
        ("id" = String, Path, description = "Project id"),
        ("label_key" = String, Path, description = "The label key, e.g. `route`"),
        ("label_value" = String, Path, description = "The label value, e.g. `summarise`"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The route", body = RouteView),
        (status = 404, description = "No such project or route", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid label key or value", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_route(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, key, value)): ApiPath<(String, String, String)>,
) -> ApiResult<axum::Json<RouteView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let label = route_label(&key, &value)?;
    let row = routes::get(&state.pool, &project.id, &label)
        .await?
        .ok_or_else(|| route_not_found(&label))?;
    Ok(axum::Json(route_view(row, &project.currency)))
}

/// Set a route's budget and caps (finance or admin); the current month is judged under
/// them at once.
#[utoipa::path(put, path = "/v1/projects/{id}/routes/{label_key}/{label_value}", tag = "routes",
    request_body = PutRoute,
    params(
        ("id" = String, Path, description = "Project id"),
        ("label_key" = String, Path, description = "The label key, e.g. `route`"),
        ("label_value" = String, Path, description = "The label value, e.g. `summarise`"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The route", body = RouteView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid label or limits", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_route(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, key, value)): ApiPath<(String, String, String)>,
    ApiJson(body): ApiJson<PutRoute>,
) -> ApiResult<axum::Json<RouteView>> {
    let project = readable_project(&state, &principal, &id).await?;
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let label = RouteLabel::parse(&key, &value, &mut violations);
    let limits = RouteLimits::parse(
        body.monthly_budget,
        body.max_attempts_per_task,
        body.max_failed_spend_per_hour,
        &mut violations,
    );
    violations.into_result()?;
    let (Some(label), Some(limits)) = (label, limits) else {
        unreachable!("both parsed or were reported")
    };
    let row = routes::put(
        &state.pool,
        &project,
        &label,
        &limits,
        &principal.actor,
        &state.settings,
    )
    .await?;
    Ok(axum::Json(route_view(row, &project.currency)))
}

/// Delete a route (finance or admin); the alerts it fired stay.
#[utoipa::path(delete, path = "/v1/projects/{id}/routes/{label_key}/{label_value}", tag = "routes",
    params(
        ("id" = String, Path, description = "Project id"),
        ("label_key" = String, Path, description = "The label key"),
        ("label_value" = String, Path, description = "The label value"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Deleted"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such project or route", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid label key or value", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_route(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, key, value)): ApiPath<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let project = readable_project(&state, &principal, &id).await?;
    require_finance(&principal)?;
    let label = route_label(&key, &value)?;
    match routes::delete(&state.pool, &project, &label, &principal.actor).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(route_not_found(&label)),
    }
}

/// How fast a route burns its monthly budget, and which of its alerts fired.
#[utoipa::path(get, path = "/v1/projects/{id}/routes/{label_key}/{label_value}/burn", tag = "routes",
    params(
        ("id" = String, Path, description = "Project id"),
        ("label_key" = String, Path, description = "The label key"),
        ("label_value" = String, Path, description = "The label value"),
        BurnQuery,
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The route's budget, spend, burn and forecast", body = RouteBurnView),
        (status = 404, description = "No such project or route", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month or as_of", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_route_burn(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, key, value)): ApiPath<(String, String, String)>,
    ApiQuery(query): ApiQuery<BurnQuery>,
) -> ApiResult<axum::Json<RouteBurnView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let label = route_label(&key, &value)?;
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
    let route = routes::get(&state.pool, &project.id, &label)
        .await?
        .ok_or_else(|| route_not_found(&label))?;
    let burn = routes::burn_status(&state.pool, project, route, month, as_of, tz).await?;
    Ok(axum::Json(burn))
}
