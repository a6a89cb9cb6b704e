//! Why a workload's cost per unit moved: `GET /v1/projects/{id}/efficiency`; and the
//! project's efficiency-regression rule and workloads: `/v1/projects/{id}/efficiency/regressions`.

use axum::extract::State;
use rust_decimal::Decimal;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::period::parse_period;
use crate::domain::regression::{RegressionRule, RuleFields};
use crate::domain::validation::Violations;
use crate::http::auth::require_admin;
use crate::http::error::{ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::cost::CostOf;
use crate::ledger::efficiency::{self, EfficiencyQuery, EfficiencyView};
use crate::ledger::regressions::{self, RegressionsView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_efficiency))
        .routes(routes!(get_regressions, put_regressions))
}

/// The longest workload name or unit taken.
const MAX_NAME_CHARS: usize = 200;

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct EfficiencyParams {
    /// The value of the records' `workload` label; records without one are each their task's
    /// own workload, named by task id.
    pub workload: Option<String>,
    /// The output unit whose cost is compared (e.g. `tokens`).
    pub unit: Option<String>,
    /// The period compared, as for the cost: `YYYY-MM`, or `from` and `to` on ledger hour
    /// boundaries.
    pub month: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    /// The baseline, in the same forms; by default as long as the period and ending where
    /// it starts. It must not overlap the period.
    pub baseline_month: Option<String>,
    pub baseline_from: Option<String>,
    pub baseline_to: Option<String>,
}

fn parse_params(params: &EfficiencyParams, tz: chrono_tz::Tz) -> ApiResult<EfficiencyQuery> {
    let mut violations = Violations::default();
    let name = |raw: Option<&str>| {
        let Some(raw) = raw else {
            return Err("is required".to_owned());
        };
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.chars().count() > MAX_NAME_CHARS {
            Err(format!("must be 1 to {MAX_NAME_CHARS} characters"))
        } else {
            Ok(trimmed.to_owned())
        }
    };
    let workload = violations.check("query:workload", name(params.workload.as_deref()));
    let unit = violations.check("query:unit", name(params.unit.as_deref()));
    let period = parse_period(
        (
            params.month.as_deref(),
            params.from.as_deref(),
            params.to.as_deref(),
        ),
        tz,
        &mut violations,
    );
    let baseline = match (
        params.baseline_month.as_deref(),
        params.baseline_from.as_deref(),
        params.baseline_to.as_deref(),
    ) {
        (None, None, None) => period.map(|(from, to)| (from - (to - from), from)),
        given => {
            let mut named = Violations::default();
            let parsed = parse_period(given, tz, &mut named);
            for error in named.into_vec() {
                let pointer = error.pointer.replacen("query:", "query:baseline_", 1);
                violations.push(pointer, error.message);
            }
            parsed
        }
    };
    if let (Some(baseline), Some(period)) = (baseline, period)
        && baseline.0 < period.1
        && period.0 < baseline.1
    {
        violations.push(
            "query:baseline_from",
            "the baseline must not overlap the period",
        );
    }
    violations.into_result()?;
    Ok(EfficiencyQuery {
        workload: workload.expect("parsed or reported"),
        unit: unit.expect("parsed or reported"),
        baseline: baseline.expect("parsed or reported"),
        period: period.expect("parsed or reported"),
    })
}

/// Why a workload's cost per unit moved from a baseline to a period: cost per unit = price
/// per GPU-hour × GPU-hours per unit of completed work × overhead (all GPU-hours ÷ those of
/// completed attempts); the ratio of the two periods is the product of the factors' ratios,
/// and the answer names the largest and shows the GPU models, attempts and retries behind
/// each period.
#[utoipa::path(get, path = "/v1/projects/{id}/efficiency", tag = "efficiency",
    params(("id" = String, Path, description = "Project id"), EfficiencyParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The two periods and the factors of the change", body = EfficiencyView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_efficiency(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(params): ApiQuery<EfficiencyParams>,
) -> ApiResult<axum::Json<EfficiencyView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let query = parse_params(&params, tz)?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    Ok(axum::Json(
        efficiency::explain(&state.pool, of, &query, tz).await?,
    ))
}

/// A project's efficiency-regression rule. Fields left out take the defaults: 0.25, 10, 3,
/// 14 and 5.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutRegressionRule {
    /// False turns the project's regression alerts off; default true.
    pub enabled: Option<bool>,
    /// The share by which the window's median daily cost per unit must exceed the
    /// baseline's (greater than 0, at most 100).
    #[schema(value_type = Option<String>, example = "0.25")]
    pub threshold: Option<Decimal>,
    /// The least extra cost per day worth an alert, in the project's currency (≥ 0).
    #[schema(value_type = Option<String>, example = "10")]
    pub min_extra_cost: Option<Decimal>,
    /// Complete ledger days judged (1 to 92).
    pub window_days: Option<i64>,
    /// Days before the window that make the baseline (1 to 92, at least `window_days`).
    pub baseline_days: Option<i64>,
    /// Completed records with output in the unit that must have ended in the window.
    pub min_records: Option<i64>,
}

/// The project's efficiency-regression rule and the workloads that regressed, now or before.
/// A workload (label `workload`, else the task id) regresses in a unit when the median daily
/// direct cost per unit of its last `window_days` complete ledger days exceeds the median of
/// the `baseline_days` before them by `threshold`, the extra cost a day reaches
/// `min_extra_cost`, and at least `min_records` completed records ended in the window; it
/// fires one `efficiency_regression` alert, and none again until it recovers.
#[utoipa::path(get, path = "/v1/projects/{id}/efficiency/regressions", tag = "efficiency",
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The rule and the workloads' states", body = RegressionsView),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_regressions(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<RegressionsView>> {
    let project = readable_project(&state, &principal, &id).await?;
    Ok(axum::Json(
        regressions::status(&state.pool, &project).await?,
    ))
}

/// Set the project's efficiency-regression rule (admin); its workloads are judged under it
/// at once.
#[utoipa::path(put, path = "/v1/projects/{id}/efficiency/regressions", tag = "efficiency",
    request_body = PutRegressionRule,
    params(("id" = String, Path, description = "Project id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The rule and the workloads' states", body = RegressionsView),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such project", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_regressions(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<PutRegressionRule>,
) -> ApiResult<axum::Json<RegressionsView>> {
    let project = readable_project(&state, &principal, &id).await?;
    require_admin(&principal)?;
    let mut violations = Violations::default();
    let fields = RuleFields {
        threshold: body.threshold,
        min_extra_cost: body.min_extra_cost,
        window_days: body.window_days,
        baseline_days: body.baseline_days,
        min_records: body.min_records,
    };
    let rule: Option<RegressionRule> = RegressionRule::parse(fields, &mut violations);
    violations.into_result()?;
    let rule = rule.expect("parsed or reported");
    let enabled = body.enabled.unwrap_or(true);
    Ok(axum::Json(
        regressions::put_rule(
            &state.pool,
            &project,
            enabled,
            rule,
            &principal.actor,
            &state.settings,
        )
        .await?,
    ))
}
