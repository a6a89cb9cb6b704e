//! Capacity: pools, the intervals their nodes are paid for, each pool's month, and the nodes
//! idle right now (COST_MODEL.md §9).

use axum::extract::State;
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::{Principal, Role};
use crate::domain::capacity::{self, PoolSettings, parse_intervals};
use crate::domain::validation::Violations;
use crate::domain::values::Month;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJsonValue, ApiPath, ApiQuery};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::capacity::{self as ledger, CapacityReceipt, PoolUtilisation, PoolView};
use crate::ledger::zombies::{self, ZombieView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_pools))
        .routes(routes!(put_pool, get_pool))
        .routes(routes!(pool_utilisation))
        .routes(routes!(post_capacity, put_capacity))
        .routes(routes!(list_zombies))
}

/// What `PUT /v1/pools/{id}` takes (validated field by field).
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct PutPool {
    /// 1-200 characters.
    #[schema(example = "H100 training nodes")]
    name: String,
    /// The project its idle and down time is charged to under `owner`, and the project
    /// scope its nodes' contracts are matched with.
    #[schema(example = "vision")]
    owner_project: Option<String>,
    /// `owner` (default with an owner), `by_usage` (split by the projects' used GPU-seconds
    /// on the pool's nodes in the month) or `pool` (default without an owner: kept on the
    /// pool's own line).
    #[schema(example = "by_usage")]
    share_idle: Option<String>,
    /// Idle minutes after which a node fires a `zombie_capacity` alert (default 120; null
    /// turns them off).
    #[schema(example = 120)]
    zombie_after_minutes: Option<i32>,
}

/// Create or change a pool (finance or admin).
#[utoipa::path(put, path = "/v1/pools/{id}", tag = "capacity", request_body = PutPool,
    params(("id" = String, Path, description = "Pool id: lowercase letters, digits, `.`, `_`, `-`")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "Changed", body = PoolView),
        (status = 201, description = "Created", body = PoolView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid id or field (an unknown owner project, `owner` without one)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_pool(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiJsonValue(body): ApiJsonValue,
) -> ApiResult<(StatusCode, axum::Json<PoolView>)> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let id = violations.check("path:id", capacity::pool_id(&id));
    let settings = match PoolSettings::parse(&body) {
        Ok(settings) => Some(settings),
        Err(errors) => {
            violations.extend(errors);
            None
        }
    };
    violations.into_result()?;
    let (Some(id), Some(settings)) = (id, settings) else {
        unreachable!("both parsed or were reported")
    };
    let (view, created) = ledger::put_pool(&state.pool, &id, &settings, &principal.actor).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, axum::Json(view)))
}

/// One pool.
#[utoipa::path(get, path = "/v1/pools/{id}", tag = "capacity",
    params(("id" = String, Path, description = "Pool id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The pool", body = PoolView),
        (status = 404, description = "No such pool", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_pool(
    State(state): State<AppState>,
    _principal: Principal,
    ApiPath(id): ApiPath<String>,
) -> ApiResult<axum::Json<PoolView>> {
    Ok(axum::Json(ledger::get_pool(&state.pool, &id).await?))
}

/// Every pool, by id.
#[utoipa::path(get, path = "/v1/pools", tag = "capacity",
    security(("bearer" = [])),
    responses(
        AuthProblems,
        (status = 200, description = "The pools", body = Vec<PoolView>),
    ))]
