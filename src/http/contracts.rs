//! Pricing contracts (finance or admin). Every change re-rates what it touches, in the same
//! transaction, before the response returns.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::Principal;
use crate::domain::contract::{ContractChange, NewContract};
use crate::domain::values::ProjectId;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::projects::present;
use crate::http::state::AppState;
use crate::ledger::pricing::{self, ContractFields, ContractRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_contract, list_contracts))
        .routes(routes!(get_contract, update_contract, delete_contract))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ContractView {
    pub id: Uuid,
    pub name: String,
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    pub price_per_gpu_hour: Decimal,
    /// ISO 4217 code of the price.
    pub currency: String,
    pub valid_from: DateTime<Utc>,
    /// Exclusive; null means open-ended.
    pub valid_until: Option<DateTime<Utc>>,
    /// Set: prices only this project's records.
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// GPUs paid for every hour of validity, used or not (reserved contracts only).
    pub committed_gpus: Option<Decimal>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<ContractRow> for ContractView {
    fn from(row: ContractRow) -> Self {
        Self {
            id: row.id,
            name: row.name,
            gpu_model: row.gpu_model,
            billing_mode: row.billing_mode.as_str().to_owned(),
            price_per_gpu_hour: row.price_per_gpu_hour.normalize(),
            currency: row.currency,
            valid_from: row.valid_from,
            valid_until: row.valid_until,
            project: row.project_id,
            provider: row.provider,
            region: row.region,
            committed_gpus: row.committed_gpus.map(|gpus| gpus.normalize()),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateContract {
    pub name: String,
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    /// Price of one GPU-hour (decimal string or number, > 0), exact.
    #[schema(value_type = String, example = "2.50")]
    pub price_per_gpu_hour: Decimal,
    /// ISO 4217 code, e.g. `USD`.
    pub currency: String,
    /// RFC 3339 with an offset.
    pub valid_from: String,
    /// RFC 3339 with an offset, after `valid_from`; absent means open-ended.
    pub valid_until: Option<String>,
    /// Scope the contract to one project.
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// Only on `reserved` contracts, > 0 (may be fractional).
    #[schema(value_type = Option<String>, example = "8")]
    pub committed_gpus: Option<Decimal>,
}

/// Fields to change. The model, mode and scope of a contract never change (create another
/// one instead); `null` makes `valid_until` open-ended or removes `committed_gpus`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateContract {
    pub name: Option<String>,
    #[schema(value_type = Option<String>)]
    pub price_per_gpu_hour: Option<Decimal>,
    pub currency: Option<String>,
    pub valid_from: Option<String>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub valid_until: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>)]
    pub committed_gpus: Option<Option<Decimal>>,
}

impl UpdateContract {
    fn change(&self) -> ContractChange<'_> {
        ContractChange {
            name: self.name.as_deref(),
            price_per_gpu_hour: self.price_per_gpu_hour,
            currency: self.currency.as_deref(),
            valid_from: self.valid_from.as_deref(),
            valid_until: self.valid_until.as_ref().map(|until| until.as_deref()),
            committed_gpus: self.committed_gpus,
        }
    }
}

/// Create a contract (finance or admin); re-rates the records it prices.
#[utoipa::path(post, path = "/v1/contracts", tag = "contracts", request_body = CreateContract,
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 201, description = "Created; the records it prices are re-rated", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An equally specific contract (same model, mode and project/provider/region scope) overlaps it; the detail names it", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateContract>,
) -> ApiResult<(StatusCode, axum::Json<ContractView>)> {
    require_finance(&principal)?;
    let (fields, project, violations) = NewContract {
        name: &body.name,
        gpu_model: &body.gpu_model,
        billing_mode: &body.billing_mode,
        price_per_gpu_hour: body.price_per_gpu_hour,
        currency: &body.currency,
        valid_from: &body.valid_from,
        valid_until: body.valid_until.as_deref(),
        project: body.project.as_deref(),
        provider: body.provider.as_deref(),
        region: body.region.as_deref(),
        committed_gpus: body.committed_gpus,
    }
    .parse();
    let project = project.as_ref().map(ProjectId::as_str);
    let row =
        pricing::create_contract(&state.pool, fields, violations, project, &state.settings).await?;
    Ok((StatusCode::CREATED, axum::Json(row.into())))
}

/// Every contract (finance or admin).
#[utoipa::path(get, path = "/v1/contracts", tag = "contracts", params(PageParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of contracts in id order", body = Page<ContractView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_contracts(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<ContractView>>> {
    require_finance(&principal)?;
    let limit = page.limit()?;
    let after: Option<Uuid> = page.cursor()?;
    let rows = pricing::contracts(&state.pool, after, limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| row.id,
        ContractView::from,
    )))
}

fn contract_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("contract `{id}` does not exist"))
}

fn contract_id(raw: &str) -> ApiResult<Uuid> {
    Uuid::parse_str(raw).map_err(|_| contract_not_found(raw))
}

/// One contract (finance or admin).
#[utoipa::path(get, path = "/v1/contracts/{id}", tag = "contracts",
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The contract", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<ContractView>> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    let row = pricing::contract(&state.pool, uuid)
        .await?
        .ok_or_else(|| contract_not_found(&id))?;
    Ok(axum::Json(row.into()))
}

/// Change a contract (finance or admin); re-rates what its old and new terms price.
#[utoipa::path(patch, path = "/v1/contracts/{id}", tag = "contracts", request_body = UpdateContract,
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The changed contract; what it prices is re-rated", body = ContractView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The new validity overlaps an equally specific contract", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn update_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<UpdateContract>,
) -> ApiResult<axum::Json<ContractView>> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    let change = |old: &ContractFields| body.change().apply(old);
    let row = pricing::update_contract(&state.pool, uuid, change, &state.settings).await?;
    Ok(axum::Json(row.into()))
}

/// Delete a contract (finance or admin); what it priced is re-rated (and may become unrated).
#[utoipa::path(delete, path = "/v1/contracts/{id}", tag = "contracts",
    params(("id" = String, Path, description = "Contract id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Deleted; what it priced is re-rated"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such contract", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_contract(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<StatusCode> {
    require_finance(&principal)?;
    let uuid = contract_id(&id)?;
    pricing::delete_contract(&state.pool, uuid, &state.settings).await?;
    Ok(StatusCode::NO_CONTENT)
}
