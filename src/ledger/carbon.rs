//! Grid carbon intensity per region and month (COST_MODEL §10). Emissions are read with
//! every figure from measured energy and these intensities, so setting one writes its row and
//! nothing else.

use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::domain::values::Month;
use crate::ledger::{LedgerError, LedgerResult};
use crate::store;
pub use crate::store::grid_intensity::GridIntensityRow;

/// Sets the intensity of one month and region.
pub async fn put_grid_intensity(
    pool: &PgPool,
    (month, region): (Month, &str),
    g_co2e_per_kwh: Decimal,
) -> LedgerResult<GridIntensityRow> {
    let mut conn = pool.acquire().await?;
    Ok(store::grid_intensity::put(&mut conn, month.first_day(), region, g_co2e_per_kwh).await?)
}

/// Deletes the intensity of one month and region; emissions there read as not covered.
pub async fn delete_grid_intensity(
    pool: &PgPool,
    (month, region): (Month, &str),
) -> LedgerResult<()> {
    let mut conn = pool.acquire().await?;
    match store::grid_intensity::delete(&mut conn, month.first_day(), region).await? {
        true => Ok(()),
        false => Err(LedgerError::NotFound(format!(
            "no grid intensity for {month} in `{region}`"
        ))),
    }
}

/// Intensities in `(month, region)` order after `after`.
pub async fn grid_intensities(
    pool: &PgPool,
    after: Option<&(chrono::NaiveDate, String)>,
    limit: i64,
) -> LedgerResult<Vec<GridIntensityRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::grid_intensity::list(&mut conn, after, limit).await?)
}
