//! The metrics, as a real Prometheus sees them: the service serves on a loopback port, takes
//! some traffic, a Prometheus (Debian's `prometheus` package; `.ci/run` installs it) scrapes
//! it, and PromQL queries over its HTTP API answer the counts the traffic made.
//!
//! Its own test binary, so that no other test adds to the process-wide metrics.

#[path = "api/common/mod.rs"]
#[expect(dead_code, reason = "this test uses a part of the API tests' harness")]
mod common;
#[path = "support/prometheus.rs"]
mod prometheus;
#[path = "support/mod.rs"]
mod support;
#[path = "support/citus.rs"]
mod support_citus;

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::TestApp;
use taskledger::config::Settings;
use taskledger::ledger::instruments;
use taskledger::server::Application;

/// The PromQL answers this test waits for, at most.
const PATIENCE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_counts_the_traffic_made() {
    let app = TestApp::spawn().await;
    let service = serve(&app).await;
    let base = format!("http://{service}");
    let client = reqwest::Client::new();
    let admin = app.admin.clone();
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut request = client
            .request(method, format!("{base}{path}"))
            .bearer_auth(&admin);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.expect("the service answers");
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap_or(Value::Null);
            (status, body)
        }
    };

    // A project with a small budget, so that the records below fire alerts; their webhook
    // goes nowhere, and no delivery worker runs, so they stay in the outbox.
    let (status, body) = call(
        reqwest::Method::POST,
        "/v1/projects",
        Some(json!({"id": "vision", "name": "Vision", "currency": "USD",
                    "default_monthly_budget": "10", "webhook_url": "http://127.0.0.1:9/alerts"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = call(
        reqwest::Method::POST,
        "/v1/contracts",
        Some(
            json!({"name": "H100 spot", "gpu_model": "H100", "billing_mode": "spot",
                    "price_per_gpu_hour": "1.20", "currency": "USD",
                    "valid_from": "2026-01-01T00:00:00Z"}),
        ),
    )
    .await;
    assert_eq!(status, 201, "{body}");

    let records: Vec<Value> = (1..=3).map(record).collect();
    let (status, body) = call(
        reqwest::Method::POST,
        "/v1/job-records",
        Some(json!(records)),
    )
    .await;
    assert_eq!((status, &body["accepted"]), (200, &json!(3)), "{body}");
    let (status, body) = call(
        reqwest::Method::POST,
        "/v1/job-records",
        Some(json!(records)),
    )
    .await;
    assert_eq!((status, &body["duplicates"]), (200, &json!(3)), "{body}");
    let mut invalid = record(4);
    invalid["gpu_count"] = json!(0);
    let (status, body) = call(
        reqwest::Method::POST,
        "/v1/job-records",
        Some(json!([record(5), invalid])),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    for _ in 0..4 {
        let (status, body) = call(
            reqwest::Method::GET,
            "/v1/projects/vision/cost?month=2026-11",
            None,
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    let (status, _) = call(reqwest::Method::GET, "/v1/projects/nowhere/cost", None).await;
    assert_eq!(status, 404);

    let prometheus = Prometheus::start(service).await;
    prometheus.wait_for("up{job=\"taskledger\"}", 1.0).await;
    let cost = r#"route="/v1/projects/{id}/cost",method="GET""#;
    prometheus
        .wait_for(
            &format!("sum(taskledger_http_requests_total{{{cost},status=\"200\"}})"),
            4.0,
        )
        .await;
    prometheus
        .wait_for(
            &format!("sum(taskledger_http_requests_total{{{cost},status=\"404\"}})"),
            1.0,
        )
        .await;
    prometheus
        .wait_for(
            &format!("sum(taskledger_http_request_duration_seconds_count{{{cost}}})"),
            5.0,
        )
        .await;
    prometheus
        .wait_for(
            "sum(taskledger_http_requests_total{route=\"/v1/job-records\",status=\"422\"})",
            1.0,
        )
        .await;
    for (result, expected) in [("accepted", 3.0), ("duplicate", 3.0), ("rejected", 1.0)] {
        prometheus
            .wait_for(
                &format!("sum(taskledger_job_records_total{{result=\"{result}\"}})"),
                expected,
            )
            .await;
    }
    // Two batches were stored (the first and its repeat), each timed once.
    prometheus
        .wait_for("taskledger_job_record_batch_duration_seconds_count", 2.0)
        .await;
    prometheus
        .wait_for("sum(taskledger_rated_records_total{cause=\"ingest\"})", 3.0)
        .await;
    prometheus
        .wait_for("taskledger_db_pool_max_connections", 8.0)
        .await;
    // Each alert fired waits in the outbox; compaction folds every delta row rating made.
    let fired = prometheus.value("sum(taskledger_alerts_fired_total)").await;
    assert!(fired >= 3.0, "the 50, 80 and 100 % alerts fired: {fired}");
    prometheus
        .wait_for("taskledger_alert_outbox_pending", fired)
        .await;
    prometheus
        .wait_for("taskledger_rollup_compaction_backlog_rows", 0.0)
        .await;
    prometheus
        .wait_for("sum(taskledger_rollup_compacted_rows_total) > bool 0", 1.0)
        .await;
}

/// Every metric the service records is listed in the operations guide.
#[test]
fn the_operations_guide_lists_every_metric() {
    let guide =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"))
            .expect("docs/operations.md is readable");
    let missing: Vec<&str> = instruments::ALL
        .iter()
        .map(|metric| metric.name)
        .filter(|name| !guide.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md does not list {missing:?}"
    );
}

/// A job record of project `vision` in November 2026: 8 H100s on spot for 90 minutes.
fn record(attempt: u32) -> Value {
    json!({"project": "vision", "task_id": format!("train-{attempt}"), "gpu_model": "H100",
           "gpu_count": 8, "billing_mode": "spot", "started_at": "2026-11-20T10:00:00Z",
           "ended_at": "2026-11-20T11:30:00Z", "gpu_seconds_busy": 30100,
           "outcome": "completed"})
}

/// Serves the app on a loopback port with the rollup compaction running, as `serve` does.
async fn serve(app: &TestApp) -> SocketAddr {
    let application = Application::bind(
        app.state(Settings::default()),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let address = application.local_addr();
    tokio::spawn(application.serve_until(std::future::pending()));
    tokio::spawn(taskledger::workers::compaction::run(
        app.pool.clone(),
        Duration::from_millis(200),
        std::future::pending(),
    ));
    address
}

struct Prometheus {
    process: prometheus::Process,
    _dir: tempfile::TempDir,
    client: reqwest::Client,
}

impl Prometheus {
    /// Starts a Prometheus that scrapes `target` every second.
    async fn start(target: SocketAddr) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n\
                 scrape_configs:\n  - job_name: taskledger\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let process = prometheus::start(&config, &dir.path().join("data"), &[]);
        process.ready(PATIENCE).await;
        Self {
            process,
            _dir: dir,
            client: reqwest::Client::new(),
        }
    }

    /// The value of a PromQL query answering one sample, or `None` while it answers none
    /// (or Prometheus is still starting).
    async fn query(&self, promql: &str) -> Option<f64> {
        let response = self
            .client
            .get(format!("{}/api/v1/query", self.process.url))
            .query(&[("query", promql)])
            .send()
            .await
            .ok()?;
        let body: Value = response.json().await.ok()?;
        assert_eq!(body["status"], "success", "{promql}: {body}");
        let result = body["data"]["result"].as_array()?;
        assert!(result.len() <= 1, "{promql} answers several series: {body}");
        result.first()?["value"][1].as_str()?.parse().ok()
    }

    /// The value of a query, once it has one.
    async fn value(&self, promql: &str) -> f64 {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(value) = self.query(promql).await {
                return value;
            }
            assert!(Instant::now() < deadline, "{promql} never answered");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until a query answers `expected`; fails with the last answer otherwise.
    async fn wait_for(&self, promql: &str, expected: f64) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let answer = self.query(promql).await;
            if answer == Some(expected) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{promql} answers {answer:?}, not {expected}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
