//! Job records: set-based, idempotent inserts decided by the table's primary key, corrections
//! that keep every earlier version, and the reads of the API.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::gpu::Precision;
use crate::domain::rating::{BillingMode, Outcome};
use crate::domain::record::{JobRecord, Output, RecordKey, Telemetry};
use crate::store::dynamic;

/// What happened to each record of a batch handed to [`insert_batch`].
#[derive(Debug, Default)]
pub struct InsertOutcome {
    /// Keys stored by this call.
    pub inserted: Vec<RecordKey>,
    /// Positions (in the slice given) of records already stored with the same content.
    pub duplicates: Vec<usize>,
    /// Positions of records whose key is stored with different content.
    pub conflicts: Vec<usize>,
}

/// Inserts records whose keys are not stored yet, in one statement, and classifies the rest
/// by comparing content hashes with what is stored — including rows another transaction
/// committed while this one waited. The caller owns the transaction: it commits, or rolls
/// back when there are conflicts. `records` must have distinct keys, sorted, so that
/// concurrent batches lock keys in the same order; `hashes` are their content hashes.
pub async fn insert_batch(
    conn: &mut PgConnection,
    records: &[JobRecord],
    hashes: &[Vec<u8>],
) -> sqlx::Result<InsertOutcome> {
    let columns = Columns::of(records);
    // Most batches carry no telemetry; they are stored without binding its columns.
    let telemetry = records
        .iter()
        .any(|r| r.telemetry != Telemetry::default())
        .then(|| TelemetryColumns::of(records));
    let mut extra_columns = String::new();
    let mut extra_arrays = String::new();
    let mut extra_names = String::new();
    let mut extra_values = String::new();
    if telemetry.is_some() {
        extra_columns.push_str(
            ", gpu_util, sm_active, tensor_active, dram_active, memory_peak_gib, \
             memory_total_gib, mig_profile, energy_joules, model_flops, precision, peak_flops",
        );
        extra_arrays.push_str(
            ", $21::numeric[], $22::numeric[], $23::numeric[], $24::numeric[], \
             $25::numeric[], $26::numeric[], $27::text[], $28::numeric[], $29::numeric[], \
             $30::text[], $31::numeric[]",
        );
        extra_names.push_str(", gu, sa, ta, da, mp, mt, mg, ej, mf, pc, pf");
        extra_values.push_str(", gu, sa, ta, da, mp, mt, mg, ej, mf, pc, pf");
    }
    // Most batches name no nodes either; a record's nodes travel as one JSON array each.
    let nodes = records
        .iter()
        .any(|r| !r.nodes.is_empty())
        .then(|| node_arrays(records));
    if nodes.is_some() {
        let placeholder = if telemetry.is_some() { 32 } else { 21 };
        extra_columns.push_str(", nodes");
        extra_arrays.push_str(&format!(", ${placeholder}::text[]"));
        extra_names.push_str(", nd");
        extra_values.push_str(
            ", CASE WHEN nd IS NULL THEN NULL \
                    ELSE ARRAY(SELECT jsonb_array_elements_text(nd::jsonb)) END",
        );
    }
    let sql = format!(
        "INSERT INTO job_records (project_id, task_id, attempt, gpu_model, gpu_count, \
             billing_mode, provider, region, queued_at, started_at, ended_at, gpu_seconds_held, \
             gpu_seconds_busy, outcome, retries, failures, output_quantity, output_unit, labels, \
             content_hash{extra_columns}) \
         SELECT p, t, a, m, c, b, pr, rg, q, s, e, h, bz, o, r, f, oq, ou, l::jsonb, ch{extra_values} \
         FROM UNNEST($1::text[], $2::text[], $3::int[], $4::text[], $5::numeric[], $6::text[], \
                     $7::text[], $8::text[], $9::timestamptz[], $10::timestamptz[], \
                     $11::timestamptz[], $12::numeric[], $13::numeric[], $14::text[], $15::int[], \
                     $16::int[], $17::numeric[], $18::text[], $19::text[], $20::bytea[]{extra_arrays}) \
              AS u(p, t, a, m, c, b, pr, rg, q, s, e, h, bz, o, r, f, oq, ou, l, ch{extra_names}) \
         ON CONFLICT (project_id, task_id, attempt) DO NOTHING \
         RETURNING project_id, task_id, attempt"
    );
    // Dynamic: the telemetry and node columns are stored only when the batch carries them.
    let query = dynamic::query_as(&sql)
        .bind(&columns.project)
        .bind(&columns.task_id)
        .bind(&columns.attempt)
        .bind(&columns.gpu_model)
        .bind(&columns.gpu_count)
        .bind(&columns.billing_mode)
        .bind(&columns.provider)
        .bind(&columns.region)
        .bind(&columns.queued_at)
        .bind(&columns.started_at)
        .bind(&columns.ended_at)
        .bind(&columns.held)
        .bind(&columns.busy)
        .bind(&columns.outcome)
        .bind(&columns.retries)
        .bind(&columns.failures)
        .bind(&columns.output_quantity)
        .bind(&columns.output_unit)
        .bind(&columns.labels)
        .bind(hashes);
    let query = match &telemetry {
        Some(t) => query
            .bind(&t.gpu_util)
            .bind(&t.sm_active)
            .bind(&t.tensor_active)
            .bind(&t.dram_active)
            .bind(&t.memory_peak_gib)
            .bind(&t.memory_total_gib)
            .bind(&t.mig_profile)
            .bind(&t.energy_joules)
            .bind(&t.model_flops)
            .bind(&t.precision)
            .bind(&t.peak_flops),
        None => query,
    };
    let query = match &nodes {
        Some(nodes) => query.bind(nodes),
        None => query,
    };
    let inserted: Vec<(String, String, i32)> = query.fetch_all(&mut *conn).await?;

    let mut outcome = InsertOutcome {
        inserted: inserted
            .into_iter()
            .map(|(project, task_id, attempt)| RecordKey {
                project,
                task_id,
                attempt,
            })
            .collect(),
        ..InsertOutcome::default()
    };
    if outcome.inserted.len() == records.len() {
        return Ok(outcome);
    }
    let stored: std::collections::HashSet<&RecordKey> = outcome.inserted.iter().collect();
    let pending: Vec<usize> = (0..records.len())
        .filter(|&i| !stored.contains(&records[i].key))
        .collect();
    let existing = stored_hashes(conn, pending.iter().map(|&i| &records[i].key)).await?;
    for index in pending {
        match existing.get(&records[index].key) {
            Some(hash) if *hash == hashes[index] => outcome.duplicates.push(index),
            // Stored without its nodes, sent again with them: the same record.
            Some(hash)
                if !records[index].nodes.is_empty()
                    && *hash == records[index].content_hash_without_nodes() =>
            {
                outcome.duplicates.push(index);
            }
            _ => outcome.conflicts.push(index),
        }
    }
    Ok(outcome)
}

