//! Ingestion benchmark: job records posted over HTTP, against a raw `COPY` of the same rows.
//!
//! One run starts an embedded PostgreSQL with the service's default (durable) settings, serves
//! the real application on a loopback port in this process, and measures:
//!
//! 1. HTTP ingest: every record posted once, as JSON arrays, by concurrent clients, in two
//!    parts: the first tenth, then the rest;
//! 2. price changes, after each part of the ingest (at a tenth of the records and at all of
//!    them): every contract's price raised, one `PATCH` each, and an FX rate put, each timed;
//! 3. COPY: the same rows (content hash and labels included) fed by `COPY … FROM STDIN` into
//!    a second migrated database of the same cluster, in chunks of the same size over as many
//!    connections, one transaction per chunk like one per request;
//! 4. replay: every record posted again, each answer counting only duplicates;
//! 5. a month's cost read at the prices in force and with a `what_if` price, alternately;
//! 6. storage floors: on the rated database, how long PostgreSQL alone takes to write the
//!    rated segments once, as rating lays them out and as one row per record;
//! 7. a contract change under CI: a batch of 20 new records posted every 0.25 s while a
//!    contract that re-assigns a model's records is created and deleted, each batch timed.
//!
//! Records are generated on the fly from their index (record `i` depends only on `i`), so
//! each phase pays for producing its own input and the process holds no copy of the data set.
//!
//! `cargo bench --bench ingest`; `TASKLEDGER_BENCH_RECORDS=20000` scales the run down.
//!
//! Prices apply when figures are read, so a price or FX change writes one row whatever the
//! number of records: the two price-change phases show it, and their ratio is the goal's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use taskledger::config::Settings;
use taskledger::db::embedded::{EmbeddedOptions, EmbeddedPostgres};
use taskledger::domain::access::Role;
use taskledger::domain::idle;
use taskledger::domain::rating::{BillingMode, Outcome};
use taskledger::domain::record::{
    JobRecord, Output, RecordKey, Telemetry, duration_seconds, format_time,
};
use taskledger::http::state::AppState;
use taskledger::server::Application;
use taskledger::store;

#[path = "support/statements.rs"]
mod statements;
#[path = "../tests/support/mod.rs"]
mod support;

const DEFAULT_RECORDS: usize = 1_000_000;
const RECORDS_ENV: &str = "TASKLEDGER_BENCH_RECORDS";
const BATCH_SIZE: usize = 1_000;
const CLIENTS: usize = 4;
/// The service's default `--db-pool-size`.
const SERVER_POOL_SIZE: u32 = 16;
const PROJECT: &str = "bench";
/// The project's monthly budget per record of the run, in USD.
const BUDGET_PER_RECORD: u32 = 10;
const HTTP_DATABASE: &str = "bench_http";
const COPY_DATABASE: &str = "bench_copy";
const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
const PHASE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
const SETUP_TIMEOUT: Duration = Duration::from_secs(120);
/// Records generated untimed to measure what producing each phase's input costs.
const GENERATOR_SAMPLE: usize = 20_000;

/// The columns both paths write; the rest take their defaults.
const COPY_STATEMENT: &str = "COPY job_records (project_id, task_id, attempt, gpu_model, \
    gpu_count, billing_mode, provider, region, queued_at, started_at, ended_at, \
    gpu_seconds_held, gpu_seconds_busy, outcome, retries, failures, output_quantity, \
    output_unit, labels, content_hash) FROM STDIN";

/// Every stored column but the bookkeeping ones, hashed row by row in key order: equal
/// fingerprints mean both databases hold the same rows.
const FINGERPRINT_QUERY: &str = "SELECT count(*), md5(string_agg(md5((project_id, task_id, \
    attempt, gpu_model, gpu_count, billing_mode, provider, region, queued_at, started_at, \
    ended_at, gpu_seconds_held, gpu_seconds_busy, outcome, retries, failures, output_quantity, \
    output_unit, labels, content_hash)::text), '' ORDER BY project_id, task_id, attempt)) \
    FROM job_records";

fn main() {
    let total = record_count();
    let batches = total.div_ceil(BATCH_SIZE);
    println!(
        "taskledger ingest benchmark: {total} records, batches of {BATCH_SIZE} ({batches} \
         batches), {CLIENTS} concurrent clients, durable embedded PostgreSQL"
    );
    // The server gets a runtime of its own, built like the service's; the clients run on
    // another, as they would in other processes.
    let server_runtime = runtime();
    let client_runtime = runtime();
    let generator = Arc::new(Generator::new(Utc::now()));

    let data_dir = tempfile::Builder::new()
        .prefix("taskledger-bench-")
        .tempdir()
        .expect("creating the benchmark's temp dir");
    let setup = bounded(
        &server_runtime,
        SETUP_TIMEOUT,
        "setting up the cluster",
        Setup::start(data_dir.path(), total),
    );
    println!(
        "cluster and databases ready in {}",
        data_dir.path().display()
    );

    let costs = GeneratorCosts::measure(&generator);
    println!(
        "client-side input per record (untimed sample of {GENERATOR_SAMPLE}): JSON {:.1} µs, \
         COPY text with content hash {:.1} µs",
        costs.json_micros, costs.copy_micros
    );

    let server = setup.serve(&server_runtime);
    let client = Arc::new(HttpClient::new(server.address, &setup.token));

    checkpoint(&client_runtime, &setup.http_url);
    let profiled = client_runtime.block_on(statements::reset(&setup.http_pool));
    let early = (total / 10).max(1);
    let first_part = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "HTTP ingest",
        post_all(&client, &generator, 0..early, Expect::AllAccepted),
    );
    let prices_early = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "price changes",
        change_prices(&setup, server.address, early),
    );
    prices_early.print();
    let second_part = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "HTTP ingest",
        post_all(&client, &generator, early..total, Expect::AllAccepted),
    );
    let ingest = first_part.followed_by(second_part);
    ingest.print("HTTP ingest");
    if profiled {
        client_runtime.block_on(statements::print(&setup.http_pool, "HTTP ingest"));
    }
    let prices = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "price changes",
        change_prices(&setup, server.address, total),
    );
    prices.print();

    checkpoint(&client_runtime, &setup.copy_url);
    let copy = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "COPY",
        copy_all(&setup.copy_url, &generator, total),
    );
    copy.print("COPY");
    println!(
        "  COPY fed as text format, one COPY statement (and transaction) per chunk of \
         {BATCH_SIZE} rows, {CLIENTS} connections in parallel"
    );

    checkpoint(&client_runtime, &setup.http_url);
    let profiled = client_runtime.block_on(statements::reset(&setup.http_pool));
    let replay = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "HTTP replay",
        post_all(&client, &generator, 0..total, Expect::AllDuplicates),
    );
    replay.print("HTTP replay");
    if profiled {
        client_runtime.block_on(statements::print(&setup.http_pool, "HTTP replay"));
    }

    let profiled = client_runtime.block_on(statements::reset(&setup.http_pool));
    let reads = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "month cost reads",
        read_month_costs(&setup, server.address),
    );
    reads.print();
    if profiled {
        client_runtime.block_on(statements::print(&setup.http_pool, "month cost reads"));
    }

    let tables = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "comparing the tables",
        compare_tables(&setup, total),
    );
    let peak_rss = peak_rss_kib();
    let floors = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "the storage floors",
        measure_floors(&setup.http_url),
    );
    let change = bounded(
        &client_runtime,
        PHASE_TIMEOUT,
        "a contract change under CI",
        change_under_ci(&setup, server.address, &generator, total),
    );
    change.print();

    bounded(
        &server_runtime,
        SETUP_TIMEOUT,
        "stopping the server",
        server.stop(),
    );
    bounded(
        &server_runtime,
        SETUP_TIMEOUT,
        "stopping the cluster",
        setup.stop(),
    );

    print_summary(&Summary {
        total,
        ingest,
        copy,
        replay,
        prices_early,
        prices,
        reads,
        change,
        tables,
        peak_rss_kib: peak_rss,
        floors,
    });
}

