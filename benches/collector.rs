//! How much memory `collect prometheus` takes for a day of 100,000 finished GPU pods.
//!
//! A stand-in Prometheus, in a process of its own, answers the collector's queries as
//! kube-state-metrics and dcgm-exporter data would: the fifteen pod facts of 100,000 pods
//! that ended through the day (in 20 namespaces, each owned by a Job, on 1,250 nodes, with
//! the labels kube-state-metrics exports, among them the scrape target's), the Job membership
//! query of their tasks, the nodes' GPU product labels, and a DCGM query per pod. Its answers
//! are made once, before the first run, so the stand-in answers at the speed of a socket.
//!
//! The stand-in answers a page's queries (`uid=~"0a.*|…"`, or `uid!~` for the last page) with
//! that page's pods only, and also takes the records as `POST /v1/job-records` of a
//! taskledger server does, answering them accepted.
//!
//! Each run reads the day in a fresh process and delivers it page by page, as `collect
//! prometheus --server` does, and prints how long it took, the peak of memory allocated
//! meanwhile, and the process' peak resident set (`VmHWM`), the figure a container's memory
//! limit is held against. Runs alternate between the default page (10,000 pods) and the
//! whole day as one page; the figures are the medians of each.
//!
//! Run with `cargo bench --bench collector` (`COLLECTOR_BENCH_PODS` to change the count).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Form, State};
use axum::routing::post;
use chrono::TimeDelta;
use peakmem_alloc::{INSTRUMENTED_SYSTEM, PeakMemAlloc, PeakMemAllocTrait};
use serde::de::IgnoredAny;
use serde_json::{Value, json};

use taskledger::collectors::prometheus::PrometheusCollector;
use taskledger::collectors::{self, Destination, Window};
use taskledger::ledger::sources::SourceSummary;
use taskledger::sources::kubernetes::Mapping;

#[global_allocator]
static GLOBAL: &PeakMemAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const RUNS: usize = 5;
const NAMESPACES: usize = 20;
const NODES: usize = 1_250;
/// The default `--page-pods`.
const PAGE_PODS: usize = 10_000;
/// The environment variable that makes this binary the stand-in Prometheus.
const SERVE: &str = "COLLECTOR_BENCH_SERVE";
/// The environment variable that makes this binary one measured run, against this URL.
const MEASURE: &str = "COLLECTOR_BENCH_MEASURE";
/// The page size of a measured run.
const PAGE: &str = "COLLECTOR_BENCH_PAGE";

fn pods() -> usize {
    std::env::var("COLLECTOR_BENCH_PODS")
        .ok()
        .and_then(|raw| raw.parse().ok())
        .unwrap_or(100_000)
}

fn day() -> Window {
    Window {
        since: "2026-11-02T00:00:00Z".parse().unwrap(),
        until: "2026-11-03T00:00:00Z".parse().unwrap(),
    }
}

fn main() {
    if std::env::var_os(SERVE).is_some() {
        serve();
    } else if let Some(url) = std::env::var_os(MEASURE) {
        let page = std::env::var(PAGE).unwrap().parse().unwrap();
        measure(url.to_str().expect("a URL"), page);
    } else {
        compare();
    }
}

/// Starts the stand-in, then runs the measured reads one after another, alternating the page.
fn compare() {
    let pods = pods();
    let exe = std::env::current_exe().unwrap();
    let mut server = Command::new(&exe)
        .env(SERVE, "1")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the stand-in Prometheus starts");
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim().to_owned();
    assert!(url.starts_with("http://"), "the stand-in said `{line}`");
    println!(
        "a day of {pods} finished GPU pods from {url}, {RUNS} runs each, each a fresh process"
    );

    let sizes = [PAGE_PODS, pods];
    let mut runs: BTreeMap<usize, Vec<HashMap<String, f64>>> = BTreeMap::new();
    for run in 1..=RUNS {
        for page in sizes {
            let output = Command::new(&exe)
                .env(MEASURE, &url)
                .env(PAGE, page.to_string())
                .stderr(Stdio::inherit())
                .output()
                .expect("a measured run starts");
            assert!(output.status.success(), "run {run} failed");
            let text = String::from_utf8(output.stdout).unwrap();
            let figures: HashMap<String, f64> = text
                .split_whitespace()
                .filter_map(|pair| pair.split_once('='))
                .map(|(name, value)| (name.to_owned(), value.parse().unwrap()))
                .collect();
            println!("  run {run}: {}", text.trim());
            assert_eq!(
                figures["accepted"] as usize, pods,
                "every pod becomes a record, delivered"
            );
            runs.entry(page).or_default().push(figures);
        }
    }
    let _ = server.kill();
    let _ = server.wait();
    for page in sizes {
        let median = |name: &str| {
            let mut values: Vec<f64> = runs[&page].iter().map(|run| run[name]).collect();
            values.sort_by(f64::total_cmp);
            values[values.len() / 2]
        };
        println!(
            "median, pages of {page} pods ({} pages): {:.1} s, peak allocated {:.0} MiB, peak \
             resident {:.0} MiB",
            median("pages"),
            median("seconds"),
            median("allocated_mib"),
            median("resident_mib")
        );
    }
}

