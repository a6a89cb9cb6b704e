//! Kubernetes GPU pods as job records, from what kube-state-metrics and dcgm-exporter put in
//! Prometheus: one record per pod that finished in a window, its task the Job that owns it (or
//! a label), its attempts the task's pods in order of creation, its telemetry what DCGM
//! measured of its GPUs over its life. `docs/kubernetes.md` tables the mapping.
//!
//! Pure: [`promql`] builds the questions and reads the answers; the collector asks them.
//! A pod is decided only once its data has settled, so that every run that sees it again
//! makes exactly the same record and overlapping windows store it once.

pub mod nodes;
pub mod promql;
pub mod resources;
pub mod telemetry;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde_json::{Map, Value, json};

use self::promql::{PodFact, Sample, TaskSource};
use self::resources::GpuRequest;
use self::telemetry::{Dcgm, SHARED_GPU};
use crate::domain::gpu;
use crate::domain::rating::Outcome;
use crate::domain::record::{format_time, label_value};
use crate::domain::values::ProjectId;
use crate::sources::batch::{LeftOut, Problem, SourceBatch, SourceRecord};
use crate::sources::slurm::{account_slug, telemetry::mig_profile};

/// Skip reasons, as the summary names them.
pub const NO_GPU: &str = "no GPU";
pub const STILL_RUNNING: &str = "still running";
pub const MISSING_START: &str = "missing start time";
pub const MISSING_END: &str = "missing end time";

/// The model of GPUs nothing named: shown as unrated until a contract names it.
pub const UNKNOWN_MODEL: &str = "unknown";

/// Why a pod's MIG profile or share is left out of its record.
pub const SEVERAL_KINDS: LeftOut = LeftOut {
    field: "mig_profile",
    reason: "several MIG profiles, or whole GPUs beside slices, in one pod",
};
pub const SHARE_OF_UNKNOWN_MODEL: LeftOut = LeftOut {
    field: "gpu_count",
    reason: "a HAMi memory share of a GPU model the catalogue does not know: counted as whole GPUs",
};

/// Pod status reasons that mean the pod was pushed off its node.
const PREEMPTING: [&str; 5] = [
    "Evicted",
    "PreemptionByScheduler",
    "NodeLost",
    "Shutdown",
    "TerminationByKubelet",
];

/// A pod: its namespace and name, and its UID where kube-state-metrics exports it (empty
/// otherwise).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodKey {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl PodKey {
    fn of(sample: &Sample) -> Option<Self> {
        Some(Self {
            namespace: sample.label("namespace")?.to_owned(),
            name: sample.label("pod")?.to_owned(),
            uid: sample.label("uid").unwrap_or_default().to_owned(),
        })
    }

    pub fn location(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

impl Phase {
    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "Pending" => Some(Phase::Pending),
            "Running" => Some(Phase::Running),
            "Succeeded" => Some(Phase::Succeeded),
            "Failed" => Some(Phase::Failed),
            "Unknown" => Some(Phase::Unknown),
            _ => None,
        }
    }

    fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }
}

/// What kube-state-metrics said of one pod over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    pub key: PodKey,
    pub created: Option<DateTime<Utc>>,
    pub started: Option<DateTime<Utc>>,
    pub completed: Option<DateTime<Utc>>,
    /// The phase of its last sample.
    pub phase: Option<Phase>,
    pub last_seen: Option<DateTime<Utc>>,
    pub last_running: Option<DateTime<Utc>>,
    /// The Job that owns it.
    pub job: Option<String>,
    /// Its labels as kube-state-metrics names them (`label_app_kubernetes_io_name`).
    pub labels: BTreeMap<String, String>,
    pub request: GpuRequest,
    pub restarts: u64,
    pub status_reasons: BTreeSet<String>,
    /// Why its containers stopped, now or last time.
    pub terminated_reasons: BTreeSet<String>,
    pub node: Option<String>,
}

impl Pod {
    fn new(key: PodKey) -> Self {
        Self {
            key,
            created: None,
            started: None,
            completed: None,
            phase: None,
            last_seen: None,
            last_running: None,
            job: None,
            labels: BTreeMap::new(),
            request: GpuRequest::default(),
            restarts: 0,
            status_reasons: BTreeSet::new(),
            terminated_reasons: BTreeSet::new(),
            node: None,
        }
    }
}

/// The pods of a window (or a page of it) as the answers of its pod queries arrive, joined by
/// namespace, name and UID: each answer is folded in and dropped, so no more than one is held
/// at a time.
#[derive(Debug, Default)]
pub struct PodTable {
    pods: BTreeMap<PodKey, Pod>,
    limits: BTreeMap<PodKey, Vec<(String, Decimal)>>,
    requested: BTreeMap<PodKey, BTreeSet<String>>,
}

