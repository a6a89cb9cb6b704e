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
use crate::domain::tco::{NewTco, Phase, PriceParts, Tco, per_minute};
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
    /// The price from `valid_from` (a TCO contract's later price is in `phases`).
    #[schema(value_type = String, example = "2.5")]
    pub price_per_gpu_hour: Decimal,
    /// The same price per GPU-minute: what an idle minute costs.
    #[schema(value_type = String, example = "0.04166666666666666667")]
    pub price_per_gpu_minute: Decimal,
    /// A TCO contract's price from `valid_from`, part by part (they sum to it exactly).
    pub price_parts: Option<PricePartsView>,
    /// Set: the contract is priced by what its cards cost.
    pub tco: Option<TcoView>,
    /// A TCO contract's: when its cards are fully depreciated and the depreciation part of
    /// its price ends.
    pub depreciated_from: Option<DateTime<Utc>>,
    /// The contract's prices in time order: one, or two when a TCO contract's cards are
    /// fully depreciated inside its validity.
    pub phases: Vec<PhaseView>,
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

/// A price per GPU-hour of a TCO contract, part by part.
#[derive(Debug, Serialize, ToSchema)]
pub struct PricePartsView {
    /// `(purchase − salvage) ÷ life_months ÷ 730`; 0 once the cards are fully depreciated.
    #[schema(value_type = String)]
    pub depreciation: Decimal,
    /// `other_per_gpu_month ÷ 730`.
    #[schema(value_type = String)]
    pub other: Decimal,
    /// `power_kw_per_gpu × pue × electricity_price_per_kwh`; measured energy replaces it.
    #[schema(value_type = String)]
    pub power: Decimal,
}

impl From<PriceParts> for PricePartsView {
    fn from(parts: PriceParts) -> Self {
        Self {
            depreciation: parts.depreciation.normalize(),
            other: parts.other.normalize(),
            power: parts.power.normalize(),
        }
    }
}

/// One stretch of a contract's validity with one price.
#[derive(Debug, Serialize, ToSchema)]
pub struct PhaseView {
    pub from: DateTime<Utc>,
    /// Exclusive; null means open-ended.
    pub until: Option<DateTime<Utc>>,
    #[schema(value_type = String)]
    pub price_per_gpu_hour: Decimal,
    #[schema(value_type = String)]
    pub price_per_gpu_minute: Decimal,
    /// A TCO contract's price, part by part.
    pub price_parts: Option<PricePartsView>,
}

impl PhaseView {
    fn new(phase: &Phase, tco: bool) -> Self {
        let price = phase.parts.total().normalize();
        Self {
            from: phase.from,
            until: phase.until,
            price_per_gpu_hour: price,
            price_per_gpu_minute: per_minute(price),
            price_parts: tco.then(|| phase.parts.into()),
        }
    }
}

/// What one owned GPU costs, as given.
#[derive(Debug, Serialize, ToSchema)]
pub struct TcoView {
    #[schema(value_type = String)]
    pub purchase_price_per_gpu: Decimal,
    #[schema(value_type = String)]
    pub salvage_value_per_gpu: Decimal,
    pub life_months: u32,
    pub in_service_from: DateTime<Utc>,
    #[schema(value_type = String)]
    pub power_kw_per_gpu: Decimal,
    #[schema(value_type = String)]
    pub electricity_price_per_kwh: Decimal,
    #[schema(value_type = String)]
    pub pue: Decimal,
    #[schema(value_type = String)]
    pub other_per_gpu_month: Decimal,
}

impl From<&Tco> for TcoView {
    fn from(tco: &Tco) -> Self {
        Self {
            purchase_price_per_gpu: tco.purchase_price_per_gpu.normalize(),
            salvage_value_per_gpu: tco.salvage_value_per_gpu.normalize(),
            life_months: tco.life_months,
            in_service_from: tco.in_service_from,
            power_kw_per_gpu: tco.power_kw_per_gpu.normalize(),
            electricity_price_per_kwh: tco.electricity_price_per_kwh.normalize(),
            pue: tco.pue.normalize(),
            other_per_gpu_month: tco.other_per_gpu_month.normalize(),
        }
    }
}

