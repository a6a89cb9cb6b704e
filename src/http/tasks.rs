//! The per-task ledger: a project's tasks over a period, and one task attempt by attempt.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::period::parse_period;
use crate::domain::rating::Outcome;
use crate::domain::task::{SortOrder, TaskFilter, TaskKeyset, TaskSort};
use crate::domain::validation::Violations;
use crate::domain::what_if::{PriceOverride, WhatIf};
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery, wants_csv};
use crate::http::pagination::{PageParams, encode_cursor};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::projects::readable_project;
use crate::http::state::AppState;
use crate::ledger::cost::CostOf;
use crate::ledger::tasks::{self, TaskDetailView, TaskListQuery, TaskView};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_tasks))
        .routes(routes!(get_task))
}

/// The query parameters of a task list, but the `label.<key>` filters.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct TaskListParams {
    /// `YYYY-MM` of the ledger time zone; instead of `from` and `to`.
    pub month: Option<String>,
    /// Start (inclusive): a date `YYYY-MM-DD` or an RFC 3339 time that starts a ledger hour.
    pub from: Option<String>,
    /// End (exclusive), in the same forms as `from`.
    pub to: Option<String>,
    /// Only tasks with this status: `completed`, `failed`, `cancelled` or `preempted`.
    pub status: Option<String>,
    /// Only tasks with an attempt on this GPU model.
    pub gpu_model: Option<String>,
    /// `cost` (default: the period's total), `waste` (idle + failed), `gpu_hours` (GPU time
    /// held), `queue_wait` or `started_at` (the task's first start).
    pub sort: Option<String>,
    /// `desc` (default) or `asc`. Ties are broken by task id, ascending in a descending
    /// list, so an ascending list is the descending one reversed.
    pub order: Option<String>,
    /// Tasks per page, 1 to 1000 (default 100).
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page, with the same period, filters and sort.
    pub cursor: Option<String>,
    /// `json` (default) or `csv`; `Accept: text/csv` also selects CSV.
    pub format: Option<String>,
    /// A what-if price, repeatable, as for the project's cost: the list is then priced,
    /// sorted and paged at those prices, and says it is hypothetical.
    #[serde(default, skip_deserializing)]
    pub what_if: Vec<String>,
}

/// A page of a task list; with `what_if`, a hypothetical one.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskListView {
    pub items: Vec<TaskView>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// Present and true when asked with `what_if` prices; nothing was stored.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub hypothetical: bool,
    /// The prices the list was read with in place of those in force.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub overrides: Vec<PriceOverride>,
}

/// What a task list's cursor carries: where the previous page ended, and the list it
/// belongs to, so that it is never applied to another.
#[derive(Debug, Serialize, Deserialize)]
struct TaskCursor {
    sort: TaskSort,
    order: SortOrder,
    /// A digest of the period and filters.
    list: String,
    after: TaskKeyset,
}

/// Splits the `label.<key>` filters and the `what_if` prices from the other parameters.
fn label_filters(
    pairs: Vec<(String, String)>,
    violations: &mut Violations,
) -> (BTreeMap<String, String>, WhatIf, Vec<(String, String)>) {
    let mut labels = BTreeMap::new();
    let mut what_if = WhatIf::default();
    let mut others = Vec::new();
    for (name, value) in pairs {
        if name == "what_if" {
            if let Err(message) = what_if.add(&value) {
                violations.push("query:what_if", message);
            }
            continue;
        }
        match name.strip_prefix("label.") {
            Some("") => violations.push("query:label.", "name a label: label.<key>=<value>"),
            Some(key) => {
                if labels.insert(key.to_owned(), value).is_some() {
                    violations.push(format!("query:{name}"), "give each label once");
                }
            }
            None => {
                if others.iter().any(|(other, _)| *other == name) {
                    violations.push(format!("query:{name}"), "give this parameter once");
                }
                others.push((name, value));
            }
        }
    }
    (labels, what_if, others)
}

