//! Kubernetes GPU pods as job records, from what kube-state-metrics and dcgm-exporter put in
//! Prometheus: one record per pod that finished in a window, its task the Job that owns it (or
//! a label), its attempts the task's pods in order of creation, its telemetry what DCGM
//! measured of its GPUs over its life. `docs/kubernetes.md` tables the mapping.
//!
//! Pure: [`promql`] builds the questions and reads the answers; the collector asks them.
//! A pod is decided only once its data has settled, so that every run that sees it again
//! makes exactly the same record and overlapping windows store it once.

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
use crate::domain::record::{MAX_LABEL_VALUE_CHARS, format_time};
use crate::domain::slurm::{account_slug, telemetry::mig_profile};
use crate::domain::source::{LeftOut, Problem, SourceBatch, SourceRecord};
use crate::domain::values::ProjectId;

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

/// Joins the answers of the pod queries into pods, by namespace, name and UID.
pub fn pods(answers: Vec<(PodFact, Vec<Sample>)>) -> Result<Vec<Pod>, String> {
    let mut pods: BTreeMap<PodKey, Pod> = BTreeMap::new();
    let mut limits: BTreeMap<PodKey, Vec<(String, Decimal)>> = BTreeMap::new();
    let mut requested: BTreeMap<PodKey, BTreeSet<String>> = BTreeMap::new();
    for (fact, samples) in answers {
        for sample in samples {
            let key = PodKey::of(&sample)
                .ok_or_else(|| format!("a series answered for {fact:?} names no namespace and pod"))?;
            let time = || {
                sample
                    .time()
                    .ok_or_else(|| format!("{}: `{}` is not a time ({fact:?})", key.location(), sample.value))
            };
            let number = || {
                sample
                    .decimal()
                    .ok_or_else(|| format!("{}: `{}` is not a number ({fact:?})", key.location(), sample.value))
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
                    limits.entry(key.clone()).or_default().push((resource, amount));
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
    }
    // Kubernetes copies an extended resource's limit into its request when only the limit
    // is given; a limit counts only where no request was read.
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
    Ok(pods.into_values().collect())
}

/// The Prometheus label kube-state-metrics gives a Kubernetes label (`label_` and the key
/// with every character other than a letter, digit or `_` as `_`).
pub fn ksm_label(key: &str) -> String {
    let sanitized: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
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
        account_slug(source)
            .ok_or_else(|| format!("`{source}` makes no project id; map it in the project map file"))
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

    fn model_name(&self, raw: &str) -> String {
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
    let reported_until = pods.iter().filter_map(|pod| pod.last_seen).max();
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
        || pod.terminated_reasons.iter().any(|reason| reason != "Completed")
    {
        Outcome::Failed
    } else {
        Outcome::Cancelled
    }
}

/// The attempt of each candidate: its place among the pods of its task, by creation time
/// (then name), counting every pod of the task Prometheus saw, finished or not. `members`
/// holds, per source, the answer of [`promql::task_pods`].
pub fn attempts(
    candidates: &[Candidate],
    members: &BTreeMap<TaskSource, Vec<Sample>>,
) -> Result<Vec<u32>, String> {
    let mut tasks: BTreeMap<(&TaskSource, &str, &str), BTreeSet<(DateTime<Utc>, PodKey)>> =
        BTreeMap::new();
    for (source, samples) in members {
        for sample in samples {
            let (Some(key), Some(task)) = (PodKey::of(sample), sample.label("task")) else {
                return Err("a series of the task answer names no namespace, pod or task".to_owned());
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
                .map_or(0, |pods| pods.iter().filter(|other| **other < own && other.1 != own.1).count());
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
pub fn records(plan: Plan, attempts: &[u32], measured: &Measured, mapping: &Mapping) -> SourceBatch {
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
    product.strip_suffix("-SHARED").unwrap_or(product).to_owned()
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
        let kind = match (request.slices.len(), request.gpus.is_zero(), dcgm.mig_profiles.len()) {
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
    let measured_anything = *dcgm != Dcgm {
        models: dcgm.models.clone(),
        mig_profiles: dcgm.mig_profiles.clone(),
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
    if let Some(profile) = profile {
        record["mig_profile"] = json!(profile.name());
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
            let value: String = value?
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_LABEL_VALUE_CHARS)
                .collect();
            (!value.trim().is_empty()).then(|| (key.to_owned(), Value::String(value)))
        })
        .collect()
}