async fn stored_hashes<'a>(
    conn: &mut PgConnection,
    keys: impl Iterator<Item = &'a RecordKey>,
) -> sqlx::Result<HashMap<RecordKey, Vec<u8>>> {
    let (mut projects, mut tasks, mut attempts) = (Vec::new(), Vec::new(), Vec::new());
    for key in keys {
        projects.push(key.project.as_str());
        tasks.push(key.task_id.as_str());
        attempts.push(key.attempt);
    }
    let rows = sqlx::query!(
        "SELECT j.project_id, j.task_id, j.attempt, j.content_hash \
         FROM UNNEST($1::text[], $2::text[], $3::int[]) AS k(p, t, a) \
         JOIN job_records j ON j.project_id = k.p AND j.task_id = k.t AND j.attempt = k.a",
        &projects as &[&str],
        &tasks as &[&str],
        &attempts,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| {
            (
                RecordKey {
                    project: row.project_id,
                    task_id: row.task_id,
                    attempt: row.attempt,
                },
                row.content_hash,
            )
        })
        .collect())
}

/// Each record's nodes as a JSON array, or null when it named none.
fn node_arrays(records: &[JobRecord]) -> Vec<Option<String>> {
    records
        .iter()
        .map(|r| {
            (!r.nodes.is_empty())
                .then(|| serde_json::to_string(&r.nodes).expect("node names serialise"))
        })
        .collect()
}

