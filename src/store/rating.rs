//! Rating's statements: locking the tasks and contract sets a rating call needs, loading its
//! records, storing what [`crate::ledger::rating`] made of them (segments, per-record figures
//! and the rollups they add up to), finding the records a contract change re-assigns, and
//! the re-assignment jobs such a change leaves.
//!
//! What is stored is card-seconds per contract, never money (migration 0014): prices and FX
//! rates are applied when a figure is read ([`crate::store::prices`]).

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::domain::ledger_time::LedgerHour;
use crate::domain::rating::{BillingMode, Outcome, RecordToRate, Segment};
use crate::domain::record::{RecordKey, Telemetry, duration_seconds};
use crate::domain::task::{AttemptEnd, TaskMarks};
use crate::domain::utilisation::{SegmentTelemetry, busy_seconds};
use crate::store::binder::Binder;
use crate::store::decoded;
use crate::store::records::{TelemetryRow, telemetry_row};
use crate::store::rollups::{self, Family, Level};
use crate::store::tasks as task_ledger;

/// One attempt of a task as rating reads it: its `job_records` row and its project's
/// currency.
#[derive(Debug, sqlx::FromRow)]
pub struct AttemptRow {
    pub project_id: String,
    pub task_id: String,
    pub attempt: i32,
    pub gpu_model: String,
    #[sqlx(try_from = "String")]
    pub billing_mode: BillingMode,
    pub provider: Option<String>,
    pub region: Option<String>,
    pub queued_at: Option<DateTime<Utc>>,
    pub started_at: DateTime<Utc>,
    pub ended_at: DateTime<Utc>,
    pub gpu_seconds_held: Decimal,
    pub gpu_seconds_busy: Option<Decimal>,
    #[sqlx(try_from = "String")]
    pub outcome: Outcome,
    pub retries: i32,
    pub failures: i32,
    pub output_quantity: Option<Decimal>,
    pub output_unit: Option<String>,
    #[sqlx(flatten)]
    pub telemetry: TelemetryRow,
    /// The nodes the record ran on, sorted; `None` when it named none.
    pub nodes: Option<Vec<String>>,
    pub currency: String,
}

impl AttemptRow {
    pub fn to_end(&self) -> AttemptEnd {
        AttemptEnd {
            attempt: self.attempt,
            outcome: self.outcome,
            started_at: self.started_at,
            ended_at: self.ended_at,
        }
    }

    pub fn to_rate(&self, telemetry: &Telemetry) -> RecordToRate {
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
            energy_joules: telemetry.energy_joules,
        }
    }

    pub fn key(&self) -> (&str, &str, i32) {
        (&self.project_id, &self.task_id, self.attempt)
    }
}

/// The two-key advisory lock namespace of the contract sets (`cont`); the second key is a
/// hash of the model and billing mode.
const CONTRACT_SETS: i32 = 0x636f_6e74;