fn record_count() -> usize {
    match std::env::var(RECORDS_ENV) {
        Ok(raw) => raw
            .trim()
            .replace('_', "")
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .unwrap_or_else(|| panic!("{RECORDS_ENV}={raw:?} is not a positive whole number")),
        Err(_) => DEFAULT_RECORDS,
    }
}

fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("building a tokio runtime")
}

/// Runs `work` to completion on `runtime`, panicking with `what` if it takes over `limit`.
fn bounded<T>(runtime: &Runtime, limit: Duration, what: &str, work: impl Future<Output = T>) -> T {
    runtime
        .block_on(async { tokio::time::timeout(limit, work).await })
        .unwrap_or_else(|_| panic!("{what} did not finish within {}s", limit.as_secs()))
}

/// The cluster, the two databases and the tokens.
struct Setup {
    cluster: EmbeddedPostgres,
    http_url: String,
    copy_url: String,
    http_pool: PgPool,
    token: String,
    admin_token: String,
}

/// What the benchmark's records are priced by: an on-demand and a spot list price per model,
/// and a reservation of committed GPUs per model (priced as owned hardware's TCO).
const CONTRACTS: &str = r#"
INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency,
                       valid_from, committed_gpus)
SELECT md5(m || '/' || b)::uuid, m || ' ' || b, m, b, (ARRAY[3.90, 1.80])[mi] * (ARRAY[1, 0.35, 0.6])[bi],
       CASE WHEN (m, b) = ('A100', 'spot') THEN 'EUR' ELSE 'USD' END, '2020-01-01T00:00:00Z',
       CASE WHEN b = 'reserved' THEN 64 END
FROM unnest(ARRAY['H100', 'A100']) WITH ORDINALITY AS models(m, mi),
     unnest(ARRAY['on_demand', 'spot', 'reserved']) WITH ORDINALITY AS modes(b, bi)
"#;

/// The rates the euro-priced contract's records are converted at: the months the records
/// span and the one after.
const FX_RATES: &str = "
INSERT INTO fx_rates (month, from_currency, to_currency, rate)
SELECT date_trunc('month', now() - k * interval '1 month')::date, 'EUR', 'USD', 1.08
FROM generate_series(-1, 2) AS k";

impl Setup {
    async fn start(data_dir: &std::path::Path, total: usize) -> Self {
        let cluster = support::start_cluster(
            data_dir,
            EmbeddedOptions {
                durable: true,
                max_connections: 100,
                statement_statistics: true,
            },
        )
        .await
        .expect("starting the embedded PostgreSQL");
        let http_url = cluster.url(HTTP_DATABASE);
        let copy_url = cluster.url(COPY_DATABASE);
        // About what half the records cost, so that ingest crosses the alert thresholds.
        let budget = Decimal::from(total) * Decimal::from(BUDGET_PER_RECORD);
        let http_pool = migrated_database(&cluster, HTTP_DATABASE, SERVER_POOL_SIZE, budget).await;
        let copy_pool = migrated_database(&cluster, COPY_DATABASE, 1, budget).await;
        copy_pool.close().await;
        for statement in [CONTRACTS, FX_RATES] {
            sqlx::query(statement)
                .execute(&http_pool)
                .await
                .expect("creating the contracts and FX rates");
        }
        let token = support::insert_token(
            &http_pool,
            "bench ingest",
            Role::Ingest,
            &[PROJECT.to_owned()],
        )
        .await;
        let admin_token = support::insert_token(&http_pool, "bench admin", Role::Admin, &[]).await;
        Self {
            cluster,
            http_url,
            copy_url,
            http_pool,
            token,
            admin_token,
        }
    }

    /// Serves the application on a loopback port of `runtime`, with rollup compaction
    /// running beside it as `taskledger serve` runs it.
    fn serve(&self, runtime: &Runtime) -> Server {
        let state = AppState::new(self.http_pool.clone(), Settings::default());
        let application = runtime
            .block_on(Application::bind(
                state,
                SocketAddr::from(([127, 0, 0, 1], 0)),
            ))
            .expect("binding the HTTP server");
        let address = application.local_addr();
        let (shutdown, stop) = oneshot::channel::<()>();
        let task = runtime.spawn(application.serve_until(async {
            let _ = stop.await;
        }));
        let (stop_compaction, compaction_stopped) = oneshot::channel::<()>();
        let compaction = runtime.spawn(taskledger::workers::compaction::run(
            self.http_pool.clone(),
            taskledger::workers::compaction::DEFAULT_INTERVAL,
            async {
                let _ = compaction_stopped.await;
            },
        ));
        Server {
            address,
            shutdown,
            task,
            stop_compaction,
            compaction,
        }
    }

    async fn stop(self) {
        self.http_pool.close().await;
        self.cluster
            .stop()
            .await
            .expect("stopping the embedded PostgreSQL");
    }
}

/// The application serving in this process.
struct Server {
    address: SocketAddr,
    shutdown: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop_compaction: oneshot::Sender<()>,
    compaction: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting, lets in-flight requests finish, and checks the server ended cleanly.
    async fn stop(self) {
        self.shutdown
            .send(())
            .expect("the server stopped before it was asked to");
        self.task
            .await
            .expect("the server task panicked")
            .expect("the server failed");
        let _ = self.stop_compaction.send(());
        self.compaction.await.expect("the compaction task panicked");
    }
}

