//! How long the month cost query, the task list and the monthly report take at 1 million and
//! 10 million job records a month.
//!
//! Each size gets its own database on an embedded cluster. The month is generated set-based
//! in SQL into the tables `rate_records` fills (segments, per-record figures, the daily and
//! monthly rollups aggregated from them, as compaction leaves them, and each
//! task's status and figures per month), across 1,000 projects, four GPU models, three
//! billing modes and every hour of November 2026; each project also has a reserved contract
//! with a commitment, so unused commitment is computed too. The job records the segments
//! were cut from are stored as well, two in three with the time they were queued, so that
//! the attempts' queue wait is read too. Each query then runs through the real router, as a
//! reader would call it, for rotating projects: the month's cost, the same at what-if prices,
//! the month's cost by day,
//! the 50 costliest tasks of the month (and the next 50, through the cursor), the 50 most
//! wasteful, and the 50 costliest of a fortnight. Then finance's monthly report of every
//! project: of the open month, of the same month once closed, and of the month after it (which
//! books what changed in a closed month as adjustments), with the statements they spent their
//! database time in.
//!
//! Run with `cargo bench --bench cost_query`; `TASKLEDGER_BENCH_RECORDS=1000000` runs one
//! size only, `TASKLEDGER_BENCH_PROJECTS=200` spreads the records over fewer projects.
//!
//! With `TASKLEDGER_BENCH_CITUS_CLUSTER=DIR`, the directory of a running Citus cluster
//! (`.ci/citus-cluster start DIR`), each size's database is made on that cluster instead and
//! loaded into the coordinator's own tables. The reads run there first, as on one PostgreSQL,
//! then the database is distributed by project (`taskledger citus distribute`) and they run
//! again, the month closed this time: the same data, read both ways.
//! `TASKLEDGER_BENCH_CITUS_SHARDS=8` distributes with 8 shards per table instead of Citus'
//! default; `TASKLEDGER_BENCH_KEEP=1` keeps each size's database afterwards.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use sqlx::{Connection, PgConnection, PgPool};
use tower::ServiceExt;

use taskledger::config::Settings;
use taskledger::db::embedded::{EmbeddedOptions, EmbeddedPostgres};
use taskledger::domain::access::Role;
use taskledger::http::state::AppState;

#[path = "support/statements.rs"]
mod statements;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "../tests/support/citus.rs"]
mod support_citus;

const DEFAULT_PROJECTS: i64 = 1_000;
const PROJECTS_ENV: &str = "TASKLEDGER_BENCH_PROJECTS";
/// Runs of each monthly report (the whole organisation's month, far heavier than one
/// project's queries).
const REPORT_RUNS: usize = 10;
const RUNS: usize = 40;
const SIZES: [i64; 2] = [1_000_000, 10_000_000];
const RECORDS_ENV: &str = "TASKLEDGER_BENCH_RECORDS";

/// Projects, one unscoped contract per model and mode, one committed reservation per project.
const SETUP: &str = r#"
INSERT INTO projects (id, name, currency)
SELECT 'p' || lpad(p::text, 3, '0'), 'project ' || p, 'USD' FROM generate_series(0, $1 - 1) p;

INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from)
SELECT md5(m || '/' || b)::uuid, m || ' ' || b, m, b,
       (ARRAY[2.50, 1.10, 0.90, 4.20])[mi] * (ARRAY[1, 0.4, 0.7])[bi], 'USD', '2026-01-01T00:00:00Z'
FROM unnest(ARRAY['H100', 'A100', 'L40S', 'B200']) WITH ORDINALITY AS models(m, mi),
     unnest(ARRAY['on_demand', 'spot', 'reserved']) WITH ORDINALITY AS modes(b, bi);

INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from,
                       project_id, committed_gpus)
SELECT md5('own/' || id)::uuid, 'own ' || id, 'A100', 'reserved', 0.95, 'USD',
       '2026-11-01T00:00:00Z', id, 4
FROM projects;
"#;