/// Takes the advisory locks of the contract sets of `kinds` (GPU model and billing mode) for
/// the rest of the transaction: shared by whoever rates records of a kind (so that the
/// contracts it reads stay the ones in force until it commits), exclusive by whoever changes
/// which contract prices which hours of it. Taken in one statement, in a fixed order.
pub async fn hold_contract_sets(
    conn: &mut PgConnection,
    kinds: &[(String, BillingMode)],
    exclusive: bool,
) -> sqlx::Result<()> {
    if kinds.is_empty() {
        return Ok(());
    }
    let names: Vec<String> = kinds
        .iter()
        .map(|(model, mode)| format!("{model}/{}", mode.as_str()))
        .collect();
    sqlx::query!(
        "SELECT CASE WHEN $3 THEN pg_advisory_xact_lock($1, key) \
                     ELSE pg_advisory_xact_lock_shared($1, key) END \
         FROM (SELECT DISTINCT hashtext(name) AS key \
               FROM UNNEST($2::text[]) AS n(name)) AS k \
         ORDER BY key",
        CONTRACT_SETS,
        &names,
        exclusive,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Locks the rows of `tasks` (project, task id) in key order, creating those that do not
/// exist: every writer of a task holds its row, so concurrent calls rating attempts of the
/// same task see each other's records.
pub async fn lock_tasks(conn: &mut PgConnection, tasks: &[(&str, &str)]) -> sqlx::Result<()> {
    let projects: Vec<&str> = tasks.iter().map(|t| t.0).collect();
    let task_ids: Vec<&str> = tasks.iter().map(|t| t.1).collect();
    sqlx::query!(
        "INSERT INTO tasks AS t (project_id, task_id) \
         SELECT * FROM UNNEST($1::text[], $2::text[]) ORDER BY 1, 2 \
         ON CONFLICT (project_id, task_id) DO UPDATE SET task_id = t.task_id",
        &projects as &[&str],
        &task_ids as &[&str],
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Every attempt of `tasks`, by project, task and attempt. The project's currency is looked
/// up per row: joined, the project could lead the plan and the records be found by project
/// alone.
pub async fn load_attempts(
    conn: &mut PgConnection,
    tasks: &[(&str, &str)],
) -> sqlx::Result<Vec<AttemptRow>> {
    let projects: Vec<&str> = tasks.iter().map(|t| t.0).collect();
    let task_ids: Vec<&str> = tasks.iter().map(|t| t.1).collect();
    // Joined to the tasks (distinct), not filtered by them as a semi-join.
    sqlx::query!(
        "SELECT r.project_id, r.task_id, r.attempt, r.gpu_model, r.billing_mode, \
                r.provider, r.region, r.queued_at, r.started_at, r.ended_at, r.gpu_seconds_held, \
                r.gpu_seconds_busy, r.outcome, r.retries, r.failures, r.output_quantity, \
                r.output_unit, r.gpu_util, r.sm_active, r.tensor_active, r.dram_active, \
                r.memory_peak_gib, r.memory_total_gib, r.mig_profile, r.energy_joules, \
                r.model_flops, r.precision, r.peak_flops, r.nodes, \
                (SELECT p.currency FROM projects p WHERE p.id = r.project_id) AS \"currency!\" \
         FROM job_records r \
         JOIN UNNEST($1::text[], $2::text[]) AS k(project_id, task_id) \
           ON (k.project_id, k.task_id) = (r.project_id, r.task_id) \
         ORDER BY r.project_id, r.task_id, r.attempt",
        &projects as &[&str],
        &task_ids as &[&str],
    )
    .try_map(|r| {
        Ok(AttemptRow {
            project_id: r.project_id,
            task_id: r.task_id,
            attempt: r.attempt,
            gpu_model: r.gpu_model,
            billing_mode: decoded("billing_mode", r.billing_mode)?,
            provider: r.provider,
            region: r.region,
            queued_at: r.queued_at,
            started_at: r.started_at,
            ended_at: r.ended_at,
            gpu_seconds_held: r.gpu_seconds_held,
            gpu_seconds_busy: r.gpu_seconds_busy,
            outcome: decoded("outcome", r.outcome)?,
            retries: r.retries,
            failures: r.failures,
            output_quantity: r.output_quantity,
            output_unit: r.output_unit,
            telemetry: telemetry_row!(r),
            nodes: r.nodes,
            currency: r.currency,
        })
    })
    .fetch_all(conn)
    .await
}

/// New `rated_segments` rows, column by column, for `UNNEST`.
#[derive(Default)]
pub struct SegmentColumns {
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
    card_seconds: Vec<Decimal>,
    productive_seconds: Vec<Decimal>,
    idle_seconds: Vec<Decimal>,
    unmeasured_seconds: Vec<Decimal>,
    failed_seconds: Vec<Decimal>,
    output_quantity: Vec<Option<Decimal>>,
    gpu_util: Vec<Option<Decimal>>,
    sm_active: Vec<Option<Decimal>>,
    tensor_active: Vec<Option<Decimal>>,
    dram_active: Vec<Option<Decimal>>,
    memory_used_share: Vec<Option<Decimal>>,
    mig_slices: Vec<Option<i16>>,
    energy_joules: Vec<Option<Decimal>>,
    productive_joules: Vec<Decimal>,
    idle_joules: Vec<Decimal>,
    unmeasured_joules: Vec<Decimal>,
    failed_joules: Vec<Decimal>,
}

impl SegmentColumns {
    /// Adds the segments contracts were assigned to for `row`, which carries `telemetry`.
    pub fn push_record(
        &mut self,
        row: &AttemptRow,
        record: &RecordToRate,
        telemetry: &Telemetry,
        segments: Vec<Segment>,
    ) -> anyhow::Result<()> {
        let carried = SegmentTelemetry::of(telemetry);
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
            self.unrated_reason.push(
                segment
                    .contract_id
                    .is_none()
                    .then(|| "no_contract".to_owned()),
            );
            self.output_unit.push(output.map(|(unit, _)| unit.clone()));
            self.gpu_seconds_held.push(segment.gpu_seconds_held);
            self.gpu_seconds_busy.push(segment.gpu_seconds_busy);
            self.card_seconds.push(segment.card_seconds);
            self.productive_seconds.push(segment.seconds.productive);
            self.idle_seconds.push(segment.seconds.idle);
            self.unmeasured_seconds.push(segment.seconds.unmeasured);
            self.failed_seconds.push(segment.seconds.failed);
            self.output_quantity
                .push(output.filter(|_| seq == last).map(|(_, quantity)| quantity));
            self.gpu_util.push(carried.gpu_util);
            self.sm_active.push(carried.sm_active);
            self.tensor_active.push(carried.tensor_active);
            self.dram_active.push(carried.dram_active);
            self.memory_used_share.push(carried.memory_used_share);
            self.mig_slices.push(mig_slices);
            self.energy_joules.push(segment.energy_joules);
            self.productive_joules.push(segment.joules.productive);
            self.idle_joules.push(segment.joules.idle);
            self.unmeasured_joules.push(segment.joules.unmeasured);
            self.failed_joules.push(segment.joules.failed);
        }
        Ok(())
    }

    /// The new segments as a row set with the `rated_segments` columns, bound to `binder`.
    fn rows(&self, binder: &mut Binder) -> String {
        let columns = [
            binder.bind(&self.project_id) + "::text[]",
            binder.bind(&self.task_id) + "::text[]",
            binder.bind(&self.attempt) + "::int[]",
            binder.bind(&self.seq) + "::int[]",
            binder.bind(&self.hour) + "::timestamptz[]",
            binder.bind(&self.gpu_model) + "::text[]",
            binder.bind(&self.billing_mode) + "::text[]",
            binder.bind(&self.outcome) + "::text[]",
            binder.bind(&self.contract_id) + "::uuid[]",
            binder.bind(&self.unrated_reason) + "::text[]",
            binder.bind(&self.output_unit) + "::text[]",
            binder.bind(&self.gpu_seconds_held) + "::numeric[]",
            binder.bind(&self.gpu_seconds_busy) + "::numeric[]",
            binder.bind(&self.card_seconds) + "::numeric[]",
            binder.bind(&self.productive_seconds) + "::numeric[]",
            binder.bind(&self.idle_seconds) + "::numeric[]",
            binder.bind(&self.unmeasured_seconds) + "::numeric[]",
            binder.bind(&self.failed_seconds) + "::numeric[]",
            binder.bind(&self.output_quantity) + "::numeric[]",
            binder.bind(&self.gpu_util) + "::numeric[]",
            binder.bind(&self.sm_active) + "::numeric[]",
            binder.bind(&self.tensor_active) + "::numeric[]",
            binder.bind(&self.dram_active) + "::numeric[]",
            binder.bind(&self.memory_used_share) + "::numeric[]",
            binder.bind(&self.mig_slices) + "::smallint[]",
            binder.bind(&self.energy_joules) + "::numeric[]",
            binder.bind(&self.productive_joules) + "::numeric[]",
            binder.bind(&self.idle_joules) + "::numeric[]",
            binder.bind(&self.unmeasured_joules) + "::numeric[]",
            binder.bind(&self.failed_joules) + "::numeric[]",
        ];
        format!("UNNEST({}) AS s({SEGMENT_COLUMNS})", columns.join(", "))
    }
}

/// The columns of `rated_segments`, in order.
const SEGMENT_COLUMNS: &str = "project_id, task_id, attempt, seq, hour, gpu_model, \
     billing_mode, outcome, contract_id, unrated_reason, output_unit, gpu_seconds_held, \
     gpu_seconds_busy, card_seconds, productive_seconds, idle_seconds, unmeasured_seconds, \
     failed_seconds, output_quantity, gpu_util, sm_active, tensor_active, dram_active, \
     memory_used_share, mig_slices, energy_joules, productive_joules, idle_joules, \
     unmeasured_joules, failed_joules";

/// A stored segment (`rated_segments` columns) as a change taken out: `sign` -1 and its
/// figures negated, so that every sum over a change is a plain sum.
const OLD_SEGMENT: &str = "-1 AS sign, project_id, task_id, attempt, seq, hour, gpu_model, \
     billing_mode, outcome, contract_id, unrated_reason, output_unit, \
     -gpu_seconds_held AS gpu_seconds_held, -gpu_seconds_busy AS gpu_seconds_busy, \
     -card_seconds AS card_seconds, -productive_seconds AS productive_seconds, \
     -idle_seconds AS idle_seconds, -unmeasured_seconds AS unmeasured_seconds, \
     -failed_seconds AS failed_seconds, -output_quantity AS output_quantity, gpu_util, \
     sm_active, tensor_active, dram_active, memory_used_share, mig_slices, \
     -energy_joules AS energy_joules, -productive_joules AS productive_joules, \
     -idle_joules AS idle_joules, -unmeasured_joules AS unmeasured_joules, \
     -failed_joules AS failed_joules";

/// New `rated_records` rows, column by column.
#[derive(Default)]
pub struct RecordColumns {
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
    /// Each record's nodes as a JSON array, or null when it named none.
    nodes: Vec<Option<String>>,
}

impl RecordColumns {
    /// Adds every attempt of one task, with the marks that count the task once.
    pub fn push_task(&mut self, attempts: &[AttemptRow], marks: &TaskMarks, tz: Tz) {
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
            self.nodes.push(
                attempt
                    .nodes
                    .as_ref()
                    .map(|nodes| serde_json::to_string(nodes).expect("node names serialise")),
            );
        }
    }

    /// Whether a record among them names nodes.
    fn name_nodes(&self) -> bool {
        self.nodes.iter().any(Option::is_some)
    }

    /// The new per-record rows as a row set with the `rated_records` columns, bound to
    /// `binder`.
    fn rows(&self, binder: &mut Binder) -> String {
        let columns = [
            binder.bind(&self.project_id) + "::text[]",
            binder.bind(&self.task_id) + "::text[]",
            binder.bind(&self.attempt) + "::int[]",
            binder.bind(&self.end_hour) + "::timestamptz[]",
            binder.bind(&self.gpu_model) + "::text[]",
            binder.bind(&self.billing_mode) + "::text[]",
            binder.bind(&self.outcome) + "::text[]",
            binder.bind(&self.retries) + "::int[]",
            binder.bind(&self.failures) + "::int[]",
            binder.bind(&self.completes_task) + "::bool[]",
            binder.bind(&self.fails_task) + "::bool[]",
            binder.bind(&self.queue_wait_seconds) + "::numeric[]",
            binder.bind(&self.nodes) + "::text[]",
        ];
        format!(
            "(SELECT project_id, task_id, attempt, end_hour, gpu_model, billing_mode, outcome, \
                     retries, failures, completes_task, fails_task, queue_wait_seconds, \
                     CASE WHEN nodes IS NULL THEN NULL \
                          ELSE ARRAY(SELECT jsonb_array_elements_text(nodes::jsonb)) END \
                         AS nodes \
              FROM UNNEST({}) AS u(project_id, task_id, attempt, end_hour, gpu_model, \
                   billing_mode, outcome, retries, failures, completes_task, fails_task, \
                   queue_wait_seconds, nodes)) AS r",
            columns.join(", ")
        )
    }
}

/// CTEs appending the changes in the CTE `diff` (summed per hourly key) to `family`'s daily
/// and monthly rollups, tagged with the delta number in the CTE `tag`; `tz` is the
/// placeholder of the time zone. (Its hourly rollup is a view over what rating stores.)
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
                  sum(coalesce(card_seconds, 0)) AS card_seconds, \
                  sum(productive_seconds) AS productive_seconds, \
                  sum(idle_seconds) AS idle_seconds, \
                  sum(unmeasured_seconds) AS unmeasured_seconds, \
                  sum(failed_seconds) AS failed_seconds, \
                  sum(coalesce(output_quantity, 0)) AS output_quantity, {energy} \
           FROM {changes} \
           GROUP BY project_id, hour, gpu_model, billing_mode, outcome, contract_id, \
                    unrated_reason, output_unit)",
        energy = rollups::summed_energy_sql(""),
    )
}

