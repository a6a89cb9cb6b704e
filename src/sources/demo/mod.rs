//! The demo's data: five weeks of a real GPU cluster (Alibaba's `cluster-trace-gpu-v2023`,
//! see [`trace`]) replayed as the job records of five projects over the month before a given
//! instant and the month up to it, with the contracts, FX rates and budget targets that make
//! every part of the ledger show something. `docs/demo.md` tells what comes from the trace
//! and what is made up; this module is that table as code.
//!
//! Pure and deterministic: the same window gives the same records, byte for byte.

pub mod trace;

use std::collections::BTreeMap;
use std::ops::Range;

use chrono::{DateTime, Months, TimeDelta, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::domain::ledger_time::month_bounds;
use crate::domain::rating::{BillingMode, Outcome};
use crate::domain::record::format_time;
use crate::domain::tco::Tco;
use crate::domain::values::Month;
use crate::sources::batch::{SourceBatch, SourceRecord};

use self::trace::{ModelCapacity, Node, Phase, Pod, Qos};

/// Skip reasons, as the load's summary names them.
pub const NO_GPU: &str = "no GPU";
pub const NEVER_SCHEDULED: &str = "never scheduled";
pub const STILL_RUNNING: &str = "still running at the end of the trace";
pub const RAN_NO_TIME: &str = "ran for no time";

/// The part of the trace replayed: its last 36 days, which hold all but a handful of its
/// pods (the rest of its 149 days is nearly empty).
pub const REPLAYED_DAYS: i64 = 36;
/// A failed pod followed, within this many seconds of its deletion, by the next pod of the
/// same workload is retried by it: they are attempts of one task. The trace's failed pods
/// are mostly crash loops; six hours catches the resubmissions that then ran to the end.
pub const RETRY_WITHIN_SECONDS: i64 = 6 * 3600;
/// The most attempts one task gets; a crash loop longer than that starts a new task.
pub const MAX_ATTEMPTS: i32 = 5;
/// A best-effort pod that failed after running at least this long (trace seconds) was
/// evicted, not crashed: it is `preempted`.
pub const PREEMPTED_AFTER_SECONDS: i64 = 600;
/// A run longer than this is recorded in pieces of this length, each a task of its own (a
/// long-running service is accounted week by week).
pub const LONGEST_RECORD: TimeDelta = TimeDelta::days(7);

/// Where the demo's records come from, for each record's location.
const SOURCE: &str = "openb_pod_list_default.csv";

/// A project of the demo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoProject {
    pub id: &'static str,
    pub name: &'static str,
    /// The team owning the project.
    pub team: &'static str,
    pub currency: &'static str,
    /// The `team` labels its workloads are dealt to, in turn.
    pub teams: [&'static str; 2],
    /// The unit of its output.
    pub unit: &'static str,
    /// Units produced per busy GPU-hour of an A100.
    pub output_per_busy_hour: u64,
    /// What its spend reaches of its budget in the complete month, in percent: its monthly
    /// budget is set from that month's spend so that it does.
    pub target_burn_pct: u32,
}

/// The projects: one overspends (past 100 %), two cross 80 %, one 50 %, one stays under; one
/// is billed in euros.
pub const PROJECTS: [DemoProject; 5] = [
    DemoProject {
        id: "llm",
        name: "Language models",
        team: "ml-research",
        currency: "USD",
        teams: ["pretraining", "alignment"],
        unit: "tokens",
        output_per_busy_hour: 4_000_000,
        target_burn_pct: 112,
    },
    DemoProject {
        id: "vision",
        name: "Vision",
        team: "ml-research",
        currency: "USD",
        teams: ["detection", "generation"],
        unit: "images",
        output_per_busy_hour: 120_000,
        target_burn_pct: 86,
    },
    DemoProject {
        id: "recsys",
        name: "Recommendations",
        team: "growth",
        currency: "USD",
        teams: ["ranking", "retrieval"],
        unit: "samples",
        output_per_busy_hour: 25_000_000,
        target_burn_pct: 64,
    },
    DemoProject {
        id: "speech",
        name: "Speech",
        team: "voice",
        currency: "EUR",
        teams: ["asr", "tts"],
        unit: "utterances",
        output_per_busy_hour: 300_000,
        target_burn_pct: 93,
    },
    DemoProject {
        id: "search",
        name: "Search",
        team: "search",
        currency: "USD",
        teams: ["indexing", "serving"],
        unit: "queries",
        output_per_busy_hour: 2_000_000,
        target_burn_pct: 41,
    },
];

/// A GPU model of the trace and what the demo makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoModel {
    /// The trace's code (`G2`, `V100M32`).
    pub code: &'static str,
    /// The model the records name.
    pub name: &'static str,
    pub memory_gib: u32,
    /// Throughput relative to an A100, in percent: how much output a busy hour yields.
    pub speed_pct: u32,
    /// Whether DCGM's profiling metrics exist for it (not on Pascal cards).
    pub profiled: bool,
    /// List-like prices per GPU-hour in US dollars, in cents.
    pub on_demand_cents: i64,
    pub spot_cents: i64,
}

/// The trace names its models by codes; `G2` and `G3` are undisclosed there, and the demo
/// takes them for an A100 and an H100.
pub const MODELS: [DemoModel; 7] = [
    model("G2", "A100", 40, 100, true, 367, 147),
    model("G3", "H100", 80, 200, true, 688, 245),
    model("V100M16", "V100", 16, 42, true, 306, 92),
    model("V100M32", "V100-32GB", 32, 45, true, 390, 117),
    model("T4", "T4", 16, 18, true, 53, 21),
    model("P100", "P100", 16, 25, false, 146, 43),
    model("A10", "A10", 24, 35, true, 101, 40),
];

