//! Carbon intensity of the electricity grid per region and ledger month.

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

#[derive(Debug, Clone)]
pub struct GridIntensityRow {
    pub month: NaiveDate,
    pub region: String,
    pub g_co2e_per_kwh: Decimal,
    pub updated_at: DateTime<Utc>,
}

/// Stores the intensity of a month and region that has none; `None` when it has one.
pub async fn insert_new(
    conn: &mut PgConnection,
    month: NaiveDate,
    region: &str,
    g_co2e_per_kwh: Decimal,
) -> sqlx::Result<Option<GridIntensityRow>> {
    sqlx::query_as!(
        GridIntensityRow,
        "INSERT INTO grid_intensity (month, region, g_co2e_per_kwh) VALUES ($1, $2, $3) \
         ON CONFLICT (month, region) DO NOTHING \
         RETURNING month, region, g_co2e_per_kwh, updated_at",
        month,
        region,
        g_co2e_per_kwh,
    )
    .fetch_optional(conn)
    .await
}

/// The intensity of a month and region, locked until the transaction ends.
pub async fn get_for_update(
    conn: &mut PgConnection,
    month: NaiveDate,
    region: &str,
) -> sqlx::Result<Option<GridIntensityRow>> {
    sqlx::query_as!(
        GridIntensityRow,
        "SELECT month, region, g_co2e_per_kwh, updated_at FROM grid_intensity \
         WHERE month = $1 AND region = $2 FOR UPDATE",
        month,
        region,
    )
    .fetch_optional(conn)
    .await
}

/// Sets the intensity of one month and region.
pub async fn put(
    conn: &mut PgConnection,
    month: NaiveDate,
    region: &str,
    g_co2e_per_kwh: Decimal,
) -> sqlx::Result<GridIntensityRow> {
    sqlx::query_as!(
        GridIntensityRow,
        "INSERT INTO grid_intensity (month, region, g_co2e_per_kwh, updated_at) \
         VALUES ($1, $2, $3, now()) \
         ON CONFLICT (month, region) \
         DO UPDATE SET g_co2e_per_kwh = EXCLUDED.g_co2e_per_kwh, \
             updated_at = EXCLUDED.updated_at \
         RETURNING month, region, g_co2e_per_kwh, updated_at",
        month,
        region,
        g_co2e_per_kwh,
    )
    .fetch_one(conn)
    .await
}

/// Deletes the intensity of one month and region; the one deleted, when there was one.
pub async fn delete(
    conn: &mut PgConnection,
    month: NaiveDate,
    region: &str,
) -> sqlx::Result<Option<GridIntensityRow>> {
    sqlx::query_as!(
        GridIntensityRow,
        "DELETE FROM grid_intensity WHERE month = $1 AND region = $2 \
         RETURNING month, region, g_co2e_per_kwh, updated_at",
        month,
        region,
    )
    .fetch_optional(conn)
    .await
}

/// Intensities in `(month, region)` order after `after`.
pub async fn list(
    conn: &mut PgConnection,
    after: Option<&(NaiveDate, String)>,
    limit: i64,
) -> sqlx::Result<Vec<GridIntensityRow>> {
    sqlx::query_as!(
        GridIntensityRow,
        "SELECT month, region, g_co2e_per_kwh, updated_at FROM grid_intensity \
         WHERE $1::date IS NULL OR (month, region) > ($1, $2::text) \
         ORDER BY month, region LIMIT $3",
        after.map(|a| a.0),
        after.map(|a| a.1.as_str()),
        limit,
    )
    .fetch_all(conn)
    .await
}