impl PodTable {
    /// Folds in the answer of one pod query.
    pub fn add(&mut self, fact: PodFact, samples: Vec<Sample>) -> Result<(), String> {
        let Self {
            pods,
            limits,
            requested,
        } = self;
        for sample in samples {
            let key = PodKey::of(&sample).ok_or_else(|| {
                format!("a series answered for {fact:?} names no namespace and pod")
            })?;
            let time = || {
                sample.time().ok_or_else(|| {
                    format!(
                        "{}: `{}` is not a time ({fact:?})",
                        key.location(),
                        sample.value
                    )
                })
            };
            let number = || {
                sample.decimal().ok_or_else(|| {
                    format!(
                        "{}: `{}` is not a number ({fact:?})",
                        key.location(),
                        sample.value
                    )
                })
            };
            let pod = pods
                .entry(key.clone())
                .or_insert_with(|| Pod::new(key.clone()));
            match fact {
                PodFact::Created => pod.created = Some(time()?),
                PodFact::Started => pod.started = Some(time()?).filter(|t| t.timestamp() > 0),
                PodFact::Completed => pod.completed = Some(time()?).filter(|t| t.timestamp() > 0),
                PodFact::Phase => pod.phase = sample.label("phase").and_then(Phase::parse),
                PodFact::LastSeen => pod.last_seen = Some(time()?),
                PodFact::LastRunning => pod.last_running = Some(time()?),
                PodFact::Owner => {
                    if sample.label("owner_kind") == Some("Job") {
                        pod.job = sample.label("owner_name").map(str::to_owned);
                    }
                }
                PodFact::Labels => pod.labels.extend(
                    sample
                        .labels
                        .iter()
                        .filter(|(name, value)| name.starts_with("label_") && !value.is_empty())
                        .map(|(name, value)| (name.clone(), value.clone())),
                ),
                PodFact::Requests => {
                    let resource = sample.label("resource").unwrap_or_default().to_owned();
                    pod.request.add(&resource, number()?);
                    requested.entry(key.clone()).or_default().insert(resource);
                }
                PodFact::Limits => {
                    let resource = sample.label("resource").unwrap_or_default().to_owned();
                    let amount = number()?;
                    limits
                        .entry(key.clone())
                        .or_default()
                        .push((resource, amount));
                }
                PodFact::Restarts => {
                    pod.restarts = u64::try_from(number()?.trunc()).unwrap_or(0);
                }
                PodFact::StatusReason => {
                    pod.status_reasons
                        .extend(sample.label("reason").map(str::to_owned));
                }
                PodFact::TerminatedReason | PodFact::LastTerminatedReason => {
                    pod.terminated_reasons
                        .extend(sample.label("reason").map(str::to_owned));
                }
                PodFact::Node => pod.node = sample.label("node").map(str::to_owned),
            }
        }
        Ok(())
    }

    /// The pods, once every answer is in.
    pub fn finish(self) -> Vec<Pod> {
        let Self {
            mut pods,
            limits,
            requested,
        } = self;
        // Kubernetes copies an extended resource's limit into its request when only the
        // limit is given; a limit counts only where no request was read.
        for (key, resources) in limits {
            let already = requested.get(&key);
            if let Some(pod) = pods.get_mut(&key) {
                for (resource, amount) in resources {
                    if !already.is_some_and(|names| names.contains(&resource)) {
                        pod.request.add(&resource, amount);
                    }
                }
            }
        }
        pods.into_values().collect()
    }
}

/// The Prometheus label kube-state-metrics gives a Kubernetes label (`label_` and the key
/// with every character other than a letter, digit or `_` as `_`).
pub fn ksm_label(key: &str) -> String {
    let sanitized: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("label_{sanitized}")
}

/// How pods become tasks, projects and labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapping {
    /// The pod label naming the project; without it (or on pods without the label), the
    /// namespace.
    pub project_label: Option<String>,
    /// Namespace or label value → project.
    pub projects: BTreeMap<String, ProjectId>,
    /// The pod label naming the task; without it (or on pods without the label), the Job
    /// that owns the pod, else the pod's name.
    pub task_label: Option<String>,
    /// Pod labels copied into the record's labels.
    pub labels: Vec<String>,
    /// GPU model as DCGM or the node names it → as contracts name it.
    pub gpu_models: BTreeMap<String, String>,
}

impl Mapping {
    fn project_of(&self, pod: &Pod) -> Result<String, String> {
        let source = self
            .project_label
            .as_deref()
            .and_then(|key| pod.labels.get(&ksm_label(key)))
            .unwrap_or(&pod.key.namespace);
        if let Some(project) = self.projects.get(source) {
            return Ok(project.as_str().to_owned());
        }
        account_slug(source).ok_or_else(|| {
            format!("`{source}` makes no project id; map it in the project map file")
        })
    }

    fn task_of(&self, pod: &Pod) -> Task {
        let labelled = self.task_label.as_deref().and_then(|key| {
            let label = ksm_label(key);
            pod.labels
                .get(&label)
                .map(|value| (TaskSource::Label(label), value.clone()))
        });
        let (source, name) = labelled
            .or_else(|| pod.job.clone().map(|job| (TaskSource::Job, job)))
            .unwrap_or_else(|| (TaskSource::PodName, pod.key.name.clone()));
        Task {
            source,
            namespace: pod.key.namespace.clone(),
            name,
        }
    }

    pub fn model_name(&self, raw: &str) -> String {
        self.gpu_models
            .get(raw)
            .cloned()
            .unwrap_or_else(|| raw.to_owned())
    }
}

/// Reads a project map file: `NAME=PROJECT` lines (a namespace or a label value, and the
/// project its pods belong to); blank lines and lines starting with `#` are skipped.
pub fn parse_project_map(text: &str) -> Result<BTreeMap<String, ProjectId>, String> {
    let mut projects = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, project) = line
            .split_once('=')
            .map(|(name, project)| (name.trim(), project.trim()))
            .filter(|(name, project)| !name.is_empty() && !project.is_empty())
            .ok_or_else(|| format!("line {}: `{line}` is not NAME=PROJECT", number + 1))?;
        let project =
            ProjectId::parse(project).map_err(|error| format!("line {}: {error}", number + 1))?;
        projects.insert(name.to_owned(), project);
    }
    Ok(projects)
}

