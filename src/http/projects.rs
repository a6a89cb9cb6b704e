//! Projects and their monthly budgets.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::{Principal, Role};
use crate::domain::project::{ProjectEdit, ProjectFields};
use crate::domain::validation::Violations;
use crate::domain::values::{self, Month};
use crate::http::auth::{project_not_found, require_admin, require_finance};
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::projects::{self, BudgetRow, ProjectRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_project, list_projects))
        .routes(routes!(get_project, update_project))
        .routes(routes!(list_budgets))
        .routes(routes!(put_budget))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ProjectView {
    pub id: String,
    pub name: String,
    pub team: Option<String>,
    /// ISO 4217 code; every cost of the project is shown in it.
    pub currency: String,
    pub default_monthly_budget: Option<Decimal>,
    /// Percentages of the monthly budget at which an alert fires.
    pub alert_thresholds: Vec<i32>,
    /// Where alerts are POSTed. Admin tokens see it whole; other tokens see only its scheme
    /// and host (`https://hooks.example.com/…`), since a webhook's path often is its secret.
    pub webhook_url: Option<String>,
    /// A finished record that held at least `idle_gpu_min_gpu_hours` with SM activity (or,
    /// without it, busy share) under this share fires one `idle_gpu` alert per task; null
    /// when idle-GPU alerts are off.
    #[schema(value_type = Option<String>, example = "0.05")]
    pub idle_gpu_threshold: Option<Decimal>,
    #[schema(value_type = String, example = "1")]
    pub idle_gpu_min_gpu_hours: Decimal,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl ProjectView {
    /// The project as `principal` may see it.
    fn seen_by(row: ProjectRow, principal: &Principal) -> Self {
        let mut view = Self::from(row);
        if !principal.is_admin() {
            view.webhook_url = view.webhook_url.as_deref().map(values::masked_url);
        }
        view
    }
}

impl From<ProjectRow> for ProjectView {
    fn from(row: ProjectRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            team: row.team,
            currency: row.currency,
            default_monthly_budget: row.default_monthly_budget.map(|b| b.normalize()),
            alert_thresholds: row.alert_thresholds,
            webhook_url: row.webhook_url,
            idle_gpu_threshold: row.idle_gpu_threshold.map(|t| t.normalize()),
            idle_gpu_min_gpu_hours: row.idle_gpu_min_gpu_hours.normalize(),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateProject {
    /// Lowercase slug: letters, digits and inner hyphens, at most 63 characters.
    pub id: String,
    pub name: String,
    pub team: Option<String>,
    /// ISO 4217 code, e.g. `USD`.
    pub currency: String,
    /// Budget for every month without its own (a decimal string or number, > 0).
    pub default_monthly_budget: Option<Decimal>,
    /// Default `[50, 80, 100]`: 1 to 1000, strictly ascending.
    pub alert_thresholds: Option<Vec<i64>>,
    /// Where alerts are POSTed (http or https).
    pub webhook_url: Option<String>,
    /// Default `0.05`: greater than 0 and at most 1; `null` turns idle-GPU alerts off.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub idle_gpu_threshold: Option<Option<Decimal>>,
    /// Default `1`: GPU-hours a record must hold to be judged idle (> 0).
    #[schema(value_type = Option<String>)]
    pub idle_gpu_min_gpu_hours: Option<Decimal>,
}

/// Fields to change; `null` clears `team`, `default_monthly_budget` or `webhook_url`, and
/// turns idle-GPU alerts off as `idle_gpu_threshold`.
/// The id and currency of a project never change: its costs are kept in that currency.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateProject {
    pub name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub team: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub default_monthly_budget: Option<Option<Decimal>>,
    pub alert_thresholds: Option<Vec<i64>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub webhook_url: Option<Option<String>>,
    /// Greater than 0 and at most 1; `null` turns idle-GPU alerts off.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub idle_gpu_threshold: Option<Option<Decimal>>,
    #[schema(value_type = Option<String>)]
    pub idle_gpu_min_gpu_hours: Option<Decimal>,
}

/// Tells a field given as `null` (`Some(None)`) from one left out (`None`).
pub fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// Create a project (admin).
#[utoipa::path(post, path = "/v1/projects", tag = "projects", request_body = CreateProject,
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 201, description = "Created", body = ProjectView),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The id is taken", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_project(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateProject>,
) -> ApiResult<(StatusCode, axum::Json<ProjectView>)> {
    require_admin(&principal)?;
    let project = ProjectFields {
        id: &body.id,
        name: &body.name,
        team: body.team.as_deref(),
        currency: &body.currency,
        default_monthly_budget: body.default_monthly_budget,
        alert_thresholds: body.alert_thresholds.as_deref(),
        webhook_url: body.webhook_url.as_deref(),
        idle_gpu_threshold: body.idle_gpu_threshold,
        idle_gpu_min_gpu_hours: body.idle_gpu_min_gpu_hours,
    }
    .parse()?;
    let row = projects::create(&state.pool, &project, &principal.actor)
        .await?
        .ok_or_else(|| {
            ApiError::Conflict(
                format!("a project with id `{}` already exists", project.id),
                vec![],
            )
        })?;
    Ok((StatusCode::CREATED, axum::Json(row.into())))
}

