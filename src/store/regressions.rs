//! Efficiency regressions: each project's rule, each workload's state (regressed or not), the
//! completed output they are judged on, and the alert a regression fires.

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::store::alerts::AlertRow;

/// A project's stored rule; a project without one is judged by the defaults.
#[derive(Debug, Clone)]
pub struct RuleRow {
    pub project_id: String,
    pub enabled: bool,
    pub threshold: Decimal,
    pub min_extra_cost: Decimal,
    pub window_days: i32,
    pub baseline_days: i32,
    pub min_records: i32,
    pub updated_at: DateTime<Utc>,
}

/// A project to judge: its currency, webhook and stored rule, if any.
#[derive(Debug, Clone)]
pub struct TargetRow {
    pub id: String,
    pub currency: String,
    pub webhook_url: Option<String>,
    pub enabled: Option<bool>,
    pub threshold: Option<Decimal>,
    pub min_extra_cost: Option<Decimal>,
    pub window_days: Option<i32>,
    pub baseline_days: Option<i32>,
    pub min_records: Option<i32>,
}

pub async fn rule(conn: &mut PgConnection, project: &str) -> sqlx::Result<Option<RuleRow>> {
    sqlx::query_as!(
        RuleRow,
        "SELECT project_id, enabled, threshold, min_extra_cost, window_days, baseline_days, \
                min_records, updated_at \
         FROM efficiency_regression_rules WHERE project_id = $1",
        project,
    )
    .fetch_optional(conn)
    .await
}

/// Creates or replaces a project's rule. The time is the caller's, so the statement holds no
/// volatile function in its `ON CONFLICT` clause.
pub async fn put_rule(conn: &mut PgConnection, rule: &RuleRow) -> sqlx::Result<RuleRow> {
    sqlx::query_as!(
        RuleRow,
        "INSERT INTO efficiency_regression_rules (project_id, enabled, threshold, \
                                                  min_extra_cost, window_days, baseline_days, \
                                                  min_records, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
         ON CONFLICT (project_id) DO UPDATE SET enabled = EXCLUDED.enabled, \
             threshold = EXCLUDED.threshold, min_extra_cost = EXCLUDED.min_extra_cost, \
             window_days = EXCLUDED.window_days, baseline_days = EXCLUDED.baseline_days, \
             min_records = EXCLUDED.min_records, updated_at = EXCLUDED.updated_at \
         RETURNING project_id, enabled, threshold, min_extra_cost, window_days, baseline_days, \
                   min_records, updated_at",
        rule.project_id,
        rule.enabled,
        rule.threshold,
        rule.min_extra_cost,
        rule.window_days,
        rule.baseline_days,
        rule.min_records,
        rule.updated_at,
    )
    .fetch_one(conn)
    .await
}

/// The projects to judge (one, or all), with their rules; those whose rule is off are left
/// out.
pub async fn targets(pool: &PgPool, project: Option<&str>) -> sqlx::Result<Vec<TargetRow>> {
    sqlx::query_as!(
        TargetRow,
        r#"SELECT p.id, p.currency, p.webhook_url, r.enabled AS "enabled?",
                  r.threshold AS "threshold?", r.min_extra_cost AS "min_extra_cost?",
                  r.window_days AS "window_days?", r.baseline_days AS "baseline_days?",
                  r.min_records AS "min_records?"
           FROM projects p
           LEFT JOIN efficiency_regression_rules r ON r.project_id = p.id
           WHERE ($1::text IS NULL OR p.id = $1) AND r.enabled IS NOT FALSE
           ORDER BY p.id"#,
        project,
    )
    .fetch_all(pool)
    .await
}

/// A workload's completed output in one unit within a window.
#[derive(Debug, Clone)]
pub struct WorkloadOutput {
    pub workload: String,
    pub output_unit: String,
    pub records: i64,
}

/// The workloads of `project` (label `workload`, else the task id) with at least
/// `min_records` completed records with output that ended in `[from, to)`, per unit. Rated
/// records are found by their end hour's index.
pub async fn completed_outputs(
    conn: &mut PgConnection,
    project: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    min_records: i64,
) -> sqlx::Result<Vec<WorkloadOutput>> {
    sqlx::query_as!(
        WorkloadOutput,
        r#"SELECT coalesce(r.labels ->> 'workload', r.task_id) AS "workload!",
                  r.output_unit AS "output_unit!", count(*) AS "records!"
           FROM rated_records d
           JOIN job_records r USING (project_id, task_id, attempt)
           WHERE d.project_id = $1 AND d.end_hour >= $2::timestamptz - interval '1 hour'
             AND d.end_hour < $3 AND r.ended_at >= $2 AND r.ended_at < $3
             AND r.outcome = 'completed' AND r.output_unit IS NOT NULL
             AND r.output_quantity > 0
           GROUP BY 1, 2
           HAVING count(*) >= $4
           ORDER BY 1, 2"#,
        project,
        from,
        to,
        min_records,
    )
    .fetch_all(conn)
    .await
}

