//! The month's FOCUS export for finance; its rows are described in [`crate::exports::focus`].

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::values::Month;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::ApiPath;
use crate::http::problems::{AuthProblems, PathProblems};
use crate::http::state::AppState;
use crate::ledger::focus;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_focus_export))
}

/// The month's charges as a FinOps FOCUS 1.2 cost-and-usage CSV (finance or admin).
///
/// Rows: GPU time of each project by the contract that rated it (`ChargeCategory=Usage`, in
/// the project's currency); GPU time that carries no cost (no contract, or no FX rate) as
/// zero-cost rows with `x_UnratedReason` and `x_UnratedGpuSeconds`, so no GPU time is left
/// out; and unused commitment of reserved contracts with committed GPUs
/// (`CommitmentDiscountStatus=Unused`), billed to the contract's project or, for a contract
/// not scoped to one, to the `shared` sub-account in the contract's currency. Projects are
/// the sub-accounts `projects/<id>` of one billing account, `taskledger`. Billing and charge
/// periods are the ledger month's bounds in UTC; in a month in progress, unused commitment
/// accrues up to now. Money is at full precision; quantities are GPU-hours. Per row,
/// `x_TaskCount` counts the distinct tasks with GPU time in it, `x_GpuSeconds` and
/// `x_GpuSecondsBusy` are the GPU-seconds held and measured busy. Text cells that a
/// spreadsheet would read as a formula start with `'`.
#[utoipa::path(get, path = "/v1/exports/focus/{month}", tag = "reports",
    params(("month" = String, Path, description = "YYYY-MM in the ledger time zone")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The FOCUS CSV", body = String, content_type = "text/csv",
            headers(("Content-Disposition" = String, description = "attachment; filename=\"focus-YYYY-MM.csv\""))),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month, as `path:month`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_focus_export(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(month): ApiPath<String>,
) -> ApiResult<Response> {
    require_finance(&principal)?;
    let month = Month::parse(&month).map_err(|message| ApiError::invalid("path:month", message))?;
    let body = focus::export(&state.pool, month, &state.settings).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"focus-{month}.csv\""),
            ),
        ],
        body,
    )
        .into_response())
}