/// A migrated database holding the benchmark's project, with a monthly budget of `budget`
/// USD and the usual alert thresholds.
async fn migrated_database(
    cluster: &EmbeddedPostgres,
    name: &str,
    pool_size: u32,
    budget: Decimal,
) -> PgPool {
    let pool =
        support::create_migrated_database(|database| cluster.url(database), name, pool_size).await;
    store::projects::insert(
        &mut pool.acquire().await.expect("a connection"),
        &taskledger::domain::project::NewProject {
            id: PROJECT.to_owned(),
            name: "Ingest benchmark".to_owned(),
            team: None,
            currency: "USD".to_owned(),
            default_monthly_budget: Some(budget),
            alert_thresholds: vec![50, 80, 100],
            webhook_url: None,
            idle_gpu_threshold: Some(idle::DEFAULT_THRESHOLD),
            idle_gpu_min_gpu_hours: idle::DEFAULT_MIN_GPU_HOURS,
        },
    )
    .await
    .unwrap_or_else(|error| panic!("creating the project in {name}: {error}"))
    .unwrap_or_else(|| panic!("project {PROJECT} already exists in {name}"));
    pool
}

/// Flushes what earlier phases wrote, so that no phase pays for another's checkpoint.
fn checkpoint(runtime: &Runtime, url: &str) {
    bounded(runtime, SETUP_TIMEOUT, "CHECKPOINT", async {
        let mut connection = PgConnection::connect(url)
            .await
            .expect("connecting for CHECKPOINT");
        sqlx::query("CHECKPOINT")
            .execute(&mut connection)
            .await
            .expect("CHECKPOINT");
        connection.close().await.expect("closing a connection");
    });
}

/// Deterministic, realistic job records: record `i` depends only on `i` and the window start.
struct Generator {
    /// Records start within the 30 days after this, all ended well before now.
    window_start: DateTime<Utc>,
}

const WINDOW_SECONDS: u64 = 30 * 24 * 3600;
const PIPELINES: [&str; 6] = [
    "train-resnet",
    "train-llama",
    "finetune-bert",
    "eval-llm",
    "sweep-vit",
    "render-sim",
];
const TEAMS: [&str; 4] = ["perception", "language", "research", "platform"];
const GPU_MODELS: [&str; 2] = ["H100", "A100"];
/// GPU counts as (mantissa, scale): whole cards, half a card, a 1/7 MIG slice.
const GPU_COUNTS: [(i64, u32); 7] = [(1, 0), (2, 0), (4, 0), (8, 0), (8, 0), (5, 1), (142857, 6)];
const PLACES: [(&str, &str); 4] = [
    ("aws", "us-east-1"),
    ("aws", "eu-west-1"),
    ("gcp", "us-central1"),
    ("azure", "westeurope"),
];

impl Generator {
    fn new(now: DateTime<Utc>) -> Self {
        let window_start = now - chrono::Duration::days(32);
        let window_start = DateTime::from_timestamp(window_start.timestamp(), 0)
            .expect("a whole-second time is representable");
        Self { window_start }
    }

    fn record(&self, index: usize) -> JobRecord {
        let mut dice = Dice::for_record(index);
        let pipeline = dice.pick(&PIPELINES);
        let team = dice.pick(&TEAMS);
        let started_at = self.window_start
            + chrono::Duration::seconds(dice.below(WINDOW_SECONDS) as i64)
            + chrono::Duration::milliseconds(dice.below(1000) as i64);
        // One minute to twelve hours.
        let ended_at = started_at + chrono::Duration::seconds(60 + dice.below(43_140) as i64);
        let queued_at = (dice.below(100) < 85)
            .then(|| started_at - chrono::Duration::seconds(dice.below(900) as i64));
        let (mantissa, scale) = dice.pick(&GPU_COUNTS);
        let gpu_count = Decimal::new(mantissa, scale);
        let held = (gpu_count * duration_seconds(started_at, ended_at)).normalize();
        let busy = (dice.below(100) < 80)
            .then(|| (held * Decimal::new(35 + dice.below(65) as i64, 2)).normalize());
        let attempt = match dice.below(100) {
            0..90 => 1,
            90..98 => 2,
            _ => 3,
        };
        let outcome = match dice.below(100) {
            0..80 => Outcome::Completed,
            80..90 => Outcome::Failed,
            90..96 => Outcome::Preempted,
            _ => Outcome::Cancelled,
        };
        let billing_mode = match dice.below(10) {
            0..5 => BillingMode::OnDemand,
            5..8 => BillingMode::Spot,
            _ => BillingMode::Reserved,
        };
        let place = (dice.below(10) < 9).then(|| dice.pick(&PLACES));
        let output = (outcome == Outcome::Completed).then(|| Output {
            quantity: Decimal::from(1 + dice.below(2_000_000_000)),
            unit: if pipeline.starts_with("render") {
                "images"
            } else {
                "tokens"
            }
            .to_owned(),
        });
        let mut labels = BTreeMap::from([
            ("team".to_owned(), team.to_owned()),
            ("pipeline".to_owned(), pipeline.to_owned()),
        ]);
        if dice.below(2) == 0 {
            labels.insert(
                "ci_run".to_owned(),
                (10_000 + dice.below(90_000)).to_string(),
            );
        }
        JobRecord {
            key: RecordKey {
                project: PROJECT.to_owned(),
                task_id: format!("{pipeline}-{}-{index:07}", started_at.format("%Y%m%d")),
                attempt,
            },
            gpu_model: dice.pick(&GPU_MODELS).to_owned(),
            gpu_count: gpu_count.normalize(),
            billing_mode,
            provider: place.map(|(provider, _)| provider.to_owned()),
            region: place.map(|(_, region)| region.to_owned()),
            queued_at,
            started_at,
            ended_at,
            gpu_seconds_held: held,
            gpu_seconds_busy: busy,
            outcome,
            retries: attempt - 1,
            failures: i32::from(outcome == Outcome::Failed) + attempt - 1,
            output,
            labels,
            telemetry: Telemetry::default(),
            nodes: Vec::new(),
        }
    }

    /// Records `[first, first + count)` as the JSON array a client posts.
    fn json_body(&self, first: usize, count: usize) -> Vec<u8> {
        let records: Vec<JobRecord> = (first..first + count).map(|i| self.record(i)).collect();
        let wire: Vec<WireRecord> = records.iter().map(WireRecord::from).collect();
        serde_json::to_vec(&wire).expect("records serialise")
    }

    /// Records `[first, first + count)` as `COPY` text-format lines.
    fn copy_text(&self, first: usize, count: usize) -> String {
        let mut text = String::with_capacity(count * 512);
        for index in first..first + count {
            write_copy_line(&mut text, &self.record(index));
        }
        text
    }
}

/// splitmix64: cheap, well-mixed, and a pure function of its input.
fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The random choices of one record.
struct Dice(u64);

impl Dice {
    fn for_record(index: usize) -> Self {
        Dice(mix(index as u64))
    }