/// One read and delivery of the day, in this process alone.
fn measure(url: &str, page_pods: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let collector = PrometheusCollector {
        url: url.parse().unwrap(),
        token: None,
        selector: String::new(),
        resolution: TimeDelta::seconds(30),
        settle: TimeDelta::minutes(5),
        attempt_lookback: TimeDelta::days(7),
        query_timeout: Duration::from_secs(120),
        page_pods,
        capacity: None,
        mapping: Mapping {
            gpu_models: [("NVIDIA H100 80GB HBM3".to_owned(), "H100".to_owned())].into(),
            ..Mapping::default()
        },
    };
    let destination = Destination::Server {
        url: url.parse().unwrap(),
        token: "bench".to_owned(),
        client: reqwest::Client::new(),
    };
    let window = day();
    GLOBAL.reset_peak_memory();
    let started = Instant::now();
    let mut summary = SourceSummary::default();
    let pages = runtime
        .block_on(
            collector.read_pages(window, window.until + TimeDelta::hours(1), async |page| {
                summary.absorb(collectors::deliver(&destination, page).await?);
                Ok(())
            }),
        )
        .expect("the day is read");
    let seconds = started.elapsed().as_secs_f64();
    let allocated = GLOBAL.get_peak_memory() as f64 / (1024.0 * 1024.0);
    assert!(
        summary.problems.is_empty(),
        "{:?}",
        summary.problems.first()
    );
    println!(
        "accepted={} pages={pages} seconds={seconds:.2} allocated_mib={allocated:.1} \
         resident_mib={:.1}",
        summary.accepted,
        resident_peak_kib() as f64 / 1024.0
    );
}

/// The process' peak resident set, in KiB.
fn resident_peak_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// The series of one answer, by the first two characters of the pods' UIDs, each part
/// rendered as the comma-separated series of a vector.
type ByPrefix = BTreeMap<String, String>;

