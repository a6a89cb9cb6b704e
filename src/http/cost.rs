//! What a project's GPU time cost over a period.

use axum::extract::State;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::figures::Grouping;
use crate::domain::period::parse_period;
use crate::domain::validation::Violations;
use crate::domain::values::parse_instant;
use crate::domain::what_if::WhatIf;
use crate::http::error::{ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQueryWhatIf};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::cost::{self, CostOf, CostQuery, CostView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_cost))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct CostParams {
    /// `YYYY-MM` of the ledger time zone; instead of `from` and `to`.
    pub month: Option<String>,
    /// Start (inclusive): a date `YYYY-MM-DD` (its first instant in the ledger time zone) or
    /// an RFC 3339 time that starts a ledger hour; any other time is refused (422), since
    /// rated data is kept per ledger hour.
    pub from: Option<String>,
    /// End (exclusive), in the same forms as `from`.
    pub to: Option<String>,
    /// `day`, `month`, `gpu_model`, `billing_mode`, `gpu_model,billing_mode` (keys
    /// `<gpu_model>/<billing_mode>`, to compare what a task costs on each model as bought),
    /// `outcome` or `label:<key>`.
    pub group_by: Option<String>,
    /// The time up to which unused commitment accrues (RFC 3339); default now.
    pub as_of: Option<String>,
    /// A what-if price, repeatable: `<contract id>:<price>` replaces a contract's price (in
    /// its currency); `<gpu_model>/<billing_mode>:<price>` prices every GPU-hour of that
    /// model and mode (in the project's currency), as if it were their only contract. The
    /// answer is then hypothetical; nothing is stored.
    #[serde(default, skip_deserializing)]
    pub what_if: Vec<String>,
}

fn parse_params(
    params: &CostParams,
    what_if: WhatIf,
    tz: Tz,
    now: DateTime<Utc>,
) -> ApiResult<CostQuery> {
    let mut violations = Violations::default();
    let period = parse_period(
        (
            params.month.as_deref(),
            params.from.as_deref(),
            params.to.as_deref(),
        ),
        tz,
        &mut violations,
    );
    let grouping = match &params.group_by {
        Some(raw) => violations.check("query:group_by", Grouping::parse(raw)),
        None => Some(Grouping::Whole),
    };
    let as_of = match &params.as_of {
        Some(raw) => violations.check("query:as_of", parse_instant(raw)),
        None => Some(now),
    };
    violations.into_result()?;
    let (Some(period), Some(grouping), Some(as_of)) = (period, grouping, as_of) else {
        unreachable!("every parameter parsed or was reported")
    };
    Ok(CostQuery {
        period,
        grouping,
        as_of,
        what_if,
    })
}

/// A project's cost over a period, from its rated data.
///
/// Every figure covers the segments in `[from, to)`: a record spanning the period's edge
/// counts with the part inside it. Figures counted per record (tasks, retries, failures,
/// output) belong to the period holding the record's `ended_at`; a task counts as completed
/// where its first completed record ended, and as failed (`tasks_failed`) where the last of
/// its attempts ended when none of them completed. Unused commitment of reserved contracts
/// scoped to the project accrues hour by hour up to `as_of`; that of unscoped contracts is
/// not the project's (it goes to the monthly report's `shared` row).
///
/// Next to the cost, never part of it: `queue_wait`, over the attempts (job records) that
/// started in the period (each in the group holding its `started_at`) and reported
/// `queued_at`. An attempt's queue wait is `started_at − queued_at`; `p50_seconds` and
/// `p95_seconds` are exact nearest-rank percentiles (PostgreSQL's `percentile_disc`): of n
/// waits, the ⌈n / 2⌉-th and ⌈0.95 × n⌉-th shortest, each one attempt's own wait, in
/// seconds as a decimal string. `attempts` and `total_seconds` of the groups add up to the
/// whole; percentiles do not. `queue_wait` is null where no attempt reported `queued_at`.
#[utoipa::path(get, path = "/v1/projects/{id}/cost", tag = "cost",
    params(("id" = String, Path, description = "Project id"), CostParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The project's cost over the period", body = CostView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid query parameters, named as `query:<name>`", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_cost(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQueryWhatIf(params, what_if): ApiQueryWhatIf<CostParams>,
) -> ApiResult<axum::Json<CostView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let query = parse_params(&params, what_if, tz, state.settings.clock.now())?;
    let mut conn = state.pool.acquire().await?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let view = cost::project_cost(&mut conn, of, &query, tz).await?;
    Ok(axum::Json(view))
}
