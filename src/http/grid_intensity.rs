//! Carbon intensity of the grid per region and ledger month (finance or admin), from which
//! emissions are read.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::Principal;
use crate::domain::contract::SCOPE_CHARS;
use crate::domain::validation::Violations;
use crate::domain::values::{self, Month};
use crate::http::auth::require_finance;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::carbon::{self, GridIntensityRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_grid_intensity))
        .routes(routes!(put_grid_intensity, delete_grid_intensity))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct GridIntensityView {
    /// `YYYY-MM` in the ledger time zone.
    #[schema(value_type = String, example = "2026-11")]
    pub month: Month,
    /// As records and contracts name it (`us-east-1`, `eu-west-3`, `dc-frankfurt`).
    pub region: String,
    /// Grams of CO2-equivalent per kWh drawn from the grid there that month.
    #[schema(value_type = String, example = "380")]
    pub g_co2e_per_kwh: Decimal,
    pub updated_at: DateTime<Utc>,
}

impl From<GridIntensityRow> for GridIntensityView {
    fn from(row: GridIntensityRow) -> Self {
        Self {
            month: Month::from_first_day(row.month),
            region: row.region,
            g_co2e_per_kwh: row.g_co2e_per_kwh.normalize(),
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutGridIntensity {
    /// gCO2e per kWh (decimal string or number, ≥ 0, at most 2000).
    #[schema(value_type = String, example = "380")]
    pub g_co2e_per_kwh: Decimal,
}

/// The most carbon-intensive electricity measured (lignite) is about 1,100 g per kWh; well
/// above it a value is a unit mistake (kg or lb for g).
const MAX_G_CO2E_PER_KWH: i64 = 2000;

fn intensity_key(violations: &mut Violations, (month, region): &(String, String)) -> Option<Month> {
    let month = violations.check("path:month", Month::parse(month));
    violations.check("path:region", values::bounded_text(region, SCOPE_CHARS));
    month
}

/// Set the grid intensity of one month and region (finance or admin).
#[utoipa::path(put, path = "/v1/grid-intensity/{month}/{region}", tag = "contracts",
    request_body = PutGridIntensity,
    params(
        ("month" = String, Path, description = "YYYY-MM in the ledger time zone"),
        ("region" = String, Path, description = "The region, as records name it"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems, JsonBodyProblems,
        (status = 200, description = "The intensity; emissions read with it from now on", body = GridIntensityView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid month, region or intensity", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn put_grid_intensity(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(path): ApiPath<(String, String)>,
    ApiJson(body): ApiJson<PutGridIntensity>,
) -> ApiResult<axum::Json<GridIntensityView>> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let month = intensity_key(&mut violations, &path);
    let intensity = body.g_co2e_per_kwh;
    if intensity < Decimal::ZERO || intensity > Decimal::from(MAX_G_CO2E_PER_KWH) {
        violations.push(
            "/g_co2e_per_kwh",
            format!("must be 0 to {MAX_G_CO2E_PER_KWH} g per kWh, got {intensity}"),
        );
    }
    violations.into_result()?;
    let Some(month) = month else {
        unreachable!("the month parsed or was reported")
    };
    let row = carbon::put_grid_intensity(
        &state.pool,
        (month, &path.1),
        intensity.normalize(),
        &principal.actor,
    )
    .await?;
    Ok(axum::Json(row.into()))
}

/// Delete the grid intensity of one month and region (finance or admin).
#[utoipa::path(delete, path = "/v1/grid-intensity/{month}/{region}", tag = "contracts",
    params(
        ("month" = String, Path, description = "YYYY-MM in the ledger time zone"),
        ("region" = String, Path, description = "The region"),
    ),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Deleted; emissions there read as not covered"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such intensity", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_grid_intensity(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(path): ApiPath<(String, String)>,
) -> ApiResult<StatusCode> {
    require_finance(&principal)?;
    let mut violations = Violations::default();
    let Some(month) = intensity_key(&mut violations, &path).filter(|_| violations.is_empty())
    else {
        return Err(ApiError::NotFound(format!(
            "no grid intensity {}/{}",
            path.0, path.1
        )));
    };
    carbon::delete_grid_intensity(&state.pool, (month, &path.1), &principal.actor).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every grid intensity (finance or admin), by month then region.
#[utoipa::path(get, path = "/v1/grid-intensity", tag = "contracts", params(PageParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of intensities", body = Page<GridIntensityView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_grid_intensity(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<GridIntensityView>>> {
    require_finance(&principal)?;
    let limit = page.limit()?;
    let after: Option<(NaiveDate, String)> = page.cursor()?;
    let rows = carbon::grid_intensities(&state.pool, after.as_ref(), limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| (row.month, row.region.clone()),
        GridIntensityView::from,
    )))
}