const fn model(
    code: &'static str,
    name: &'static str,
    memory_gib: u32,
    speed_pct: u32,
    profiled: bool,
    on_demand_cents: i64,
    spot_cents: i64,
) -> DemoModel {
    DemoModel {
        code,
        name,
        memory_gib,
        speed_pct,
        profiled,
        on_demand_cents,
        spot_cents,
    }
}

/// The model whose latency-sensitive pods run on the company's own cards, bought three
/// years before the demo and priced by what they cost (see [`owned_a100`]).
pub const RESERVED_MODEL: &str = "A100";

/// Where the owned cards stand: the region their records name, and its grid's carbon
/// intensity in gCO2e per kWh.
pub const OWNED_REGION: &str = "dc-frankfurt";
pub const OWNED_REGION_G_CO2E_PER_KWH: i64 = 364;

/// What one of the owned A100s costs: bought for 12,000 USD and sold for 1,500 after three
/// years, drawing 0.4 kW on average at PUE 1.4 and 0.12 USD a kWh, with 95 USD a month of
/// hosting, network and support. They went into service three years before the 10th of the
/// window's current month, so their depreciation ends then and their price drops inside the
/// window.
pub fn owned_a100(window: Window) -> Tco {
    let fully_depreciated = window.boundary + chrono::Duration::days(9);
    Tco {
        purchase_price_per_gpu: Decimal::from(12_000),
        salvage_value_per_gpu: Decimal::from(1_500),
        life_months: 36,
        in_service_from: fully_depreciated
            .checked_sub_months(Months::new(36))
            .expect("months stay within chrono's range"),
        power_kw_per_gpu: Decimal::new(4, 1),
        electricity_price_per_kwh: Decimal::new(12, 2),
        pue: Decimal::new(14, 1),
        other_per_gpu_month: Decimal::from(95),
    }
}

/// The months the demo fills: the complete month before `until`'s and that month up to
/// `until`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub previous: Month,
    pub current: Month,
    /// The first instant of `previous`.
    pub start: DateTime<Utc>,
    /// The first instant of `current`.
    pub boundary: DateTime<Utc>,
    /// Where the data ends: the demo's "now".
    pub until: DateTime<Utc>,
}

impl Window {
    /// The window ending at `until` in the ledger time zone `tz`.
    pub fn ending_at(until: DateTime<Utc>, tz: Tz) -> Self {
        let current = Month::from_first_day(until.with_timezone(&tz).date_naive());
        let previous = Month::from_first_day(
            current
                .first_day()
                .checked_sub_months(Months::new(1))
                .expect("months stay within chrono's range"),
        );
        let (start, boundary) = month_bounds(previous.first_day(), tz);
        Self {
            previous,
            current,
            start,
            boundary,
            until,
        }
    }
}

/// A contract of the demo, in US dollars.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoContract {
    pub name: String,
    pub gpu_model: &'static str,
    pub billing_mode: BillingMode,
    pub price_per_gpu_hour: Decimal,
    pub valid_from: DateTime<Utc>,
    pub valid_until: Option<DateTime<Utc>>,
    pub committed_gpus: Option<Decimal>,
    /// Set on the owned cards' contract, priced by what they cost.
    pub tco: Option<Tco>,
}

/// An FX rate of the demo: one US dollar in `to`, for a month.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoFxRate {
    pub month: Month,
    pub to: &'static str,
    pub rate: Decimal,
}

/// A pool of the demo: the trace's nodes of one model. It has no owner and keeps its idle
/// time on its own line, so the projects' figures are their records' alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoPool {
    pub id: String,
    pub name: String,
    pub gpu_model: &'static str,
}

/// How long a demo node may sit idle before it is a zombie: a day.
pub const ZOMBIE_AFTER_MINUTES: i32 = 24 * 60;

/// Everything the demo loads.
#[derive(Debug, Clone, PartialEq)]
pub struct Demo {
    pub window: Window,
    /// A pool per model.
    pub pools: Vec<DemoPool>,
    /// The trace's nodes, each up over the whole window, as `POST /v1/capacity` takes them.
    pub capacity: Value,
    pub contracts: Vec<DemoContract>,
    pub fx_rates: Vec<DemoFxRate>,
    /// Each project's monthly budget, in its currency, in the order of [`PROJECTS`]: set from
    /// what its records spend in the complete month as the contracts price them, so that it
    /// burns its target share (`None` for a project that spent nothing).
    pub budgets: Vec<(&'static DemoProject, Option<Decimal>)>,
    /// The job records, in the shape `POST /v1/job-records` takes, in the order they ended,
    /// and the pods skipped.
    pub batch: SourceBatch,
    /// When the records were posted: each day's at the end of the day (the last day's at
    /// `until`), as CI would have, so that alerts fire when spend crossed their thresholds.
    pub posts: Vec<Post>,
}

/// The records of `batch.records[records]`, posted at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Post {
    pub at: DateTime<Utc>,
    pub records: Range<usize>,
}

/// The demo over `window`, from the shipped trace.
pub fn demo(window: Window) -> Result<Demo, String> {
    let pods = trace::pods(trace::POD_LIST)?;
    let capacity = trace::capacity(trace::NODE_LIST)?;
    let nodes = trace::nodes(trace::NODE_LIST)?;
    Ok(replay(&pods, &capacity, &nodes, window))
}

