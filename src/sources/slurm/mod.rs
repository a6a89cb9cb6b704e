//! Slurm's accounting as job records. `sacct --json` (data_parser v0.0.37 to v0.0.43) and
//! `sacct --parsable`/`--parsable2` text are read into [`SlurmJob`]s, one per allocation with
//! its steps' usage folded in; [`convert`] maps them to job-record inputs the same way for
//! both, as `docs/slurm.md` tables it.
//!
//! Pure: no files, processes or clock. What cannot be read is a [`Problem`] naming its line or
//! job id; a caller stores nothing of a batch that has one.

pub mod hostlist;
pub mod job;
pub mod json;
pub mod nodes;
pub mod telemetry;
pub mod text;
pub mod tres;

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use serde_json::{Map, Value, json};

use crate::domain::record::{MAX_NODES, format_time, label_value};
use crate::domain::values::ProjectId;
use crate::sources::batch::{LeftOut, Problem, SourceBatch, SourceRecord};

pub use self::job::{SlurmJob, State, parse_elapsed, parse_time};
use self::tres::{GpuTres, split_gpu_type};

/// Skip reasons, as the summary names them.
pub const NO_GPU: &str = "no GPU";
pub const NOT_FINISHED: &str = "not finished";
pub const NEVER_STARTED: &str = "never started";

/// The model of GPUs nobody named: shown as unrated until a contract names it.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Why a job's nodes are left out of its record.
pub const UNREADABLE_NODE_LIST: LeftOut = LeftOut {
    field: "nodes",
    reason: "a NodeList that is not a host list, or names more than 256 nodes",
};

/// How Slurm's names become the ledger's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    /// Every job in this project, whatever its account.
    pub project: Option<ProjectId>,
    /// Account → project.
    pub projects: BTreeMap<String, ProjectId>,
    /// Partition → GPU model, for GPUs accounted without a type.
    pub gpu_models: BTreeMap<String, String>,
}

impl Mapping {
    fn project_of(&self, job: &SlurmJob) -> Result<String, String> {
        if let Some(project) = &self.project {
            return Ok(project.as_str().to_owned());
        }
        let account = job
            .account
            .as_deref()
            .ok_or("the job has no account; give --project")?;
        if let Some(project) = self.projects.get(account) {
            return Ok(project.as_str().to_owned());
        }
        account_slug(account).ok_or_else(|| {
            format!("account `{account}` makes no project id; map it with --project-map")
        })
    }
}

/// An account as a project id: lowercase, every run of other characters one hyphen.
pub fn account_slug(account: &str) -> Option<String> {
    let mut slug = String::new();
    for c in account.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.chars().take(63).collect();
    let slug = slug.trim_end_matches('-').to_owned();
    ProjectId::parse(&slug).ok().map(|_| slug)
}

/// The GPU model and MIG profile of an allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuModel {
    pub model: String,
    pub mig_profile: Option<String>,
}

/// From the typed GPU entries: a MIG slice's parent where its type names one (a whole-GPU
/// type equal to that parent repeats it); several models are joined with `+`, so the record
/// shows as unrated rather than priced as one of them. Untyped GPUs take their partition's
/// model from the mapping, else [`UNKNOWN_MODEL`].
pub fn gpu_model(gpus: &GpuTres, partition: Option<&str>, mapping: &Mapping) -> GpuModel {
    let from_partition = || {
        partition
            .and_then(|p| mapping.gpu_models.get(p))
            .cloned()
            .unwrap_or_else(|| UNKNOWN_MODEL.to_owned())
    };
    let kinds: Vec<_> = gpus.typed.keys().map(|kind| split_gpu_type(kind)).collect();
    let mig_parents: BTreeSet<&str> = kinds
        .iter()
        .filter(|k| k.mig_profile.is_some())
        .filter_map(|k| k.parent.as_deref())
        .collect();
    let mut models = BTreeSet::new();
    let mut profiles = BTreeSet::new();
    for kind in &kinds {
        match (&kind.parent, &kind.mig_profile) {
            (parent, Some(profile)) => {
                profiles.insert(profile.as_str());
                models.insert(parent.clone().unwrap_or_else(from_partition));
            }
            (Some(parent), None) if !mig_parents.contains(parent.as_str()) => {
                models.insert(parent.clone());
            }
            _ => {}
        }
    }
    if models.is_empty() {
        models.insert(from_partition());
    }
    GpuModel {
        model: models.into_iter().collect::<Vec<_>>().join("+"),
        mig_profile: (!profiles.is_empty())
            .then(|| profiles.into_iter().collect::<Vec<_>>().join("+")),
    }
}