/// The records as parallel column arrays for `UNNEST`.
struct Columns {
    project: Vec<String>,
    task_id: Vec<String>,
    attempt: Vec<i32>,
    gpu_model: Vec<String>,
    gpu_count: Vec<Decimal>,
    billing_mode: Vec<&'static str>,
    provider: Vec<Option<String>>,
    region: Vec<Option<String>>,
    queued_at: Vec<Option<DateTime<Utc>>>,
    started_at: Vec<DateTime<Utc>>,
    ended_at: Vec<DateTime<Utc>>,
    held: Vec<Decimal>,
    busy: Vec<Option<Decimal>>,
    outcome: Vec<&'static str>,
    retries: Vec<i32>,
    failures: Vec<i32>,
    output_quantity: Vec<Option<Decimal>>,
    output_unit: Vec<Option<String>>,
    labels: Vec<String>,
}

impl Columns {
    fn of(records: &[JobRecord]) -> Self {
        let n = records.len();
        let mut c = Columns {
            project: Vec::with_capacity(n),
            task_id: Vec::with_capacity(n),
            attempt: Vec::with_capacity(n),
            gpu_model: Vec::with_capacity(n),
            gpu_count: Vec::with_capacity(n),
            billing_mode: Vec::with_capacity(n),
            provider: Vec::with_capacity(n),
            region: Vec::with_capacity(n),
            queued_at: Vec::with_capacity(n),
            started_at: Vec::with_capacity(n),
            ended_at: Vec::with_capacity(n),
            held: Vec::with_capacity(n),
            busy: Vec::with_capacity(n),
            outcome: Vec::with_capacity(n),
            retries: Vec::with_capacity(n),
            failures: Vec::with_capacity(n),
            output_quantity: Vec::with_capacity(n),
            output_unit: Vec::with_capacity(n),
            labels: Vec::with_capacity(n),
        };
        for r in records {
            c.project.push(r.key.project.clone());
            c.task_id.push(r.key.task_id.clone());
            c.attempt.push(r.key.attempt);
            c.gpu_model.push(r.gpu_model.clone());
            c.gpu_count.push(r.gpu_count);
            c.billing_mode.push(r.billing_mode.as_str());
            c.provider.push(r.provider.clone());
            c.region.push(r.region.clone());
            c.queued_at.push(r.queued_at);
            c.started_at.push(r.started_at);
            c.ended_at.push(r.ended_at);
            c.held.push(r.gpu_seconds_held);
            c.busy.push(r.gpu_seconds_busy);
            c.outcome.push(r.outcome.as_str());
            c.retries.push(r.retries);
            c.failures.push(r.failures);
            c.output_quantity
                .push(r.output.as_ref().map(|o| o.quantity));
            c.output_unit
                .push(r.output.as_ref().map(|o| o.unit.clone()));
            c.labels
                .push(serde_json::to_string(&r.labels).expect("labels serialise"));
        }
        c
    }
}

/// The telemetry columns of a batch, for `UNNEST`.
#[derive(Default)]
struct TelemetryColumns {
    gpu_util: Vec<Option<Decimal>>,
    sm_active: Vec<Option<Decimal>>,
    tensor_active: Vec<Option<Decimal>>,
    dram_active: Vec<Option<Decimal>>,
    memory_peak_gib: Vec<Option<Decimal>>,
    memory_total_gib: Vec<Option<Decimal>>,
    mig_profile: Vec<Option<String>>,
    energy_joules: Vec<Option<Decimal>>,
    model_flops: Vec<Option<Decimal>>,
    precision: Vec<Option<&'static str>>,
    peak_flops: Vec<Option<Decimal>>,
}

