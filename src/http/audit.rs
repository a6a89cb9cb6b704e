//! The audit log (admin and finance): every change with who made it, before and after, in a
//! hash chain; its verification; and its CSV export.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::{Actor, Principal};
use crate::domain::validation::Violations;
use crate::domain::values::parse_instant;
use crate::exports;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiQuery, wants_csv};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::audit::{self, Entry, Filter};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_audit))
        .routes(routes!(verify_audit))
}

/// One entry of the audit log.
#[derive(Debug, Serialize, ToSchema)]
pub struct AuditEntryView {
    /// 1, 2, 3, … without gaps.
    pub seq: i64,
    /// When the change was made, to the microsecond.
    pub at: DateTime<Utc>,
    pub actor: Actor,
    /// `create`, `update`, `delete`, `revoke`, `replace`, `close`, `correct` or `import`.
    pub action: String,
    /// `project`, `budget`, `contract`, `fx_rate`, `grid_intensity`, `token`, `channel`,
    /// `pool`, `capacity_interval`, `bill`, `month_close`, `job_record`, `route` or
    /// `efficiency_regression_rule`.
    pub entity: String,
    pub entity_id: String,
    /// The entity as the API showed it before the change; null when it was created. Secrets
    /// are left out or masked.
    #[schema(value_type = Option<Object>)]
    pub before: Option<Value>,
    /// The entity after the change; null when it was deleted.
    #[schema(value_type = Option<Object>)]
    pub after: Option<Value>,
    /// SHA-256 (hex) of `prev_hash` followed by the canonical JSON of `{seq, at, actor,
    /// action, entity, entity_id, before, after}`.
    pub hash: String,
    /// The hash of the entry before (64 zeros before the first).
    pub prev_hash: String,
}

impl From<Entry> for AuditEntryView {
    fn from(entry: Entry) -> Self {
        Self {
            seq: entry.seq,
            at: entry.at,
            actor: entry.actor,
            action: entry.action,
            entity: entry.entity,
            entity_id: entry.entity_id,
            before: entry.before,
            after: entry.after,
            hash: hex::encode(entry.hash),
            prev_hash: hex::encode(entry.prev_hash),
        }
    }
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Changes made at or after this instant (RFC 3339).
    pub from: Option<String>,
    /// Changes made before this instant (RFC 3339).
    pub to: Option<String>,
    /// The actor's id: a token's id, a signed-in user's subject, or the part of the service
    /// that acted (`bootstrap`, `cli`, `demo`, `collector`).
    pub actor: Option<String>,
    /// The kind of entity changed, e.g. `contract`.
    pub entity: Option<String>,
    /// The id of the entity changed, as entries name it (a contract's id, `2026-11/USD/EUR`).
    pub entity_id: Option<String>,
    /// What was done, e.g. `update`.
    pub action: Option<String>,
    /// Items per page, 1 to 1000 (default 100); not with CSV.
    pub limit: Option<i64>,
    /// The `next_cursor` of the previous page; not with CSV.
    pub cursor: Option<String>,
    /// `json` (default) or `csv`: every entry the filters match, oldest first;
    /// `Accept: text/csv` also selects CSV.
    pub format: Option<String>,
}

/// A filter value: trimmed, not empty, at most 200 characters.
fn filter_text(violations: &mut Violations, name: &str, raw: &Option<String>) -> Option<String> {
    let raw = raw.as_deref()?;
    let pointer = format!("query:{name}");
    if raw.is_empty() || raw.len() > 200 || raw.contains('\0') {
        violations.push(pointer, "must be 1 to 200 characters, without NUL");
        return None;
    }
    Some(raw.to_owned())
}

