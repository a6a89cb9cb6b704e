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
use crate::domain::idle;
use crate::domain::validation::Violations;
use crate::domain::values::{self, Currency, Month, ProjectId};
use crate::http::auth::{project_not_found, require_admin, require_finance};
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::projects::{self, BudgetRow, NewProject, ProjectChanges, ProjectRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_project, list_projects))
        .routes(routes!(get_project, update_project))
        .routes(routes!(list_budgets))
        .routes(routes!(put_budget))
}

pub const DEFAULT_THRESHOLDS: [i32; 3] = [50, 80, 100];

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

fn optional_text(
    violations: &mut Violations,
    pointer: &str,
    raw: Option<&str>,
    max: usize,
) -> Option<String> {
    raw.and_then(|text| violations.check(pointer, values::bounded_text(text, max)))
}

/// An idle-GPU threshold as given: a share, or `null` for off.
fn idle_threshold(violations: &mut Violations, given: Option<Decimal>) -> Option<Decimal> {
    given.and_then(|t| violations.check("/idle_gpu_threshold", idle::threshold(t)))
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
    let mut violations = Violations::default();
    let id = violations.check("/id", ProjectId::parse(&body.id));
    let name = violations.check("/name", values::bounded_text(&body.name, 200));
    let team = optional_text(&mut violations, "/team", body.team.as_deref(), 200);
    let currency = violations.check("/currency", Currency::parse(&body.currency));
    let budget = body
        .default_monthly_budget
        .and_then(|b| violations.check("/default_monthly_budget", values::positive(b)));
    let thresholds = match &body.alert_thresholds {
        Some(list) => violations.check("/alert_thresholds", values::alert_thresholds(list)),
        None => Some(DEFAULT_THRESHOLDS.to_vec()),
    };
    let webhook_url = body
        .webhook_url
        .as_deref()
        .and_then(|url| violations.check("/webhook_url", values::webhook_url(url)));
    let idle_gpu_threshold = match body.idle_gpu_threshold {
        None => Some(idle::DEFAULT_THRESHOLD),
        Some(threshold) => idle_threshold(&mut violations, threshold),
    };
    let idle_gpu_min_gpu_hours = body
        .idle_gpu_min_gpu_hours
        .and_then(|hours| violations.check("/idle_gpu_min_gpu_hours", values::positive(hours)))
        .unwrap_or(idle::DEFAULT_MIN_GPU_HOURS);
    violations.into_result()?;
    let (Some(id), Some(name), Some(currency), Some(thresholds)) = (id, name, currency, thresholds)
    else {
        unreachable!("every required field either parsed or was reported")
    };
    let project = NewProject {
        id: id.as_str().to_owned(),
        name,
        team,
        currency: currency.code().to_owned(),
        default_monthly_budget: budget,
        alert_thresholds: thresholds,
        webhook_url,
        idle_gpu_threshold,
        idle_gpu_min_gpu_hours,
    };
    let row = projects::create(&state.pool, &project)
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
    let mut violations = Violations::default();
    let changes = ProjectChanges {
        name: optional_text(&mut violations, "/name", body.name.as_deref(), 200),
        team: body
            .team
            .map(|team| optional_text(&mut violations, "/team", team.as_deref(), 200)),
        default_monthly_budget: body.default_monthly_budget.map(|budget| {
            budget.and_then(|b| violations.check("/default_monthly_budget", values::positive(b)))
        }),
        alert_thresholds: body.alert_thresholds.and_then(|list| {
            violations.check("/alert_thresholds", values::alert_thresholds(&list))
        }),
        webhook_url: body.webhook_url.map(|url| {
            url.and_then(|url| violations.check("/webhook_url", values::webhook_url(&url)))
        }),
        idle_gpu_threshold: body
            .idle_gpu_threshold
            .map(|threshold| idle_threshold(&mut violations, threshold)),
        idle_gpu_min_gpu_hours: body
            .idle_gpu_min_gpu_hours
            .and_then(|hours| violations.check("/idle_gpu_min_gpu_hours", values::positive(hours))),
    };
    violations.into_result()?;
    let row = projects::update(&state.pool, &id, &changes, &state.settings)
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
    let row = projects::put_budget(&state.pool, &id, month, amount, &state.settings).await?;
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