/// A CTE `util_diff` of the utilisation sums (see `util_hourly`) the segment changes in
/// `changes` make, per hourly key; only segments with some telemetry take part.
fn util_diff(changes: &str) -> String {
    format!(
        "util_diff AS ( \
           SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, \
                  sum(sign) AS segments, {sums} \
           FROM {changes} WHERE {with_telemetry} \
           GROUP BY project_id, hour, gpu_model, billing_mode, outcome, contract_id)",
        sums = rollups::util_sums_sql(""),
        with_telemetry = rollups::has_telemetry_sql(""),
    )
}

/// A CTE `node_usage` appending to `capacity_usage_hourly` what the segment changes in
/// `changes` put on the nodes their records were rated with (`nodes` of the record changes
/// in `record_changes`: the old row for a segment taken out, the new one for a segment
/// stored), each segment's card-seconds spread evenly over its record's nodes, tagged with
/// the delta number in the CTE `tag`; it returns the node-hours whose usage changed.
fn node_usage_diff(changes: &str, record_changes: &str) -> String {
    let share = "round(c.card_seconds / cardinality(r.nodes), 20)";
    format!(
        "node_usage AS ( \
           INSERT INTO capacity_usage_hourly (project_id, node, hour, gpu_seconds, delta) \
           SELECT c.project_id, n.node, c.hour, sum({share}), min(tag.delta) \
           FROM {changes} c \
           JOIN {record_changes} r \
             ON r.sign = c.sign \
            AND (r.project_id, r.task_id, r.attempt) = (c.project_id, c.task_id, c.attempt) \
           CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
           CROSS JOIN tag \
           WHERE r.nodes IS NOT NULL \
           GROUP BY c.project_id, n.node, c.hour \
           HAVING sum({share}) <> 0 \
           RETURNING node, hour)"
    )
}

