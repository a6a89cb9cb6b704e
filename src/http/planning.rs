//! Commitment planning, for finance: how many GPUs of a model to reserve.

use axum::extract::State;
use chrono::Utc;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::reservation_plan::PlanRequest;
use crate::http::auth::require_finance;
use crate::http::error::{ApiResult, Problem};
use crate::http::extract::ApiQuery;
use crate::http::problems::{AuthProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::planning::{self, ReservationPlanView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_reservation_plan))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PlanParams {
    /// The GPU model to plan for (required).
    pub gpu_model: Option<String>,
    /// Only records naming a node of this pool in the window.
    pub pool: Option<String>,
    /// Only records of this provider; contracts scoped to another provider are left out.
    pub provider: Option<String>,
    /// `YYYY-MM` of the ledger time zone; instead of `from` and `to`.
    pub month: Option<String>,
    /// Start (inclusive): a date `YYYY-MM-DD` or an RFC 3339 time starting a ledger hour.
    /// Without `month`, `from` and `to`: the 30 ledger days before today.
    pub from: Option<String>,
    /// End (exclusive), in the same forms as `from`.
    pub to: Option<String>,
    /// Reserved price per GPU-hour, in `currency`; default: the reserved contract of the
    /// model in force in the window's last hour.
    pub reserved_price: Option<String>,
    /// On-demand price per GPU-hour, in `currency`; default: the on-demand contract in force.
    pub on_demand_price: Option<String>,
    /// Spot price per GPU-hour, in `currency`; default: the spot contract in force (none: no
    /// spot comparison).
    pub spot_price: Option<String>,
    /// The plan's currency; default: the reserved contract's, else the on-demand one's,
    /// else USD.
    pub currency: Option<String>,
}

/// How many GPUs of a model to reserve (finance or admin).
///
/// `u_h`, the GPU-hours used in each ledger hour of the window by records of the model on
/// on-demand and reserved (MIG slices as their share of the card; GPU time no contract priced
/// included), gives the cost of committing `N` GPUs: `N × r × H + o × Σ_h max(0, u_h − N)`,
/// for every `N` from 0 to the busiest hour rounded up (`curve`). `recommended_gpus` is the
/// cheapest, the fewest where several tie; `cost_today` is the same formula at the GPUs the
/// model's reservations commit in the window's last hour, and `saving` the difference.
/// `break_even_utilisation` = `r ÷ o`. `contracts` are the model's reservations with a
/// commitment over the window (except those pricing a pool's capacity, judged there), each
/// with its utilisation, its own break-even (its price ÷ `o`) and, when below it, over-reserved
/// with its unused commitment as `wasted`. `spot` prices the window's on-demand GPU-hours at
/// the spot price, beside the spot attempts of the model seen preempted in the window: what
/// was observed, not a promise. Money is exact, in `currency`; contract prices in another
/// currency are converted at the rate of the month of the window's last hour.
#[utoipa::path(get, path = "/v1/planning/reservations", tag = "reports",
    params(PlanParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "The plan", body = ReservationPlanView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing or invalid parameter, no price in force where none is given, or no FX rate for a conversion, named as `query:<name>`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_reservation_plan(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(params): ApiQuery<PlanParams>,
) -> ApiResult<axum::Json<ReservationPlanView>> {
    require_finance(&principal)?;
    let query = PlanRequest {
        gpu_model: params.gpu_model.as_deref(),
        pool: params.pool.as_deref(),
        provider: params.provider.as_deref(),
        month: params.month.as_deref(),
        from: params.from.as_deref(),
        to: params.to.as_deref(),
        reserved_price: params.reserved_price.as_deref(),
        on_demand_price: params.on_demand_price.as_deref(),
        spot_price: params.spot_price.as_deref(),
        currency: params.currency.as_deref(),
    }
    .parse(state.settings.timezone, Utc::now())?;
    let plan = planning::reservations(&state.pool, &query, state.settings.timezone).await?;
    Ok(axum::Json(plan))
}
