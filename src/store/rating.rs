//! Rating stored: each record's segments, its per-record figures and the rollups they add
//! up to. [`rate_records`] is the one way in, with [`reprice_records`] for a change of price
//! alone; whatever changes a record, a contract or an FX rate calls one of them in the same
//! transaction.

use std::collections::{HashMap, HashSet};

use anyhow::Context;
use chrono::{DateTime, Days, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::gpu::COMPUTE_SLICES;
use crate::domain::ledger_time::{LedgerHour, first_of_month};
use crate::domain::rating::{BillingMode, Contract, Outcome, RecordToRate, rate_record};
use crate::domain::record::{RecordKey, Telemetry, duration_seconds};
use crate::domain::task::{AttemptEnd, TaskStatus, task_marks, task_status};
use crate::domain::utilisation::{SegmentTelemetry, busy_seconds};
use crate::store::records::TelemetryRow;
use crate::store::rollups::{self, Family, Level};
use crate::store::{contracts, fx_rates, tasks as task_ledger};

/// The most hourly segments one rating call is asked to make. A call holds its segments in
/// memory, so this bounds the memory of rating, whatever the batch: records of up to a month
/// make up to 745 segments each.
pub const SEGMENTS_PER_CALL: i64 = 10_000;

#[derive(Debug, sqlx::FromRow)]
struct RecordRow {
    project_id: String,
    task_id: String,
    attempt: i32,
    gpu_model: String,
    #[sqlx(try_from = "String")]
    billing_mode: BillingMode,
    provider: Option<String>,
    region: Option<String>,
    queued_at: Option<DateTime<Utc>>,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    gpu_seconds_held: Decimal,
    gpu_seconds_busy: Option<Decimal>,
    #[sqlx(try_from = "String")]
    outcome: Outcome,
    retries: i32,
    failures: i32,
    output_quantity: Option<Decimal>,
    output_unit: Option<String>,
    #[sqlx(flatten)]
    telemetry: TelemetryRow,
    currency: String,
}

impl RecordRow {
    fn to_end(&self) -> AttemptEnd {
        AttemptEnd {
            attempt: self.attempt,
            outcome: self.outcome,
            started_at: self.started_at,
            ended_at: self.ended_at,
        }
    }

    fn to_rate(&self, telemetry: &Telemetry) -> RecordToRate {
        RecordToRate {
            project: self.project_id.clone(),
            gpu_model: self.gpu_model.clone(),
            billing_mode: self.billing_mode,
            provider: self.provider.clone(),
            region: self.region.clone(),
            currency: self.currency.clone(),
            started_at: self.started_at,
            ended_at: self.ended_at,
            gpu_seconds_held: self.gpu_seconds_held,
            gpu_seconds_busy: busy_seconds(
                self.gpu_seconds_busy,
                self.gpu_seconds_held,
                telemetry.sm_active,
            ),
            outcome: self.outcome,
            compute_share: telemetry
                .mig(&self.gpu_model)
                .map(|profile| profile.compute_share()),
        }
    }
}

/// New `rated_segments` rows, column by column, for `UNNEST`.
#[derive(Default)]
struct SegmentColumns {
    project_id: Vec<String>,
    task_id: Vec<String>,
    attempt: Vec<i32>,
    seq: Vec<i32>,
    hour: Vec<DateTime<Utc>>,
    gpu_model: Vec<String>,
    billing_mode: Vec<String>,
    outcome: Vec<String>,
    contract_id: Vec<Option<Uuid>>,
    unrated_reason: Vec<Option<String>>,
    output_unit: Vec<Option<String>>,
    gpu_seconds_held: Vec<Decimal>,
    gpu_seconds_busy: Vec<Option<Decimal>>,
    cost: Vec<Option<Decimal>>,
    productive: Vec<Decimal>,
    idle: Vec<Decimal>,
    unmeasured: Vec<Decimal>,
    failed: Vec<Decimal>,
    output_quantity: Vec<Option<Decimal>>,
    gpu_util: Vec<Option<Decimal>>,
    sm_active: Vec<Option<Decimal>>,
    tensor_active: Vec<Option<Decimal>>,
    dram_active: Vec<Option<Decimal>>,
    memory_used_share: Vec<Option<Decimal>>,
    mig_slices: Vec<Option<i16>>,
}

impl SegmentColumns {
    fn push_record(
        &mut self,
        row: &RecordRow,
        contracts: &[Contract],
        fx: &fx_rates::RateTable,
        tz: Tz,
    ) -> anyhow::Result<()> {
        let telemetry = row.telemetry.to_telemetry();
        let record = row.to_rate(&telemetry);
        let segments = rate_record(&record, contracts, fx, tz);
        let carried = SegmentTelemetry::of(&telemetry);
        let mig_slices = record
            .compute_share
            .map(|share| i16::try_from(share.slices))
            .transpose()
            .context("MIG slices out of range")?;
        // Output belongs to completed records and is booked where the record ends.
        let output = match record.outcome {
            Outcome::Completed => row.output_unit.as_ref().zip(row.output_quantity),
            _ => None,
        };
        let last = segments.len().saturating_sub(1);
        for (seq, segment) in segments.into_iter().enumerate() {
            self.project_id.push(row.project_id.clone());
            self.task_id.push(row.task_id.clone());
            self.attempt.push(row.attempt);
            self.seq
                .push(i32::try_from(seq).context("too many segments in one record")?);
            self.hour.push(segment.hour);
            self.gpu_model.push(row.gpu_model.clone());
            self.billing_mode.push(row.billing_mode.as_str().to_owned());
            self.outcome.push(row.outcome.as_str().to_owned());
            self.contract_id.push(segment.contract_id);
            self.unrated_reason
                .push(segment.unrated.map(|reason| reason.as_str().to_owned()));
            self.output_unit.push(output.map(|(unit, _)| unit.clone()));
            self.gpu_seconds_held.push(segment.gpu_seconds_held);
            self.gpu_seconds_busy.push(segment.gpu_seconds_busy);
            self.cost.push(segment.cost);
            self.productive.push(segment.parts.productive);
            self.idle.push(segment.parts.idle);
            self.unmeasured.push(segment.parts.unmeasured);
            self.failed.push(segment.parts.failed);
            self.output_quantity
                .push(output.filter(|_| seq == last).map(|(_, quantity)| quantity));
            self.gpu_util.push(carried.gpu_util);
            self.sm_active.push(carried.sm_active);
            self.tensor_active.push(carried.tensor_active);
            self.dram_active.push(carried.dram_active);
            self.memory_used_share.push(carried.memory_used_share);
            self.mig_slices.push(mig_slices);
        }
        Ok(())
    }

    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.project_id)
            .bind(&self.task_id)
            .bind(&self.attempt)
            .bind(&self.seq)
            .bind(&self.hour)
            .bind(&self.gpu_model)
            .bind(&self.billing_mode)
            .bind(&self.outcome)
            .bind(&self.contract_id)
            .bind(&self.unrated_reason)
            .bind(&self.output_unit)
            .bind(&self.gpu_seconds_held)
            .bind(&self.gpu_seconds_busy)
            .bind(&self.cost)
            .bind(&self.productive)
            .bind(&self.idle)
            .bind(&self.unmeasured)
            .bind(&self.failed)
            .bind(&self.output_quantity)
            .bind(&self.gpu_util)
            .bind(&self.sm_active)
            .bind(&self.tensor_active)
            .bind(&self.dram_active)
            .bind(&self.memory_used_share)
            .bind(&self.mig_slices)
    }
}

