//! What each task cost, kept per ledger month (`task_monthly`) by the rating path, and
//! read for any period of ledger hours.
//!
//! Every writer of a task holds the task's row in `tasks`, so its rows are updated in place:
//! [`rate_records`](crate::store::rating::rate_records) adds the signed difference between
//! a task's old and new segments and attempts, in the statement that updates the project
//! rollups, and then stores each task's status and deletes the rows left empty
//! ([`Settlement`]).
//! They are rebuilt with the project rollups for another ledger time zone
//! ([`crate::store::rollups::align_to_time_zone`]).
//! A period is read from whole months of `task_monthly` and, for the hours outside them,
//! from the view `task_hourly` over the segments and per-record figures (see
//! [`PeriodSplit::months_and_hours_sql`]).

use std::collections::BTreeMap;

use anyhow::Context;
use chrono::{DateTime, Months, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::figures::SUM_SCALE;
use crate::domain::rating::Outcome;
use crate::domain::task::{SortOrder, TaskFigures, TaskFilter, TaskKeyset, TaskSort, TaskStatus};
use crate::store::records::{COLUMNS as RECORD_COLUMNS, RecordRow};
use crate::store::rollups::{Level, PeriodSplit, TASK_SUMS};

/// The summed columns filled from segments, with the expression over a segment change
/// (`sign` and the `rated_segments` columns, with the figures of an old segment negated)
/// each adds.
const SEGMENT_SUMS: [(&str, &str); 9] = [
    ("segments", "sign"),
    ("cost", "coalesce(cost, 0)"),
    ("productive", "productive"),
    ("idle", "idle"),
    ("unmeasured", "unmeasured"),
    ("failed", "failed"),
    ("gpu_seconds_held", "gpu_seconds_held"),
    ("gpu_seconds_busy", "coalesce(gpu_seconds_busy, 0)"),
    (
        "unrated_gpu_seconds",
        "CASE WHEN unrated_reason IS NULL THEN 0 ELSE gpu_seconds_held END",
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

/// A CTE `task_changes` adding the changes of a rating call to every task's monthly rows in
/// one upsert, so that each row is written once per call: the segment changes in the CTE
/// `segments` (`sign` and the `rated_segments` columns, with the figures of an old segment
/// negated) in the month of their hour, and the per-record changes in the CTE `records`
/// (`sign` and the `rated_records` columns as stored) in the month holding each record's
/// end. `tz` is the parameter holding the ledger time zone.
/// Groups that change nothing are left out. [`emptied_rows`] names the rows nothing is left
/// under.
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
    let month = Level::Month.of_hour(tz);
    let changed = format!(
        "SELECT project_id, task_id, {month} AS month, {segment_columns} FROM {segments} \
         UNION ALL \
         SELECT project_id, task_id, {month} AS month, {record_columns} \
         FROM (SELECT *, end_hour AS hour FROM {records}) AS ended",
        segment_columns = branch(&SEGMENT_SUMS),
        record_columns = branch(&RECORD_SUMS),
    );
    // Output per unit of each task and month, left out where it nets to zero.
    let outputs = format!(
        "SELECT project_id, task_id, month, jsonb_object_agg(output_unit, quantity) AS output \
         FROM (SELECT project_id, task_id, {month} AS month, output_unit, \
                      sum(output_quantity) AS quantity \
               FROM {segments} WHERE output_quantity IS NOT NULL \
               GROUP BY 1, 2, 3, 4 HAVING sum(output_quantity) <> 0) AS units \
         GROUP BY 1, 2, 3"
    );
    format!(
        "task_changes AS ( \
           INSERT INTO task_monthly AS t (project_id, task_id, month, {columns}, output) \
           SELECT project_id, task_id, month, {columns}, coalesce(outputs.output, '{{}}') \
           FROM (SELECT project_id, task_id, month, {totals} FROM ({changed}) AS changed \
                 GROUP BY 1, 2, 3) AS sums \
           LEFT JOIN ({outputs}) AS outputs USING (project_id, task_id, month) \
           WHERE ({columns}) <> ({zeros}) OR outputs.output IS NOT NULL \
           ON CONFLICT (project_id, month, task_id) DO UPDATE SET {updates}, \
             output = CASE WHEN EXCLUDED.output = '{{}}' THEN t.output \
                           ELSE add_quantities(t.output, EXCLUDED.output) END \
           RETURNING t.ctid::text AS row_id, (t.segments, t.attempts) = (0, 0) AS emptied)"
    )
}

/// The row ids of the monthly rows [`add_changes`] left empty, as a `text[]` column:
/// [`Settlement`] deletes them.
pub fn emptied_rows() -> &'static str {
    "ARRAY(SELECT row_id FROM task_changes WHERE emptied)"
}

/// What the rating path settles for the tasks it rated once their changes are added: each
/// task's status (`None` for one left without attempts) and GPU models, and which of their
/// monthly rows nothing is left under.
#[derive(Default)]
pub struct Settlement<'a> {
    projects: Vec<&'a str>,
    task_ids: Vec<&'a str>,
    statuses: Vec<Option<&'static str>>,
    completed_at: Vec<Option<DateTime<Utc>>>,
    first_started_at: Vec<Option<DateTime<Utc>>>,
    last_ended_at: Vec<Option<DateTime<Utc>>>,
    /// Every task's distinct GPU models, one task after another: a task's are
    /// `models[first_model..=last_model]`, counted from 1 as SQL arrays are.
    models: Vec<&'a str>,
    first_model: Vec<i32>,
    last_model: Vec<i32>,
    /// Row ids of the monthly rows left empty (see [`emptied_rows`]).
    emptied: Vec<String>,
}

