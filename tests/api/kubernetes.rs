//! Kubernetes as a source: `collect prometheus` against a real Prometheus, whose TSDB promtool
//! builds from an OpenMetrics file this test writes: about 30 pods over a day as
//! kube-state-metrics and dcgm-exporter report them. The records stored must be those the
//! pods' specs call for, field by field.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, cost};
use crate::prometheus;

/// kube-state-metrics' and dcgm-exporter's scrape interval, seconds.
const SCRAPE: i64 = 30;
const HOUR: i64 = 3600;
const MINUTE: i64 = 60;
/// The samples start an hour before the day the collector reads, and end with it.
const DATA_START: i64 = -HOUR;
const DATA_END: i64 = 24 * HOUR;

#[derive(Clone, Copy)]
struct Gpu {
    model: &'static str,
    mig: Option<&'static str>,
    profiling: bool,
    memory_mib: i64,
}

const A100: Gpu = Gpu {
    model: "NVIDIA A100-SXM4-80GB",
    mig: None,
    profiling: true,
    memory_mib: 81920,
};
const H100: Gpu = Gpu {
    model: "NVIDIA H100 80GB HBM3",
    mig: None,
    profiling: true,
    memory_mib: 81920,
};
const L40S: Gpu = Gpu {
    model: "NVIDIA L40S",
    mig: None,
    profiling: false,
    memory_mib: 46068,
};

#[derive(Clone, Copy, PartialEq)]
enum End {
    Succeeded,
    Failed(&'static str),
    Evicted,
    /// Deleted while running: its series just stop.
    Vanished,
    /// Still running when the samples end.
    Running,
    /// Refused by the kubelet before it started.
    NeverStarted,
}

#[derive(Clone)]
struct Spec {
    namespace: &'static str,
    name: String,
    job: Option<String>,
    team: Option<&'static str>,
    created: i64,
    started: Option<i64>,
    ended: i64,
    end: End,
    resources: Vec<(&'static str, i64)>,
    restarts: u32,
    node: &'static str,
    gpus: Vec<Gpu>,
    /// How long its series stay after it ended (until the pod object is deleted).
    linger: i64,
    /// DCGM's energy counter on its GPUs, where dcgm-exporter reports it.
    counters: Option<Counters>,
    /// How many pods of its namespace and name came before it (a re-created pod): part of
    /// its UID.
    recreated: u32,
    /// How many seconds after kube-state-metrics dcgm-exporter is scraped, each `SCRAPE`.
    dcgm_phase: i64,
}

/// `DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION` of a pod's GPUs: GPU `i` draws `watts[i]` W, so
/// at its DCGM sample `k` (every `SCRAPE` s) its counter reads `base_i + k·30·watts[i]·1000`
/// mJ, `base_0` being `first`; from sample `reset` on (a driver reload) it counts again
/// from 0.
#[derive(Clone)]
struct Counters {
    watts: Vec<i64>,
    reset: Option<usize>,
    first: i64,
}

impl Counters {
    fn millijoules(&self, gpu: usize, k: usize) -> i64 {
        let per_sample = SCRAPE * self.watts[gpu] * 1000;
        match self.reset {
            Some(reset) if k >= reset => (k - reset) as i64 * per_sample,
            // Days of use since the driver loaded, different on each GPU.
            _ => self.first + gpu as i64 * 7_654_321_987 + k as i64 * per_sample,
        }
    }
}

impl Spec {
    fn new(namespace: &'static str, name: &str, started: i64, ended: i64) -> Self {
        Self {
            namespace,
            name: name.to_owned(),
            job: None,
            team: None,
            created: started - 97,
            started: Some(started),
            ended,
            end: End::Succeeded,
            resources: vec![],
            restarts: 0,
            node: "gpu-node-1",
            gpus: vec![],
            linger: 40 * MINUTE,
            counters: None,
            recreated: 0,
            dcgm_phase: 0,
        }
    }

    fn job(mut self, job: &str) -> Self {
        self.job = Some(job.to_owned());
        self
    }

    fn gpus(mut self, gpu: Gpu, count: usize) -> Self {
        self.resources.push(("nvidia_com_gpu", count as i64));
        self.gpus = vec![gpu; count];
        self
    }

    fn end(mut self, end: End) -> Self {
        self.end = end;
        self
    }

    /// Its GPUs report their energy counters, drawing `watts`, reset at sample `reset`.
    fn energy(mut self, watts: &[i64], reset: Option<usize>) -> Self {
        self.counters = Some(Counters {
            watts: watts.to_vec(),
            reset,
            first: 310_000_000_000,
        });
        self
    }

    /// Its first GPU's counter reads `millijoules` at its first DCGM sample.
    fn counted_from(mut self, millijoules: i64) -> Self {
        self.counters.as_mut().expect("energy() comes first").first = millijoules;
        self
    }

    /// A UID shaped as Kubernetes makes them, spread over its first characters as theirs
    /// are (the collector pages by them), and the same on every run.
    fn uid(&self) -> String {
        let mut identity = format!("{}/{}", self.namespace, self.name);
        if self.recreated > 0 {
            identity.push_str(&format!("#{}", self.recreated));
        }
        let hash = identity
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
            });
        format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            hash >> 32,
            (hash >> 16) & 0xffff,
            hash & 0xfff,
            (hash >> 20) & 0xfff,
            hash & 0xffff_ffff_ffff
        )
    }

    /// Whether kube-state-metrics reports a completion time.
    fn completes(&self) -> bool {
        matches!(self.end, End::Succeeded | End::Failed(_))
    }

    /// The scrape times its kube-state-metrics series are sampled at.
    fn scrapes(&self) -> impl Iterator<Item = i64> + '_ {
        let first = self.created.div_euclid(SCRAPE) * SCRAPE + SCRAPE;
        let last = match self.end {
            End::Vanished => self.ended - 1,
            End::Running => DATA_END,
            _ => (self.ended + self.linger).min(DATA_END),
        };
        (first..=last)
            .step_by(SCRAPE as usize)
            .filter(|t| *t >= DATA_START)
    }

    fn phase_at(&self, t: i64) -> &'static str {
        match self.started {
            Some(started) if t >= started && (t < self.ended || self.end == End::Running) => {
                "Running"
            }
            _ if t < self.ended || self.end == End::Vanished => "Pending",
            _ => match self.end {
                End::Succeeded => "Succeeded",
                _ => "Failed",
            },
        }
    }

    /// When the record says it ended: its completion, else the last scrape that saw it
    /// running.
    fn record_end(&self) -> i64 {
        if self.completes() {
            self.ended
        } else {
            self.scrapes()
                .filter(|t| self.phase_at(*t) == "Running")
                .max()
                .unwrap()
        }
    }

    /// The DCGM sample times of its GPUs: every `SCRAPE` s at its phase, after it started and
    /// before it ended.
    fn dcgm_times(&self) -> Vec<i64> {
        let Some(started) = self.started else {
            return vec![];
        };
        let end = if self.end == End::Running {
            DATA_END
        } else {
            self.ended
        };
        let phase = self.dcgm_phase;
        let first = (started - phase).div_euclid(SCRAPE) * SCRAPE + SCRAPE + phase;
        (first..end).step_by(SCRAPE as usize).collect()
    }
}

