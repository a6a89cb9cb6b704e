//! What right-sizing reads: a period's records on whole GPUs with their telemetry and
//! their cost in the period.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::domain::rating::{BillingMode, Outcome};
use crate::domain::what_if::WhatIf;
use crate::store::binder::Binder;
use crate::store::prices::{PriceJoin, summed_priced};
use crate::store::rollups::PRICED_SUMS;

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
    tz: Tz,
) -> sqlx::Result<Vec<WorkloadRecord>> {
    let mut binder = Binder::new();
    let (project, from, to, zone) = (
        binder.bind(project.to_owned()),
        binder.bind(from),
        binder.bind(to),
        binder.bind(tz.name().to_owned()),
    );
    let price = PriceJoin::new(&mut binder, &WhatIf::default(), "g");
    let sql = format!(
        "SELECT coalesce(r.labels ->> 'workload', r.task_id) AS workload, r.task_id, r.attempt, \
                r.gpu_model, r.billing_mode, r.provider, r.region, r.started_at, r.ended_at, \
                r.gpu_count, r.gpu_seconds_held, r.gpu_seconds_busy, r.outcome, r.sm_active, \
                r.memory_peak_gib, s.cost, s.unrated_segments \
         FROM ( \
           SELECT task_id, attempt, {cost}, \
                  sum(CASE WHEN price IS NULL THEN segments ELSE 0 END)::bigint \
                      AS unrated_segments \
           FROM ( \
             SELECT g.task_id, g.attempt, g.segments, g.card_seconds, \
                    g.metered_card_seconds, g.energy_joules, {prices} \
             FROM ( \
               SELECT project_id, task_id, attempt, contract_id, \
                      date_trunc('month', hour AT TIME ZONE {zone})::date AS month, \
                      NULL::text AS gpu_model, NULL::text AS billing_mode, \
                      count(*) AS segments, sum(card_seconds) AS card_seconds, \
                      sum(CASE WHEN energy_joules IS NULL THEN 0 ELSE card_seconds END) \
                          AS metered_card_seconds, \
                      sum(coalesce(energy_joules, 0)) AS energy_joules \
               FROM rated_segments \
               WHERE project_id = {project} AND hour >= {from} AND hour < {to} \
               GROUP BY 1, 2, 3, 4, 5) AS g \
             {joins}) AS priced \
           GROUP BY task_id, attempt) AS s \
         JOIN job_records r \
           ON r.project_id = {project} AND r.task_id = s.task_id AND r.attempt = s.attempt \
         WHERE r.mig_profile IS NULL \
         ORDER BY workload, r.gpu_model, r.task_id, r.attempt",
        cost = summed_priced(&PRICED_SUMS[0]),
        prices = price.prices(),
        joins = price.joins(),
    );
    // Dynamic: the prices are joined through the binder, as every report joins them.
    binder
        .query_as::<WorkloadRecord>(&sql)?
        .fetch_all(conn)
        .await
}