impl<'a> Settlement<'a> {
    /// Adds a task, with the GPU models of its attempts.
    pub fn push(
        &mut self,
        (project, task_id): (&'a str, &'a str),
        status: Option<TaskStatus>,
        models: impl IntoIterator<Item = &'a str>,
    ) -> anyhow::Result<()> {
        self.projects.push(project);
        self.task_ids.push(task_id);
        self.statuses.push(status.map(|s| s.status.as_str()));
        self.completed_at.push(status.and_then(|s| s.completed_at));
        self.first_started_at
            .push(status.map(|s| s.first_started_at));
        self.last_ended_at.push(status.map(|s| s.last_ended_at));
        let mut distinct: Vec<&str> = models.into_iter().collect();
        distinct.sort_unstable();
        distinct.dedup();
        let position =
            |index: usize| i32::try_from(index).context("too many GPU models in one rating call");
        self.first_model.push(position(self.models.len() + 1)?);
        self.models.extend(distinct);
        self.last_model.push(position(self.models.len())?);
        Ok(())
    }

    /// Notes the rows the changes left empty, as [`emptied_rows`] names them.
    pub fn emptied(&mut self, (rows,): (Vec<String>,)) {
        self.emptied = rows;
    }

    /// CTEs storing the tasks' status and deleting their emptied rows, reading the
    /// parameters [`Settlement::bind`] binds from `$first` on.
    pub fn ctes(first: usize) -> String {
        let p = |offset: usize| format!("${}", first + offset);
        // Each task's models are a slice of one array, so that no join pairs tasks with
        // their models; several are sorted here, in the database's collation. The rows are
        // updated through an upsert rather than `UPDATE … FROM`, so that each is found by its
        // primary key whatever the planner estimates of the table (a join with the batch
        // would scan every task); every task is locked already, so none is inserted.
        format!(
            "settled AS ( \
               INSERT INTO tasks AS t \
                 (project_id, task_id, status, completed_at, first_started_at, last_ended_at, \
                  gpu_models) \
               SELECT project_id, task_id, status, completed_at, first_started_at, \
                      last_ended_at, \
                      CASE WHEN last_model <= first_model \
                           THEN ({models}::text[])[first_model:last_model] \
                           ELSE ARRAY(SELECT model \
                                      FROM unnest(({models}::text[])[first_model:last_model]) \
                                           AS model \
                                      ORDER BY model) END \
               FROM UNNEST({projects}::text[], {task_ids}::text[], {statuses}::text[], \
                           {completed}::timestamptz[], {started}::timestamptz[], \
                           {ended}::timestamptz[], {first_model}::int[], {last_model}::int[]) \
                    AS u(project_id, task_id, status, completed_at, first_started_at, \
                         last_ended_at, first_model, last_model) \
               ON CONFLICT (project_id, task_id) DO UPDATE \
               SET status = EXCLUDED.status, completed_at = EXCLUDED.completed_at, \
                   first_started_at = EXCLUDED.first_started_at, \
                   last_ended_at = EXCLUDED.last_ended_at, gpu_models = EXCLUDED.gpu_models \
               WHERE (t.status, t.completed_at, t.first_started_at, t.last_ended_at, \
                      t.gpu_models) \
                     IS DISTINCT FROM (EXCLUDED.status, EXCLUDED.completed_at, \
                                       EXCLUDED.first_started_at, EXCLUDED.last_ended_at, \
                                       EXCLUDED.gpu_models)), \
             emptied AS ( \
               DELETE FROM task_monthly \
               WHERE ctid = ANY({emptied}::text[]::tid[]) \
                 AND segments = 0 AND attempts = 0)",
            projects = p(0),
            task_ids = p(1),
            statuses = p(2),
            completed = p(3),
            started = p(4),
            ended = p(5),
            first_model = p(6),
            last_model = p(7),
            models = p(8),
            emptied = p(9),
        )
    }