/// The node-hours whose usage a rating call changed: their capacity rollup is refreshed
/// before the transaction commits.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
#[must_use = "the capacity rollup of the node-hours a rating changed must be refreshed"]
pub struct NodeHours(pub Vec<(String, DateTime<Utc>)>);

impl NodeHours {
    pub fn extend(&mut self, other: NodeHours) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// What one rating call stores: the new segments of the records it rated, the per-record
/// figures of every attempt of their tasks, and the tasks' status.
pub struct Rated<'a> {
    /// The records rated, in key order.
    pub keys: &'a [RecordKey],
    /// Their tasks, in key order.
    pub tasks: &'a [(&'a str, &'a str)],
    pub segments: SegmentColumns,
    pub records: RecordColumns,
    pub settlement: task_ledger::Settlement<'a>,
    /// The keys are of records stored in this transaction and never rated: they have no old
    /// segments to take out, and their new ones are stored by the statement that adds them
    /// to the rollups. (Were one rated after all, storing its segments again would break
    /// `rated_segments`' key and fail the call.)
    pub fresh: bool,
}

/// Replaces the rated data of `rated.keys` with `rated`: their old segments and the
/// per-record figures of their tasks out, the new ones in, their difference appended to the
/// rollups as new delta rows (see [`crate::store::rollups`]) and added to the tasks' rows,
/// and the tasks settled. Set-based: a fixed number of statements, whatever the number of
/// keys. The caller holds the rows of the tasks.
pub async fn store_rated(
    conn: &mut PgConnection,
    rated: Rated<'_>,
    tz: Tz,
) -> anyhow::Result<NodeHours> {
    let Rated {
        keys,
        tasks,
        segments,
        records,
        mut settlement,
        fresh,
    } = rated;
    let mut binder = Binder::new();
    let new_segments = segments.rows(&mut binder);
    let zone = binder.bind(tz.name().to_owned());
    // The figures of old segments are negated once in `changes`, so that every sum over it
    // is a plain sum.
    let segment_changes = match fresh {
        true => format!(
            "new AS (SELECT * FROM {new_segments}), \
             stored AS (INSERT INTO rated_segments SELECT * FROM new), \
             changes AS (SELECT 1 AS sign, * FROM new)"
        ),
        false => {
            let projects = binder.bind(keys.iter().map(|k| k.project.clone()).collect::<Vec<_>>());
            let task_ids = binder.bind(keys.iter().map(|k| k.task_id.clone()).collect::<Vec<_>>());
            let attempts = binder.bind(keys.iter().map(|k| k.attempt).collect::<Vec<_>>());
            format!(
                "old AS ( \
                   DELETE FROM rated_segments \
                   WHERE (project_id, task_id, attempt) IN \
                         (SELECT * FROM UNNEST({projects}::text[], {task_ids}::text[], \
                                               {attempts}::int[])) \
                   RETURNING *), \
                 changes AS ( \
                   SELECT {OLD_SEGMENT} FROM old UNION ALL SELECT 1, * FROM {new_segments})"
            )
        }
    };
    let new_records = records.rows(&mut binder);
    // New records that name no nodes put nothing on them; a re-rating may take time off
    // the nodes an earlier version named.
    let (node_usage, touched) = if fresh && !records.name_nodes() {
        (
            String::new(),
            "ARRAY[]::text[], ARRAY[]::timestamptz[]".to_owned(),
        )
    } else {
        (
            format!("{}, ", node_usage_diff("changes", "record_changes")),
            "ARRAY(SELECT node FROM node_usage ORDER BY node, hour), \
             ARRAY(SELECT hour FROM node_usage ORDER BY node, hour)"
                .to_owned(),
        )
    };
    let task_projects = binder.bind(tasks.iter().map(|t| t.0).collect::<Vec<_>>());
    let task_ids = binder.bind(tasks.iter().map(|t| t.1).collect::<Vec<_>>());
    let sql = format!(
        "WITH {segment_changes}, \
         {cost_diff}, \
         {util_diff}, \
         tag AS (SELECT nextval('rollup_deltas') AS delta), \
         {cost_levels}, \
         usage AS ( \
         INSERT INTO contract_usage_hourly \
           (contract_id, hour, project_id, segments, gpu_seconds_held, delta) \
         SELECT contract_id, hour, project_id, sum(segments), sum(card_seconds), \
                min(tag.delta) \
         FROM diff, tag WHERE contract_id IS NOT NULL AND billing_mode = 'reserved' \
         GROUP BY contract_id, hour, project_id \
         HAVING (sum(segments), sum(card_seconds)) <> (0, 0)), \
         {util_levels}, \
         old_records AS ( \
           DELETE FROM rated_records \
           WHERE (project_id, task_id) IN \
                 (SELECT * FROM UNNEST({task_projects}::text[], {task_ids}::text[])) \
           RETURNING *), \
         record_changes AS ( \
           SELECT -1 AS sign, * FROM old_records \
           UNION ALL SELECT 1, * FROM {new_records}), \
         {node_usage} \
         record_diff AS ( \
           SELECT project_id, end_hour AS hour, gpu_model, billing_mode, outcome, \
                  sum(sign) AS records, sum(sign * retries) AS retries, \
                  sum(sign * failures) AS failures, \
                  sum(sign * completes_task::int) AS tasks_completed, \
                  sum(sign * fails_task::int) AS tasks_failed \
           FROM record_changes GROUP BY project_id, end_hour, gpu_model, billing_mode, outcome), \
         {record_levels}, \
         {tasks} \
         SELECT {emptied}, {touched}",
        node_usage = node_usage,
        touched = touched,
        cost_diff = cost_diff("changes"),
        cost_levels = append_diff(Family::Cost, "diff", &zone),
        util_diff = util_diff("changes"),
        util_levels = append_diff(Family::Util, "util_diff", &zone),
        record_levels = append_diff(Family::Records, "record_diff", &zone),
        tasks = task_ledger::add_changes(&zone, "changes", "record_changes"),
        emptied = task_ledger::emptied_rows(),
    );
    // Dynamic: the rollups' and tasks' changes are the batch's, in the families' tables.
    let (emptied, nodes, hours) = binder
        .query_as::<(serde_json::Value, Vec<String>, Vec<DateTime<Utc>>)>(&sql)?
        .fetch_one(&mut *conn)
        .await
        .context("updating the rollups and the tasks")?;
    settlement.emptied((emptied,));
    let touched = NodeHours(nodes.into_iter().zip(hours).collect());

    if !fresh {
        let mut binder = Binder::new();
        let new_segments = segments.rows(&mut binder);
        // Dynamic: the segments' rows are the batch's, bound through the binder.
        binder
            .query(&format!(
                "INSERT INTO rated_segments SELECT * FROM {new_segments}"
            ))?
            .execute(&mut *conn)
            .await
            .context("storing segments")?;
    }

    // With the tasks' status, and their rows left empty by the changes above deleted.
    let mut binder = Binder::new();
    let new_records = records.rows(&mut binder);
    let settle = settlement.ctes(&mut binder);
    // Dynamic: the records' rows and the settling statements are the batch's.
    binder
        .query_as::<(i64,)>(&format!(
            "WITH stored AS (INSERT INTO rated_records SELECT * FROM {new_records} RETURNING 1), \
             {settle} \
             SELECT count(*) FROM stored",
        ))?
        .fetch_one(&mut *conn)
        .await
        .context("storing per-record figures and settling the tasks")?;
    Ok(touched)
}