/// `$1` records, each of 1 to 3 whole hours in November 2026, cut into one segment per hour,
/// each with the card-seconds its contract's price applies to when a figure is read.
const SEGMENTS: &str = r#"
INSERT INTO rated_segments
SELECT r.project_id, r.task_id, 1, h.seq, r.started + h.seq * interval '1 hour',
       r.gpu_model, r.billing_mode, r.outcome, coalesce(own.id, c.id), NULL, r.output_unit,
       r.gpus * 3600, CASE WHEN r.measured THEN r.gpus * 3600 * r.busy_share END,
       card.seconds,
       CASE WHEN r.outcome = 'completed' AND r.measured THEN card.seconds * r.busy_share ELSE 0 END,
       CASE WHEN r.outcome = 'completed' AND r.measured THEN card.seconds * (1 - r.busy_share) ELSE 0 END,
       CASE WHEN r.outcome = 'completed' AND NOT r.measured THEN card.seconds ELSE 0 END,
       CASE WHEN r.outcome <> 'completed' THEN card.seconds ELSE 0 END,
       CASE WHEN h.seq = r.hours - 1 AND r.output_unit IS NOT NULL THEN r.gpus * 1000000 END
FROM (
  SELECT 'p' || lpad((i % $2)::text, 3, '0') AS project_id,
         't' || i AS task_id,
         (ARRAY['H100', 'A100', 'L40S', 'B200'])[1 + (i / 7) % 4] AS gpu_model,
         (ARRAY['on_demand', 'spot', 'reserved'])[1 + (i / 3) % 3] AS billing_mode,
         (ARRAY['completed', 'completed', 'completed', 'completed', 'completed', 'completed',
                'failed', 'preempted', 'cancelled', 'completed'])[1 + (i / 11) % 10] AS outcome,
         (ARRAY['tokens', 'samples', NULL])[1 + (i / 13) % 3] AS output_unit,
         timestamptz '2026-11-01T00:00:00Z' + ((i * 7919) % 717) * interval '1 hour' AS started,
         1 + (i / 17) % 3 AS hours,
         (ARRAY[1, 2, 4, 8])[1 + (i / 19) % 4] AS gpus,
         (i % 5) <> 0 AS measured,
         ((i % 90) + 10) / 100.0 AS busy_share
  FROM generate_series(1, $1) AS i
) r
CROSS JOIN LATERAL generate_series(0, r.hours - 1) AS h(seq)
JOIN contracts c ON c.gpu_model = r.gpu_model AND c.billing_mode = r.billing_mode
                AND c.project_id IS NULL
LEFT JOIN contracts own ON own.project_id = r.project_id AND own.gpu_model = r.gpu_model
                       AND own.billing_mode = r.billing_mode
CROSS JOIN LATERAL (SELECT r.gpus * 3600 AS seconds) card;
"#;

/// The job records the segments were cut from (task `t<i>` is the `i`th); two in three of
/// each project's were queued for up to 90 minutes, to the millisecond, before they started.
const RECORDS: &str = r#"
INSERT INTO job_records (project_id, task_id, attempt, gpu_model, gpu_count, billing_mode,
                         queued_at, started_at, ended_at, gpu_seconds_held, gpu_seconds_busy,
                         outcome, output_quantity, output_unit, content_hash)
SELECT project_id, task_id, attempt, min(gpu_model), min(gpu_seconds_held) / 3600,
       min(billing_mode),
       CASE WHEN substr(task_id, 2)::bigint % 3 <> 0
            THEN min(hour) - (substr(task_id, 2)::bigint * 7919 % 5400000) * interval '1 millisecond'
       END,
       min(hour), max(hour) + interval '1 hour', sum(gpu_seconds_held), sum(gpu_seconds_busy),
       min(outcome), sum(output_quantity), min(output_unit), decode(md5(task_id), 'hex')
FROM rated_segments
GROUP BY project_id, task_id, attempt;
"#;

const ROLLUPS: &str = r#"
INSERT INTO rated_records
SELECT project_id, task_id, attempt, max(hour), min(gpu_model), min(billing_mode), min(outcome),
       0, (min(outcome) <> 'completed')::int, min(outcome) = 'completed', min(outcome) <> 'completed'
FROM rated_segments GROUP BY project_id, task_id, attempt;