/// The two shapes of sacct output.
#[derive(Debug, Clone)]
pub enum Format {
    /// `sacct --json`.
    Json,
    /// `sacct --parsable` / `--parsable2` with a header.
    Text(text::TextOptions),
}

/// Reads one sacct output named `name` and converts its jobs.
pub fn batch(format: &Format, name: &str, input: &str, mapping: &Mapping) -> SourceBatch {
    let (jobs, problems, has_account) = match format {
        Format::Json => {
            let (jobs, problems) = json::read(name, input);
            (jobs, problems, true)
        }
        Format::Text(options) => {
            let read = text::read(name, input, options);
            (read.jobs, read.problems, read.has_account)
        }
    };
    if !has_account && mapping.project.is_none() && !jobs.is_empty() {
        let mut batch = SourceBatch {
            jobs_read: jobs.len(),
            unparsable: problems,
            ..SourceBatch::default()
        };
        batch.unparsable.insert(
            0,
            Problem::new(name, "the output has no Account field: give --project"),
        );
        return batch;
    }
    let mut batch = convert(jobs, mapping);
    batch.unparsable.splice(0..0, problems);
    batch
}

/// Maps read jobs to job-record inputs: finished jobs with GPUs become records, the others are
/// counted by reason. A requeued job's runs are its attempts: `Restarts + 1` where every run
/// of it reports Restarts, else their order of submission.
pub fn convert(jobs: Vec<SlurmJob>, mapping: &Mapping) -> SourceBatch {
    let attempts = attempts(&jobs);
    convert_as(jobs, &attempts, mapping)
}

/// [`convert`] with each job's attempt given.
pub fn convert_as(jobs: Vec<SlurmJob>, attempts: &[u32], mapping: &Mapping) -> SourceBatch {
    let mut batch = SourceBatch {
        jobs_read: jobs.len(),
        ..SourceBatch::default()
    };
    let attempts = attempts.iter().copied();
    for (job, attempt) in jobs.into_iter().zip(attempts) {
        match record_of(&job, attempt, mapping, &mut batch) {
            Ok(Some(value)) => batch.records.push(SourceRecord {
                location: job.location,
                value,
            }),
            Ok(None) => {}
            Err(reason) => batch.unparsable.push(Problem::new(
                job.location,
                format!("job {}: {reason}", job.job_id),
            )),
        }
    }
    batch
}

fn attempts(jobs: &[SlurmJob]) -> Vec<u32> {
    let mut runs: BTreeMap<&str, Vec<Run>> = BTreeMap::new();
    for (index, job) in jobs.iter().enumerate() {
        runs.entry(&job.job_id)
            .or_default()
            .push(Run::of(job, index));
    }
    let mut attempts = vec![1; jobs.len()];
    for job_runs in runs.into_values() {
        for (index, attempt) in attempts_of(job_runs) {
            attempts[index] = attempt;
        }
    }
    attempts
}

/// What numbers one run of a job among its runs: its restarts, submission, start and
/// position in what was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub restarts: Option<u32>,
    pub submit: Option<chrono::DateTime<chrono::Utc>>,
    pub start: Option<chrono::DateTime<chrono::Utc>>,
    pub index: usize,
}

impl Run {
    pub fn of(job: &SlurmJob, index: usize) -> Self {
        Self {
            restarts: job.restarts,
            submit: job.submit,
            start: job.start,
            index,
        }
    }
}

