//! Storing a batch of job records, shared by the HTTP endpoint and `taskledger import`:
//! identical copies collapse, differing copies of a key are a conflict, and the database's
//! primary key decides what is new, whatever other requests do at the same time.

use std::collections::{BTreeMap, BTreeSet};

use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::record::{JobRecord, RecordKey};
use crate::domain::validation::{FieldError, Violations};
use crate::domain::values::Month;
use crate::domain::values::months_between;
use crate::ledger::alerting;
use crate::ledger::instruments::{self, BatchTimer, Rating, RatingCause};
use crate::ledger::{LedgerError, LedgerResult, capacity_rollup, rating};
use crate::store;

/// A validated record and its position in what the client sent.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub position: usize,
    pub record: JobRecord,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Stored {
    /// Records written by this batch.
    pub accepted: usize,
    /// Records already stored with the same content, or repeated inside the batch.
    pub duplicates: usize,
}

/// A record whose key is taken by different content; nothing of its batch was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    pub position: usize,
    pub key: RecordKey,
    pub reason: ConflictReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConflictReason {
    /// The key is stored with different content.
    Stored,
    /// The same batch holds another, different, copy of the key.
    InBatch,
}

impl Conflict {
    pub fn message(&self) -> String {
        let key = &self.key;
        match self.reason {
            ConflictReason::Stored => format!(
                "record {key} is already stored with different content; correct it with \
                 PUT /v1/projects/{}/job-records/{}/{}",
                key.project, key.task_id, key.attempt
            ),
            ConflictReason::InBatch => {
                format!("the batch holds different copies of record {key}")
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("{} records conflict with stored or repeated keys", .0.len())]
    Conflicts(Vec<Conflict>),
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("rating the records failed: {0:#}")]
    Rating(anyhow::Error),
    #[error("judging the records for idle GPUs failed: {0:#}")]
    IdleGpuAlerts(anyhow::Error),
}

/// Stores a batch all or nothing: on any conflict nothing is written. What is written is
/// rated in the same transaction, with days and months of `tz`, and judged for idle GPUs
/// there, so an idle-GPU alert commits exactly with its record; then the budget burn of every
/// project and month it touched is re-evaluated.
pub async fn store_batch(
    pool: &PgPool,
    batch: Vec<Submitted>,
    settings: &Settings,
) -> Result<Stored, IngestError> {
    let _timer = BatchTimer::start();
    let tz = settings.timezone;
    let (unique, hashes, repeats) = collapse(batch)?;
    let records: Vec<JobRecord> = unique.iter().map(|s| s.record.clone()).collect();
    let mut tx = pool.begin().await?;
    rating::hold_contract_sets(
        &mut tx,
        records
            .iter()
            .map(|r| (r.gpu_model.clone(), r.billing_mode)),
    )
    .await?;
    let outcome = store::records::insert_batch(&mut tx, &records, &hashes).await?;
    if !outcome.conflicts.is_empty() {
        tx.rollback().await?;
        return Err(IngestError::Conflicts(
            outcome
                .conflicts
                .iter()
                .map(|&i| Conflict {
                    position: unique[i].position,
                    key: unique[i].record.key.clone(),
                    reason: ConflictReason::Stored,
                })
                .collect(),
        ));
    }
    let by_key: BTreeMap<&RecordKey, &JobRecord> = records.iter().map(|r| (&r.key, r)).collect();
    // In key order, as the task locks are taken.
    let bounded: Vec<(RecordKey, i64)> = outcome
        .inserted
        .iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .map(|key| (key.clone(), by_key[key].segment_bound()))
        .collect();
    let rating = Rating::start(RatingCause::Ingest);
    // Only the records this batch inserted are rated: none has segments yet.
    let touched = rating::rate_in_bounded_calls(&mut tx, &bounded, tz, true)
        .await
        .map_err(IngestError::Rating)?;
    capacity_rollup::refresh_rated(&mut tx, touched, tz)
        .await
        .map_err(|error| IngestError::Rating(error.into()))?;
    rating.finished(bounded.len());
    let stored: Vec<&JobRecord> = bounded.iter().map(|(key, _)| by_key[key]).collect();
    alerting::fire_idle_gpu(&mut tx, &stored, settings.clock.now(), tz)
        .await
        .map_err(IngestError::IdleGpuAlerts)?;
    let stored_keys: BTreeSet<&RecordKey> = outcome.inserted.iter().collect();
    tx.commit().await?;
    let touched: BTreeSet<(String, Month)> = unique
        .iter()
        .filter(|s| stored_keys.contains(&s.record.key))
        .flat_map(|s| {
            months_between(s.record.started_at, s.record.ended_at, tz)
                .into_iter()
                .map(|month| (s.record.key.project.clone(), month))
        })
        .collect();
    alerting::evaluate_all(pool, touched, settings).await;
    metrics::counter!(instruments::JOB_RECORDS, "result" => "accepted")
        .increment(outcome.inserted.len() as u64);
    metrics::counter!(instruments::JOB_RECORDS, "result" => "duplicate")
        .increment((outcome.duplicates.len() + repeats) as u64);
    Ok(Stored {
        accepted: outcome.inserted.len(),
        duplicates: outcome.duplicates.len() + repeats,
    })
}

/// The positions of the records whose project does not exist.
pub async fn unknown_projects(pool: &PgPool, batch: &[Submitted]) -> sqlx::Result<Vec<usize>> {
    let named: Vec<String> = batch
        .iter()
        .map(|s| s.record.key.project.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let existing: BTreeSet<String> = store::projects::existing_ids(pool, &named)
        .await?
        .into_iter()
        .collect();
    Ok(batch
        .iter()
        .filter(|s| !existing.contains(&s.record.key.project))
        .map(|s| s.position)
        .collect())
}

/// Stores a batch all or nothing, as the API takes it: a record naming a project that does
/// not exist is invalid at `/<position>/project`, a conflict is named at `/<position>`.
pub async fn ingest(
    pool: &PgPool,
    batch: Vec<Submitted>,
    settings: &Settings,
) -> LedgerResult<Stored> {
    let unknown = unknown_projects(pool, &batch).await?;
    if !unknown.is_empty() {
        instruments::job_records_rejected(unknown.len());
        let mut violations = Violations::default();
        for s in batch.iter().filter(|s| unknown.contains(&s.position)) {
            violations.push(
                format!("/{}/project", s.position),
                format!("project `{}` does not exist", s.record.key.project),
            );
        }
        return Err(violations.into());
    }
    store_batch(pool, batch, settings)
        .await
        .inspect_err(|error| {
            if let IngestError::Conflicts(conflicts) = error {
                instruments::job_records_rejected(conflicts.len());
            }
        })
        .map_err(|error| match error {
            IngestError::Conflicts(conflicts) => LedgerError::Conflict(
                format!(
                    "{} records conflict with stored or repeated keys; nothing was written",
                    conflicts.len()
                ),
                conflicts
                    .iter()
                    .map(|c| FieldError::new(format!("/{}", c.position), c.message()))
                    .collect(),
            ),
            IngestError::Database(error) => error.into(),
            IngestError::Rating(error) | IngestError::IdleGpuAlerts(error) => error.into(),
        })
}

/// A batch with one record per key: the records, their content hashes, and how many
/// identical repeats were dropped.
type Collapsed = (Vec<Submitted>, Vec<Vec<u8>>, usize);

/// One record per key, sorted by key (so concurrent batches lock keys in the same order).
fn collapse(batch: Vec<Submitted>) -> Result<Collapsed, IngestError> {
    let mut by_key: BTreeMap<RecordKey, (Submitted, Vec<u8>)> = BTreeMap::new();
    let mut repeats = 0;
    let mut conflicts = Vec::new();
    for submitted in batch {
        let hash = submitted.record.content_hash();
        match by_key.get(&submitted.record.key) {
            None => {
                by_key.insert(submitted.record.key.clone(), (submitted, hash));
            }
            Some((_, first_hash)) if *first_hash == hash => repeats += 1,
            Some((first, _)) => {
                if !conflicts
                    .iter()
                    .any(|c: &Conflict| c.position == first.position)
                {
                    conflicts.push(Conflict {
                        position: first.position,
                        key: first.record.key.clone(),
                        reason: ConflictReason::InBatch,
                    });
                }
                conflicts.push(Conflict {
                    position: submitted.position,
                    key: submitted.record.key.clone(),
                    reason: ConflictReason::InBatch,
                });
            }
        }
    }
    if conflicts.is_empty() {
        let (unique, hashes) = by_key.into_values().unzip();
        Ok((unique, hashes, repeats))
    } else {
        conflicts.sort_by_key(|c| c.position);
        Err(IngestError::Conflicts(conflicts))
    }
}