    /// Binds the ten parameters [`Settlement::ctes`] reads, in its order.
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
            .bind(&self.first_model)
            .bind(&self.last_model)
            .bind(&self.models)
            .bind(&self.emptied)
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

/// Columns of the figures a task row is read with, rounded to [`SUM_SCALE`] places, from a
/// row set `f` holding one row per task (`output` as `output_units` and
/// `output_quantities`).
fn figure_columns() -> String {
    let rounded = [
        "productive",
        "idle",
        "unmeasured",
        "failed",
        "gpu_seconds_held",
    ]
    .into_iter()
    .chain([
        "gpu_seconds_busy",
        "unrated_gpu_seconds",
        "queue_wait_seconds",
    ])
    .map(|column| format!("round(f.{column}, {SUM_SCALE}) AS {column}"));
    let counted = [
        "attempts",
        "failed_attempts",
        "retries",
        "failures",
        "queue_waits",
    ]
    .into_iter()
    .map(|column| format!("f.{column}::bigint AS {column}"));
    rounded
        .chain(counted)
        .chain([
            "f.output_units".to_owned(),
            "f.output_quantities".to_owned(),
        ])
        .collect::<Vec<_>>()
        .join(", ")
}

/// The per-task rows of `task_monthly` rows `m`, with their output as sorted arrays.
fn monthly_row(m: &str) -> String {
    format!(
        "{m}.*, \
         ARRAY(SELECT o.key FROM jsonb_each_text({m}.output) AS o ORDER BY o.key) AS output_units, \
         ARRAY(SELECT round(o.value::numeric, {SUM_SCALE}) \
               FROM jsonb_each_text({m}.output) AS o ORDER BY o.key) AS output_quantities"
    )
}

/// CTEs ending in `f`: one row per task of `project` ($1) with a segment or an ended
/// attempt in the period bound by [`PeriodSplit::bind_months_and_hours`] from $2, holding
/// the sums of its figures over the period: its whole months' rows of `task_monthly` and its
/// other hours' rows of `task_hourly`.
fn period_ctes() -> String {
    let rows = PeriodSplit::months_and_hours_sql(
        "task",
        &format!("task_id, {}", TASK_SUMS.join(", ")),
        ("month", "hour"),
        "= $1",
        2,
    );
    let sums = TASK_SUMS
        .iter()
        .filter(|column| **column != "output")
        .map(|column| format!("sum({column}) AS {column}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "rows AS ({rows}), \
         outputs AS ( \
           SELECT task_id, array_agg(unit ORDER BY unit) AS units, \
                  array_agg(quantity ORDER BY unit) AS quantities \
           FROM (SELECT task_id, o.unit, round(sum(o.quantity::numeric), {SUM_SCALE}) AS quantity \
                 FROM rows, jsonb_each_text(rows.output) AS o(unit, quantity) \
                 GROUP BY 1, 2 HAVING sum(o.quantity::numeric) <> 0) AS units \
           GROUP BY task_id), \
         f AS ( \
           SELECT task_id, {sums}, coalesce(min(outputs.units), '{{}}') AS output_units, \
                  coalesce(min(outputs.quantities), '{{}}') AS output_quantities \
           FROM rows LEFT JOIN outputs USING (task_id) \
           GROUP BY task_id)"
    )
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
    let sql = format!(
        "WITH {ctes} SELECT f.task_id, {columns} FROM f ORDER BY f.task_id",
        ctes = period_ctes(),
        columns = figure_columns(),
    );
    let query = sqlx::query_as::<_, TaskRow>(&sql).bind(project);
    let rows = PeriodSplit::new(period, tz, true)
        .bind_months_and_hours(query)
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(TaskRow::into_parts).collect())
}

/// One task of a list: its figures over the list's period, what it is, and its place in the
/// list.
#[derive(sqlx::FromRow)]
pub struct ListedRow {
    #[sqlx(flatten)]
    figures: TaskRow,
    #[sqlx(try_from = "String")]
    pub status: Outcome,
    pub completed_at: Option<DateTime<Utc>>,
    pub first_started_at: DateTime<Utc>,
    pub last_ended_at: DateTime<Utc>,
    pub gpu_models: Vec<String>,
    /// The value the list is sorted by, as exact text (epoch seconds for `started_at`).
    pub sort_key: String,
}

/// A task of a list, as [`list`] returns it.
pub struct ListedTask {
    pub task_id: String,
    pub figures: TaskFigures,
    pub status: Outcome,
    pub completed_at: Option<DateTime<Utc>>,
    pub first_started_at: DateTime<Utc>,
    pub last_ended_at: DateTime<Utc>,
    pub gpu_models: Vec<String>,
    pub key: TaskKeyset,
}

impl From<ListedRow> for ListedTask {
    fn from(row: ListedRow) -> Self {
        let (task_id, figures) = row.figures.into_parts();
        ListedTask {
            key: TaskKeyset {
                value: row.sort_key,
                task_id: task_id.clone(),
            },
            task_id,
            figures,
            status: row.status,
            completed_at: row.completed_at,
            first_started_at: row.first_started_at,
            last_ended_at: row.last_ended_at,
            gpu_models: row.gpu_models,
        }
    }
}

/// What [`list`] lists, in what order, from where.
pub struct ListQuery<'a> {
    pub project: &'a str,
    pub period: (DateTime<Utc>, DateTime<Utc>),
    pub filter: &'a TaskFilter,
    pub sort: TaskSort,
    pub order: SortOrder,
    /// The last task of the previous page.
    pub after: Option<&'a TaskKeyset>,
    pub limit: i64,
}

