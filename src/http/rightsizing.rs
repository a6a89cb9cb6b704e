//! Right-sizing recommendations: which workloads fit a MIG slice or a cheaper GPU model.

use axum::extract::State;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::values::Month;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::cost::CostOf;
use crate::ledger::rightsizing::{self, RecommendationsView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_recommendations))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RecommendationParams {
    /// `YYYY-MM` of the ledger time zone (required).
    pub month: Option<String>,
}

/// Right-sizing recommendations of a project's month.
///
/// A workload is the records' `workload` label, or else the task id; it is judged per GPU
/// model, over its records on whole GPUs (no `mig_profile`) with GPU time in the month. With
/// at least 3 of them reporting `memory_peak_gib`, its need is the 95th percentile (nearest
/// rank, as PostgreSQL's `percentile_disc`) of their memory peaks and of the SM activity of
/// those reporting it, each with 20 % headroom. It is recommended the smallest MIG profile
/// of its card short of the whole card (fewest slices, then least memory) whose memory and
/// compute share g/7 cover that need; else the GPU model whose contracts, chosen as rating
/// chooses them (same billing mode, project scope first), would have priced its GPU time of
/// the month for least, among those with the memory and cheaper than what it cost; else it
/// is skipped, with the reason. Without SM activity only memory is compared, and the
/// assumption says so. `estimated_saving` = `period_cost` × (1 − `share`), assuming the same
/// run time; items come largest saving first. Workloads whose records reported neither a
/// memory peak nor SM activity are only counted.
#[utoipa::path(get, path = "/v1/projects/{id}/recommendations", tag = "cost",
    params(("id" = String, Path, description = "Project id"), RecommendationParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The month's recommendations and skipped workloads", body = RecommendationsView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Missing or invalid month, or an unknown parameter, named as `query:<name>`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_recommendations(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<RecommendationParams>,
) -> ApiResult<axum::Json<RecommendationsView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let month = match params.month.as_deref() {
        Some(raw) => {
            Month::parse(raw).map_err(|message| ApiError::invalid("query:month", message))?
        }
        None => {
            return Err(ApiError::invalid(
                "query:month",
                "give the month, as YYYY-MM",
            ));
        }
    };
    let mut conn = state.pool.acquire().await?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let view = rightsizing::recommendations(&mut conn, of, month, state.settings.timezone).await?;
    Ok(axum::Json(view))
}