const NEW_SEGMENTS: &str = "UNNEST($1::text[], $2::text[], $3::int[], $4::int[], \
     $5::timestamptz[], $6::text[], $7::text[], $8::text[], $9::uuid[], $10::text[], $11::text[], \
     $12::numeric[], $13::numeric[], $14::numeric[], $15::numeric[], $16::numeric[], \
     $17::numeric[], $18::numeric[], $19::numeric[], $20::numeric[], $21::numeric[], \
     $22::numeric[], $23::numeric[], $24::numeric[], $25::smallint[]) \
     AS s(project_id, task_id, attempt, seq, hour, gpu_model, billing_mode, outcome, contract_id, \
          unrated_reason, output_unit, gpu_seconds_held, gpu_seconds_busy, cost, productive, idle, \
          unmeasured, failed, output_quantity, gpu_util, sm_active, tensor_active, dram_active, \
          memory_used_share, mig_slices)";

/// A stored segment (`rated_segments` columns) as a change taken out: `sign` -1 and its
/// figures negated, so that every sum over a change is a plain sum.
const OLD_SEGMENT: &str = "-1 AS sign, project_id, task_id, attempt, seq, hour, gpu_model, \
     billing_mode, outcome, contract_id, unrated_reason, output_unit, \
     -gpu_seconds_held AS gpu_seconds_held, -gpu_seconds_busy AS gpu_seconds_busy, -cost AS cost, \
     -productive AS productive, -idle AS idle, -unmeasured AS unmeasured, -failed AS failed, \
     -output_quantity AS output_quantity, gpu_util, sm_active, tensor_active, dram_active, \
     memory_used_share, mig_slices";

/// The columns of [`RecordRow`] from `job_records r`, which the keys `k` are joined to. The
/// project's currency is looked up per row: joined, the project could lead the plan and the
/// records be found by project alone.
const RECORDS: &str = "r.project_id, r.task_id, r.attempt, r.gpu_model, r.billing_mode, \
     r.provider, r.region, r.queued_at, r.started_at, r.ended_at, r.gpu_seconds_held, \
     r.gpu_seconds_busy, r.outcome, r.retries, r.failures, r.output_quantity, r.output_unit, \
     r.gpu_util, r.sm_active, r.tensor_active, r.dram_active, r.memory_peak_gib, \
     r.memory_total_gib, r.mig_profile, \
     (SELECT p.currency FROM projects p WHERE p.id = r.project_id) AS currency \
     FROM job_records r";