/// A pod's task: where its name comes from, and the name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Task {
    pub source: TaskSource,
    pub namespace: String,
    pub name: String,
}

/// Which pods a run decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Horizon {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub now: DateTime<Utc>,
    /// How long after a pod ended (or was last seen) its data counts as complete; also how
    /// long a pod that stopped being reported must stay unseen to count as gone.
    pub settle: TimeDelta,
    /// When any pod of the window was last reported, where the pods planned are only a page
    /// of them; `None`: the latest of theirs.
    pub reported_until: Option<DateTime<Utc>>,
}

/// A pod that finished in the window with GPUs: it becomes a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub pod: Pod,
    pub started: DateTime<Utc>,
    pub ended: DateTime<Utc>,
    pub outcome: Outcome,
    pub task: Task,
}

/// The pods of a window sorted out: those to make records of, and the counts of the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub batch: SourceBatch,
    pub candidates: Vec<Candidate>,
}

/// Decides each pod: ended in the window (a candidate, unless it had no GPU or never
/// started), still running, or outside the window (not counted at all).
///
/// A pod ends at its completion time, else when it was last seen running. One that stopped
/// being reported without finishing (deleted, its node lost) counts as gone only once other
/// pods were reported `settle` after its last sample; until then, and until `settle` has
/// passed since its end, it is still running, and a later window decides it.
pub fn plan(pods: Vec<Pod>, horizon: &Horizon, mapping: &Mapping) -> Plan {
    let mut plan = Plan::default();
    let reported_until = horizon
        .reported_until
        .or_else(|| pods.iter().filter_map(|pod| pod.last_seen).max());
    let decided_until = horizon.until.min(horizon.now - horizon.settle);
    for pod in pods {
        let finished = pod.phase.is_some_and(Phase::is_final);
        let gone = !finished
            && pod
                .last_seen
                .zip(reported_until)
                .is_some_and(|(last, reported)| last <= reported - horizon.settle);
        let ended = match (finished, gone) {
            (true, _) => Some(pod.completed.or(pod.last_running)),
            (false, true) => Some(pod.last_running),
            (false, false) => None,
        };
        let ended = match ended {
            // Ended before the window: an earlier window's.
            Some(Some(ended)) if ended <= horizon.since => continue,
            Some(None) if pod.last_seen.is_some_and(|last| last <= horizon.since) => continue,
            ended => ended,
        };
        plan.batch.jobs_read += 1;
        if pod.request.is_empty() {
            plan.batch.skip(NO_GPU);
            continue;
        }
        let ended = match ended {
            Some(Some(ended)) if ended <= decided_until => ended,
            Some(Some(_)) | None => {
                plan.batch.skip(STILL_RUNNING);
                continue;
            }
            Some(None) if pod.started.is_none() => {
                plan.batch.skip(MISSING_START);
                continue;
            }
            Some(None) => {
                plan.batch.skip(MISSING_END);
                continue;
            }
        };
        let Some(started) = pod.started else {
            plan.batch.skip(MISSING_START);
            continue;
        };
        let outcome = outcome(&pod);
        let task = mapping.task_of(&pod);
        plan.candidates.push(Candidate {
            ended: ended.max(started),
            started,
            outcome,
            task,
            pod,
        });
    }
    plan
}

/// Succeeded is completed; pushed off its node (evicted, preempted, node lost) is preempted;
/// Failed is failed; gone without finishing is failed when a container had failed, else
/// cancelled (deleted).
fn outcome(pod: &Pod) -> Outcome {
    if pod.phase == Some(Phase::Succeeded) {
        Outcome::Completed
    } else if pod
        .status_reasons
        .iter()
        .any(|reason| PREEMPTING.contains(&reason.as_str()))
    {
        Outcome::Preempted
    } else if pod.phase == Some(Phase::Failed)
        || pod
            .terminated_reasons
            .iter()
            .any(|reason| reason != "Completed")
    {
        Outcome::Failed
    } else {
        Outcome::Cancelled
    }
}

/// The pods of each task (source, namespace, name), by creation time.
type TaskPods<'a> = BTreeMap<(&'a TaskSource, &'a str, &'a str), BTreeSet<(DateTime<Utc>, PodKey)>>;

/// The attempt of each candidate: its place among the pods of its task, by creation time
/// (then name), counting every pod of the task Prometheus saw, finished or not. `members`
/// holds, per source, the answer of [`promql::task_pods`].
pub fn attempts(
    candidates: &[Candidate],
    members: &BTreeMap<TaskSource, Vec<Sample>>,
) -> Result<Vec<u32>, String> {
    let mut tasks: TaskPods = BTreeMap::new();
    for (source, samples) in members {
        for sample in samples {
            let (Some(key), Some(task)) = (PodKey::of(sample), sample.label("task")) else {
                return Err(
                    "a series of the task answer names no namespace, pod or task".to_owned(),
                );
            };
            let created = sample
                .time()
                .ok_or_else(|| format!("{}: `{}` is not a time", key.location(), sample.value))?;
            let namespace = sample.label("namespace").unwrap_or_default();
            tasks
                .entry((source, namespace, task))
                .or_default()
                .insert((created, key));
        }
    }
    Ok(candidates
        .iter()
        .map(|candidate| {
            let own = (
                candidate.pod.created.unwrap_or(candidate.started),
                candidate.pod.key.clone(),
            );
            let earlier = tasks
                .get(&(
                    &candidate.task.source,
                    candidate.task.namespace.as_str(),
                    candidate.task.name.as_str(),
                ))
                .map_or(0, |pods| {
                    pods.iter()
                        .filter(|other| **other < own && other.1 != own.1)
                        .count()
                });
            u32::try_from(earlier).unwrap_or(u32::MAX - 1) + 1
        })
        .collect())
}

