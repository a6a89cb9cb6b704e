//! The rollup tables every cost figure is read from, and their upkeep.
//!
//! Rating appends its changes as delta rows (`delta <> 0`), so that concurrent writers never
//! wait on each other's rollup rows; [`compact`] folds them into the compacted rows
//! (`delta = 0`). Every read sums all rows of a key, so figures are exact whether or not
//! compaction has run. A period is read from the monthly tables for its whole ledger months,
//! from the daily ones for its other whole ledger days, and from the hourly ones for the
//! hours left over. The hourly ones are views with a row per segment or per-record figures
//! (migration 0011): a period has at most two partial days, which the segments' index by
//! project and hour reads as fast as a table of sums, and rating writes no hourly row.

use anyhow::Context;
use chrono::{DateTime, Months, NaiveDate, Utc};
use chrono_tz::Tz;
use serde_json::Value as JsonValue;
use sqlx::{PgConnection, PgPool};

use crate::domain::ledger_time::{first_instant_of_day, first_of_month};
use crate::domain::utilisation::{LOOKS_BUSY_GPU_UTIL, LOOKS_BUSY_SM_ACTIVE};
use crate::store::binder::Binder;
use crate::store::dynamic;
use crate::store::jobs::COMPACTION;

/// What a rollup sums: GPU time and cost of segments, or counts of records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Sums of `rated_segments`, keyed also by contract, unrated reason and output unit.
    Cost,
    /// Sums of `rated_records`.
    Records,
    /// Utilisation sums of the `rated_segments` that carry telemetry.
    Util,
}

impl Family {
    const ALL: [Family; 3] = [Family::Cost, Family::Records, Family::Util];

    fn name(self) -> &'static str {
        match self {
            Family::Cost => "cost",
            Family::Records => "records",
            Family::Util => "util",
        }
    }

    /// The key columns of the family's table at `level`, without `delta`.
    fn key(self, level: Level) -> String {
        self.key_with(level.column())
    }

    /// The key columns with `period` in place of the period column.
    fn key_with(self, period: &str) -> String {
        match self {
            Family::Cost => format!(
                "project_id, {period}, gpu_model, billing_mode, outcome, contract_id, \
                 unrated_reason, output_unit"
            ),
            Family::Util => {
                format!("project_id, {period}, gpu_model, billing_mode, outcome, contract_id")
            }
            Family::Records => format!("project_id, {period}, gpu_model, billing_mode, outcome"),
        }
    }

    /// The summed columns; the first is the count that is zero exactly when nothing is
    /// left under a key.
    fn sums(self) -> &'static [&'static str] {
        match self {
            Family::Cost => &COST_KIND_SUMS,
            Family::Records => &[
                "records",
                "retries",
                "failures",
                "tasks_completed",
                "tasks_failed",
            ],
            Family::Util => &UTIL_SUMS,
        }
    }

    fn table(self, level: Level) -> String {
        format!("{}_{}", self.name(), level.suffix())
    }

    fn constraint(self, level: Level) -> String {
        match self {
            Family::Cost | Family::Util => format!("{}_key", self.table(level)),
            Family::Records => format!("{}_pkey", self.table(level)),
        }
    }
}

/// The summed columns of the utilisation rollups, `segments` first.
pub const UTIL_SUMS: [&str; 13] = [
    "segments",
    "gpu_util_held",
    "gpu_util_weighted",
    "sm_active_held",
    "sm_active_weighted",
    "tensor_active_held",
    "tensor_active_weighted",
    "dram_active_held",
    "dram_active_weighted",
    "memory_held",
    "memory_used_weighted",
    "looks_busy_seconds",
    "unused_memory_seconds",
];

/// What [`SegmentSums`](crate::domain::figures::SegmentSums) tells segments apart by, as
/// columns, with what prices them: whether they completed, their contract, model and billing
/// mode (a contract has one of each, so they add no rows; a what-if price may name them),
/// and the output unit of completed ones. Grouping by these and nothing finer keeps the rows read
/// few: a month of a thousand projects has a few per project and contract, against some
/// fifty by outcome, model, mode and unit.
pub const SEGMENT_KINDS: [&str; 6] = [
    "completed",
    "unrated_reason",
    "contract_id",
    "gpu_model",
    "billing_mode",
    "output_unit",
];

/// [`SEGMENT_KINDS`] over rows of `rated_segments` or a cost rollup; `prefix` qualifies the
/// columns (`s.`).
pub fn segment_kinds_sql(prefix: &str) -> String {
    format!(
        "{prefix}outcome = 'completed' AS completed, {prefix}unrated_reason, {prefix}contract_id, \
         {prefix}gpu_model, {prefix}billing_mode, \
         CASE WHEN {prefix}outcome = 'completed' THEN {prefix}output_unit END AS output_unit"
    )
}

/// The summed columns of the cost rollups and of `cost_monthly_kinds`, `segments` first,
/// the [`ENERGY_SUMS`] last.
pub const COST_KIND_SUMS: [&str; 19] = followed_by_energy([
    "segments",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "card_seconds",
    "productive_seconds",
    "idle_seconds",
    "unmeasured_seconds",
    "failed_seconds",
    "output_quantity",
]);

