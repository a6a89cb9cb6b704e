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
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::figures::SUM_SCALE;
use crate::domain::rating::Outcome;
use crate::domain::task::{SortOrder, TaskFigures, TaskFilter, TaskKeyset, TaskSort, TaskStatus};
use crate::domain::what_if::WhatIf;
use crate::store::binder::Binder;
use crate::store::cost::EnergyRow;
use crate::store::cost::MfuRow;
use crate::store::prices::{PER_HOUR, PriceJoin, UNRATED_REASON, summed_priced};
use crate::store::records::{RecordRow, record_row, select_records};
use crate::store::rollups::{
    ENERGY_SUMS, Level, PRICED_SUMS, PeriodSplit, TASK_SUMS, delete_by_keys, summed,
    summed_energy_sql,
};

/// The summed columns filled from segments, with the expression over a segment change
/// (`sign` and the `rated_segments` columns, with the figures of an old segment negated)
/// each adds.
const SEGMENT_SUMS: [(&str, &str); 9] = [
    ("segments", "sign"),
    ("card_seconds", "coalesce(card_seconds, 0)"),
    ("productive_seconds", "productive_seconds"),
    ("idle_seconds", "idle_seconds"),
    ("unmeasured_seconds", "unmeasured_seconds"),
    ("failed_seconds", "failed_seconds"),
    ("gpu_seconds_held", "gpu_seconds_held"),
    ("gpu_seconds_busy", "coalesce(gpu_seconds_busy, 0)"),
    (
        "unrated_gpu_seconds",
        "CASE WHEN contract_id IS NULL THEN gpu_seconds_held ELSE 0 END",
    ),
];

/// The columns a task's row is kept by besides the task and month: the contract, model and
/// billing mode of its segments (a contract has one model and mode, so they add no rows); a
/// row of per-record figures has none of them.
const PRICED_BY: &str = "contract_id, gpu_model, billing_mode";

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
    // The energy sums of a segment change come after the others, as `task_monthly` has them.
    let energy = crate::store::rollups::energy_sum_expressions("");
    let segment_sums: Vec<(&str, &str)> = SEGMENT_SUMS
        .iter()
        .copied()
        .chain(
            energy
                .iter()
                .map(|(expression, name)| (*name, expression.as_str())),
        )
        .collect();
    let all: Vec<(&str, &str)> = segment_sums.iter().chain(&RECORD_SUMS).copied().collect();
    let names: Vec<&str> = all.iter().map(|(name, _)| *name).collect();
    let branch = |own: &[(&str, &str)]| {
        all.iter()
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
        "SELECT project_id, task_id, {month} AS month, {segment_key}, {segment_columns} \
         FROM {segments} \
         UNION ALL \
         SELECT project_id, task_id, {month} AS month, NULL::uuid, NULL::text, NULL::text, \
                {record_columns} \
         FROM (SELECT *, end_hour AS hour FROM {records}) AS ended",
        segment_key = SEGMENT_KEY,
        segment_columns = branch(&segment_sums),
        record_columns = branch(&RECORD_SUMS),
    );
    // Output per unit of each task and month, left out where it nets to zero.
    let outputs = format!(
        "SELECT project_id, task_id, month, {PRICED_BY}, \
                jsonb_object_agg(output_unit, quantity) AS output \
         FROM (SELECT project_id, task_id, {month} AS month, {SEGMENT_KEY}, output_unit, \
                      sum(output_quantity) AS quantity \
               FROM {segments} WHERE output_quantity IS NOT NULL \
               GROUP BY 1, 2, 3, 4, 5, 6, 7 HAVING sum(output_quantity) <> 0) AS units \
         GROUP BY 1, 2, 3, 4, 5, 6"
    );
    format!(
        "task_changes AS ( \
           INSERT INTO task_monthly AS t \
             (project_id, task_id, month, {PRICED_BY}, {columns}, output) \
           SELECT sums.project_id, sums.task_id, sums.month, sums.contract_id, sums.gpu_model, \
                  sums.billing_mode, {columns}, coalesce(outputs.output, '{{}}') \
           FROM (SELECT project_id, task_id, month, {PRICED_BY}, {totals} \
                 FROM ({changed}) AS changed \
                 GROUP BY 1, 2, 3, 4, 5, 6) AS sums \
           LEFT JOIN ({outputs}) AS outputs \
             ON (outputs.project_id, outputs.task_id, outputs.month) \
                = (sums.project_id, sums.task_id, sums.month) \
            AND (outputs.contract_id, outputs.gpu_model, outputs.billing_mode) \
                IS NOT DISTINCT FROM (sums.contract_id, sums.gpu_model, sums.billing_mode) \
           WHERE ({columns}) <> ({zeros}) OR outputs.output IS NOT NULL \
           ON CONFLICT ON CONSTRAINT task_monthly_key DO UPDATE SET {updates}, \
             output = CASE WHEN EXCLUDED.output = '{{}}' THEN t.output \
                           ELSE add_quantities(t.output, EXCLUDED.output) END \
           RETURNING t.project_id, t.month, t.task_id, t.contract_id, t.gpu_model, \
                     t.billing_mode, (t.segments, t.attempts) = (0, 0) AS emptied)"
    )
}

