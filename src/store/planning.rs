//! What commitment planning reads: a GPU model's GPU-hours hour by hour, by billing mode, and
//! the spot attempts it saw preempted.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

/// Which records a plan reads: those of one GPU model, optionally of one provider and of the
/// records naming one of `nodes` (a pool's).
#[derive(Debug, Clone, Copy)]
pub struct UseFilter<'a> {
    pub gpu_model: &'a str,
    pub provider: Option<&'a str>,
    pub nodes: Option<&'a [String]>,
}

/// The card-seconds of one ledger hour and billing mode, those of preempted attempts apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HourUse {
    pub hour: DateTime<Utc>,
    pub billing_mode: String,
    pub preempted: bool,
    pub card_seconds: Decimal,
}

/// The card-seconds the filtered records held in each ledger hour of `[from, to)`, by billing
/// mode and whether the attempt was preempted. GPU time no contract priced counts as well.
pub async fn use_by_hour(
    conn: &mut PgConnection,
    filter: UseFilter<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<HourUse>> {
    sqlx::query_as!(
        HourUse,
        r#"SELECT s.hour AS "hour!", s.billing_mode AS "billing_mode!",
                  (s.outcome = 'preempted') AS "preempted!",
                  sum(s.card_seconds) AS "card_seconds!"
           FROM projects p
           JOIN rated_segments s ON s.project_id = p.id
           WHERE s.gpu_model = $1 AND s.hour >= $2 AND s.hour < $3
             AND (($4::text IS NULL AND $5::text[] IS NULL) OR EXISTS (
                 SELECT 1 FROM job_records j
                 WHERE (j.project_id, j.task_id, j.attempt) = (s.project_id, s.task_id, s.attempt)
                   AND ($4::text IS NULL OR j.provider = $4)
                   AND ($5::text[] IS NULL OR j.nodes && $5)))
           GROUP BY s.hour, s.billing_mode, s.outcome = 'preempted'
           ORDER BY 1"#,
        filter.gpu_model,
        from,
        to,
        filter.provider,
        filter.nodes,
    )
    .fetch_all(conn)
    .await
}

/// Attempts on spot that ended within `[from, to)`, and how many of them were preempted.
pub async fn spot_attempts(
    conn: &mut PgConnection,
    filter: UseFilter<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<(i64, i64)> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "attempts!",
                  count(*) FILTER (WHERE d.outcome = 'preempted') AS "preempted!"
           FROM projects p
           JOIN rated_records d ON d.project_id = p.id
           WHERE d.gpu_model = $1 AND d.billing_mode = 'spot'
             AND d.end_hour >= $2 AND d.end_hour < $3
             AND (($4::text IS NULL AND $5::text[] IS NULL) OR EXISTS (
                 SELECT 1 FROM job_records j
                 WHERE (j.project_id, j.task_id, j.attempt) = (d.project_id, d.task_id, d.attempt)
                   AND ($4::text IS NULL OR j.provider = $4)
                   AND ($5::text[] IS NULL OR j.nodes && $5)))"#,
        filter.gpu_model,
        from,
        to,
        filter.provider,
        filter.nodes,
    )
    .fetch_one(conn)
    .await?;
    Ok((row.attempts, row.preempted))
}

/// The nodes `pool` had within `[from, to)`.
pub async fn pool_nodes(
    conn: &mut PgConnection,
    pool: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT DISTINCT node AS "node!" FROM capacity_intervals
           WHERE pool_id = $1 AND from_at < $3 AND until_at > $2
           ORDER BY 1"#,
        pool,
        from,
        to,
    )
    .fetch_all(conn)
    .await
}