/// CTEs appending the changes in the CTE `diff` (summed per hourly key) to `family`'s daily
/// and monthly rollups, tagged with the delta number in the CTE `tag`; `tz` is the parameter
/// holding the time zone. (Its hourly rollup is a view over what rating stores.)
fn append_diff(family: Family, diff: &str, tz: &str) -> String {
    Level::STORED
        .iter()
        .enumerate()
        .map(|(i, &level)| {
            let append =
                rollups::append_sql(family, level, tz, &format!("{diff}, tag"), "min(tag.delta)");
            format!("{diff}_append_{i} AS ({append})")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A CTE `diff` of the cost sums (see `cost_hourly`) and the card-seconds of reserved
/// capacity the segment changes in `changes` make, per hourly key.
fn cost_diff(changes: &str) -> String {
    format!(
        "diff AS ( \
           SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, \
                  unrated_reason, output_unit, \
                  sum(sign) AS segments, \
                  sum(gpu_seconds_held) AS gpu_seconds_held, \
                  sum(coalesce(gpu_seconds_busy, 0)) AS gpu_seconds_busy, \
                  sum(coalesce(cost, 0)) AS cost, \
                  sum(productive) AS productive, sum(idle) AS idle, \
                  sum(unmeasured) AS unmeasured, sum(failed) AS failed, \
                  sum(coalesce(output_quantity, 0)) AS output_quantity, \
                  sum(CASE WHEN mig_slices IS NULL THEN gpu_seconds_held \
                           ELSE gpu_seconds_held * mig_slices / {COMPUTE_SLICES} END) \
                      AS card_seconds_held \
           FROM {changes} \
           GROUP BY project_id, hour, gpu_model, billing_mode, outcome, contract_id, \
                    unrated_reason, output_unit)"
    )
}

/// A CTE `util_diff` of the utilisation sums (see `util_hourly`) the segment changes in
/// `changes` make, per hourly key; only segments with some telemetry take part.
fn util_diff(changes: &str) -> String {
    format!(
        "util_diff AS ( \
           SELECT project_id, hour, gpu_model, billing_mode, outcome, sum(sign) AS segments, \
                  {sums} \
           FROM {changes} WHERE {with_telemetry} \
           GROUP BY project_id, hour, gpu_model, billing_mode, outcome)",
        sums = rollups::util_sums_sql(""),
        with_telemetry = rollups::has_telemetry_sql(""),
    )
}

/// New `rated_records` rows, column by column.
#[derive(Default)]
struct RecordColumns {
    project_id: Vec<String>,
    task_id: Vec<String>,
    attempt: Vec<i32>,
    end_hour: Vec<DateTime<Utc>>,
    gpu_model: Vec<String>,
    billing_mode: Vec<String>,
    outcome: Vec<String>,
    retries: Vec<i32>,
    failures: Vec<i32>,
    completes_task: Vec<bool>,
    fails_task: Vec<bool>,
    queue_wait_seconds: Vec<Option<Decimal>>,
}

impl RecordColumns {
    /// Every attempt of one task, with the marks that count the task once (COST_MODEL §4);
    /// returns the task's status.
    fn push_task(&mut self, attempts: &[RecordRow], tz: Tz) -> Option<TaskStatus> {
        let ends: Vec<AttemptEnd> = attempts.iter().map(RecordRow::to_end).collect();
        let marks = task_marks(&ends);
        for attempt in attempts {
            self.project_id.push(attempt.project_id.clone());
            self.task_id.push(attempt.task_id.clone());
            self.attempt.push(attempt.attempt);
            self.end_hour
                .push(LedgerHour::holding(attempt.ended_at, tz).start);
            self.gpu_model.push(attempt.gpu_model.clone());
            self.billing_mode
                .push(attempt.billing_mode.as_str().to_owned());
            self.outcome.push(attempt.outcome.as_str().to_owned());
            self.retries.push(attempt.retries);
            self.failures.push(attempt.failures);
            self.completes_task
                .push(marks.completes == Some(attempt.attempt));
            self.fails_task.push(marks.fails == Some(attempt.attempt));
            self.queue_wait_seconds.push(
                attempt
                    .queued_at
                    .map(|queued| duration_seconds(queued, attempt.started_at)),
            );
        }
        task_status(&ends)
    }
}

impl RecordColumns {
    fn bind<'q, O>(
        &'q self,
        query: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
        query
            .bind(&self.project_id)
            .bind(&self.task_id)
            .bind(&self.attempt)
            .bind(&self.end_hour)
            .bind(&self.gpu_model)
            .bind(&self.billing_mode)
            .bind(&self.outcome)
            .bind(&self.retries)
            .bind(&self.failures)
            .bind(&self.completes_task)
            .bind(&self.fails_task)
            .bind(&self.queue_wait_seconds)
    }
}

/// New `rated_records` rows, bound by [`RecordColumns::bind`] from `$first` on.
fn new_records(first: usize) -> String {
    let types = [
        "text",
        "text",
        "int",
        "timestamptz",
        "text",
        "text",
        "text",
        "int",
        "int",
        "bool",
        "bool",
        "numeric",
    ];
    let columns = types
        .iter()
        .enumerate()
        .map(|(i, kind)| format!("${}::{kind}[]", first + i))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "UNNEST({columns}) \
         AS r(project_id, task_id, attempt, end_hour, gpu_model, billing_mode, outcome, retries, \
              failures, completes_task, fails_task, queue_wait_seconds)"
    )
}

/// (Re)rates the records with these keys from their current `job_records` rows.
///
/// Their old segments and their contributions to the rollups are removed, they are rated
/// with the contracts and FX rates in the database, and the new segments are stored and
/// added to the rollups. The per-record figures of every attempt of their tasks are
/// recomputed too, since one attempt decides whether its siblings complete or fail the
/// task. A key without a `job_records` row only loses its contributions.
///
/// With `fresh`, the keys are of records stored in this transaction, never rated: they have
/// no old segments to take out, and their new ones are stored by the statement that adds them
/// to the rollups. (Were one rated after all, storing its segments again would break
/// `rated_segments`' key and fail the call.)
///
/// Set-based: a fixed number of statements per call, whatever the number of keys. The
/// difference between old and new is appended to the rollups as new delta rows (see
/// [`crate::store::rollups`]), so concurrent calls never wait on each other's rollup rows;
/// they wait only on the rows of the tasks they share, locked in key order.
pub async fn rate_records(
    conn: &mut PgConnection,
    keys: &[RecordKey],
    tz: Tz,
    fresh: bool,
) -> anyhow::Result<()> {
    if keys.is_empty() {
        return Ok(());
    }
    let mut tasks: Vec<(&str, &str)> = keys
        .iter()
        .map(|key| (key.project.as_str(), key.task_id.as_str()))
        .collect();
    tasks.sort_unstable();
    tasks.dedup();
    let task_projects: Vec<&str> = tasks.iter().map(|t| t.0).collect();
    let task_ids: Vec<&str> = tasks.iter().map(|t| t.1).collect();

    // In key order, so that concurrent calls lock shared tasks in the same order.
    sqlx::query(
        "INSERT INTO tasks AS t (project_id, task_id) \
         SELECT * FROM UNNEST($1::text[], $2::text[]) ORDER BY 1, 2 \
         ON CONFLICT (project_id, task_id) DO UPDATE SET task_id = t.task_id",
    )
    .bind(&task_projects)
    .bind(&task_ids)
    .execute(&mut *conn)
    .await
    .context("locking the tasks to rate")?;

    // Joined to the tasks (distinct), not filtered by them as a semi-join.
    let attempts = sqlx::query_as::<_, RecordRow>(&format!(
        "SELECT {RECORDS} \
         JOIN UNNEST($1::text[], $2::text[]) AS k(project_id, task_id) \
           ON (k.project_id, k.task_id) = (r.project_id, r.task_id) \
         ORDER BY r.project_id, r.task_id, r.attempt",
    ))
    .bind(&task_projects)
    .bind(&task_ids)
    .fetch_all(&mut *conn)
    .await
    .context("loading the records to rate")?;

    let wanted: HashSet<(&str, &str, i32)> = keys
        .iter()
        .map(|k| (k.project.as_str(), k.task_id.as_str(), k.attempt))
        .collect();
    let to_rate: Vec<&RecordRow> = attempts
        .iter()
        .filter(|r| wanted.contains(&(r.project_id.as_str(), r.task_id.as_str(), r.attempt)))
        .collect();

    let segments = rate_all(conn, &to_rate, tz).await?;
    let mut records = RecordColumns::default();
    let mut settlement = task_ledger::Settlement::default();
    let by_task: HashMap<(&str, &str), &[RecordRow]> = attempts
        .chunk_by(|a, b| (&a.project_id, &a.task_id) == (&b.project_id, &b.task_id))
        .map(|task| {
            (
                (task[0].project_id.as_str(), task[0].task_id.as_str()),
                task,
            )
        })
        .collect();
    for &task in &tasks {
        let task_attempts = by_task.get(&task).copied().unwrap_or_default();
        let status = records.push_task(task_attempts, tz);
        settlement.push(
            task,
            status,
            task_attempts.iter().map(|a| a.gpu_model.as_str()),
        )?;
    }

    let key_projects: Vec<&str> = keys.iter().map(|k| k.project.as_str()).collect();
    let key_tasks: Vec<&str> = keys.iter().map(|k| k.task_id.as_str()).collect();
    let key_attempts: Vec<i32> = keys.iter().map(|k| k.attempt).collect();

    // Old segments and per-record figures out, new ones in: their difference is appended
    // to the rollups and added to the tasks' rows. The new segments are stored after it, or
    // in it when there are no old ones. The figures of old segments are negated once in
    // `changes`, so that every sum over it is a plain sum.
    let segment_changes = match fresh {
        true => format!(
            "new AS (SELECT * FROM {NEW_SEGMENTS}), \
             stored AS (INSERT INTO rated_segments SELECT * FROM new), \
             changes AS (SELECT 1 AS sign, * FROM new)"
        ),
        false => format!(
            "old AS ( \
               DELETE FROM rated_segments \
               WHERE (project_id, task_id, attempt) IN \
                     (SELECT * FROM UNNEST($26::text[], $27::text[], $28::int[])) \
               RETURNING *), \
             changes AS ( \
               SELECT {OLD_SEGMENT} FROM old UNION ALL SELECT 1, * FROM {NEW_SEGMENTS})"
        ),
    };
    let sql = format!(
        "WITH {segment_changes}, \
         {cost_diff}, \
         {util_diff}, \
         tag AS (SELECT nextval('rollup_deltas') AS delta), \
         {cost_levels}, \
         usage AS ( \
         INSERT INTO contract_usage_hourly \
           (contract_id, hour, project_id, segments, gpu_seconds_held, delta) \
         SELECT contract_id, hour, project_id, sum(segments), sum(card_seconds_held), \
                min(tag.delta) \
         FROM diff, tag WHERE contract_id IS NOT NULL AND billing_mode = 'reserved' \
         GROUP BY contract_id, hour, project_id \
         HAVING (sum(segments), sum(card_seconds_held)) <> (0, 0)), \
         {util_levels}, \
         old_records AS ( \
           DELETE FROM rated_records \
           WHERE (project_id, task_id) IN (SELECT * FROM UNNEST($42::text[], $43::text[])) \
           RETURNING *), \
         record_changes AS ( \
           SELECT -1 AS sign, * FROM old_records \
           UNION ALL SELECT 1, * FROM {new_records}), \
         record_diff AS ( \
           SELECT project_id, end_hour AS hour, gpu_model, billing_mode, outcome, \
                  sum(sign) AS records, sum(sign * retries) AS retries, \
                  sum(sign * failures) AS failures, \
                  sum(sign * completes_task::int) AS tasks_completed, \
                  sum(sign * fails_task::int) AS tasks_failed \
           FROM record_changes GROUP BY project_id, end_hour, gpu_model, billing_mode, outcome), \
         {record_levels}, \
         {tasks} \
         SELECT {emptied}",
        cost_diff = cost_diff("changes"),
        cost_levels = append_diff(Family::Cost, "diff", "$29"),
        util_diff = util_diff("changes"),
        util_levels = append_diff(Family::Util, "util_diff", "$29"),
        new_records = new_records(30),
        record_levels = append_diff(Family::Records, "record_diff", "$29"),
        tasks = task_ledger::add_changes("$29", "changes", "record_changes"),
        emptied = task_ledger::emptied_rows(),
    );
    let query = sqlx::query_as::<_, (Vec<String>,)>(&sql);
    let emptied = records
        .bind(
            segments
                .bind(query)
                .bind(&key_projects)
                .bind(&key_tasks)
                .bind(&key_attempts)
                .bind(tz.name()),
        )
        .bind(&task_projects)
        .bind(&task_ids)
        .fetch_one(&mut *conn)
        .await
        .context("updating the rollups and the tasks")?;
    settlement.emptied(emptied);

    if !fresh {
        segments
            .bind(sqlx::query_as::<_, (i64,)>(&format!(
                "WITH stored AS (INSERT INTO rated_segments SELECT * FROM {NEW_SEGMENTS} \
                                 RETURNING 1) \
                 SELECT count(*) FROM stored"
            )))
            .fetch_one(&mut *conn)
            .await
            .context("storing segments")?;
    }

    // With the tasks' status, and their rows left empty by the changes above deleted.
    settlement
        .bind(records.bind(sqlx::query_as::<_, (i64,)>(&format!(
            "WITH stored AS (INSERT INTO rated_records SELECT * FROM {new_records} RETURNING 1), \
             {settle} \
             SELECT count(*) FROM stored",
            new_records = new_records(1),
            settle = task_ledger::Settlement::ctes(13),
        ))))
        .fetch_one(&mut *conn)
        .await
        .context("storing per-record figures and settling the tasks")?;
    Ok(())
}

/// Re-prices the records with these keys where a contract's price alone changed: rated again
/// with the contracts and FX rates in the database, their segments keep their hours,
/// contracts and GPU-seconds, and only the cost and its parts of those whose cost moved are
/// updated in place, their difference appended to the cost and utilisation rollups and added
/// to the tasks' rows. Nothing else a record adds depends on a price: its per-record figures,
/// its task's status and the reservations' usage stay as they are.
///
/// Returns `false`, having changed nothing, when a record's new segments do not line up with
/// its stored ones (another change moved which contract prices what): those keys need
/// [`rate_records`].
pub async fn reprice_records(
    conn: &mut PgConnection,
    keys: &[RecordKey],
    tz: Tz,
) -> anyhow::Result<bool> {
    if keys.is_empty() {
        return Ok(true);
    }
    let key_projects: Vec<&str> = keys.iter().map(|k| k.project.as_str()).collect();
    let key_tasks: Vec<&str> = keys.iter().map(|k| k.task_id.as_str()).collect();
    let key_attempts: Vec<i32> = keys.iter().map(|k| k.attempt).collect();

    // The writers of a task hold its row: in key order, as rating takes them.
    sqlx::query(
        "SELECT 1 FROM UNNEST($1::text[], $2::text[]) AS k(project_id, task_id) \
         JOIN tasks t USING (project_id, task_id) \
         ORDER BY t.project_id, t.task_id FOR UPDATE OF t",
    )
    .bind(&key_projects)
    .bind(&key_tasks)
    .fetch_all(&mut *conn)
    .await
    .context("locking the tasks to re-price")?;

    let records = sqlx::query_as::<_, RecordRow>(&format!(
        "SELECT {RECORDS} \
         JOIN UNNEST($1::text[], $2::text[], $3::int[]) AS k(project_id, task_id, attempt) \
           ON (k.project_id, k.task_id, k.attempt) = (r.project_id, r.task_id, r.attempt) \
         ORDER BY r.project_id, r.task_id, r.attempt",
    ))
    .bind(&key_projects)
    .bind(&key_tasks)
    .bind(&key_attempts)
    .fetch_all(&mut *conn)
    .await
    .context("loading the records to re-price")?;
    let records: Vec<&RecordRow> = records.iter().collect();
    let segments = rate_all(conn, &records, tz).await?;

    // `stored` and `new` must pair up one to one with the same hour, contract, unrated
    // reason and GPU-seconds; if any does not, `mismatched` counts it and nothing is written.
    let sql = format!(
        "WITH new AS ( \
           SELECT * FROM UNNEST($1::text[], $2::text[], $3::int[], $4::int[], \
                                $5::timestamptz[], $6::uuid[], $7::text[], $8::numeric[], \
                                $9::numeric[], $10::numeric[], $11::numeric[], $12::numeric[], \
                                $13::numeric[]) \
             AS n(project_id, task_id, attempt, seq, hour, contract_id, unrated_reason, \
                  gpu_seconds_held, cost, productive, idle, unmeasured, failed)), \
         stored AS ( \
           SELECT s.* FROM UNNEST($14::text[], $15::text[], $16::int[]) \
             AS k(project_id, task_id, attempt) \
           JOIN rated_segments s USING (project_id, task_id, attempt)), \
         mismatched AS ( \
           SELECT count(*) AS count \
           FROM stored s FULL JOIN new n USING (project_id, task_id, attempt, seq) \
           WHERE (s.hour, s.contract_id, s.unrated_reason, s.gpu_seconds_held) \
                 IS DISTINCT FROM (n.hour, n.contract_id, n.unrated_reason, n.gpu_seconds_held)), \
         repriced AS ( \
           SELECT s.*, n.cost AS new_cost, n.productive AS new_productive, n.idle AS new_idle, \
                  n.unmeasured AS new_unmeasured, n.failed AS new_failed \
           FROM stored s JOIN new n USING (project_id, task_id, attempt, seq) \
           WHERE (SELECT count FROM mismatched) = 0 \
             AND (s.cost, s.productive, s.idle, s.unmeasured, s.failed) \
                 IS DISTINCT FROM (n.cost, n.productive, n.idle, n.unmeasured, n.failed)), \
         updated AS ( \
           UPDATE rated_segments s \
           SET cost = r.new_cost, productive = r.new_productive, idle = r.new_idle, \
               unmeasured = r.new_unmeasured, failed = r.new_failed \
           FROM repriced r \
           WHERE (s.project_id, s.task_id, s.attempt, s.seq) \
                 = (r.project_id, r.task_id, r.attempt, r.seq)), \
         changes AS ( \
           SELECT {OLD_SEGMENT} FROM repriced \
           UNION ALL \
           SELECT 1, project_id, task_id, attempt, seq, hour, gpu_model, billing_mode, outcome, \
                  contract_id, unrated_reason, output_unit, gpu_seconds_held, gpu_seconds_busy, \
                  new_cost, new_productive, new_idle, new_unmeasured, new_failed, \
                  output_quantity, gpu_util, sm_active, tensor_active, dram_active, \
                  memory_used_share, mig_slices \
           FROM repriced), \
         {cost_diff}, \
         {util_diff}, \
         tag AS (SELECT nextval('rollup_deltas') AS delta), \
         {cost_levels}, \
         {util_levels}, \
         record_changes AS (SELECT 1 AS sign, * FROM rated_records WHERE false), \
         {tasks} \
         SELECT count FROM mismatched",
        cost_diff = cost_diff("changes"),
        cost_levels = append_diff(Family::Cost, "diff", "$17"),
        util_diff = util_diff("changes"),
        util_levels = append_diff(Family::Util, "util_diff", "$17"),
        tasks = task_ledger::add_changes("$17", "changes", "record_changes"),
    );
    let mismatched: i64 = sqlx::query_scalar(&sql)
        .bind(&segments.project_id)
        .bind(&segments.task_id)
        .bind(&segments.attempt)
        .bind(&segments.seq)
        .bind(&segments.hour)
        .bind(&segments.contract_id)
        .bind(&segments.unrated_reason)
        .bind(&segments.gpu_seconds_held)
        .bind(&segments.cost)
        .bind(&segments.productive)
        .bind(&segments.idle)
        .bind(&segments.unmeasured)
        .bind(&segments.failed)
        .bind(&key_projects)
        .bind(&key_tasks)
        .bind(&key_attempts)
        .bind(tz.name())
        .fetch_one(&mut *conn)
        .await
        .context("re-pricing segments and updating the rollups and the tasks")?;
    Ok(mismatched == 0)
}

/// Rates `records` against the contracts and FX rates they may need.
async fn rate_all(
    conn: &mut PgConnection,
    records: &[&RecordRow],
    tz: Tz,
) -> anyhow::Result<SegmentColumns> {
    let mut segments = SegmentColumns::default();
    let (Some(earliest), Some(latest)) = (
        records.iter().map(|r| r.started_at).min(),
        records.iter().map(|r| r.ended_at).max(),
    ) else {
        return Ok(segments);
    };
    let mut kinds: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r.gpu_model.as_str(), r.billing_mode.as_str()))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let models: Vec<String> = kinds.iter().map(|k| k.0.to_owned()).collect();
    let modes: Vec<String> = kinds.iter().map(|k| k.1.to_owned()).collect();
    let contracts = contracts::for_kinds(conn, &models, &modes)
        .await
        .context("loading contracts")?
        .iter()
        .map(contracts::ContractRow::to_domain)
        .collect::<Vec<_>>();
    let mut currencies: Vec<String> = records.iter().map(|r| r.currency.clone()).collect();
    currencies.sort_unstable();
    currencies.dedup();
    // Ledger months are within a day of UTC ones.
    let month_around = |at: DateTime<Utc>, shift: fn(NaiveDate) -> Option<NaiveDate>| {
        first_of_month(shift(at.date_naive()).unwrap_or(at.date_naive()))
    };
    let fx = fx_rates::table(
        conn,
        month_around(earliest, |d| d.checked_sub_days(Days::new(1))),
        month_around(latest, |d| d.checked_add_days(Days::new(1))),
        &currencies,
    )
    .await
    .context("loading FX rates")?;
    for record in records {
        segments.push_record(record, &contracts, &fx, tz)?;
    }
    Ok(segments)
}

