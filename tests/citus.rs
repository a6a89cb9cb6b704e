//! The ledger on Citus, for real: a coordinator and two workers on this machine
//! (`.ci/citus-cluster`), the schema placed by `taskledger citus distribute`, and one
//! multi-project scenario (FX rates, a reservation, a project's own contract made after the
//! records, an FX change, budgets, a month close) run through the API against Citus and
//! against one plain PostgreSQL. Every figure must be the same, every alert delivered once, and
//! the Citus server must log no error.
//!
//! Skipped, saying so, where Citus is not installed (`.ci/citus-build` builds it from its
//! source tree).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use serde_json::{Value, json};

const TOKEN: &str = "tl_citus_test_admin_token_0123456789";

fn citus_installed() -> bool {
    let Ok(output) = Command::new("pg_config").arg("--pkglibdir").output() else {
        return false;
    };
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    Path::new(&dir).join("citus.so").exists()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A base port with the two after it free too.
fn free_base_port() -> u16 {
    (9800..9990)
        .step_by(7)
        .find(|base| (0..3).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok()))
        .expect("three free ports in a row")
}

struct Cluster {
    dir: tempfile::TempDir,
    url: String,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let output = Command::new(script())
            .args(["start", dir.path().to_str().unwrap(), "taskledger"])
            .env("CITUS_PORT", free_base_port().to_string())
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(output.status.success(), "the Citus cluster did not start");
        let url = String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap()
            .to_owned();
        Cluster { dir, url }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script())
            .args(["stop", self.dir.path().to_str().unwrap()])
            .status();
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(".ci/citus-cluster")
}

struct Server {
    child: Child,
    url: String,
    log: PathBuf,
}

impl Server {
    /// `taskledger serve` on `database_url`, or on an embedded cluster in `data_dir`.
    async fn start(database_url: Option<&str>, data_dir: &Path) -> Server {
        let port = free_port();
        let log = data_dir.join("serve.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_taskledger"));
        command
            .args(["--listen", &format!("127.0.0.1:{port}"), "serve"])
            .arg("--data-dir")
            .arg(data_dir.join("data"))
            .env("TASKLEDGER_BOOTSTRAP_TOKEN", TOKEN)
            .env("TASKLEDGER_BURN_TICK_SECONDS", "1")
            .env("RUST_LOG", "warn")
            .env_remove("DATABASE_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(url) = database_url {
            command.env("DATABASE_URL", url);
        }
        let child = command.spawn().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let started = Instant::now();
        let http = reqwest::Client::new();
        loop {
            if let Ok(response) = http.get(format!("{url}/readyz")).send().await
                && response.status().is_success()
            {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "not ready: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Server { child, url, log }
    }

    fn errors(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|line| line.contains(" ERROR ") || line.contains(" WARN "))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// Alert webhooks as they arrive.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Value>>>);

impl Receiver {
    async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .route("/hook", post(receive))
            .with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        url
    }

    fn ids(&self) -> Vec<String> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .map(|body| body["id"].as_str().unwrap_or_default().to_owned())
            .collect()
    }
}

async fn receive(State(receiver): State<Receiver>, Json(body): Json<Value>) -> &'static str {
    receiver.0.lock().unwrap().push(body);
    "ok"
}

async fn call(
    http: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Value {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = http
        .request(method, format!("{base}{path}"))
        .bearer_auth(TOKEN);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{path}: {status} {body}");
    body
}

/// A small deterministic generator, so that both ledgers get the same records.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, below: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % below
    }
}

const PROJECTS: [(&str, &str); 5] = [
    ("p0", "USD"),
    ("p1", "EUR"),
    ("p2", "GBP"),
    ("p3", "EUR"),
    ("p4", "USD"),
];

/// `count` records from `first_day` (a Unix time) on, over `days` days.
fn records(seed: u64, count: usize, first_day: u64, days: u64) -> Vec<Value> {
    let mut random = Lcg(seed);
    (0..count)
        .map(|i| {
            let (project, _) = PROJECTS[random.next(5) as usize];
            let (model, mode) = match random.next(3) {
                0 => ("H100", "on_demand"),
                1 => ("H100", "spot"),
                _ => ("A100", "reserved"),
            };
            let gpus = 1 + random.next(8);
            let start = first_day + random.next(days * 24) * 3600 + random.next(3600);
            let hours = 1 + random.next(12);
            let end = start + hours * 3600;
            let at = |s: u64| {
                chrono::DateTime::from_timestamp(s as i64, 0)
                    .unwrap()
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            };
            json!({
                "project": project, "task_id": format!("task-{seed}-{i}"), "gpu_model": model,
                "billing_mode": mode, "gpu_count": gpus, "started_at": at(start),
                "ended_at": at(end),
                "gpu_seconds_busy": gpus * hours * 3600 * (20 + random.next(80)) / 100,
                "outcome": if random.next(6) == 0 { "failed" } else { "completed" },
            })
        })
        .collect()
}