/// The figures of GPU `gpu` at sample `k`, as dcgm-exporter reports them.
fn util(seed: usize, gpu: usize, k: usize) -> f64 {
    ((k * 7 + gpu * 13 + seed) % 101) as f64
}
fn sm(seed: usize, gpu: usize, k: usize) -> f64 {
    ((k * 3 + gpu * 5 + seed) % 61) as f64 / 100.0
}
fn tensor(_seed: usize, _gpu: usize, k: usize) -> f64 {
    (k % 11) as f64 / 40.0
}
fn dram(seed: usize, _gpu: usize, k: usize) -> f64 {
    ((k * 5 + seed) % 37) as f64 / 100.0
}
fn fb_used(seed: usize, gpu: usize, k: usize, memory_mib: i64) -> f64 {
    (1000 + ((k * 97 + gpu * 31 + seed) as i64) % (memory_mib - 1000)) as f64
}

/// The pods of the day, with their specs.
fn specs() -> Vec<Spec> {
    let mig = |profile: &'static str, profiling: bool| Gpu {
        mig: Some(profile),
        profiling,
        memory_mib: if profile == "3g.40gb" { 40960 } else { 10240 },
        ..A100
    };
    let mut specs = vec![
        Spec::new(
            "vision",
            "train-a-7xk2p",
            HOUR + 137,
            2 * HOUR + 45 * MINUTE + 11,
        )
        .job("train-a")
        .gpus(A100, 1),
        Spec::new(
            "vision",
            "train-b-q9w8e",
            2 * HOUR + 5 * MINUTE + 3,
            5 * HOUR + 33 * MINUTE + 7,
        )
        .job("train-b")
        .gpus(H100, 8),
        Spec::new(
            "vision",
            "embed-x1",
            3 * HOUR + 11,
            4 * HOUR + 20 * MINUTE + 19,
        )
        .job("embed")
        .gpus(
            Gpu {
                profiling: false,
                ..A100
            },
            2,
        ),
        // A Job whose first pod failed and whose second succeeded.
        Spec::new(
            "nlp",
            "finetune-abc12",
            3 * HOUR + 13,
            3 * HOUR + 40 * MINUTE + 1,
        )
        .job("finetune")
        .gpus(L40S, 2)
        .end(End::Failed("Error")),
        Spec::new(
            "nlp",
            "finetune-def34",
            3 * HOUR + 42 * MINUTE + 9,
            5 * HOUR + 10 * MINUTE + 29,
        )
        .job("finetune")
        .gpus(L40S, 2),
        Spec::new("nlp", "oom-77kq", 6 * HOUR + 21, 6 * HOUR + 50 * MINUTE + 3)
            .job("oom")
            .gpus(A100, 1)
            .end(End::Failed("OOMKilled")),
        // Its container was OOM-killed once, restarted and then finished.
        Spec {
            restarts: 1,
            ..Spec::new(
                "nlp",
                "restarted-5tt",
                7 * HOUR + 17,
                8 * HOUR + 31 * MINUTE + 13,
            )
            .job("restarted")
            .gpus(A100, 1)
        },
        Spec {
            resources: vec![("nvidia_com_mig_3g_40gb", 1)],
            gpus: vec![mig("3g.40gb", true)],
            ..Spec::new(
                "research",
                "mig3-lp0",
                4 * HOUR + 29,
                6 * HOUR + 2 * MINUTE + 17,
            )
            .job("mig3")
        },
        Spec {
            resources: vec![("nvidia_com_mig_1g_10gb", 2)],
            gpus: vec![mig("1g.10gb", false); 2],
            ..Spec::new(
                "research",
                "mig1-zz9",
                9 * HOUR + 7,
                10 * HOUR + 15 * MINUTE + 7,
            )
            .job("mig1")
        },
        // A HAMi share: 30 % of the cores and 20000 MiB of one A100 80GB.
        Spec {
            resources: vec![
                ("nvidia_com_gpu", 1),
                ("nvidia_com_gpucores", 30),
                ("nvidia_com_gpumem", 20000),
            ],
            gpus: vec![A100],
            ..Spec::new("research", "shared-notebook", 5 * HOUR + 19, 7 * HOUR + 3)
        },
        Spec::new(
            "vision",
            "evicted-m2",
            8 * HOUR + 23,
            9 * HOUR + 12 * MINUTE + 1,
        )
        .job("evicted")
        .gpus(A100, 1)
        .end(End::Evicted),
        // A bare pod deleted while it ran.
        Spec::new(
            "vision",
            "debug-shell",
            6 * HOUR + 1,
            6 * HOUR + 47 * MINUTE + 11,
        )
        .gpus(A100, 1)
        .end(End::Vanished),
        Spec {
            started: None,
            ..Spec::new(
                "nlp",
                "never-ran",
                10 * HOUR + 3,
                10 * HOUR + 5 * MINUTE + 3,
            )
            .job("never-ran")
            .gpus(A100, 1)
            .end(End::NeverStarted)
        },
        // On a node dcgm-exporter does not cover: the model comes from the node's label.
        Spec {
            node: "gpu-node-9",
            gpus: vec![],
            ..Spec::new(
                "research",
                "quick-eval",
                11 * HOUR + 13,
                11 * HOUR + 40 * MINUTE + 21,
            )
            .job("quick-eval")
            .gpus(A100, 4)
        },
        // Finished in the overlap of the two windows.
        Spec::new(
            "vision",
            "overlap-r4",
            11 * HOUR + 51,
            13 * HOUR + 2 * MINUTE + 41,
        )
        .job("overlap")
        .gpus(H100, 2),
        // Running when the first window ends, finished in the second.
        Spec::new(
            "nlp",
            "long-k1",
            12 * HOUR + 30 * MINUTE + 3,
            15 * HOUR + 45 * MINUTE + 53,
        )
        .job("long")
        .gpus(H100, 4),
        // A retried Job whose first pod is long deleted when the second finishes.
        Spec {
            linger: 20 * MINUTE,
            ..Spec::new(
                "vision",
                "retry-1aa",
                9 * HOUR + 31,
                10 * HOUR + 2 * MINUTE + 2,
            )
            .job("retry")
            .gpus(A100, 1)
            .end(End::Failed("Error"))
        },
        Spec::new(
            "vision",
            "retry-2bb",
            13 * HOUR + 31,
            16 * HOUR + 2 * MINUTE + 5,
        )
        .job("retry")
        .gpus(A100, 1),
        // Still running when the samples end.
        Spec::new("vision", "serve-0", 20 * HOUR + 9, DATA_END)
            .gpus(A100, 1)
            .end(End::Running),
        // Ended before the day began.
        Spec::new("vision", "old-1", -50 * MINUTE + 3, -20 * MINUTE + 7)
            .job("old")
            .gpus(A100, 1),
    ];
    for (i, (namespace, gpu, count)) in [
        ("vision", A100, 1),
        ("vision", H100, 2),
        ("nlp", A100, 4),
        ("nlp", L40S, 1),
        ("research", H100, 8),
        (
            "research",
            Gpu {
                profiling: false,
                ..H100
            },
            1,
        ),
        ("vision", A100, 2),
    ]
    .into_iter()
    .enumerate()
    {
        let start = (14 + i as i64) * HOUR + 7 * MINUTE + 17 + i as i64;
        let mut spec = Spec::new(
            namespace,
            &format!("sweep-{i}-x"),
            start,
            start + 47 * MINUTE + 31,
        )
        .job(&format!("sweep-{i}"))
        .gpus(gpu, count);
        spec.team = Some(["perception", "language"][i % 2]);
        spec.node = "gpu-node-2";
        specs.push(spec);
    }
    for i in 0..4 {
        let start = (2 + 5 * i) * HOUR + 1;
        let mut cpu = Spec::new(
            "batch",
            &format!("etl-{i}"),
            start,
            start + 30 * MINUTE + 11,
        )
        .job(&format!("etl-{i}"));
        cpu.resources = vec![];
        cpu.node = "cpu-node-1";
        specs.push(cpu);
    }
    specs
}