/// A workload's state.
#[derive(Debug, Clone)]
pub struct StateRow {
    pub project_id: String,
    pub workload: String,
    pub output_unit: String,
    pub regressed: bool,
    pub since: NaiveDate,
    pub judged_on: NaiveDate,
    pub recovered_on: Option<NaiveDate>,
    pub baseline_cost_per_unit: Decimal,
    pub window_cost_per_unit: Decimal,
}

/// The states of a project's workloads, regressed first.
pub async fn states(pool: &PgPool, project: &str) -> sqlx::Result<Vec<StateRow>> {
    sqlx::query_as!(
        StateRow,
        "SELECT project_id, workload, output_unit, regressed, since, judged_on, recovered_on, \
                baseline_cost_per_unit, window_cost_per_unit \
         FROM efficiency_regression_states WHERE project_id = $1 \
         ORDER BY regressed DESC, workload, output_unit",
        project,
    )
    .fetch_all(pool)
    .await
}

/// A judgement to store.
#[derive(Debug, Clone)]
pub struct Judged<'a> {
    pub project_id: &'a str,
    pub workload: &'a str,
    pub output_unit: &'a str,
    /// The first day of the window judged, and the day after it.
    pub window_first: NaiveDate,
    pub today: NaiveDate,
    pub baseline_cost_per_unit: Decimal,
    pub window_cost_per_unit: Decimal,
}

/// Marks a workload regressed unless it already is; `true` when this call changed it (the
/// caller then fires its alert in the same transaction). Of two transactions racing, the
/// second waits for the first's row and then finds it regressed, so only one fires.
pub async fn mark_regressed(conn: &mut PgConnection, judged: &Judged<'_>) -> sqlx::Result<bool> {
    let changed = sqlx::query_scalar!(
        "INSERT INTO efficiency_regression_states AS s (project_id, workload, output_unit, \
                 regressed, since, judged_on, recovered_on, baseline_cost_per_unit, \
                 window_cost_per_unit) \
         VALUES ($1, $2, $3, true, $4, $5, NULL, $6, $7) \
         ON CONFLICT (project_id, workload, output_unit) DO UPDATE SET regressed = true, \
             since = EXCLUDED.since, judged_on = EXCLUDED.judged_on, recovered_on = NULL, \
             baseline_cost_per_unit = EXCLUDED.baseline_cost_per_unit, \
             window_cost_per_unit = EXCLUDED.window_cost_per_unit \
         WHERE NOT s.regressed \
         RETURNING s.regressed",
        judged.project_id,
        judged.workload,
        judged.output_unit,
        judged.window_first,
        judged.today,
        judged.baseline_cost_per_unit,
        judged.window_cost_per_unit,
    )
    .fetch_optional(conn)
    .await?;
    Ok(changed.is_some())
}

/// Marks a regressed workload recovered, which re-arms it; `true` when it was regressed.
pub async fn mark_recovered(pool: &PgPool, judged: &Judged<'_>) -> sqlx::Result<bool> {
    let result = sqlx::query!(
        "UPDATE efficiency_regression_states SET regressed = false, recovered_on = $4, \
                judged_on = $4, baseline_cost_per_unit = $5, window_cost_per_unit = $6 \
         WHERE project_id = $1 AND workload = $2 AND output_unit = $3 AND regressed",
        judged.project_id,
        judged.workload,
        judged.output_unit,
        judged.today,
        judged.baseline_cost_per_unit,
        judged.window_cost_per_unit,
    )
    .execute(pool)
    .await?;
    Ok(result.rows_affected() > 0)
}

/// An efficiency-regression alert to fire.
#[derive(Debug, Clone)]
pub struct NewRegressionAlert<'a> {
    pub project_id: &'a str,
    pub month: NaiveDate,
    pub currency: &'a str,
    pub workload: &'a str,
    pub output_unit: &'a str,
    /// The first instant of the window whose level shift fired.
    pub since: DateTime<Utc>,
    pub regression: serde_json::Value,
    pub fired_at: DateTime<Utc>,
}

/// Fires a regression alert unless one fired for the same workload, unit and window start.
pub async fn fire(
    conn: &mut PgConnection,
    alert: &NewRegressionAlert<'_>,
) -> sqlx::Result<Option<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, kind, currency, fired_at, workload, \
                                   output_unit, since, regression) \
         VALUES ($1, $2, $3, 'efficiency_regression', $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (project_id, workload, output_unit, since) \
             WHERE kind = 'efficiency_regression' DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
        alert.project_id,
        Uuid::new_v4(),
        alert.month,
        alert.currency,
        alert.fired_at,
        alert.workload,
        alert.output_unit,
        alert.since,
        alert.regression,
    )
    .fetch_optional(conn)
    .await
}