/// What was measured of the candidates: DCGM's figures by pod, and each node's GPU product.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Measured {
    pub dcgm: BTreeMap<PodKey, Dcgm>,
    pub node_products: BTreeMap<String, String>,
}

/// The job-record inputs of the planned candidates, with their attempts.
pub fn records(
    plan: Plan,
    attempts: &[u32],
    measured: &Measured,
    mapping: &Mapping,
) -> SourceBatch {
    let mut batch = plan.batch;
    let none = Dcgm::default();
    for (candidate, attempt) in plan.candidates.iter().zip(attempts) {
        let dcgm = measured.dcgm.get(&candidate.pod.key).unwrap_or(&none);
        let location = candidate.pod.key.location();
        match record_of(candidate, *attempt, dcgm, measured, mapping, &mut batch) {
            Ok(value) => batch.records.push(SourceRecord { location, value }),
            Err(reason) => batch.unparsable.push(Problem::new(location, reason)),
        }
    }
    batch
}

/// The GPU product a node's label names, as DCGM would name the card: NVIDIA's feature
/// discovery writes `NVIDIA-A100-SXM4-80GB`, with `-MIG-…` or `-SHARED` under MIG's single
/// strategy or time-slicing.
pub fn node_product(label: &str) -> String {
    let product = label.split("-MIG-").next().unwrap_or(label);
    product
        .strip_suffix("-SHARED")
        .unwrap_or(product)
        .to_owned()
}

fn record_of(
    candidate: &Candidate,
    attempt: u32,
    dcgm: &Dcgm,
    measured: &Measured,
    mapping: &Mapping,
    batch: &mut SourceBatch,
) -> Result<Value, String> {
    let pod = &candidate.pod;
    let project = mapping.project_of(pod)?;
    let raw_model = if dcgm.models.is_empty() {
        pod.node
            .as_ref()
            .and_then(|node| measured.node_products.get(node))
            .map(|product| node_product(product))
            .unwrap_or_else(|| UNKNOWN_MODEL.to_owned())
    } else {
        dcgm.models
            .iter()
            .map(|model| mapping.model_name(model))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("+")
    };
    let model = mapping.model_name(&raw_model);
    let spec = gpu::lookup(&model);
    let request = &pod.request;
    let mut profile = None;
    let mig = !request.slices.is_empty() || !dcgm.mig_profiles.is_empty();
    let count = if mig {
        let slices: Decimal = request.slices.values().sum();
        let kind = match (
            request.slices.len(),
            request.gpus.is_zero(),
            dcgm.mig_profiles.len(),
        ) {
            (1, true, _) => request.slices.keys().next().cloned(),
            // MIG's single strategy: each slice is advertised as a `nvidia.com/gpu`.
            (0, false, 1) => dcgm.mig_profiles.iter().next().cloned(),
            _ => {
                batch.leave_out(SEVERAL_KINDS);
                None
            }
        };
        match kind.map(|kind| mig_profile(&model, Some(&kind))) {
            Some(Ok(found)) => profile = found,
            Some(Err(reason)) => batch.leave_out(reason),
            None => {}
        }
        request.gpus + slices
    } else if request.is_share() {
        let share = request.share(spec).unwrap_or_else(|| {
            batch.leave_out(SHARE_OF_UNKNOWN_MODEL);
            Decimal::ONE
        });
        (request.gpus * share).normalize()
    } else {
        request.gpus
    };
    let mut record = json!({
        "project": project,
        "task_id": candidate.task.name,
        "attempt": attempt,
        "gpu_model": model,
        "gpu_count": count.normalize().to_string(),
        "started_at": format_time(candidate.started),
        "ended_at": format_time(candidate.ended),
        "outcome": candidate.outcome.as_str(),
    });
    if let Some(created) = pod.created.filter(|created| *created <= candidate.started) {
        record["queued_at"] = json!(format_time(created));
    }
    if pod.restarts > 0 {
        record["retries"] = json!(pod.restarts.min(i32::MAX as u64));
    }
    let measured_anything = *dcgm
        != Dcgm {
            models: dcgm.models.clone(),
            mig_profiles: dcgm.mig_profiles.clone(),
            energy: dcgm.energy.clone(),
            ..Dcgm::default()
        };
    if request.is_share() && !mig {
        if measured_anything {
            batch.leave_out(SHARED_GPU);
        }
    } else {
        let total = match profile {
            Some(profile) => Some(Decimal::from(profile.memory_gib)),
            None => spec.map(|spec| Decimal::from(spec.memory_gib)),
        };
        let (telemetry, left_out) = telemetry::telemetry(dcgm, mig, total);
        for reason in left_out {
            batch.leave_out(reason);
        }
        for (field, figure) in [
            ("gpu_util", telemetry.gpu_util),
            ("sm_active", telemetry.sm_active),
            ("tensor_active", telemetry.tensor_active),
            ("dram_active", telemetry.dram_active),
            ("memory_peak_gib", telemetry.memory_peak_gib),
        ] {
            if let Some(figure) = figure {
                record[field] = json!(figure.to_string());
            }
        }
    }
    // Under time-slicing NVIDIA's feature discovery marks the node's product `-SHARED`.
    let time_sliced = pod
        .node
        .as_ref()
        .and_then(|node| measured.node_products.get(node))
        .is_some_and(|product| product.ends_with("-SHARED"));
    match telemetry::energy_joules(dcgm, request.gpus, mig, request.is_share() || time_sliced) {
        Ok(Some(joules)) => record["energy_joules"] = json!(joules.to_string()),
        Ok(None) => {}
        Err(reason) => batch.leave_out(reason),
    }
    if let Some(profile) = profile {
        record["mig_profile"] = json!(profile.name());
    }
    if let Some(node) = &pod.node {
        record["nodes"] = json!([node]);
    }
    record["labels"] = Value::Object(labels(candidate, mapping));
    Ok(record)
}

