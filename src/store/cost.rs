//! Reading a project's cost for a period from the rollups (never from raw records): whole
//! ledger months from the monthly ones, other whole days from the daily ones, and the hours
//! left over from the hourly ones (see [`PeriodSplit`]).
//!
//! Sums come out of PostgreSQL exactly and are rounded to [`SUM_SCALE`] decimal places on the
//! way out: `Decimal` holds 28 significant digits, and a sum of 28-digit segment figures can
//! need more. At that scale every figure below 10^8 fits and every further addition in Rust
//! is exact, so groups add up exactly to their total.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::commitment::WholeDays;
use crate::domain::figures::{
    EnergySums, Grouping, MfuSums, QueueWait, RecordCounts, SUM_SCALE, SegmentSums,
};
use crate::domain::utilisation::{MetricSums, UtilSums};
use crate::domain::what_if::WhatIf;
use crate::store::binder::Binder;
use crate::store::in_snapshot;
use crate::store::numeric::Numeric;
use crate::store::prices::{
    PER_HOUR, PriceJoin, UNRATED_MODEL, UNRATED_REASON, summed_money, summed_priced,
};
use crate::store::rollups::{self, PeriodSplit, UTIL_SUMS};

/// Whose figures a query reads, and how they are grouped.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// One project's, in the groups of a grouping.
    Project(&'a str, &'a Grouping),
    /// Every project's over the whole period, one group per project keyed by its id: every
    /// project there is, whose ids the caller read (on the same snapshot).
    EveryProject(&'a [String]),
}

impl Scope<'_> {
    fn grouping(&self) -> &Grouping {
        match self {
            Scope::Project(_, grouping) => grouping,
            Scope::EveryProject(_) => &Grouping::Whole,
        }
    }

    /// The condition on `project_id`: the project bound to `binder`, or every project, bound
    /// as an array. The rollups are then read through their project-leading keys rather than
    /// scanned whole; and on Citus the array reaches each shard as a constant, which
    /// PostgreSQL looks rows up in by hash (an `ARRAY(SELECT id FROM projects)` there is
    /// evaluated on every shard and searched row by row: 230 ms instead of 20 for the record
    /// counts of 1,000 projects).
    fn projects(&self, binder: &mut Binder) -> String {
        match self {
            Scope::Project(project, _) => format!("= {}", binder.bind(project.to_string())),
            Scope::EveryProject(ids) => format!("= ANY({}::text[])", binder.bind(ids.to_vec())),
        }
    }

    /// How the period is read from the rollups.
    fn split(&self, period: (DateTime<Utc>, DateTime<Utc>), tz: Tz) -> PeriodSplit {
        PeriodSplit::new(period, tz, *self.grouping() != Grouping::Day)
    }

    /// The group key over the monthly, daily and hourly rollups; `extra` is the placeholder
    /// of the ledger time zone or the label key.
    fn rollup_keys(&self, extra: &str) -> (String, String, String) {
        match self {
            Scope::Project(_, grouping) => (
                month_key(grouping, extra),
                day_key(grouping, extra),
                key_expression(grouping, "hour", "", extra),
            ),
            Scope::EveryProject(_) => (
                "project_id".to_owned(),
                "project_id".to_owned(),
                "project_id".to_owned(),
            ),
        }
    }
}

/// Sums of segments of one group and kind.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct CostSums {
    pub key: Option<String>,
    pub completed: bool,
    pub unrated_reason: Option<String>,
    /// Set for unrated segments only.
    pub gpu_model: Option<String>,
    pub output_unit: Option<String>,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Decimal,
    pub cost: Decimal,
    pub productive: Decimal,
    pub idle: Decimal,
    pub unmeasured: Decimal,
    pub failed: Decimal,
    pub output_quantity: Decimal,
}

impl CostSums {
    /// The group key and the sums it holds.
    pub fn into_parts(self) -> (Option<String>, SegmentSums) {
        (
            self.key,
            SegmentSums {
                completed: self.completed,
                unrated: self.unrated_reason.zip(self.gpu_model),
                output_unit: self.output_unit,
                gpu_seconds_held: self.gpu_seconds_held,
                gpu_seconds_busy: self.gpu_seconds_busy,
                cost: self.cost,
                productive: self.productive,
                idle: self.idle,
                unmeasured: self.unmeasured,
                failed: self.failed,
                output_quantity: self.output_quantity,
            },
        )
    }
}

/// Per-record counts of one group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RecordSums {
    pub key: Option<String>,
    pub records: i64,
    pub retries: i64,
    pub failures: i64,
    pub tasks_completed: i64,
    pub tasks_failed: i64,
}

impl RecordSums {
    /// The group key and the counts it holds.
    pub fn into_parts(self) -> (Option<String>, RecordCounts) {
        (
            self.key,
            RecordCounts {
                retries: self.retries,
                failures: self.failures,
                tasks_completed: self.tasks_completed,
                tasks_failed: self.tasks_failed,
            },
        )
    }
}

/// Queue wait of one group's attempts, or of the whole period's.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct QueueWaitSums {
    pub key: Option<String>,
    /// This row is the whole period's, not a group's (whose key may be null too).
    pub whole: bool,
    pub attempts: i64,
    pub p50_seconds: Decimal,
    pub p95_seconds: Decimal,
    pub total_seconds: Decimal,
}

impl QueueWaitSums {
    /// The group key and its queue wait.
    pub fn into_parts(self) -> (Option<String>, QueueWait) {
        (
            self.key,
            QueueWait {
                attempts: self.attempts,
                p50_seconds: self.p50_seconds,
                p95_seconds: self.p95_seconds,
                total_seconds: self.total_seconds,
            },
        )
    }
}

/// The SQL expression of a group's key over a table with `hour`, `gpu_model`,
/// `billing_mode` and `outcome`; `extra` is the placeholder of the ledger time zone (for
/// days and months) or of the label key (for labels, read from the records `r`).
fn key_expression(grouping: &Grouping, hour: &str, prefix: &str, extra: &str) -> String {
    match grouping {
        Grouping::Whole => "NULL::text".to_owned(),
        Grouping::Day => format!("to_char({prefix}{hour} AT TIME ZONE {extra}, 'YYYY-MM-DD')"),
        Grouping::Month => format!("to_char({prefix}{hour} AT TIME ZONE {extra}, 'YYYY-MM')"),
        Grouping::GpuModel => format!("{prefix}gpu_model"),
        Grouping::BillingMode => format!("{prefix}billing_mode"),
        Grouping::GpuModelAndBillingMode => {
            format!("{prefix}gpu_model || '/' || {prefix}billing_mode")
        }
        Grouping::Outcome => format!("{prefix}outcome"),
        Grouping::Label(_) => format!("r.labels ->> {extra}"),
    }
}