/// The SQL value `sort` orders by, over the per-task row `f` and the task `t`.
fn sort_value(sort: TaskSort) -> &'static str {
    match sort {
        TaskSort::Cost => "f.cost",
        TaskSort::Waste => "(f.idle + f.failed)",
        TaskSort::GpuHours => "f.gpu_seconds_held",
        TaskSort::QueueWait => "f.queue_wait_seconds",
        TaskSort::StartedAt => "extract(epoch FROM t.first_started_at)",
    }
}

/// Up to `limit` tasks of a project with figures in the period, filtered and sorted, after
/// `after`.
///
/// A period that is one whole ledger month reads that month's rows of `task_monthly` alone,
/// in the order of its index when sorted by cost, so the costliest tasks of a month are found
/// without summing the others. Any other period sums the task's rows of its whole months and
/// other hours first.
pub async fn list(
    conn: &mut PgConnection,
    query: &ListQuery<'_>,
    tz: Tz,
) -> sqlx::Result<Vec<ListedTask>> {
    let split = PeriodSplit::new(query.period, tz, true);
    let one_month = split.days_start == split.from
        && split.days_end == split.to
        && (split.first_day, split.end_day) == (split.first_month, split.end_month)
        && split.first_month.checked_add_months(Months::new(1)) == Some(split.end_month);
    let (ctes, source, mut next) = if one_month {
        (
            String::new(),
            format!(
                "(SELECT {row} FROM task_monthly AS m WHERE m.project_id = $1 AND m.month = $2)",
                row = monthly_row("m"),
            ),
            3,
        )
    } else {
        (format!("WITH {} ", period_ctes()), "f".to_owned(), 8)
    };
    let mut param = || {
        let name = format!("${next}");
        next += 1;
        name
    };
    let mut filters = vec!["t.status IS NOT NULL".to_owned()];
    if query.filter.status.is_some() {
        filters.push(format!("t.status = {}", param()));
    }
    if query.filter.gpu_model.is_some() {
        filters.push(format!("{} = ANY(t.gpu_models)", param()));
    }
    if !query.filter.labels.is_empty() {
        filters.push(format!(
            "EXISTS (SELECT 1 FROM job_records r \
                     WHERE (r.project_id, r.task_id) = (t.project_id, t.task_id) \
                       AND r.labels @> {}::jsonb)",
            param()
        ));
    }
    let value = sort_value(query.sort);
    let mut conditions = vec!["true".to_owned()];
    let (beyond, tie_beyond, order, tie_order) = match query.order {
        SortOrder::Desc => ("<", ">", "DESC", "ASC"),
        SortOrder::Asc => (">", "<", "ASC", "DESC"),
    };
    if query.after.is_some() {
        let (key, task) = (param(), param());
        // The first bound alone narrows an index scan; the second skips the ties already
        // shown.
        conditions.push(format!(
            "{value} {beyond}= {key}::numeric \
             AND ({value} {beyond} {key}::numeric OR f.task_id {tie_beyond} {task})"
        ));
    }
    let limit = param();
    // The task is looked up per row, under a LIMIT that keeps the lookup from being planned
    // as a join of all the period's tasks: rows come in the order of the index on cost, and
    // the scan stops once the page is full.
    let sql = format!(
        "{ctes}SELECT f.task_id, {columns}, t.status, t.completed_at, t.first_started_at, \
                t.last_ended_at, t.gpu_models, ({value})::text AS sort_key \
         FROM {source} AS f \
         CROSS JOIN LATERAL ( \
             SELECT t.status, t.completed_at, t.first_started_at, t.last_ended_at, \
                    t.gpu_models \
             FROM tasks AS t \
             WHERE (t.project_id, t.task_id) = ($1, f.task_id) AND {filters} \
             LIMIT 1) AS t \
         WHERE {conditions} \
         ORDER BY {value} {order}, f.task_id {tie_order} \
         LIMIT {limit}",
        columns = figure_columns(),
        filters = filters.join(" AND "),
        conditions = conditions.join(" AND "),
    );
    let mut statement = sqlx::query_as::<_, ListedRow>(&sql).bind(query.project);
    statement = if one_month {
        statement.bind(split.first_month)
    } else {
        split.bind_months_and_hours(statement)
    };
    if let Some(status) = query.filter.status {
        statement = statement.bind(status.as_str());
    }
    if let Some(model) = &query.filter.gpu_model {
        statement = statement.bind(model);
    }
    if !query.filter.labels.is_empty() {
        statement = statement.bind(sqlx::types::Json(&query.filter.labels));
    }
    if let Some(after) = query.after {
        statement = statement.bind(&after.value).bind(&after.task_id);
    }
    let rows = statement.bind(query.limit).fetch_all(conn).await?;
    Ok(rows.into_iter().map(ListedTask::from).collect())
}