/// The records a change of which contract prices which hours re-assigns: those of a model
/// and billing mode with segments in a span (open-ended without its end), of one project or
/// of every project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindSpan {
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    pub project: Option<String>,
    pub span: (DateTime<Utc>, Option<DateTime<Utc>>),
}

/// An upper bound of the segments rating a `job_records` row `r` makes: one per hour it
/// touches, one more for each month or contract boundary inside an hour being rare enough to
/// be covered by the spare one.
const SEGMENT_BOUND: &str =
    "ceil(extract(epoch FROM r.ended_at - r.started_at) / 3600)::bigint + 2";

/// Up to `limit` keys of the records `of` names, after `after`, in key order, each with an
/// upper bound of the segments it makes. A record's segments lie in the ledger hours from the
/// one holding its start to the one holding its end, each at most an hour long: one with a
/// segment in the span started less than an hour before its end and ended less than an hour
/// before its start.
pub async fn record_page(
    conn: &mut PgConnection,
    of: &KindSpan,
    after: Option<&RecordKey>,
    limit: i64,
) -> sqlx::Result<Vec<(RecordKey, i64)>> {
    let mut binder = Binder::new();
    let projects = match &of.project {
        Some(project) => format!("= {}", binder.bind(project.clone())),
        None => "= ANY(ARRAY(SELECT id FROM projects))".to_owned(),
    };
    let after = match after {
        Some(key) => format!(
            "AND (r.project_id, r.task_id, r.attempt) > ({}, {}, {})",
            binder.bind(key.project.clone()),
            binder.bind(key.task_id.clone()),
            binder.bind(key.attempt)
        ),
        None => String::new(),
    };
    let until = match of.span.1 {
        Some(until) => format!(
            "AND r.started_at < {} + interval '1 hour'",
            binder.bind(until)
        ),
        None => String::new(),
    };
    let sql = format!(
        "SELECT r.project_id, r.task_id, r.attempt, {SEGMENT_BOUND} FROM job_records r \
         WHERE r.project_id {projects} AND r.gpu_model = {model} AND r.billing_mode = {mode} \
           AND r.ended_at > {from} - interval '1 hour' {until} {after} \
         ORDER BY r.project_id, r.task_id, r.attempt LIMIT {limit}",
        model = binder.bind(of.gpu_model.clone()),
        mode = binder.bind(of.billing_mode.as_str()),
        from = binder.bind(of.span.0),
        limit = binder.bind(limit),
    );
    // Dynamic: the project and the record to continue after are optional filters.
    let rows: Vec<(String, String, i32, i64)> = binder.query_as(&sql)?.fetch_all(conn).await?;
    Ok(rows
        .into_iter()
        .map(|(project, task_id, attempt, segments)| {
            let key = RecordKey {
                project,
                task_id,
                attempt,
            };
            (key, segments)
        })
        .collect())
}