impl From<ContractRow> for ContractView {
    fn from(row: ContractRow) -> Self {
        let terms = row.fields();
        let priced_by_tco = terms.tco.is_some();
        let phases: Vec<PhaseView> = terms
            .phases()
            .iter()
            .map(|phase| PhaseView::new(phase, priced_by_tco))
            .collect();
        let first = &terms.phases()[0];
        Self {
            id: row.id,
            name: row.name,
            gpu_model: row.gpu_model,
            billing_mode: row.billing_mode.as_str().to_owned(),
            price_per_gpu_hour: phases[0].price_per_gpu_hour,
            price_per_gpu_minute: phases[0].price_per_gpu_minute,
            price_parts: priced_by_tco.then(|| first.parts.into()),
            tco: terms.tco.as_ref().map(TcoView::from),
            depreciated_from: terms.depreciated_from(),
            phases,
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
    /// Price of one GPU-hour (decimal string or number, > 0), exact. Required unless `tco`
    /// is given.
    #[schema(value_type = Option<String>, example = "2.50")]
    pub price_per_gpu_hour: Option<Decimal>,
    /// What one owned GPU costs, in place of a price (reserved contracts only).
    pub tco: Option<TcoBody>,
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

/// What one owned GPU costs (COST_MODEL §10), in the contract's currency. Creating a TCO
/// contract requires the purchase price, life and in-service date; salvage, power,
/// electricity and other costs default to 0 and PUE to 1. A change names only the fields it
/// changes.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TcoBody {
    /// What one GPU cost to buy (> 0).
    #[schema(value_type = Option<String>, example = "30000")]
    pub purchase_price_per_gpu: Option<Decimal>,
    /// What it sells for at the end of its life (0 to the purchase price).
    #[schema(value_type = Option<String>, example = "3000")]
    pub salvage_value_per_gpu: Option<Decimal>,
    /// Months it depreciates over (1 to 1200).
    #[schema(example = 36)]
    pub life_months: Option<i64>,
    /// RFC 3339 with an offset: when depreciation starts.
    #[schema(example = "2026-01-01T00:00:00Z")]
    pub in_service_from: Option<String>,
    /// Average power one GPU draws, in kW (≥ 0).
    #[schema(value_type = Option<String>, example = "0.7")]
    pub power_kw_per_gpu: Option<Decimal>,
    /// What one kWh costs (≥ 0).
    #[schema(value_type = Option<String>, example = "0.12")]
    pub electricity_price_per_kwh: Option<Decimal>,
    /// Power usage effectiveness of the data centre (≥ 1).
    #[schema(value_type = Option<String>, example = "1.25")]
    pub pue: Option<Decimal>,
    /// Hosting, network, support and staff per GPU and month (≥ 0).
    #[schema(value_type = Option<String>, example = "146")]
    pub other_per_gpu_month: Option<Decimal>,
}

impl TcoBody {
    fn given(&self) -> NewTco<'_> {
        NewTco {
            purchase_price_per_gpu: self.purchase_price_per_gpu,
            salvage_value_per_gpu: self.salvage_value_per_gpu,
            life_months: self.life_months,
            in_service_from: self.in_service_from.as_deref(),
            power_kw_per_gpu: self.power_kw_per_gpu,
            electricity_price_per_kwh: self.electricity_price_per_kwh,
            pue: self.pue,
            other_per_gpu_month: self.other_per_gpu_month,
        }
    }
}

/// Fields to change. The model, mode and scope of a contract never change (create another
/// one instead); `null` makes `valid_until` open-ended or removes `committed_gpus`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateContract {
    pub name: Option<String>,
    /// Not on a TCO contract (change its `tco`, or set `tco` to null with a price).
    #[schema(value_type = Option<String>)]
    pub price_per_gpu_hour: Option<Decimal>,
    /// The TCO fields to change; null turns a TCO contract into one with the price given.
    #[serde(default, deserialize_with = "present")]
    pub tco: Option<Option<TcoBody>>,
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
            tco: self
                .tco
                .as_ref()
                .map(|tco| tco.as_ref().map(TcoBody::given)),
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
        tco: body.tco.as_ref().map(TcoBody::given),
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
    let row = pricing::create_contract(
        &state.pool,
        fields,
        violations,
        project,
        &principal.actor,
        &state.settings,
    )
    .await?;
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
    let row =
        pricing::update_contract(&state.pool, uuid, change, &principal.actor, &state.settings)
            .await?;
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
    pricing::delete_contract(&state.pool, uuid, &principal.actor, &state.settings).await?;
    Ok(StatusCode::NO_CONTENT)
}