/// A series' name and labels as OpenMetrics writes them.
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    format!("{name}{{{}}}", labels.join(","))
}

const ENERGY: &str = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION";

/// The OpenMetrics text of the specs' series, from `base` on.
fn openmetrics(specs: &[Spec], base: i64) -> String {
    let mut families: BTreeMap<&'static str, String> = BTreeMap::new();
    // Whole millijoules, written as integers.
    let mut energy = String::new();
    let mut emit = |name: &'static str, labels: &[(&str, &str)], value: f64, t: i64| {
        let line = families.entry(name).or_default();
        let _ = writeln!(line, "{} {value} {}", series(name, labels), base + t);
    };
    for spec in specs {
        let uid = spec.uid();
        let pod = [
            ("namespace", spec.namespace),
            ("pod", spec.name.as_str()),
            ("uid", uid.as_str()),
        ];
        let with = |more: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
            pod.iter().copied().chain(more.iter().copied()).collect()
        };
        let owner = spec.job.as_deref().unwrap_or("<none>");
        let owner_kind = if spec.job.is_some() { "Job" } else { "<none>" };
        let scrapes: Vec<i64> = spec.scrapes().collect();
        for &t in &scrapes {
            emit(
                "kube_pod_created",
                &with(&[]),
                (base + spec.created) as f64,
                t,
            );
            if let Some(started) = spec.started.filter(|s| t >= *s) {
                emit(
                    "kube_pod_start_time",
                    &with(&[]),
                    (base + started) as f64,
                    t,
                );
            }
            if spec.completes() && t >= spec.ended {
                emit(
                    "kube_pod_completion_time",
                    &with(&[]),
                    (base + spec.ended) as f64,
                    t,
                );
            }
            let now = spec.phase_at(t);
            for phase in ["Pending", "Running", "Succeeded", "Failed", "Unknown"] {
                let mut labels = with(&[]);
                labels.push(("phase", phase));
                emit(
                    "kube_pod_status_phase",
                    &labels,
                    f64::from(u8::from(now == phase)),
                    t,
                );
            }
            let mut labels = with(&[("owner_is_controller", "true")]);
            labels.push(("owner_kind", owner_kind));
            labels.push(("owner_name", owner));
            emit("kube_pod_owner", &labels, 1.0, t);
            let mut labels = with(&[]);
            if let Some(job) = &spec.job {
                labels.push(("label_job_name", job));
            }
            if let Some(team) = spec.team {
                labels.push(("label_team", team));
            }
            emit("kube_pod_labels", &labels, 1.0, t);
            for (resource, amount) in &spec.resources {
                for name in [
                    "kube_pod_container_resource_requests",
                    "kube_pod_container_resource_limits",
                ] {
                    let mut labels = with(&[("container", "main"), ("unit", "integer")]);
                    labels.push(("resource", resource));
                    labels.push(("node", spec.node));
                    emit(name, &labels, *amount as f64, t);
                }
            }
            let mut labels = with(&[("container", "main"), ("resource", "cpu"), ("unit", "core")]);
            labels.push(("node", spec.node));
            emit("kube_pod_container_resource_requests", &labels, 2.0, t);
            emit(
                "kube_pod_container_status_restarts_total",
                &with(&[("container", "main")]),
                f64::from(spec.restarts),
                t,
            );
            if spec.restarts > 0 {
                emit(
                    "kube_pod_container_status_last_terminated_reason",
                    &with(&[("container", "main"), ("reason", "OOMKilled")]),
                    1.0,
                    t,
                );
            }
            let over = t >= spec.ended && spec.end != End::Running;
            let reason = match spec.end {
                End::Succeeded => Some("Completed"),
                End::Failed(reason) => Some(reason),
                _ => None,
            };
            if let Some(reason) = reason.filter(|_| over) {
                emit(
                    "kube_pod_container_status_terminated_reason",
                    &with(&[("container", "main"), ("reason", reason)]),
                    1.0,
                    t,
                );
            }
            for reason in ["Evicted", "UnexpectedAdmissionError"] {
                let on = over
                    && match spec.end {
                        End::Evicted => reason == "Evicted",
                        End::NeverStarted => reason == "UnexpectedAdmissionError",
                        _ => false,
                    };
                emit(
                    "kube_pod_status_reason",
                    &with(&[("reason", reason)]),
                    f64::from(u8::from(on)),
                    t,
                );
            }
            let mut labels = with(&[("created_by_kind", owner_kind)]);
            labels.push(("node", spec.node));
            emit("kube_pod_info", &labels, 1.0, t);
        }
        let seed = seed_of(spec);
        for (i, gpu) in spec.gpus.iter().enumerate() {
            let index = i.to_string();
            let uuid = format!("GPU-{}-{i}", spec.name);
            let mut labels: Vec<(&str, &str)> = vec![
                ("gpu", &index),
                ("UUID", &uuid),
                ("modelName", gpu.model),
                ("Hostname", spec.node),
                ("container", "main"),
                ("namespace", spec.namespace),
                ("pod", &spec.name),
            ];
            if let Some(profile) = gpu.mig {
                labels.push(("GPU_I_PROFILE", profile));
                labels.push(("GPU_I_ID", "1"));
            }
            for (k, &t) in spec.dcgm_times().iter().enumerate() {
                if let Some(counters) = &spec.counters {
                    let _ = writeln!(
                        energy,
                        "{} {} {}",
                        series(ENERGY, &labels),
                        counters.millijoules(i, k),
                        base + t
                    );
                }
                if gpu.mig.is_none() {
                    emit("DCGM_FI_DEV_GPU_UTIL", &labels, util(seed, i, k), t);
                }
                emit(
                    "DCGM_FI_DEV_FB_USED",
                    &labels,
                    fb_used(seed, i, k, gpu.memory_mib),
                    t,
                );
                if gpu.profiling {
                    emit(
                        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                        &labels,
                        util(seed, i, k) / 100.0,
                        t,
                    );
                    emit("DCGM_FI_PROF_SM_ACTIVE", &labels, sm(seed, i, k), t);
                    emit(
                        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
                        &labels,
                        tensor(seed, i, k),
                        t,
                    );
                    emit("DCGM_FI_PROF_DRAM_ACTIVE", &labels, dram(seed, i, k), t);
                }
            }
        }
    }
    for t in (DATA_START..=DATA_END).step_by(SCRAPE as usize) {
        for node in NODES {
            let mut labels = vec![
                ("node", node.name),
                ("label_nvidia_com_gpu_product", "NVIDIA-A100-SXM4-80GB"),
                (node.pool_label, node.pool),
            ];
            if node.spot {
                labels.push(("label_karpenter_sh_capacity_type", "spot"));
            }
            emit("kube_node_labels", &labels, 1.0, t);
            let provider_id = format!("gce://proj/us-central1-a/{}", node.name);
            emit(
                "kube_node_info",
                &[("node", node.name), ("provider_id", &provider_id)],
                1.0,
                t,
            );
            let gpus = node.gpus.to_string();
            for resource in ["nvidia_com_gpu", "cpu"] {
                let amount = if resource == "cpu" {
                    64.0
                } else {
                    f64::from(node.gpus)
                };
                emit(
                    "kube_node_status_capacity",
                    &[("node", node.name), ("resource", resource), ("unit", &gpus)],
                    amount,
                    t,
                );
            }
            let during = |(from, until): (i64, i64)| t >= from && t < until;
            emit(
                "kube_node_spec_unschedulable",
                &[("node", node.name)],
                f64::from(u8::from(node.cordoned.is_some_and(during))),
                t,
            );
            let ready = !node.not_ready.is_some_and(during);
            for status in ["true", "false", "unknown"] {
                let on = (status == "true") == ready && status != "unknown";
                emit(
                    "kube_node_status_condition",
                    &[
                        ("node", node.name),
                        ("condition", "Ready"),
                        ("status", status),
                    ],
                    f64::from(u8::from(on)),
                    t,
                );
            }
        }
        emit(
            "kube_node_status_capacity",
            &[
                ("node", "cpu-node-1"),
                ("resource", "cpu"),
                ("unit", "core"),
            ],
            64.0,
            t,
        );
    }
    if !energy.is_empty() {
        families.insert(ENERGY, energy);
    }
    let mut text = String::new();
    for (name, lines) in families {
        let _ = writeln!(text, "# TYPE {name} gauge");
        text.push_str(&lines);
    }
    text.push_str("# EOF\n");
    text
}