/// List the projects the token may read.
#[utoipa::path(get, path = "/v1/projects", tag = "projects", params(PageParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of projects", body = Page<ProjectView>),
    ))]
pub async fn list_projects(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<ProjectView>>> {
    let limit = page.limit()?;
    let after: Option<String> = page.cursor()?;
    let scope: Option<&[String]> = match principal.role {
        Role::Admin | Role::Finance => None,
        Role::Reader => Some(&principal.projects),
        Role::Ingest => Some(&[]),
    };
    let rows = projects::list(&state.pool, scope, after.as_deref(), limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| row.id.clone(),
        |row| ProjectView::seen_by(row, &principal),
    )))
}

/// The project row if the caller may read it; 404 otherwise, exactly as for a missing one.
pub async fn readable_project(
    state: &AppState,
    principal: &Principal,
    id: &str,
) -> ApiResult<ProjectRow> {
    if !principal.can_read(id) {
        return Err(project_not_found(id));
    }
    projects::get(&state.pool, id)
        .await?
        .ok_or_else(|| project_not_found(id))
}

/// One project.
#[utoipa::path(get, path = "/v1/projects/{id}", tag = "projects",
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The project", body = ProjectView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_project(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<ProjectView>> {
    let row = readable_project(&state, &principal, &id).await?;
    Ok(axum::Json(ProjectView::seen_by(row, &principal)))
}

/// Change a project (admin).
#[utoipa::path(patch, path = "/v1/projects/{id}", tag = "projects", request_body = UpdateProject,
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The changed project", body = ProjectView),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn update_project(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateProject>,
) -> ApiResult<axum::Json<ProjectView>> {
    if !principal.can_read(&id) {
        return Err(project_not_found(&id));
    }
    require_admin(&principal)?;
    let changes = ProjectEdit {
        name: body.name.as_deref(),
        team: body.team.as_ref().map(|team| team.as_deref()),
        default_monthly_budget: body.default_monthly_budget,
        alert_thresholds: body.alert_thresholds.as_deref(),
        webhook_url: body.webhook_url.as_ref().map(|url| url.as_deref()),
        idle_gpu_threshold: body.idle_gpu_threshold,
        idle_gpu_min_gpu_hours: body.idle_gpu_min_gpu_hours,
    }
    .parse()?;
    let row = projects::update(
        &state.pool,
        &id,
        &changes,
        &principal.actor,
        &state.settings,
    )
    .await?
    .ok_or_else(|| project_not_found(&id))?;
    Ok(axum::Json(row.into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutBudget {
    /// Budget for the month in the project's currency (decimal string or number, > 0).
    pub amount: Decimal,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BudgetView {
    pub project: String,
    /// `YYYY-MM` in the ledger time zone.
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    pub amount: Decimal,
    pub currency: String,
    pub updated_at: DateTime<Utc>,
}

fn budget_view(row: BudgetRow, currency: &str) -> BudgetView {
    BudgetView {
        project: row.project_id,
        month: Month::from_first_day(row.month),
        amount: row.amount.normalize(),
        currency: currency.to_owned(),
        updated_at: row.updated_at,
    }
}

/// Set the budget of one month (finance or admin).
#[utoipa::path(put, path = "/v1/projects/{id}/budgets/{month}", tag = "projects", request_body = PutBudget,
    params(("id" = String, Path, description = "Project id"), ("month" = String, Path, description = "YYYY-MM")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The month's budget", body = BudgetView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month or amount", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_budget(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, month)): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<PutBudget>,
) -> ApiResult<axum::Json<BudgetView>> {
    let project = readable_project(&state, &principal, &id).await?;
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let month = violations.check("path:month", Month::parse(&month));
    let amount = violations.check("/amount", values::positive(body.amount));
    violations.into_result()?;
    let (Some(month), Some(amount)) = (month, amount) else {
        unreachable!("both parsed or were reported")
    };
    let row = projects::put_budget(
        &state.pool,
        &id,
        month,
        amount,
        &principal.actor,
        &state.settings,
    )
    .await?
    .ok_or_else(|| project_not_found(&id))?;
    Ok(axum::Json(budget_view(row, &project.currency)))
}

/// Every month with its own budget.
#[utoipa::path(get, path = "/v1/projects/{id}/budgets", tag = "projects",
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "Monthly budgets in month order", body = Vec<BudgetView>),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_budgets(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<Vec<BudgetView>>> {
    let project = readable_project(&state, &principal, &id).await?;
    let rows = projects::budgets(&state.pool, &id).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|row| budget_view(row, &project.currency))
            .collect(),
    ))
}