/// The attempt of each run of one job (by the runs' `index`): `Restarts + 1` where every
/// run reports a distinct Restarts, else their order of submission.
pub fn attempts_of(mut runs: Vec<Run>) -> Vec<(usize, u32)> {
    let mut distinct: Vec<u32> = runs.iter().filter_map(|run| run.restarts).collect();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() == runs.len() {
        runs.iter()
            .map(|run| (run.index, run.restarts.unwrap_or(0).saturating_add(1)))
            .collect()
    } else {
        runs.sort_by_key(|run| (run.submit, run.start, run.index));
        runs.iter()
            .enumerate()
            .map(|(order, run)| (run.index, order as u32 + 1))
            .collect()
    }
}

fn record_of(
    job: &SlurmJob,
    attempt: u32,
    mapping: &Mapping,
    batch: &mut SourceBatch,
) -> Result<Option<Value>, String> {
    let outcome = match job.state {
        State::NotFinished => {
            batch.skip(NOT_FINISHED);
            return Ok(None);
        }
        State::Finished(outcome) => outcome,
    };
    let Some(started) = job.start else {
        batch.skip(NEVER_STARTED);
        return Ok(None);
    };
    let count = job.gpus.count();
    if count == 0 {
        batch.skip(NO_GPU);
        return Ok(None);
    }
    let ended = job.end.ok_or("the job is finished but has no End time")?;
    let project = mapping.project_of(job)?;
    let model = gpu_model(&job.gpus, job.partition.as_deref(), mapping);
    let (telemetry, left_out) = telemetry::telemetry(
        &model.model,
        model.mig_profile.as_deref(),
        count,
        &job.usage,
    );
    for left_out in left_out {
        batch.leave_out(left_out);
    }
    let mut record = json!({
        "project": project,
        "task_id": job.job_id,
        "attempt": attempt,
        "gpu_model": model.model,
        "gpu_count": count.to_string(),
        "started_at": format_time(started),
        "ended_at": format_time(ended),
        "outcome": outcome.as_str(),
    });
    let queued = [job.eligible, job.submit]
        .into_iter()
        .flatten()
        .find(|queued| *queued <= started);
    if let Some(queued) = queued {
        record["queued_at"] = json!(format_time(queued));
    }
    // A suspended job gives its GPUs back until it resumes.
    let span = (ended - started).num_seconds();
    if let Some(suspended) = job.suspended_seconds
        && (1..=span).contains(&suspended)
    {
        record["gpu_seconds_held"] =
            json!((Decimal::from(count) * Decimal::from(span - suspended)).to_string());
    }
    if let Some(util) = telemetry.gpu_util {
        record["gpu_util"] = json!(util.to_string());
    }
    if let Some(peak) = telemetry.memory_peak_gib {
        record["memory_peak_gib"] = json!(peak.to_string());
    }
    if let Some(profile) = telemetry.mig_profile {
        record["mig_profile"] = json!(profile);
    }
    match telemetry::energy_joules(job.energy, model.mig_profile.is_some()) {
        Ok(Some(joules)) => record["energy_joules"] = json!(joules.to_string()),
        Ok(None) => {}
        Err(reason) => batch.leave_out(reason),
    }
    match job
        .nodes
        .as_deref()
        .map(|list| hostlist::expand(list, MAX_NODES))
        .transpose()
    {
        Ok(Some(nodes)) if !nodes.is_empty() => record["nodes"] = json!(nodes),
        Ok(_) => {}
        Err(_) => batch.leave_out(UNREADABLE_NODE_LIST),
    }
    let labels = labels(job);
    if !labels.is_empty() {
        record["labels"] = Value::Object(labels);
    }
    Ok(Some(record))
}