fn labels(candidate: &Candidate, mapping: &Mapping) -> Map<String, Value> {
    let pod = &candidate.pod;
    let reason = (candidate.outcome != Outcome::Completed)
        .then(|| {
            pod.status_reasons
                .iter()
                .chain(pod.terminated_reasons.iter().filter(|r| *r != "Completed"))
                .next()
        })
        .flatten();
    let fixed = [
        ("namespace", Some(&pod.key.namespace)),
        ("pod", Some(&pod.key.name)),
        ("node", pod.node.as_ref()),
        ("reason", reason),
    ];
    let copied = mapping
        .labels
        .iter()
        .map(|key| (key.as_str(), pod.labels.get(&ksm_label(key))));
    fixed
        .into_iter()
        .chain(copied)
        .filter_map(|(key, value)| {
            let value = label_value(value?)?;
            Some((key.to_owned(), Value::String(value)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::record::{JobRecord, RecordRules};

    fn utc(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    fn pod(name: &str) -> Pod {
        let mut pod = Pod::new(PodKey {
            namespace: "ml".to_owned(),
            name: name.to_owned(),
            uid: format!("uid-{name}"),
        });
        pod.created = Some(utc("2026-03-01T09:58:00Z"));
        pod.started = Some(utc("2026-03-01T10:00:00Z"));
        pod.completed = Some(utc("2026-03-01T11:00:00Z"));
        pod.phase = Some(Phase::Succeeded);
        pod.last_seen = Some(utc("2026-03-01T11:30:00Z"));
        pod.last_running = Some(utc("2026-03-01T10:59:30Z"));
        pod.job = Some("train".to_owned());
        pod.request.add("nvidia_com_gpu", Decimal::from(2));
        pod.node = Some("n1".to_owned());
        pod
    }

    fn horizon() -> Horizon {
        Horizon {
            since: utc("2026-03-01T00:00:00Z"),
            until: utc("2026-03-02T00:00:00Z"),
            now: utc("2026-03-05T00:00:00Z"),
            settle: TimeDelta::minutes(5),
            reported_until: None,
        }
    }

    fn sample(labels: &[(&str, &str)], value: &str) -> Sample {
        Sample {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            value: value.to_owned(),
        }
    }

    fn table_of(answers: Vec<(PodFact, Vec<Sample>)>) -> Result<Vec<Pod>, String> {
        let mut table = PodTable::default();
        for (fact, samples) in answers {
            table.add(fact, samples)?;
        }
        Ok(table.finish())
    }

    #[test]
    fn answers_join_into_pods_and_a_limit_counts_only_without_a_request() {
        let key = [("namespace", "ml"), ("pod", "a"), ("uid", "u")];
        let with = |more: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
            key.iter().chain(more).copied().collect()
        };
        let pods = table_of(vec![
            (PodFact::Started, vec![sample(&with(&[]), "1772359200")]),
            (
                PodFact::Phase,
                vec![sample(&with(&[("phase", "Failed")]), "1")],
            ),
            (
                PodFact::Owner,
                vec![sample(
                    &with(&[("owner_kind", "Job"), ("owner_name", "j")]),
                    "1",
                )],
            ),
            (
                PodFact::Labels,
                vec![sample(
                    &with(&[("label_team", "nlp"), ("label_empty", ""), ("job", "ksm")]),
                    "1",
                )],
            ),
            (
                PodFact::Requests,
                vec![sample(&with(&[("resource", "nvidia_com_gpu")]), "2")],
            ),
            (
                PodFact::Limits,
                vec![
                    sample(&with(&[("resource", "nvidia_com_gpu")]), "2"),
                    sample(&with(&[("resource", "nvidia_com_gpucores")]), "50"),
                ],
            ),
            (
                PodFact::StatusReason,
                vec![sample(&with(&[("reason", "Evicted")]), "1")],
            ),
        ])
        .unwrap();
        assert_eq!(pods.len(), 1);
        let pod = &pods[0];
        assert_eq!(pod.started, Some(utc("2026-03-01T10:00:00Z")));
        assert_eq!(pod.phase, Some(Phase::Failed));
        assert_eq!(pod.job.as_deref(), Some("j"));
        assert_eq!(
            pod.labels,
            [("label_team".to_owned(), "nlp".to_owned())].into()
        );
        assert_eq!(pod.request.gpus, Decimal::from(2));
        assert_eq!(pod.request.cores_percent, Some(Decimal::from(50)));
        assert_eq!(outcome(pod), Outcome::Preempted);
        let nameless = vec![(PodFact::Created, vec![sample(&[("pod", "a")], "1")])];
        assert!(table_of(nameless).is_err());
    }

    #[test]
    fn pods_are_decided_once_they_ended_in_the_window_and_settled() {
        let mut running = pod("running");
        running.phase = Some(Phase::Running);
        running.completed = None;
        running.last_seen = Some(utc("2026-03-01T23:59:30Z"));
        // Deleted while running: no longer reported while others are.
        let mut gone = running.clone();
        gone.key.name = "gone".to_owned();
        gone.last_seen = Some(utc("2026-03-01T12:00:00Z"));
        gone.last_running = Some(utc("2026-03-01T12:00:00Z"));
        let mut recent = pod("recent");
        recent.completed = Some(utc("2026-03-04T23:58:00Z"));
        let mut earlier = pod("earlier");
        earlier.completed = Some(utc("2026-02-28T23:00:00Z"));
        let mut cpu = pod("cpu");
        cpu.request = GpuRequest::default();
        let mut unstarted = pod("unstarted");
        unstarted.started = None;
        unstarted.phase = Some(Phase::Failed);
        unstarted.completed = None;
        unstarted.last_running = None;
        let plan = plan(
            vec![pod("done"), running, gone, earlier, cpu, unstarted],
            &horizon(),
            &Mapping::default(),
        );
        assert_eq!(
            plan.batch.jobs_read, 5,
            "the pod that ended before the window is not counted"
        );
        assert_eq!(
            plan.batch.skipped,
            [(NO_GPU, 1), (STILL_RUNNING, 1), (MISSING_START, 1)].into()
        );
        let decided: Vec<(&str, DateTime<Utc>, Outcome)> = plan
            .candidates
            .iter()
            .map(|c| (c.pod.key.name.as_str(), c.ended, c.outcome))
            .collect();
        assert_eq!(
            decided,
            vec![
                ("done", utc("2026-03-01T11:00:00Z"), Outcome::Completed),
                ("gone", utc("2026-03-01T12:00:00Z"), Outcome::Cancelled),
            ]
        );
        // A pod that ended less than `settle` before now waits for a later window.
        let late = Horizon {
            until: utc("2026-03-05T00:00:00Z"),
            ..horizon()
        };
        let plan = self::plan(vec![recent], &late, &Mapping::default());
        assert_eq!(plan.batch.skipped, [(STILL_RUNNING, 1)].into());
    }

    #[test]
    fn a_page_alone_knows_a_pod_is_gone_by_when_any_pod_was_reported() {
        let mut gone = pod("gone");
        gone.phase = Some(Phase::Running);
        gone.completed = None;
        gone.last_seen = Some(utc("2026-03-01T12:00:00Z"));
        gone.last_running = gone.last_seen;
        // Alone on its page, it is the latest pod reported: still running.
        let alone = plan(vec![gone.clone()], &horizon(), &Mapping::default());
        assert_eq!(alone.batch.skipped, [(STILL_RUNNING, 1)].into());
        // Other pages' pods were reported until the window's end: it is gone.
        let paged = Horizon {
            reported_until: Some(utc("2026-03-01T23:59:30Z")),
            ..horizon()
        };
        let decided = plan(vec![gone], &paged, &Mapping::default());
        assert_eq!(decided.candidates.len(), 1);
        assert_eq!(decided.candidates[0].outcome, Outcome::Cancelled);
    }

    #[test]
    fn outcomes_follow_the_phase_then_the_reasons() {
        let mut failed = pod("f");
        failed.phase = Some(Phase::Failed);
        failed.terminated_reasons.insert("OOMKilled".to_owned());
        assert_eq!(outcome(&failed), Outcome::Failed);
        let mut restarted = pod("r");
        restarted.terminated_reasons.insert("OOMKilled".to_owned());
        assert_eq!(outcome(&restarted), Outcome::Completed);
        let mut deleted = pod("d");
        deleted.phase = Some(Phase::Running);
        deleted.terminated_reasons.insert("Completed".to_owned());
        assert_eq!(outcome(&deleted), Outcome::Cancelled);
        deleted.terminated_reasons.insert("Error".to_owned());
        assert_eq!(outcome(&deleted), Outcome::Failed);
        deleted
            .status_reasons
            .insert("PreemptionByScheduler".to_owned());
        assert_eq!(outcome(&deleted), Outcome::Preempted);
    }

    #[test]
    fn attempts_count_every_earlier_pod_of_the_task() {
        let mut second = pod("train-2");
        second.created = Some(utc("2026-03-01T12:00:00Z"));
        let plan = plan(vec![second], &horizon(), &Mapping::default());
        let task = |pod: &str, created: &str| {
            sample(
                &[
                    ("namespace", "ml"),
                    ("pod", pod),
                    ("uid", &format!("uid-{pod}")),
                    ("task", "train"),
                ],
                created,
            )
        };
        let members = [(
            TaskSource::Job,
            vec![
                // Long deleted, but Prometheus still holds its series.
                task("train-1", "1772355600"),
                task("train-2", "1772366400"),
                task("train-3", "1772370000"),
            ],
        )]
        .into();
        assert_eq!(attempts(&plan.candidates, &members).unwrap(), vec![2]);
        assert_eq!(
            attempts(&plan.candidates, &BTreeMap::new()).unwrap(),
            vec![1]
        );
    }

    #[test]
    fn tasks_and_projects_come_from_labels_jobs_or_names() {
        let mut labelled = pod("a");
        labelled.labels.insert(
            "label_app_kubernetes_io_instance".to_owned(),
            "run-7".to_owned(),
        );
        labelled
            .labels
            .insert("label_team".to_owned(), "Vision_GPU".to_owned());
        let mapping = Mapping {
            task_label: Some("app.kubernetes.io/instance".to_owned()),
            project_label: Some("team".to_owned()),
            ..Mapping::default()
        };
        assert_eq!(mapping.task_of(&labelled).name, "run-7");
        assert_eq!(mapping.project_of(&labelled).unwrap(), "vision-gpu");
        let mut bare = pod("bare");
        bare.job = None;
        assert_eq!(mapping.task_of(&bare).source, TaskSource::PodName);
        assert_eq!(mapping.task_of(&bare).name, "bare");
        assert_eq!(mapping.project_of(&bare).unwrap(), "ml");
        let projects = parse_project_map("# teams\nml = research\n\nVision_GPU=vision\n").unwrap();
        let mapped = Mapping {
            projects,
            ..mapping
        };
        assert_eq!(mapped.project_of(&labelled).unwrap(), "vision");
        assert_eq!(mapped.project_of(&bare).unwrap(), "research");
        assert!(
            parse_project_map("ml research")
                .unwrap_err()
                .starts_with("line 1")
        );
        assert!(parse_project_map("ml=Research").is_err());
        assert_eq!(
            ksm_label("app.kubernetes.io/name"),
            "label_app_kubernetes_io_name"
        );
        assert_eq!(
            node_product("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
            "NVIDIA-A100-SXM4-40GB"
        );
        assert_eq!(
            node_product("NVIDIA-A100-SXM4-80GB-SHARED"),
            "NVIDIA-A100-SXM4-80GB"
        );
    }

    fn record(pod: Pod, dcgm: Dcgm, mapping: &Mapping) -> (Value, SourceBatch) {
        let key = pod.key.clone();
        let plan = plan(vec![pod], &horizon(), mapping);
        let measured = Measured {
            dcgm: [(key, dcgm)].into(),
            node_products: [("n1".to_owned(), "NVIDIA-H100-80GB-HBM3".to_owned())].into(),
        };
        let batch = records(plan, &[1], &measured, mapping);
        assert_eq!(batch.unparsable, vec![]);
        let value = batch.records[0].value.clone();
        let rules = RecordRules {
            now: utc("2026-03-05T00:00:00Z"),
            max_duration: RecordRules::DEFAULT_MAX_DURATION,
        };
        JobRecord::parse(&value, "", rules).expect("every record passes the ledger's checks");
        (value, batch)
    }

    fn dcgm(models: &[&str], profiles: &[&str]) -> Dcgm {
        Dcgm {
            gpu_util_percent: Some(telemetry::Figure::Value(Decimal::from(90))),
            gr_engine_active: Some(telemetry::Figure::Value("0.25".parse().unwrap())),
            fb_used_mib: Some(telemetry::Figure::Value(Decimal::from(30720))),
            models: models.iter().map(|m| (*m).to_owned()).collect(),
            mig_profiles: profiles.iter().map(|p| (*p).to_owned()).collect(),
            ..Dcgm::default()
        }
    }

    #[test]
    fn whole_gpus_become_a_record_with_their_telemetry_and_labels() {
        let mut whole = pod("a");
        whole.restarts = 2;
        whole
            .labels
            .insert("label_team".to_owned(), "nlp".to_owned());
        let mapping = Mapping {
            labels: vec!["team".to_owned(), "missing".to_owned()],
            gpu_models: [("NVIDIA A100-SXM4-80GB".to_owned(), "A100-80GB".to_owned())].into(),
            ..Mapping::default()
        };
        let (value, _) = record(whole, dcgm(&["NVIDIA A100-SXM4-80GB"], &[]), &mapping);
        assert_eq!(
            value,
            json!({
                "project": "ml", "task_id": "train", "attempt": 1, "gpu_model": "A100-80GB",
                "gpu_count": "2", "started_at": "2026-03-01T10:00:00Z",
                "ended_at": "2026-03-01T11:00:00Z", "queued_at": "2026-03-01T09:58:00Z",
                "outcome": "completed", "retries": 2, "gpu_util": "0.9",
                "memory_peak_gib": "30", "nodes": ["n1"],
                "labels": {"namespace": "ml", "pod": "a", "node": "n1", "team": "nlp"}
            })
        );
        // Without DCGM, the node's product names the model.
        let (value, _) = record(pod("b"), Dcgm::default(), &Mapping::default());
        assert_eq!(value["gpu_model"], "NVIDIA-H100-80GB-HBM3");
        assert_eq!(value.get("gpu_util"), None);
    }

    #[test]
    fn slices_and_shares_are_counted_as_the_ledger_prices_them() {
        let mut slices = pod("mig");
        slices.request = GpuRequest::default();
        slices
            .request
            .add("nvidia_com_mig_3g_40gb", Decimal::from(2));
        let (value, _) = record(
            slices,
            dcgm(&["NVIDIA H100 80GB HBM3"], &["3g.40gb"]),
            &Mapping::default(),
        );
        assert_eq!(
            (
                &value["gpu_count"],
                &value["mig_profile"],
                &value["gpu_util"],
                &value["memory_peak_gib"]
            ),
            (&json!("2"), &json!("3g.40gb"), &json!("0.25"), &json!("30"))
        );
        // MIG's single strategy: slices advertised as GPUs, the profile from DCGM.
        let (value, _) = record(
            pod("single"),
            dcgm(&["NVIDIA H100 80GB HBM3"], &["1g.10gb"]),
            &Mapping::default(),
        );
        assert_eq!(
            (&value["gpu_count"], &value["mig_profile"]),
            (&json!("2"), &json!("1g.10gb"))
        );
        assert_eq!(
            value.get("memory_peak_gib"),
            None,
            "30 GiB on a 10 GiB slice is left out"
        );
        let mut mixed = pod("mixed");
        mixed.request.add("nvidia_com_mig_1g_10gb", Decimal::ONE);
        let (value, batch) = record(
            mixed,
            dcgm(&["NVIDIA H100 80GB HBM3"], &["1g.10gb"]),
            &Mapping::default(),
        );
        assert_eq!(
            (&value["gpu_count"], value.get("mig_profile")),
            (&json!("3"), None)
        );
        assert_eq!(batch.left_out[&SEVERAL_KINDS], 1);

        let mut shared = pod("hami");
        shared.request = GpuRequest::default();
        shared.request.add("nvidia_com_gpu", Decimal::from(2));
        shared
            .request
            .add("nvidia_com_gpumem", Decimal::from(20480));
        let (value, batch) = record(
            shared.clone(),
            dcgm(&["NVIDIA H100 80GB HBM3"], &[]),
            &Mapping::default(),
        );
        assert_eq!(value["gpu_count"], "0.5", "2 × 20 of 80 GiB");
        assert_eq!(
            (value.get("gpu_util"), value.get("memory_peak_gib")),
            (None, None)
        );
        assert_eq!(batch.left_out[&SHARED_GPU], 1);
        let (value, batch) = record(shared, dcgm(&["TPU"], &[]), &Mapping::default());
        assert_eq!(value["gpu_count"], "2");
        assert_eq!(batch.left_out[&SHARE_OF_UNKNOWN_MODEL], 1);
    }

    /// DCGM's energy counter on `gpus` (UUID, first and last reading in mJ, resets).
    fn energy(gpus: &[(&str, &str, &str, &str)]) -> Dcgm {
        let mut samples = Vec::new();
        for (uuid, least, most, resets) in gpus {
            for (figure, value) in [
                ("energy_least", least),
                ("energy_most", most),
                ("energy_resets", resets),
            ] {
                samples.push(sample(&[("figure", figure), ("UUID", uuid)], value));
            }
        }
        Dcgm::read(&samples).unwrap()
    }

    #[test]
    fn energy_goes_into_records_of_gpus_the_pod_had_alone() {
        // Two GPUs over the hour: 2,520,000,000 and 2,430,000,500 mJ used.
        let two = energy(&[
            ("GPU-0", "81000000000", "83520000000", "0"),
            ("GPU-1", "90000000000", "92430000500", "0"),
        ]);
        let mut sliced = pod("sliced");
        sliced.node = Some("n2".to_owned());
        let mut hami = pod("hami");
        hami.request.add("nvidia_com_gpucores", Decimal::from(50));
        let mut mig = pod("mig");
        mig.request = GpuRequest::default();
        mig.request.add("nvidia_com_mig_3g_40gb", Decimal::ONE);
        let pods = vec![pod("a"), sliced, hami, mig];
        let keys: Vec<PodKey> = pods.iter().map(|p| p.key.clone()).collect();
        let plan = plan(pods, &horizon(), &Mapping::default());
        let measured = Measured {
            dcgm: keys.into_iter().map(|key| (key, two.clone())).collect(),
            node_products: [
                ("n1".to_owned(), "NVIDIA-H100-80GB-HBM3".to_owned()),
                ("n2".to_owned(), "NVIDIA-H100-80GB-HBM3-SHARED".to_owned()),
            ]
            .into(),
        };
        let batch = records(plan, &[1, 1, 1, 1], &measured, &Mapping::default());
        assert_eq!(batch.unparsable, vec![]);
        let energy: BTreeMap<&str, Option<&Value>> = batch
            .records
            .iter()
            .map(|r| {
                (
                    r.value["labels"]["pod"].as_str().unwrap(),
                    r.value.get("energy_joules"),
                )
            })
            .collect();
        assert_eq!(
            energy,
            [
                ("a", Some(&json!("4950000.5"))),
                ("sliced", None),
                ("hami", None),
                ("mig", None)
            ]
            .into()
        );
        assert_eq!(batch.left_out[&telemetry::ENERGY_OF_SHARED_GPU], 2);
        assert_eq!(batch.left_out[&telemetry::ENERGY_OF_MIG_INSTANCE], 1);
        assert_eq!(
            batch.left_out.get(&SHARED_GPU),
            None,
            "energy alone is not the telemetry of a shared GPU"
        );
    }
}