impl TelemetryColumns {
    fn of(records: &[JobRecord]) -> Self {
        let mut c = TelemetryColumns::default();
        for t in records.iter().map(|r| &r.telemetry) {
            c.gpu_util.push(t.gpu_util);
            c.sm_active.push(t.sm_active);
            c.tensor_active.push(t.tensor_active);
            c.dram_active.push(t.dram_active);
            c.memory_peak_gib.push(t.memory_peak_gib);
            c.memory_total_gib.push(t.memory_total_gib);
            c.mig_profile.push(t.mig_profile.clone());
            c.energy_joules.push(t.energy_joules);
            c.model_flops.push(t.model_flops);
            c.precision.push(t.precision.map(|p| p.as_str()));
            c.peak_flops.push(t.peak_flops);
        }
        c
    }
}

/// A record's labels as stored.
pub type Labels = sqlx::types::Json<BTreeMap<String, String>>;

/// A stored record with its bookkeeping.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct RecordRow {
    pub project_id: String,
    pub task_id: String,
    pub attempt: i32,
    pub version: i32,
    pub gpu_model: String,
    pub gpu_count: Decimal,
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
    pub labels: Labels,
    #[sqlx(flatten)]
    pub telemetry: TelemetryRow,
    pub nodes: Option<Vec<String>>,
    pub ingested_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `query!` of `$head` (a literal), the columns a [`RecordRow`] reads, then `$rest` (a
/// literal); [`record_row`] makes each row a [`RecordRow`].
macro_rules! select_records {
    ($head:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head
                + "project_id, task_id, attempt, version, gpu_model, gpu_count, billing_mode, \
                   provider, region, queued_at, started_at, ended_at, gpu_seconds_held, \
                   gpu_seconds_busy, outcome, retries, failures, output_quantity, output_unit, \
                   labels AS \"labels: crate::store::records::Labels\", \
                   gpu_util, sm_active, tensor_active, dram_active, memory_peak_gib, \
                   memory_total_gib, mig_profile, energy_joules, model_flops, precision, \
                   peak_flops, nodes, ingested_at, updated_at"
                + $rest
            $(, $arg)*
        )
    };
}
pub(crate) use select_records;

/// The [`RecordRow`] of a row `$r` read by [`select_records`], inside a `try_map`.
macro_rules! record_row {
    ($r:ident) => {
        $crate::store::records::RecordRow {
            project_id: $r.project_id,
            task_id: $r.task_id,
            attempt: $r.attempt,
            version: $r.version,
            gpu_model: $r.gpu_model,
            gpu_count: $r.gpu_count,
            billing_mode: $crate::store::decoded("billing_mode", $r.billing_mode)?,
            provider: $r.provider,
            region: $r.region,
            queued_at: $r.queued_at,
            started_at: $r.started_at,
            ended_at: $r.ended_at,
            gpu_seconds_held: $r.gpu_seconds_held,
            gpu_seconds_busy: $r.gpu_seconds_busy,
            outcome: $crate::store::decoded("outcome", $r.outcome)?,
            retries: $r.retries,
            failures: $r.failures,
            output_quantity: $r.output_quantity,
            output_unit: $r.output_unit,
            telemetry: $crate::store::records::telemetry_row!($r),
            labels: $r.labels,
            nodes: $r.nodes,
            ingested_at: $r.ingested_at,
            updated_at: $r.updated_at,
        }
    };
}
pub(crate) use record_row;

/// The [`TelemetryRow`] of a row `$r` that read the telemetry columns of `job_records`.
macro_rules! telemetry_row {
    ($r:ident) => {
        $crate::store::records::TelemetryRow {
            gpu_util: $r.gpu_util,
            sm_active: $r.sm_active,
            tensor_active: $r.tensor_active,
            dram_active: $r.dram_active,
            memory_peak_gib: $r.memory_peak_gib,
            memory_total_gib: $r.memory_total_gib,
            mig_profile: $r.mig_profile,
            energy_joules: $r.energy_joules,
            model_flops: $r.model_flops,
            precision: $r.precision,
            peak_flops: $r.peak_flops,
        }
    };
}
pub(crate) use telemetry_row;