/// A GPU node kube-state-metrics reports all day.
struct Node {
    name: &'static str,
    gpus: u32,
    /// The label naming its pool, as kube-state-metrics exports it, and the pool.
    pool_label: &'static str,
    pool: &'static str,
    spot: bool,
    /// When it was cordoned, from and until (offsets from the day's start).
    cordoned: Option<(i64, i64)>,
    /// When it was not Ready.
    not_ready: Option<(i64, i64)>,
}

const NODES: [Node; 3] = [
    Node {
        name: "gpu-node-1",
        gpus: 8,
        pool_label: "label_cloud_google_com_gke_nodepool",
        pool: "train",
        spot: false,
        cordoned: None,
        not_ready: None,
    },
    Node {
        name: "gpu-node-2",
        gpus: 8,
        pool_label: "label_cloud_google_com_gke_nodepool",
        pool: "train",
        spot: false,
        cordoned: None,
        not_ready: Some((7 * HOUR + 45 * MINUTE, 8 * HOUR + 15 * MINUTE)),
    },
    Node {
        name: "gpu-node-9",
        gpus: 4,
        pool_label: "label_karpenter_sh_nodepool",
        pool: "infer",
        spot: true,
        cordoned: Some((3 * HOUR + 10 * MINUTE, 5 * HOUR + 20 * MINUTE)),
        not_ready: None,
    },
];

fn seed_of(spec: &Spec) -> usize {
    spec.name.bytes().map(usize::from).sum()
}

