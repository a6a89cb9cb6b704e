//! Storing what a scheduler source read (a Slurm file, a collector's window). A batch is
//! checked whole before anything is written: one unreadable job, invalid record or unknown
//! project and nothing of it is stored, so a fixed input can simply be imported again. The
//! records are then stored through the same use case as `POST /v1/job-records`, in
//! transactions of [`BATCH_SIZE`], each all or nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::record::{JobRecord, RecordRules};
use crate::ledger::import::{BATCH_SIZE, Rejection};
use crate::ledger::ingest::{self, IngestError, Submitted};
use crate::sources::batch::{LeftOut, SourceBatch};
use crate::store;

/// What became of a source's jobs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceSummary {
    pub jobs_read: usize,
    /// Job records the jobs became.
    pub records: usize,
    pub accepted: usize,
    pub duplicates: usize,
    pub skipped: BTreeMap<&'static str, usize>,
    /// Unreadable input, invalid records and refused batches, each with where it came from.
    pub problems: Vec<Rejection>,
    /// Figures read but left out of their records, by field and reason.
    pub left_out: BTreeMap<LeftOut, usize>,
}

impl SourceSummary {
    /// The counts of a batch, before anything was stored.
    pub fn of(batch: &SourceBatch) -> Self {
        Self {
            jobs_read: batch.jobs_read,
            records: batch.records.len(),
            skipped: batch.skipped.clone(),
            left_out: batch.left_out.clone(),
            ..Self::default()
        }
    }

    /// Adds what became of another part of the same source.
    pub fn absorb(&mut self, other: SourceSummary) {
        self.jobs_read += other.jobs_read;
        self.records += other.records;
        self.accepted += other.accepted;
        self.duplicates += other.duplicates;
        for (reason, count) in other.skipped {
            *self.skipped.entry(reason).or_default() += count;
        }
        self.problems.extend(other.problems);
        for (left_out, count) in other.left_out {
            *self.left_out.entry(left_out).or_default() += count;
        }
    }

    /// Whether anything could not be read or stored: the command exits non-zero.
    pub fn failed(&self) -> bool {
        !self.problems.is_empty()
    }

    /// The summary printed at the end of an import or a collection; at most `shown` problems
    /// are listed.
    pub fn render(&self, shown: usize) -> String {
        self.render_counting("jobs read", shown)
    }

    /// [`Self::render`], naming what was read (`pods seen`).
    pub fn render_counting(&self, read: &str, shown: usize) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{read} {}, records {}: accepted {}, duplicates {}",
            self.jobs_read, self.records, self.accepted, self.duplicates
        );
        let skipped: Vec<String> = self
            .skipped
            .iter()
            .map(|(reason, count)| format!("{reason} {count}"))
            .collect();
        let _ = writeln!(
            out,
            "skipped: {}",
            if skipped.is_empty() {
                "none".to_owned()
            } else {
                skipped.join(", ")
            }
        );
        if !self.left_out.is_empty() {
            let read: Vec<String> = self
                .left_out
                .iter()
                .map(|(left_out, count)| {
                    format!(
                        "{} on {count} job{} ({})",
                        left_out.field,
                        if *count == 1 { "" } else { "s" },
                        left_out.reason
                    )
                })
                .collect();
            let _ = writeln!(
                out,
                "telemetry read but left out (the jobs are stored without it): {}",
                read.join("; ")
            );
        }
        if !self.problems.is_empty() {
            let _ = writeln!(out, "unparsable or refused {}:", self.problems.len());
            for problem in self.problems.iter().take(shown) {
                let _ = writeln!(out, "  {}: {}", problem.location, problem.reason);
            }
            if self.problems.len() > shown {
                let _ = writeln!(out, "  … and {} more", self.problems.len() - shown);
            }
        }
        out
    }
}

/// The batch's records validated, each with where it came from; or every problem of the
/// batch, unreadable input first.
pub fn validate(
    batch: &SourceBatch,
    rules: RecordRules,
) -> Result<Vec<(String, JobRecord)>, Vec<Rejection>> {
    let mut problems: Vec<Rejection> = batch
        .unparsable
        .iter()
        .map(|p| Rejection {
            location: p.location.clone(),
            reason: p.reason.clone(),
        })
        .collect();
    let mut valid = Vec::with_capacity(batch.records.len());
    for source in &batch.records {
        match JobRecord::parse(&source.value, "", rules) {
            Ok(record) => valid.push((source.location.clone(), record)),
            Err(violations) => {
                problems.extend(violations.into_vec().into_iter().map(|e| Rejection {
                    location: source.location.clone(),
                    reason: format!(
                        "job {}: {}: {}",
                        source.value["task_id"].as_str().unwrap_or("?"),
                        e.pointer.trim_start_matches('/'),
                        e.message
                    ),
                }))
            }
        }
    }
    if problems.is_empty() {
        Ok(valid)
    } else {
        Err(problems)
    }
}

/// Stores checked records (`submitted`, made of `valid`, which says where each came from)
/// in batches of [`BATCH_SIZE`]; a batch with a record that conflicts with a stored one is
/// left out whole and its conflicts reported.
pub(crate) async fn store_checked(
    pool: &PgPool,
    valid: &[(String, JobRecord)],
    submitted: &[Submitted],
    settings: &Settings,
    summary: &mut SourceSummary,
) -> anyhow::Result<()> {
    for chunk in submitted.chunks(BATCH_SIZE) {
        match ingest::store_batch(pool, chunk.to_vec(), settings).await {
            Ok(stored) => {
                summary.accepted += stored.accepted;
                summary.duplicates += stored.duplicates;
            }
            Err(IngestError::Conflicts(conflicts)) => {
                summary
                    .problems
                    .extend(conflicts.iter().map(|conflict| Rejection {
                        location: valid[conflict.position].0.clone(),
                        reason: format!(
                            "{}; nothing of its {} records was stored",
                            conflict.message(),
                            chunk.len()
                        ),
                    }));
            }
            Err(IngestError::Database(error)) => return Err(error.into()),
            Err(IngestError::Rating(error) | IngestError::IdleGpuAlerts(error)) => {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// Stores a batch in the local database, or nothing of it when any part is unreadable,
/// invalid or names a project that does not exist.
pub async fn store(
    pool: &PgPool,
    batch: SourceBatch,
    settings: &Settings,
) -> anyhow::Result<SourceSummary> {
    let mut summary = SourceSummary::of(&batch);
    let valid = match validate(&batch, settings.record_rules()) {
        Ok(valid) => valid,
        Err(problems) => {
            summary.problems = problems;
            return Ok(summary);
        }
    };
    let submitted: Vec<Submitted> = valid
        .iter()
        .enumerate()
        .map(|(position, (_, record))| Submitted {
            position,
            record: record.clone(),
        })
        .collect();
    let unknown: BTreeSet<usize> = ingest::unknown_projects(pool, &submitted)
        .await?
        .into_iter()
        .collect();
    if !unknown.is_empty() {
        summary.problems = unknown
            .iter()
            .map(|&position| {
                let (location, record) = &valid[position];
                Rejection {
                    location: location.clone(),
                    reason: format!(
                        "job {}: project `{}` does not exist; create it or map the account \
                         with --project-map",
                        record.key.task_id, record.key.project
                    ),
                }
            })
            .collect();
        return Ok(summary);
    }
    store_checked(pool, &valid, &submitted, settings, &mut summary).await?;
    // Fold the rollup rows the import appended, in case no `serve` is running to do it.
    store::rollups::compact(pool).await?;
    Ok(summary)
}
