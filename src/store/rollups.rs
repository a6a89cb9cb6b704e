//! The rollup tables every cost figure is read from, and their upkeep.
//!
//! Rating appends its changes as delta rows (`delta <> 0`), so that concurrent writers never
//! wait on each other's rollup rows; [`compact`] folds them into the compacted rows
//! (`delta = 0`). Every read sums all rows of a key, so figures are exact whether or not
//! compaction has run. A period is read from the daily tables for its whole ledger days and
//! from the hourly ones for the hours left over.

use anyhow::Context;
use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use sqlx::{PgConnection, PgPool};

use crate::domain::ledger_time::first_instant_of_day;

/// One rollup table: its key columns (without `delta`), the columns it sums, and the count
/// that is zero exactly when nothing is left under a key.
struct Rollup {
    table: &'static str,
    constraint: &'static str,
    key: &'static [&'static str],
    sums: &'static [&'static str],
    count: &'static str,
}

const COST_SUMS: &[&str] = &[
    "segments",
    "gpu_seconds_held",
    "gpu_seconds_busy",
    "cost",
    "productive",
    "idle",
    "unmeasured",
    "failed",
    "output_quantity",
];
const RECORD_SUMS: &[&str] = &[
    "records",
    "retries",
    "failures",
    "tasks_completed",
    "tasks_failed",
];

const ROLLUPS: [Rollup; 5] = [
    Rollup {
        table: "cost_hourly",
        constraint: "cost_hourly_key",
        key: &[
            "project_id",
            "hour",
            "gpu_model",
            "billing_mode",
            "outcome",
            "contract_id",
            "unrated_reason",
            "output_unit",
        ],
        sums: COST_SUMS,
        count: "segments",
    },
    Rollup {
        table: "cost_daily",
        constraint: "cost_daily_key",
        key: &[
            "project_id",
            "day",
            "gpu_model",
            "billing_mode",
            "outcome",
            "contract_id",
            "unrated_reason",
            "output_unit",
        ],
        sums: COST_SUMS,
        count: "segments",
    },
    Rollup {
        table: "records_hourly",
        constraint: "records_hourly_pkey",
        key: &["project_id", "hour", "gpu_model", "billing_mode", "outcome"],
        sums: RECORD_SUMS,
        count: "records",
    },
    Rollup {
        table: "records_daily",
        constraint: "records_daily_pkey",
        key: &["project_id", "day", "gpu_model", "billing_mode", "outcome"],
        sums: RECORD_SUMS,
        count: "records",
    },
    Rollup {
        table: "contract_usage_hourly",
        constraint: "contract_usage_hourly_pkey",
        key: &["contract_id", "hour", "project_id"],
        sums: &["segments", "gpu_seconds_held"],
        count: "segments",
    },
];

/// Compaction runs in one transaction at a time, across replicas.
const COMPACTION_LOCK: (i32, i32) = (0x726f_6c6c, 1);
const SETTING_TIMEZONE: &str = "rollup_timezone";

impl Rollup {
    /// Folds every committed delta row into the compacted rows, in key order, and returns
    /// the row ids of compacted rows left empty.
    fn compaction_sql(&self) -> String {
        let key = self.key.join(", ");
        let sums = self.sums.join(", ");
        let merged = self
            .sums
            .iter()
            .map(|column| format!("sum({column}) AS {column}"))
            .collect::<Vec<_>>()
            .join(", ");
        let updates = self
            .sums
            .iter()
            .map(|column| format!("{column} = t.{column} + EXCLUDED.{column}"))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "WITH moved AS (DELETE FROM {table} WHERE delta <> 0 RETURNING *), \
             merged AS (SELECT {key}, {merged} FROM moved GROUP BY {key}), \
             upserted AS ( \
               INSERT INTO {table} AS t ({key}, {sums}, delta) \
               SELECT {key}, {sums}, 0 FROM merged ORDER BY {key} \
               ON CONFLICT ON CONSTRAINT {constraint} DO UPDATE SET {updates} \
               RETURNING t.ctid::text AS row_id, t.{count} AS remaining) \
             SELECT (SELECT count(*) FROM moved), \
                    ARRAY(SELECT row_id FROM upserted WHERE remaining = 0)",
            table = self.table,
            constraint = self.constraint,
            count = self.count,
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
    let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_xact_lock($1, $2)")
        .bind(COMPACTION_LOCK.0)
        .bind(COMPACTION_LOCK.1)
        .fetch_one(&mut *tx)
        .await?;
    if !locked {
        return Ok(None);
    }
    let mut done = Compaction::default();
    for rollup in &ROLLUPS {
        let (moved, emptied): (i64, Vec<String>) = sqlx::query_as(&rollup.compaction_sql())
            .fetch_one(&mut *tx)
            .await
            .with_context(|| format!("compacting {}", rollup.table))?;
        if !emptied.is_empty() {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE ctid = ANY($1::text[]::tid[]) \
                 AND delta = 0 AND {count} = 0",
                table = rollup.table,
                count = rollup.count,
            ))
            .bind(&emptied)
            .execute(&mut *tx)
            .await
            .with_context(|| format!("removing emptied {} rows", rollup.table))?;
        }
        done.delta_rows += moved;
        done.emptied_rows += emptied.len();
    }
    tx.commit().await?;
    Ok(Some(done))
}

