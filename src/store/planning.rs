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

/// What the filtered records used over a window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelUse {
    /// By ledger hour, billing mode and whether the attempt was preempted, in hour order.
    pub hours: Vec<HourUse>,
    /// Attempts on spot with GPU time in the window.
    pub spot_attempts: i64,
    /// Those of them preempted.
    pub spot_preempted: i64,
}

/// The card-seconds the filtered records held in each ledger hour of `[from, to)` (GPU time
/// no contract priced included), and the spot attempts among them: the window's segments of
/// the model are read once for both.
pub async fn model_use(
    conn: &mut PgConnection,
    filter: UseFilter<'_>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> sqlx::Result<ModelUse> {
    let rows = sqlx::query!(
        r#"WITH s AS MATERIALIZED (
               SELECT s.project_id, s.task_id, s.attempt, s.hour, s.billing_mode, s.outcome,
                      s.card_seconds
               FROM projects p
               JOIN rated_segments s ON s.project_id = p.id
               WHERE s.gpu_model = $1 AND s.hour >= $2 AND s.hour < $3
                 AND (($4::text IS NULL AND $5::text[] IS NULL) OR EXISTS (
                     SELECT 1 FROM job_records j
                     WHERE (j.project_id, j.task_id, j.attempt)
                           = (s.project_id, s.task_id, s.attempt)
                       AND ($4::text IS NULL OR j.provider = $4)
                       AND ($5::text[] IS NULL OR j.nodes && $5)))),
           used AS (
               SELECT hour, billing_mode, outcome = 'preempted' AS preempted,
                      sum(card_seconds) AS card_seconds
               FROM s GROUP BY hour, billing_mode, outcome = 'preempted'),
           spot AS (
               SELECT count(*) AS attempts,
                      count(*) FILTER (WHERE outcome = 'preempted') AS preempted
               FROM (SELECT DISTINCT project_id, task_id, attempt, outcome
                     FROM s WHERE billing_mode = 'spot') AS a)
           SELECT u.hour AS "hour?", u.billing_mode AS "billing_mode?",
                  u.preempted AS "preempted?", u.card_seconds AS "card_seconds?",
                  spot.attempts AS "attempts!", spot.preempted AS "spot_preempted!"
           FROM spot LEFT JOIN used u ON true
           ORDER BY u.hour"#,
        filter.gpu_model,
        from,
        to,
        filter.provider,
        filter.nodes,
    )
    .fetch_all(conn)
    .await?;
    let mut used = ModelUse::default();
    for row in rows {
        used.spot_attempts = row.attempts;
        used.spot_preempted = row.spot_preempted;
        if let (Some(hour), Some(billing_mode), Some(preempted), Some(card_seconds)) =
            (row.hour, row.billing_mode, row.preempted, row.card_seconds)
        {
            used.hours.push(HourUse {
                hour,
                billing_mode,
                preempted,
                card_seconds,
            });
        }
    }
    Ok(used)
}

/// Plans the statements of the rest of the transaction for the values they are given, not
/// once for any: a filter left out (`$4 IS NULL`) then costs nothing.
pub async fn plan_for_each_call(conn: &mut PgConnection) -> sqlx::Result<()> {
    sqlx::query!("SET LOCAL plan_cache_mode = force_custom_plan")
        .execute(conn)
        .await?;
    Ok(())
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