/// 2026-11-01T00:00:00Z and 2026-12-01T00:00:00Z.
const NOVEMBER: u64 = 1_793_491_200;
const DECEMBER: u64 = 1_796_083_200;

/// Runs the scenario against one ledger and returns what it answered, keyed by request.
async fn scenario(base: &str, hook: &str) -> BTreeMap<String, Value> {
    let http = reqwest::Client::new();
    for (id, currency) in PROJECTS {
        call(
            &http,
            base,
            "POST",
            "/v1/projects",
            Some(json!({
                "id": id, "name": id, "currency": currency, "default_monthly_budget": "2500",
                "webhook_url": hook,
            })),
        )
        .await;
    }
    for (pair, rate) in [("USD/EUR", "0.92"), ("USD/GBP", "0.79")] {
        call(
            &http,
            base,
            "PUT",
            &format!("/v1/fx-rates/2026-11/{pair}"),
            Some(json!({"rate": rate})),
        )
        .await;
    }
    for body in [
        json!({"name": "H100 on demand", "gpu_model": "H100", "billing_mode": "on_demand",
               "price_per_gpu_hour": "2.50", "currency": "USD", "valid_from": "2026-01-01T00:00:00Z"}),
        json!({"name": "H100 spot", "gpu_model": "H100", "billing_mode": "spot",
               "price_per_gpu_hour": "1.10", "currency": "USD", "valid_from": "2026-01-01T00:00:00Z"}),
        json!({"name": "A100 reserved", "gpu_model": "A100", "billing_mode": "reserved",
               "price_per_gpu_hour": "1.20", "currency": "USD", "committed_gpus": 8,
               "valid_from": "2026-01-01T00:00:00Z"}),
    ] {
        call(&http, base, "POST", "/v1/contracts", Some(body)).await;
    }
    for batch in records(1, 80, NOVEMBER, 27).chunks(20) {
        let batch = Some(Value::Array(batch.to_vec()));
        call(&http, base, "POST", "/v1/job-records", batch).await;
    }
    // This month's, against small budgets, so that the burn check fires alerts.
    for (id, _) in PROJECTS {
        let path = format!("/v1/projects/{id}/budgets/2026-12");
        call(&http, base, "PUT", &path, Some(json!({"amount": "150"}))).await;
    }
    let december = Some(Value::Array(records(2, 30, DECEMBER, 4)));
    call(&http, base, "POST", "/v1/job-records", december).await;
    // Changes after the records: each re-rates what it touches.
    call(
        &http,
        base,
        "POST",
        "/v1/contracts",
        Some(json!({
        "name": "p1's H100", "gpu_model": "H100", "billing_mode": "on_demand", "project": "p1",
        "price_per_gpu_hour": "2.20", "currency": "USD", "valid_from": "2026-11-10T00:00:00Z"})),
    )
    .await;
    call(
        &http,
        base,
        "PUT",
        "/v1/fx-rates/2026-11/USD/EUR",
        Some(json!({"rate": "0.95"})),
    )
    .await;
    call(
        &http,
        base,
        "PUT",
        "/v1/projects/p2/budgets/2026-11",
        Some(json!({"amount": "300"})),
    )
    .await;

    let mut answers = BTreeMap::new();
    for (id, _) in PROJECTS {
        for path in [
            format!("/v1/projects/{id}/cost?month=2026-11&group_by=gpu_model,billing_mode"),
            format!("/v1/projects/{id}/cost?month=2026-11&group_by=day"),
            format!("/v1/projects/{id}/tasks?month=2026-11&limit=1000"),
            format!("/v1/projects/{id}/burn?month=2026-11"),
        ] {
            answers.insert(path.clone(), call(&http, base, "GET", &path, None).await);
        }
    }
    let report = "/v1/reports/monthly/2026-11".to_owned();
    answers.insert(
        report.clone(),
        call(&http, base, "GET", &report, None).await,
    );
    let close = "/v1/reports/monthly/2026-11/close".to_owned();
    answers.insert(
        close.clone(),
        call(&http, base, "POST", &close, Some(json!({}))).await,
    );
    answers
}

/// What may differ between two ledgers given the same requests: generated ids and times.
fn comparable(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !key.ends_with("_at") && *key != "as_of" && *key != "id")
                .map(|(key, value)| (key.clone(), comparable(value)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(comparable).collect()),
        Value::String(text) if uuid::Uuid::parse_str(text).is_ok() => json!("<uuid>"),
        other => other.clone(),
    }
}