INSERT INTO cost_daily
SELECT project_id, (hour AT TIME ZONE 'UTC')::date, gpu_model, billing_mode, outcome, contract_id,
       unrated_reason, output_unit, sum(segments), sum(gpu_seconds_held), sum(gpu_seconds_busy),
       sum(card_seconds), sum(productive_seconds), sum(idle_seconds), sum(unmeasured_seconds),
       sum(failed_seconds), sum(output_quantity)
FROM cost_hourly GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

INSERT INTO records_daily
SELECT project_id, (hour AT TIME ZONE 'UTC')::date, gpu_model, billing_mode, outcome,
       sum(records), sum(retries), sum(failures), sum(tasks_completed), sum(tasks_failed)
FROM records_hourly GROUP BY 1, 2, 3, 4, 5;

INSERT INTO cost_monthly
SELECT project_id, date_trunc('month', day)::date, gpu_model, billing_mode, outcome, contract_id,
       unrated_reason, output_unit, sum(segments), sum(gpu_seconds_held), sum(gpu_seconds_busy),
       sum(card_seconds), sum(productive_seconds), sum(idle_seconds), sum(unmeasured_seconds),
       sum(failed_seconds), sum(output_quantity)
FROM cost_daily GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

INSERT INTO cost_monthly_kinds
  (project_id, month, completed, unrated_reason, contract_id, gpu_model, billing_mode, output_unit,
   segments, gpu_seconds_held, gpu_seconds_busy, card_seconds, productive_seconds, idle_seconds,
   unmeasured_seconds, failed_seconds, output_quantity)
SELECT project_id, month, outcome = 'completed', unrated_reason, contract_id, gpu_model,
       billing_mode, CASE WHEN outcome = 'completed' THEN output_unit END,
       sum(segments), sum(gpu_seconds_held), sum(gpu_seconds_busy), sum(card_seconds),
       sum(productive_seconds), sum(idle_seconds), sum(unmeasured_seconds), sum(failed_seconds),
       sum(output_quantity)
FROM cost_monthly GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;

INSERT INTO records_monthly
SELECT project_id, date_trunc('month', day)::date, gpu_model, billing_mode, outcome,
       sum(records), sum(retries), sum(failures), sum(tasks_completed), sum(tasks_failed)
FROM records_daily GROUP BY 1, 2, 3, 4, 5;

INSERT INTO contract_usage_daily
SELECT contract_id, day, hours, segments, used, usage_sorted(used), usage_running_sums(used)
FROM (
  SELECT contract_id, (hour AT TIME ZONE 'UTC')::date AS day, array_agg(hour ORDER BY hour) AS hours,
         array_agg(segments ORDER BY hour) AS segments, array_agg(used ORDER BY hour) AS used
  FROM (
    SELECT contract_id, hour, sum(segments) AS segments, sum(gpu_seconds_held) AS used
    FROM cost_hourly WHERE contract_id IS NOT NULL AND billing_mode = 'reserved'
    GROUP BY contract_id, hour) AS hours
  GROUP BY 1, 2) AS days;

INSERT INTO tasks (project_id, task_id, status, completed_at, first_started_at, last_ended_at,
                   gpu_models)
SELECT project_id, task_id, min(outcome),
       CASE WHEN min(outcome) = 'completed' THEN max(hour) + interval '1 hour' END,
       min(hour), max(hour) + interval '1 hour', ARRAY[min(gpu_model)]
FROM rated_segments GROUP BY project_id, task_id;

INSERT INTO task_monthly
  (project_id, task_id, month, contract_id, gpu_model, billing_mode, segments, card_seconds,
   productive_seconds, idle_seconds, unmeasured_seconds, failed_seconds, gpu_seconds_held,
   gpu_seconds_busy, unrated_gpu_seconds, output, attempts, failed_attempts, retries, failures,
   queue_wait_seconds, queue_waits)
SELECT project_id, task_id, date_trunc('month', hour AT TIME ZONE 'UTC')::date, contract_id,
       gpu_model, billing_mode, sum(segments), sum(card_seconds), sum(productive_seconds),
       sum(idle_seconds), sum(unmeasured_seconds), sum(failed_seconds),
       sum(gpu_seconds_held), sum(gpu_seconds_busy), sum(unrated_gpu_seconds),
       sum_quantities(output), sum(attempts), sum(failed_attempts), sum(retries),
       sum(failures), sum(queue_wait_seconds), sum(queue_waits)
