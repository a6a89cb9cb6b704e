//! What each task cost, kept per ledger day and ledger month (`task_daily`,
//! `task_monthly`) by the rating path, and read for any period of ledger hours.
//!
//! Every writer of a task holds the task's row in `tasks`, so its rows are updated in place:
//! [`rate_records`](crate::store::rating::rate_records) adds the signed difference between
//! a task's old and new segments and attempts, in the statements that update the project
//! rollups, and then stores each task's status and deletes the rows left empty
//! ([`Settlement`]).
//! They are rebuilt with the project rollups for another ledger time zone
//! ([`crate::store::rollups::align_to_time_zone`]).
//! A period is read like the project's cost (see [`PeriodSplit`]): whole months from
//! `task_monthly`, other whole days from `task_daily`, and the hours left over from the
//! view `task_hourly` over the segments and per-record figures.

use std::collections::BTreeMap;

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

/// CTEs adding the changes of a rating call to every task's daily and monthly rows, one
/// upsert per level, so that each row is written once per call: the segment changes in the
/// CTE `segments` (`sign` and the `rated_segments` columns) in the period of their hour,
/// and the per-record changes in the CTE `records` (`sign` and the `rated_records`
/// columns) in the period holding each record's end. `tz` is the parameter holding the
/// ledger time zone. Groups that change nothing are left out. [`emptied_rows`] names the
/// rows nothing is left under.
pub fn add_changes(tz: &str, segments: &str, records: &str) -> String {
    let names: Vec<&str> = SEGMENT_SUMS
        .iter()
        .chain(&RECORD_SUMS)
        .map(|(name, _)| *name)
        .collect();
    let branch = |own: &[(&str, &str)]| {
        SEGMENT_SUMS
            .iter()
            .chain(&RECORD_SUMS)
            .map(
                |(name, expression)| match own.iter().any(|(own, _)| own == name) {
                    true => format!("{expression} AS {name}"),
                    false => format!("0 AS {name}"),
                },
            )
            .collect::<Vec<_>>()
            .join(", ")
    };
    let columns = names.join(", ");
    let totals = names
        .iter()
        .map(|name| format!("sum({name}) AS {name}"))
        .collect::<Vec<_>>()
        .join(", ");
    let zeros = vec!["0"; names.len()].join(", ");
    let updates = names
        .iter()
        .map(|name| format!("{name} = t.{name} + EXCLUDED.{name}"))
        .collect::<Vec<_>>()
        .join(", ");
    LEVELS
        .iter()
        .map(|&level| {
            let period = level.column();
            let of_hour = level.of_hour(tz);
            let changed = format!(
                "SELECT project_id, task_id, {of_hour} AS period, {segment_columns} \
                 FROM {segments} \
                 UNION ALL \
                 SELECT project_id, task_id, {of_hour} AS period, {record_columns} \
                 FROM (SELECT *, end_hour AS hour FROM {records}) AS ended",
                segment_columns = branch(&SEGMENT_SUMS),
                record_columns = branch(&RECORD_SUMS),
            );
            // Output per unit of each task and period, left out where it nets to zero.
            let outputs = format!(
                "SELECT project_id, task_id, period, jsonb_object_agg(output_unit, quantity) \
                        AS output \
                 FROM (SELECT project_id, task_id, {of_hour} AS period, output_unit, \
                              sum(sign * output_quantity) AS quantity \
                       FROM {segments} WHERE output_quantity IS NOT NULL \
                       GROUP BY 1, 2, 3, 4 HAVING sum(sign * output_quantity) <> 0) AS units \
                 GROUP BY 1, 2, 3"
            );
            format!(
                "task_changes_{period} AS ( \
                   INSERT INTO {table} AS t (project_id, task_id, {period}, {columns}, output) \
                   SELECT project_id, task_id, period, {columns}, \
                          coalesce(outputs.output, '{{}}') \
                   FROM (SELECT project_id, task_id, period, {totals} FROM ({changed}) AS changed \
                         GROUP BY 1, 2, 3) AS sums \
                   LEFT JOIN ({outputs}) AS outputs USING (project_id, task_id, period) \
                   WHERE ({columns}) <> ({zeros}) OR outputs.output IS NOT NULL \
                   ON CONFLICT (project_id, {period}, task_id) DO UPDATE SET {updates}, \
                     output = CASE WHEN EXCLUDED.output = '{{}}' THEN t.output \
                                   ELSE add_quantities(t.output, EXCLUDED.output) END \
                   RETURNING t.ctid::text AS row_id, (t.segments, t.attempts) = (0, 0) AS emptied)",
                table = table(level),
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The row ids of the daily and of the monthly rows [`add_changes`] left empty, as two
/// `text[]` columns: [`Settlement`] deletes them.
pub fn emptied_rows() -> String {
    LEVELS
        .iter()
        .map(|level| {
            format!(
                "ARRAY(SELECT row_id FROM task_changes_{} WHERE emptied)",
                level.column()
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the rating path settles for the tasks it rated once their changes are added: each
/// task's status (`None` for one left without attempts) and GPU models, and which of their
/// daily and monthly rows nothing is left under.
#[derive(Default)]
pub struct Settlement<'a> {
    projects: Vec<&'a str>,
    task_ids: Vec<&'a str>,
    statuses: Vec<Option<&'static str>>,
    completed_at: Vec<Option<DateTime<Utc>>>,
    first_started_at: Vec<Option<DateTime<Utc>>>,
    last_ended_at: Vec<Option<DateTime<Utc>>>,
    model_projects: Vec<&'a str>,
    model_tasks: Vec<&'a str>,
    models: Vec<&'a str>,
    /// Row ids of the daily and monthly rows left empty (see [`emptied_rows`]).
    emptied_days: Vec<String>,
    emptied_months: Vec<String>,
}

impl<'a> Settlement<'a> {
    /// Adds a task, with the GPU models of its attempts.
    pub fn push(
        &mut self,
        (project, task_id): (&'a str, &'a str),
        status: Option<TaskStatus>,
        models: impl IntoIterator<Item = &'a str>,
    ) {
        self.projects.push(project);
        self.task_ids.push(task_id);
        self.statuses.push(status.map(|s| s.status.as_str()));
        self.completed_at.push(status.and_then(|s| s.completed_at));
        self.first_started_at
            .push(status.map(|s| s.first_started_at));
        self.last_ended_at.push(status.map(|s| s.last_ended_at));
        for model in models {
            self.model_projects.push(project);
            self.model_tasks.push(task_id);
            self.models.push(model);
        }
    }

    /// Notes the rows the changes left empty, as [`emptied_rows`] names them.
    pub fn emptied(&mut self, (days, months): (Vec<String>, Vec<String>)) {
        self.emptied_days = days;
        self.emptied_months = months;
    }

    /// CTEs storing the tasks' status and deleting their emptied rows, reading the
    /// parameters [`Settlement::bind`] binds from `$first` on.
    pub fn ctes(first: usize) -> String {
        let p = |offset: usize| format!("${}", first + offset);
        format!(
            "task_models AS ( \
               SELECT project_id, task_id, array_agg(DISTINCT model ORDER BY model) AS models \
               FROM UNNEST({model_projects}::text[], {model_tasks}::text[], {models}::text[]) \
                    AS m(project_id, task_id, model) \
               GROUP BY 1, 2), \
             settled AS ( \
               UPDATE tasks t \
               SET status = s.status, completed_at = s.completed_at, \
                   first_started_at = s.first_started_at, last_ended_at = s.last_ended_at, \
                   gpu_models = coalesce(s.models, '{{}}') \
               FROM (UNNEST({projects}::text[], {task_ids}::text[], {statuses}::text[], \
                            {completed}::timestamptz[], {started}::timestamptz[], \
                            {ended}::timestamptz[]) \
                     AS u(project_id, task_id, status, completed_at, first_started_at, \
                          last_ended_at) \
                     LEFT JOIN task_models USING (project_id, task_id)) AS s \
               WHERE (t.project_id, t.task_id) = (s.project_id, s.task_id) \
                 AND (t.status, t.completed_at, t.first_started_at, t.last_ended_at, \
                      t.gpu_models) \
                     IS DISTINCT FROM (s.status, s.completed_at, s.first_started_at, \
                                       s.last_ended_at, coalesce(s.models, '{{}}'))), \
             emptied_days AS ( \
               DELETE FROM task_daily \
               WHERE ctid = ANY({emptied_days}::text[]::tid[]) \
                 AND segments = 0 AND attempts = 0), \
             emptied_months AS ( \
               DELETE FROM task_monthly \
               WHERE ctid = ANY({emptied_months}::text[]::tid[]) \
                 AND segments = 0 AND attempts = 0)",
            projects = p(0),
            task_ids = p(1),
            statuses = p(2),
            completed = p(3),
            started = p(4),
            ended = p(5),
            model_projects = p(6),
            model_tasks = p(7),
            models = p(8),
            emptied_days = p(9),
            emptied_months = p(10),
        )
    }

    /// Binds the eleven parameters [`Settlement::ctes`] reads, in its order.
    pub fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.projects)
            .bind(&self.task_ids)
            .bind(&self.statuses)
            .bind(&self.completed_at)
            .bind(&self.first_started_at)
            .bind(&self.last_ended_at)
            .bind(&self.model_projects)
            .bind(&self.model_tasks)
            .bind(&self.models)
            .bind(&self.emptied_days)
            .bind(&self.emptied_months)
    }
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
