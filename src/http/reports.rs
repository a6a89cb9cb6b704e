//! The monthly report and month close (finance).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::figures::Grouping;
use crate::domain::validation::Violations;
use crate::domain::values::Month;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery, ApiQueryWhatIf, wants_csv};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::reports::{self, MonthlyReport};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_monthly_report))
        .routes(routes!(close_month))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ReportQuery {
    /// `json` (default) or `csv`; `Accept: text/csv` also selects CSV.
    pub format: Option<String>,
    /// Adds per-group rows to each project (open months only): `day`, `month`, `gpu_model`,
    /// `billing_mode`, `gpu_model,billing_mode`, `outcome` or `label:<key>`.
    pub group_by: Option<String>,
    /// A what-if price, repeatable, as for a project's cost: the report (a closed month's
    /// too) is then computed at those prices, marked hypothetical, and nothing is stored.
    #[serde(default, skip_deserializing)]
    pub what_if: Vec<String>,
}

fn parse_month(raw: &str) -> ApiResult<Month> {
    Month::parse(raw).map_err(|message| ApiError::invalid("path:month", message))
}

fn csv_asked(format: Option<&str>, headers: &HeaderMap) -> ApiResult<bool> {
    wants_csv(format, headers).map_err(|message| ApiError::invalid("query:format", message))
}

fn respond(json: String, csv: bool, month: Month) -> ApiResult<Response> {
    if csv {
        let body = reports::to_csv(&json)?;
        let disposition = format!("attachment; filename=\"taskledger-{month}.csv\"");
        let mut response = body.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        headers.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_str(&disposition).map_err(anyhow::Error::from)?,
        );
        Ok(response)
    } else {
        Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            json,
        )
            .into_response())
    }
}

/// The monthly report (finance or admin).
///
/// One row per project with its cost figures, tasks, cost per completed task, waste, budget
/// and burn; the `shared` unused commitment of contracts scoped to no project; prior-period
/// adjustments (changes to closed months, with the month they belong to); grand totals per
/// currency. A closed month's report is frozen: it is returned exactly as it was at close.
/// As CSV, money is rounded half-even to the currency's minor unit, totals from unrounded
/// sums, and no text cell can be read as a formula.
#[utoipa::path(get, path = "/v1/reports/monthly/{month}", tag = "reports",
    params(("month" = String, Path, description = "YYYY-MM"), ReportQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The report", content(
            (MonthlyReport = "application/json"),
            (String = "text/csv"),
        )),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "group_by on a closed month", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month, format or group_by", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_monthly_report(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(month): ApiPath<String>,
    ApiQueryWhatIf(query, what_if): ApiQueryWhatIf<ReportQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let month = violations.check("path:month", Month::parse(&month));
    let grouping = match &query.group_by {
        Some(raw) => violations.check("query:group_by", Grouping::parse(raw)),
        None => Some(Grouping::Whole),
    };
    violations.into_result()?;
    let (Some(month), Some(grouping)) = (month, grouping) else {
        unreachable!("both parsed or were reported")
    };
    let csv = csv_asked(query.format.as_deref(), &headers)?;
    let report = reports::report(&state.pool, month, grouping, &what_if, &state.settings).await?;
    respond(report.to_json()?, csv, month)
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CloseQuery {
    /// `json` (default) or `csv`: the format of the frozen report returned.
    pub format: Option<String>,
}

/// Close a month (finance or admin): freezes its report for good.
///
/// Only a month that has ended can be closed, and only once. Records, corrections and
/// re-rating that touch it later are still stored; their effect appears as prior-period
/// adjustments in the first open month after it.
#[utoipa::path(post, path = "/v1/reports/monthly/{month}/close", tag = "reports",
    params(("month" = String, Path, description = "YYYY-MM"), CloseQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "Closed; the frozen report", body = MonthlyReport),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "The month has not ended, or is already closed", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn close_month(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(month): ApiPath<String>,
    ApiQuery(query): ApiQuery<CloseQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    require_finance(&principal)?;
    let month = parse_month(&month)?;
    let csv = csv_asked(query.format.as_deref(), &headers)?;
    let json = reports::close(&state.pool, month, &principal.actor, &state.settings).await?;
    respond(json, csv, month)
}