/// Rebuilds the daily rollups from the hourly ones when they were built for another ledger
/// time zone than `tz` (or never recorded one), so that a day is always a ledger day.
/// Returns whether it rebuilt them.
pub async fn align_days(pool: &PgPool, tz: Tz) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
        .bind(COMPACTION_LOCK.0)
        .bind(COMPACTION_LOCK.1)
        .execute(&mut *tx)
        .await?;
    let built_for: Option<String> = sqlx::query_scalar("SELECT value FROM settings WHERE key = $1")
        .bind(SETTING_TIMEZONE)
        .fetch_optional(&mut *tx)
        .await?;
    if built_for.as_deref() == Some(tz.name()) {
        return Ok(false);
    }
    // Writers append to the daily tables; this waits for them and keeps them out meanwhile.
    sqlx::query("LOCK TABLE cost_daily, records_daily IN EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await?;
    sqlx::raw_sql("DELETE FROM cost_daily; DELETE FROM records_daily")
        .execute(&mut *tx)
        .await?;
    let cost = COST_SUMS
        .iter()
        .map(|column| format!("sum({column})"))
        .collect::<Vec<_>>()
        .join(", ");
    sqlx::query(&format!(
        "INSERT INTO cost_daily (project_id, day, gpu_model, billing_mode, outcome, contract_id, \
                                 unrated_reason, output_unit, {columns}) \
         SELECT project_id, (hour AT TIME ZONE $1)::date, gpu_model, billing_mode, outcome, \
                contract_id, unrated_reason, output_unit, {cost} \
         FROM cost_hourly GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 HAVING sum(segments) <> 0",
        columns = COST_SUMS.join(", "),
    ))
    .bind(tz.name())
    .execute(&mut *tx)
    .await
    .context("rebuilding cost_daily")?;
    let records = RECORD_SUMS
        .iter()
        .map(|column| format!("sum({column})"))
        .collect::<Vec<_>>()
        .join(", ");
    sqlx::query(&format!(
        "INSERT INTO records_daily (project_id, day, gpu_model, billing_mode, outcome, {columns}) \
         SELECT project_id, (hour AT TIME ZONE $1)::date, gpu_model, billing_mode, outcome, \
                {records} \
         FROM records_hourly GROUP BY 1, 2, 3, 4, 5 HAVING sum(records) <> 0",
        columns = RECORD_SUMS.join(", "),
    ))
    .bind(tz.name())
    .execute(&mut *tx)
    .await
    .context("rebuilding records_daily")?;
    sqlx::query(
        "INSERT INTO settings (key, value) VALUES ($1, $2) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    )
    .bind(SETTING_TIMEZONE)
    .bind(tz.name())
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(true)
}

/// A period `[from, to)` of ledger hours, split into the whole ledger days it covers and
/// the hours before and after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeriodSplit {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Whole days `[first_day, end_day)`; empty when equal.
    pub first_day: NaiveDate,
    pub end_day: NaiveDate,
    /// Where the whole days begin and end; hours outside `[days_start, days_end)` are read
    /// from the hourly tables.
    pub days_start: DateTime<Utc>,
    pub days_end: DateTime<Utc>,
}

impl PeriodSplit {
    pub fn new((from, to): (DateTime<Utc>, DateTime<Utc>), tz: Tz) -> Self {
        let local_date = |at: DateTime<Utc>| at.with_timezone(&tz).date_naive();
        let mut first_day = local_date(from);
        if first_instant_of_day(first_day, tz) < from {
            first_day = first_day.succ_opt().unwrap_or(first_day);
        }
        let end_day = local_date(to);
        let days_start = first_instant_of_day(first_day, tz);
        let days_end = first_instant_of_day(end_day, tz);
        if first_day < end_day && days_start < days_end {
            PeriodSplit {
                from,
                to,
                first_day,
                end_day,
                days_start,
                days_end,
            }
        } else {
            PeriodSplit {
                from,
                to,
                first_day,
                end_day: first_day,
                days_start: to,
                days_end: to,
            }
        }
    }