pub async fn list_pools(
    State(state): State<AppState>,
    _principal: Principal,
) -> ApiResult<axum::Json<Vec<PoolView>>> {
    Ok(axum::Json(ledger::list_pools(&state.pool).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct MonthQuery {
    /// `YYYY-MM` in the ledger time zone.
    #[param(example = "2026-11")]
    month: String,
}

/// A pool's month node by node: paid = used + idle + down, in GPU-hours and cost, and who
/// was charged its idle and down time (finance or admin, or a reader of its owner project).
#[utoipa::path(get, path = "/v1/pools/{id}/utilisation", tag = "capacity",
    params(("id" = String, Path, description = "Pool id"), MonthQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "The pool's month", body = PoolUtilisation),
        (status = 404, description = "No such pool (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn pool_utilisation(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<MonthQuery>,
) -> ApiResult<axum::Json<PoolUtilisation>> {
    let month = Month::parse(&query.month).map_err(|e| ApiError::invalid("query:month", e))?;
    let pool = ledger::get_pool(&state.pool, &id).await?;
    if !principal.is_finance_or_admin()
        && !pool
            .owner_project
            .as_deref()
            .is_some_and(|owner| principal.role == Role::Reader && principal.can_read(owner))
    {
        return Err(ApiError::NotFound(format!("no pool `{id}`")));
    }
    let view = ledger::pool_utilisation(&state.pool, &id, month, state.settings.timezone).await?;
    Ok(axum::Json(view))
}

/// One interval of a node, as `POST /v1/capacity` takes it.
#[derive(Debug, Deserialize, ToSchema)]
#[allow(dead_code)]
pub struct CapacityIntervalInput {
    /// The node's name as its cluster spells it (1-253 characters, no white space).
    #[schema(example = "gpu-node-07")]
    node: String,
    /// The pool it belongs to; create it first with `PUT /v1/pools/{id}`.
    #[schema(example = "h100-train")]
    pool: String,
    #[schema(example = "H100")]
    gpu_model: String,
    /// Whole cards (MIG-partitioned cards count as cards), 1 to 1024.
    #[schema(example = 8)]
    gpus: i32,
    /// `on_demand`, `spot` or `reserved`: how the node is paid, which picks its contract.
    #[schema(example = "on_demand")]
    billing_mode: String,
    provider: Option<String>,
    region: Option<String>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// RFC 3339; the interval is `[from, until)`.
    #[schema(example = "2026-11-02T00:00:00Z")]
    from: String,
    /// RFC 3339, later than `from`, at most 5 minutes ahead of now and 366 days after `from`.
    #[schema(example = "2026-11-02T06:00:00Z")]
    until: String,
    /// `up` (could run jobs) or `down` (drained, failed, in maintenance: paid, unusable).
    #[schema(example = "up")]
    state: String,
}

/// Whether `principal` may post capacity for pools of these owners: an admin may; an ingest
/// token may for pools owned by projects it is scoped to.
async fn may_post(
    state: &AppState,
    principal: &Principal,
    intervals: &[capacity::CapacityInterval],
) -> ApiResult<()> {
    if principal.is_admin() {
        return Ok(());
    }
    if principal.role != Role::Ingest {
        return Err(ApiError::Forbidden(
            "posting capacity needs an admin token, or an ingest token of the pool's owner"
                .to_owned(),
        ));
    }
    let owners = ledger::pool_owners(&state.pool, intervals).await?;
    for (pool, owner) in &owners {
        if !owner
            .as_deref()
            .is_some_and(|owner| principal.can_ingest(owner))
        {
            return Err(ApiError::Forbidden(format!(
                "this token may not post capacity for pool `{pool}`: it is not scoped to the \
                 pool's owner project"
            )));
        }
    }
    Ok(())
}

async fn store_capacity(
    state: &AppState,
    principal: &Principal,
    body: &serde_json::Value,
    replace: bool,
) -> ApiResult<CapacityReceipt> {
    let intervals = parse_intervals(body, state.settings.clock.now())?;
    may_post(state, principal, &intervals).await?;
    let nodes: Vec<String> = intervals.iter().map(|i| i.node.clone()).collect();
    let receipt = ledger::post_capacity(
        &state.pool,
        intervals,
        replace,
        state.settings.timezone,
        &principal.actor,
    )
    .await?;
    // New capacity may show a node idle for long enough: judge its nodes now.
    if let Err(error) = zombies::judge(&state.pool, Some(nodes), &state.settings).await {
        tracing::warn!(error = %error, "judging zombie capacity failed; the timer retries");
    }
    Ok(receipt)
}

/// Store capacity intervals, all or nothing (admin, or an ingest token of the pools' owner).
///
/// An interval is identified by `(node, from)`: sent again with the same content it is a
/// duplicate; with other content it is refused (409) — `PUT` replaces it. An interval that
/// overlaps another of its node, in the body or stored, is refused (422) with the other's
/// extent.
#[utoipa::path(post, path = "/v1/capacity", tag = "capacity",
    request_body(content = Vec<CapacityIntervalInput>, description = "1 to 10,000 intervals"),
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 200, description = "Stored", body = CapacityReceipt),
        (status = 403, description = "Not admin, nor an ingest token of every pool's owner", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "An interval is stored under its node and start with other content", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid or overlapping intervals, or an unknown pool", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn post_capacity(
    State(state): State<AppState>,
    principal: Principal,
    ApiJsonValue(body): ApiJsonValue,
) -> ApiResult<axum::Json<CapacityReceipt>> {
    Ok(axum::Json(
        store_capacity(&state, &principal, &body, false).await?,
    ))
}

/// Store capacity intervals, replacing those stored under the same `(node, from)`.
#[utoipa::path(put, path = "/v1/capacity", tag = "capacity",
    request_body(content = Vec<CapacityIntervalInput>, description = "1 to 10,000 intervals"),
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 200, description = "Stored", body = CapacityReceipt),
        (status = 403, description = "Not admin, nor an ingest token of every pool's owner", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid or overlapping intervals, or an unknown pool", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_capacity(
    State(state): State<AppState>,
    principal: Principal,
    ApiJsonValue(body): ApiJsonValue,
) -> ApiResult<axum::Json<CapacityReceipt>> {
    Ok(axum::Json(
        store_capacity(&state, &principal, &body, true).await?,
    ))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ZombieQuery {
    /// Only this pool's nodes.
    pool: Option<String>,
}

/// Nodes up right now with no job on them for longer than their pool's `zombie_after`
/// (finance or admin).
#[utoipa::path(get, path = "/v1/capacity/zombies", tag = "capacity",
    params(ZombieQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "Idle nodes, longest idle first", body = Vec<ZombieView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_zombies(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<ZombieQuery>,
) -> ApiResult<axum::Json<Vec<ZombieView>>> {
    require_finance(&principal)?;
    let pool = query
        .pool
        .map(|pool| capacity::pool_id(&pool).map_err(|e| ApiError::invalid("query:pool", e)))
        .transpose()?;
    Ok(axum::Json(
        zombies::now(&state.pool, pool.as_deref(), &state.settings).await?,
    ))
}