impl RecordRow {
    /// The record as it was validated.
    pub fn to_record(&self) -> JobRecord {
        JobRecord {
            key: RecordKey {
                project: self.project_id.clone(),
                task_id: self.task_id.clone(),
                attempt: self.attempt,
            },
            gpu_model: self.gpu_model.clone(),
            gpu_count: self.gpu_count.normalize(),
            billing_mode: self.billing_mode,
            provider: self.provider.clone(),
            region: self.region.clone(),
            queued_at: self.queued_at,
            started_at: self.started_at,
            ended_at: self.ended_at,
            gpu_seconds_held: self.gpu_seconds_held.normalize(),
            gpu_seconds_busy: self.gpu_seconds_busy.map(|b| b.normalize()),
            outcome: self.outcome,
            retries: self.retries,
            failures: self.failures,
            output: match (self.output_quantity, &self.output_unit) {
                (Some(quantity), Some(unit)) => Some(Output {
                    quantity: quantity.normalize(),
                    unit: unit.clone(),
                }),
                _ => None,
            },
            labels: self.labels.0.clone(),
            telemetry: self.telemetry.to_telemetry(),
            nodes: self.nodes.clone().unwrap_or_default(),
        }
    }
}

/// The telemetry columns of a `job_records` row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TelemetryRow {
    pub gpu_util: Option<Decimal>,
    pub sm_active: Option<Decimal>,
    pub tensor_active: Option<Decimal>,
    pub dram_active: Option<Decimal>,
    pub memory_peak_gib: Option<Decimal>,
    pub memory_total_gib: Option<Decimal>,
    pub mig_profile: Option<String>,
    pub energy_joules: Option<Decimal>,
    pub model_flops: Option<Decimal>,
    pub precision: Option<String>,
    pub peak_flops: Option<Decimal>,
}

impl TelemetryRow {
    pub fn to_telemetry(&self) -> Telemetry {
        let normal = |value: Option<Decimal>| value.map(|v| v.normalize());
        Telemetry {
            gpu_util: normal(self.gpu_util),
            sm_active: normal(self.sm_active),
            tensor_active: normal(self.tensor_active),
            dram_active: normal(self.dram_active),
            memory_peak_gib: normal(self.memory_peak_gib),
            memory_total_gib: normal(self.memory_total_gib),
            mig_profile: self.mig_profile.clone(),
            energy_joules: normal(self.energy_joules),
            model_flops: normal(self.model_flops),
            precision: self.precision.as_deref().and_then(Precision::parse),
            peak_flops: normal(self.peak_flops),
        }
    }
}

pub async fn get(pool: &PgPool, key: &RecordKey) -> sqlx::Result<Option<RecordRow>> {
    select_records!(
        "SELECT ",
        " FROM job_records WHERE project_id = $1 AND task_id = $2 AND attempt = $3",
        key.project,
        key.task_id,
        key.attempt,
    )
    .try_map(|r| Ok(record_row!(r)))
    .fetch_optional(pool)
    .await
}

/// Filters of the record list; `after` continues after the last row of the previous page.
#[derive(Debug, Default)]
pub struct RecordFilter {
    pub from: Option<DateTime<Utc>>,
    pub to: Option<DateTime<Utc>>,
    pub outcome: Option<Outcome>,
    pub task_id: Option<String>,
    pub after: Option<(DateTime<Utc>, String, i32)>,
}

/// Records of a project by `started_at` in `[from, to)`, in start order.
pub async fn list(
    pool: &PgPool,
    project: &str,
    filter: &RecordFilter,
    limit: i64,
) -> sqlx::Result<Vec<RecordRow>> {
    let (after_start, after_task, after_attempt) = match &filter.after {
        Some((start, task, attempt)) => (Some(*start), Some(task.as_str()), Some(*attempt)),
        None => (None, None, None),
    };
    select_records!(
        "SELECT ",
        " FROM job_records \
         WHERE project_id = $1 \
           AND ($2::timestamptz IS NULL OR started_at >= $2) \
           AND ($3::timestamptz IS NULL OR started_at < $3) \
           AND ($4::text IS NULL OR outcome = $4) \
           AND ($5::text IS NULL OR task_id = $5) \
           AND ($6::timestamptz IS NULL OR (started_at, task_id, attempt) > ($6, $7, $8)) \
         ORDER BY started_at, task_id, attempt LIMIT $9",
        project,
        filter.from,
        filter.to,
        filter.outcome.map(|o| o.as_str()),
        filter.task_id,
        after_start,
        after_task,
        after_attempt,
        limit,
    )
    .try_map(|r| Ok(record_row!(r)))
    .fetch_all(pool)
    .await
}

