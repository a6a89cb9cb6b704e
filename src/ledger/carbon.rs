//! Grid carbon intensity per region and month (COST_MODEL §10). Emissions are read with
//! every figure from measured energy and these intensities, so setting one writes its row and
//! nothing else.

use rust_decimal::Decimal;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::values::Month;
use crate::ledger::{LedgerError, LedgerResult, audit};
use crate::store;
pub use crate::store::grid_intensity::GridIntensityRow;

/// Sets the intensity of one month and region.
pub async fn put_grid_intensity(
    pool: &PgPool,
    (month, region): (Month, &str),
    g_co2e_per_kwh: Decimal,
    actor: &Actor,
) -> LedgerResult<GridIntensityRow> {
    let mut tx = pool.begin().await?;
    let day = month.first_day();
    // A new intensity is inserted alone; an existing one is locked first, so `before` is the
    // one this change replaces.
    let (before, row) =
        match store::grid_intensity::insert_new(&mut tx, day, region, g_co2e_per_kwh).await? {
            Some(row) => (None, row),
            None => {
                let before = store::grid_intensity::get_for_update(&mut tx, day, region).await?;
                let row = store::grid_intensity::put(&mut tx, day, region, g_co2e_per_kwh).await?;
                (before, row)
            }
        };
    let change = Change::new(
        "grid_intensity",
        format!("{month}/{region}"),
        if before.is_some() { "update" } else { "create" },
        before.as_ref().map(snapshot),
        Some(snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(row)
}

/// Deletes the intensity of one month and region; emissions there read as not covered.
pub async fn delete_grid_intensity(
    pool: &PgPool,
    (month, region): (Month, &str),
    actor: &Actor,
) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    let Some(before) = store::grid_intensity::delete(&mut tx, month.first_day(), region).await?
    else {
        return Err(LedgerError::NotFound(format!(
            "no grid intensity for {month} in `{region}`"
        )));
    };
    let change = Change::new(
        "grid_intensity",
        format!("{month}/{region}"),
        "delete",
        Some(snapshot(&before)),
        None,
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(())
}

fn snapshot(row: &GridIntensityRow) -> Value {
    json!({
        "month": Month::from_first_day(row.month).to_string(),
        "region": row.region,
        "g_co2e_per_kwh": row.g_co2e_per_kwh.normalize(),
        "updated_at": row.updated_at,
    })
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
