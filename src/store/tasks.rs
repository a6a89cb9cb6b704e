//! What each task cost, kept per ledger day and ledger month (`task_daily`,
//! `task_monthly`) by the rating path, and read for any period of ledger hours.
//!
//! Every writer of a task holds the task's row in `tasks`, so its rows are updated in place:
//! [`rate_records`](crate::store::rating::rate_records) adds the signed difference between
//! a task's old and new segments and attempts, in the statements that update the project
//! rollups, and [`settle`] then stores each task's status and deletes the rows left empty.
//! They are rebuilt with the project rollups for another ledger time zone
//! ([`crate::store::rollups::align_to_time_zone`]).
//! A period is read like the project's cost (see [`PeriodSplit`]): whole months from
//! `task_monthly`, other whole days from `task_daily`, and the hours left over from the
//! view `task_hourly` over the segments and per-record figures.

use std::collections::BTreeMap;

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;

use crate::domain::figures::SUM_SCALE;
use crate::domain::task::{TaskFigures, TaskStatus};
use crate::store::rollups::{Level, PeriodSplit, TASK_SUMS};

/// The levels a task's figures are kept at.
const LEVELS: [Level; 2] = [Level::Day, Level::Month];

fn table(level: Level) -> &'static str {
    match level {
        Level::Hour => "task_hourly",
        Level::Day => "task_daily",
        Level::Month => "task_monthly",
    }
}

/// The summed columns filled from segments, with the expression over a signed segment
/// change (`sign` and the `rated_segments` columns) each adds.
const SEGMENT_SUMS: [(&str, &str); 9] = [
    ("segments", "sign"),
    ("cost", "sign * coalesce(cost, 0)"),
    ("productive", "sign * productive"),
    ("idle", "sign * idle"),
    ("unmeasured", "sign * unmeasured"),
    ("failed", "sign * failed"),
    ("gpu_seconds_held", "sign * gpu_seconds_held"),
    ("gpu_seconds_busy", "sign * coalesce(gpu_seconds_busy, 0)"),
    (
        "unrated_gpu_seconds",
        "CASE WHEN unrated_reason IS NULL THEN 0 ELSE sign * gpu_seconds_held END",
    ),
];

/// The summed columns filled from per-record figures, likewise over a signed change of a
/// `rated_records` row.
const RECORD_SUMS: [(&str, &str); 6] = [
    ("attempts", "sign"),
    ("failed_attempts", "sign * (outcome <> 'completed')::int"),
    ("retries", "sign * retries"),
    ("failures", "sign * failures"),
    (
        "queue_wait_seconds",
        "sign * coalesce(queue_wait_seconds, 0)",
    ),
    (
        "queue_waits",
        "sign * (queue_wait_seconds IS NOT NULL)::int",
    ),
];