    /// A number in `0..bound`.
    fn below(&mut self, bound: u64) -> u64 {
        self.0 = mix(self.0);
        self.0 % bound
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
}

/// A record as CI posts it: optional fields left out when absent, decimals as strings.
#[derive(Serialize)]
struct WireRecord<'a> {
    project: &'a str,
    task_id: &'a str,
    attempt: i32,
    gpu_model: &'a str,
    #[serde(with = "rust_decimal::serde::str")]
    gpu_count: Decimal,
    billing_mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    provider: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    region: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queued_at: Option<DateTime<Utc>>,
    started_at: DateTime<Utc>,
    ended_at: DateTime<Utc>,
    #[serde(with = "rust_decimal::serde::str")]
    gpu_seconds_held: Decimal,
    #[serde(
        with = "rust_decimal::serde::str_option",
        skip_serializing_if = "Option::is_none"
    )]
    gpu_seconds_busy: Option<Decimal>,
    outcome: &'static str,
    retries: i32,
    failures: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    output: Option<WireOutput<'a>>,
    labels: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct WireOutput<'a> {
    #[serde(with = "rust_decimal::serde::str")]
    quantity: Decimal,
    unit: &'a str,
}

impl<'a> From<&'a JobRecord> for WireRecord<'a> {
    fn from(record: &'a JobRecord) -> Self {
        Self {
            project: &record.key.project,
            task_id: &record.key.task_id,
            attempt: record.key.attempt,
            gpu_model: &record.gpu_model,
            gpu_count: record.gpu_count,
            billing_mode: record.billing_mode.as_str(),
            provider: record.provider.as_deref(),
            region: record.region.as_deref(),
            queued_at: record.queued_at,
            started_at: record.started_at,
            ended_at: record.ended_at,
            gpu_seconds_held: record.gpu_seconds_held,
            gpu_seconds_busy: record.gpu_seconds_busy,
            outcome: record.outcome.as_str(),
            retries: record.retries,
            failures: record.failures,
            output: record.output.as_ref().map(|output| WireOutput {
                quantity: output.quantity,
                unit: &output.unit,
            }),
            labels: &record.labels,
        }
    }
}

/// One row of [`COPY_STATEMENT`] in text format, with the content hash the service stores.
fn write_copy_line(text: &mut String, record: &JobRecord) {
    let labels = serde_json::to_string(&record.labels).expect("labels serialise");
    let hash = format!("\\x{}", hex::encode(record.content_hash()));
    let fields: [Option<String>; 20] = [
        Some(record.key.project.clone()),
        Some(record.key.task_id.clone()),
        Some(record.key.attempt.to_string()),
        Some(record.gpu_model.clone()),
        Some(record.gpu_count.to_string()),
        Some(record.billing_mode.as_str().to_owned()),
        record.provider.clone(),
        record.region.clone(),
        record.queued_at.map(format_time),
        Some(format_time(record.started_at)),
        Some(format_time(record.ended_at)),
        Some(record.gpu_seconds_held.to_string()),
        record.gpu_seconds_busy.map(|busy| busy.to_string()),
        Some(record.outcome.as_str().to_owned()),
        Some(record.retries.to_string()),
        Some(record.failures.to_string()),
        record.output.as_ref().map(|o| o.quantity.to_string()),
        record.output.as_ref().map(|o| o.unit.clone()),
        Some(labels),
        Some(hash),
    ];
    for (position, field) in fields.iter().enumerate() {
        if position > 0 {
            text.push('\t');
        }
        match field {
            None => text.push_str("\\N"),
            Some(value) => push_copy_escaped(text, value),
        }
    }
    text.push('\n');
}

/// Text-format escaping: backslash, and the delimiter and line breaks.
fn push_copy_escaped(text: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => text.push_str("\\\\"),
            '\t' => text.push_str("\\t"),
            '\n' => text.push_str("\\n"),
            '\r' => text.push_str("\\r"),
            c => text.push(c),
        }
    }
}

/// What producing each phase's input costs the client, per record.
struct GeneratorCosts {
    json_micros: f64,
    copy_micros: f64,
}

impl GeneratorCosts {
    fn measure(generator: &Generator) -> Self {
        let per_record = |work: &dyn Fn(usize, usize) -> usize| {
            let started = Instant::now();
            let mut bytes = 0;
            for first in (0..GENERATOR_SAMPLE).step_by(BATCH_SIZE) {
                bytes += work(first, BATCH_SIZE);
            }
            assert!(bytes > 0, "the generator produced nothing");
            started.elapsed().as_secs_f64() * 1e6 / GENERATOR_SAMPLE as f64
        };
        Self {
            json_micros: per_record(&|first, count| generator.json_body(first, count).len()),
            copy_micros: per_record(&|first, count| generator.copy_text(first, count).len()),
        }
    }
}

/// What every answer of a posting phase must say.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    AllAccepted,
    AllDuplicates,
}

#[derive(Deserialize)]
struct IngestAnswer {
    accepted: usize,
    duplicates: usize,
}

struct HttpClient {
    client: reqwest::Client,
    url: String,
    authorization: String,
}

impl HttpClient {
    fn new(address: SocketAddr, token: &str) -> Self {
        Self {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(REQUEST_TIMEOUT)
                .pool_max_idle_per_host(CLIENTS)
                .build()
                .expect("building the HTTP client"),
            url: format!("http://{address}/v1/job-records"),
            authorization: format!("Bearer {token}"),
        }
    }

    async fn post(&self, body: Vec<u8>) -> IngestAnswer {
        let response = self
            .client
            .post(&self.url)
            .header(reqwest::header::AUTHORIZATION, &self.authorization)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|error| panic!("POST {} failed: {error}", self.url));
        let status = response.status();
        let text = response
            .text()
            .await
            .unwrap_or_else(|error| panic!("reading the answer to POST {}: {error}", self.url));
        assert_eq!(status, StatusCode::OK, "POST {} answered {text}", self.url);
        serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("unexpected answer {text}: {error}"))
    }
}

/// How long a phase took and how long its requests (or COPY chunks) took.
struct PhaseResult {
    records: usize,
    elapsed: Duration,
    /// CPU time of this process (server and clients) during the phase: unlike the rates, it
    /// hardly depends on what else runs on the machine.
    cpu: Duration,
    latencies: Vec<Duration>,
}

impl PhaseResult {
    /// This phase and then `next`, as one.
    fn followed_by(mut self, next: PhaseResult) -> PhaseResult {
        self.records += next.records;
        self.elapsed += next.elapsed;
        self.cpu += next.cpu;
        self.latencies.extend(next.latencies);
        self
    }

    fn rate(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64()
    }

    fn latency(&self, quantile: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort();
        let index = ((sorted.len() - 1) as f64 * quantile).round() as usize;
        sorted[index]
    }

    fn cpu_micros_per_record(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.records as f64
    }