/// A re-assignment a contract change owes, as stored in `rerating_jobs`.
#[derive(Debug, Clone)]
pub struct ReratingJob {
    pub id: Uuid,
    pub of: KindSpan,
    /// The last record re-assigned so far.
    pub after: Option<RecordKey>,
}

#[derive(sqlx::FromRow)]
struct JobRow {
    id: Uuid,
    gpu_model: String,
    #[sqlx(try_from = "String")]
    billing_mode: BillingMode,
    project_id: Option<String>,
    span_from: DateTime<Utc>,
    span_until: Option<DateTime<Utc>>,
    after_project: Option<String>,
    after_task: Option<String>,
    after_attempt: Option<i32>,
}

impl From<JobRow> for ReratingJob {
    fn from(row: JobRow) -> Self {
        let after = match (row.after_project, row.after_task, row.after_attempt) {
            (Some(project), Some(task_id), Some(attempt)) => Some(RecordKey {
                project,
                task_id,
                attempt,
            }),
            _ => None,
        };
        ReratingJob {
            id: row.id,
            of: KindSpan {
                gpu_model: row.gpu_model,
                billing_mode: row.billing_mode,
                project: row.project_id,
                span: (row.span_from, row.span_until),
            },
            after,
        }
    }
}

/// Stores a re-assignment job for `of`, in the transaction of the change that owes it.
pub async fn insert_job(conn: &mut PgConnection, of: &KindSpan) -> sqlx::Result<ReratingJob> {
    let id = Uuid::new_v4();
    sqlx::query!(
        "INSERT INTO rerating_jobs (id, gpu_model, billing_mode, project_id, span_from, span_until) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        id,
        of.gpu_model,
        of.billing_mode.as_str(),
        of.project,
        of.span.0,
        of.span.1,
    )
    .execute(conn)
    .await?;
    Ok(ReratingJob {
        id,
        of: of.clone(),
        after: None,
    })
}

