//! What right-sizing reads: a period's records on whole GPUs with their telemetry and
//! their cost in the period.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::domain::figures::SUM_SCALE;
use crate::domain::rating::{BillingMode, Outcome};

/// A record on whole GPUs (no MIG profile) with some of its time in the period.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct WorkloadRecord {
    /// Its `workload` label, or else its task id.
    pub workload: String,
    pub task_id: String,
    pub attempt: i32,
    pub gpu_model: String,
    #[sqlx(try_from = "String")]
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub gpu_count: Decimal,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Option<Decimal>,
    #[sqlx(try_from = "String")]
    pub outcome: Outcome,
    pub sm_active: Option<Decimal>,
    pub memory_peak_gib: Option<Decimal>,
    /// The cost of its segments in the period.
    pub cost: Decimal,
    /// Its segments in the period that carry no cost.
    pub unrated_segments: i64,
}

/// The records of `project` on whole GPUs with segments in `[from, to)`, by workload and
/// GPU model.
pub async fn whole_gpu_records(
    conn: &mut PgConnection,
    project: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> sqlx::Result<Vec<WorkloadRecord>> {
    sqlx::query_as::<_, WorkloadRecord>(&format!(
        "SELECT coalesce(r.labels ->> 'workload', r.task_id) AS workload, r.task_id, r.attempt, \
                r.gpu_model, r.billing_mode, r.provider, r.region, r.started_at, r.ended_at, \
                r.gpu_count, r.gpu_seconds_held, r.gpu_seconds_busy, r.outcome, r.sm_active, \
                r.memory_peak_gib, s.cost, s.unrated_segments \
         FROM ( \
           SELECT task_id, attempt, round(coalesce(sum(cost), 0), {SUM_SCALE}) AS cost, \
                  count(*) FILTER (WHERE cost IS NULL) AS unrated_segments \
           FROM rated_segments \
           WHERE project_id = $1 AND hour >= $2 AND hour < $3 \
           GROUP BY task_id, attempt) AS s \
         JOIN job_records r \
           ON r.project_id = $1 AND r.task_id = s.task_id AND r.attempt = s.attempt \
         WHERE r.mig_profile IS NULL \
         ORDER BY workload, r.gpu_model, r.task_id, r.attempt"
    ))
    .bind(project)
    .bind(from)
    .bind(to)
    .fetch_all(conn)
    .await
}