/// The parsed list query and whether CSV was asked for.
fn parse_list(
    pairs: Vec<(String, String)>,
    headers: &HeaderMap,
    tz: chrono_tz::Tz,
) -> ApiResult<(TaskListQuery, bool)> {
    let mut violations = Violations::default();
    let (labels, what_if, others) = label_filters(pairs, &mut violations);
    violations.into_result()?;
    let mut violations = Violations::default();
    let encoded = serde_urlencoded::to_string(&others).map_err(anyhow::Error::from)?;
    let deserializer =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(encoded.as_bytes()));
    let params: TaskListParams =
        serde_path_to_error::deserialize(deserializer).map_err(|error| {
            let name = error.path().to_string();
            ApiError::invalid(format!("query:{name}"), error.into_inner().to_string())
        })?;
    let period = parse_period(
        (
            params.month.as_deref(),
            params.from.as_deref(),
            params.to.as_deref(),
        ),
        tz,
        &mut violations,
    );
    let status = params.status.as_deref().and_then(|raw| {
        let status = Outcome::parse(raw).ok_or_else(|| {
            format!("`{raw}` is not a status: use completed, failed, cancelled or preempted")
        });
        violations.check("query:status", status)
    });
    let sort = match &params.sort {
        Some(raw) => violations.check("query:sort", TaskSort::parse(raw)),
        None => Some(TaskSort::Cost),
    };
    let order = match &params.order {
        Some(raw) => violations.check("query:order", SortOrder::parse(raw)),
        None => Some(SortOrder::Desc),
    };
    let csv = violations
        .check("query:format", wants_csv(params.format.as_deref(), headers))
        .unwrap_or(false);
    violations.into_result()?;
    let (Some(period), Some(sort), Some(order)) = (period, sort, order) else {
        unreachable!("every parameter parsed or was reported")
    };
    let filter = TaskFilter {
        status,
        gpu_model: params.gpu_model.clone(),
        labels,
    };
    let list = list_digest(period, &filter, &what_if);
    let page = PageParams {
        limit: params.limit,
        cursor: params.cursor.clone(),
    };
    let limit = page.limit()?;
    let after = match page.cursor::<TaskCursor>()? {
        None => None,
        Some(cursor) if (cursor.sort, cursor.order) != (sort, order) => {
            return Err(ApiError::invalid(
                "query:cursor",
                format!(
                    "this cursor continues a list sorted by {} {}, not by {} {}",
                    cursor.sort.as_str(),
                    cursor.order.as_str(),
                    sort.as_str(),
                    order.as_str()
                ),
            ));
        }
        Some(cursor) if cursor.list != list => {
            return Err(ApiError::invalid(
                "query:cursor",
                "this cursor continues a list of another period or other filters",
            ));
        }
        Some(cursor) if !cursor.after.value_is_a_number() => {
            return Err(ApiError::invalid(
                "query:cursor",
                "not a cursor this list returned: its position is not a number",
            ));
        }
        Some(cursor) => Some(cursor.after),
    };
    Ok((
        TaskListQuery {
            period,
            filter,
            sort,
            order,
            after,
            limit,
            what_if,
        },
        csv,
    ))
}

/// A short digest naming a list's period and filters.
fn list_digest(
    (from, to): (chrono::DateTime<chrono::Utc>, chrono::DateTime<chrono::Utc>),
    filter: &TaskFilter,
    what_if: &WhatIf,
) -> String {
    let named = serde_json::json!([
        from,
        to,
        filter.status.map(|s| s.as_str()),
        filter.gpu_model,
        filter.labels,
        what_if.overrides(),
    ]);
    let digest = Sha256::digest(named.to_string().as_bytes());
    hex::encode(&digest[..8])
}