    fn print(&self, name: &str) {
        println!(
            "{name}: {} records in {:.2}s = {:.0} records/s; process CPU {:.1} µs/record; per \
             batch p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; peak RSS so far {} MiB",
            self.records,
            self.elapsed.as_secs_f64(),
            self.rate(),
            self.cpu_micros_per_record(),
            self.latency(0.5).as_secs_f64() * 1e3,
            self.latency(0.99).as_secs_f64() * 1e3,
            self.latency(1.0).as_secs_f64() * 1e3,
            peak_rss_kib() / 1024,
        );
    }
}

/// Runs `CLIENTS` workers that take batch numbers from a shared counter until every record
/// of `range` was sent. `work(worker, first, count)` sends records `[first, first + count)`.
async fn run_batches<F, Fut>(range: Range<usize>, work: F) -> PhaseResult
where
    F: Fn(usize, usize, usize) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (start, total) = (range.start, range.len());
    let batches = total.div_ceil(BATCH_SIZE);
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let cpu_before = process_cpu();
    let workers: Vec<_> = (0..CLIENTS)
        .map(|worker| {
            let next = next.clone();
            let work = work.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut records = 0;
                loop {
                    let batch = next.fetch_add(1, Ordering::Relaxed);
                    if batch >= batches {
                        return (latencies, records);
                    }
                    let first = start + batch * BATCH_SIZE;
                    let count = BATCH_SIZE.min(start + total - first);
                    let batch_started = Instant::now();
                    work(worker, first, count).await;
                    latencies.push(batch_started.elapsed());
                    records += count;
                }
            })
        })
        .collect();
    let mut result = PhaseResult {
        records: 0,
        elapsed: Duration::ZERO,
        cpu: Duration::ZERO,
        latencies: Vec::with_capacity(batches),
    };
    for worker in workers {
        let (latencies, records) = worker.await.expect("a benchmark client panicked");
        result.latencies.extend(latencies);
        result.records += records;
    }
    result.elapsed = started.elapsed();
    result.cpu = process_cpu() - cpu_before;
    assert_eq!(result.records, total, "not every batch was sent");
    result
}

async fn post_all(
    client: &Arc<HttpClient>,
    generator: &Arc<Generator>,
    range: Range<usize>,
    expect: Expect,
) -> PhaseResult {
    let (client, generator) = (client.clone(), generator.clone());
    run_batches(range, move |_, first, count| {
        let (client, generator) = (client.clone(), generator.clone());
        async move {
            let answer = client.post(generator.json_body(first, count)).await;
            let (accepted, duplicates) = match expect {
                Expect::AllAccepted => (count, 0),
                Expect::AllDuplicates => (0, count),
            };
            assert!(
                answer.accepted == accepted && answer.duplicates == duplicates,
                "batch at record {first}: {} accepted and {} duplicates, expected {accepted} \
                 and {duplicates}",
                answer.accepted,
                answer.duplicates
            );
        }
    })
    .await
}

/// The median and the largest of `durations`, in milliseconds.
fn median_and_max(durations: &[Duration]) -> (f64, f64) {
    let mut sorted = durations.to_vec();
    sorted.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    match sorted.len() {
        0 => (0.0, 0.0),
        n => (ms(sorted[n / 2]), ms(sorted[n - 1])),
    }
}

/// The `quantile` of `durations`, in milliseconds (nearest rank).
fn quantile_ms(durations: &[Duration], quantile: f64) -> f64 {
    let mut sorted = durations.to_vec();
    sorted.sort();
    let index = ((sorted.len() as f64 * quantile).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index].as_secs_f64() * 1e3
}

/// An admin's HTTP client of the served application.
struct AdminClient {
    client: reqwest::Client,
    base: String,
    authorization: String,
}

impl AdminClient {
    fn new(setup: &Setup, address: SocketAddr) -> Self {
        Self {
            client: reqwest::Client::builder()
                .no_proxy()
                .timeout(PHASE_TIMEOUT)
                .build()
                .expect("building the HTTP client"),
            base: format!("http://{address}"),
            authorization: format!("Bearer {}", setup.admin_token),
        }
    }

    /// Sends `method path` with `body`, checks the status, and says how long it took.
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
        expected: StatusCode,
    ) -> (Duration, String) {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .client
            .request(method.clone(), &url)
            .header(reqwest::header::AUTHORIZATION, &self.authorization);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let started = Instant::now();
        let response = request
            .send()
            .await
            .unwrap_or_else(|error| panic!("{method} {url} failed: {error}"));
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let took = started.elapsed();
        assert_eq!(status, expected, "{method} {url} answered {text}");
        (took, text)
    }
}

/// How long price and FX changes took with `records` records stored.
struct PriceChanges {
    records: usize,
    contract_changes: Vec<Duration>,
    fx_changes: Vec<Duration>,
}

impl PriceChanges {
    fn all(&self) -> Vec<Duration> {
        self.contract_changes
            .iter()
            .chain(&self.fx_changes)
            .copied()
            .collect()
    }

    fn print(&self) {
        let (contract_median, contract_max) = median_and_max(&self.contract_changes);
        let (fx_median, fx_max) = median_and_max(&self.fx_changes);
        println!(
            "price changes at {} records: {} contract PATCHes median {contract_median:.1} ms, \
             max {contract_max:.1} ms; {} FX rate PUTs median {fx_median:.1} ms, max \
             {fx_max:.1} ms",
            self.records,
            self.contract_changes.len(),
            self.fx_changes.len(),
        );
    }
}

/// Raises every contract's price by a tenth, one `PATCH` at a time, and puts the current
/// month's EUR rate three times, each timed.
async fn change_prices(setup: &Setup, address: SocketAddr, records: usize) -> PriceChanges {
    let contracts = sqlx::query_as::<_, (uuid::Uuid, Decimal)>(
        "SELECT id, price_per_gpu_hour FROM contracts ORDER BY name",
    )
    .fetch_all(&setup.http_pool)
    .await
    .expect("listing the contracts");
    let admin = AdminClient::new(setup, address);
    let mut contract_changes = Vec::with_capacity(contracts.len());
    for (id, price) in contracts {
        let new_price = (price * Decimal::new(11, 1)).round_dp(4).to_string();
        let (took, _) = admin
            .send(
                reqwest::Method::PATCH,
                &format!("/v1/contracts/{id}"),
                Some(serde_json::json!({ "price_per_gpu_hour": new_price })),
                StatusCode::OK,
            )
            .await;
        contract_changes.push(took);
    }
    let month = Utc::now().format("%Y-%m");
    let mut fx_changes = Vec::new();
    for rate in ["1.07", "1.09", "1.08"] {
        let (took, _) = admin
            .send(
                reqwest::Method::PUT,
                &format!("/v1/fx-rates/{month}/EUR/USD"),
                Some(serde_json::json!({ "rate": rate })),
                StatusCode::OK,
            )
            .await;
        fx_changes.push(took);
    }
    PriceChanges {
        records,
        contract_changes,
        fx_changes,
    }
}

/// Reads of the project's cost for the month holding most records.
struct MonthReads {
    month: String,
    in_force: Vec<Duration>,
    what_if: Vec<Duration>,
}

