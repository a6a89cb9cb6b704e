//! Cloud bills (FOCUS) and their reconciliation with capacity (finance).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request, State};
use axum::http::StatusCode;
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::capacity;
use crate::domain::validation::Violations;
use crate::domain::values::Month;
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiPath, ApiQuery, body_rejection, content_type_essence};
use crate::http::problems::{AuthProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::bills::{self, BillReceipt, Reconciliation};
use crate::ledger::zombies;
use crate::sources::focus::{bill_text, parse_bill};

/// A CSV body (`text/csv`, or gzip-compressed as `application/gzip`), as posted.
pub struct CsvBody(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for CsvBody {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let content_type = content_type_essence(req.headers());
        if !matches!(
            content_type.as_str(),
            "text/csv" | "application/gzip" | "application/x-gzip"
        ) {
            return Err(ApiError::UnsupportedMediaType(
                "send the FOCUS CSV as text/csv (gzip-compressed as application/gzip)".to_owned(),
            ));
        }
        let body = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        Ok(CsvBody(body))
    }
}

/// The most a posted bill may inflate to when gzip-compressed.
pub const MAX_INFLATED_BILL_BYTES: u64 = 256 * 1024 * 1024;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(post_bill))
        .routes(routes!(get_reconciliation))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct BillQuery {
    /// The pool the GPU instances the bill shows and nobody reported go to (default
    /// `billed-<provider>`, created when missing).
    pub pool: Option<String>,
}

/// Post a cloud bill (finance or admin): a FOCUS 1.0–1.2 CSV, as exported, optionally
/// gzip-compressed.
///
/// The bill is stored by statement (one provider's billing account in one billing period):
/// posted again with the same rows it is a duplicate; with other rows it replaces what was
/// stored and says what moved. Rows whose resource is a known node price that node's time
/// (billed wins over contracts); GPU instance rows of unknown resources become capacity.
#[utoipa::path(post, path = "/v1/bills", tag = "capacity",
    params(BillQuery),
    request_body(content = String, content_type = "text/csv", description = "A FOCUS CSV (gzip accepted)"),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 400, description = "The body could not be read", body = Problem, content_type = "application/problem+json"),
        (status = 200, description = "Every statement was stored before with the same rows", body = BillReceipt),
        (status = 201, description = "Stored", body = BillReceipt),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 413, description = "The body, or what it inflates to, is too large", body = Problem, content_type = "application/problem+json"),
        (status = 415, description = "Not text/csv", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "A missing column or a bad cell, named by row and column", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn post_bill(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(query): ApiQuery<BillQuery>,
    CsvBody(body): CsvBody,
) -> ApiResult<(StatusCode, axum::Json<BillReceipt>)> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let pool = query
        .pool
        .as_deref()
        .and_then(|raw| violations.check("query:pool", capacity::pool_id(raw)));
    violations.into_result()?;
    let text = bill_text(&body, MAX_INFLATED_BILL_BYTES).map_err(|message| {
        if message.contains("inflates") {
            ApiError::PayloadTooLarge(message)
        } else {
            let mut v = Violations::default();
            v.push("/", message);
            ApiError::from(v)
        }
    })?;
    let bill = parse_bill(&text)?;
    let (receipt, nodes) = bills::post_bill(
        &state.pool,
        bill,
        pool.as_deref(),
        state.settings.timezone,
        &principal.actor,
    )
    .await?;
    if !nodes.is_empty()
        && let Err(error) = zombies::judge(&state.pool, Some(nodes), &state.settings).await
    {
        tracing::warn!(error = %error, "judging zombie capacity failed; the timer retries");
    }
    let status = if receipt.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, axum::Json(receipt)))
}

/// A month's bills reconciled with capacity (finance or admin).
///
/// Per provider and currency: the billed total = the billed cost that priced nodes' time
/// (split into used, idle and down by the nodes' GPU-seconds) + the rows that priced no
/// node, by service and SKU, exactly; and the price variance between the jobs' contracts
/// and their used share of the billed cost. The month is the bills' billing period.
#[utoipa::path(get, path = "/v1/reports/monthly/{month}/reconciliation", tag = "reports",
    params(("month" = String, Path, description = "YYYY-MM: the billing period")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "The reconciliation", body = Reconciliation),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_reconciliation(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(month): ApiPath<String>,
) -> ApiResult<axum::Json<Reconciliation>> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let month = violations.check("path:month", Month::parse(&month));
    violations.into_result()?;
    let month = month.expect("parsed or reported");
    Ok(axum::Json(
        bills::reconciliation(&state.pool, month, state.settings.timezone).await?,
    ))
}