/// The advisory lock namespace of re-assignment jobs: whoever runs a job holds the job's
/// lock, so two replicas never run one job at once.
const JOBS: i32 = 0x6a6f_6273;

/// `query!` of the columns a [`JobRow`] is read from, then `$rest` (a literal), each row
/// made a [`JobRow`].
macro_rules! select_jobs {
    ($rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            "SELECT id, gpu_model, billing_mode, project_id, span_from, span_until, \
                    after_project, after_task, after_attempt \
             FROM rerating_jobs "
                + $rest
            $(, $arg)*
        )
        .try_map(|row| {
            Ok(JobRow {
                id: row.id,
                gpu_model: row.gpu_model,
                billing_mode: decoded("billing_mode", row.billing_mode)?,
                project_id: row.project_id,
                span_from: row.span_from,
                span_until: row.span_until,
                after_project: row.after_project,
                after_task: row.after_task,
                after_attempt: row.after_attempt,
            })
        })
    };
}

/// Takes the lock of job `id` for the rest of the transaction of `conn` (waiting for whoever
/// holds it when `wait`, else giving up at once), and reads the job as it stands then: `None`
/// when it was not taken, or when the job is already done.
pub async fn claim_job(
    conn: &mut PgConnection,
    id: Uuid,
    wait: bool,
) -> sqlx::Result<Option<ReratingJob>> {
    let taken = match wait {
        true => {
            sqlx::query!(
                "SELECT pg_advisory_xact_lock($1, hashtext($2::uuid::text))",
                JOBS,
                id,
            )
            .execute(&mut *conn)
            .await?;
            true
        }
        false => {
            sqlx::query_scalar!(
                "SELECT pg_try_advisory_xact_lock($1, hashtext($2::uuid::text)) AS \"taken!\"",
                JOBS,
                id,
            )
            .fetch_one(&mut *conn)
            .await?
        }
    };
    if !taken {
        return Ok(None);
    }
    let row = select_jobs!("WHERE id = $1", id)
        .fetch_optional(conn)
        .await?;
    Ok(row.map(ReratingJob::from))
}

/// Every job still owed, oldest first.
pub async fn pending_jobs(conn: &mut PgConnection) -> sqlx::Result<Vec<ReratingJob>> {
    let rows = select_jobs!("ORDER BY created_at, id")
        .fetch_all(conn)
        .await?;
    Ok(rows.into_iter().map(ReratingJob::from).collect())
}

/// Notes that a job re-assigned every record up to `after`.
pub async fn job_progress(
    conn: &mut PgConnection,
    id: Uuid,
    after: &RecordKey,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE rerating_jobs SET after_project = $2, after_task = $3, after_attempt = $4 \
         WHERE id = $1",
        id,
        after.project,
        after.task_id,
        after.attempt,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Removes a job that is done.
pub async fn finish_job(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<()> {
    sqlx::query!("DELETE FROM rerating_jobs WHERE id = $1", id)
        .execute(conn)
        .await?;
    Ok(())
}