FROM task_hourly GROUP BY 1, 2, 3, 4, 5, 6;
"#;

/// Secondary indexes are built once after the bulk load, as one would for an import.
const DROP_INDEXES: &str = "DROP INDEX rated_segments_by_hour, rated_records_by_end, \
                            job_records_by_start";
const CREATE_INDEXES: &str = r#"
CREATE INDEX job_records_by_start ON job_records (project_id, started_at, task_id, attempt)
    INCLUDE (queued_at);
CREATE INDEX rated_segments_by_hour ON rated_segments (project_id, hour);
CREATE INDEX rated_records_by_end ON rated_records (project_id, end_hour);
"#;

async fn execute_script(conn: &mut PgConnection, script: &str) {
    sqlx::raw_sql(script).execute(conn).await.expect(script);
}

async fn load(conn: &mut PgConnection, records: i64, projects: i64) {
    execute_script(conn, DROP_INDEXES).await;
    sqlx::query(SETUP.split(";\n").next().unwrap())
        .bind(projects)
        .execute(&mut *conn)
        .await
        .unwrap();
    for statement in SETUP.split(";\n").skip(1).filter(|s| !s.trim().is_empty()) {
        execute_script(conn, statement).await;
    }
    sqlx::query(SEGMENTS)
        .bind(records)
        .bind(projects)
        .execute(&mut *conn)
        .await
        .unwrap();
    execute_script(conn, RECORDS).await;
    execute_script(conn, ROLLUPS).await;
    execute_script(conn, CREATE_INDEXES).await;
    execute_script(conn, "VACUUM ANALYZE").await;
}

fn percentile(sorted: &[Duration], pct: usize) -> Duration {
    sorted[(sorted.len() * pct / 100).min(sorted.len() - 1)]
}

/// Where the benchmark's databases are: the embedded cluster, or a running Citus cluster
/// (`.ci/citus-cluster start DIR`) named by `TASKLEDGER_BENCH_CITUS_CLUSTER`.
enum Server {
    Embedded(EmbeddedPostgres),
    Citus(PathBuf),
}

const CITUS_ENV: &str = "TASKLEDGER_BENCH_CITUS_CLUSTER";
/// Shards per distributed table on Citus (`taskledger citus distribute --shard-count`).
const SHARDS_ENV: &str = "TASKLEDGER_BENCH_CITUS_SHARDS";
/// `1` keeps each size's database, to look into its plans afterwards.
const KEEP_ENV: &str = "TASKLEDGER_BENCH_KEEP";

impl Server {
    /// A new, migrated database `name`.
    async fn database(&self, name: &str) -> PgPool {
        match self {
            Server::Embedded(cluster) => {
                support::create_migrated_database(|db| cluster.url(db), name, 4).await
            }
            Server::Citus(dir) => {
                support_citus::create_migrated_citus_database(dir, name, 4)
                    .await
                    .1
            }
        }
    }

    /// The `postgres` database of every node.
    fn admin_urls(&self) -> Vec<String> {
        match self {
            Server::Embedded(cluster) => vec![cluster.url("postgres")],
            Server::Citus(dir) => support_citus::citus_node_urls(dir),
        }
    }
}