/// The record a spec calls for, with `attempt`, as the ledger shows it.
fn expected(spec: &Spec, attempt: u32, base: i64) -> Value {
    let time = |t: i64| {
        DateTime::<Utc>::from_timestamp(base + t, 0)
            .unwrap()
            .format("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let started = spec.started.unwrap();
    let ended = spec.record_end();
    let model = |gpu: &Gpu| match gpu.model {
        "NVIDIA A100-SXM4-80GB" => "A100-80GB",
        other => other,
    };
    let gpu_model = spec.gpus.first().map_or("A100-80GB", model);
    let hami = spec
        .resources
        .iter()
        .any(|(r, _)| *r == "nvidia_com_gpucores");
    let mig = spec.gpus.first().and_then(|gpu| gpu.mig);
    let gpu_count: i64 = spec
        .resources
        .iter()
        .filter(|(r, _)| !r.contains("gpucores") && !r.contains("gpumem"))
        .map(|(_, n)| n)
        .sum();
    let mut record = json!({
        "project": spec.namespace,
        "task_id": spec.job.clone().unwrap_or_else(|| spec.name.clone()),
        "attempt": attempt,
        "gpu_model": gpu_model,
        "gpu_count": if hami { "0.3".to_owned() } else { gpu_count.to_string() },
        "started_at": time(started),
        "ended_at": time(ended),
        "queued_at": time(spec.created),
        "outcome": match spec.end {
            End::Succeeded => "completed",
            End::Failed(_) => "failed",
            End::Evicted => "preempted",
            End::Vanished => "cancelled",
            End::Running | End::NeverStarted => unreachable!(),
        },
        "retries": spec.restarts,
        "mig_profile": mig,
        "nodes": [spec.node],
    });
    let mut labels = json!({"namespace": spec.namespace, "pod": spec.name, "node": spec.node});
    match spec.end {
        End::Failed(reason) => labels["reason"] = json!(reason),
        End::Evicted => labels["reason"] = json!("Evicted"),
        _ => {}
    }
    if let Some(team) = spec.team {
        labels["team"] = json!(team);
    }
    record["labels"] = labels;
    // Each figure: the mean over GPUs of each GPU's mean over the samples in the pod's life.
    let times: Vec<(usize, i64)> = spec
        .dcgm_times()
        .into_iter()
        .enumerate()
        .filter(|(_, t)| *t <= ended)
        .collect();
    let seed = seed_of(spec);
    let mean = |figure: &dyn Fn(usize, usize) -> f64| -> Value {
        let per_gpu: Vec<f64> = (0..spec.gpus.len())
            .map(|g| times.iter().map(|(k, _)| figure(g, *k)).sum::<f64>() / times.len() as f64)
            .collect();
        json!(per_gpu.iter().sum::<f64>() / per_gpu.len() as f64)
    };
    let profiling = spec.gpus.first().is_some_and(|gpu| gpu.profiling);
    let measured = !spec.gpus.is_empty() && !hami;
    record["gpu_util"] = match (measured, mig, profiling) {
        (true, None, _) | (true, Some(_), true) => mean(&|g, k| util(seed, g, k) / 100.0),
        _ => Value::Null,
    };
    for (field, figure) in [
        ("sm_active", sm as fn(usize, usize, usize) -> f64),
        ("tensor_active", tensor),
        ("dram_active", dram),
    ] {
        record[field] = if measured && profiling {
            mean(&|g, k| figure(seed, g, k))
        } else {
            Value::Null
        };
    }
    record["memory_peak_gib"] = if measured {
        let peak = (0..spec.gpus.len())
            .flat_map(|g| {
                times
                    .iter()
                    .map(move |(k, _)| fb_used(seed, g, *k, spec.gpus[g].memory_mib))
            })
            .fold(0.0, f64::max);
        json!(peak / 1024.0)
    } else {
        Value::Null
    };
    record
}

/// Compares a stored record with the expected one: times and texts exactly, figures to 1e-6.
fn assert_record(stored: &Value, expected: &Value) {
    let name = format!("{}/{}", expected["task_id"], expected["attempt"]);
    for (field, want) in expected.as_object().unwrap() {
        let got = &stored[field];
        let number = |value: &Value| -> Option<f64> {
            value
                .as_str()
                .map_or_else(|| value.as_f64(), |text| text.parse().ok())
        };
        match field.as_str() {
            "gpu_util" | "sm_active" | "tensor_active" | "dram_active" | "memory_peak_gib" => {
                match (number(got), want.as_f64()) {
                    (None, None) => assert!(got.is_null(), "{name} {field}: {got}"),
                    (Some(got), Some(want)) => assert!(
                        (got - want).abs() <= 1e-6,
                        "{name} {field}: stored {got}, expected {want}"
                    ),
                    _ => panic!("{name} {field}: stored {got}, expected {want}"),
                }
            }
            "retries" | "attempt" => assert_eq!(number(got), number(want), "{name} {field}"),
            _ => assert_eq!(got, want, "{name} {field}"),
        }
    }
}

/// Writes the OpenMetrics file, has promtool build the TSDB from it and starts Prometheus on
/// that TSDB.
async fn prometheus_with(specs: &[Spec], base: i64, dir: &Path) -> prometheus::Process {
    let file = dir.join("pods.om");
    std::fs::write(&file, openmetrics(specs, base)).unwrap();
    let data = dir.join("data");
    let output = tokio::process::Command::new("promtool")
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&file)
        .arg(&data)
        .output()
        .await
        .expect("promtool runs (Debian's `prometheus` package has it)");
    assert!(
        output.status.success(),
        "promtool: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, "global:\n  scrape_interval: 1m\n").unwrap();
    let process = prometheus::start(&config, &data, &["--storage.tsdb.retention.time=30d"]);
    process.ready(Duration::from_secs(60)).await;
    process
}

async fn collect(
    app: &TestApp,
    prometheus: &str,
    state: &Path,
    window: (&str, &str),
    server: Option<(&str, &str)>,
    extra: &[&str],
) -> (bool, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskledger"));
    command
        .env_remove("TASKLEDGER_SERVER")
        .args(["--database-url", &app.database_url, "collect", "prometheus"])
        .args(["--prometheus", prometheus])
        .arg("--state")
        .arg(state)
        .args(["--since", window.0, "--until", window.1])
        .args(["--label", "team"])
        .args(["--gpu-model", "NVIDIA A100-SXM4-80GB=A100-80GB"])
        .args(["--gpu-model", "NVIDIA-A100-SXM4-80GB=A100-80GB"])
        .args(extra);
    if let Some((url, token)) = server {
        command
            .args(["--server", url])
            .env("TASKLEDGER_TOKEN", token);
    }
    let output = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.success(), format!("{stdout}{stderr}"))
}

async fn record_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM job_records")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// The start of the day the test reads: a whole hour, 27 hours ago, so that the day ended
/// well before now and lies inside Prometheus' retention.
fn day_start() -> i64 {
    let now = Utc::now().timestamp();
    now - now.rem_euclid(HOUR) - 27 * HOUR
}

fn at(base: i64, offset: i64) -> String {
    DateTime::<Utc>::from_timestamp(base + offset, 0)
        .unwrap()
        .to_rfc3339()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_prometheus_makes_the_records_the_pods_call_for_once_over_overlapping_windows() {
    let app = TestApp::spawn().await;
    for project in ["vision", "nlp", "research"] {
        app.create_project(project, "USD").await;
    }
    for (pool, owner) in [("train", "vision"), ("infer", "nlp")] {
        let body = json!({"name": pool, "owner_project": owner});
        let response = app
            .put(&format!("/v1/pools/{pool}"), &app.admin, body)
            .await;
        assert!(response.status.is_success(), "{}", response.text());
    }
    let token = app.token("ingest", &["vision", "nlp", "research"]).await;
    let served = app.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let base = day_start();
    let specs = specs();
    let prometheus = prometheus_with(&specs, base, dir.path()).await;
    let state = dir.path().join("prometheus.state");

    let first = (at(base, 0), at(base, 14 * HOUR));
    let (ok, out) = collect(
        &app,
        &prometheus.url,
        &state,
        (&first.0, &first.1),
        None,
        &[],
    )
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("pods seen 21, records 15: accepted 15, duplicates 0"),
        "{out}"
    );
    // Two pods still run at 14:00 (one of a retried Job), one GPU pod never started.
    assert!(
        out.contains("skipped: missing start time 1, no GPU 3, still running 2"),
        "{out}"
    );
    assert!(
        out.contains(
            "telemetry on 1 job (measured for the whole shared GPU, not for the pod's share)"
        ),
        "{out}"
    );
    // Fourteen whole hours of three GPU nodes, two of which changed state within two hours.
    assert!(
        out.contains("capacity: hours 14, nodes 3, intervals 46: inserted 46, duplicates 0"),
        "{out}"
    );
    let second = (at(base, 12 * HOUR), at(base, DATA_END));
    let (ok, out) = collect(
        &app,
        &prometheus.url,
        &state,
        (&second.0, &second.1),
        Some((&served.url(), &token)),
        &[],
    )
    .await;
    assert!(ok, "{out}");
    // The pod that finished at 13:02 was in both windows.
    assert!(
        out.contains("pods seen 13, records 10: accepted 9, duplicates 1"),
        "{out}"
    );
    assert!(out.contains("skipped: no GPU 2, still running 1"), "{out}");
    assert!(
        out.contains("capacity: hours 12, nodes 3, intervals 36: inserted 30, duplicates 6"),
        "{out}"
    );
    // The day's capacity, node by node: what was paid, and what of it could run nothing.
    let seconds: Vec<(String, String, String, String, String, i64)> = sqlx::query_as(
        "SELECT node, state, pool_id, billing_mode, coalesce(provider, ''), \
                sum(gpus * extract(epoch FROM until_at - from_at))::bigint \
         FROM capacity_intervals GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let row = |node: &str, state: &str, pool: &str, mode: &str, gpu_seconds: i64| {
        (
            node.to_owned(),
            state.to_owned(),
            pool.to_owned(),
            mode.to_owned(),
            "gcp".to_owned(),
            gpu_seconds,
        )
    };
    assert_eq!(
        seconds,
        [
            row("gpu-node-1", "up", "train", "on_demand", 8 * 24 * HOUR),
            row("gpu-node-2", "down", "train", "on_demand", 8 * 30 * MINUTE),
            row(
                "gpu-node-2",
                "up",
                "train",
                "on_demand",
                8 * (24 * HOUR - 30 * MINUTE)
            ),
            row(
                "gpu-node-9",
                "down",
                "infer",
                "spot",
                4 * (2 * HOUR + 10 * MINUTE)
            ),
            row(
                "gpu-node-9",
                "up",
                "infer",
                "spot",
                4 * (24 * HOUR - 130 * MINUTE)
            ),
        ]
    );
    let cordoned: (DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "SELECT min(from_at), max(until_at) FROM capacity_intervals \
         WHERE node = 'gpu-node-9' AND state = 'down'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        cordoned,
        (
            DateTime::from_timestamp(base + 3 * HOUR + 10 * MINUTE, 0).unwrap(),
            DateTime::from_timestamp(base + 5 * HOUR + 20 * MINUTE, 0).unwrap()
        )
    );
    let stored: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(
        stored["until"]
            .as_str()
            .map(|t| t.parse::<DateTime<Utc>>().unwrap()),
        DateTime::from_timestamp(base + DATA_END, 0)
    );

    // Every pod that ran on GPUs and finished in the day, once.
    let recorded: Vec<&Spec> = specs
        .iter()
        .filter(|s| !s.gpus.is_empty() || s.resources.iter().any(|(r, _)| r.starts_with("nvidia")))
        .filter(|s| !matches!(s.end, End::Running | End::NeverStarted) && s.ended > 0)
        .collect();
    assert_eq!(record_count(&app).await, recorded.len() as i64);
    let mut attempts: BTreeMap<(String, String), u32> = BTreeMap::new();
    for spec in &recorded {
        let task = spec.job.clone().unwrap_or_else(|| spec.name.clone());
        let attempt = attempts
            .entry((spec.namespace.to_owned(), task.clone()))
            .or_default();
        *attempt += 1;
        let response = app
            .get(
                &format!(
                    "/v1/projects/{}/job-records/{task}/{attempt}",
                    spec.namespace
                ),
                &app.admin,
            )
            .await;
        assert_eq!(response.status, 200, "{}: {}", spec.name, response.text());
        assert_record(&response.json()["record"], &expected(spec, *attempt, base));
    }

    // The whole day again, read whole and then a page of about two pods at a time: the same
    // pods, the same records, all of them already stored.
    let day = (at(base, 0), at(base, DATA_END));
    let mut summaries = Vec::new();
    for pages in [&[][..], &["--page-pods", "2"]] {
        let (ok, out) = collect(
            &app,
            &prometheus.url,
            &dir.path().join("again.state"),
            (&day.0, &day.1),
            None,
            pages,
        )
        .await;
        assert!(ok, "{out}");
        assert!(
            out.contains(&format!(
                "records {}: accepted 0, duplicates {}",
                recorded.len(),
                recorded.len()
            )),
            "{out}"
        );
        summaries.push(out);
    }
    let pages = summaries[1]
        .lines()
        .find_map(|line| line.strip_prefix("read and delivered in "))
        .and_then(|rest| rest.strip_suffix(" pages"))
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| panic!("{}", summaries[1]));
    assert!(pages >= 5, "{}", summaries[1]);
    assert!(!summaries[0].contains(" pages"), "{}", summaries[0]);
    assert_eq!(
        summaries[0],
        summaries[1].replace(&format!("read and delivered in {pages} pages\n"), "")
    );

    // Prometheus failing halfway: the pages read before are delivered, the run fails saying
    // so, and the state stays where it was.
    let failing = failing_after(&prometheus.url, 40).await;
    let halfway = dir.path().join("halfway.state");
    let (ok, out) = collect(
        &app,
        &failing,
        &halfway,
        (&day.0, &day.1),
        None,
        &["--page-pods", "2"],
    )
    .await;
    assert!(!ok, "{out}");
    assert!(out.contains("answered 503 Service Unavailable"), "{out}");
    assert!(
        out.contains("capacity intervals read before it were delivered (0 and 0 stored, "),
        "{out}"
    );
    assert!(!halfway.exists());
    assert_eq!(record_count(&app).await, recorded.len() as i64);
    served.stop().await;
}