/// The alerts a ledger fired: project, month, threshold and kind, sorted.
async fn alerts(base: &str) -> Vec<Value> {
    let page = call(
        &reqwest::Client::new(),
        base,
        "GET",
        "/v1/alerts?limit=1000",
        None,
    )
    .await;
    let mut alerts: Vec<Value> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| json!([a["project"], a["month"], a["threshold"], a["kind"]]))
        .collect();
    alerts.sort_by_key(|a| a.to_string());
    alerts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_project_scenario_gives_the_same_money_on_citus_as_on_one_postgres() {
    if !citus_installed() {
        eprintln!(
            "SKIPPED: Citus is not installed here (.ci/citus-build builds it from its source)"
        );
        return;
    }
    let cluster = Cluster::start();
    let distribute = Command::new(env!("CARGO_BIN_EXE_taskledger"))
        .args(["citus", "distribute", "--shard-count", "4"])
        .env("DATABASE_URL", &cluster.url)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(
        distribute.status.success(),
        "{}",
        String::from_utf8_lossy(&distribute.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&distribute.stdout).trim(),
        "25 reference tables made, 24 tables distributed by project, 0 placed already"
    );
    let mut coordinator = <sqlx::PgConnection as sqlx::Connection>::connect(&cluster.url)
        .await
        .unwrap();
    let shards: Vec<(String, i64)> = sqlx::query_as(
        "SELECT logicalrelid::text, count(*) FROM pg_dist_shard \
         WHERE logicalrelid IN ('job_records'::regclass, 'rated_segments'::regclass) \
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&mut coordinator)
    .await
    .unwrap();
    assert_eq!(
        shards,
        [
            ("job_records".to_owned(), 4),
            ("rated_segments".to_owned(), 4)
        ],
        "--shard-count gives every co-located table its shards"
    );

    let plain_dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        plain_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o711),
    )
    .unwrap();
    let citus_dir = tempfile::tempdir().unwrap();
    let plain = Server::start(None, plain_dir.path()).await;
    let citus = Server::start(Some(&cluster.url), citus_dir.path()).await;
    let (plain_hook, citus_hook) = (Receiver::default(), Receiver::default());
    let (plain_url, citus_url) = (plain_hook.start().await, citus_hook.start().await);

    let (on_plain, on_citus) = tokio::join!(
        scenario(&plain.url, &plain_url),
        scenario(&citus.url, &citus_url)
    );
    for (request, answer) in &on_plain {
        assert_eq!(
            comparable(answer),
            comparable(&on_citus[request]),
            "{request} answers differently on Citus"
        );
    }
    let report = &on_citus["/v1/reports/monthly/2026-11"];
    assert_eq!(report["projects"].as_array().unwrap().len(), 5);
    for project in report["projects"].as_array().unwrap() {
        let total: rust_decimal::Decimal = project["total"].as_str().unwrap().parse().unwrap();
        assert!(total > rust_decimal::Decimal::ZERO, "{project}");
    }

    // Every alert fired is delivered, once, on both. The burn check runs every second on each
    // ledger, on its own clock, so both lists are read again until they agree and every alert
    // has arrived.
    let started = Instant::now();
    let fired = loop {
        let (plain_fired, citus_fired) = (alerts(&plain.url).await, alerts(&citus.url).await);
        if !plain_fired.is_empty()
            && citus_fired == plain_fired
            && plain_hook.ids().len() == plain_fired.len()
            && citus_hook.ids().len() == plain_fired.len()
        {
            break plain_fired;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "alerts: plain {plain_fired:?}, citus {citus_fired:?}; delivered {} and {}",
            plain_hook.ids().len(),
            citus_hook.ids().len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        alerts(&plain.url).await,
        fired,
        "no alert fires later on one PostgreSQL"
    );
    assert_eq!(
        alerts(&citus.url).await,
        fired,
        "no alert fires later on Citus"
    );
    let mut delivered = citus_hook.ids();
    delivered.sort();
    delivered.dedup();
    assert_eq!(delivered.len(), fired.len(), "each alert once on Citus");
    assert_eq!(citus_hook.ids().len(), fired.len());

    eprintln!(
        "on Citus as on one PostgreSQL: {} answers, {} alerts each delivered once",
        on_citus.len(),
        fired.len()
    );
    assert_eq!(
        citus.errors(),
        Vec::<String>::new(),
        "the Citus server logged errors"
    );
    assert_eq!(plain.errors(), Vec::<String>::new());
    drop(cluster);
}