/// The figures of each of `task_ids` of `project` per ledger month, over every month they
/// have figures in: their lifetime is the sum of these.
pub async fn monthly_figures(
    conn: &mut PgConnection,
    project: &str,
    task_ids: &[String],
    tz: Tz,
) -> sqlx::Result<Vec<(String, NaiveDate, TaskFigures)>> {
    // A task's figures lie in the months from its first start to its last end, so its rows
    // are found by their primary key without an index by task.
    let sql = format!(
        "SELECT f.task_id, f.month, {columns} \
         FROM tasks AS t \
         CROSS JOIN LATERAL ( \
             SELECT {row} FROM task_monthly AS m \
             WHERE m.project_id = t.project_id AND m.task_id = t.task_id \
               AND m.month = ANY(ARRAY( \
                   SELECT generate_series( \
                       date_trunc('month', t.first_started_at AT TIME ZONE $3), \
                       date_trunc('month', t.last_ended_at AT TIME ZONE $3), \
                       interval '1 month')::date))) AS f \
         WHERE t.project_id = $1 AND t.task_id = ANY($2) \
         ORDER BY f.task_id, f.month",
        columns = figure_columns(),
        row = monthly_row("m"),
    );
    let rows = sqlx::query_as::<_, MonthRow>(&sql)
        .bind(project)
        .bind(task_ids)
        .bind(tz.name())
        .fetch_all(conn)
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            let month = row.month;
            let (task_id, figures) = row.figures.into_parts();
            (task_id, month, figures)
        })
        .collect())
}

