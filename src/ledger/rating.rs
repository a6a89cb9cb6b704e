//! Rating: which records are rated, against which contracts, in what batches and under which
//! locks. The rules are the domain's ([`assign_record`], [`task_marks`]); the statements
//! are the store's ([`crate::store::rating`]).
//!
//! Rating stores card-seconds per contract, not money; prices and FX rates apply when a
//! figure is read. So a change of a contract's price or of an FX rate writes one row and
//! re-rates nothing. What still re-rates is a change of *which* contract prices which hours
//! (a contract created or deleted, or its model, billing mode, validity or scope changed):
//! the records of that kind in that span are re-assigned.
//!
//! The lock discipline that keeps this exact while CI posts records (docs/cost-model.md,
//! "When prices apply"):
//!
//! - Whoever rates records of a model and billing mode (ingest, a correction, a page of a
//!   re-assignment) first takes the kind's contract-set lock **shared**, in its transaction,
//!   before it reads the contracts, and keeps it until it commits.
//! - A change of which contract prices a kind takes that lock **exclusive** in the
//!   transaction that stores the contract, and stores a re-assignment job beside it. It waits
//!   only for the rating transactions already running (one batch each) and holds the lock
//!   only while it writes the contract and the job.
//! - The job then re-assigns the kind's records in the span page by page, each page in a
//!   transaction of its own that rates like ingest (shared lock, task row locks). A record
//!   committed before the change is re-assigned by the job; one rated after it reads the new
//!   contracts. Every writer of a task holds the task's row, so two ratings of one record
//!   never interleave. No interleaving leaves a record assigned by a contract set that no
//!   longer holds; the job's progress is stored with each page, and a job a stopped service
//!   leaves, or whose run failed, is finished at the next start and by the re-assignment
//!   worker (`workers::reassignment`). Whoever runs a job holds its lock, so two
//!   replicas never run one job at once.

use std::collections::{HashMap, HashSet};

use anyhow::Context;
use chrono_tz::Tz;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::rating::{BillingMode, assign_record};
use crate::domain::record::RecordKey;
use crate::domain::task::{task_marks, task_status};
use crate::ledger::capacity_rollup;
use crate::ledger::instruments::{Rating, RatingCause};
use crate::store;
use crate::store::rating::{
    AttemptRow, KindSpan, NodeHours, Rated, RecordColumns, ReratingJob, SegmentColumns,
};
use crate::store::tasks::Settlement;

pub use crate::store::rollups::Compaction;

/// The most hourly segments one rating call is asked to make. A call holds its segments in
/// memory, so this bounds the memory of rating, whatever the batch: records of up to a month
/// make up to 745 segments each.
pub const SEGMENTS_PER_CALL: i64 = 10_000;

/// The most segments one page of a re-assignment rates in its own transaction: small enough
/// that a batch of CI's waiting on one of its tasks waits well under a second.
pub const SEGMENTS_PER_REASSIGNMENT: i64 = 2_000;

/// How many record keys a re-assignment reads at once.
const KEYS_PER_PAGE: i64 = 10_000;

/// Takes the contract-set locks of `kinds` shared, for the rest of the transaction: whoever
/// rates records of these kinds calls it first.
pub async fn hold_contract_sets(
    conn: &mut PgConnection,
    kinds: impl IntoIterator<Item = (String, BillingMode)>,
) -> sqlx::Result<()> {
    lock_contract_sets(conn, kinds, false).await
}

/// Takes the contract-set locks of `kinds` exclusive: a change of which contract prices
/// which hours of them calls it before it stores the contract.
pub async fn change_contract_sets(
    conn: &mut PgConnection,
    kinds: impl IntoIterator<Item = (String, BillingMode)>,
) -> sqlx::Result<()> {
    lock_contract_sets(conn, kinds, true).await
}

async fn lock_contract_sets(
    conn: &mut PgConnection,
    kinds: impl IntoIterator<Item = (String, BillingMode)>,
    exclusive: bool,
) -> sqlx::Result<()> {
    let mut kinds: Vec<(String, BillingMode)> = kinds.into_iter().collect();
    kinds.sort_unstable();
    kinds.dedup();
    store::rating::hold_contract_sets(conn, &kinds, exclusive).await
}

