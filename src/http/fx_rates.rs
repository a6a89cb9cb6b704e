//! Exchange rates per ledger month (finance or admin). Setting or deleting one re-rates
//! the segments of that month priced in `from` for projects kept in `to`.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::validation::Violations;
use crate::domain::values::{self, Currency, Month};
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::pricing::{self, FxRateRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_fx_rates))
        .routes(routes!(put_fx_rate, delete_fx_rate))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct FxRateView {
    /// `YYYY-MM` in the ledger time zone.
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    pub from: String,
    pub to: String,
    /// An amount in `from` times this is the amount in `to`.
    pub rate: Decimal,
    pub updated_at: DateTime<Utc>,
}

impl From<FxRateRow> for FxRateView {
    fn from(row: FxRateRow) -> Self {
        Self {
            month: Month::from_first_day(row.month),
            from: row.from_currency,
            to: row.to_currency,
            rate: row.rate.normalize(),
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutFxRate {
    /// Units of `to` per unit of `from` (decimal string or number, > 0), exact.
    #[schema(value_type = String, example = "7.1")]
    pub rate: Decimal,
}

/// The month and currency pair of a path, each checked.
fn rate_key(
    violations: &mut Violations,
    (month, from, to): &(String, String, String),
) -> Option<(Month, Currency, Currency)> {
    let month = violations.check("path:month", Month::parse(month));
    let from = violations.check("path:from", Currency::parse(from));
    let to = violations.check("path:to", Currency::parse(to));
    if let (Some(from), Some(to)) = (from, to)
        && from == to
    {
        violations.push("path:to", "must differ from `from`");
    }
    Some((month?, from?, to?))
}

/// Set the rate of one month and currency pair (finance or admin); re-rates what it converts.
#[utoipa::path(put, path = "/v1/fx-rates/{month}/{from}/{to}", tag = "contracts", request_body = PutFxRate,
    params(
        ("month" = String, Path, description = "YYYY-MM in the ledger time zone"),
        ("from" = String, Path, description = "ISO 4217 code of the contract's price"),
        ("to" = String, Path, description = "ISO 4217 code of the project's currency"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The rate; segments it converts are re-rated", body = FxRateView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month, currency or rate", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_fx_rate(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(path): ApiPath<(String, String, String)>,
    ApiJson(body): ApiJson<PutFxRate>,
) -> ApiResult<axum::Json<FxRateView>> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let key = rate_key(&mut violations, &path);
    let rate = violations.check("/rate", values::positive(body.rate));
    violations.into_result()?;
    let (Some(key), Some(rate)) = (key, rate) else {
        unreachable!("both parsed or were reported")
    };
    let row =
        pricing::put_fx_rate(&state.pool, key, rate, &principal.actor, &state.settings).await?;
    Ok(axum::Json(row.into()))
}

/// Delete the rate of one month and currency pair (finance or admin); what it converted
/// becomes unrated (`no_fx_rate`).
#[utoipa::path(delete, path = "/v1/fx-rates/{month}/{from}/{to}", tag = "contracts",
    params(
        ("month" = String, Path, description = "YYYY-MM in the ledger time zone"),
        ("from" = String, Path, description = "ISO 4217 code"),
        ("to" = String, Path, description = "ISO 4217 code"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Deleted; segments it converted are re-rated"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such rate", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_fx_rate(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(path): ApiPath<(String, String, String)>,
) -> ApiResult<StatusCode> {
    require_finance(&principal)?;
    let not_found = || ApiError::NotFound(format!("no FX rate {}/{}/{}", path.0, path.1, path.2));
    let mut violations = Violations::default();
    let Some(key) = rate_key(&mut violations, &path).filter(|_| violations.is_empty()) else {
        return Err(not_found());
    };
    pricing::delete_fx_rate(&state.pool, key, &principal.actor, &state.settings).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every FX rate (finance or admin), by month then currency pair.
#[utoipa::path(get, path = "/v1/fx-rates", tag = "contracts", params(PageParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of rates", body = Page<FxRateView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_fx_rates(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<FxRateView>>> {
    require_finance(&principal)?;
    let limit = page.limit()?;
    let after: Option<(NaiveDate, String, String)> = page.cursor()?;
    let rows = pricing::fx_rates(&state.pool, after.as_ref(), limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| {
            (
                row.month,
                row.from_currency.clone(),
                row.to_currency.clone(),
            )
        },
        FxRateView::from,
    )))
}