impl AuditQuery {
    fn filter(&self) -> ApiResult<Filter> {
        let mut violations = Violations::default();
        let mut instant = |name: &str, raw: &Option<String>| {
            raw.as_deref()
                .and_then(|raw| violations.check(&format!("query:{name}"), parse_instant(raw)))
        };
        let from = instant("from", &self.from);
        let to = instant("to", &self.to);
        if let (Some(from), Some(to)) = (from, to)
            && to <= from
        {
            violations.push("query:to", "must be after `from`");
        }
        let filter = Filter {
            from,
            to,
            actor: filter_text(&mut violations, "actor", &self.actor),
            entity: filter_text(&mut violations, "entity", &self.entity),
            entity_id: filter_text(&mut violations, "entity_id", &self.entity_id),
            action: filter_text(&mut violations, "action", &self.action),
        };
        violations.into_result()?;
        Ok(filter)
    }

    fn wants_csv(&self, headers: &HeaderMap) -> ApiResult<bool> {
        wants_csv(self.format.as_deref(), headers)
            .map_err(|message| ApiError::invalid("query:format", message))
    }
}

/// The audit log (finance or admin): every change made through the service, oldest first.
///
/// As CSV (`format=csv` or `Accept: text/csv`) it holds every entry the filters match, with
/// the fields an auditor needs to re-hash each entry and check the chain: `before` and
/// `after` as their canonical JSON, text cells that a spreadsheet opens as text (a cell that
/// starts with `'` has had one `'` put in front of it).
#[utoipa::path(get, path = "/v1/audit", tag = "audit", params(AuditQuery),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of entries in seq order, or every matching entry as CSV", content(
            (Page<AuditEntryView> = "application/json"),
            (String = "text/csv"),
        )),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid filter, limit, cursor or format", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_audit(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<AuditQuery>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    require_finance(&principal)?;
    let filter = query.filter()?;
    if query.wants_csv(&headers)? {
        for (name, given) in [
            ("limit", query.limit.is_some()),
            ("cursor", query.cursor.is_some()),
        ] {
            if given {
                return Err(ApiError::invalid(
                    format!("query:{name}"),
                    "the CSV holds every entry the filters match: leave it out",
                ));
            }
        }
        return Ok(csv_response(&state, filter));
    }
    let page = PageParams {
        limit: query.limit,
        cursor: query.cursor.clone(),
    };
    let limit = page.limit()?;
    let after: i64 = page.cursor()?.unwrap_or(0);
    let entries = audit::list(&state.pool, &filter, after, limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        entries,
        limit,
        |entry| entry.seq,
        AuditEntryView::from,
    ))
    .into_response())
}

/// Streams the CSV a page of entries at a time, so an export of any length is held in memory
/// a page at a time. A database error after the first page ends the body early, which the
/// client sees as a broken transfer, never as a complete file.
fn csv_response(state: &AppState, filter: Filter) -> Response {
    let pages = audit::export(state.pool.clone(), filter, 0).map(|page| {
        page.map(|entries| exports::audit::rows(&entries))
            .map_err(|error| {
                tracing::error!(error = %error, "exporting the audit log failed");
                std::io::Error::other("the audit log export failed")
            })
    });
    let body = futures::stream::once(async { Ok(exports::audit::header()) }).chain(pages);
    let mut response = Body::from_stream(body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/csv; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"taskledger-audit.csv\""),
    );
    response
}

/// The outcome of checking the audit log's chain.
#[derive(Debug, Serialize, ToSchema)]
pub struct VerificationView {
    /// How many entries were checked.
    pub entries: u64,
    /// Whether every entry's hash is that of its fields and its predecessor's hash, without
    /// a missing seq.
    pub valid: bool,
    /// The first seq where the chain does not hold: an entry changed after it was written,
    /// one whose `prev_hash` is not the hash before it, or a missing one; null when valid.
    pub first_broken_seq: Option<i64>,
}

/// Check the whole audit log's hash chain (finance or admin).
#[utoipa::path(get, path = "/v1/audit/verify", tag = "audit",
    security(("bearer" = [])),
    responses(
        AuthProblems,
        (status = 200, description = "What the check found", body = VerificationView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn verify_audit(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<VerificationView>> {
    require_finance(&principal)?;
    let verification = audit::verify(&state.pool).await?;
    Ok(axum::Json(VerificationView {
        entries: verification.entries,
        valid: verification.valid(),
        first_broken_seq: verification.first_broken_seq,
    }))
}