/// How much of a record a price change can move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rerating {
    /// Anything: which contract prices which hours, whether they are rated at all.
    Whole,
    /// Only the cost of what a contract already prices, and its parts: its price changed
    /// and nothing else that rating reads (see [`reprice_records`]).
    Prices,
}

/// Re-rates every record of `gpu_model` and `billing_mode` with segments in `[from, until)`
/// (open-ended without `until`), and the few within an hour of it, of `project` or of every
/// project: what a contract valid over that span may change. Returns how many records were
/// re-rated.
pub async fn rerate_kind(
    conn: &mut PgConnection,
    gpu_model: &str,
    billing_mode: BillingMode,
    project: Option<&str>,
    span: (DateTime<Utc>, Option<DateTime<Utc>>),
    tz: Tz,
    how: Rerating,
) -> anyhow::Result<usize> {
    let projects: Vec<String> = match project {
        Some(project) => vec![project.to_owned()],
        None => {
            sqlx::query_scalar("SELECT id FROM projects")
                .fetch_all(&mut *conn)
                .await?
        }
    };
    let touched = Touched::Kind {
        projects: &projects,
        gpu_model,
        billing_mode,
        span,
    };
    touched.rerate(conn, tz, how).await
}

/// Re-rates every record with segments in the ledger month `[month_start, month_end)` that
/// use a contract priced in `from` for a project kept in `to`: what the FX rate of that
/// month from `from` into `to` may change. A rate that replaces another changes only
/// [`Rerating::Prices`]; one added or removed rates or unrates what it converts.
pub async fn rerate_fx(
    conn: &mut PgConnection,
    month: (DateTime<Utc>, DateTime<Utc>),
    (from, to): (&str, &str),
    tz: Tz,
    how: Rerating,
) -> anyhow::Result<usize> {
    let contracts = contracts::ids_in_currency(conn, from).await?;
    if contracts.is_empty() {
        return Ok(0);
    }
    let projects: Vec<String> = sqlx::query_scalar("SELECT id FROM projects WHERE currency = $1")
        .bind(to)
        .fetch_all(&mut *conn)
        .await?;
    // The records are found once, by the month's segments, and kept in the database for the
    // pages to read in key order.
    let (start, end) = month;
    sqlx::query("DROP TABLE IF EXISTS fx_touched")
        .execute(&mut *conn)
        .await?;
    sqlx::query(
        "CREATE TEMPORARY TABLE fx_touched ON COMMIT DROP AS \
         SELECT DISTINCT project_id, task_id, attempt FROM rated_segments \
         WHERE project_id = ANY($1) AND hour >= $2 AND hour < $3 AND contract_id = ANY($4)",
    )
    .bind(&projects)
    .bind(start)
    .bind(end)
    .bind(&contracts)
    .execute(&mut *conn)
    .await
    .context("finding the records an FX rate touches")?;
    sqlx::query("ALTER TABLE fx_touched ADD PRIMARY KEY (project_id, task_id, attempt)")
        .execute(&mut *conn)
        .await?;
    Touched::Fx.rerate(conn, tz, how).await
}