/// [`PRICED_BY`] of a segment change.
const SEGMENT_KEY: &str = "contract_id, gpu_model, billing_mode";

/// The keys of the monthly rows [`add_changes`] left empty, as a `jsonb` array column:
/// [`Settlement`] deletes them.
pub fn emptied_rows() -> &'static str {
    "(SELECT coalesce(jsonb_agg(c), '[]') FROM task_changes c WHERE emptied)"
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
    /// Keys of the monthly rows left empty, a JSON array (see [`emptied_rows`]).
    emptied: serde_json::Value,
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
    pub fn emptied(&mut self, (rows,): (serde_json::Value,)) {
        self.emptied = rows;
    }

    /// CTEs storing the tasks' status and deleting their emptied rows, their values bound
    /// to `binder`.
    pub fn ctes(&self, binder: &mut Binder) -> String {
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
             emptied AS ({emptied})",
            projects = binder.bind(&self.projects),
            task_ids = binder.bind(&self.task_ids),
            statuses = binder.bind(&self.statuses),
            completed = binder.bind(&self.completed_at),
            started = binder.bind(&self.first_started_at),
            ended = binder.bind(&self.last_ended_at),
            first_model = binder.bind(&self.first_model),
            last_model = binder.bind(&self.last_model),
            models = binder.bind(&self.models),
            emptied = delete_by_keys(
                "task_monthly",
                (
                    "project_id, month, task_id, contract_id, gpu_model, billing_mode",
                    3
                ),
                "t.segments = 0 AND t.attempts = 0",
                &format!("{}::jsonb", binder.bind(&self.emptied)),
            ),
        )
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
/// row set `f` holding one row per task joined to its `outputs` ([`outputs_cte`]; `output`
/// as `output_units` and `output_quantities`).
fn figure_columns() -> String {
    let money = ["productive", "idle", "unmeasured", "failed"]
        .into_iter()
        .map(|column| format!("round(f.{column} / {PER_HOUR}, {SUM_SCALE}) AS {column}"));
    let rounded = [
        "gpu_seconds_held",
        "gpu_seconds_busy",
        "unrated_gpu_seconds",
        "queue_wait_seconds",
    ]
    .into_iter()
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
    money
        .chain(rounded)
        .chain(counted)
        .chain([
            "coalesce(outputs.units, '{}') AS output_units".to_owned(),
            "coalesce(outputs.quantities, '{}') AS output_quantities".to_owned(),
        ])
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns of a task's rows before they are priced, over `task_monthly` or
/// `task_hourly` (`{month}` standing for the row's ledger month).
fn unpriced_columns(prefix: &str) -> String {
    let sums = TASK_SUMS
        .iter()
        .map(|column| format!("{prefix}{column}"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{prefix}task_id, {prefix}project_id, {{month}} AS month, {prefix}contract_id, \
         {prefix}gpu_model, {prefix}billing_mode, {sums}"
    )
}

/// CTEs `rows` (the task rows `rows`, SQL of [`unpriced_columns`], each with its price) and
/// `f`: one row per `group` (`task_id`, or `task_id, month`) of them, holding the sums of
/// their figures, the card-seconds priced per contract and ledger month as `what_if` says.
/// Money is summed as Σ seconds × price, 3600 times the money, and divided once where a row
/// is shown ([`figure_columns`]): it sorts tasks as the money does. Outputs are summed apart
/// ([`outputs_cte`]), for the groups that are shown.
fn priced_ctes(binder: &mut Binder, what_if: &WhatIf, rows: &str, group: &str) -> String {
    let price = PriceJoin::new(binder, what_if, "r");
    let money = PRICED_SUMS
        .iter()
        .map(|sum| format!("coalesce({}, 0) AS {}", sum.summed_times_3600(), sum.money))
        .collect::<Vec<_>>()
        .join(", ");
    let counted = summed(&[
        "gpu_seconds_held",
        "gpu_seconds_busy",
        "attempts",
        "failed_attempts",
        "retries",
        "failures",
        "queue_wait_seconds",
        "queue_waits",
    ]);
    format!(
        "rows AS ( \
           SELECT r.*, {prices} FROM ({rows}) AS r {joins}), \
         f AS ( \
           SELECT {group}, {money}, {counted}, \
                  sum(CASE WHEN price IS NULL THEN gpu_seconds_held ELSE 0 END) \
                      AS unrated_gpu_seconds \
           FROM rows \
           GROUP BY {group})",
        prices = price.prices(),
        joins = price.joins(),
    )
}

/// The CTE `outputs`: per `group` of the CTE `rows` ([`priced_ctes`]) among the groups of
/// `shown` (a CTE or table with the `group` columns), its output units and quantities, each
/// unit's quantities summed.
fn outputs_cte(group: &str, shown: &str) -> String {
    let columns: Vec<&str> = group.split(", ").collect();
    let qualified = |of: &str| {
        columns
            .iter()
            .map(|column| format!("{of}.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "outputs AS ( \
           SELECT {group}, array_agg(unit ORDER BY unit) AS units, \
                  array_agg(quantity ORDER BY unit) AS quantities \
           FROM (SELECT {rows_group}, o.unit, \
                        round(sum(o.quantity::numeric), {SUM_SCALE}) AS quantity \
                 FROM rows JOIN {shown} USING ({group}), \
                      jsonb_each_text(rows.output) AS o(unit, quantity) \
                 GROUP BY {rows_group}, o.unit HAVING sum(o.quantity::numeric) <> 0) AS units \
           GROUP BY {group})",
        rows_group = qualified("rows"),
    )
}

/// CTEs ending in `f`: one row per task of the project `project` with a segment or an ended
/// attempt in the period, holding the sums of its figures over the period: its whole
/// months' rows of `task_monthly` and its other hours' rows of `task_hourly`.
fn period_ctes(
    binder: &mut Binder,
    project: &str,
    split: &PeriodSplit,
    tz: Tz,
    what_if: &WhatIf,
) -> String {
    let project = format!("= {}", binder.bind(project.to_owned()));
    let zone = binder.bind(tz.name().to_owned());
    let rows = split.months_and_hours_sql(
        binder,
        "task",
        &unpriced_columns(""),
        ("month", "hour"),
        &project,
        &zone,
    );
    priced_ctes(binder, what_if, &rows, "task_id")
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
    let mut binder = Binder::new();
    let split = PeriodSplit::new(period, tz, true);
    let sql = format!(
        "WITH {ctes}, {outputs} \
         SELECT f.task_id, {columns} FROM f LEFT JOIN outputs USING (task_id) \
         ORDER BY f.task_id",
        ctes = period_ctes(&mut binder, project, &split, tz, &WhatIf::default()),
        outputs = outputs_cte("task_id", "f"),
        columns = figure_columns(),
    );
    // Dynamic: the rollup levels are the period's, and the prices joined through the binder.
    let rows = binder.query_as::<TaskRow>(&sql)?.fetch_all(conn).await?;
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
/// `after`, their money priced as `what_if` says. Prices apply when read, so every task of
/// the period is priced before the page is cut.
pub async fn list(
    conn: &mut PgConnection,
    query: &ListQuery<'_>,
    tz: Tz,
    what_if: &WhatIf,
) -> sqlx::Result<Vec<ListedTask>> {
    let split = PeriodSplit::new(query.period, tz, true);
    let mut binder = Binder::new();
    let ctes = period_ctes(&mut binder, query.project, &split, tz, what_if);
    let project = binder.bind(query.project.to_owned());
    let mut filters = vec!["t.status IS NOT NULL".to_owned()];
    if let Some(status) = query.filter.status {
        filters.push(format!("t.status = {}", binder.bind(status.as_str())));
    }
    if let Some(model) = &query.filter.gpu_model {
        filters.push(format!(
            "{} = ANY(t.gpu_models)",
            binder.bind(model.clone())
        ));
    }
    if !query.filter.labels.is_empty() {
        filters.push(format!(
            "EXISTS (SELECT 1 FROM job_records r \
                     WHERE (r.project_id, r.task_id) = (t.project_id, t.task_id) \
                       AND r.labels @> {}::jsonb)",
            binder.bind(sqlx::types::Json(query.filter.labels.clone()))
        ));
    }
    let value = sort_value(query.sort);
    let mut conditions = vec!["true".to_owned()];
    let (beyond, tie_beyond, order, tie_order) = match query.order {
        SortOrder::Desc => ("<", ">", "DESC", "ASC"),
        SortOrder::Asc => (">", "<", "ASC", "DESC"),
    };
    if let Some(after) = query.after {
        let key = binder.bind(after.value.clone());
        let task = binder.bind(after.task_id.clone());
        conditions.push(format!(
            "{value} {beyond}= {key}::numeric \
             AND ({value} {beyond} {key}::numeric OR f.task_id {tie_beyond} {task})"
        ));
    }
    let limit = binder.bind(query.limit);
    // The page is cut before the outputs of its tasks are summed.
    let sql = format!(
        "WITH {ctes}, \
         page AS ( \
           SELECT f.*, t.status, t.completed_at, t.first_started_at, t.last_ended_at, \
                  t.gpu_models, {value} AS sort_value \
           FROM f JOIN tasks AS t ON t.project_id = {project} AND t.task_id = f.task_id \
           WHERE {filters} AND {conditions} \
           ORDER BY {value} {order}, f.task_id {tie_order} \
           LIMIT {limit}), \
         {outputs} \
         SELECT f.task_id, {columns}, f.status, f.completed_at, f.first_started_at, \
                f.last_ended_at, f.gpu_models, f.sort_value::text AS sort_key \
         FROM page AS f LEFT JOIN outputs USING (task_id) \
         ORDER BY f.sort_value {order}, f.task_id {tie_order}",
        outputs = outputs_cte("task_id", "page"),
        columns = figure_columns(),
        filters = filters.join(" AND "),
        conditions = conditions.join(" AND "),
    );
    // Dynamic: the filters are optional, the sort is the caller's, and the rollup levels
    // are the period's.
    let rows = binder.query_as::<ListedRow>(&sql)?.fetch_all(conn).await?;
    Ok(rows.into_iter().map(ListedTask::from).collect())
}

/// The figures of each of `task_ids` of `project` per ledger month, over every month they
/// have figures in, priced as `what_if` says: their lifetime is the sum of these.
pub async fn monthly_figures(
    conn: &mut PgConnection,
    project: &str,
    task_ids: &[String],
    tz: Tz,
    what_if: &WhatIf,
) -> sqlx::Result<Vec<(String, NaiveDate, TaskFigures)>> {
    let mut binder = Binder::new();
    let (project, ids, zone) = (
        binder.bind(project.to_owned()),
        binder.bind(task_ids.to_vec()),
        binder.bind(tz.name().to_owned()),
    );
    // A task's figures lie in the months from its first start to its last end, so its rows
    // are found by their key without an index by task.
    let rows = format!(
        "SELECT {columns} \
         FROM tasks AS t \
         CROSS JOIN LATERAL ( \
             SELECT * FROM task_monthly AS m \
             WHERE m.project_id = t.project_id AND m.task_id = t.task_id \
               AND m.month = ANY(ARRAY( \
                   SELECT generate_series( \
                       date_trunc('month', t.first_started_at AT TIME ZONE {zone}), \
                       date_trunc('month', t.last_ended_at AT TIME ZONE {zone}), \
                       interval '1 month')::date))) AS m \
         WHERE t.project_id = {project} AND t.task_id = ANY({ids})",
        columns = unpriced_columns("m.").replace("{month}", "m.month"),
    );
    let sql = format!(
        "WITH {ctes}, {outputs} \
         SELECT f.task_id, f.month, {columns} FROM f LEFT JOIN outputs USING (task_id, month) \
         ORDER BY f.task_id, f.month",
        ctes = priced_ctes(&mut binder, what_if, &rows, "task_id, month"),
        outputs = outputs_cte("task_id, month", "f"),
        columns = figure_columns(),
    );
    // Dynamic: the prices (a what-if's) are joined through the binder.
    let rows = binder.query_as::<MonthRow>(&sql)?.fetch_all(conn).await?;
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
    select_records!(
        "SELECT r.*, coalesce(d.completes_task, false) AS \"completes_task!\", \
                coalesce(d.fails_task, false) AS \"fails_task!\" \
         FROM (SELECT ",
        " FROM job_records WHERE project_id = $1 AND task_id = $2) AS r \
         LEFT JOIN rated_records AS d USING (project_id, task_id, attempt) \
         ORDER BY r.attempt",
        project,
        task_id,
    )
    .try_map(|r| {
        Ok(AttemptRow {
            completes_task: r.completes_task,
            fails_task: r.fails_task,
            record: record_row!(r),
        })
    })
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
/// reason, by attempt, at the prices in force.
pub async fn attempt_pricing(
    conn: &mut PgConnection,
    project: &str,
    task_id: &str,
    tz: Tz,
) -> sqlx::Result<Vec<AttemptPricing>> {
    let mut binder = Binder::new();
    let (project, task, zone) = (
        binder.bind(project.to_owned()),
        binder.bind(task_id.to_owned()),
        binder.bind(tz.name().to_owned()),
    );
    let price = PriceJoin::new(&mut binder, &WhatIf::default(), "g");
    let money = PRICED_SUMS
        .iter()
        .map(summed_priced)
        .collect::<Vec<_>>()
        .join(", ");
    let rounded = |column: &str| format!("round(sum({column}), {SUM_SCALE}) AS {column}");
    let sql = format!(
        "SELECT attempt, contract_id, contract_name, price_per_gpu_hour, contract_currency, \
                unrated_reason, sum(segments)::bigint AS segments, {held}, {busy}, {money} \
         FROM ( \
           SELECT attempt, contract_id, contract_name, price_per_gpu_hour, contract_currency, \
                  {UNRATED_REASON} AS unrated_reason, first_hour, segments, gpu_seconds_held, \
                  gpu_seconds_busy, card_seconds, productive_seconds, idle_seconds, \
                  unmeasured_seconds, failed_seconds, {energy}, price, power_price, \
                  energy_price, energy_priced \
           FROM ( \
             SELECT g.*, pc.name AS contract_name, pc.price_per_gpu_hour, \
                    pc.currency::text AS contract_currency, {columns} \
             FROM ( \
               SELECT s.project_id, s.attempt, s.contract_id, \
                      date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, \
                      NULL::text AS gpu_model, NULL::text AS billing_mode, \
                      min(s.hour) AS first_hour, count(*) AS segments, \
                      sum(s.gpu_seconds_held) AS gpu_seconds_held, \
                      sum(coalesce(s.gpu_seconds_busy, 0)) AS gpu_seconds_busy, \
                      sum(coalesce(s.card_seconds, 0)) AS card_seconds, \
                      sum(s.productive_seconds) AS productive_seconds, \
                      sum(s.idle_seconds) AS idle_seconds, \
                      sum(s.unmeasured_seconds) AS unmeasured_seconds, \
                      sum(s.failed_seconds) AS failed_seconds, {summed_energy} \
               FROM rated_segments AS s \
               WHERE s.project_id = {project} AND s.task_id = {task} \
               GROUP BY 1, 2, 3, 4) AS g \
             {joins}) AS with_prices) AS priced \
         GROUP BY 1, 2, 3, 4, 5, 6 \
         ORDER BY attempt, min(first_hour), contract_id, unrated_reason",
        held = rounded("gpu_seconds_held"),
        busy = rounded("gpu_seconds_busy"),
        energy = ENERGY_SUMS.join(", "),
        summed_energy = summed_energy_sql("s."),
        columns = price.columns(),
        joins = price.joins(),
    );
    // Dynamic: the prices are joined through the binder, as every report joins them.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// The measured energy and its emissions of each of `tasks` (those with any, keyed by task
/// id), over `period` or, without one, over their lifetime; as
/// `store::cost::energy_sums` reads them.
pub async fn energy(
    conn: &mut PgConnection,
    project: &str,
    tasks: &[String],
    period: Option<(DateTime<Utc>, DateTime<Utc>)>,
    tz: Tz,
) -> sqlx::Result<Vec<EnergyRow>> {
    let mut binder = Binder::new();
    let (project, tasks, zone) = (
        binder.bind(project.to_owned()),
        binder.bind(tasks.to_vec()),
        binder.bind(tz.name().to_owned()),
    );
    let within = match period {
        Some((from, to)) => format!(
            "AND s.hour >= {} AND s.hour < {}",
            binder.bind(from),
            binder.bind(to)
        ),
        None => String::new(),
    };
    let sql = format!(
        "SELECT s.task_id AS key, NULL::text AS output_unit, {sums} \
         FROM {segments} \
         WHERE s.project_id = {project} AND s.task_id = ANY({tasks}) \
           AND s.energy_joules IS NOT NULL {within} \
         GROUP BY 1",
        sums = crate::store::cost::energy_sums_columns(),
        segments = crate::store::cost::metered_segments(&zone),
    );
    // Dynamic: the period is an optional filter.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// The model FLOPs of `tasks` of `project` by task id, over their segments in `period` (or
/// all of them), for MFU.
pub async fn mfu(
    conn: &mut PgConnection,
    project: &str,
    tasks: &[String],
    period: Option<(DateTime<Utc>, DateTime<Utc>)>,
) -> sqlx::Result<Vec<MfuRow>> {
    let mut binder = Binder::new();
    let (project, tasks) = (binder.bind(project.to_owned()), binder.bind(tasks.to_vec()));
    let within = match period {
        Some((from, to)) => format!(
            "AND s.hour >= {} AND s.hour < {}",
            binder.bind(from),
            binder.bind(to)
        ),
        None => String::new(),
    };
    let sql = format!(
        "SELECT r.task_id AS key, {sums} \
         FROM job_records r JOIN rated_segments s USING (project_id, task_id, attempt) \
         WHERE r.project_id = {project} AND r.task_id = ANY({tasks}) \
           AND r.peak_flops IS NOT NULL {within} \
         GROUP BY 1",
        sums = crate::store::cost::mfu_sums_columns(),
    );
    // Dynamic: the period is an optional filter.
    binder.query_as(&sql)?.fetch_all(conn).await
}