async fn measure(server: &Server, records: i64, projects: i64) {
    let database = format!("bench_{records}");
    let pool = server.database(&database).await;

    let started = Instant::now();
    load(&mut pool.acquire().await.unwrap(), records, projects).await;
    let load_time = started.elapsed();
    let (segments, rollup_rows): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM rated_segments), \
                (SELECT count(*) FROM cost_daily) + (SELECT count(*) FROM cost_monthly)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let secret = support::insert_token(&pool, "bench", Role::Admin, &[]).await;
    let router = taskledger::http::app(AppState::new(pool.clone(), Settings::default()));
    println!(
        "{records:>9} records of {projects} projects ({segments} segments, {rollup_rows} cost \
         rollup rows, load {:.1} s)",
        load_time.as_secs_f64()
    );
    let reader = Reader { router, secret };
    match server {
        Server::Embedded(_) => {
            reader.project_reads(records, projects, "").await;
            reader.reports(&pool, records, projects, "", true).await;
        }
        Server::Citus(_) => {
            // The same data read first from the coordinator's own tables, as one PostgreSQL
            // with Citus loaded, then distributed over the workers.
            let local = "one node, ";
            reader.project_reads(records, projects, local).await;
            reader.reports(&pool, records, projects, local, false).await;
            let started = Instant::now();
            let shards = std::env::var(SHARDS_ENV).ok().map(|raw| {
                raw.parse()
                    .expect("TASKLEDGER_BENCH_CITUS_SHARDS: a number")
            });
            let placed = taskledger::ledger::citus::distribute(&pool, shards)
                .await
                .unwrap();
            sqlx::query("ANALYZE").execute(&pool).await.unwrap();
            println!(
                "{records:>9} records: distributed over the workers in {:.1} s ({placed:?})",
                started.elapsed().as_secs_f64()
            );
            let citus = "Citus, ";
            reader.project_reads(records, projects, citus).await;
            reader.reports(&pool, records, projects, citus, true).await;
        }
    }
    pool.close().await;
    if std::env::var(KEEP_ENV).is_ok_and(|keep| keep == "1") {
        println!("{records:>9} records: database {database} kept");
        return;
    }
    for url in server.admin_urls() {
        let mut admin = PgConnection::connect(&url).await.unwrap();
        sqlx::query(&format!("DROP DATABASE {database} WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// The real router and a token to read with.
struct Reader {
    router: axum::Router,
    secret: String,
}

impl Reader {
    /// Sends `request` with the token as a reader would: how long it took, the status and
    /// the body.
    async fn send(
        &self,
        request: axum::http::request::Builder,
    ) -> (Duration, StatusCode, axum::body::Bytes) {
        let request = request
            .header(header::AUTHORIZATION, format!("Bearer {}", self.secret))
            .body(Body::empty())
            .unwrap();
        let started = Instant::now();
        let response = self.router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (started.elapsed(), status, body)
    }

    /// Reads `uri`: how long it took, and the body.
    async fn get(&self, uri: String) -> (Duration, axum::body::Bytes) {
        let (elapsed, status, body) = self.send(Request::get(uri)).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
        (elapsed, body)
    }

    /// One project's reads, for rotating projects; `label` prefixes each line's name.
    async fn project_reads(&self, records: i64, projects: i64, label: &str) {
        let queries: [(&str, &str); 7] = [
            (
                "month cost",
                "cost?month=2026-11&as_of=2026-11-20T00:00:00Z",
            ),
            (
                "month cost, what-if prices",
                "cost?month=2026-11&as_of=2026-11-20T00:00:00Z&what_if=H100/on_demand:3.10\
                 &what_if=A100/reserved:0.80",
            ),
            (
                "month cost by day",
                "cost?month=2026-11&as_of=2026-11-20T00:00:00Z&group_by=day",
            ),
            (
                "50 costliest tasks of the month",
                "tasks?month=2026-11&limit=50",
            ),
            (
                "the next 50 by cost",
                "tasks?month=2026-11&limit=50&cursor={cursor}",
            ),
            (
                "50 most wasteful tasks of the month",
                "tasks?month=2026-11&limit=50&sort=waste",
            ),
            (
                "50 costliest tasks of a fortnight",
                "tasks?from=2026-11-03&to=2026-11-17&limit=50",
            ),
        ];
        for (name, query) in queries {
            let mut timings = Vec::with_capacity(RUNS);
            for run in 0..RUNS + 3 {
                let project = format!("p{:03}", (run * 37) % projects as usize);
                let base = format!("/v1/projects/{project}");
                let query = if query.contains("{cursor}") {
                    let (_, first) = self
                        .get(format!("{base}/tasks?month=2026-11&limit=50"))
                        .await;
                    let first: serde_json::Value = serde_json::from_slice(&first).unwrap();
                    query.replace("{cursor}", first["next_cursor"].as_str().unwrap())
                } else {
                    query.to_owned()
                };
                let (elapsed, body) = self.get(format!("{base}/{query}")).await;
                if query.starts_with("tasks") {
                    let page: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    assert_eq!(page["items"].as_array().unwrap().len(), 50);
                }
                // The first runs warm the connection pool and the cache.
                if run >= 3 {
                    timings.push(elapsed);
                }
            }
            timings.sort();
            println!(
                "{records:>9} records: {label}{name:<36} median {:>7.2} ms, p95 {:>7.2} ms over {RUNS} runs",
                percentile(&timings, 50).as_secs_f64() * 1000.0,
                percentile(&timings, 95).as_secs_f64() * 1000.0,
            );
        }
    }

    /// Finance's monthly report of every project: of the open month and, with `close`, of
    /// the same month once closed and of the month after it.
    async fn reports(&self, pool: &PgPool, records: i64, projects: i64, label: &str, close: bool) {
        // The organisation's month for finance: open, closed, and the next month, whose report
        // books what changed in the closed one as adjustments.
        let profiled = statements::reset(pool).await;
        let reports = [
            ("monthly report, open month", "/v1/reports/monthly/2026-11"),
            (
                "monthly report, closed month",
                "/v1/reports/monthly/2026-11",
            ),
            (
                "monthly report after a closed month",
                "/v1/reports/monthly/2026-12",
            ),
        ];
        for (i, (name, uri)) in reports.into_iter().enumerate() {
            if i > 0 && !close {
                break;
            }
            if i == 1 {
                let (took, status, body) = self
                    .send(Request::post("/v1/reports/monthly/2026-11/close"))
                    .await;
                assert!(status.is_success(), "{}", String::from_utf8_lossy(&body));
                println!(
                    "{records:>9} records: {label}closing the month took {:.2} ms",
                    took.as_secs_f64() * 1000.0
                );
            }
            let mut timings = Vec::with_capacity(REPORT_RUNS);
            for run in 0..REPORT_RUNS + 1 {
                let (elapsed, body) = self.get(uri.to_owned()).await;
                let report: serde_json::Value = serde_json::from_slice(&body).unwrap();
                if i < 2 {
                    assert_eq!(
                        report["projects"].as_array().unwrap().len(),
                        projects as usize
                    );
                }
                if run >= 1 {
                    timings.push(elapsed);
                }
            }
            timings.sort();
            println!(
                "{records:>9} records: {label}{name:<36} median {:>7.2} ms, p95 {:>7.2} ms over \
                 {REPORT_RUNS} runs",
                percentile(&timings, 50).as_secs_f64() * 1000.0,
                percentile(&timings, 95).as_secs_f64() * 1000.0,
            );
        }
        if profiled {
            statements::print(pool, "the monthly reports").await;
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::Builder::new()
            .prefix("taskledger-bench-")
            .tempdir()
            .unwrap();
        let server = match std::env::var(CITUS_ENV).ok().filter(|d| !d.is_empty()) {
            Some(cluster) => Server::Citus(PathBuf::from(cluster)),
            None => {
                let options = EmbeddedOptions {
                    durable: false,
                    max_connections: 20,
                    statement_statistics: true,
                };
                Server::Embedded(support::start_cluster(dir.path(), options).await.unwrap())
            }
        };
        let sizes = match std::env::var(RECORDS_ENV) {
            Ok(raw) => vec![
                raw.parse()
                    .expect("TASKLEDGER_BENCH_RECORDS: a number of records"),
            ],
            Err(_) => SIZES.to_vec(),
        };
        let projects = match std::env::var(PROJECTS_ENV) {
            Ok(raw) => raw
                .parse()
                .expect("TASKLEDGER_BENCH_PROJECTS: a number of projects"),
            Err(_) => DEFAULT_PROJECTS,
        };
        assert!(
            (1..=1_000).contains(&projects),
            "TASKLEDGER_BENCH_PROJECTS: from 1 to 1000 (project ids have three digits)"
        );
        for records in sizes {
            measure(&server, records, projects).await;
        }
        if let Server::Embedded(cluster) = server {
            cluster.stop().await.unwrap();
        }
    });
}