/// The stand-in's answers: each pod query's, the membership answer by task, the nodes'
/// products, and how many pods each UID prefix holds.
struct Answers {
    facts: Vec<(&'static str, ByPrefix)>,
    members: HashMap<String, String>,
    nodes: Bytes,
    prefixes: Bytes,
    reported_until: Bytes,
    at: String,
}

/// One synthetic pod: its identity and times.
struct Pod {
    namespace: String,
    name: String,
    uid: String,
    job: String,
    node: String,
    gpus: u32,
    created: i64,
    started: i64,
    ended: i64,
}

fn synthetic_pods(count: usize, window: Window) -> Vec<Pod> {
    let since = window.since.timestamp();
    // Ends spread from a minute into the day to an hour before its end.
    let spread = (window.until - window.since - TimeDelta::hours(1)).num_seconds();
    (0..count)
        .map(|i| {
            let ended = since + 60 + (i as i64 * spread) / count as i64;
            let started = ended - 600 - (i as i64 % 50) * 60;
            // Spread over their first characters as Kubernetes' random UIDs are.
            let spread_uid = (i as u32).wrapping_mul(0x9e37_79b9);
            Pod {
                namespace: format!("team-{:02}", i % NAMESPACES),
                name: format!("train-{i:06}-x7k2p"),
                uid: format!("{spread_uid:08x}-5c1e-4b7a-9d2f-{i:012x}"),
                job: format!("train-{i:06}"),
                node: format!("gpu-node-{:04}", i % NODES),
                gpus: if i % 10 == 0 { 8 } else { 1 },
                created: started - 5,
                started,
                ended,
            }
        })
        .collect()
}

fn vector_of(parts: &[&str]) -> Bytes {
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    format!(
        r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
        parts.join(",")
    )
    .into()
}

fn vector(series: impl Iterator<Item = Value>) -> Bytes {
    let rendered: Vec<String> = series.map(|s| s.to_string()).collect();
    vector_of(&[&rendered.join(",")])
}

fn prefix(uid: &str) -> String {
    uid.chars().take(2).collect()
}

fn answers(window: Window) -> Answers {
    let pods = synthetic_pods(pods(), window);
    let at = window.until.timestamp();
    let series = |pod: &Pod, extra: Value, value: String| {
        let mut metric = json!({"namespace": pod.namespace, "pod": pod.name, "uid": pod.uid});
        metric
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        json!({"metric": metric, "value": [at, value]})
    };
    let fact = |make: &dyn Fn(&Pod) -> Option<Value>| {
        let mut parts: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for pod in &pods {
            if let Some(series) = make(pod) {
                parts
                    .entry(prefix(&pod.uid))
                    .or_default()
                    .push(series.to_string());
            }
        }
        parts
            .into_iter()
            .map(|(prefix, series)| (prefix, series.join(",")))
            .collect::<ByPrefix>()
    };
    let facts: Vec<(&'static str, ByPrefix)> = vec![
        // Most specific first: the stand-in answers the first name a query contains.
        (
            "timestamp(kube_pod_status_phase",
            fact(&|p| Some(series(p, json!({}), (p.ended - 15).to_string()))),
        ),
        (
            "timestamp(kube_pod_created",
            fact(&|p| Some(series(p, json!({}), (p.ended + 30).to_string()))),
        ),
        (
            "kube_pod_created",
            fact(&|p| Some(series(p, json!({}), p.created.to_string()))),
        ),
        (
            "kube_pod_start_time",
            fact(&|p| Some(series(p, json!({}), p.started.to_string()))),
        ),
        (
            "kube_pod_completion_time",
            fact(&|p| Some(series(p, json!({}), p.ended.to_string()))),
        ),
        (
            "kube_pod_status_phase",
            fact(&|p| Some(series(p, json!({"phase": "Succeeded"}), "1".into()))),
        ),
        (
            "kube_pod_owner",
            fact(&|p| {
                Some(series(
                    p,
                    json!({"owner_kind": "Job", "owner_name": p.job}),
                    "1".into(),
                ))
            }),
        ),
        (
            "kube_pod_labels",
            fact(&|p| {
                Some(series(
                    p,
                    json!({"__name__": "kube_pod_labels", "container": "kube-state-metrics",
                           "endpoint": "http", "instance": "10.4.17.9:8080",
                           "job": "kube-state-metrics", "service": "kube-state-metrics",
                           "label_app_kubernetes_io_name": "trainer",
                           "label_batch_kubernetes_io_job_name": p.job,
                           "label_batch_kubernetes_io_controller_uid": p.uid,
                           "label_team": p.namespace}),
                    "1".into(),
                ))
            }),
        ),
        (
            "kube_pod_container_resource_requests",
            fact(&|p| {
                Some(series(
                    p,
                    json!({"resource": "nvidia_com_gpu"}),
                    p.gpus.to_string(),
                ))
            }),
        ),
        (
            "kube_pod_container_resource_limits",
            fact(&|p| {
                Some(series(
                    p,
                    json!({"resource": "nvidia_com_gpu"}),
                    p.gpus.to_string(),
                ))
            }),
        ),
        (
            "kube_pod_container_status_restarts_total",
            fact(&|p| Some(series(p, json!({}), "0".into()))),
        ),
        ("kube_pod_status_reason", fact(&|_| None)),
        (
            "kube_pod_container_status_last_terminated_reason",
            fact(&|_| None),
        ),
        (
            "kube_pod_container_status_terminated_reason",
            fact(&|p| Some(series(p, json!({"reason": "Completed"}), "1".into()))),
        ),
        (
            "kube_pod_info",
            fact(&|p| Some(series(p, json!({"node": p.node}), "1".into()))),
        ),
    ];
    let members = pods
        .iter()
        .map(|p| {
            let member = series(p, json!({"task": p.job}), p.created.to_string());
            (p.job.clone(), member.to_string())
        })
        .collect();
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for pod in &pods {
        *counts.entry(prefix(&pod.uid)).or_default() += 1;
    }
    let prefixes = vector(counts.into_iter().map(
        |(prefix, count)| json!({"metric": {"prefix": prefix}, "value": [at, count.to_string()]}),
    ));
    let last = pods.iter().map(|p| p.ended + 30).max().unwrap_or(at);
    let reported_until =
        vector([json!({"metric": {}, "value": [at, last.to_string()]})].into_iter());
    let nodes = vector((0..NODES).map(|n| {
        json!({"metric": {"node": format!("gpu-node-{n:04}"),
                          "label_nvidia_com_gpu_product": "NVIDIA-H100-80GB-HBM3"},
               "value": [at, "1"]})
    }));
    Answers {
        facts,
        members,
        nodes,
        prefixes,
        reported_until,
        at: at.to_string(),
    }
}

/// The DCGM answer of one pod: the six figures and its devices.
fn dcgm(answers: &Answers, pod: &str) -> Bytes {
    let figures = [
        ("gpu_util", "87.5"),
        ("gr_engine_active", "0.61"),
        ("sm_active", "0.55"),
        ("tensor_active", "0.31"),
        ("dram_active", "0.42"),
        ("fb_used", "61234"),
    ];
    let gpus = if pod[6..12].parse::<usize>().is_ok_and(|i| i % 10 == 0) {
        "8"
    } else {
        "1"
    };
    vector(
        figures
            .iter()
            .map(|(figure, value)| json!({"metric": {"figure": figure}, "value": [answers.at, value]}))
            .chain([json!({"metric": {"figure": "device", "modelName": "NVIDIA H100 80GB HBM3"},
                           "value": [answers.at, gpus]})]),
    )
}

/// The string literal after `marker` in `promql`, split at `|` (the stand-in's values hold
/// no escapes).
fn alternatives<'a>(promql: &'a str, marker: &str) -> Option<Vec<&'a str>> {
    let start = promql.find(marker)? + marker.len();
    let end = start + promql[start..].find('"')?;
    Some(promql[start..end].split('|').collect())
}