#[derive(sqlx::FromRow)]
struct MonthRow {
    month: NaiveDate,
    #[sqlx(flatten)]
    figures: TaskRow,
}

/// One attempt of a task, as posted, with what rating made of it.
#[derive(Debug, sqlx::FromRow)]
pub struct AttemptRow {
    #[sqlx(flatten)]
    pub record: RecordRow,
    /// Whether this attempt is the one that completes the task, or the one that fails it.
    pub completes_task: bool,
    pub fails_task: bool,
}

/// Every attempt of a task, by attempt number; empty for a task without records.
pub async fn attempts(
    conn: &mut PgConnection,
    project: &str,
    task_id: &str,
) -> sqlx::Result<Vec<AttemptRow>> {
    sqlx::query_as::<_, AttemptRow>(&format!(
        "SELECT r.*, coalesce(d.completes_task, false) AS completes_task, \
                coalesce(d.fails_task, false) AS fails_task \
         FROM (SELECT {RECORD_COLUMNS} FROM job_records \
               WHERE project_id = $1 AND task_id = $2) AS r \
         LEFT JOIN rated_records AS d USING (project_id, task_id, attempt) \
         ORDER BY r.attempt"
    ))
    .bind(project)
    .bind(task_id)
    .fetch_all(conn)
    .await
}

/// The sums of an attempt's rated segments priced by one contract, or left unrated for one
/// reason.
#[derive(Debug, sqlx::FromRow)]
pub struct AttemptPricing {
    pub attempt: i32,
    pub contract_id: Option<Uuid>,
    pub contract_name: Option<String>,
    pub price_per_gpu_hour: Option<Decimal>,
    pub contract_currency: Option<String>,
    pub unrated_reason: Option<String>,
    pub segments: i64,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Decimal,
    pub cost: Decimal,
    pub productive: Decimal,
    pub idle: Decimal,
    pub unmeasured: Decimal,
    pub failed: Decimal,
}

/// How each attempt of a task was priced: its segments summed per contract and per unrated
/// reason, by attempt.
pub async fn attempt_pricing(
    conn: &mut PgConnection,
    project: &str,
    task_id: &str,
) -> sqlx::Result<Vec<AttemptPricing>> {
    let rounded = |column: &str| format!("round(sum(s.{column}), {SUM_SCALE}) AS {column}");
    sqlx::query_as::<_, AttemptPricing>(&format!(
        "SELECT s.attempt, s.contract_id, c.name AS contract_name, c.price_per_gpu_hour, \
                c.currency::text AS contract_currency, s.unrated_reason, count(*) AS segments, \
                {held}, round(sum(coalesce(s.gpu_seconds_busy, 0)), {SUM_SCALE}) AS gpu_seconds_busy, \
                round(sum(coalesce(s.cost, 0)), {SUM_SCALE}) AS cost, \
                {productive}, {idle}, {unmeasured}, {failed} \
         FROM rated_segments AS s LEFT JOIN contracts AS c ON c.id = s.contract_id \
         WHERE s.project_id = $1 AND s.task_id = $2 \
         GROUP BY s.attempt, s.contract_id, c.name, c.price_per_gpu_hour, c.currency, \
                  s.unrated_reason \
         ORDER BY s.attempt, min(s.hour), s.contract_id, s.unrated_reason",
        held = rounded("gpu_seconds_held"),
        productive = rounded("productive"),
        idle = rounded("idle"),
        unmeasured = rounded("unmeasured"),
        failed = rounded("failed"),
    ))
    .bind(project)
    .bind(task_id)
    .fetch_all(conn)
    .await
}