/// Four GPU pods whose GPUs report DCGM's energy counter, from `from` on (offsets from the
/// day's start). Their samples are on the 30 s grid, never at a start or an end.
fn energy_specs(from: i64) -> Vec<Spec> {
    let mig = Gpu {
        mig: Some("3g.40gb"),
        memory_mib: 40960,
        ..A100
    };
    vec![
        // Samples at +1:00:30 … +2:00:30: 120 intervals of 30 s at 400 W and 300 W.
        Spec::new(
            "vision",
            "train-e-1",
            from + HOUR + 17,
            from + 2 * HOUR + 43,
        )
        .job("train-e")
        .gpus(A100, 2)
        .energy(&[400, 300], None),
        // Samples at +3:00:30 … +3:40:00: 79 intervals at 700, 700, 650 and 650 W.
        Spec::new(
            "vision",
            "train-f-1",
            from + 3 * HOUR + 7,
            from + 3 * HOUR + 40 * MINUTE + 29,
        )
        .job("train-f")
        .gpus(H100, 4)
        .energy(&[700, 700, 650, 650], None),
        // Its driver reloaded halfway: the counter starts again from 0 at its 60th sample.
        Spec::new(
            "vision",
            "reload-1",
            from + 2 * HOUR + 11,
            from + 3 * HOUR + 19,
        )
        .job("reload")
        .gpus(A100, 1)
        .energy(&[400], Some(60)),
        // A MIG instance: the counter is the whole card's.
        Spec {
            resources: vec![("nvidia_com_mig_3g_40gb", 1)],
            gpus: vec![mig],
            ..Spec::new(
                "vision",
                "mig-e-1",
                from + HOUR + 29,
                from + 2 * HOUR + 2 * MINUTE + 17,
            )
            .job("mig-e")
            .energy(&[250], None)
        },
    ]
}