const READS: usize = 40;

impl MonthReads {
    fn print(&self) {
        println!(
            "month cost {} ({READS} reads each, alternating): at the prices in force p50 \
             {:.1} ms, p95 {:.1} ms; with a what_if price p50 {:.1} ms, p95 {:.1} ms",
            self.month,
            quantile_ms(&self.in_force, 0.5),
            quantile_ms(&self.in_force, 0.95),
            quantile_ms(&self.what_if, 0.5),
            quantile_ms(&self.what_if, 0.95),
        );
    }
}

/// Reads the month's cost at the prices in force and with a what-if price for one
/// contract, alternately.
async fn read_month_costs(setup: &Setup, address: SocketAddr) -> MonthReads {
    let month: String = sqlx::query_scalar(
        "SELECT to_char(started_at, 'YYYY-MM') FROM job_records \
         GROUP BY 1 ORDER BY count(*) DESC, 1 LIMIT 1",
    )
    .fetch_one(&setup.http_pool)
    .await
    .expect("finding the busiest month");
    let contract: uuid::Uuid =
        sqlx::query_scalar("SELECT id FROM contracts WHERE name = 'H100 on_demand'")
            .fetch_one(&setup.http_pool)
            .await
            .expect("finding a contract");
    let admin = AdminClient::new(setup, address);
    let plain = format!("/v1/projects/{PROJECT}/cost?month={month}");
    let hypothetical = format!("{plain}&what_if={contract}:5.25");
    let mut reads = MonthReads {
        month,
        in_force: Vec::with_capacity(READS),
        what_if: Vec::with_capacity(READS),
    };
    for _ in 0..READS {
        let (took, _) = admin
            .send(reqwest::Method::GET, &plain, None, StatusCode::OK)
            .await;
        reads.in_force.push(took);
        let (took, text) = admin
            .send(reqwest::Method::GET, &hypothetical, None, StatusCode::OK)
            .await;
        assert!(text.contains("\"hypothetical\":true"), "{text}");
        reads.what_if.push(took);
    }
    reads
}

/// CI's batches while a contract that re-assigns a model's records is created and deleted.
struct ChangeUnderCi {
    /// Records of the model and mode the contract re-assigns, twice.
    reassigned: i64,
    create: Duration,
    delete: Duration,
    /// Batches that ended before the change began, and those that overlapped it.
    before: Vec<Duration>,
    during: Vec<Duration>,
}

const CI_BATCH: usize = 20;
const CI_INTERVAL: Duration = Duration::from_millis(250);
const CI_WARM_UP: Duration = Duration::from_secs(5);

impl ChangeUnderCi {
    /// The longest a batch may wait: 1 s or 5× the median before the change, whichever is
    /// more.
    fn allowed_ms(&self) -> f64 {
        (median_and_max(&self.before).0 * 5.0).max(1000.0)
    }

    fn print(&self) {
        let (before_median, before_max) = median_and_max(&self.before);
        let (during_median, during_max) = median_and_max(&self.during);
        println!(
            "contract change under CI: creating a contract that re-assigns {} records took \
             {:.2}s, deleting it {:.2}s; CI batches of {CI_BATCH} every {} ms: before median \
             {before_median:.1} ms, max {before_max:.1} ms ({} batches); during median \
             {during_median:.1} ms, max {during_max:.1} ms ({} batches); allowed {:.0} ms",
            self.reassigned / 2,
            self.create.as_secs_f64(),
            self.delete.as_secs_f64(),
            CI_INTERVAL.as_millis(),
            self.before.len(),
            self.during.len(),
            self.allowed_ms(),
        );
    }
}

/// Posts a batch of [`CI_BATCH`] new records every [`CI_INTERVAL`] from record `first` on,
/// and meanwhile creates a spot H100 contract for the project, valid over every record,
/// then deletes it: both re-assign every spot H100 record.
async fn change_under_ci(
    setup: &Setup,
    address: SocketAddr,
    generator: &Arc<Generator>,
    first: usize,
) -> ChangeUnderCi {
    let ci = HttpClient::new(address, &setup.token);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let posting = {
        let (generator, stop) = (generator.clone(), stop.clone());
        tokio::spawn(async move {
            let mut batches = Vec::new();
            let mut next = first;
            while !stop.load(Ordering::SeqCst) {
                let started = Instant::now();
                let answer = ci.post(generator.json_body(next, CI_BATCH)).await;
                assert_eq!(answer.accepted, CI_BATCH, "a CI batch was not stored whole");
                batches.push((started, started.elapsed()));
                next += CI_BATCH;
                tokio::time::sleep(CI_INTERVAL.saturating_sub(started.elapsed())).await;
            }
            batches
        })
    };
    tokio::time::sleep(CI_WARM_UP).await;
    let reassigned: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_records WHERE gpu_model = 'H100' AND billing_mode = 'spot'",
    )
    .fetch_one(&setup.http_pool)
    .await
    .expect("counting the records to re-assign");
    let admin = AdminClient::new(setup, address);
    let began = Instant::now();
    let (create, text) = admin
        .send(
            reqwest::Method::POST,
            "/v1/contracts",
            Some(serde_json::json!({
                "name": "bench spot H100", "gpu_model": "H100", "billing_mode": "spot",
                "price_per_gpu_hour": "1.25", "currency": "USD", "project": PROJECT,
                "valid_from": "2020-01-01T00:00:00Z"
            })),
            StatusCode::CREATED,
        )
        .await;
    let id = serde_json::from_str::<serde_json::Value>(&text).expect("a contract")["id"]
        .as_str()
        .expect("the contract's id")
        .to_owned();
    let (delete, _) = admin
        .send(
            reqwest::Method::DELETE,
            &format!("/v1/contracts/{id}"),
            None,
            StatusCode::NO_CONTENT,
        )
        .await;
    let ended = Instant::now();
    tokio::time::sleep(CI_INTERVAL * 4).await;
    stop.store(true, Ordering::SeqCst);
    let batches = posting.await.expect("the CI client panicked");
    let mut result = ChangeUnderCi {
        reassigned: reassigned * 2,
        create,
        delete,
        before: Vec::new(),
        during: Vec::new(),
    };
    for (started, took) in batches {
        if started + took < began {
            result.before.push(took);
        } else if started <= ended {
            result.during.push(took);
        }
    }
    result
}

/// Connections the storage floors spread each statement over, one part each.
const FLOOR_PARTS: usize = CLIENTS;