/// Locks a stored record for a correction.
pub async fn lock(conn: &mut PgConnection, key: &RecordKey) -> sqlx::Result<Option<RecordRow>> {
    select_records!(
        "SELECT ",
        " FROM job_records WHERE project_id = $1 AND task_id = $2 AND attempt = $3 FOR UPDATE",
        key.project,
        key.task_id,
        key.attempt,
    )
    .try_map(|r| Ok(record_row!(r)))
    .fetch_optional(conn)
    .await
}

/// Replaces a locked record, keeping the version it replaces in the history.
pub async fn replace(
    conn: &mut PgConnection,
    previous: &RecordRow,
    record: &JobRecord,
    changed_by: Option<Uuid>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO job_record_versions \
             (project_id, task_id, attempt, version, record, recorded_at, replaced_by) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        previous.project_id,
        previous.task_id,
        previous.attempt,
        previous.version,
        previous.to_record().canonical_json(),
        previous.updated_at,
        changed_by,
    )
    .execute(&mut *conn)
    .await?;
    let labels = serde_json::to_string(&record.labels).expect("labels serialise");
    let telemetry = &record.telemetry;
    sqlx::query!(
        "UPDATE job_records SET version = version + 1, gpu_model = $4, gpu_count = $5, \
             billing_mode = $6, provider = $7, region = $8, queued_at = $9, started_at = $10, \
             ended_at = $11, gpu_seconds_held = $12, gpu_seconds_busy = $13, outcome = $14, \
             retries = $15, failures = $16, output_quantity = $17, output_unit = $18, \
             labels = $19::text::jsonb, content_hash = $20, gpu_util = $21, sm_active = $22, \
             tensor_active = $23, dram_active = $24, memory_peak_gib = $25, \
             memory_total_gib = $26, mig_profile = $27, nodes = $28, energy_joules = $29, \
             model_flops = $30, precision = $31, peak_flops = $32, updated_at = now() \
         WHERE project_id = $1 AND task_id = $2 AND attempt = $3",
        record.key.project,
        record.key.task_id,
        record.key.attempt,
        record.gpu_model,
        record.gpu_count,
        record.billing_mode.as_str(),
        record.provider,
        record.region,
        record.queued_at,
        record.started_at,
        record.ended_at,
        record.gpu_seconds_held,
        record.gpu_seconds_busy,
        record.outcome.as_str(),
        record.retries,
        record.failures,
        record.output.as_ref().map(|o| o.quantity),
        record.output.as_ref().map(|o| o.unit.as_str()),
        labels,
        record.content_hash(),
        telemetry.gpu_util,
        telemetry.sm_active,
        telemetry.tensor_active,
        telemetry.dram_active,
        telemetry.memory_peak_gib,
        telemetry.memory_total_gib,
        telemetry.mig_profile,
        (!record.nodes.is_empty()).then_some(record.nodes.as_slice()),
        telemetry.energy_joules,
        telemetry.model_flops,
        telemetry.precision.map(|p| p.as_str()),
        telemetry.peak_flops,
    )
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct VersionRow {
    pub version: i32,
    pub record: serde_json::Value,
    pub recorded_at: DateTime<Utc>,
    pub replaced_by: Option<Uuid>,
    pub replaced_at: DateTime<Utc>,
}

/// Earlier versions of a record, oldest first.
pub async fn history(pool: &PgPool, key: &RecordKey) -> sqlx::Result<Vec<VersionRow>> {
    sqlx::query_as!(
        VersionRow,
        "SELECT version, record, recorded_at, replaced_by, replaced_at FROM job_record_versions \
         WHERE project_id = $1 AND task_id = $2 AND attempt = $3 ORDER BY version",
        key.project,
        key.task_id,
        key.attempt,
    )
    .fetch_all(pool)
    .await
}