/// Runs `collect prometheus --no-capacity` for project `vision` over five hours of pods from
/// `specs(from)`, posting to a served app: the pods lie within one UTC day, so within one
/// month (after midnight where the day's start is too close to it). Returns the app, the
/// specs, what the collector printed, and the day's start with `from`.
async fn collected_energy(specs: fn(i64) -> Vec<Spec>) -> (TestApp, Vec<Spec>, String, (i64, i64)) {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let token = app.token("ingest", &["vision"]).await;
    let served = app.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let base = day_start();
    let midnight = 24 * HOUR - base.rem_euclid(24 * HOUR);
    let from = if midnight <= 4 * HOUR { midnight } else { 0 };
    let specs = specs(from);
    let prometheus = prometheus_with(&specs, base, dir.path()).await;
    let state = dir.path().join("prometheus.state");
    let window = (at(base, from), at(base, from + 5 * HOUR));
    let (ok, out) = collect(
        &app,
        &prometheus.url,
        &state,
        (&window.0, &window.1),
        Some((&served.url(), &token)),
        &["--no-capacity"],
    )
    .await;
    served.stop().await;
    assert!(ok, "{out}");
    (app, specs, out, (base, from))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_prometheus_posts_each_pods_dcgm_energy_but_not_over_a_reset_or_a_slice() {
    let (app, _, out, (base, from)) = collected_energy(energy_specs).await;
    assert!(
        out.contains("pods seen 4, records 4: accepted 4, duplicates 0"),
        "{out}"
    );
    let left_out: Vec<&str> = out
        .lines()
        .filter(|line| line.contains("left out"))
        .collect();
    assert_eq!(
        left_out,
        [
            "telemetry read but left out (the jobs are stored without it): \
          energy_joules on 1 job (a GPU's counter went down during the pod's life \
          (driver reload or GPU reset)); \
          energy_joules on 1 job (a MIG instance: DCGM counts the whole card's energy)"
        ],
        "{out}"
    );

    let energy = |task: &'static str| {
        let app = &app;
        let path = format!("/v1/projects/vision/job-records/{task}/1");
        async move {
            let response = app.get(&path, &app.admin).await;
            assert_eq!(response.status, 200, "{task}: {}", response.text());
            response.json()["record"]["energy_joules"].clone()
        }
    };
    // 120 × 30 s × (400 + 300) W = 120 × 21,000 J = 2,520,000 J.
    assert_eq!(energy("train-e").await, "2520000");
    // 79 × 30 s × (700 + 700 + 650 + 650) W = 79 × 81,000 J = 6,399,000 J.
    assert_eq!(energy("train-f").await, "6399000");
    assert_eq!(energy("reload").await, Value::Null);
    assert_eq!(energy("mig-e").await, Value::Null);

    // The month's measured energy: (2,520,000 + 6,399,000) J = 8,919,000 J
    // ÷ 3,600,000 J/kWh = 2.4775 kWh.
    let month = DateTime::<Utc>::from_timestamp(base + from, 0)
        .unwrap()
        .format("%Y-%m");
    let view = cost(&app, &format!("/v1/projects/vision/cost?month={month}")).await;
    assert_money(&view["energy"]["kwh"], "2.4775");
}