/// The key expression over a daily rollup, whose `day` is already a ledger date.
fn day_key(grouping: &Grouping, extra: &str) -> String {
    match grouping {
        Grouping::Day => "to_char(day, 'YYYY-MM-DD')".to_owned(),
        Grouping::Month => "to_char(day, 'YYYY-MM')".to_owned(),
        _ => key_expression(grouping, "day", "", extra),
    }
}

/// The key expression over a monthly rollup, whose `month` is the first day of a ledger
/// month. Grouping by day never reads months.
fn month_key(grouping: &Grouping, extra: &str) -> String {
    match grouping {
        Grouping::Day => "NULL::text".to_owned(),
        Grouping::Month => "to_char(month, 'YYYY-MM')".to_owned(),
        _ => key_expression(grouping, "month", "", extra),
    }
}

/// The placeholder of what a grouping's key needs besides the row: the ledger time zone, or
/// the label key; bound to `binder`, with the time zone's placeholder.
fn key_parameters(binder: &mut Binder, grouping: &Grouping, tz: Tz) -> (String, String) {
    let zone = binder.bind(tz.name().to_owned());
    let extra = match grouping {
        Grouping::Label(key) => binder.bind(key.clone()),
        _ => zone.clone(),
    };
    (zone, extra)
}

/// `round(coalesce(sum(column), 0), SUM_SCALE) AS column` for each of `columns`.
fn rounded_sums<'a>(columns: impl IntoIterator<Item = &'a str>) -> String {
    columns
        .into_iter()
        .map(|column| format!("round(coalesce(sum({column}), 0), {SUM_SCALE}) AS {column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Segment sums of the scope over `[from, to)` (ledger hour boundaries), by group and by
/// whether they completed, the reason and model of unrated ones and the output unit of
/// completed ones; the card-seconds priced per contract and ledger month at the prices in
/// force, or at `what_if`'s.
pub async fn cost_sums(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    what_if: &WhatIf,
) -> sqlx::Result<Vec<CostSums>> {
    let mut binder = Binder::new();
    let grouping = scope.grouping();
    let projects = scope.projects(&mut binder);
    let (zone, extra) = key_parameters(&mut binder, grouping, tz);
    let sums = rollups::COST_KIND_SUMS.join(", ");
    // Rows with the key, the project and ledger month, what prices them and the sums.
    let rows: Vec<RowSet> = match grouping {
        // Labels live on the records, so grouping by one reads the period's segments.
        Grouping::Label(_) => {
            let (from, to) = (binder.bind(period.0), binder.bind(period.1));
            vec![RowSet::Select(format!(
                "SELECT {key} AS key, s.project_id, \
                        date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, {kinds}, \
                        {columns} \
                 FROM rated_segments s \
                 JOIN job_records r USING (project_id, task_id, attempt) \
                 WHERE s.project_id {projects} AND s.hour >= {from} AND s.hour < {to}",
                key = key_expression(grouping, "hour", "s.", &extra),
                kinds = rollups::segment_kinds_sql("s."),
                columns = rollups::segment_sums_sql("s."),
            ))]
        }
        _ => {
            let (month_keys, day_keys, hour_keys) = scope.rollup_keys(&extra);
            // Every project's whole months come from their sums by kind, which compaction
            // keeps, and the monthly delta rows it has not folded in yet, each table read as
            // the priced set's own rows.
            let months = |first: &str, end: &str| {
                let month = |table, delta: &str, kinds| RowSet::Table {
                    table,
                    kinds,
                    filter: format!("{delta}g.month >= {first} AND g.month < {end}"),
                };
                vec![
                    month("cost_monthly_kinds", "", "g.completed, g.output_unit"),
                    month(
                        "cost_monthly",
                        "g.delta <> 0 AND ",
                        "g.outcome = 'completed' AS completed, \
                         CASE WHEN g.outcome = 'completed' THEN g.output_unit END AS output_unit",
                    ),
                ]
            };
            scope.split(period, tz).row_sets_with_months(
                &mut binder,
                "cost",
                &format!(
                    "{{key}} AS key, project_id, {{month}} AS month, {}, {sums}",
                    rollups::segment_kinds_sql("")
                ),
                (&month_keys, &day_keys, &hour_keys),
                &projects,
                &zone,
                match scope {
                    Scope::EveryProject(_) => Some(&months),
                    Scope::Project(..) => None,
                },
            )
        }
    };
    let sql = priced_cost_sums(&mut binder, &rows, what_if);
    // Dynamic: the group key is the grouping's, the rollup levels the period's, and the
    // prices (a what-if's) are joined through the binder.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// A set of rows [`priced_cost_sums`] prices, read as `g`.
#[derive(Debug, Clone)]
enum RowSet {
    /// A `SELECT` of a key, the project and ledger month, the [`rollups::SEGMENT_KINDS`] and
    /// the [`rollups::COST_KIND_SUMS`].
    Select(String),
    /// Every project's rows of a monthly cost rollup `table` that meet `filter` (over `g`),
    /// keyed by project, with `kinds` the expressions of `completed` and `output_unit`. Read
    /// as the table itself rather than through a subquery: on Citus a `UNION ALL` of sets
    /// that each join a subquery to the price tables (reference tables) is planned set by set,
    /// each set's sums written to the coordinator and added there; over the tables
    /// themselves it runs whole on the workers, each shard's projects summed where they are.
    Table {
        table: &'static str,
        kinds: &'static str,
        filter: String,
    },
}

impl From<String> for RowSet {
    fn from(select: String) -> Self {
        RowSet::Select(select)
    }
}

impl RowSet {
    /// The `FROM` item read as `g`, the key, `completed` and `output_unit` over it, and the
    /// `WHERE` clause of its rows (empty for a `SELECT`, which has its own).
    fn parts(&self) -> (String, String, String) {
        match self {
            RowSet::Select(select) => (
                format!("({select}) AS g"),
                "g.key, g.completed, g.output_unit".to_owned(),
                String::new(),
            ),
            RowSet::Table {
                table,
                kinds,
                filter,
            } => (
                format!("{table} AS g"),
                format!("g.project_id AS key, {kinds}"),
                format!("WHERE {filter}"),
            ),
        }
    }
}

/// [`CostSums`] of the row sets `rows`, priced per contract and ledger month.
///
/// Pricing is linear, so the rows are priced as they come, each once, and summed by what a
/// figure tells apart; every money figure is divided by 3600 once, at the end. Each set is
/// priced and summed on its own (exact `numeric` sums, money still times 3600), and the
/// sets' sums are added: on Citus each set's statement runs on the workers, grouped by
/// project there, where a join of the sets' `UNION ALL` would first bring every row to the
/// coordinator.
fn priced_cost_sums(binder: &mut Binder, rows: &[RowSet], what_if: &WhatIf) -> String {
    let price = PriceJoin::new(binder, what_if, "g");
    let money = rollups::PRICED_SUMS
        .iter()
        .map(|sum| {
            format!(
                "round(coalesce(sum({name}), 0) / {PER_HOUR}, {SUM_SCALE}) AS {name}",
                name = sum.money
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "SELECT key, completed, unrated_reason, gpu_model, output_unit, {rounded}, {money} \
         FROM ({sets}) AS sets \
         GROUP BY 1, 2, 3, 4, 5 HAVING sum(segments) > 0",
        rounded = rounded_sums(["gpu_seconds_held", "gpu_seconds_busy", "output_quantity"]),
        sets = rows
            .iter()
            .map(|set| priced_row_set(&price, set))
            .collect::<Vec<_>>()
            .join(" UNION ALL "),
    )
}

/// One set of [`priced_cost_sums`], priced and summed by what a figure tells apart, the
/// money still times 3600.
fn priced_row_set(price: &PriceJoin, rows: &RowSet) -> String {
    let (from, keys, filter) = rows.parts();
    let sums = [
        "segments",
        "gpu_seconds_held",
        "gpu_seconds_busy",
        "output_quantity",
    ]
    .iter()
    .map(|column| format!("sum({column}) AS {column}"))
    .chain(
        rollups::PRICED_SUMS
            .iter()
            .map(|sum| format!("{} AS {}", sum.summed_times_3600(), sum.money)),
    )
    .collect::<Vec<_>>()
    .join(", ");
    format!(
        "SELECT key, completed, {UNRATED_REASON} AS unrated_reason, \
                {UNRATED_MODEL} AS gpu_model, output_unit, {sums} \
         FROM ( \
           SELECT {keys}, g.segments, g.gpu_seconds_held, \
                  g.gpu_seconds_busy, g.card_seconds, g.productive_seconds, g.idle_seconds, \
                  g.unmeasured_seconds, g.failed_seconds, g.output_quantity, \
                  {energy}, {columns} \
           FROM {from} {joins} {filter}) AS priced \
         GROUP BY 1, 2, 3, 4, 5",
        energy = rollups::ENERGY_SUMS
            .iter()
            .map(|column| format!("g.{column}"))
            .collect::<Vec<_>>()
            .join(", "),
        columns = price.columns(),
        joins = price.joins(),
    )
}

/// The records of a workload: those labelled `workload=<name>`, and those without a
/// `workload` label whose task id is the name (`r` is `job_records`).
pub fn workload_records(workload: &str) -> String {
    format!("coalesce(r.labels ->> 'workload', r.task_id) = {workload}")
}

/// Segment sums of one workload of `project` in each of two periods, keyed
/// `<side>|<gpu_model>|<billing_mode>` where the side is `baseline` or `period` (a segment in
/// both periods counts in the baseline), priced at the prices in force.
pub async fn workload_sums(
    conn: &mut PgConnection,
    project: &str,
    workload: &str,
    baseline: (DateTime<Utc>, DateTime<Utc>),
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<CostSums>> {
    let mut binder = Binder::new();
    let project = binder.bind(project.to_owned());
    let workload = binder.bind(workload.to_owned());
    let zone = binder.bind(tz.name().to_owned());
    let (bf, bt) = (binder.bind(baseline.0), binder.bind(baseline.1));
    let (pf, pt) = (binder.bind(period.0), binder.bind(period.1));
    let rows = format!(
        "SELECT CASE WHEN s.hour >= {bf} AND s.hour < {bt} THEN 'baseline' ELSE 'period' END \
                || '|' || s.gpu_model || '|' || s.billing_mode AS key, s.project_id, \
                date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, {kinds}, \
                {columns} \
         FROM rated_segments s \
         JOIN job_records r USING (project_id, task_id, attempt) \
         WHERE s.project_id = {project} \
           AND ((s.hour >= {bf} AND s.hour < {bt}) OR (s.hour >= {pf} AND s.hour < {pt})) \
           AND {of_workload}",
        kinds = rollups::segment_kinds_sql("s."),
        columns = rollups::segment_sums_sql("s."),
        of_workload = workload_records(&workload),
    );
    let sql = priced_cost_sums(&mut binder, &[RowSet::Select(rows)], &WhatIf::default());
    // Dynamic: the priced sums are assembled through the binder, with the prices joined as
    // every report joins them.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// Segment sums of the attempts of the given workloads of `project` that ended in
/// `[from, to)`, keyed `<ledger day of the end>|<workload>` (the day as `YYYY-MM-DD`): each
/// attempt whole on the day it ended, with its output, priced at the prices in force.
pub async fn daily_workload_sums(
    conn: &mut PgConnection,
    project: &str,
    workloads: &[String],
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<CostSums>> {
    let mut binder = Binder::new();
    let project = binder.bind(project.to_owned());
    let workloads = binder.bind(workloads.to_vec());
    let zone = binder.bind(tz.name().to_owned());
    let (from, to) = (binder.bind(from), binder.bind(to));
    let rows = format!(
        "SELECT to_char((r.ended_at AT TIME ZONE {zone})::date, 'YYYY-MM-DD') || '|' \
                || coalesce(r.labels ->> 'workload', r.task_id) AS key, s.project_id, \
                date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, {kinds}, \
                {columns} \
         FROM rated_records d \
         JOIN job_records r USING (project_id, task_id, attempt) \
         JOIN rated_segments s USING (project_id, task_id, attempt) \
         WHERE d.project_id = {project} \
           AND d.end_hour >= {from}::timestamptz - interval '1 hour' AND d.end_hour < {to} \
           AND r.ended_at >= {from} AND r.ended_at < {to} AND s.hour < {to} \
           AND coalesce(r.labels ->> 'workload', r.task_id) = ANY({workloads})",
        kinds = rollups::segment_kinds_sql("s."),
        columns = rollups::segment_sums_sql("s."),
    );
    let sql = priced_cost_sums(&mut binder, &[RowSet::Select(rows)], &WhatIf::default());
    // Dynamic: the priced sums are assembled through the binder, with the prices joined as
    // every report joins them.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// Attempts of a workload that ended in a period: how many, how many did not complete, and
/// their retries.
#[derive(Debug, Clone, Default, sqlx::FromRow)]
pub struct WorkloadAttempts {
    pub attempts: i64,
    pub failed_attempts: i64,
    pub retries: i64,
    pub tasks: i64,
}

/// The attempts of one workload of `project` that ended in `[from, to)`.
pub async fn workload_attempts(
    conn: &mut PgConnection,
    project: &str,
    workload: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> sqlx::Result<WorkloadAttempts> {
    sqlx::query_as!(
        WorkloadAttempts,
        "SELECT count(*) AS \"attempts!\", \
                count(*) FILTER (WHERE r.outcome <> 'completed') AS \"failed_attempts!\", \
                coalesce(sum(r.retries), 0)::bigint AS \"retries!\", \
                count(DISTINCT r.task_id) AS \"tasks!\" \
         FROM job_records r \
         WHERE r.project_id = $1 AND r.ended_at >= $3 AND r.ended_at < $4 \
           AND coalesce(r.labels ->> 'workload', r.task_id) = $2",
        project,
        workload,
        from,
        to,
    )
    .fetch_one(conn)
    .await
}

/// Per-record counts of the scope for the records that ended in `[from, to)`, by group.
pub async fn record_sums(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<RecordSums>> {
    let mut binder = Binder::new();
    let grouping = scope.grouping();
    let projects = scope.projects(&mut binder);
    let (zone, extra) = key_parameters(&mut binder, grouping, tz);
    let sql = match grouping {
        Grouping::Label(_) => {
            let (from, to) = (binder.bind(period.0), binder.bind(period.1));
            format!(
                "SELECT {key} AS key, count(*) AS records, sum(d.retries)::bigint AS retries, \
                        sum(d.failures)::bigint AS failures, \
                        count(*) FILTER (WHERE d.completes_task) AS tasks_completed, \
                        count(*) FILTER (WHERE d.fails_task) AS tasks_failed \
                 FROM rated_records d \
                 JOIN job_records r USING (project_id, task_id, attempt) \
                 WHERE d.project_id {projects} AND d.end_hour >= {from} AND d.end_hour < {to} \
                 GROUP BY 1",
                key = key_expression(grouping, "end_hour", "d.", &extra),
            )
        }
        _ => {
            let (month_keys, day_keys, hour_keys) = scope.rollup_keys(&extra);
            format!(
                "SELECT key, sum(records)::bigint AS records, sum(retries)::bigint AS retries, \
                        sum(failures)::bigint AS failures, \
                        sum(tasks_completed)::bigint AS tasks_completed, \
                        sum(tasks_failed)::bigint AS tasks_failed \
                 FROM ({rows}) AS rows \
                 GROUP BY 1 HAVING sum(records) > 0",
                rows = scope.split(period, tz).rows_sql(
                    &mut binder,
                    "records",
                    "{key} AS key, records, retries, failures, tasks_completed, tasks_failed",
                    (&month_keys, &day_keys, &hour_keys),
                    &projects,
                    &zone,
                ),
            )
        }
    };
    // Dynamic: the group key is the grouping's and the rollup levels the period's.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// Queue wait of the attempts of `project` that started in `[from, to)` and reported
/// `queued_at`, by group and for the whole period (the row marked `whole`); percentiles are
/// PostgreSQL's `percentile_disc`, exact and by nearest rank. Groups, and the whole, where no
/// attempt reported it have no row.
pub async fn queue_waits(
    conn: &mut PgConnection,
    project: &str,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    grouping: &Grouping,
    tz: Tz,
) -> sqlx::Result<Vec<QueueWaitSums>> {
    // Percentiles of the whole cannot be had from those of its groups, so the whole is a
    // grouping set of its own.
    let (key_column, whole, sets) = match grouping {
        Grouping::Whole => ("NULL::text", "true", "()"),
        _ => ("key", "grouping(key) = 1", "(key), ()"),
    };
    let mut binder = Binder::new();
    let project = binder.bind(project.to_owned());
    let (from, to) = (binder.bind(from), binder.bind(to));
    let (_, extra) = key_parameters(&mut binder, grouping, tz);
    // Waits are sorted and summed as intervals, which compare faster than numeric seconds;
    // `extract` then gives the exact numeric seconds (to the microsecond) of the results.
    // An attempt belongs to the group holding its start.
    let sql = format!(
        "SELECT {key_column} AS key, {whole} AS whole, count(*) AS attempts, \
                extract(epoch FROM percentile_disc(0.5) WITHIN GROUP (ORDER BY wait)) \
                    AS p50_seconds, \
                extract(epoch FROM percentile_disc(0.95) WITHIN GROUP (ORDER BY wait)) \
                    AS p95_seconds, \
                extract(epoch FROM sum(wait)) AS total_seconds \
         FROM (SELECT {key} AS key, r.started_at - r.queued_at AS wait \
               FROM job_records r \
               WHERE r.project_id = {project} AND r.started_at >= {from} \
                 AND r.started_at < {to} AND r.queued_at IS NOT NULL) AS waits \
         GROUP BY GROUPING SETS ({sets}) HAVING count(*) > 0",
        key = key_expression(grouping, "started_at", "r.", &extra),
    );
    // Dynamic: the group key and its grouping sets are the grouping's.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// A reservation's usage over a window, as [`contract_usage`] reads it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ContractUsage {
    /// GPU-seconds rated per ledger hour, in hour order, without the hours of `capped_days`.
    pub hours: Vec<(DateTime<Utc>, Decimal)>,
    /// For some of the contract's whole days, in day order: the sum over the day's hours of
    /// their GPU-seconds, each capped at the hour's commitment (see
    /// `domain::commitment::unused_commitment_by_day`).
    pub capped_days: Vec<(NaiveDate, Decimal)>,
}

/// The delta rows of reservations' usage that compaction has not folded into whole days yet,
/// summed by contract and hour: read by [`pending_usage`] apart from the days, for
/// [`contract_usage`] on the same snapshot.
#[derive(Debug, Default, Clone)]
pub struct PendingUsage {
    contracts: Vec<Uuid>,
    hours: Vec<DateTime<Utc>>,
    segments: Vec<i64>,
    /// As text, to be bound again exactly.
    used: Vec<String>,
}

/// The statement summing the delta rows of `contracts` over `[from, to)` by contract and
/// hour, with the placeholders of the three.
fn pending_sql((from, to, contracts): (&str, &str, &str)) -> String {
    format!(
        "SELECT contract_id, hour, sum(segments)::bigint AS segments, \
                sum(gpu_seconds_held) AS used \
         FROM contract_usage_hourly \
         WHERE contract_id = ANY({contracts}) AND hour >= {from} AND hour < {to} \
         GROUP BY contract_id, hour"
    )
}

/// The delta rows [`contract_usage`] reads of `contracts` over `[from, to)`, in a statement of
/// their own. `None` unless `conn` is in a transaction on one snapshot, where both statements
/// read the same rows whatever compaction commits between them.
///
/// On Citus the delta rows are spread over the workers and the whole days are a reference
/// table: read in one statement, the delta rows are gathered into an intermediate result sent
/// to every node and the days read against it; read first, they are handed to the days'
/// statement as arrays, which then reads the coordinator alone.
pub async fn pending_usage(
    conn: &mut PgConnection,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    contracts: &[Uuid],
) -> sqlx::Result<Option<PendingUsage>> {
    if !in_snapshot(&mut *conn).await? {
        return Ok(None);
    }
    let mut binder = Binder::new();
    let bounds = (
        binder.bind(from),
        binder.bind(to),
        binder.bind(contracts.to_vec()),
    );
    let sql = format!(
        "SELECT contract_id, hour, segments, used::text FROM ({}) AS h",
        pending_sql((&bounds.0, &bounds.1, &bounds.2))
    );
    // Dynamic: the same text as the delta rows' part of `contract_usage`'s single statement.
    let rows: Vec<(Uuid, DateTime<Utc>, i64, String)> =
        binder.query_as(&sql)?.fetch_all(conn).await?;
    let mut pending = PendingUsage::default();
    for (contract, hour, segments, used) in rows {
        pending.contracts.push(contract);
        pending.hours.push(hour);
        pending.segments.push(segments);
        pending.used.push(used);
    }
    Ok(Some(pending))
}

/// GPU-seconds each of `contracts` rated, per ledger hour of `[from, to)`, in hour order and
/// without hours whose segments are all gone. A month of a thousand reservations is hundreds
/// of thousands of hours, so they are read from the compacted rows of whole ledger days,
/// whose hours come as arrays (migrations 0012 and 0015), and the delta rows compaction has
/// not folded in yet are added hour by hour: read here, or given as `pending` (read by
/// [`pending_usage`] on the same snapshot). Usage is summed over projects: a project-scoped
/// contract only rates its own project's records.
///
/// The days `whole` names for a contract that are among `regular_days` (each a ledger day
/// whose hours are all whole, with where they begin and end) come as one capped sum each,
/// worked out in the database from the day's sorted usage, instead of hour by hour; unless
/// the day has delta rows yet to fold, or its row holds hours outside it (rows compacted for
/// another time zone than `tz`).
pub async fn contract_usage(
    conn: &mut PgConnection,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    contracts: &[Uuid],
    tz: Tz,
    whole: &[(Uuid, WholeDays)],
    regular_days: &[(NaiveDate, DateTime<Utc>, DateTime<Utc>)],
    pending: Option<PendingUsage>,
) -> sqlx::Result<BTreeMap<Uuid, ContractUsage>> {
    // The days and the delta rows come from one snapshot whatever compaction commits: one
    // statement, or `pending` read before it on the same snapshot. The delta rows come as one
    // row per contract, without a day; a capped day comes without hours.
    type Row = (
        Uuid,
        Option<NaiveDate>,
        Option<Vec<DateTime<Utc>>>,
        Option<Vec<i64>>,
        Option<Vec<Numeric>>,
        Option<Numeric>,
    );
    type Hours = Vec<(DateTime<Utc>, i64, Decimal)>;
    let ledger_day = |at: DateTime<Utc>| at.with_timezone(&tz).date_naive();
    let mut binder = Binder::new();
    let ids = binder.bind(contracts.to_vec());
    // A day either side, for rows compacted for another time zone; hours outside the window
    // are left out below.
    let first_day = binder.bind(ledger_day(from).pred_opt().unwrap_or(NaiveDate::MIN));
    let last_day = binder.bind(
        ledger_day(to - chrono::Duration::microseconds(1))
            .succ_opt()
            .unwrap_or(NaiveDate::MAX),
    );
    let pending = match pending {
        Some(pending) => format!(
            "pending AS ( \
               SELECT * FROM unnest({}::uuid[], {}::timestamptz[], {}::bigint[], \
                                    {}::numeric[]) AS p(contract_id, hour, segments, used))",
            binder.bind(pending.contracts),
            binder.bind(pending.hours),
            binder.bind(pending.segments),
            binder.bind(pending.used),
        ),
        None => format!(
            "pending AS ({})",
            pending_sql((&binder.bind(from), &binder.bind(to), &ids))
        ),
    };
    let pending_rows = "SELECT contract_id, NULL, array_agg(hour ORDER BY hour), \
                               array_agg(segments ORDER BY hour), \
                               array_agg(used ORDER BY hour), NULL \
                        FROM pending GROUP BY contract_id";
    let days_wanted =
        format!("d.contract_id = ANY({ids}) AND d.day >= {first_day} AND d.day <= {last_day}");
    let sql = if whole.is_empty() {
        format!(
            "WITH {pending} \
             SELECT d.contract_id, d.day, d.hours, d.segments, d.used, NULL::numeric \
             FROM contract_usage_daily d WHERE {days_wanted} \
             UNION ALL {pending_rows}"
        )
    } else {
        let whole_ids = binder.bind(whole.iter().map(|(id, _)| *id).collect::<Vec<_>>());
        let whole_firsts = binder.bind(whole.iter().map(|(_, d)| d.first).collect::<Vec<_>>());
        let whole_lasts = binder.bind(whole.iter().map(|(_, d)| d.last).collect::<Vec<_>>());
        let caps = binder.bind(
            whole
                .iter()
                .map(|(_, d)| d.hour_seconds)
                .collect::<Vec<_>>(),
        );
        let zone = binder.bind(tz.name());
        let (regular_days, regular_starts, regular_ends) = (
            binder.bind(regular_days.iter().map(|d| d.0).collect::<Vec<_>>()),
            binder.bind(regular_days.iter().map(|d| d.1).collect::<Vec<_>>()),
            binder.bind(regular_days.iter().map(|d| d.2).collect::<Vec<_>>()),
        );
        format!(
            "WITH {pending}, \
             pending_days AS ( \
               SELECT DISTINCT contract_id, (hour AT TIME ZONE {zone})::date AS day \
               FROM pending), \
             whole AS ( \
               SELECT * FROM unnest({whole_ids}::uuid[], {whole_firsts}::date[], \
                                    {whole_lasts}::date[], {caps}::numeric[]) \
                 AS w(contract_id, first_day, last_day, hour_seconds)), \
             regular AS ( \
               SELECT * FROM unnest({regular_days}::date[], {regular_starts}::timestamptz[], \
                                    {regular_ends}::timestamptz[]) AS r(day, starts, ends)) \
             SELECT d.contract_id, d.day, \
                    CASE WHEN NOT c.capped THEN d.hours END, \
                    CASE WHEN NOT c.capped THEN d.segments END, \
                    CASE WHEN NOT c.capped THEN d.used END, \
                    CASE WHEN c.capped THEN \
                      coalesce(d.running_used[b.at_most], 0) \
                      + w.hour_seconds * (cardinality(d.sorted_used) - b.at_most) END \
             FROM contract_usage_daily d \
             LEFT JOIN whole w ON w.contract_id = d.contract_id \
             LEFT JOIN regular r ON r.day = d.day \
             CROSS JOIN LATERAL (SELECT coalesce( \
                 d.day BETWEEN w.first_day AND w.last_day \
                 AND d.hours[1] >= r.starts AND d.hours[cardinality(d.hours)] < r.ends \
                 AND NOT EXISTS (SELECT FROM pending_days p \
                                 WHERE p.contract_id = d.contract_id AND p.day = d.day), \
                 false) AS capped) AS c \
             CROSS JOIN LATERAL (SELECT width_bucket(w.hour_seconds, d.sorted_used) AS at_most) \
               AS b \
             WHERE {days_wanted} \
             UNION ALL {pending_rows}"
        )
    };
    // Netting days, the statement is planned for its parameters on every run: the generic
    // plan PostgreSQL turns to after a prepared statement's fifth run cannot see how many
    // contracts and days the arrays hold, and read a month of a thousand reservations in
    // 2.5 s instead of 0.1 s.
    // Dynamic: the contracts read whole, and their statement, vary with the call.
    let rows: Vec<Row> = binder
        .query_as(&sql)?
        .persistent(whole.is_empty())
        .fetch_all(&mut *conn)
        .await?;
    let in_window = |hours: Vec<DateTime<Utc>>, segments: Vec<i64>, used: Vec<Numeric>| {
        hours
            .into_iter()
            .zip(segments)
            .zip(used)
            .map(|((hour, segments), Numeric(used))| (hour, segments, used))
            .filter(move |(hour, _, _)| (from..to).contains(hour))
    };
    // The days come in no order (sorting the rows in the database spilled them to disk): each
    // contract's few dozen are put in order here.
    type Day = (NaiveDate, Vec<DateTime<Utc>>, Vec<i64>, Vec<Numeric>);
    let mut days: BTreeMap<Uuid, Vec<Day>> = BTreeMap::new();
    let mut pending: BTreeMap<Uuid, Hours> = BTreeMap::new();
    let mut usage: BTreeMap<Uuid, ContractUsage> = BTreeMap::new();
    for (contract, day, hours, segments, used, capped) in rows {
        match (day, capped) {
            (Some(day), Some(Numeric(capped))) => usage
                .entry(contract)
                .or_default()
                .capped_days
                .push((day, capped)),
            (Some(day), None) => days.entry(contract).or_default().push((
                day,
                hours.unwrap_or_default(),
                segments.unwrap_or_default(),
                used.unwrap_or_default(),
            )),
            (None, _) => {
                pending.insert(
                    contract,
                    in_window(
                        hours.unwrap_or_default(),
                        segments.unwrap_or_default(),
                        used.unwrap_or_default(),
                    )
                    .collect(),
                );
            }
        }
    }
    for (contract, mut rows) in days {
        rows.sort_unstable_by_key(|row| row.0);
        let compacted: Hours = rows
            .into_iter()
            .flat_map(|(_, hours, segments, used)| in_window(hours, segments, used))
            .collect();
        let pending = pending.remove(&contract).unwrap_or_default();
        usage.entry(contract).or_default().hours = merge_hours(compacted, pending);
    }
    for (contract, hours) in pending {
        usage.entry(contract).or_default().hours = merge_hours(Vec::new(), hours);
    }
    for contract in usage.values_mut() {
        contract.capped_days.sort_unstable_by_key(|(day, _)| *day);
    }
    usage.retain(|_, usage| !usage.hours.is_empty() || !usage.capped_days.is_empty());
    Ok(usage)
}

/// Two lists of `(hour, segments, GPU-seconds)` in hour order added hour by hour, without
/// the hours left with no segment, the GPU-seconds rounded as every sum read.
fn merge_hours(
    compacted: Vec<(DateTime<Utc>, i64, Decimal)>,
    pending: Vec<(DateTime<Utc>, i64, Decimal)>,
) -> Vec<(DateTime<Utc>, Decimal)> {
    let mut merged = Vec::with_capacity(compacted.len() + pending.len());
    let mut compacted = compacted.into_iter().peekable();
    let mut pending = pending.into_iter().peekable();
    loop {
        let next = match (compacted.peek(), pending.peek()) {
            (Some(a), Some(b)) if a.0 == b.0 => {
                let (hour, segments, used) = compacted.next().expect("peeked");
                let (_, more_segments, more_used) = pending.next().expect("peeked");
                (hour, segments + more_segments, used + more_used)
            }
            (Some(a), Some(b)) if a.0 < b.0 => compacted.next().expect("peeked"),
            (Some(_), None) => compacted.next().expect("peeked"),
            (_, Some(_)) => pending.next().expect("peeked"),
            (None, None) => break,
        };
        let (hour, segments, used) = next;
        if segments != 0 {
            merged.push((hour, used.round_dp(SUM_SCALE)));
        }
    }
    merged
}

/// Utilisation sums of one group.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UtilRow {
    pub key: Option<String>,
    pub gpu_util_held: Decimal,
    pub gpu_util_weighted: Decimal,
    pub sm_active_held: Decimal,
    pub sm_active_weighted: Decimal,
    pub tensor_active_held: Decimal,
    pub tensor_active_weighted: Decimal,
    pub dram_active_held: Decimal,
    pub dram_active_weighted: Decimal,
    pub memory_held: Decimal,
    pub memory_used_weighted: Decimal,
    pub looks_busy_cost: Decimal,
    pub unused_memory_cost: Decimal,
}

impl UtilRow {
    /// The group key and its sums.
    pub fn into_parts(self) -> (Option<String>, UtilSums) {
        let metric = |held, weighted| MetricSums { held, weighted };
        (
            self.key,
            UtilSums {
                gpu_util: metric(self.gpu_util_held, self.gpu_util_weighted),
                sm_active: metric(self.sm_active_held, self.sm_active_weighted),
                tensor_active: metric(self.tensor_active_held, self.tensor_active_weighted),
                dram_active: metric(self.dram_active_held, self.dram_active_weighted),
                memory_used: metric(self.memory_held, self.memory_used_weighted),
                looks_busy_cost: self.looks_busy_cost,
                unused_memory_cost: self.unused_memory_cost,
            },
        )
    }
}

/// Utilisation sums of the scope over `[from, to)` by group, from the utilisation rollups
/// (or, by label, from the period's segments with telemetry), the card-seconds that look
/// busy or held unused memory priced as [`cost_sums`] prices; groups without telemetry have
/// no row.
pub async fn util_sums(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    period: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    what_if: &WhatIf,
) -> sqlx::Result<Vec<UtilRow>> {
    let mut binder = Binder::new();
    let grouping = scope.grouping();
    let projects = scope.projects(&mut binder);
    let (zone, extra) = key_parameters(&mut binder, grouping, tz);
    let metrics = &UTIL_SUMS[1..UTIL_SUMS.len() - 2];
    let rows = match grouping {
        Grouping::Label(_) => {
            let (from, to) = (binder.bind(period.0), binder.bind(period.1));
            format!(
                "SELECT {key} AS key, s.project_id, \
                        date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, \
                        s.contract_id, s.gpu_model, s.billing_mode, count(*) AS segments, {util} \
                 FROM rated_segments s \
                 JOIN job_records r USING (project_id, task_id, attempt) \
                 WHERE s.project_id {projects} AND s.hour >= {from} AND s.hour < {to} \
                   AND {with_telemetry} \
                 GROUP BY 1, 2, 3, 4, 5, 6",
                key = key_expression(grouping, "hour", "s.", &extra),
                util = rollups::util_sums_sql("s."),
                with_telemetry = rollups::has_telemetry_sql("s."),
            )
        }
        _ => {
            let (month_keys, day_keys, hour_keys) = scope.rollup_keys(&extra);
            scope.split(period, tz).rows_sql(
                &mut binder,
                "util",
                &format!(
                    "{{key}} AS key, project_id, {{month}} AS month, contract_id, gpu_model, \
                     billing_mode, {}",
                    UTIL_SUMS.join(", ")
                ),
                (&month_keys, &day_keys, &hour_keys),
                &projects,
                &zone,
            )
        }
    };
    let price = PriceJoin::new(&mut binder, what_if, "g");
    let sql = format!(
        "SELECT key, {rounded}, {looks_busy}, {unused_memory} FROM ( \
           SELECT g.key, g.segments, {metrics}, g.looks_busy_seconds, g.unused_memory_seconds, \
                  {price} AS price \
           FROM ({rows}) AS g {joins}) AS priced \
         GROUP BY 1 HAVING sum(segments) > 0",
        rounded = rounded_sums(metrics.iter().copied()),
        metrics = metrics
            .iter()
            .map(|column| format!("g.{column}"))
            .collect::<Vec<_>>()
            .join(", "),
        looks_busy = summed_money("looks_busy_seconds", "looks_busy_cost"),
        unused_memory = summed_money("unused_memory_seconds", "unused_memory_cost"),
        price = price.price(),
        joins = price.joins(),
    );
    // Dynamic: the group key is the grouping's, the rollup levels the period's, and the
    // prices (a what-if's) are joined through the binder.
    binder.query_as(&sql)?.fetch_all(conn).await
}

impl EnergyRow {
    /// The group key and the sums it holds.
    pub fn into_parts(self) -> (Option<String>, EnergySums) {
        (
            self.key,
            EnergySums {
                output_unit: self.output_unit,
                metered_gpu_seconds: self.metered_gpu_seconds,
                joules: self.joules,
                intensity_gpu_seconds: self.intensity_gpu_seconds,
                gram_joules: self.gram_joules,
            },
        )
    }
}

/// Measured energy of one group's segments, for one output unit or none (those of attempts
/// that did not complete, or produced no output).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct EnergyRow {
    pub key: Option<String>,
    pub output_unit: Option<String>,
    /// GPU-seconds held of the segments whose energy was measured.
    pub metered_gpu_seconds: Decimal,
    pub joules: Decimal,
    /// GPU-seconds held of those whose region has a grid intensity that month.
    pub intensity_gpu_seconds: Decimal,
    /// Σ joules × PUE × gCO2e per kWh: grams of CO2e times 3.6 million.
    pub gram_joules: Decimal,
}

/// The measured energy of the scope's segments over `[from, to)` by group and output unit,
/// with the emissions of those in a region and month with a grid intensity: each segment's
/// joules × the PUE of the contract that priced it (1 when none did, or it has a plain
/// price) × the intensity of its record's region in its ledger month. Only the segments that
/// carry energy are read (through their partial index).
pub async fn energy_sums(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<EnergyRow>> {
    let mut binder = Binder::new();
    let grouping = scope.grouping();
    let projects = scope.projects(&mut binder);
    let (zone, extra) = key_parameters(&mut binder, grouping, tz);
    let (from, to) = (binder.bind(from), binder.bind(to));
    let key = match scope {
        Scope::Project(..) => key_expression(grouping, "hour", "s.", &extra),
        Scope::EveryProject(_) => "s.project_id".to_owned(),
    };
    let sql = format!(
        "SELECT {key} AS key, \
                CASE WHEN s.outcome = 'completed' THEN s.output_unit END AS output_unit, \
                {sums} \
         FROM {segments} \
         WHERE s.project_id {projects} AND s.hour >= {from} AND s.hour < {to} \
           AND s.energy_joules IS NOT NULL \
         GROUP BY 1, 2",
        sums = energy_sums_columns(),
        segments = metered_segments(&zone),
    );
    // Dynamic: the group key is the scope's grouping, and the projects its.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// The sums of an [`EnergyRow`] over the segments of [`metered_segments`].
pub fn energy_sums_columns() -> String {
    format!(
        "round(sum(s.gpu_seconds_held), {SUM_SCALE}) AS metered_gpu_seconds, \
         round(sum(s.energy_joules), {SUM_SCALE}) AS joules, \
         round(coalesce(sum(s.gpu_seconds_held) FILTER (WHERE gi.region IS NOT NULL), 0), \
               {SUM_SCALE}) AS intensity_gpu_seconds, \
         round(coalesce(sum(s.energy_joules * coalesce(c.pue, 1) * gi.g_co2e_per_kwh), 0), \
               {SUM_SCALE}) AS gram_joules"
    )
}

/// Segments `s` with their records `r`, the contract `c` that priced each, and the grid
/// intensity `gi` of the record's region in the segment's ledger month (`zone` is the
/// placeholder of the ledger time zone).
pub fn metered_segments(zone: &str) -> String {
    format!(
        "rated_segments s \
         JOIN job_records r USING (project_id, task_id, attempt) \
         LEFT JOIN contracts c ON c.id = s.contract_id \
         LEFT JOIN grid_intensity gi ON gi.region = r.region \
              AND gi.month = date_trunc('month', s.hour AT TIME ZONE {zone})::date"
    )
}

/// Model FLOPs of one group's segments: see [`MfuSums`].
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct MfuRow {
    pub key: Option<String>,
    pub tflops: Decimal,
    pub peak_tflops: Decimal,
    pub gpu_seconds_held: Decimal,
}

impl MfuRow {
    /// The group key and its sums.
    pub fn into_parts(self) -> (Option<String>, MfuSums) {
        (
            self.key,
            MfuSums {
                tflops: self.tflops,
                peak_tflops: self.peak_tflops,
                gpu_seconds_held: self.gpu_seconds_held,
            },
        )
    }
}

/// The sums of an [`MfuRow`] over segments `s` of records `r` with a peak: a record's FLOPs
/// spread over its segments as its GPU-seconds held are. Sums are in teraFLOPs, to 10^-6.
pub fn mfu_sums_columns() -> String {
    format!(
        "round(sum(s.gpu_seconds_held * r.model_flops / r.gpu_seconds_held) / 1e12, 6) AS tflops, \
         round(sum(s.gpu_seconds_held * r.peak_flops) / 1e12, 6) AS peak_tflops, \
         round(sum(s.gpu_seconds_held), {SUM_SCALE}) AS gpu_seconds_held"
    )
}

/// Records `r` with a peak (so FLOPs, and GPU time held) joined to their segments `s` in
/// `[from, to)`, named by their placeholders. The records are found through their partial
/// index first: a segment in the period belongs to a record that ended at or after `from`
/// and started less than an hour before `to`.
pub fn records_with_flops(from: &str, to: &str) -> String {
    format!(
        "job_records r JOIN rated_segments s USING (project_id, task_id, attempt) \
         WHERE r.peak_flops IS NOT NULL \
           AND r.ended_at >= {from} AND r.started_at < {to} + interval '1 hour' \
           AND s.hour >= {from} AND s.hour < {to}"
    )
}

/// Whether any record of the scope with FLOPs may have segments in `[from, to)`, read from
/// the partial index of such records alone: most periods have none, and then the join of
/// their segments is not run at all.
async fn any_flops(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> sqlx::Result<bool> {
    let project = match scope {
        Scope::Project(project, _) => Some(project.to_string()),
        Scope::EveryProject(_) => None,
    };
    sqlx::query_scalar!(
        "SELECT EXISTS (SELECT 1 FROM job_records \
                        WHERE peak_flops IS NOT NULL \
                          AND ($1::text IS NULL OR project_id = $1) \
                          AND ended_at >= $2::timestamptz AND started_at < $3::timestamptz + interval '1 hour') \
                AS \"any!\"",
        project,
        from,
        to,
    )
    .fetch_one(conn)
    .await
}

/// The model FLOPs of the scope's segments over `[from, to)` by group, for MFU.
pub async fn mfu_sums(
    conn: &mut PgConnection,
    scope: Scope<'_>,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<MfuRow>> {
    if !any_flops(conn, scope, (from, to)).await? {
        return Ok(Vec::new());
    }
    let mut binder = Binder::new();
    let grouping = scope.grouping();
    let projects = scope.projects(&mut binder);
    let (_, extra) = key_parameters(&mut binder, grouping, tz);
    let (from, to) = (binder.bind(from), binder.bind(to));
    let key = match scope {
        Scope::Project(..) => key_expression(grouping, "hour", "s.", &extra),
        Scope::EveryProject(_) => "s.project_id".to_owned(),
    };
    let sql = format!(
        "SELECT {key} AS key, {sums} FROM {records} AND r.project_id {projects} GROUP BY 1",
        sums = mfu_sums_columns(),
        records = records_with_flops(&from, &to),
    );
    // Dynamic: the group key is the scope's grouping, and the projects its.
    binder.query_as(&sql)?.fetch_all(conn).await
}

/// Failed spend of one ledger hour.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct FailedHour {
    pub hour: DateTime<Utc>,
    pub failed: Decimal,
}

/// The failed spend (the `failed` part: segments of records whose outcome is not
/// `completed`) of a project's records carrying the label `key` = `value`, per ledger hour of
/// `[from, to)` that has any, at the prices in force; in hour order.
pub async fn failed_spend_by_hour(
    conn: &mut PgConnection,
    project: &str,
    (key, value): (&str, &str),
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> sqlx::Result<Vec<FailedHour>> {
    let mut binder = Binder::new();
    let project = binder.bind(project.to_owned());
    let key = binder.bind(key.to_owned());
    let value = binder.bind(value.to_owned());
    let (from, to) = (binder.bind(from), binder.bind(to));
    let zone = binder.bind(tz.name().to_owned());
    let price = PriceJoin::new(&mut binder, &WhatIf::default(), "g");
    let failed = rollups::PRICED_SUMS
        .iter()
        .find(|sum| sum.money == "failed")
        .expect("the failed part is priced");
    let sql = format!(
        "SELECT hour, {money} \
         FROM (SELECT g.hour, g.failed_seconds, g.failed_metered, g.failed_joules, {columns} \
               FROM (SELECT s.hour, s.project_id, \
                            date_trunc('month', s.hour AT TIME ZONE {zone})::date AS month, \
                            s.contract_id, s.gpu_model, s.billing_mode, {sums} \
                     FROM rated_segments s \
                     JOIN job_records r USING (project_id, task_id, attempt) \
                     WHERE s.project_id = {project} AND r.labels ->> {key} = {value} \
                       AND s.outcome <> 'completed' AND s.hour >= {from} AND s.hour < {to}) \
                    AS g {joins}) AS priced \
         GROUP BY hour ORDER BY hour",
        money = summed_priced(failed),
        columns = price.columns(),
        joins = price.joins(),
        sums = rollups::segment_sums_sql("s."),
    );
    // Dynamic: the prices are joined through the binder, as every report joins them.
    binder.query_as(&sql)?.fetch_all(conn).await
}