/// `columns` followed by the [`ENERGY_SUMS`]; `N` is their count.
const fn followed_by_energy<const M: usize, const N: usize>(
    columns: [&'static str; M],
) -> [&'static str; N] {
    assert!(M + ENERGY_SUMS.len() == N, "N counts both");
    let mut all = [""; N];
    let mut i = 0;
    while i < N {
        all[i] = match i < M {
            true => columns[i],
            false => ENERGY_SUMS[i - M],
        };
        i += 1;
    }
    all
}

/// The energy sums of a segment (`rated_segments` columns qualified by `prefix`), as the
/// views `cost_hourly` and `task_hourly` have them: the card-seconds of each part whose
/// energy was measured, and the joules measured in each part (see migration 0020).
pub fn energy_sums_sql(prefix: &str) -> String {
    energy_sum_expressions(prefix)
        .iter()
        .map(|(expression, name)| format!("{expression} AS {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The energy sums of [`energy_sums_sql`], summed over the segments.
pub fn summed_energy_sql(prefix: &str) -> String {
    energy_sum_expressions(prefix)
        .iter()
        .map(|(expression, name)| format!("sum({expression}) AS {name}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The names of the energy sums, as [`COST_KIND_SUMS`] ends with them.
pub const ENERGY_SUMS: [&str; 10] = [
    "metered_card_seconds",
    "productive_metered",
    "idle_metered",
    "unmeasured_metered",
    "failed_metered",
    "energy_joules",
    "productive_joules",
    "idle_joules",
    "unmeasured_joules",
    "failed_joules",
];

/// The expression over a segment (qualified by `prefix`) of each of the [`ENERGY_SUMS`], with
/// its name.
pub fn energy_sum_expressions(prefix: &str) -> [(String, &'static str); 10] {
    let metered = |seconds: &str| {
        format!("CASE WHEN {prefix}energy_joules IS NULL THEN 0 ELSE {seconds} END")
    };
    let [
        card,
        productive,
        idle,
        unmeasured,
        failed,
        energy,
        productive_j,
        idle_j,
        unmeasured_j,
        failed_j,
    ] = ENERGY_SUMS;
    [
        (metered(&format!("coalesce({prefix}card_seconds, 0)")), card),
        (metered(&format!("{prefix}productive_seconds")), productive),
        (metered(&format!("{prefix}idle_seconds")), idle),
        (metered(&format!("{prefix}unmeasured_seconds")), unmeasured),
        (metered(&format!("{prefix}failed_seconds")), failed),
        (format!("coalesce({prefix}energy_joules, 0)"), energy),
        (format!("{prefix}productive_joules"), productive_j),
        (format!("{prefix}idle_joules"), idle_j),
        (format!("{prefix}unmeasured_joules"), unmeasured_j),
        (format!("{prefix}failed_joules"), failed_j),
    ]
}

/// [`COST_KIND_SUMS`] of each row of `rated_segments` (qualified by `prefix`), as the view
/// `cost_hourly` has them.
pub fn segment_sums_sql(prefix: &str) -> String {
    format!(
        "1::bigint AS segments, {prefix}gpu_seconds_held, \
         coalesce({prefix}gpu_seconds_busy, 0) AS gpu_seconds_busy, \
         coalesce({prefix}card_seconds, 0) AS card_seconds, {prefix}productive_seconds, \
         {prefix}idle_seconds, {prefix}unmeasured_seconds, {prefix}failed_seconds, \
         coalesce({prefix}output_quantity, 0) AS output_quantity, {energy}",
        energy = energy_sums_sql(prefix),
    )
}

/// The card-seconds columns of [`COST_KIND_SUMS`], each with the money column a price
/// makes of it and the energy sums beside it.
pub const PRICED_SUMS: [PricedSum; 5] = [
    PricedSum::new(
        "card_seconds",
        "metered_card_seconds",
        "energy_joules",
        "cost",
    ),
    PricedSum::new(
        "productive_seconds",
        "productive_metered",
        "productive_joules",
        "productive",
    ),
    PricedSum::new("idle_seconds", "idle_metered", "idle_joules", "idle"),
    PricedSum::new(
        "unmeasured_seconds",
        "unmeasured_metered",
        "unmeasured_joules",
        "unmeasured",
    ),
    PricedSum::new(
        "failed_seconds",
        "failed_metered",
        "failed_joules",
        "failed",
    ),
];

/// Card-seconds a price applies to, with the part of them whose energy was measured and
/// that energy: what one money figure is made of.
#[derive(Debug, Clone, Copy)]
pub struct PricedSum {
    pub seconds: &'static str,
    pub metered: &'static str,
    pub joules: &'static str,
    pub money: &'static str,
}

impl PricedSum {
    const fn new(
        seconds: &'static str,
        metered: &'static str,
        joules: &'static str,
        money: &'static str,
    ) -> Self {
        Self {
            seconds,
            metered,
            joules,
            money,
        }
    }

    /// The money of rows with the priced columns of
    /// [`PriceJoin::columns`](crate::store::prices::PriceJoin::columns), summed, times 3600;
    /// null where every row is unrated. The measured energy's part (owned cards priced by
    /// power, COST_MODEL §10) is summed over the rows whose contract prices it alone: for the
    /// others it is zero, and working out its zero products and quotient row by row took
    /// about 40% of a month's priced sums. Sums of `numeric` are exact, so the figure is the
    /// same as summing each row's whole money.
    pub fn summed_times_3600(&self) -> String {
        format!(
            "(sum({seconds} * price) \
              + coalesce(sum({joules} * energy_price / 1000 - {metered} * power_price) \
                           FILTER (WHERE energy_priced), 0))",
            seconds = self.seconds,
            metered = self.metered,
            joules = self.joules,
        )
    }
}

/// `sum(column) AS column` for each of `columns`.
pub fn summed(columns: &[&str]) -> String {
    columns
        .iter()
        .map(|column| format!("sum({column}) AS {column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `ON CONFLICT` updates adding each of `columns` of the proposed row to the row `alias`.
fn added_to(alias: &str, columns: &[&str]) -> String {
    columns
        .iter()
        .map(|column| format!("{column} = {alias}.{column} + EXCLUDED.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every project's monthly cost summed by [`SEGMENT_KINDS`] (migration 0013): the rows of
/// `moved`, which compaction takes out of `cost_monthly`, added to theirs, returning their keys
/// and what is left under them. The monthly report reads these instead of grouping every project's
/// monthly rows by kind.
fn fold_into_cost_kinds(moved: &str) -> String {
    let sums = COST_KIND_SUMS.join(", ");
    let totals = summed(&COST_KIND_SUMS);
    let updates = added_to("k", &COST_KIND_SUMS);
    format!(
        "INSERT INTO cost_monthly_kinds AS k (project_id, month, {kinds}, {sums}) \
         SELECT project_id, month, {row_kinds}, {totals} FROM {moved} \
         GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 ORDER BY 1, 2, 3, 4, 5, 6, 7, 8 \
         ON CONFLICT ON CONSTRAINT cost_monthly_kinds_key DO UPDATE SET {updates} \
         RETURNING {returned}, k.segments AS remaining",
        kinds = SEGMENT_KINDS.join(", "),
        row_kinds = segment_kinds_sql(""),
        returned = qualified("k", &cost_kinds_key()),
    )
}

/// The key columns of `cost_monthly_kinds`.
fn cost_kinds_key() -> String {
    format!("project_id, month, {}", SEGMENT_KINDS.join(", "))
}

/// Each of the comma-separated `columns` qualified by `alias`.
fn qualified(alias: &str, columns: &str) -> String {
    columns
        .split(", ")
        .map(|column| format!("{alias}.{column}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The condition that the row `left` has the key `key` (comma-separated) of the row `right`.
/// The first `not_null` columns are never null and compared with `=`, so that the key's index
/// finds the rows; the rest may be null and are compared as not distinct.
fn same_key((key, not_null): (&str, usize), left: &str, right: &str) -> String {
    let columns: Vec<&str> = key.split(", ").collect();
    let (leading, rest) = columns.split_at(not_null.min(columns.len()));
    let mut parts: Vec<String> = leading
        .iter()
        .map(|column| format!("{left}.{column} = {right}.{column}"))
        .collect();
    if !rest.is_empty() {
        let rest = rest.join(", ");
        parts.push(format!(
            "({}) IS NOT DISTINCT FROM ({})",
            qualified(left, &rest),
            qualified(right, &rest)
        ));
    }
    parts.join(" AND ")
}

/// Removes the rows of `table` whose keys are among `rows` (a JSON array of objects holding at
/// least the key columns, as the compaction and rating statements return the rows they left
/// empty) and that are still empty: `condition` over the row `t`. `key` is the key's columns,
/// comma-separated, and how many of the first are never null (see [`same_key`]). The rows are
/// found by their keys, never by a physical row id, which means nothing across the shards of a
/// distributed table.
pub fn delete_by_keys(table: &str, key: (&str, usize), condition: &str, rows: &str) -> String {
    format!(
        "DELETE FROM {table} AS t \
         USING (SELECT * FROM jsonb_populate_recordset(NULL::{table}, {rows})) AS e \
         WHERE {matches} AND {condition}",
        matches = same_key(key, "t", "e"),
    )
}

/// The utilisation sums (every column of [`UTIL_SUMS`] but `segments`) over segment rows
/// with the `rated_segments` columns, named as in [`UTIL_SUMS`]; `prefix` qualifies the
/// columns (`s.`). Segments without telemetry add nothing.
pub fn util_sums_sql(prefix: &str) -> String {
    let metric = |column: &str, held: &str, weighted: &str| {
        format!(
            "coalesce(sum({prefix}gpu_seconds_held) FILTER (WHERE {prefix}{column} IS NOT NULL), \
                      0) AS {held}, \
             coalesce(sum({prefix}gpu_seconds_held * {prefix}{column}), 0) AS {weighted}"
        )
    };
    format!(
        "{gpu_util}, {sm_active}, {tensor_active}, {dram_active}, {memory}, \
         coalesce(sum({prefix}card_seconds) \
                      FILTER (WHERE {prefix}gpu_util >= {LOOKS_BUSY_GPU_UTIL} \
                                AND {prefix}sm_active < {LOOKS_BUSY_SM_ACTIVE}), 0) \
             AS looks_busy_seconds, \
         coalesce(sum({prefix}card_seconds * (1 - {prefix}memory_used_share)), 0) \
             AS unused_memory_seconds",
        gpu_util = metric("gpu_util", "gpu_util_held", "gpu_util_weighted"),
        sm_active = metric("sm_active", "sm_active_held", "sm_active_weighted"),
        tensor_active = metric(
            "tensor_active",
            "tensor_active_held",
            "tensor_active_weighted"
        ),
        dram_active = metric("dram_active", "dram_active_held", "dram_active_weighted"),
        memory = metric("memory_used_share", "memory_held", "memory_used_weighted"),
    )
}

/// Whether a `rated_segments` row (columns qualified by `prefix`) carries some telemetry.
pub fn has_telemetry_sql(prefix: &str) -> String {
    format!(
        "num_nonnulls({prefix}gpu_util, {prefix}sm_active, {prefix}tensor_active, \
                      {prefix}dram_active, {prefix}memory_used_share) > 0"
    )
}

/// The period a rollup row covers: a ledger hour, day or month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Hour,
    Day,
    Month,
}

impl Level {
    /// The levels kept as tables, which rating appends to and compaction folds. The hourly
    /// rollups are views over the segments and per-record figures.
    pub const STORED: [Level; 2] = [Level::Day, Level::Month];

    pub fn column(self) -> &'static str {
        match self {
            Level::Hour => "hour",
            Level::Day => "day",
            Level::Month => "month",
        }
    }

    fn suffix(self) -> &'static str {
        match self {
            Level::Hour => "hourly",
            Level::Day => "daily",
            Level::Month => "monthly",
        }
    }

    /// The level's period of a ledger hour `hour`, with the ledger time zone in the
    /// parameter `tz`.
    pub fn of_hour(self, tz: &str) -> String {
        match self {
            Level::Hour => "hour".to_owned(),
            Level::Day => format!("(hour AT TIME ZONE {tz})::date"),
            Level::Month => format!("date_trunc('month', hour AT TIME ZONE {tz})::date"),
        }
    }
}

/// An `INSERT` into `family`'s table at `level` of the sums of `source` (rows with the
/// family's hourly key and sums) per period of their hour, tagged with `delta`; groups that
/// change nothing are left out. `tz` is the parameter holding the ledger time zone.
pub fn append_sql(family: Family, level: Level, tz: &str, source: &str, delta: &str) -> String {
    let sums = family.sums();
    let totals = sums
        .iter()
        .map(|column| format!("sum({column})"))
        .collect::<Vec<_>>()
        .join(", ");
    let zeros = vec!["0"; sums.len()].join(", ");
    let grouped = family.key_with(&level.of_hour(tz));
    format!(
        "INSERT INTO {table} ({key}, {columns}, delta) \
         SELECT {grouped}, {totals}, {delta} FROM {source} \
         GROUP BY {grouped} HAVING ({totals}) <> ({zeros})",
        table = family.table(level),
        key = family.key(level),
        columns = sums.join(", "),
    )
}

/// One rollup table, as compaction sees it.
struct Rollup {
    table: String,
    constraint: String,
    key: String,
    sums: &'static [&'static str],
    /// Another table the folded delta rows are summed into, as SQL over the rows `moved`
    /// returning the keys of its rows and their `remaining` count, and that table's name.
    also: Option<(String, &'static str)>,
}

fn rollups() -> Vec<Rollup> {
    Family::ALL
        .iter()
        .flat_map(|&family| {
            Level::STORED.iter().map(move |&level| Rollup {
                table: family.table(level),
                constraint: family.constraint(level),
                key: family.key(level),
                sums: family.sums(),
                also: (family == Family::Cost && level == Level::Month)
                    .then(|| (fold_into_cost_kinds("moved"), "cost_monthly_kinds")),
            })
        })
        .collect()
}

/// Every table rating appends delta rows to: the rollups, and each reservation's usage.
fn delta_tables() -> Vec<String> {
    let mut tables: Vec<String> = rollups().into_iter().map(|rollup| rollup.table).collect();
    tables.push("contract_usage_hourly".to_owned());
    tables.extend(crate::store::capacity::delta_tables().map(str::to_owned));
    tables
}

/// `query!` of `$head`, then the `INSERT` of the rows of `contract_usage_daily` (migration
/// 0015) for the hours of `$source` (rows of `contract_id`, `hour`, `segments`, `used`, at
/// most one per contract and hour), then `$tail` (all literals): one row per contract and
/// ledger day in the time zone `$zone`, its hours in order and their usage also sorted with
/// running sums, without hours whose segments are all gone.
macro_rules! usage_days {
    ($head:literal, $source:literal, $zone:literal, $tail:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head
                + "INSERT INTO contract_usage_daily \
                     (contract_id, day, hours, segments, used, sorted_used, running_used) \
                   SELECT contract_id, day, hours, segments, used, usage_sorted(used), \
                          usage_running_sums(used) \
                   FROM ( \
                     SELECT contract_id, (hour AT TIME ZONE "
                + $zone
                + ")::date AS day, \
                            array_agg(hour ORDER BY hour) AS hours, \
                            array_agg(segments ORDER BY hour) AS segments, \
                            array_agg(used ORDER BY hour) AS used \
                     FROM "
                + $source
                + " WHERE segments <> 0 GROUP BY 1, 2) AS days \
                   ORDER BY 1, 2"
                + $tail
            $(, $arg)*
        )
    };
}

/// Folds every committed delta row of the reservations' usage into its ledger day's row
/// (migration 0015): the day's hours and the delta rows' hours are summed per hour, summed
/// over projects, and written back as the day's row, in the ledger time zone the rollups
/// were built for (the setting `rollup_timezone`, UTC without one). Returns how many delta
/// rows it folded and how many day rows were left with no hour, which are removed.
async fn fold_contract_usage(conn: &mut PgConnection) -> sqlx::Result<(i64, i64)> {
    let row = usage_days!(
        "WITH moved AS ( \
           DELETE FROM contract_usage_hourly WHERE delta <> 0 \
           RETURNING contract_id, hour, segments, gpu_seconds_held AS used), \
         days AS ( \
           SELECT DISTINCT contract_id, \
                  (hour AT TIME ZONE \
                   coalesce((SELECT value FROM settings WHERE key = 'rollup_timezone'), 'UTC') \
                  )::date AS day \
           FROM moved), \
         old AS ( \
           DELETE FROM contract_usage_daily d USING days \
           WHERE d.contract_id = days.contract_id AND d.day = days.day \
           RETURNING d.*), \
         entries AS ( \
           SELECT contract_id, hour, segments, used FROM moved \
           UNION ALL \
           SELECT old.contract_id, e.hour, e.segments, e.used \
           FROM old, unnest(old.hours, old.segments, old.used) AS e(hour, segments, used)), \
         per_hour AS ( \
           SELECT contract_id, hour, sum(segments) AS segments, sum(used) AS used \
           FROM entries GROUP BY contract_id, hour), \
         folded AS (",
        "per_hour",
        "coalesce((SELECT value FROM settings WHERE key = 'rollup_timezone'), 'UTC')",
        " RETURNING contract_id, day) \
         SELECT (SELECT count(*) FROM moved) AS \"moved!\", \
                (SELECT count(*) FROM old WHERE (contract_id, day) NOT IN (SELECT * FROM folded)) \
                    AS \"emptied!\"",
    )
    .fetch_one(conn)
    .await?;
    Ok((row.moved, row.emptied))
}

const SETTING_TIMEZONE: &str = "rollup_timezone";

impl Rollup {
    /// Folds every committed delta row into the compacted rows, in key order (and into the
    /// rows of `also`), and returns the keys of compacted rows left empty (and of rows of
    /// `also`), as JSON arrays.
    fn compaction_sql(&self) -> String {
        let sums = self.sums.join(", ");
        let merged = summed(self.sums);
        let updates = added_to("t", self.sums);
        format!(
            "WITH moved AS (DELETE FROM {table} WHERE delta <> 0 RETURNING *), \
             merged AS (SELECT {key}, {merged} FROM moved GROUP BY {key}), \
             upserted AS ( \
               INSERT INTO {table} AS t ({key}, {sums}, delta) \
               SELECT {key}, {sums}, 0 FROM merged ORDER BY {key} \
               ON CONFLICT ON CONSTRAINT {constraint} DO UPDATE SET {updates} \
               RETURNING {returned}, t.{count} AS remaining), \
             also AS ({also}) \
             SELECT (SELECT count(*) FROM moved), \
                    (SELECT coalesce(jsonb_agg(u), '[]') FROM upserted u WHERE remaining = 0), \
                    (SELECT coalesce(jsonb_agg(a), '[]') FROM also a WHERE remaining = 0)",
            also = self.also.as_ref().map_or(
                "SELECT NULL::bigint AS remaining WHERE false",
                |(sql, _)| sql.as_str()
            ),
            returned = qualified("t", &self.key),
            table = self.table,
            key = self.key,
            constraint = self.constraint,
            count = self.sums[0],
        )
    }
}

/// How many delta rows compaction folded in.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub delta_rows: i64,
    pub emptied_rows: usize,
}

/// Folds the delta rows of every rollup into its compacted rows and removes the compacted
/// rows nothing is left under. Returns `None` when another transaction is compacting.
pub async fn compact(pool: &PgPool) -> anyhow::Result<Option<Compaction>> {
    let mut tx = pool.begin().await?;
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_xact_lock($1, $2) AS "locked!""#,
        COMPACTION.0,
        COMPACTION.1,
    )
    .fetch_one(&mut *tx)
    .await?;
    if !locked {
        return Ok(None);
    }
    let mut done = Compaction::default();
    for rollup in rollups() {
        // Dynamic: the rollup table is the family's at the level.
        let (moved, emptied_keys, also_keys): (i64, JsonValue, JsonValue) =
            dynamic::query_as(&rollup.compaction_sql())
                .fetch_one(&mut *tx)
                .await
                .with_context(|| format!("compacting {}", rollup.table))?;
        let emptied = emptied_keys.as_array().map_or(0, Vec::len);
        if emptied > 0 {
            let condition = format!("t.delta = 0 AND t.{} = 0", rollup.sums[0]);
            // Dynamic: the rollup table is the family's at the level.
            dynamic::query(&delete_by_keys(
                &rollup.table,
                (&rollup.key, 2),
                &condition,
                "$1",
            ))
            .bind(&emptied_keys)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("removing emptied {} rows", rollup.table))?;
        }
        let emptied_also = also_keys.as_array().map_or(0, Vec::len);
        if let Some((_, also)) = &rollup.also
            && emptied_also > 0
        {
            // Dynamic: the table is the one the rollup's rows are also summed into.
            dynamic::query(&delete_by_keys(
                also,
                (&cost_kinds_key(), 2),
                "t.segments = 0",
                "$1",
            ))
            .bind(&also_keys)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("removing emptied {also} rows"))?;
        }
        done.delta_rows += moved;
        done.emptied_rows += emptied + emptied_also;
    }
    let (moved, emptied) = fold_contract_usage(&mut tx)
        .await
        .context("compacting contract_usage_hourly")?;
    done.delta_rows += moved;
    done.emptied_rows += usize::try_from(emptied)?;
    done.delta_rows += crate::store::capacity::compact(&mut tx)
        .await
        .context("compacting the capacity rollups")?;
    tx.commit().await?;
    Ok(Some(done))
}

/// How many delta rows wait to be compacted, over every rollup (each counted through its
/// partial index of delta rows).
pub async fn delta_rows(pool: &PgPool) -> sqlx::Result<i64> {
    let counts = delta_tables()
        .iter()
        .map(|table| format!("(SELECT count(*) FROM {table} WHERE delta <> 0)"))
        .collect::<Vec<_>>()
        .join(" + ");
    // Dynamic: the tables are the rollup families' and the capacity rollups'.
    dynamic::query_scalar(&format!("SELECT {counts}"))
        .fetch_one(pool)
        .await
}

/// Rebuilds the daily and monthly rollups from the hourly ones, and the per-task months from
/// the rated segments and records (see [`rebuild_tasks`]), and regroups the reservations'
/// usage by day, when they were built for another ledger time zone than `tz` (or never
/// recorded one), so that their days and months are those of the ledger. Returns whether it
/// rebuilt them.
pub async fn align_to_time_zone(pool: &PgPool, tz: Tz) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query!(
        "SELECT pg_advisory_xact_lock($1, $2)",
        COMPACTION.0,
        COMPACTION.1,
    )
    .execute(&mut *tx)
    .await?;
    let built_for = crate::store::settings::get(&mut tx, SETTING_TIMEZONE).await?;
    if built_for.as_deref() == Some(tz.name()) {
        return Ok(false);
    }
    // Writers append to these tables; this waits for them and keeps them out meanwhile.
    sqlx::query!(
        "LOCK TABLE cost_daily, records_daily, util_daily, cost_monthly, records_monthly, \
         util_monthly, task_monthly, cost_monthly_kinds IN EXCLUSIVE MODE",
    )
    .execute(&mut *tx)
    .await?;
    for level in [Level::Day, Level::Month] {
        for family in Family::ALL {
            let table = family.table(level);
            // Dynamic: the rollup table is the family's at the level.
            dynamic::query(&format!("DELETE FROM {table}"))
                .execute(&mut *tx)
                .await?;
            let source = family.table(Level::Hour);
            // Dynamic: the rollup tables are the family's at the level and by the hour.
            dynamic::query(&append_sql(family, level, "$1", &source, "0"))
                .bind(tz.name())
                .execute(&mut *tx)
                .await
                .with_context(|| format!("rebuilding {table}"))?;
        }
    }
    sqlx::query!("DELETE FROM cost_monthly_kinds")
        .execute(&mut *tx)
        .await?;
    // Dynamic: the cost kinds' statement is the one compaction assembles for `cost_monthly`
    // from the columns of the cost families (`fold_into_cost_kinds`).
    dynamic::query(&format!(
        "WITH moved AS (SELECT * FROM cost_monthly) {}",
        fold_into_cost_kinds("moved")
    ))
    .execute(&mut *tx)
    .await
    .context("rebuilding cost_monthly_kinds")?;
    rebuild_tasks(&mut tx, tz).await?;
    usage_days!(
        "WITH old AS (DELETE FROM contract_usage_daily RETURNING *), \
         hours AS ( \
           SELECT old.contract_id, e.hour, e.segments, e.used \
           FROM old, unnest(old.hours, old.segments, old.used) AS e(hour, segments, used)) ",
        "hours",
        "$1",
        "",
        tz.name(),
    )
    .execute(&mut *tx)
    .await
    .context("rebuilding contract_usage_daily")?;
    crate::store::settings::put(&mut tx, SETTING_TIMEZONE, tz.name()).await?;
    tx.commit().await?;
    Ok(true)
}

/// Rebuilds every task's monthly rows (`task_monthly`) from its segments and per-record
/// figures (the view `task_hourly`) for the ledger time zone `tz`; the caller keeps writers
/// out meanwhile.
async fn rebuild_tasks(conn: &mut PgConnection, tz: Tz) -> anyhow::Result<()> {
    let sums = TASK_SUMS
        .iter()
        .map(|&column| match column {
            "output" => "sum_quantities(output)".to_owned(),
            _ => format!("sum({column})"),
        })
        .collect::<Vec<_>>()
        .join(", ");
    sqlx::query!("DELETE FROM task_monthly")
        .execute(&mut *conn)
        .await?;
    // Dynamic: the columns are `TASK_SUMS`, which the task statements assemble theirs from.
    dynamic::query(&format!(
        "INSERT INTO task_monthly \
           (project_id, task_id, month, contract_id, gpu_model, billing_mode, {columns}) \
         SELECT project_id, task_id, {month}, contract_id, gpu_model, billing_mode, {sums} \
         FROM task_hourly GROUP BY 1, 2, 3, 4, 5, 6",
        columns = TASK_SUMS.join(", "),
        month = Level::Month.of_hour("$1"),
    ))
    .bind(tz.name())
    .execute(&mut *conn)
    .await
    .context("rebuilding task_monthly")?;
    Ok(())
}

/// The summed columns of `task_monthly` and of the view `task_hourly` it is built from, the
/// [`ENERGY_SUMS`] last.
pub const TASK_SUMS: [&str; 26] = followed_by_energy([
    "segments",
    "card_seconds",
    "productive_seconds",
    "idle_seconds",
    "unmeasured_seconds",
    "failed_seconds",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "unrated_gpu_seconds",
    "output",
    "attempts",
    "failed_attempts",
    "retries",
    "failures",
    "queue_wait_seconds",
    "queue_waits",
]);

/// SQL reading `columns` of `{family}_{level}` for the projects matching `projects`, where
/// `time` lies in `[start, end)`.
fn level_rows(
    family: &str,
    level: &str,
    columns: &str,
    projects: &str,
    (time, start, end): (&str, &str, &str),
) -> String {
    format!(
        "SELECT {columns} FROM {family}_{level} \
         WHERE project_id {projects} AND {time} >= {start} AND {time} < {end}"
    )
}

/// The row sets reading a period's whole months, given the parameters of its first and end
/// month.
pub type MonthsSql<'a, T> = dyn Fn(&str, &str) -> Vec<T> + 'a;

/// A period `[from, to)` of ledger hours, split into the whole ledger months it covers,
/// the other whole ledger days, and the hours left over before and after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodSplit {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Whole days `[first_day, end_day)`, months included; empty when equal.
    pub first_day: NaiveDate,
    pub end_day: NaiveDate,
    /// Where the whole days begin and end; hours outside `[days_start, days_end)` are read
    /// from the hourly tables.
    pub days_start: DateTime<Utc>,
    pub days_end: DateTime<Utc>,
    /// Whole months `[first_month, end_month)` (first days of months) within the whole
    /// days; days outside them are read from the daily tables. Empty when equal.
    pub first_month: NaiveDate,
    pub end_month: NaiveDate,
    /// Where the whole months begin and end; for tables kept per month and hour only, hours
    /// outside `[months_start, months_end)` are read from the hourly ones. Both are `to`
    /// when the period holds no whole month.
    pub months_start: DateTime<Utc>,
    pub months_end: DateTime<Utc>,
}

impl PeriodSplit {
    /// Splits `[from, to)`; without `months`, whole months are read as days.
    pub fn new((from, to): (DateTime<Utc>, DateTime<Utc>), tz: Tz, months: bool) -> Self {
        let local_date = |at: DateTime<Utc>| at.with_timezone(&tz).date_naive();
        let mut first_day = local_date(from);
        if first_instant_of_day(first_day, tz) < from {
            first_day = first_day.succ_opt().unwrap_or(first_day);
        }
        let end_day = local_date(to);
        let days_start = first_instant_of_day(first_day, tz);
        let days_end = first_instant_of_day(end_day, tz);
        if first_day >= end_day || days_start >= days_end {
            return PeriodSplit {
                from,
                to,
                first_day,
                end_day: first_day,
                days_start: to,
                days_end: to,
                first_month: first_day,
                end_month: first_day,
                months_start: to,
                months_end: to,
            };
        }
        let mut first_month = first_of_month(first_day);
        if first_month < first_day {
            first_month = first_month
                .checked_add_months(Months::new(1))
                .unwrap_or(first_month);
        }
        let end_month = first_of_month(end_day);
        let (first_month, end_month, months_start, months_end) =
            if months && first_month < end_month {
                (
                    first_month,
                    end_month,
                    first_instant_of_day(first_month, tz),
                    first_instant_of_day(end_month, tz),
                )
            } else {
                (end_day, end_day, to, to)
            };
        PeriodSplit {
            from,
            to,
            first_day,
            end_day,
            days_start,
            days_end,
            first_month,
            end_month,
            months_start,
            months_end,
        }
    }

    /// SQL reading `columns` of a rollup family (`cost`, `records` or `util`) over the
    /// period, as one row set: whole months from `{family}_monthly`, other whole days from
    /// `{family}_daily`, other hours from `{family}_hourly`. In `columns`, `{key}` stands for
    /// the month, day or hour key, and `{month}` for the ledger month of the row (`tz` is the
    /// placeholder of the ledger time zone). The period's bounds are bound to `binder`. Parts
    /// of the period that are empty are left out: with no project to lead an index, even an
    /// empty range would otherwise scan a whole table.
    pub fn rows_sql(
        &self,
        binder: &mut Binder,
        family: &str,
        columns: &str,
        keys: (&str, &str, &str),
        projects: &str,
        tz: &str,
    ) -> String {
        self.row_sets_with_months::<String>(binder, family, columns, keys, projects, tz, None)
            .join(" UNION ALL ")
    }

    /// [`PeriodSplit::rows_sql`] as the `SELECT`s whose rows it is, each reading one table,
    /// with the whole months read by `months` when given: `SELECT`s of the same columns given
    /// the placeholders of the first and the end month. A caller that joins the rows to other
    /// tables can join each set on its own, which Citus runs on the workers where it would
    /// not run the join of their `UNION ALL`.
    #[expect(
        clippy::too_many_arguments,
        reason = "each names a part of the statement"
    )]
    pub fn row_sets_with_months<T: From<String> + Clone>(
        &self,
        binder: &mut Binder,
        family: &str,
        columns: &str,
        (month_key, day_key, hour_key): (&str, &str, &str),
        projects: &str,
        tz: &str,
        months: Option<&MonthsSql<'_, T>>,
    ) -> Vec<T> {
        let (from, to) = (binder.bind(self.from), binder.bind(self.to));
        let (first_day, end_day) = (binder.bind(self.first_day), binder.bind(self.end_day));
        let (days_start, days_end) = (binder.bind(self.days_start), binder.bind(self.days_end));
        let (first_month, end_month) = (binder.bind(self.first_month), binder.bind(self.end_month));
        let at_level =
            |key: &str, month: &str| columns.replace("{key}", key).replace("{month}", month);
        let monthly = at_level(month_key, "month");
        let daily = at_level(day_key, "date_trunc('month', day)::date");
        let hourly = at_level(hour_key, &Level::Month.of_hour(tz));
        let select = |columns: &str, level: &str, time: &str, start: &str, end: &str| {
            T::from(level_rows(
                family,
                level,
                columns,
                projects,
                (time, start, end),
            ))
        };
        let parts = [
            (
                self.first_month < self.end_month,
                match months {
                    Some(months) => months(&first_month, &end_month),
                    None => vec![select(
                        &monthly,
                        "monthly",
                        "month",
                        &first_month,
                        &end_month,
                    )],
                },
            ),
            (
                self.first_day < self.first_month,
                vec![select(&daily, "daily", "day", &first_day, &first_month)],
            ),
            (
                self.end_month < self.end_day,
                vec![select(&daily, "daily", "day", &end_month, &end_day)],
            ),
            (
                self.from < self.days_start,
                vec![select(&hourly, "hourly", "hour", &from, &days_start)],
            ),
            (
                self.days_end < self.to,
                vec![select(&hourly, "hourly", "hour", &days_end, &to)],
            ),
        ];
        let read: Vec<T> = parts
            .iter()
            .filter(|(covered, _)| *covered)
            .flat_map(|(_, sets)| sets.iter().cloned())
            .collect();
        match read.is_empty() {
            // An empty period still reads one (empty) range, for the columns' types.
            true => parts[3].1.clone(),
            false => read,
        }
    }

    /// SQL reading `columns` of a family kept per month and hour only (`task`) over the
    /// period, as one row set: whole months from `{family}_monthly`, every other hour from
    /// `{family}_hourly`. In `columns`, `{key}` stands for the month or hour key and `{month}`
    /// for the row's ledger month (`tz` the placeholder of the ledger time zone); the bounds
    /// are bound to `binder`.
    pub fn months_and_hours_sql(
        &self,
        binder: &mut Binder,
        family: &str,
        columns: &str,
        (month_key, hour_key): (&str, &str),
        projects: &str,
        tz: &str,
    ) -> String {
        let (from, to) = (binder.bind(self.from), binder.bind(self.to));
        let (first_month, end_month) = (binder.bind(self.first_month), binder.bind(self.end_month));
        let (months_start, months_end) =
            (binder.bind(self.months_start), binder.bind(self.months_end));
        let monthly = columns
            .replace("{key}", month_key)
            .replace("{month}", "month");
        let hourly = columns
            .replace("{key}", hour_key)
            .replace("{month}", &Level::Month.of_hour(tz));
        let select = |columns: &str, level: &str, time: &str, start: &str, end: &str| {
            level_rows(family, level, columns, projects, (time, start, end))
        };
        [
            select(&monthly, "monthly", "month", &first_month, &end_month),
            select(&hourly, "hourly", "hour", &from, &months_start),
            select(&hourly, "hourly", "hour", &months_end, &to),
        ]
        .join(" UNION ALL ")
    }
}

/// How many delta rows wait for compaction, over every rollup.
pub async fn pending_deltas(conn: &mut PgConnection) -> sqlx::Result<i64> {
    let sql = delta_tables()
        .iter()
        .map(|table| format!("(SELECT count(*) FROM {table} WHERE delta <> 0)"))
        .collect::<Vec<_>>()
        .join(" + ");
    // Dynamic: the tables are the rollup families' and the capacity rollups'.
    dynamic::query_scalar(&format!("SELECT {sql}"))
        .fetch_one(conn)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(y: i32, m: u32, d: u32, h: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, h, 0, 0).unwrap()
    }

    fn date(y: i32, m: u32, d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(y, m, d).unwrap()
    }

    fn months(split: &PeriodSplit) -> (NaiveDate, NaiveDate) {
        (split.first_month, split.end_month)
    }

    #[test]
    fn a_month_is_one_whole_month() {
        let period = (at(2026, 11, 1, 0), at(2026, 12, 1, 0));
        let split = PeriodSplit::new(period, chrono_tz::UTC, true);
        assert_eq!(months(&split), (date(2026, 11, 1), date(2026, 12, 1)));
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 1), date(2026, 12, 1))
        );
        assert_eq!((split.days_start, split.days_end), (split.from, split.to));
        assert_eq!(
            (split.months_start, split.months_end),
            (split.from, split.to)
        );
        // Read by the day, it is 30 whole days.
        let split = PeriodSplit::new(period, chrono_tz::UTC, false);
        assert_eq!(split.first_month, split.end_month);
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 1), date(2026, 12, 1))
        );
    }

    #[test]
    fn days_and_hours_around_whole_months() {
        let period = (at(2026, 10, 14, 5), at(2027, 1, 3, 7));
        let split = PeriodSplit::new(period, chrono_tz::UTC, true);
        assert_eq!(months(&split), (date(2026, 11, 1), date(2027, 1, 1)));
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 10, 15), date(2027, 1, 3))
        );
        assert_eq!(
            (split.days_start, split.days_end),
            (at(2026, 10, 15, 0), at(2027, 1, 3, 0))
        );
        assert_eq!(
            (split.months_start, split.months_end),
            (at(2026, 11, 1, 0), at(2027, 1, 1, 0))
        );
    }

    #[test]
    fn hours_outside_whole_days_are_edges() {
        let period = (at(2026, 11, 3, 5), at(2026, 11, 9, 7));
        let split = PeriodSplit::new(period, chrono_tz::UTC, true);
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 4), date(2026, 11, 9))
        );
        assert_eq!(split.first_month, split.end_month);
        assert_eq!(split.days_start, at(2026, 11, 4, 0));
        assert_eq!(split.days_end, at(2026, 11, 9, 0));
        // Without a whole month, tables kept per month and hour are read by the hour.
        assert_eq!((split.months_start, split.months_end), (split.to, split.to));
    }

    #[test]
    fn less_than_a_day_is_all_hours() {
        let period = (at(2026, 11, 3, 5), at(2026, 11, 4, 3));
        let split = PeriodSplit::new(period, chrono_tz::UTC, true);
        assert_eq!(split.first_day, split.end_day);
        assert_eq!(split.first_month, split.end_month);
        assert_eq!((split.days_start, split.days_end), (split.to, split.to));
    }

    #[test]
    fn days_and_months_are_the_ledgers() {
        let tz = chrono_tz::America::New_York;
        // November in New York: the 1st begins at 04:00 UTC (EDT), December at 05:00 (EST).
        let split = PeriodSplit::new((at(2026, 11, 1, 4), at(2026, 12, 1, 5)), tz, true);
        assert_eq!(months(&split), (date(2026, 11, 1), date(2026, 12, 1)));
        assert_eq!((split.days_start, split.days_end), (split.from, split.to));
        assert_eq!(
            (split.months_start, split.months_end),
            (split.from, split.to)
        );
        // Cut an hour into the first day: that day is read by the hour, the rest by the day.
        let split = PeriodSplit::new((at(2026, 11, 1, 5), at(2026, 12, 1, 5)), tz, true);
        assert_eq!(split.first_month, split.end_month);
        assert_eq!(split.first_day, date(2026, 11, 2));
        assert_eq!(split.days_start, at(2026, 11, 2, 5));
        assert_eq!((split.months_start, split.months_end), (split.to, split.to));
        // November is the only whole month; it begins at 04:00 UTC (EDT), December at 05:00.
        let split = PeriodSplit::new((at(2026, 10, 20, 4), at(2026, 12, 31, 5)), tz, true);
        assert_eq!(months(&split), (date(2026, 11, 1), date(2026, 12, 1)));
        assert_eq!(
            (split.months_start, split.months_end),
            (at(2026, 11, 1, 4), at(2026, 12, 1, 5))
        );
    }

    #[test]
    fn the_hourly_utilisation_view_judges_looks_busy_by_the_same_thresholds() {
        let views = include_str!("../../migrations/0014_prices_applied_when_read.sql");
        assert!(views.contains(&format!(
            "gpu_util >= {LOOKS_BUSY_GPU_UTIL} AND sm_active < {LOOKS_BUSY_SM_ACTIVE}"
        )));
    }
}