/// The most records a re-rating reads the keys of at once: a price change may touch millions,
/// and their keys alone would take hundreds of megabytes.
const KEYS_PER_PAGE: i64 = 10_000;

/// The records a price change touches.
enum Touched<'a> {
    /// Of a model and billing mode, with segments in a span (open-ended without its end).
    Kind {
        projects: &'a [String],
        gpu_model: &'a str,
        billing_mode: BillingMode,
        span: (DateTime<Utc>, Option<DateTime<Utc>>),
    },
    /// Those in the temporary table `fx_touched`.
    Fx,
}

impl Touched<'_> {
    /// Re-rates them a page of at most [`KEYS_PER_PAGE`] keys at a time, each page after the
    /// last key of the one before it; returns how many were re-rated.
    async fn rerate(
        &self,
        conn: &mut PgConnection,
        tz: Tz,
        how: Rerating,
    ) -> anyhow::Result<usize> {
        let sql = self.page_sql();
        let mut rerated = 0;
        let mut after: Option<RecordKey> = None;
        loop {
            let keys = record_keys(self.page(conn, &sql, after.as_ref()).await?);
            let Some((last, _)) = keys.last() else {
                return Ok(rerated);
            };
            let last = last.clone();
            match how {
                Rerating::Whole => rate_in_bounded_calls(conn, &keys, tz, false).await?,
                Rerating::Prices => reprice_in_bounded_calls(conn, &keys, tz).await?,
            }
            rerated += keys.len();
            after = Some(last);
        }
    }

    /// The keys of a page, with an upper bound of the segments of each, after the key bound
    /// to `$1` to `$3` (all null for the first page), in key order.
    fn page_sql(&self) -> String {
        let records = match self {
            // A record's segments lie in the ledger hours from the one holding its start to
            // the one holding its end, each at most an hour long: one with a segment in the
            // span started less than an hour before its end and ended less than an hour
            // before its start. The records' own model and mode are those of their segments.
            Touched::Kind { .. } => {
                "job_records r \
                 WHERE r.project_id = ANY($4) AND r.gpu_model = $5 AND r.billing_mode = $6 \
                   AND r.ended_at > $7 - interval '1 hour' \
                   AND ($8::timestamptz IS NULL OR r.started_at < $8 + interval '1 hour') AND"
            }
            Touched::Fx => {
                "fx_touched JOIN job_records r USING (project_id, task_id, attempt) WHERE"
            }
        };
        format!(
            "SELECT r.project_id, r.task_id, r.attempt, {SEGMENT_BOUND} FROM {records} \
             ($1::text IS NULL OR (r.project_id, r.task_id, r.attempt) > ($1, $2, $3)) \
             ORDER BY r.project_id, r.task_id, r.attempt LIMIT {KEYS_PER_PAGE}"
        )
    }

    async fn page(
        &self,
        conn: &mut PgConnection,
        sql: &str,
        after: Option<&RecordKey>,
    ) -> anyhow::Result<Vec<(String, String, i32, i64)>> {
        let query = sqlx::query_as(sql)
            .bind(after.map(|key| key.project.as_str()))
            .bind(after.map(|key| key.task_id.as_str()))
            .bind(after.map(|key| key.attempt));
        let query = match *self {
            Touched::Kind {
                projects,
                gpu_model,
                billing_mode,
                span: (from, until),
            } => query
                .bind(projects)
                .bind(gpu_model)
                .bind(billing_mode.as_str())
                .bind(from)
                .bind(until),
            Touched::Fx => query,
        };
        query
            .fetch_all(conn)
            .await
            .context("finding the records a price change touches")
    }
}