/// The demo over `window` from the given pods and node capacity.
pub fn replay(
    pods: &[Pod],
    capacity: &BTreeMap<String, ModelCapacity>,
    nodes: &[Node],
    window: Window,
) -> Demo {
    let timeline = Replay::new(pods, window);
    let mut batch = SourceBatch {
        jobs_read: pods.len(),
        ..SourceBatch::default()
    };
    let mut runs = Vec::new();
    for pod in pods {
        match timeline.run(pod, capacity) {
            Ok(run) => runs.push(run),
            Err(reason) => batch.skip(reason),
        }
    }
    let attempts = tasks(workloads(runs));
    let reserved = committed_gpus(&attempts, window);
    let placed = place(&attempts, nodes);
    let fx_rates: Vec<DemoFxRate> = [window.previous, window.current]
        .into_iter()
        .zip([Decimal::new(8612, 4), Decimal::new(8574, 4)])
        .map(|(month, rate)| DemoFxRate {
            month,
            to: "EUR",
            rate,
        })
        .collect();
    let mut spend: BTreeMap<&'static str, Decimal> = BTreeMap::new();
    let mut ended = Vec::new();
    for attempt in &attempts {
        for piece in attempt.pieces() {
            *spend.entry(attempt.project.id).or_default() +=
                attempt.cost_in(&piece, (window.start, window.boundary), &fx_rates[0]);
            let mut value = attempt.record(&piece);
            if let Some(node) = placed.get(attempt.run.pod.name.as_str()) {
                value["nodes"] = json!([node]);
            }
            ended.push((
                piece.ended,
                SourceRecord {
                    location: piece.location,
                    value,
                },
            ));
        }
    }
    ended.sort_by_key(|(at, _)| *at);
    let posts = posts(&ended, window);
    batch.records = ended.into_iter().map(|(_, record)| record).collect();
    // The trace's pod list is a sample of the cluster's load: the fleet is the nodes the
    // placement put a run on, not every node of the cluster.
    let used: std::collections::BTreeSet<&str> = placed.values().copied().collect();
    let busy_nodes: Vec<Node> = nodes
        .iter()
        .filter(|node| used.contains(node.name.as_str()))
        .cloned()
        .collect();
    let (pools, capacity) = fleet(&busy_nodes, window);
    Demo {
        window,
        pools,
        capacity,
        contracts: contracts(window, reserved),
        budgets: PROJECTS
            .iter()
            .map(|project| {
                let spent = spend.get(project.id).copied().unwrap_or_default();
                (project, budget_for(spent, project.target_burn_pct))
            })
            .collect(),
        fx_rates,
        batch,
        posts,
    }
}

/// The demo model of a trace model code.
fn demo_model(code: &str) -> Option<&'static DemoModel> {
    MODELS.iter().find(|model| model.code == code)
}

/// A node and the runs on it: when each ends, and the thousandths of GPUs it holds.
type NodeLoad<'a> = (&'a Node, Vec<(DateTime<Utc>, u32)>);

/// Places each run on a node of its model, in the order they started: the first node (by
/// name) with enough GPUs free, or else the one with the most free (so the cluster's busiest
/// hours show as overbooked rather than vanish). The trace does not say where its pods ran.
fn place<'a>(attempts: &[Attempt<'a>], nodes: &'a [Node]) -> BTreeMap<&'a str, &'a str> {
    let mut by_model: BTreeMap<&str, Vec<NodeLoad<'_>>> = BTreeMap::new();
    for node in nodes {
        if let Some(model) = demo_model(&node.model) {
            by_model
                .entry(model.name)
                .or_default()
                .push((node, Vec::new()));
        }
    }
    for model_nodes in by_model.values_mut() {
        model_nodes.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    }
    let mut runs: Vec<&Run<'a>> = attempts.iter().map(|a| &a.run).collect();
    runs.sort_by(|a, b| (a.started, &a.pod.name).cmp(&(b.started, &b.pod.name)));
    let mut placed = BTreeMap::new();
    for run in runs {
        let Some(model_nodes) = by_model.get_mut(run.model.name) else {
            continue;
        };
        let needed = run.pod.num_gpu * run.pod.gpu_milli;
        let mut best: Option<(usize, i64)> = None;
        let mut chosen = None;
        for (index, (node, running)) in model_nodes.iter_mut().enumerate() {
            running.retain(|(ends, _)| *ends > run.started);
            let free = i64::from(node.gpus * 1000)
                - running.iter().map(|(_, m)| i64::from(*m)).sum::<i64>();
            if free >= i64::from(needed) {
                chosen = Some(index);
                break;
            }
            if best.is_none_or(|(_, most)| free > most) {
                best = Some((index, free));
            }
        }
        let Some(index) = chosen.or(best.map(|(index, _)| index)) else {
            continue;
        };
        let (node, running) = &mut model_nodes[index];
        running.push((run.ended, needed));
        placed.insert(run.pod.name.as_str(), node.name.as_str());
    }
    placed
}