/// An upsert adding `sums` of `source` (rows with `project_id`, `task_id` and `hour`) per
/// task and period of `level` into the level's table, with the output maps of `outputs`
/// (rows with `project_id`, `task_id`, `period` and `output`) when it adds output. Groups
/// that change nothing are left out.
fn upsert_sql(
    level: Level,
    tz: &str,
    source: &str,
    sums: &[(&str, &str)],
    outputs: Option<&str>,
) -> String {
    let period = level.column();
    let names = sums.iter().map(|(name, _)| *name).collect::<Vec<_>>();
    let totals = sums
        .iter()
        .map(|(name, expression)| format!("sum({expression}) AS {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let zeros = vec!["0"; sums.len()].join(", ");
    let updates = names
        .iter()
        .map(|name| format!("{name} = t.{name} + EXCLUDED.{name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let columns = names.join(", ");
    let sums = format!(
        "(SELECT project_id, task_id, {of_hour} AS period, {totals} \
          FROM {source} GROUP BY 1, 2, 3) AS sums",
        of_hour = level.of_hour(tz),
    );
    let (rows, selected, inserted, changed, output_update) = match outputs {
        Some(outputs) => (
            format!("{sums} LEFT JOIN {outputs} AS outputs USING (project_id, task_id, period)"),
            format!("{columns}, coalesce(outputs.output, '{{}}')"),
            format!("{columns}, output"),
            " OR outputs.output IS NOT NULL",
            ", output = CASE WHEN EXCLUDED.output = '{}' THEN t.output \
               ELSE add_quantities(t.output, EXCLUDED.output) END",
        ),
        None => (sums, columns.clone(), columns.clone(), "", ""),
    };
    format!(
        "INSERT INTO {table} AS t (project_id, task_id, {period}, {inserted}) \
         SELECT project_id, task_id, period, {selected} FROM {rows} \
         WHERE ({columns}) <> ({zeros}){changed} \
         ORDER BY 1, 2, 3 \
         ON CONFLICT (project_id, {period}, task_id) DO UPDATE SET {updates}{output_update}",
        table = table(level),
    )
}

/// CTEs adding the segment changes in the CTE `changes` (`sign` and the `rated_segments`
/// columns) to every task's daily and monthly rows; `tz` is the parameter holding the
/// ledger time zone.
pub fn add_segment_changes(tz: &str) -> String {
    LEVELS
        .iter()
        .map(|&level| {
            // Output per unit of each task and period, left out where it nets to zero.
            let outputs = format!(
                "(SELECT project_id, task_id, period, jsonb_object_agg(output_unit, quantity) \
                        AS output \
                  FROM (SELECT project_id, task_id, {of_hour} AS period, output_unit, \
                               sum(sign * output_quantity) AS quantity \
                        FROM changes WHERE output_quantity IS NOT NULL \
                        GROUP BY 1, 2, 3, 4 HAVING sum(sign * output_quantity) <> 0) AS units \
                  GROUP BY 1, 2, 3)",
                of_hour = level.of_hour(tz),
            );
            let upsert = upsert_sql(level, tz, "changes", &SEGMENT_SUMS, Some(&outputs));
            format!(
                "task_segments_{period} AS ({upsert})",
                period = level.column()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// CTEs adding the per-record changes in the CTE `changes` (`sign` and the `rated_records`
/// columns) to every task's daily and monthly rows, in the period holding each record's end.
pub fn add_record_changes(tz: &str) -> String {
    LEVELS
        .iter()
        .map(|&level| {
            let upsert = upsert_sql(
                level,
                tz,
                "(SELECT *, end_hour AS hour FROM changes) AS ended",
                &RECORD_SUMS,
                None,
            );
            format!(
                "task_records_{period} AS ({upsert})",
                period = level.column()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Stores the status of each of `tasks` (`None` for one left without attempts) and deletes
/// their daily and monthly rows nothing is left under, after their changes were added.
pub async fn settle(
    conn: &mut PgConnection,
    tasks: &[((&str, &str), Option<TaskStatus>)],
) -> anyhow::Result<()> {
    let projects: Vec<&str> = tasks.iter().map(|((project, _), _)| *project).collect();
    let task_ids: Vec<&str> = tasks.iter().map(|((_, task), _)| *task).collect();
    let statuses: Vec<Option<&str>> = tasks
        .iter()
        .map(|(_, status)| status.map(|s| s.status.as_str()))
        .collect();
    let field = |get: fn(&TaskStatus) -> Option<DateTime<Utc>>| -> Vec<Option<DateTime<Utc>>> {
        tasks
            .iter()
            .map(|(_, status)| status.as_ref().and_then(get))
            .collect()
    };
    sqlx::query_as::<_, (i64,)>(
        "WITH settled AS ( \
           UPDATE tasks t \
           SET status = s.status, completed_at = s.completed_at, \
               first_started_at = s.first_started_at, last_ended_at = s.last_ended_at, \
               gpu_models = ARRAY(SELECT DISTINCT r.gpu_model FROM job_records r \
                                  WHERE (r.project_id, r.task_id) = (t.project_id, t.task_id) \
                                  ORDER BY 1) \
           FROM UNNEST($1::text[], $2::text[], $3::text[], $4::timestamptz[], \
                       $5::timestamptz[], $6::timestamptz[]) \
                AS s(project_id, task_id, status, completed_at, first_started_at, last_ended_at) \
           WHERE (t.project_id, t.task_id) = (s.project_id, s.task_id) \
           RETURNING 1), \
         emptied_days AS ( \
           DELETE FROM task_daily \
           WHERE (project_id, task_id) IN (SELECT * FROM UNNEST($1::text[], $2::text[])) \
             AND segments = 0 AND attempts = 0), \
         emptied_months AS ( \
           DELETE FROM task_monthly \
           WHERE (project_id, task_id) IN (SELECT * FROM UNNEST($1::text[], $2::text[])) \
             AND segments = 0 AND attempts = 0) \
         SELECT count(*) FROM settled",
    )
    .bind(&projects)
    .bind(&task_ids)
    .bind(&statuses)
    .bind(field(|s| s.completed_at))
    .bind(field(|s| Some(s.first_started_at)))
    .bind(field(|s| Some(s.last_ended_at)))
    .fetch_one(conn)
    .await
    .context("settling the rated tasks")?;
    Ok(())
}

#[derive(sqlx::FromRow)]
struct TaskRow {
    task_id: String,
    productive: Decimal,
    idle: Decimal,
    unmeasured: Decimal,
    failed: Decimal,
    gpu_seconds_held: Decimal,
    gpu_seconds_busy: Decimal,
    unrated_gpu_seconds: Decimal,
    output_units: Vec<String>,
    output_quantities: Vec<Decimal>,
    attempts: i64,
    failed_attempts: i64,
    retries: i64,
    failures: i64,
    queue_wait_seconds: Decimal,
    queue_waits: i64,
}

impl TaskRow {
    fn into_parts(self) -> (String, TaskFigures) {
        let output: BTreeMap<String, Decimal> = self
            .output_units
            .into_iter()
            .zip(self.output_quantities)
            .collect();
        (
            self.task_id,
            TaskFigures {
                productive: self.productive,
                idle: self.idle,
                unmeasured: self.unmeasured,
                failed: self.failed,
                gpu_seconds_held: self.gpu_seconds_held,
                gpu_seconds_busy: self.gpu_seconds_busy,
                unrated_gpu_seconds: self.unrated_gpu_seconds,
                output,
                attempts: self.attempts,
                failed_attempts: self.failed_attempts,
                retries: self.retries,
                failures: self.failures,
                queue_wait_seconds: self.queue_wait_seconds,
                queue_waits: self.queue_waits,
            },
        )
    }
}

/// The figures of every task of `project` with a segment or an ended attempt in
/// `[from, to)` (ledger hour boundaries), by task id. Sums are rounded to [`SUM_SCALE`]
/// decimal places, as the project's are.
pub async fn period_figures(
    conn: &mut PgConnection,
    project: &str,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<(String, TaskFigures)>> {
    let rows = PeriodSplit::rows_sql(
        "task",
        &format!("task_id, {}", TASK_SUMS.join(", ")),
        ("month", "day", "hour"),
        "= $1",
        2,
    );
    let rounded = |column: &str| format!("round(sum({column}), {SUM_SCALE}) AS {column}");
    let counted = |column: &str| format!("sum({column})::bigint AS {column}");
    let sql = format!(
        "WITH rows AS ({rows}), \
         outputs AS ( \
           SELECT task_id, array_agg(unit ORDER BY unit) AS units, \
                  array_agg(quantity ORDER BY unit) AS quantities \
           FROM (SELECT task_id, o.unit, round(sum(o.quantity::numeric), {SUM_SCALE}) AS quantity \
                 FROM rows, jsonb_each_text(rows.output) AS o(unit, quantity) \
                 GROUP BY 1, 2 HAVING sum(o.quantity::numeric) <> 0) AS units \
           GROUP BY task_id) \
         SELECT task_id, {productive}, {idle}, {unmeasured}, {failed}, {held}, {busy}, \
                {unrated}, coalesce(min(outputs.units), '{{}}') AS output_units, \
                coalesce(min(outputs.quantities), '{{}}') AS output_quantities, \
                {attempts}, {failed_attempts}, {retries}, {failures}, {queue_wait}, {queue_waits} \
         FROM rows LEFT JOIN outputs USING (task_id) \
         GROUP BY task_id ORDER BY task_id",
        productive = rounded("productive"),
        idle = rounded("idle"),
        unmeasured = rounded("unmeasured"),
        failed = rounded("failed"),
        held = rounded("gpu_seconds_held"),
        busy = rounded("gpu_seconds_busy"),
        unrated = rounded("unrated_gpu_seconds"),
        attempts = counted("attempts"),
        failed_attempts = counted("failed_attempts"),
        retries = counted("retries"),
        failures = counted("failures"),
        queue_wait = rounded("queue_wait_seconds"),
        queue_waits = counted("queue_waits"),
    );
    let query = sqlx::query_as::<_, TaskRow>(&sql).bind(project);
    let rows = PeriodSplit::new(period, tz, true)
        .bind(query)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(TaskRow::into_parts).collect())
}