/// An upper bound of the segments rating a `job_records` row `r` makes: one per hour it
/// touches, one more for each month or contract boundary inside an hour being rare enough to
/// be covered by the spare one.
const SEGMENT_BOUND: &str =
    "ceil(extract(epoch FROM r.ended_at - r.started_at) / 3600)::bigint + 2";

fn record_keys(rows: Vec<(String, String, i32, i64)>) -> Vec<(RecordKey, i64)> {
    rows.into_iter()
        .map(|(project, task_id, attempt, segments)| {
            let key = RecordKey {
                project,
                task_id,
                attempt,
            };
            (key, segments)
        })
        .collect()
}

/// Rates `keys` (in key order, each with an upper bound of the segments it makes) in calls
/// of at most [`SEGMENTS_PER_CALL`] segments (see [`bounded_calls`]); `fresh` as for
/// [`rate_records`].
pub async fn rate_in_bounded_calls(
    conn: &mut PgConnection,
    keys: &[(RecordKey, i64)],
    tz: Tz,
    fresh: bool,
) -> anyhow::Result<()> {
    for chunk in bounded_calls(keys) {
        rate_records(conn, &chunk, tz, fresh).await?;
    }
    Ok(())
}

/// Re-prices `keys` like [`rate_in_bounded_calls`] rates them, with [`reprice_records`]; the
/// keys of a call whose segments no longer line up are rated whole instead.
async fn reprice_in_bounded_calls(
    conn: &mut PgConnection,
    keys: &[(RecordKey, i64)],
    tz: Tz,
) -> anyhow::Result<()> {
    for chunk in bounded_calls(keys) {
        if !reprice_records(conn, &chunk, tz).await? {
            rate_records(conn, &chunk, tz, false).await?;
        }
    }
    Ok(())
}

/// `keys` (each with an upper bound of the segments it makes) in calls of at most
/// [`SEGMENTS_PER_CALL`] segments; a record larger than that makes a call alone.
fn bounded_calls(keys: &[(RecordKey, i64)]) -> impl Iterator<Item = Vec<RecordKey>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= keys.len() {
            return None;
        }
        let mut end = start + 1;
        let mut segments = keys[start].1;
        while end < keys.len() && segments + keys[end].1 <= SEGMENTS_PER_CALL {
            segments += keys[end].1;
            end += 1;
        }
        let chunk = keys[start..end].iter().map(|(k, _)| k.clone()).collect();
        start = end;
        Some(chunk)
    })
}