fn labels(job: &SlurmJob) -> Map<String, Value> {
    [
        ("user", &job.user),
        ("partition", &job.partition),
        ("qos", &job.qos),
        ("cluster", &job.cluster),
        ("job_name", &job.name),
    ]
    .into_iter()
    .filter_map(|(key, value)| {
        let value = label_value(value.as_deref()?)?;
        Some((key.to_owned(), Value::String(value)))
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use self::tres::{Energy, GpuUsage};
    use super::*;
    use crate::domain::rating::Outcome;
    use crate::domain::record::{JobRecord, RecordRules};
    use chrono::{DateTime, Utc};

    fn utc(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    fn job(id: &str) -> SlurmJob {
        let mut gpus = GpuTres::default();
        gpus.add("gpu", 2);
        SlurmJob {
            location: format!("test: job {id}"),
            job_id: id.to_owned(),
            account: Some("Vision_GPU".to_owned()),
            user: Some("ada".to_owned()),
            partition: Some("gpu".to_owned()),
            qos: Some("normal".to_owned()),
            cluster: Some("c1".to_owned()),
            name: Some("train".to_owned()),
            state: State::Finished(Outcome::Completed),
            submit: Some(utc("2024-05-01T09:00:00Z")),
            eligible: Some(utc("2024-05-01T09:10:00Z")),
            start: Some(utc("2024-05-01T10:00:00Z")),
            end: Some(utc("2024-05-01T11:00:00Z")),
            suspended_seconds: Some(0),
            restarts: None,
            gpus,
            usage: GpuUsage::default(),
            energy: Energy::Unmeasured,
            nodes: Some("gpu[01-02]".to_owned()),
        }
    }

    #[test]
    fn a_job_becomes_a_record_with_its_labels_and_queue_time() {
        let batch = convert(vec![job("7")], &Mapping::default());
        assert_eq!(batch.unparsable, vec![]);
        let record = &batch.records[0].value;
        assert_eq!(record["project"], "vision-gpu");
        assert_eq!(record["task_id"], "7");
        assert_eq!(record["attempt"], 1);
        assert_eq!(record["gpu_model"], "unknown");
        assert_eq!(record["gpu_count"], "2");
        assert_eq!(record["queued_at"], "2024-05-01T09:10:00Z");
        assert_eq!(record["outcome"], "completed");
        assert_eq!(record.get("gpu_seconds_held"), None);
        assert_eq!(
            record["labels"],
            json!({"user": "ada", "partition": "gpu", "qos": "normal", "cluster": "c1", "job_name": "train"})
        );
        assert_eq!(record["nodes"], json!(["gpu01", "gpu02"]));
        let mut unreadable = job("8");
        unreadable.nodes = Some("gpu[01-".to_owned());
        let batch = convert(vec![unreadable], &Mapping::default());
        assert_eq!(batch.records[0].value.get("nodes"), None);
        assert_eq!(batch.left_out, [(UNREADABLE_NODE_LIST, 1)].into());
    }

    #[test]
    fn skipped_jobs_are_counted_by_reason() {
        let mut running = job("1");
        running.state = State::NotFinished;
        let mut cpu_only = job("2");
        cpu_only.gpus = GpuTres::default();
        let mut cancelled_pending = job("3");
        cancelled_pending.state = State::Finished(Outcome::Cancelled);
        cancelled_pending.start = None;
        let batch = convert(
            vec![running, cpu_only, cancelled_pending],
            &Mapping::default(),
        );
        assert_eq!(batch.jobs_read, 3);
        assert!(batch.records.is_empty());
        assert_eq!(batch.skipped[NOT_FINISHED], 1);
        assert_eq!(batch.skipped[NO_GPU], 1);
        assert_eq!(batch.skipped[NEVER_STARTED], 1);
    }

    #[test]
    fn requeued_runs_are_attempts_by_restarts_or_by_submission() {
        let mut first = job("9");
        first.state = State::Finished(Outcome::Preempted);
        first.restarts = Some(0);
        let mut second = job("9");
        second.restarts = Some(1);
        second.submit = Some(utc("2024-05-01T09:30:00Z"));
        let attempts = |jobs: Vec<SlurmJob>| -> Vec<Value> {
            let batch = convert(jobs, &Mapping::default());
            batch
                .records
                .iter()
                .map(|r| r.value["attempt"].clone())
                .collect()
        };
        assert_eq!(
            attempts(vec![second.clone(), first.clone()]),
            vec![json!(2), json!(1)]
        );
        first.restarts = None;
        second.restarts = None;
        assert_eq!(attempts(vec![second, first]), vec![json!(2), json!(1)]);
    }

    #[test]
    fn gpu_models_come_from_types_then_partitions_never_guessed() {
        let mapping = Mapping {
            gpu_models: [("gpu".to_owned(), "A100".to_owned())].into(),
            ..Mapping::default()
        };
        let model = |entries: &[(&str, u64)], partition: &str| {
            let mut gpus = GpuTres::default();
            for (name, count) in entries {
                gpus.add(name, *count);
            }
            gpu_model(&gpus, Some(partition), &mapping)
        };
        assert_eq!(model(&[("gpu", 2), ("gpu:h100", 2)], "gpu").model, "h100");
        assert_eq!(model(&[("gpu", 2)], "gpu").model, "A100");
        assert_eq!(model(&[("gpu", 2)], "other").model, "unknown");
        let mig = model(&[("gpu", 1), ("gpu:a100", 1), ("gpu:a100_3g.20gb", 1)], "x");
        assert_eq!(mig.model, "a100");
        assert_eq!(mig.mig_profile.as_deref(), Some("3g.20gb"));
        let bare = model(&[("gpu:3g.20gb", 1)], "gpu");
        assert_eq!(
            (bare.model.as_str(), bare.mig_profile.as_deref()),
            ("A100", Some("3g.20gb"))
        );
        assert_eq!(
            model(&[("gpu:a100", 1), ("gpu:v100", 1)], "x").model,
            "a100+v100"
        );
    }

    #[test]
    fn projects_come_from_the_mapping_or_the_account() {
        let mut mapping = Mapping::default();
        mapping
            .projects
            .insert("Vision_GPU".to_owned(), ProjectId::parse("vision").unwrap());
        let batch = convert(vec![job("1")], &mapping);
        assert_eq!(batch.records[0].value["project"], "vision");
        mapping.project = Some(ProjectId::parse("hpc").unwrap());
        let batch = convert(vec![job("1")], &mapping);
        assert_eq!(batch.records[0].value["project"], "hpc");
        let mut nameless = job("2");
        nameless.account = Some("__".to_owned());
        let batch = convert(vec![nameless], &Mapping::default());
        assert!(batch.unparsable[0].reason.contains("job 2: account `__`"));
        assert_eq!(
            account_slug("rrg-bengioy-ad_gpu").as_deref(),
            Some("rrg-bengioy-ad-gpu")
        );
    }

    #[test]
    fn telemetry_goes_into_the_record_and_odd_figures_are_counted_not_fatal() {
        let mut sliced = job("8");
        sliced.gpus = GpuTres::default();
        sliced.gpus.add("gpu", 2);
        sliced.gpus.add("gpu:a100_3g.20gb", 2);
        sliced.usage = GpuUsage {
            gpu_util: Some(Decimal::from(87)),
            memory_bytes: Some(Decimal::from(4u64 << 30)),
        };
        let mut summed = job("9");
        summed.gpus.add("gpu:h100", 2);
        summed.usage = GpuUsage {
            gpu_util: Some(Decimal::from(196)),
            memory_bytes: Some(Decimal::from(150u64 << 30)),
        };
        let mut odd = job("10");
        odd.gpus = GpuTres::default();
        odd.gpus.add("gpu:a100_1c.3g.20gb", 1);
        odd.usage.gpu_util = Some(Decimal::from(250));
        let batch = convert(vec![sliced, summed, odd], &Mapping::default());
        assert_eq!(batch.unparsable, vec![]);
        assert_eq!(batch.records.len(), 3);
        let sliced = &batch.records[0].value;
        assert_eq!(sliced["gpu_model"], "a100");
        assert_eq!(sliced["mig_profile"], "3g.20gb");
        assert_eq!(sliced["gpu_util"], "0.87");
        assert_eq!(sliced["memory_peak_gib"], "4");
        // 196 % and 150 GiB on two 80 GiB H100s are sums: halved.
        let summed = &batch.records[1].value;
        assert_eq!(summed["gpu_util"], "0.98");
        assert_eq!(summed["memory_peak_gib"], "75");
        assert_eq!(summed.get("mig_profile"), None);
        let odd = &batch.records[2].value;
        assert_eq!(odd["gpu_model"], "a100");
        assert_eq!(odd.get("mig_profile"), None);
        assert_eq!(odd.get("gpu_util"), None);
        assert_eq!(
            batch.left_out,
            [
                (telemetry::MIG_UNKNOWN_PROFILE, 1),
                (telemetry::UTIL_ABOVE_FULL, 1)
            ]
            .into()
        );
        // Every record passes the ledger's validation, with the slice's memory as total.
        let rules = RecordRules {
            now: utc("2024-06-01T00:00:00Z"),
            max_duration: RecordRules::DEFAULT_MAX_DURATION,
        };
        let parsed: Vec<JobRecord> = batch
            .records
            .iter()
            .map(|r| JobRecord::parse(&r.value, "", rules).unwrap())
            .collect();
        assert_eq!(
            parsed[0].telemetry.memory_total_gib,
            Some(Decimal::from(20))
        );
        assert_eq!(
            parsed[0].telemetry.mig("a100").map(|p| p.compute_share()),
            Some(crate::domain::gpu::ComputeShare { slices: 3 })
        );
    }

    #[test]
    fn energy_goes_into_the_record_except_on_a_slice_or_rounded() {
        let mut whole = job("11");
        whole.energy = Energy::Joules(Decimal::from(5_400_123));
        let mut slice = job("12");
        slice.gpus = GpuTres::default();
        slice.gpus.add("gpu:a100_3g.20gb", 1);
        slice.energy = Energy::Joules(Decimal::from(900_000));
        let mut rounded = job("13");
        rounded.energy = Energy::Rounded;
        let unmeasured = job("14");
        let batch = convert(vec![whole, slice, rounded, unmeasured], &Mapping::default());
        assert_eq!(batch.unparsable, vec![]);
        let energy: Vec<Option<&Value>> = batch
            .records
            .iter()
            .map(|r| r.value.get("energy_joules"))
            .collect();
        assert_eq!(energy, vec![Some(&json!("5400123")), None, None, None]);
        assert_eq!(
            batch.left_out,
            [
                (telemetry::ENERGY_OF_MIG_SLICE, 1),
                (telemetry::ENERGY_ROUNDED, 1)
            ]
            .into()
        );
    }

    #[test]
    fn a_real_jobs_accounted_energy_becomes_its_records() {
        let real = include_str!("../../../tests/fixtures/slurm/v0.0.43/fromage_1716595200.json");
        let records = |text: &str| {
            let batch = batch(&Format::Json, "fromage.json", text, &Mapping::default());
            assert_eq!(batch.unparsable, vec![]);
            batch.records
        };
        assert!(
            records(real)
                .iter()
                .all(|r| r.value.get("energy_joules").is_none()),
            "the fixture accounts no energy"
        );
        // Job 6 and job 37 (two V100s) with the energy TRES a measuring plugin accounts.
        let mut document: Value = serde_json::from_str(real).unwrap();
        for (index, joules) in [(0, 1_874_400), (10, 0)] {
            document["jobs"][index]["tres"]["allocated"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "energy", "name": "", "id": 3, "count": joules}));
        }
        assert_eq!(document["jobs"][10]["job_id"], 37);
        let records = records(&document.to_string());
        let energy = |task: &str| {
            records
                .iter()
                .find(|r| r.value["task_id"] == task)
                .and_then(|r| r.value.get("energy_joules").cloned())
        };
        assert_eq!(energy("6"), Some(json!("1874400")));
        assert_eq!(energy("37"), None, "0 J is nothing measured");
    }

    #[test]
    fn suspended_time_is_not_held() {
        let mut suspended = job("5");
        suspended.suspended_seconds = Some(1800);
        let batch = convert(vec![suspended], &Mapping::default());
        assert_eq!(
            batch.records[0].value["gpu_seconds_held"], "3600",
            "2 GPUs × 30 minutes"
        );
    }
}
