//! The rollup tables every cost figure is read from, and their upkeep.
//!
//! Rating appends its changes as delta rows (`delta <> 0`), so that concurrent writers never
//! wait on each other's rollup rows; [`compact`] folds them into the compacted rows
//! (`delta = 0`). Every read sums all rows of a key, so figures are exact whether or not
//! compaction has run. A period is read from the monthly tables for its whole ledger months,
//! from the daily ones for its other whole ledger days, and from the hourly ones for the
//! hours left over.

use anyhow::Context;
use chrono::{DateTime, Months, NaiveDate, Utc};
use chrono_tz::Tz;
use sqlx::{PgConnection, PgPool};

use crate::domain::ledger_time::{first_instant_of_day, first_of_month};

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

const ROLLUPS: [Rollup; 7] = [
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
        table: "cost_monthly",
        constraint: "cost_monthly_key",
        key: &[
            "project_id",
            "month",
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
        table: "records_monthly",
        constraint: "records_monthly_pkey",
        key: &[
            "project_id",
            "month",
            "gpu_model",
            "billing_mode",
            "outcome",
        ],
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

/// Rebuilds the daily and monthly rollups from the hourly ones when they were built for
/// another ledger time zone than `tz` (or never recorded one), so that their days and months
/// are those of the ledger. Returns whether it rebuilt them.
pub async fn align_to_time_zone(pool: &PgPool, tz: Tz) -> anyhow::Result<bool> {
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
    // Writers append to these tables; this waits for them and keeps them out meanwhile.
    sqlx::query(
        "LOCK TABLE cost_daily, records_daily, cost_monthly, records_monthly IN EXCLUSIVE MODE",
    )
    .execute(&mut *tx)
    .await?;
    let cost = COST_SUMS
        .iter()
        .map(|column| format!("sum({column})"))
        .collect::<Vec<_>>()
        .join(", ");
    let records = RECORD_SUMS
        .iter()
        .map(|column| format!("sum({column})"))
        .collect::<Vec<_>>()
        .join(", ");
    let periods = [
        ("day", "(hour AT TIME ZONE $1)::date"),
        ("month", "date_trunc('month', hour AT TIME ZONE $1)::date"),
    ];
    for (table, period) in [("daily", periods[0]), ("monthly", periods[1])] {
        let (column, expression) = period;
        sqlx::raw_sql(&format!(
            "DELETE FROM cost_{table}; DELETE FROM records_{table}"
        ))
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "INSERT INTO cost_{table} (project_id, {column}, gpu_model, billing_mode, outcome, \
                                       contract_id, unrated_reason, output_unit, {columns}) \
             SELECT project_id, {expression}, gpu_model, billing_mode, outcome, contract_id, \
                    unrated_reason, output_unit, {cost} \
             FROM cost_hourly GROUP BY 1, 2, 3, 4, 5, 6, 7, 8 HAVING sum(segments) <> 0",
            columns = COST_SUMS.join(", "),
        ))
        .bind(tz.name())
        .execute(&mut *tx)
        .await
        .with_context(|| format!("rebuilding cost_{table}"))?;
        sqlx::query(&format!(
            "INSERT INTO records_{table} (project_id, {column}, gpu_model, billing_mode, \
                                          outcome, {columns}) \
             SELECT project_id, {expression}, gpu_model, billing_mode, outcome, {records} \
             FROM records_hourly GROUP BY 1, 2, 3, 4, 5 HAVING sum(records) <> 0",
            columns = RECORD_SUMS.join(", "),
        ))
        .bind(tz.name())
        .execute(&mut *tx)
        .await
        .with_context(|| format!("rebuilding records_{table}"))?;
    }
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
            };
        }
        let mut first_month = first_of_month(first_day);
        if first_month < first_day {
            first_month = first_month
                .checked_add_months(Months::new(1))
                .unwrap_or(first_month);
        }
        let end_month = first_of_month(end_day);
        let (first_month, end_month) = if months && first_month < end_month {
            (first_month, end_month)
        } else {
            (end_day, end_day)
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
        }
    }

    /// SQL reading `columns` of a rollup family (`cost` or `records`) over the period, as
    /// one row set: whole months from `{family}_monthly`, other whole days from
    /// `{family}_daily`, other hours from `{family}_hourly`. In `columns`, `{key}` stands for
    /// the month, day or hour key. `$n` are bound by [`PeriodSplit::bind`] from `first`.
    pub fn rows_sql(
        family: &str,
        columns: &str,
        (month_key, day_key, hour_key): (&str, &str, &str),
        projects: &str,
        first: usize,
    ) -> String {
        let p = |offset: usize| format!("${}", first + offset);
        let (from, to, first_day, end_day) = (p(0), p(1), p(2), p(3));
        let (days_start, days_end, first_month, end_month) = (p(4), p(5), p(6), p(7));
        let monthly = columns.replace("{key}", month_key);
        let daily = columns.replace("{key}", day_key);
        let hourly = columns.replace("{key}", hour_key);
        let select = |columns: &str, level: &str, time: &str, start: &str, end: &str| {
            format!(
                "SELECT {columns} FROM {family}_{level} \
                 WHERE project_id {projects} AND {time} >= {start} AND {time} < {end}"
            )
        };
        [
            select(&monthly, "monthly", "month", &first_month, &end_month),
            select(&daily, "daily", "day", &first_day, &first_month),
            select(&daily, "daily", "day", &end_month, &end_day),
            select(&hourly, "hourly", "hour", &from, &days_start),
            select(&hourly, "hourly", "hour", &days_end, &to),
        ]
        .join(" UNION ALL ")
    }

    /// Binds the eight parameters [`PeriodSplit::rows_sql`] uses, in its order.
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
            .bind(self.first_month)
            .bind(self.end_month)
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
        // Cut an hour into the first day: that day is read by the hour, the rest by the day.
        let split = PeriodSplit::new((at(2026, 11, 1, 5), at(2026, 12, 1, 5)), tz, true);
        assert_eq!(split.first_month, split.end_month);
        assert_eq!(split.first_day, date(2026, 11, 2));
        assert_eq!(split.days_start, at(2026, 11, 2, 5));
    }
}