/// A record's segments as one row: what the record itself decides once, and one array element
/// per segment for what differs between its segments.
const FLOOR_PER_RECORD: &str = "\
CREATE TABLE floor_per_record AS
SELECT project_id, task_id, attempt,
       min(gpu_model) AS gpu_model, min(billing_mode) AS billing_mode, min(outcome) AS outcome,
       min(output_unit) AS output_unit, max(output_quantity) AS output_quantity,
       min(gpu_util) AS gpu_util, min(sm_active) AS sm_active,
       min(tensor_active) AS tensor_active, min(dram_active) AS dram_active,
       min(memory_used_share) AS memory_used_share, min(mig_slices) AS mig_slices,
       min(hour) AS first_hour,
       array_agg(hour ORDER BY seq) AS hours,
       array_agg(contract_id ORDER BY seq) AS contract_ids,
       array_agg(unrated_reason ORDER BY seq) AS unrated_reasons,
       array_agg(gpu_seconds_held ORDER BY seq) AS gpu_seconds_held,
       array_agg(gpu_seconds_busy ORDER BY seq) AS gpu_seconds_busy,
       array_agg(card_seconds ORDER BY seq) AS card_seconds,
       array_agg(productive_seconds ORDER BY seq) AS productive_seconds,
       array_agg(idle_seconds ORDER BY seq) AS idle_seconds,
       array_agg(unmeasured_seconds ORDER BY seq) AS unmeasured_seconds,
       array_agg(failed_seconds ORDER BY seq) AS failed_seconds
FROM rated_segments
GROUP BY project_id, task_id, attempt";

/// What any design that stores rated segments, one row each or one row per record, must at
/// least do at ingest: write those rows once. Timed on the ingest database once the other
/// phases are done, each statement split by task over [`FLOOR_PARTS`] connections in
/// parallel, like the clients of the other phases.
struct Floors {
    records: i64,
    segments: i64,
    /// `rated_segments` as rating lays it out: one row per record, hour and contract.
    per_segment: Floor,
    /// The same segments as one row per record ([`FLOOR_PER_RECORD`]).
    per_record: Floor,
}

/// How long one layout's rows take to write once.
struct Floor {
    write: Duration,
}

async fn measure_floors(url: &str) -> Floors {
    let mut connection = PgConnection::connect(url)
        .await
        .expect("connecting for the storage floors");
    let (records, segments): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM job_records), (SELECT count(*) FROM rated_segments)",
    )
    .fetch_one(&mut connection)
    .await
    .expect("counting records and segments");
    for statement in [
        "CREATE TABLE floor_segments (LIKE rated_segments INCLUDING ALL)",
        FLOOR_PER_RECORD,
        "ALTER TABLE floor_per_record ADD PRIMARY KEY (project_id, task_id, attempt)",
        "CREATE INDEX ON floor_per_record (project_id, first_hour)",
        "CREATE TABLE floor_per_record_copy (LIKE floor_per_record INCLUDING ALL)",
        "VACUUM ANALYZE floor_per_record",
    ] {
        sqlx::query(statement)
            .execute(&mut connection)
            .await
            .unwrap_or_else(|error| panic!("{statement}: {error}"));
    }
    connection.close().await.expect("closing a connection");
    Floors {
        records,
        segments,
        per_segment: measure_floor(url, "rated_segments", "floor_segments").await,
        per_record: measure_floor(url, "floor_per_record", "floor_per_record_copy").await,
    }
}

/// Copies `table` into the empty `copy` of it.
async fn measure_floor(url: &str, table: &str, copy: &str) -> Floor {
    let part = "abs(hashtext(task_id)) % $2 = $1";
    let write = in_parts(
        url,
        &format!("INSERT INTO {copy} SELECT * FROM {table} WHERE {part}"),
    )
    .await;
    Floor { write }
}

/// Runs `statement` for every part on a connection of its own, all at once, after a
/// checkpoint; how long until the last part committed.
async fn in_parts(url: &str, statement: &str) -> Duration {
    let mut connections = Vec::with_capacity(FLOOR_PARTS);
    for _ in 0..FLOOR_PARTS {
        connections.push(
            PgConnection::connect(url)
                .await
                .expect("connecting for a storage floor"),
        );
    }
    sqlx::query("CHECKPOINT")
        .execute(&mut connections[0])
        .await
        .expect("CHECKPOINT");
    let started = Instant::now();
    let parts = connections
        .into_iter()
        .enumerate()
        .map(|(index, mut connection)| {
            let statement = statement.to_owned();
            tokio::spawn(async move {
                let part = i32::try_from(index).expect("a few parts");
                let parts = i32::try_from(FLOOR_PARTS).expect("a few parts");
                sqlx::query(&statement)
                    .bind(part)
                    .bind(parts)
                    .execute(&mut connection)
                    .await
                    .unwrap_or_else(|error| panic!("{statement}: {error}"));
                connection.close().await.expect("closing a connection");
            })
        });
    for part in parts.collect::<Vec<_>>() {
        part.await.expect("a storage floor's part panicked");
    }
    started.elapsed()
}

async fn copy_all(url: &str, generator: &Arc<Generator>, total: usize) -> PhaseResult {
    let mut connections = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let connection = PgConnection::connect(url)
            .await
            .expect("connecting for COPY");
        connections.push(tokio::sync::Mutex::new(connection));
    }
    // One connection per worker: the locks are never contended.
    let connections = Arc::new(connections);
    let generator = generator.clone();
    run_batches(0..total, move |worker, first, count| {
        let (connections, generator) = (connections.clone(), generator.clone());
        async move {
            let text = generator.copy_text(first, count);
            let mut connection = connections[worker].lock().await;
            let mut copy = connection
                .copy_in_raw(COPY_STATEMENT)
                .await
                .expect("starting COPY");
            copy.send(text.into_bytes())
                .await
                .expect("sending COPY data");
            let rows = copy.finish().await.expect("finishing COPY");
            assert_eq!(rows, count as u64, "COPY of the chunk at record {first}");
        }
    })
    .await
}

/// The sizes of both tables, after checking that they hold the same rows.
struct TableSizes {
    http_bytes: i64,
    http_indexes_bytes: i64,
    copy_bytes: i64,
    copy_indexes_bytes: i64,
}

async fn compare_tables(setup: &Setup, total: usize) -> TableSizes {
    let mut sizes = Vec::new();
    let mut fingerprints = Vec::new();
    for url in [&setup.http_url, &setup.copy_url] {
        let mut connection = PgConnection::connect(url)
            .await
            .expect("connecting to compare the tables");
        let (rows, fingerprint): (i64, String) = sqlx::query_as(FINGERPRINT_QUERY)
            .fetch_one(&mut connection)
            .await
            .expect("fingerprinting job_records");
        assert_eq!(rows as usize, total, "rows of job_records in {url}");
        fingerprints.push(fingerprint);
        let size: (i64, i64) = sqlx::query_as(
            "SELECT pg_total_relation_size('job_records'), pg_indexes_size('job_records')",
        )
        .fetch_one(&mut connection)
        .await
        .expect("reading the size of job_records");
        sizes.push(size);
        connection.close().await.expect("closing a connection");
    }
    assert_eq!(
        fingerprints[0], fingerprints[1],
        "the HTTP and COPY databases hold different rows"
    );
    TableSizes {
        http_bytes: sizes[0].0,
        http_indexes_bytes: sizes[0].1,
        copy_bytes: sizes[1].0,
        copy_indexes_bytes: sizes[1].1,
    }
}