/// Which UID prefixes a page's query selects: all of them without a page matcher.
fn selected<'a>(promql: &str, all: &'a ByPrefix) -> Vec<&'a str> {
    let page = |operator: &str| {
        [format!("{{uid{operator}\""), format!(" uid{operator}\"")]
            .iter()
            .find_map(|marker| alternatives(promql, marker))
            .map(|listed| {
                listed
                    .into_iter()
                    .map(|p| p.trim_end_matches(".*").to_owned())
                    .collect::<BTreeSet<String>>()
            })
    };
    let (within, outside) = (page("=~"), page("!~"));
    all.iter()
        .filter(|(prefix, _)| {
            within.as_ref().is_none_or(|w| w.contains(*prefix))
                && outside.as_ref().is_none_or(|o| !o.contains(*prefix))
        })
        .map(|(_, series)| series.as_str())
        .collect()
}

async fn query(
    State(answers): State<Arc<Answers>>,
    Form(form): Form<HashMap<String, String>>,
) -> Bytes {
    let promql = &form["query"];
    if promql.contains("DCGM_FI_") {
        let pod = promql
            .split("pod=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
            .expect("a DCGM query names its pod");
        return dcgm(&answers, pod);
    }
    if promql.contains("group_left (task)") {
        let tasks = alternatives(promql, "owner_name=~\"").expect("a member query names tasks");
        let series: Vec<&str> = tasks
            .iter()
            .filter_map(|task| answers.members.get(*task).map(String::as_str))
            .collect();
        return vector_of(&[&series.join(",")]);
    }
    if promql.contains("kube_node_labels") {
        return answers.nodes.clone();
    }
    if promql.starts_with("count by (prefix)") {
        return answers.prefixes.clone();
    }
    if promql.starts_with("max(max_over_time(timestamp(") {
        return answers.reported_until.clone();
    }
    answers
        .facts
        .iter()
        .find(|(name, _)| promql.contains(name))
        .map(|(_, parts)| vector_of(&selected(promql, parts)))
        .unwrap_or_else(|| panic!("the stand-in knows no answer to {promql}"))
}

/// Takes records as a taskledger server does, answering them all accepted.
async fn ingest(body: Bytes) -> Json<Value> {
    let records: Vec<IgnoredAny> = serde_json::from_slice(&body).expect("a JSON array");
    Json(json!({"accepted": records.len(), "duplicates": 0}))
}

fn serve() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let answers = Arc::new(answers(day()));
        let app = axum::Router::new()
            .route("/api/v1/query", post(query))
            .route("/v1/job-records", post(ingest))
            .layer(DefaultBodyLimit::disable())
            .with_state(answers);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("http://{}/", listener.local_addr().unwrap());
        axum::serve(listener, app).await.unwrap();
    });
}