/// A pool per model of the trace's nodes, and each node up over the whole window.
fn fleet(nodes: &[Node], window: Window) -> (Vec<DemoPool>, Value) {
    let mut pools = Vec::new();
    let mut intervals = Vec::new();
    for model in &MODELS {
        let of_model: Vec<&Node> = nodes.iter().filter(|n| n.model == model.code).collect();
        if of_model.is_empty() {
            continue;
        }
        let id = model.name.to_lowercase();
        // The owned cards are paid for whether they work or not, at their TCO.
        let (name, billing) = match model.name == RESERVED_MODEL {
            true => (format!("{} nodes (owned)", model.name), "reserved"),
            false => (format!("{} nodes", model.name), "on_demand"),
        };
        pools.push(DemoPool {
            id: id.clone(),
            name,
            gpu_model: model.name,
        });
        for node in of_model {
            intervals.push(json!({
                "node": node.name,
                "pool": id,
                "gpu_model": model.name,
                "gpus": node.gpus,
                "billing_mode": billing,
                "from": format_time(window.start),
                "until": format_time(window.until),
                "state": "up",
            }));
        }
    }
    (pools, Value::Array(intervals))
}

/// The records, in the order they ended, cut into days from the window's start.
fn posts(ended: &[(DateTime<Utc>, SourceRecord)], window: Window) -> Vec<Post> {
    let mut posts: Vec<Post> = Vec::new();
    for (index, (at, _)) in ended.iter().enumerate() {
        let day = (*at - window.start).num_seconds().max(0) / 86_400;
        let posted = (window.start + TimeDelta::days(day + 1)).min(window.until);
        match posts.last_mut() {
            Some(post) if post.at == posted => post.records.end = index + 1,
            _ => posts.push(Post {
                at: posted,
                records: index..index + 1,
            }),
        }
    }
    posts
}

/// A monthly budget that `spend` burns to about `target_burn_pct` percent: spend × 100 /
/// target, rounded to two significant digits as budgets are (within 5 % of the target).
pub fn budget_for(spend: Decimal, target_burn_pct: u32) -> Option<Decimal> {
    if spend <= Decimal::ZERO || target_burn_pct == 0 {
        return None;
    }
    let exact = spend * Decimal::ONE_HUNDRED / Decimal::from(target_burn_pct);
    let mut scale = Decimal::ONE;
    while exact >= scale * Decimal::ONE_HUNDRED {
        scale *= Decimal::TEN;
    }
    while exact < scale * Decimal::TEN {
        scale /= Decimal::TEN;
    }
    Some(((exact / scale).round() * scale).normalize())
}

/// Trace time to ledger time: the replayed days are stretched (or squeezed) linearly onto the
/// window, so that the trace's end is the window's `until`.
struct Replay {
    window: Window,
    /// The trace second the window starts at, and the last one of the trace.
    first: i64,
    last: i64,
}

impl Replay {
    fn new(pods: &[Pod], window: Window) -> Self {
        let last = pods.iter().map(|p| p.deletion).max().unwrap_or(0);
        Self {
            window,
            first: last - REPLAYED_DAYS * 86_400,
            last,
        }
    }

    fn at(&self, trace_second: i64) -> DateTime<Utc> {
        let span = i128::from((self.window.until - self.window.start).num_seconds());
        let offset = i128::from(trace_second.max(self.first) - self.first) * span
            / i128::from(self.last - self.first);
        self.window.start + TimeDelta::seconds(offset as i64)
    }

    /// The pod as a run of GPUs in the window, or why it is none.
    fn run<'a>(
        &self,
        pod: &'a Pod,
        capacity: &BTreeMap<String, ModelCapacity>,
    ) -> Result<Run<'a>, &'static str> {
        if pod.num_gpu == 0 {
            return Err(NO_GPU);
        }
        let Some(scheduled) = pod.scheduled else {
            return Err(NEVER_SCHEDULED);
        };
        if pod.deletion >= self.last {
            return Err(STILL_RUNNING);
        }
        let started = self.at(scheduled);
        let ended = self.at(pod.deletion);
        if ended <= started {
            return Err(RAN_NO_TIME);
        }
        let outcome = match pod.phase {
            Phase::Succeeded | Phase::Running => Outcome::Completed,
            Phase::Failed
                if pod.qos == Qos::Be && pod.deletion - scheduled >= PREEMPTED_AFTER_SECONDS =>
            {
                Outcome::Preempted
            }
            Phase::Failed => Outcome::Failed,
            Phase::Pending => Outcome::Cancelled,
        };
        Ok(Run {
            pod,
            model: model_of(pod, capacity),
            queued: self.at(pod.creation).min(started),
            started,
            ended,
            outcome,
            gpu_seconds: i128::from(pod.deletion - scheduled.max(self.first))
                * i128::from(pod.num_gpu * pod.gpu_milli),
        })
    }
}

/// A pod that ran in the window.
struct Run<'a> {
    pod: &'a Pod,
    model: &'static DemoModel,
    queued: DateTime<Utc>,
    started: DateTime<Utc>,
    ended: DateTime<Utc>,
    outcome: Outcome,
    /// Thousandths of GPU-seconds it held in the trace's replayed days (dealing workloads
    /// to projects by them keeps the projects' sizes independent of the window).
    gpu_seconds: i128,
}

impl Run<'_> {
    fn is_long(&self) -> bool {
        self.ended - self.started > LONGEST_RECORD
    }
}

/// The pod's GPU model: the trace leaves pods free to run on any model, so each is placed
/// on one at random (by a hash of its name), weighted by the model's GPUs among the nodes
/// large enough for it.
fn model_of(pod: &Pod, capacity: &BTreeMap<String, ModelCapacity>) -> &'static DemoModel {
    let fitting: Vec<(&'static DemoModel, u64)> = MODELS
        .iter()
        .filter_map(|model| {
            let found = capacity.get(model.code)?;
            (found.largest_node >= pod.num_gpu).then_some((model, u64::from(found.gpus)))
        })
        .collect();
    let total: u64 = fitting.iter().map(|(_, gpus)| gpus).sum();
    if total == 0 {
        return &MODELS[0];
    }
    let mut pick = hash(&[&pod.name, "model"]) % total;
    for (model, gpus) in &fitting {
        if pick < *gpus {
            return model;
        }
        pick -= gpus;
    }
    fitting[0].0
}

