//! What a GPU costs right now, per hour and per minute: what an idle minute of each card
//! burns. For a project (anyone who may read it), from the contracts that could price its
//! GPU time; for the fleet (finance or admin), from every contract.

use axum::extract::State;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::Principal;
use crate::domain::tco::per_minute;
use crate::domain::validation::Violations;
use crate::domain::values::parse_instant;
use crate::http::auth::require_finance;
use crate::http::contracts::PricePartsView;
use crate::http::error::{ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::pricing::{self, PriceAt};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(fleet_prices))
        .routes(routes!(project_prices))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PricesParams {
    /// RFC 3339 with an offset; now when absent.
    pub at: Option<String>,
}

/// What one GPU under one contract costs at the instant.
#[derive(Debug, Serialize, ToSchema)]
pub struct CardPriceView {
    pub gpu_model: String,
    /// `on_demand`, `spot` or `reserved`.
    pub billing_mode: String,
    pub contract: Uuid,
    pub name: String,
    pub project: Option<String>,
    pub provider: Option<String>,
    pub region: Option<String>,
    /// The contract's currency.
    pub currency: String,
    #[schema(value_type = String, example = "1.75")]
    pub price_per_gpu_hour: Decimal,
    /// What an idle minute of one GPU costs.
    #[schema(value_type = String, example = "0.02916666666666666667")]
    pub price_per_gpu_minute: Decimal,
    /// An owned card's price, part by part.
    pub price_parts: Option<PricePartsView>,
    /// An owned card's: when its depreciation ends.
    pub depreciated_from: Option<DateTime<Utc>>,
    /// For a project: the price per GPU-minute in the project's currency at this month's FX
    /// rate; null when the rate is missing.
    #[schema(value_type = Option<String>)]
    pub project_price_per_gpu_minute: Option<Decimal>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PricesView {
    pub at: DateTime<Utc>,
    /// The project's, for a project's prices.
    pub project: Option<String>,
    pub currency: Option<String>,
    /// By GPU model, billing mode and contract.
    pub items: Vec<CardPriceView>,
}

fn view(price: PriceAt) -> CardPriceView {
    let terms = price.row.fields();
    let total = price.phase.parts.total().normalize();
    CardPriceView {
        gpu_model: terms.gpu_model.clone(),
        billing_mode: terms.billing_mode.as_str().to_owned(),
        contract: price.row.id,
        name: terms.name.clone(),
        project: terms.project_id.clone(),
        provider: terms.provider.clone(),
        region: terms.region.clone(),
        currency: terms.currency.clone(),
        price_per_gpu_hour: total,
        price_per_gpu_minute: per_minute(total),
        price_parts: terms.tco.as_ref().map(|_| price.phase.parts.into()),
        depreciated_from: terms.depreciated_from(),
        project_price_per_gpu_minute: price.converted.map(per_minute),
    }
}

fn instant(params: &PricesParams, now: DateTime<Utc>) -> ApiResult<DateTime<Utc>> {
    let mut violations = Violations::default();
    let at = match &params.at {
        Some(raw) => violations.check("query:at", parse_instant(raw)),
        None => Some(now),
    };
    violations.into_result()?;
    Ok(at.expect("parsed or reported"))
}

/// What a GPU of each model costs now under every contract in force (finance or admin).
#[utoipa::path(get, path = "/v1/prices", tag = "contracts", params(PricesParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "Every contract's price at the instant", body = PricesView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn fleet_prices(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(params): ApiQuery<PricesParams>,
) -> ApiResult<axum::Json<PricesView>> {
    require_finance(&principal)?;
    let at = instant(&params, state.settings.clock.now())?;
    let prices = pricing::prices_at(&state.pool, at, None, state.settings.timezone).await?;
    Ok(axum::Json(PricesView {
        at,
        project: None,
        currency: None,
        items: prices.into_iter().map(view).collect(),
    }))
}

/// What a GPU of each model costs the project now: the contracts in force that could price
/// its GPU time (unscoped, or scoped to it).
#[utoipa::path(get, path = "/v1/projects/{id}/prices", tag = "cost",
    params(("id" = String, Path, description = "Project id"), PricesParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The prices at the instant", body = PricesView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn project_prices(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<PricesParams>,
) -> ApiResult<axum::Json<PricesView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let at = instant(&params, state.settings.clock.now())?;
    let prices = pricing::prices_at(
        &state.pool,
        at,
        Some((&project.id, &project.currency)),
        state.settings.timezone,
    )
    .await?;
    Ok(axum::Json(PricesView {
        at,
        project: Some(project.id.clone()),
        currency: Some(project.currency.clone()),
        items: prices.into_iter().map(view).collect(),
    }))
}
