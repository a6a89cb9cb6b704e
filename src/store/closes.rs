//! Closed months and their frozen reports.

use chrono::{DateTime, NaiveDate, Utc};
use sqlx::PgConnection;
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct CloseRow {
    pub month: NaiveDate,
    pub closed_at: DateTime<Utc>,
    pub closed_by: Option<Uuid>,
    pub report_json: String,
}

/// Every closed month, oldest first.
pub async fn all(conn: &mut PgConnection) -> sqlx::Result<Vec<CloseRow>> {
    sqlx::query_as!(
        CloseRow,
        "SELECT month, closed_at, closed_by, report_json FROM month_closes ORDER BY month",
    )
    .fetch_all(conn)
    .await
}

/// Freezes a month with its report; false when it was already closed.
pub async fn close(
    conn: &mut PgConnection,
    month: NaiveDate,
    closed_at: DateTime<Utc>,
    closed_by: Option<Uuid>,
    report_json: &str,
) -> sqlx::Result<bool> {
    let result = sqlx::query!(
        "INSERT INTO month_closes (month, closed_at, closed_by, report_json) \
         VALUES ($1, $2, $3, $4) ON CONFLICT (month) DO NOTHING",
        month,
        closed_at,
        closed_by,
        report_json,
    )
    .execute(conn)
    .await?;
    Ok(result.rows_affected() == 1)
}