/// A project's tasks over a period, with each task's figures in it (COST_MODEL §7).
///
/// Lists the tasks with GPU time or an ended attempt in `[from, to)`, with their figures
/// inside the period (a task spanning its edge counts with the part inside), their status,
/// and, for completed tasks, their final cost: the lifetime total, failed attempts
/// included. The tasks of a period add up to the project's total less its unused
/// commitment, which belongs to no task. Filters combine: `status`, `gpu_model`, and any
/// number of `label.<key>=<value>` (a task matches when one of its attempts carries every
/// given label). Pages follow `next_cursor`; a cursor continues only the list it came from
/// (same period, filters and sort), so paging never repeats or skips a task, though figures
/// that change between pages are not re-read. With `Accept: text/csv` (or `format=csv`) the
/// same page is CSV: money rounded half-even to the currency's minor unit, cost per unit to
/// 10 places, text cells safe in a spreadsheet, and the next page's cursor in the
/// `X-Next-Cursor` header.
#[utoipa::path(get, path = "/v1/projects/{id}/tasks", tag = "tasks",
    params(
        ("id" = String, Path, description = "Project id"),
        TaskListParams,
        ("label.<key>" = Option<String>, Query, description = "Only tasks with an attempt labelled `<key>` = this value, e.g. `label.team=vision`; repeat with other keys to require each"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, QueryProblems,
        (status = 200, description = "A page of tasks", content(
            (TaskListView = "application/json"),
            (String = "text/csv"),
        ), headers(("X-Next-Cursor" = String, description = "CSV only: the cursor of the next page, absent on the last"))),
        (status = 404, description = "No such project (or not visible to this token)", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid query parameters, named as `query:<name>` (a cursor of another list is `query:cursor`)", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_tasks(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<String>,
    ApiQuery(pairs): ApiQuery<Vec<(String, String)>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let project = readable_project(&state, &principal, &id).await?;
    let tz = state.settings.timezone;
    let (query, csv) = parse_list(pairs, &headers, tz)?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let page = tasks::list_tasks(&state.pool, of, &query, tz).await?;
    let next_cursor = page.next.map(|after| {
        encode_cursor(&TaskCursor {
            sort: query.sort,
            order: query.order,
            list: list_digest(query.period, &query.filter, &query.what_if),
            after,
        })
    });
    if csv {
        let body = tasks::tasks_csv(&page.items)?;
        let mut response = body.into_response();
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/csv; charset=utf-8"),
        );
        headers.insert(
            header::CONTENT_DISPOSITION,
            HeaderValue::from_str(&format!(
                "attachment; filename=\"taskledger-{}-tasks.csv\"",
                project
                    .id
                    .replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
            ))
            .map_err(anyhow::Error::from)?,
        );
        if let Some(cursor) = next_cursor {
            headers.insert(
                "x-next-cursor",
                HeaderValue::from_str(&cursor).map_err(anyhow::Error::from)?,
            );
        }
        return Ok(response);
    }
    Ok(axum::Json(TaskListView {
        items: page.items,
        next_cursor,
        hypothetical: !query.what_if.is_empty(),
        overrides: query.what_if.overrides(),
    })
    .into_response())
}

/// One task over its lifetime: its figures over all time, its final cost, its figures per
/// ledger month, and every attempt with its own figures, the contracts that priced it, the
/// GPU-seconds left unrated and why, and its queue wait.
#[utoipa::path(get, path = "/v1/projects/{id}/tasks/{task_id}", tag = "tasks",
    params(
        ("id" = String, Path, description = "Project id"),
        ("task_id" = String, Path, description = "Task id"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The task", body = TaskDetailView),
        (status = 404, description = "No such project (or not visible to this token), or no such task in it", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_task(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath((id, task_id)): ApiPath<(String, String)>,
) -> ApiResult<axum::Json<TaskDetailView>> {
    let project = readable_project(&state, &principal, &id).await?;
    let of = CostOf {
        project: &project.id,
        currency: &project.currency,
    };
    let view = tasks::task_detail(&state.pool, of, &task_id, state.settings.timezone).await?;
    Ok(axum::Json(view))
}