/// (Re)rates the records with these keys from their current `job_records` rows; the caller
/// holds the contract-set locks of their kinds ([`hold_contract_sets`]).
///
/// Their old segments and their contributions to the rollups are removed, they are assigned
/// to the contracts in the database, and the new segments are stored and added to the
/// rollups. The per-record figures of every attempt of their tasks are recomputed too, since
/// one attempt decides whether its siblings complete or fail the task. A key without a
/// `job_records` row only loses its contributions. With `fresh`, the keys are of records
/// stored in this transaction and never rated.
pub async fn rate_records(
    conn: &mut PgConnection,
    keys: &[RecordKey],
    tz: Tz,
    fresh: bool,
) -> anyhow::Result<NodeHours> {
    if keys.is_empty() {
        return Ok(NodeHours::default());
    }
    let mut tasks: Vec<(&str, &str)> = keys
        .iter()
        .map(|key| (key.project.as_str(), key.task_id.as_str()))
        .collect();
    tasks.sort_unstable();
    tasks.dedup();
    // In key order, so that concurrent calls lock shared tasks in the same order.
    store::rating::lock_tasks(conn, &tasks)
        .await
        .context("locking the tasks to rate")?;
    let attempts = store::rating::load_attempts(conn, &tasks)
        .await
        .context("loading the records to rate")?;

    let wanted: HashSet<(&str, &str, i32)> = keys
        .iter()
        .map(|k| (k.project.as_str(), k.task_id.as_str(), k.attempt))
        .collect();
    let to_rate: Vec<&AttemptRow> = attempts
        .iter()
        .filter(|r| wanted.contains(&r.key()))
        .collect();
    let segments = assign(conn, &to_rate, tz).await?;

    let mut records = RecordColumns::default();
    let mut settlement = Settlement::default();
    let by_task: HashMap<(&str, &str), &[AttemptRow]> = attempts
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
        let ends: Vec<_> = task_attempts.iter().map(AttemptRow::to_end).collect();
        records.push_task(task_attempts, &task_marks(&ends), tz);
        settlement.push(
            task,
            task_status(&ends),
            task_attempts.iter().map(|a| a.gpu_model.as_str()),
        )?;
    }
    let rated = Rated {
        keys,
        tasks: &tasks,
        segments,
        records,
        settlement,
        fresh,
    };
    store::rating::store_rated(conn, rated, tz).await
}

/// Assigns `records` to the contracts that may price them.
async fn assign(
    conn: &mut PgConnection,
    records: &[&AttemptRow],
    tz: Tz,
) -> anyhow::Result<SegmentColumns> {
    let mut segments = SegmentColumns::default();
    if records.is_empty() {
        return Ok(segments);
    }
    let mut kinds: Vec<(&str, &str)> = records
        .iter()
        .map(|r| (r.gpu_model.as_str(), r.billing_mode.as_str()))
        .collect();
    kinds.sort_unstable();
    kinds.dedup();
    let models: Vec<String> = kinds.iter().map(|k| k.0.to_owned()).collect();
    let modes: Vec<String> = kinds.iter().map(|k| k.1.to_owned()).collect();
    let contracts = store::contracts::for_kinds(conn, &models, &modes)
        .await
        .context("loading contracts")?
        .iter()
        .map(store::contracts::ContractRow::to_domain)
        .collect::<Vec<_>>();
    for row in records {
        let telemetry = row.telemetry.to_telemetry();
        let record = row.to_rate(&telemetry);
        let assigned = assign_record(&record, &contracts, tz);
        segments.push_record(row, &record, &telemetry, assigned)?;
    }
    Ok(segments)
}

/// `keys` (each with an upper bound of the segments it makes) in calls of at most `limit`
/// segments; a record larger than that makes a call alone.
fn bounded_calls(
    keys: &[(RecordKey, i64)],
    limit: i64,
) -> impl Iterator<Item = Vec<RecordKey>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= keys.len() {
            return None;
        }
        let mut end = start + 1;
        let mut segments = keys[start].1;
        while end < keys.len() && segments + keys[end].1 <= limit {
            segments += keys[end].1;
            end += 1;
        }
        let chunk = keys[start..end].iter().map(|(k, _)| k.clone()).collect();
        start = end;
        Some(chunk)
    })
}