/// Pods of one shape (CPU, memory, GPUs, GPU share and QoS): the replicas and reruns of one
/// workload, which the trace does not name.
struct Workload<'a> {
    name: String,
    project: &'static DemoProject,
    team: &'static str,
    runs: Vec<Run<'a>>,
}

type Shape = (u32, u32, u32, u32, Qos);

/// Groups the runs into workloads and deals them to the projects in turn, largest (in
/// GPU-hours) first, so that each project gets large and small ones; within a project they
/// alternate between its two teams and are named by project, kind and rank (`llm-train-03`).
fn workloads(runs: Vec<Run<'_>>) -> Vec<Workload<'_>> {
    let mut by_shape: BTreeMap<Shape, Vec<Run<'_>>> = BTreeMap::new();
    for run in runs {
        let pod = run.pod;
        by_shape
            .entry((
                pod.cpu_milli,
                pod.memory_mib,
                pod.num_gpu,
                pod.gpu_milli,
                pod.qos,
            ))
            .or_default()
            .push(run);
    }
    let mut shapes: Vec<(i128, Shape, Vec<Run<'_>>)> = by_shape
        .into_iter()
        .map(|(shape, runs)| (runs.iter().map(|r| r.gpu_seconds).sum(), shape, runs))
        .collect();
    shapes.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut dealt = [0usize; PROJECTS.len()];
    let mut named: BTreeMap<(usize, &'static str), usize> = BTreeMap::new();
    let mut workloads = Vec::new();
    for (rank_overall, (_, shape, runs)) in shapes.into_iter().enumerate() {
        let index = rank_overall % PROJECTS.len();
        let project = &PROJECTS[index];
        let kind = match shape.4 {
            Qos::Ls => "serve",
            Qos::Be => "train",
            Qos::Burstable | Qos::Guaranteed => "eval",
        };
        let rank = named.entry((index, kind)).or_default();
        *rank += 1;
        workloads.push(Workload {
            name: format!("{}-{kind}-{rank:02}", project.id),
            project,
            team: project.teams[dealt[index] % project.teams.len()],
            runs,
        });
        dealt[index] += 1;
    }
    workloads
}

/// One attempt of a task: a run with its place in the ledger.
struct Attempt<'a> {
    run: Run<'a>,
    project: &'static DemoProject,
    team: &'static str,
    workload: String,
    task_id: String,
    attempt: i32,
}

/// Chains each workload's runs into tasks: a failed or preempted run followed within
/// [`RETRY_WITHIN_SECONDS`] of its deletion by the workload's next pod is retried by it.
fn tasks(workloads: Vec<Workload<'_>>) -> Vec<Attempt<'_>> {
    let mut attempts: Vec<Attempt<'_>> = Vec::new();
    for workload in workloads {
        let mut runs = workload.runs;
        runs.sort_by(|a, b| (a.pod.creation, &a.pod.name).cmp(&(b.pod.creation, &b.pod.name)));
        let mut previous: Option<(String, i32, i64, bool)> = None;
        for run in runs {
            let (task_id, attempt) = match previous.take() {
                Some((task_id, attempt, deleted, retryable))
                    if retryable
                        && !run.is_long()
                        && attempt < MAX_ATTEMPTS
                        && (0..=RETRY_WITHIN_SECONDS).contains(&(run.pod.creation - deleted)) =>
                {
                    (task_id, attempt + 1)
                }
                _ => (format!("{}-{}", workload.name, run.pod.number()), 1),
            };
            previous = Some((
                task_id.clone(),
                attempt,
                run.pod.deletion,
                run.outcome != Outcome::Completed && !run.is_long(),
            ));
            attempts.push(Attempt {
                run,
                project: workload.project,
                team: workload.team,
                workload: workload.name.clone(),
                task_id,
                attempt,
            });
        }
    }
    attempts
}

/// The reserved contract's commitment: the GPUs the reserved runs use in the median hour of
/// the window (at least one), so that it is mostly used and the quieter hours leave some of
/// it unused.
fn committed_gpus(attempts: &[Attempt<'_>], window: Window) -> u32 {
    let hours = ((window.until - window.start).num_seconds() / 3600).max(1) as usize;
    let mut used = vec![0i64; hours];
    for attempt in attempts {
        let run = &attempt.run;
        if billing_mode(run) != BillingMode::Reserved {
            continue;
        }
        let milli = i64::from(run.pod.num_gpu * run.pod.gpu_milli);
        let from = ((run.started - window.start).num_seconds() / 3600) as usize;
        let to = ((run.ended - window.start).num_seconds() / 3600) as usize;
        for hour in used.iter_mut().take(to.min(hours - 1) + 1).skip(from) {
            *hour += milli;
        }
    }
    used.sort_unstable();
    ((used[hours / 2] / 1000) as u32).max(1)
}

/// Best-effort pods run on spot capacity, latency-sensitive pods on the reserved model's
/// reserved capacity, everything else on demand.
fn billing_mode(run: &Run<'_>) -> BillingMode {
    match run.pod.qos {
        Qos::Be => BillingMode::Spot,
        Qos::Ls if run.model.name == RESERVED_MODEL => BillingMode::Reserved,
        _ => BillingMode::OnDemand,
    }
}

/// On-demand and spot prices for every model, valid from the window's start, and the one
/// reserved contract, for a year, not scoped to a project (so that its unused part is shared).
fn contracts(window: Window, committed_gpus: u32) -> Vec<DemoContract> {
    let mut contracts = Vec::new();
    for model in &MODELS {
        for (mode, label) in [
            (BillingMode::OnDemand, "on-demand"),
            (BillingMode::Spot, "spot"),
        ] {
            contracts.push(DemoContract {
                name: format!("{} {label}", model.name),
                gpu_model: model.name,
                billing_mode: mode,
                price_per_gpu_hour: price(model, mode),
                valid_from: window.start,
                valid_until: None,
                committed_gpus: None,
                tco: None,
            });
        }
    }
    let owned = owned_a100(window);
    contracts.push(DemoContract {
        name: format!("{RESERVED_MODEL} owned, {committed_gpus} GPUs"),
        gpu_model: RESERVED_MODEL,
        billing_mode: BillingMode::Reserved,
        price_per_gpu_hour: owned.parts().total(),
        valid_from: window.start,
        valid_until: None,
        committed_gpus: Some(Decimal::from(committed_gpus)),
        tco: Some(owned),
    });
    contracts
}

/// What a GPU-hour of the model costs in US dollars under the contract of the billing mode.
/// The owned cards' price while they depreciate.
fn price(model: &DemoModel, mode: BillingMode) -> Decimal {
    match mode {
        BillingMode::OnDemand => Decimal::new(model.on_demand_cents, 2),
        BillingMode::Spot => Decimal::new(model.spot_cents, 2),
        BillingMode::Reserved => owned_a100(Window::ending_at(
            DateTime::<Utc>::UNIX_EPOCH,
            chrono_tz::UTC,
        ))
        .parts()
        .total(),
    }
}

/// What DCGM would have measured of a workload's runs; the trace has no telemetry, so it is
/// made up, from hashes of the workload's and the pod's names, in whole percent.
struct Activity {
    sm: u32,
    gpu_util: u32,
    tensor: u32,
    dram: u32,
    memory_pct: u32,
}

impl Activity {
    fn of(workload: &str, pod: &str) -> Self {
        let draw = |salt: &str, below: u64| (hash(&[workload, salt]) % below) as u32;
        let jitter = |salt: &str, spread: u64| {
            (hash(&[pod, salt]) % (2 * spread + 1)) as i64 - spread as i64
        };
        // One workload in eleven is left idle: a notebook or a stuck job holding its GPUs.
        let sm = if draw("idle", 11) == 0 {
            2 + (hash(&[pod, "sm"]) % 3) as u32
        } else {
            (i64::from(12 + draw("sm", 67)) + jitter("sm", 5)).clamp(6, 95) as u32
        };
        let gap = i64::from(10 + draw("util", 46)) + jitter("util", 3);
        Self {
            sm,
            gpu_util: (i64::from(sm) + gap).clamp(1, 99) as u32,
            tensor: sm * (20 + draw("tensor", 51)) / 100,
            dram: sm * (30 + draw("dram", 61)) / 100,
            memory_pct: (i64::from(15 + draw("memory", 76)) + jitter("memory", 5)).clamp(5, 98)
                as u32,
        }
    }
}

/// One job record of an attempt.
struct Piece {
    task_id: String,
    location: String,
    queued: DateTime<Utc>,
    started: DateTime<Utc>,
    ended: DateTime<Utc>,
    outcome: Outcome,
}

impl Attempt<'_> {
    /// Its job records: one, or one per [`LONGEST_RECORD`] of a long run.
    fn pieces(&self) -> Vec<Piece> {
        let run = &self.run;
        let spans = split(run.started, run.ended);
        let last = spans.len() - 1;
        spans
            .into_iter()
            .enumerate()
            .map(|(index, (started, ended))| {
                let (task_id, location, outcome) = if last == 0 {
                    (
                        self.task_id.clone(),
                        format!("{SOURCE}: {}", run.pod.name),
                        run.outcome,
                    )
                } else {
                    (
                        format!("{}-w{}", self.task_id, index + 1),
                        format!("{SOURCE}: {} week {}", run.pod.name, index + 1),
                        if index == last {
                            run.outcome
                        } else {
                            Outcome::Completed
                        },
                    )
                };
                Piece {
                    task_id,
                    location,
                    queued: if index == 0 { run.queued } else { started },
                    started,
                    ended,
                    outcome,
                }
            })
            .collect()
    }

    /// What the piece costs in its project's currency over `[from, to)`, as rating prices it:
    /// held GPU-seconds spread evenly over the record, priced by its contract, converted
    /// at `fx` for a project billed in its currency.
    fn cost_in(
        &self,
        piece: &Piece,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        fx: &DemoFxRate,
    ) -> Decimal {
        let seconds = (piece.ended.min(to) - piece.started.max(from)).num_seconds();
        if seconds <= 0 {
            return Decimal::ZERO;
        }
        let pod = self.run.pod;
        let gpus = Decimal::new(i64::from(pod.num_gpu * pod.gpu_milli), 3);
        let usd = gpus * Decimal::from(seconds) * price(self.run.model, billing_mode(&self.run))
            / Decimal::from(3600);
        if self.project.currency == fx.to {
            usd * fx.rate
        } else {
            usd
        }
    }

    fn record(&self, piece: &Piece) -> Value {
        let Piece {
            task_id,
            queued,
            started,
            ended,
            outcome,
            ..
        } = piece;
        let (started, ended, outcome) = (*started, *ended, *outcome);
        let run = &self.run;
        let pod = run.pod;
        let model = run.model;
        let milli = pod.num_gpu * pod.gpu_milli;
        let activity = Activity::of(&self.workload, &pod.name);
        let mut record = json!({
            "project": self.project.id,
            "task_id": task_id,
            "attempt": self.attempt,
            "gpu_model": model.name,
            "gpu_count": Decimal::new(i64::from(milli), 3).normalize().to_string(),
            "billing_mode": billing_mode(run).as_str(),
            "queued_at": format_time(*queued),
            "started_at": format_time(started),
            "ended_at": format_time(ended),
            "outcome": outcome.as_str(),
            "labels": {
                "team": self.team,
                "workload": self.workload,
                "qos": pod.qos.as_str(),
                "pod": pod.name,
            },
        });
        // Pascal cards have no profiling metrics, and one workload in ten runs without the
        // exporter: their cost is unmeasured.
        if model.profiled && !hash(&[&self.workload, "dcgm"]).is_multiple_of(10) {
            let share = |pct: u32| Decimal::new(i64::from(pct), 2).to_string();
            record["sm_active"] = json!(share(activity.sm));
            record["gpu_util"] = json!(share(activity.gpu_util));
            record["tensor_active"] = json!(share(activity.tensor));
            record["dram_active"] = json!(share(activity.dram));
            // A shared GPU's pod uses at most its share of the card's memory.
            let tenths = u64::from(model.memory_gib)
                * u64::from(pod.gpu_milli)
                * u64::from(activity.memory_pct)
                / 10_000;
            record["memory_peak_gib"] = json!(Decimal::new(tenths.max(1) as i64, 1).to_string());
            record["memory_total_gib"] = json!(model.memory_gib.to_string());
            // The owned cards' exporter reads their energy counter too, on whole GPUs: 55 W
            // idle to 400 W with every SM busy.
            if billing_mode(run) == BillingMode::Reserved && pod.gpu_milli == 1000 {
                let seconds = (ended - started).num_seconds().max(0);
                let watts = Decimal::new(5500 + 345 * i64::from(activity.sm), 2);
                let joules = Decimal::from(i64::from(pod.num_gpu) * seconds) * watts;
                record["energy_joules"] = json!(joules.normalize().to_string());
            }
        }
        if billing_mode(run) == BillingMode::Reserved {
            record["region"] = json!(OWNED_REGION);
        }
        if outcome == Outcome::Completed {
            let seconds = (ended - started).num_seconds().max(0) as u128;
            let quantity = u128::from(milli)
                * seconds
                * u128::from(activity.sm)
                * u128::from(model.speed_pct)
                * u128::from(self.project.output_per_busy_hour)
                * u128::from(90 + hash(&[&pod.name, "output"]) % 21)
                / (1000 * 3600 * 100 * 100 * 100);
            if quantity > 0 {
                record["output"] = json!({
                    "quantity": quantity.to_string(),
                    "unit": self.project.unit,
                });
            }
        }
        record
    }
}

/// `[started, ended)` in pieces of at most [`LONGEST_RECORD`].
fn split(started: DateTime<Utc>, ended: DateTime<Utc>) -> Vec<(DateTime<Utc>, DateTime<Utc>)> {
    let mut pieces = Vec::new();
    let mut from = started;
    while ended - from > LONGEST_RECORD {
        pieces.push((from, from + LONGEST_RECORD));
        from += LONGEST_RECORD;
    }
    pieces.push((from, ended));
    pieces
}

/// FNV-1a over the parts, separated: a hash that is the same on every machine and release.
fn hash(parts: &[&str]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0xff]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use chrono::TimeZone;

    use super::*;
    use crate::domain::record::{JobRecord, RecordRules};

    fn window() -> Window {
        Window::ending_at(
            Utc.with_ymd_and_hms(2026, 11, 20, 12, 0, 0).unwrap(),
            chrono_tz::UTC,
        )
    }

    fn parsed(demo: &Demo) -> Vec<JobRecord> {
        let rules = RecordRules {
            now: demo.window.until,
            max_duration: RecordRules::DEFAULT_MAX_DURATION,
        };
        demo.batch
            .records
            .iter()
            .map(|r| {
                JobRecord::parse(&r.value, "", rules)
                    .unwrap_or_else(|v| panic!("{}: {:?}", r.location, v.into_vec()))
            })
            .collect()
    }

    #[test]
    fn the_window_is_the_month_before_and_the_month_so_far() {
        let window = window();
        assert_eq!(window.previous.to_string(), "2026-10");
        assert_eq!(window.current.to_string(), "2026-11");
        assert_eq!(
            window.start,
            Utc.with_ymd_and_hms(2026, 10, 1, 0, 0, 0).unwrap()
        );
        let january = Window::ending_at(
            Utc.with_ymd_and_hms(2027, 1, 1, 0, 30, 0).unwrap(),
            chrono_tz::Europe::Berlin,
        );
        assert_eq!(january.previous.to_string(), "2026-12");
        assert_eq!(
            january.start,
            Utc.with_ymd_and_hms(2026, 11, 30, 23, 0, 0).unwrap()
        );
    }

    #[test]
    fn every_record_is_valid_and_inside_the_window() {
        let demo = demo(window()).unwrap();
        let records = parsed(&demo);
        assert!(records.len() > 5_000, "{} records", records.len());
        for record in &records {
            assert!(record.started_at >= demo.window.start);
            assert!(record.ended_at <= demo.window.until);
            assert!(record.ended_at - record.started_at <= LONGEST_RECORD);
        }
        assert_eq!(demo.batch.skipped[NO_GPU], 1088);
        assert_eq!(demo.batch.skipped[NEVER_SCHEDULED], 861);
        assert_eq!(demo.batch.skipped[STILL_RUNNING], 32);
        assert_eq!(demo.batch.skipped.get(RAN_NO_TIME), None);
        let keys: BTreeSet<_> = records.iter().map(|r| r.key.clone()).collect();
        assert_eq!(keys.len(), records.len(), "keys are unique");
        assert_eq!(
            demo.batch.jobs_read,
            records.len() - pieces_beyond_first(&records) + skipped(&demo)
        );
    }

    fn skipped(demo: &Demo) -> usize {
        demo.batch.skipped.values().sum()
    }

    fn pieces_beyond_first(records: &[JobRecord]) -> usize {
        records
            .iter()
            .filter(|r| {
                r.key
                    .task_id
                    .rsplit_once("-w")
                    .is_some_and(|(_, week)| week != "1" && week.parse::<u32>().is_ok())
            })
            .count()
    }

    #[test]
    fn the_records_show_what_the_dashboard_shows() {
        let demo = demo(window()).unwrap();
        let records = parsed(&demo);
        let projects: BTreeSet<&str> = records.iter().map(|r| r.key.project.as_str()).collect();
        assert_eq!(projects.len(), PROJECTS.len());
        for outcome in [Outcome::Completed, Outcome::Failed, Outcome::Preempted] {
            assert!(records.iter().any(|r| r.outcome == outcome), "{outcome:?}");
        }
        for mode in [
            BillingMode::OnDemand,
            BillingMode::Spot,
            BillingMode::Reserved,
        ] {
            assert!(records.iter().any(|r| r.billing_mode == mode), "{mode:?}");
        }
        let retried = records
            .iter()
            .filter(|r| r.key.attempt >= 2 && r.outcome == Outcome::Completed)
            .count();
        assert!(retried > 10, "{retried} tasks completed on a retry");
        assert!(
            records.iter().any(|r| r.gpu_count < Decimal::ONE),
            "shared GPUs"
        );
        assert!(records.iter().any(|r| r.output.is_some()));
        assert!(records.iter().any(|r| r.telemetry.sm_active.is_none()));
        assert!(
            records.iter().any(|r| r
                .telemetry
                .sm_active
                .is_some_and(|sm| sm < Decimal::new(5, 2))),
            "idle GPUs"
        );
        assert!(records.iter().any(|r| r.queued_at < Some(r.started_at)));
        let months: BTreeSet<Month> = records
            .iter()
            .map(|r| Month::from_first_day(r.started_at.date_naive()))
            .collect();
        assert_eq!(
            months,
            BTreeSet::from([demo.window.previous, demo.window.current])
        );
        let reserved = demo.contracts.last().unwrap();
        assert_eq!(reserved.billing_mode, BillingMode::Reserved);
        assert!(reserved.committed_gpus.unwrap() >= Decimal::ONE);
    }

    #[test]
    fn the_records_are_posted_day_by_day_after_they_ended() {
        let demo = demo(window()).unwrap();
        let records = parsed(&demo);
        let mut next = 0;
        let mut last_post = demo.window.start;
        for post in &demo.posts {
            assert_eq!(post.records.start, next, "in order, none left out");
            assert!(post.at > last_post && post.at <= demo.window.until);
            for record in &records[post.records.clone()] {
                assert!(record.ended_at <= post.at);
                assert!(record.ended_at >= post.at - TimeDelta::days(1));
            }
            next = post.records.end;
            last_post = post.at;
        }
        assert_eq!(next, records.len());
        assert_eq!(demo.posts.last().unwrap().at, demo.window.until);
    }

    #[test]
    fn each_project_gets_a_budget_it_burns_to_its_target() {
        let demo = demo(window()).unwrap();
        assert_eq!(demo.budgets.len(), PROJECTS.len());
        for (project, budget) in &demo.budgets {
            let budget = budget.unwrap_or_else(|| panic!("{} has no budget", project.id));
            assert!(budget > Decimal::ZERO);
        }
    }

    #[test]
    fn the_same_window_gives_the_same_records() {
        assert_eq!(demo(window()).unwrap(), demo(window()).unwrap());
    }

    #[test]
    fn budgets_are_round_and_near_their_target() {
        assert_eq!(
            budget_for(Decimal::new(1_234_567, 2), 50),
            Some(Decimal::from(25_000))
        );
        assert_eq!(
            budget_for(Decimal::new(87, 0), 100),
            Some(Decimal::from(87))
        );
        assert_eq!(
            budget_for(Decimal::new(9, 1), 100),
            Some(Decimal::new(90, 2))
        );
        assert_eq!(budget_for(Decimal::ZERO, 100), None);
        for cents in [10_500i64, 999_999, 100_000, 5_555_555] {
            let spend = Decimal::new(cents, 2);
            for target in [41, 64, 86, 93, 112] {
                let burn = spend * Decimal::ONE_HUNDRED / budget_for(spend, target).unwrap();
                let off = (burn - Decimal::from(target)).abs() / Decimal::from(target);
                assert!(off <= Decimal::new(5, 2), "{spend} at {target}: {burn}");
            }
        }
    }
}