/// A StatefulSet's pod `trainer-0` re-created on the same GPU, from `from` on (offsets from
/// the day's start). dcgm-exporter, scraped 15 s after kube-state-metrics, exports no
/// `pod_uid`, so both pods' counter readings are one series.
fn recreated_specs(from: i64) -> Vec<Spec> {
    let trainer = |started: i64, ended: i64| Spec {
        dcgm_phase: 15,
        ..Spec::new("vision", "trainer-0", from + started, from + ended).gpus(A100, 1)
    };
    vec![
        // Samples at +1:00:45 … +1:30:15 at 300 W, counting from 310,000,000,000 mJ; the
        // last step of its life (+1:30:00) reads +1:29:45, so 58 intervals of 30 s count.
        // Deleted as it ended, before its successor was created.
        Spec {
            linger: 20,
            ..trainer(HOUR + 17, HOUR + 30 * MINUTE + 20).energy(&[300], None)
        },
        // Started 2 minutes after the first ended, before a resolution step (+1:32:30) that
        // comes before its first sample (+1:32:45). Samples at +1:32:45 … +2:39:45: 134
        // intervals at 400 W, from 311,000,000,000 mJ, 469,000 J above the first pod's last
        // reading (310,531,000,000 mJ at +1:30:15).
        Spec {
            recreated: 1,
            ..trainer(HOUR + 32 * MINUTE + 20, 2 * HOUR + 40 * MINUTE + 10)
                .energy(&[400], None)
                .counted_from(311_000_000_000)
        },
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_prometheus_counts_no_energy_of_an_earlier_pod_of_the_same_name_on_the_gpu() {
    let (app, specs, out, (base, _)) = collected_energy(recreated_specs).await;
    assert!(
        out.contains("pods seen 2, records 2: accepted 2, duplicates 0"),
        "{out}"
    );
    assert!(!out.contains("left out"), "{out}");

    for (attempt, spec) in (1..).zip(&specs) {
        let path = format!("/v1/projects/vision/job-records/trainer-0/{attempt}");
        let response = app.get(&path, &app.admin).await;
        assert_eq!(response.status, 200, "{path}: {}", response.text());
        let record = &response.json()["record"];
        // The averages read only the samples of the pod's own life.
        assert_record(record, &expected(spec, attempt, base));
        let energy = &record["energy_joules"];
        match attempt {
            // 58 × 30 s × 300 W = 522,000 J.
            1 => assert_eq!(energy, "522000"),
            // 134 × 30 s × 400 W = 1,608,000 J: its own readings only. The first pod's last
            // reading, 2 min 15 s before the step at +1:32:30, is within Prometheus' lookback
            // there; counted, it would add the 469,000 J between the pods (2,077,000 J).
            _ => assert_eq!(energy, "1608000"),
        }
    }
}

/// A proxy to Prometheus at `upstream` that passes on the first `answered` queries and
/// answers every later one with 503; returns its URL.
async fn failing_after(upstream: &str, answered: usize) -> String {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let upstream = upstream.trim_end_matches('/').to_owned();
    let seen = Arc::new(AtomicUsize::new(0));
    let client = reqwest::Client::new();
    let proxy = axum::Router::new().fallback(
        move |uri: axum::http::Uri, headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let (seen, client, upstream) = (seen.clone(), client.clone(), upstream.clone());
            async move {
                if seen.fetch_add(1, Ordering::SeqCst) >= answered {
                    return (
                        axum::http::StatusCode::SERVICE_UNAVAILABLE,
                        "unavailable".to_owned(),
                    );
                }
                let mut request = client.post(format!("{upstream}{uri}")).body(body);
                if let Some(kind) = headers.get("content-type") {
                    request = request.header("content-type", kind.as_bytes());
                }
                let answer = request.send().await.unwrap();
                let status = axum::http::StatusCode::from_u16(answer.status().as_u16()).unwrap();
                (status, answer.text().await.unwrap())
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, proxy).await });
    format!("http://{address}")
}

/// How a stand-in for Prometheus answers.
#[derive(Clone, Copy)]
enum Fake {
    /// Never answers.
    Silent,
    /// Answers what Prometheus answers when a query ran out of time.
    TimedOut,
    /// Answers something that is not Prometheus' JSON.
    Garbage,
    /// Answers a range vector where an instant vector belongs.
    Matrix,
    /// Answers more than the collector reads, saying so in its Content-Length.
    Huge,
    /// Answers more than the collector reads, without a Content-Length.
    HugeUntold,
    /// Answers a million numbers where the series belong.
    Numbers,
}

/// Serves `fake` on a loopback port; returns its URL.
async fn fake_prometheus(fake: Fake) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let (status, body) = match fake {
                    Fake::Silent => {
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        return;
                    }
                    Fake::TimedOut => (
                        "503 Service Unavailable",
                        r#"{"status":"error","errorType":"timeout","error":"query timed out in expression evaluation"}"#.to_owned(),
                    ),
                    Fake::Garbage => ("200 OK", "<html><body>Bad Gateway</body></html>".to_owned()),
                    Fake::Matrix => (
                        "200 OK",
                        r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#.to_owned(),
                    ),
                    Fake::Huge | Fake::HugeUntold => {
                        // 65 MiB of series, sent without being built whole.
                        let head = if matches!(fake, Fake::Huge) {
                            format!("content-length: {}\r\n", 65 * 1024 * 1024)
                        } else {
                            String::new()
                        };
                        let _ = socket
                            .write_all(
                                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n{head}connection: close\r\n\r\n")
                                    .as_bytes(),
                            )
                            .await;
                        let block = vec![b' '; 1024 * 1024];
                        for _ in 0..65 {
                            if socket.write_all(&block).await.is_err() {
                                return;
                            }
                        }
                        return;
                    }
                    Fake::Numbers => (
                        "200 OK",
                        format!(
                            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
                            vec!["0"; 1_000_000].join(",")
                        ),
                    ),
                };
                let response = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{address}")
}

#[tokio::test]
async fn collect_prometheus_fails_clearly_and_keeps_its_state_when_prometheus_does() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("prometheus.state");
    let kept = r#"{"collector": "prometheus", "until": "2026-01-01T00:00:00Z"}"#;
    std::fs::write(&state, kept).unwrap();
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    for (url, expected) in [
        (down, "cannot reach Prometheus"),
        (fake_prometheus(Fake::Silent).await, "no answer within 2 s"),
        (
            fake_prometheus(Fake::TimedOut).await,
            "answered 503 Service Unavailable: Prometheus answered timeout: query timed out",
        ),
        (
            fake_prometheus(Fake::Garbage).await,
            "the answer is not JSON",
        ),
        (
            fake_prometheus(Fake::Matrix).await,
            "is a `matrix`, not an instant vector",
        ),
        (
            fake_prometheus(Fake::Huge).await,
            "the answer is larger than 64 MiB; narrow --selector or collect shorter windows (--since, --until)",
        ),
        (
            fake_prometheus(Fake::HugeUntold).await,
            "the answer is larger than 64 MiB",
        ),
        (
            fake_prometheus(Fake::Numbers).await,
            "the answer is not an instant vector of series",
        ),
    ] {
        // A password in the URL is never printed.
        let url = url.replacen("http://", "http://admin:hunter2@", 1);
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskledger"));
        command
            .env_remove("TASKLEDGER_SERVER")
            .args(["--database-url", &app.database_url, "collect", "prometheus"])
            .args(["--prometheus", &url, "--query-timeout", "1s"])
            .arg("--state")
            .arg(&state)
            .args([
                "--until",
                "2026-01-02T00:00:00Z",
                "--since",
                "2026-01-01T00:00:00Z",
            ]);
        let output = command.output().await.unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{url}: {stderr}");
        assert!(stderr.contains(expected), "{url}: {stderr}");
        assert!(stderr.contains("the query was: "), "{url}: {stderr}");
        assert!(!stderr.contains("hunter2"), "{url}: {stderr}");
        assert!(stderr.contains("admin:***@"), "{url}: {stderr}");
        assert_eq!(std::fs::read_to_string(&state).unwrap(), kept, "{url}");
        assert_eq!(record_count(&app).await, 0, "{url}");
    }
}

#[tokio::test]
async fn collect_every_keeps_running_past_a_failed_run_until_sigterm() {
    let app = TestApp::spawn().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("prometheus.state");
    let kept = r#"{"collector": "prometheus", "until": "2026-01-01T00:00:00Z"}"#;
    std::fs::write(&state, kept).unwrap();
    let url = fake_prometheus(Fake::Garbage).await;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
        .env_remove("TASKLEDGER_SERVER")
        .args(["--database-url", &app.database_url, "collect", "prometheus"])
        .args(["--prometheus", &url, "--every", "1s"])
        .arg("--state")
        .arg(&state)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let pid = nix::unistd::Pid::from_raw(child.id().unwrap() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let output = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("SIGTERM stops it")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.matches("error: ").count() >= 2,
        "each run failed and the next one ran: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no colour codes when not written to a terminal: {stderr}"
    );
    assert_eq!(std::fs::read_to_string(&state).unwrap(), kept);
}
