//! What a scheduler source hands on (a Slurm file, a collector's window): job-record inputs in
//! the shape `POST /v1/job-records` takes, each with where it came from, how many jobs it
//! skipped and why, what it could not read, and the measured figures it read but left out of
//! the records, and why.

use std::collections::BTreeMap;

use serde_json::Value;

/// One job-record input and where it came from (`file:12`, `file: job 4711`).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceRecord {
    pub location: String,
    pub value: Value,
}

/// Something a source could not read, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub location: String,
    pub reason: String,
}

impl Problem {
    pub fn new(location: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            location: location.into(),
            reason: reason.into(),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SourceBatch {
    /// Jobs (allocations) the source read, whatever became of them.
    pub jobs_read: usize,
    pub records: Vec<SourceRecord>,
    /// Jobs that are not records, by reason ("no GPU", "not finished", ...).
    pub skipped: BTreeMap<&'static str, usize>,
    /// Input that could not be read; one of these keeps the whole batch out of the ledger.
    pub unparsable: Vec<Problem>,
    /// Figures read but left out of the records (an implausible value, a MIG profile the
    /// catalogue does not know), by field and reason, with how many jobs carried them. The
    /// job itself is stored without the figure.
    pub left_out: BTreeMap<LeftOut, usize>,
}

/// A figure of a job left out of its record: the record field it was read for, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeftOut {
    pub field: &'static str,
    pub reason: &'static str,
}

impl SourceBatch {
    pub fn skip(&mut self, reason: &'static str) {
        *self.skipped.entry(reason).or_default() += 1;
    }

    pub fn leave_out(&mut self, left_out: LeftOut) {
        *self.left_out.entry(left_out).or_default() += 1;
    }

    /// Adds another batch's jobs, records and counts to this one.
    pub fn absorb(&mut self, other: SourceBatch) {
        self.jobs_read += other.jobs_read;
        self.records.extend(other.records);
        for (reason, count) in other.skipped {
            *self.skipped.entry(reason).or_default() += count;
        }
        self.unparsable.extend(other.unparsable);
        for (left_out, count) in other.left_out {
            *self.left_out.entry(left_out).or_default() += count;
        }
    }
}