    /// SQL reading `columns` of a rollup family (`cost` or `records`) over the period, as
    /// one row set: whole days from `{family}_daily`, other hours from `{family}_hourly`.
    /// In `columns`, `{time}` stands for the table's `day` or `hour` column and `{key}` for
    /// `day_key` or `hour_key`. `$n` are bound by [`PeriodSplit::bind`] from `first`.
    pub fn rows_sql(
        family: &str,
        columns: &str,
        (day_key, hour_key): (&str, &str),
        projects: &str,
        first: usize,
    ) -> String {
        let p = |offset: usize| format!("${}", first + offset);
        let daily = columns.replace("{key}", day_key).replace("{time}", "day");
        let hourly = columns.replace("{key}", hour_key).replace("{time}", "hour");
        format!(
            "SELECT {daily} FROM {family}_daily \
             WHERE project_id {projects} AND day >= {first_day} AND day < {end_day} \
             UNION ALL \
             SELECT {hourly} FROM {family}_hourly \
             WHERE project_id {projects} AND hour >= {from} AND hour < {days_start} \
             UNION ALL \
             SELECT {hourly} FROM {family}_hourly \
             WHERE project_id {projects} AND hour >= {days_end} AND hour < {to}",
            from = p(0),
            to = p(1),
            first_day = p(2),
            end_day = p(3),
            days_start = p(4),
            days_end = p(5),
        )
    }

    /// Binds the six parameters [`PeriodSplit::rows_sql`] uses, in its order.
    pub fn bind<'q, O>(
        &self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(self.from)
            .bind(self.to)
            .bind(self.first_day)
            .bind(self.end_day)
            .bind(self.days_start)
            .bind(self.days_end)
    }
}

/// How many delta rows wait for compaction, over every rollup.
pub async fn pending_deltas(conn: &mut PgConnection) -> sqlx::Result<i64> {
    let sql = ROLLUPS
        .iter()
        .map(|r| format!("(SELECT count(*) FROM {} WHERE delta <> 0)", r.table))
        .collect::<Vec<_>>()
        .join(" + ");
    sqlx::query_scalar(&format!("SELECT {sql}"))
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

    #[test]
    fn a_month_is_whole_days() {
        let split = PeriodSplit::new((at(2026, 11, 1, 0), at(2026, 12, 1, 0)), chrono_tz::UTC);
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 1), date(2026, 12, 1))
        );
        assert_eq!((split.days_start, split.days_end), (split.from, split.to));
    }

    #[test]
    fn hours_outside_whole_days_are_edges() {
        let split = PeriodSplit::new((at(2026, 11, 3, 5), at(2026, 11, 9, 7)), chrono_tz::UTC);
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 4), date(2026, 11, 9))
        );
        assert_eq!(split.days_start, at(2026, 11, 4, 0));
        assert_eq!(split.days_end, at(2026, 11, 9, 0));
    }

    #[test]
    fn less_than_a_day_is_all_hours() {
        let split = PeriodSplit::new((at(2026, 11, 3, 5), at(2026, 11, 4, 3)), chrono_tz::UTC);
        assert_eq!(split.first_day, split.end_day);
        assert_eq!((split.days_start, split.days_end), (split.to, split.to));
    }

    #[test]
    fn days_are_ledger_days() {
        let tz = chrono_tz::America::New_York;
        // November in New York: the 1st begins at 04:00 UTC (EDT), December at 05:00 (EST).
        let split = PeriodSplit::new((at(2026, 11, 1, 4), at(2026, 12, 1, 5)), tz);
        assert_eq!(
            (split.first_day, split.end_day),
            (date(2026, 11, 1), date(2026, 12, 1))
        );
        assert_eq!((split.days_start, split.days_end), (split.from, split.to));
        // Cut an hour into the first day: it is read by the hour.
        let split = PeriodSplit::new((at(2026, 11, 1, 5), at(2026, 12, 1, 5)), tz);
        assert_eq!(split.first_day, date(2026, 11, 2));
        assert_eq!(split.days_start, at(2026, 11, 2, 5));
    }
}
