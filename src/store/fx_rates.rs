//! Exchange rates by ledger month.

use std::collections::HashMap;

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::domain::rating::FxRates;

#[derive(Debug, Clone)]
pub struct FxRateRow {
    pub month: NaiveDate,
    pub from_currency: String,
    pub to_currency: String,
    pub rate: Decimal,
    pub updated_at: DateTime<Utc>,
}

/// Stores a rate where the month and pair has none; `None` when it has one.
pub async fn insert_new(
    conn: &mut PgConnection,
    month: NaiveDate,
    from: &str,
    to: &str,
    rate: Decimal,
) -> sqlx::Result<Option<FxRateRow>> {
    sqlx::query_as!(
        FxRateRow,
        "INSERT INTO fx_rates (month, from_currency, to_currency, rate) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (month, from_currency, to_currency) DO NOTHING \
         RETURNING month, from_currency, to_currency, rate, updated_at",
        month,
        from,
        to,
        rate,
    )
    .fetch_optional(conn)
    .await
}

/// The rate of a month and pair, locked until the transaction ends.
pub async fn get_for_update(
    conn: &mut PgConnection,
    month: NaiveDate,
    from: &str,
    to: &str,
) -> sqlx::Result<Option<FxRateRow>> {
    sqlx::query_as!(
        FxRateRow,
        "SELECT month, from_currency, to_currency, rate, updated_at FROM fx_rates \
         WHERE month = $1 AND from_currency = $2 AND to_currency = $3 FOR UPDATE",
        month,
        from,
        to,
    )
    .fetch_optional(conn)
    .await
}

pub async fn put(
    conn: &mut PgConnection,
    month: NaiveDate,
    from: &str,
    to: &str,
    rate: Decimal,
) -> sqlx::Result<FxRateRow> {
    sqlx::query_as!(
        FxRateRow,
        "INSERT INTO fx_rates (month, from_currency, to_currency, rate, updated_at) \
         VALUES ($1, $2, $3, $4, now()) \
         ON CONFLICT (month, from_currency, to_currency) \
         DO UPDATE SET rate = EXCLUDED.rate, updated_at = EXCLUDED.updated_at \
         RETURNING month, from_currency, to_currency, rate, updated_at",
        month,
        from,
        to,
        rate,
    )
    .fetch_one(conn)
    .await
}

/// Whether a rate of this month and currency pair is stored.
pub async fn exists(
    conn: &mut PgConnection,
    month: NaiveDate,
    from: &str,
    to: &str,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM fx_rates \
                        WHERE month = $1 AND from_currency = $2 AND to_currency = $3) \
             AS \"exists!\"",
        month,
        from,
        to,
    )
    .fetch_one(conn)
    .await
}

/// Deletes one rate; the rate deleted, when there was one.
pub async fn delete(
    conn: &mut PgConnection,
    month: NaiveDate,
    from: &str,
    to: &str,
) -> sqlx::Result<Option<FxRateRow>> {
    sqlx::query_as!(
        FxRateRow,
        "DELETE FROM fx_rates WHERE month = $1 AND from_currency = $2 AND to_currency = $3 \
         RETURNING month, from_currency, to_currency, rate, updated_at",
        month,
        from,
        to,
    )
    .fetch_optional(conn)
    .await
}

/// Rates in `(month, from, to)` order after `after`.
pub async fn list(
    conn: &mut PgConnection,
    after: Option<&(NaiveDate, String, String)>,
    limit: i64,
) -> sqlx::Result<Vec<FxRateRow>> {
    sqlx::query_as!(
        FxRateRow,
        "SELECT month, from_currency, to_currency, rate, updated_at FROM fx_rates \
         WHERE $1::date IS NULL OR (month, from_currency, to_currency) > ($1, $2::text, $3::text) \
         ORDER BY month, from_currency, to_currency LIMIT $4",
        after.map(|a| a.0),
        after.map(|a| a.1.as_str()),
        after.map(|a| a.2.as_str()),
        limit,
    )
    .fetch_all(conn)
    .await
}

/// The rates of months `first..=last` into any of `to_currencies`, ready for rating.
pub async fn table(
    conn: &mut PgConnection,
    first: NaiveDate,
    last: NaiveDate,
    to_currencies: &[String],
) -> sqlx::Result<RateTable> {
    let rows = sqlx::query!(
        "SELECT month, from_currency, to_currency, rate FROM fx_rates \
         WHERE month BETWEEN $1 AND $2 AND to_currency = ANY($3)",
        first,
        last,
        to_currencies as &[String],
    )
    .fetch_all(conn)
    .await?;
    Ok(RateTable(
        rows.into_iter()
            .map(|row| ((row.month, row.from_currency, row.to_currency), row.rate))
            .collect(),
    ))
}

/// Rates loaded once for a batch.
#[derive(Debug, Default)]
pub struct RateTable(HashMap<(NaiveDate, String, String), Decimal>);

impl FxRates for RateTable {
    fn rate(&self, month: NaiveDate, from: &str, to: &str) -> Option<Decimal> {
        self.0
            .get(&(month, from.to_owned(), to.to_owned()))
            .copied()
    }
}