/// `/proc/<pid>/stat` counts CPU time in USER_HZ ticks, 100 a second on Linux.
const CLOCK_TICKS_PER_SECOND: u64 = 100;

/// User and system CPU time of this process, all threads.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("reading /proc/self/stat");
    // Fields after "<pid> (<comm>)": state is the first, utime the 12th and stime the 13th.
    let after_comm = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .expect("/proc/self/stat names the command in parentheses");
    let ticks: u64 = after_comm
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|field| {
            field
                .parse::<u64>()
                .expect("utime and stime are tick counts")
        })
        .sum();
    Duration::from_millis(ticks * 1000 / CLOCK_TICKS_PER_SECOND)
}

/// The process's peak resident set (VmHWM), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("reading /proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("/proc/self/status has a VmHWM line in kB")
}

struct Summary {
    total: usize,
    ingest: PhaseResult,
    copy: PhaseResult,
    replay: PhaseResult,
    prices_early: PriceChanges,
    prices: PriceChanges,
    reads: MonthReads,
    change: ChangeUnderCi,
    tables: TableSizes,
    peak_rss_kib: u64,
    floors: Floors,
}

fn print_summary(summary: &Summary) {
    let mib = |bytes: i64| bytes as f64 / (1024.0 * 1024.0);
    let ratio = summary.ingest.rate() / summary.copy.rate();
    let mut table = String::new();
    let mut row = |name: &str, value: String| {
        writeln!(table, "| {name:<34} | {value:>36} |").expect("writing to a String");
    };
    row("records / batch size / clients", {
        format!("{} / {BATCH_SIZE} / {CLIENTS}", summary.total)
    });
    for (name, phase) in [
        ("HTTP ingest", &summary.ingest),
        ("COPY, same rows", &summary.copy),
        ("HTTP replay, all duplicates", &summary.replay),
    ] {
        row(
            name,
            format!(
                "{:.0} records/s ({:.2}s, {:.1} µs CPU)",
                phase.rate(),
                phase.elapsed.as_secs_f64(),
                phase.cpu_micros_per_record()
            ),
        );
    }
    let verdict = |met: bool| if met { "meets" } else { "misses" };
    row(
        "ratio HTTP / COPY",
        format!("{ratio:.2} ({} ≥ 0.30)", verdict(ratio >= 0.30)),
    );
    let replay_ratio = summary.replay.rate() / summary.ingest.rate();
    row(
        "ratio replay / ingest",
        format!("{replay_ratio:.2} ({} ≥ 1.0)", verdict(replay_ratio >= 1.0)),
    );
    let (early_median, early_max) = median_and_max(&summary.prices_early.all());
    let (late_median, late_max) = median_and_max(&summary.prices.all());
    for (records, median, max) in [
        (summary.prices_early.records, early_median, early_max),
        (summary.prices.records, late_median, late_max),
    ] {
        row(
            &format!("price or FX change, {records} records"),
            format!(
                "p50 {median:.1} ms, max {max:.1} ms ({} ≤ 100)",
                verdict(max <= 100.0)
            ),
        );
    }
    let scaling = late_median / early_median;
    row(
        "price change, all ÷ a tenth (p50)",
        format!("{scaling:.2} ({} ≤ 1.5)", verdict(scaling <= 1.5)),
    );
    let reads = &summary.reads;
    row(
        "month cost p50 / p95",
        format!(
            "{:.1} / {:.1} ms",
            quantile_ms(&reads.in_force, 0.5),
            quantile_ms(&reads.in_force, 0.95)
        ),
    );
    let what_if_p95 = quantile_ms(&reads.what_if, 0.95);
    row(
        "what-if month cost p50 / p95",
        format!(
            "{:.1} / {what_if_p95:.1} ms ({} ≤ 50)",
            quantile_ms(&reads.what_if, 0.5),
            verdict(what_if_p95 <= 50.0)
        ),
    );
    let change = &summary.change;
    let during_max = median_and_max(&change.during).1;
    row(
        "CI batch during a contract change",
        format!(
            "max {during_max:.0} ms ({} ≤ {:.0})",
            verdict(during_max <= change.allowed_ms()),
            change.allowed_ms()
        ),
    );
    row(
        "contract create / delete",
        format!(
            "{:.2}s / {:.2}s ({} records)",
            change.create.as_secs_f64(),
            change.delete.as_secs_f64(),
            change.reassigned / 2
        ),
    );
    let rss_mib = summary.peak_rss_kib as f64 / 1024.0;
    row(
        "peak RSS, server and clients",
        format!("{rss_mib:.0} MiB ({} ≤ 150)", verdict(rss_mib <= 150.0)),
    );
    let tables = &summary.tables;
    row(
        "job_records via HTTP (indexes)",
        format!(
            "{:.1} MiB ({:.1} MiB)",
            mib(tables.http_bytes),
            mib(tables.http_indexes_bytes)
        ),
    );
    row(
        "job_records via COPY (indexes)",
        format!(
            "{:.1} MiB ({:.1} MiB)",
            mib(tables.copy_bytes),
            mib(tables.copy_indexes_bytes)
        ),
    );
    let floors = &summary.floors;
    let copy_seconds = summary.copy.elapsed.as_secs_f64();
    row(
        "rated segments per record",
        format!(
            "{:.2} ({} segments)",
            floors.segments as f64 / floors.records as f64,
            floors.segments
        ),
    );
    for (layout, Floor { write }) in [
        ("a row per segment", &floors.per_segment),
        ("a row per record", &floors.per_record),
    ] {
        row(
            &format!("floor: write, {layout}"),
            format!(
                "{:.1}s ({:.2}× COPY; ratio ≤ {:.2})",
                write.as_secs_f64(),
                write.as_secs_f64() / copy_seconds,
                copy_seconds / (copy_seconds + write.as_secs_f64())
            ),
        );
    }
    let (replay_rate, copy_rate) = (summary.replay.rate(), summary.copy.rate());
    row(
        "ratio, rating after the answer",
        format!(
            "≈ {:.2} (replay ÷ (replay + COPY))",
            replay_rate / (replay_rate + copy_rate)
        ),
    );
    println!("\nsummary\n{table}");
    println!(
        "  floors: PostgreSQL alone writing the rated segments (INSERT … SELECT), split by \
         task over {FLOOR_PARTS} connections; \
         ratio ≤ COPY / (COPY + write) bounds HTTP / COPY for any ingest that stores the \
         records and their segments before it answers. An ingest that answered before rating \
         would still read, check and look up every record (what a replay does) and write it \
         (what COPY does): about replay ÷ (replay + COPY) of COPY's rate."
    );
}