/// Rates `keys` (in key order, each with an upper bound of the segments it makes) in calls
/// of at most [`SEGMENTS_PER_CALL`] segments; `fresh` as for [`rate_records`].
pub async fn rate_in_bounded_calls(
    conn: &mut PgConnection,
    keys: &[(RecordKey, i64)],
    tz: Tz,
    fresh: bool,
) -> anyhow::Result<NodeHours> {
    let mut touched = NodeHours::default();
    for chunk in bounded_calls(keys, SEGMENTS_PER_CALL) {
        touched.extend(rate_records(conn, &chunk, tz, fresh).await?);
    }
    Ok(touched)
}

/// Runs re-assignment job `id` to its end, holding the job's lock so that no other replica
/// runs it at the same time: waiting for whoever holds it when `wait` (a change that must
/// return with its records re-assigned), else leaving it to them. The records it names are
/// re-assigned page by page from where it stood, each call of at most
/// [`SEGMENTS_PER_REASSIGNMENT`] segments in a transaction of its own that takes the kind's
/// contract-set lock shared, as ingest does, and notes the job's progress; then the job is
/// removed. Returns how many records it re-assigned, or `None` when it was left to another
/// runner or already done.
pub async fn run_job(pool: &PgPool, id: Uuid, tz: Tz, wait: bool) -> anyhow::Result<Option<usize>> {
    // The lock is the holding transaction's: it goes with it however the run ends.
    let mut holder = pool.begin().await?;
    let Some(job) = store::rating::claim_job(&mut holder, id, wait).await? else {
        return Ok(None);
    };
    let rating = Rating::start(RatingCause::Contract);
    let kind = (job.of.gpu_model.clone(), job.of.billing_mode);
    let mut after = job.after.clone();
    let mut rerated = 0;
    loop {
        let page = {
            let mut conn = pool.acquire().await?;
            store::rating::record_page(&mut conn, &job.of, after.as_ref(), KEYS_PER_PAGE)
                .await
                .context("finding the records a contract change re-assigns")?
        };
        let Some((last, _)) = page.last() else {
            break;
        };
        let last = last.clone();
        for chunk in bounded_calls(&page, SEGMENTS_PER_REASSIGNMENT) {
            let mut tx = pool.begin().await?;
            hold_contract_sets(&mut tx, [kind.clone()]).await?;
            let touched = rate_records(&mut tx, &chunk, tz, false).await?;
            capacity_rollup::refresh_rated(&mut tx, touched, tz).await?;
            if let Some(chunk_last) = chunk.last() {
                store::rating::job_progress(&mut tx, job.id, chunk_last).await?;
            }
            tx.commit().await?;
            rerated += chunk.len();
        }
        after = Some(last);
    }
    store::rating::finish_job(&mut holder, job.id).await?;
    holder.commit().await?;
    rating.finished(rerated);
    Ok(Some(rerated))
}

/// Runs every re-assignment job still owed that no other replica is running: those a stopped
/// service left, and those whose run failed. Returns how many it ran.
pub async fn finish_pending_jobs(pool: &PgPool, tz: Tz) -> anyhow::Result<usize> {
    let jobs = store::rating::pending_jobs(&mut *pool.acquire().await?).await?;
    let mut ran = 0;
    for job in &jobs {
        if run_job(pool, job.id, tz, false).await?.is_some() {
            ran += 1;
        }
    }
    Ok(ran)
}

/// The records of `of` a contract change re-assigns, for the change's transaction to store
/// as a job.
pub async fn owe_reassignment(conn: &mut PgConnection, of: &KindSpan) -> sqlx::Result<ReratingJob> {
    store::rating::insert_job(conn, of).await
}

/// Folds the rollups' delta rows into their compacted rows; `None` when another process is
/// compacting.
pub async fn compact(pool: &PgPool) -> anyhow::Result<Option<Compaction>> {
    store::rollups::compact(pool).await
}
