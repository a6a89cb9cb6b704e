//! How long a month of capacity takes to read: 1,000 nodes of 8 GPUs, each known for every
//! hour of November 2026 (up, with six hours down mid-month), in four pools of 250 nodes
//! with each idle rule, and jobs that keep the nodes about half busy: 240 records a node,
//! each naming its node, rated into hourly segments; the capacity rollup is built from them
//! as the service builds it at its first start.
//!
//! Measured, alternating: the whole fleet's month as the monthly report reads it (every
//! pool's paid, used, idle and down time, priced and charged), one pool's utilisation node by
//! node through the router, an owner project's month cost (which charges it its pools' idle
//! time), and the monthly report of every project and pool. Then, alternating, a batch of
//! 1,000 records each naming a node, and the same batch naming none.
//!
//! Last, a cloud bill: a FOCUS CSV billing each of pool `pool-0`'s 250 nodes every hour of
//! the month (180,000 rows), read and stored once, timed; then, alternating, the fleet's
//! month with the bill pricing a quarter of it, the billed pool's utilisation against an
//! unbilled pool of the same size, and the month's reconciliation.
//!
//! Run with `cargo bench --bench capacity`.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

use taskledger::config::{Clock, Settings};
use taskledger::db::embedded::EmbeddedOptions;
use taskledger::domain::access::Role;
use taskledger::domain::capacity_plan::Detail;
use taskledger::domain::what_if::WhatIf;
use taskledger::http::state::AppState;
use taskledger::ledger::capacity::CapacityWindow;
use taskledger::ledger::capacity_rollup;

#[path = "../tests/support/mod.rs"]
mod support;

const RUNS: usize = 7;

/// Ten projects, one H100 price, four pools of 250 nodes (one per idle rule, and a second
/// owned one), each node up all month but for six hours down, and 240 jobs on each.
const LOAD: &str = r#"
INSERT INTO projects (id, name, currency)
SELECT 'p' || lpad(p::text, 3, '0'), 'project ' || p, 'USD' FROM generate_series(0, 9) p;

INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from)
VALUES (md5('h100')::uuid, 'H100 on demand', 'H100', 'on_demand', 2.50, 'USD', '2026-01-01T00:00:00Z');

INSERT INTO pools (id, name, owner_project, share_idle)
VALUES ('pool-0', 'owned', 'p000', 'owner'), ('pool-1', 'shared by use', NULL, 'by_usage'),
       ('pool-2', 'kept', NULL, 'pool'), ('pool-3', 'owned too', 'p001', 'owner');

INSERT INTO capacity_intervals (node, from_at, until_at, pool_id, state, gpu_model, gpus,
                                billing_mode, content_hash)
SELECT 'node-' || lpad(n::text, 4, '0'), s.from_at, s.until_at, 'pool-' || (n % 4), s.state,
       'H100', 8, 'on_demand', decode(md5(n || s.state || s.from_at), 'hex')
FROM generate_series(0, 999) n
CROSS JOIN LATERAL (VALUES
    (timestamptz '2026-11-01T00:00:00Z', timestamptz '2026-11-15T00:00:00Z' + (n % 24) * interval '1 hour', 'up'),
    (timestamptz '2026-11-15T00:00:00Z' + (n % 24) * interval '1 hour',
     timestamptz '2026-11-15T06:00:00Z' + (n % 24) * interval '1 hour', 'down'),
    (timestamptz '2026-11-15T06:00:00Z' + (n % 24) * interval '1 hour', timestamptz '2026-12-01T00:00:00Z', 'up')
) AS s(from_at, until_at, state);

CREATE TEMP TABLE jobs AS
SELECT 'node-' || lpad(n::text, 4, '0') AS node,
       'p' || lpad(((n + j) % 10)::text, 3, '0') AS project_id,
       'n' || n || '-j' || j AS task_id,
       timestamptz '2026-11-01T00:00:00Z' + (j * 3 + n % 2) * interval '1 hour' AS started,
       1 + (n + j) % 2 AS hours,
       1 + j % 8 AS gpus
FROM generate_series(0, 999) n, generate_series(0, 239) j;

INSERT INTO job_records (project_id, task_id, attempt, gpu_model, gpu_count, billing_mode,
                         started_at, ended_at, gpu_seconds_held, outcome, content_hash, nodes)
SELECT project_id, task_id, 1, 'H100', gpus, 'on_demand', started,
       started + hours * interval '1 hour', gpus * hours * 3600, 'completed',
       decode(md5(task_id), 'hex'), ARRAY[node]
FROM jobs;

INSERT INTO rated_segments (project_id, task_id, attempt, seq, hour, gpu_model, billing_mode,
                            outcome, contract_id, unrated_reason, output_unit,
                            gpu_seconds_held, gpu_seconds_busy, card_seconds,
                            productive_seconds, idle_seconds, unmeasured_seconds,
                            failed_seconds, output_quantity)
SELECT j.project_id, j.task_id, 1, h, j.started + h * interval '1 hour', 'H100', 'on_demand',
       'completed', md5('h100')::uuid, NULL, NULL, j.gpus * 3600, NULL, j.gpus * 3600,
       0, 0, j.gpus * 3600, 0, NULL
FROM jobs j CROSS JOIN LATERAL generate_series(0, j.hours - 1) AS h;

DROP TABLE jobs;

INSERT INTO capacity_usage_hourly (project_id, node, hour, gpu_seconds, delta)
SELECT s.project_id, r.nodes[1], s.hour, sum(s.card_seconds), 0
FROM rated_segments s JOIN job_records r USING (project_id, task_id, attempt)
GROUP BY s.project_id, r.nodes[1], s.hour;
"#;

fn median(times: &mut [Duration]) -> (Duration, Duration) {
    times.sort_unstable();
    (
        times[times.len() / 2],
        times[(times.len() * 95 / 100).min(times.len() - 1)],
    )
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
        let options = EmbeddedOptions {
            durable: false,
            max_connections: 20,
            statement_statistics: false,
        };
        let cluster = support::start_cluster(dir.path(), options).await.unwrap();
        let pool =
            support::create_migrated_database(|name| cluster.url(name), "bench_capacity", 4).await;
        let started = Instant::now();
        {
            let mut conn = pool.acquire().await.unwrap();
            sqlx::raw_sql(LOAD).execute(&mut *conn).await.unwrap();
            sqlx::raw_sql("VACUUM ANALYZE")
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        let (intervals, records, segments): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM capacity_intervals), (SELECT count(*) FROM job_records), \
                    (SELECT count(*) FROM rated_segments)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        println!(
            "1000 nodes × 720 hours: {intervals} intervals, {records} records on them, \
             {segments} segments (load {:.1} s)",
            started.elapsed().as_secs_f64()
        );

        let settings = Settings {
            clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
            ..Settings::default()
        };
        let tz = settings.timezone;
        let started = Instant::now();
        assert!(
            capacity_rollup::align_to_time_zone(&pool, tz)
                .await
                .unwrap()
        );
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM capacity_node_days")
            .fetch_one(&pool)
            .await
            .unwrap();
        println!(
            "rollup built: {rows} node-day rows in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let secret = support::insert_token(&pool, "bench", Role::Admin, &[]).await;
        let router = taskledger::http::app(AppState::new(pool.clone(), settings));
        // Answers a request through the router, timed; it must answer 200.
        let timed = |request: axum::http::request::Builder, body: Body| {
            let router = router.clone();
            let request = request
                .header(header::AUTHORIZATION, format!("Bearer {secret}"))
                .body(body)
                .unwrap();
            async move {
                let started = Instant::now();
                let response = router.oneshot(request).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                let elapsed = started.elapsed();
                assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                elapsed
            }
        };
        let get = |uri: &'static str| timed(Request::get(uri), Body::empty());
        let month = taskledger::domain::ledger_time::month_bounds(
            chrono::NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(),
            tz,
        );
        let mut fleet = Vec::new();
        let mut one_pool = Vec::new();
        let mut project = Vec::new();
        let mut report = Vec::new();
        for run in 0..RUNS + 2 {
            let started = Instant::now();
            let mut conn = pool.acquire().await.unwrap();
            let window = CapacityWindow::load(
                &mut conn,
                None,
                month,
                tz,
                &WhatIf::default(),
                Detail::Pools,
            )
            .await
            .unwrap();
            assert_eq!(window.figures.days.len(), 4 * 30);
            let paid: rust_decimal::Decimal =
                window.figures.days.iter().map(|d| d.seconds.paid).sum();
            assert_eq!(paid, rust_decimal::Decimal::from(1000_i64 * 8 * 720 * 3600));
            drop(conn);
            let fleet_time = started.elapsed();
            let pool_time = get("/v1/pools/pool-0/utilisation?month=2026-11").await;
            let project_time = get("/v1/projects/p000/cost?month=2026-11").await;
            let report_time = get("/v1/reports/monthly/2026-11").await;
            // The first two runs warm the caches.
            if run >= 2 {
                fleet.push(fleet_time);
                one_pool.push(pool_time);
                project.push(project_time);
                report.push(report_time);
            }
        }
        for (name, times) in [
            (
                "the fleet's month (1,000 nodes), read and priced",
                &mut fleet,
            ),
            (
                "one pool's utilisation, node by node (250 nodes)",
                &mut one_pool,
            ),
            ("an owner project's month cost", &mut project),
            ("the monthly report (10 projects, 4 pools)", &mut report),
        ] {
            let (median, p95) = median(times);
            println!(
                "{name:<52} median {:>8.1} ms   p95 {:>8.1} ms",
                median.as_secs_f64() * 1000.0,
                p95.as_secs_f64() * 1000.0
            );
        }
        // What naming nodes costs ingest: a batch of 1,000 one-hour records, one per node
        // (each rewrites its node-day's rollup rows), against the same batch naming none.
        let post = |body: String| {
            timed(
                Request::post("/v1/job-records").header(header::CONTENT_TYPE, "application/json"),
                Body::from(body),
            )
        };
        let batch = |run: usize, with_nodes: bool| {
            let records: Vec<serde_json::Value> = (0..1000)
                .map(|n| {
                    let mut record = serde_json::json!({
                        "project": format!("p{:03}", n % 10),
                        "task_id": format!("ingest-{run}-{with_nodes}-{n}"),
                        "gpu_model": "H100", "gpu_count": 4,
                        "started_at": format!("2026-11-{:02}T{:02}:00:00Z", 1 + run, n % 24),
                        "ended_at": format!("2026-11-{:02}T{:02}:59:00Z", 1 + run, n % 24),
                        "outcome": "completed"
                    });
                    if with_nodes {
                        record["nodes"] = serde_json::json!([format!("node-{n:04}")]);
                    }
                    record
                })
                .collect();
            serde_json::to_string(&records).unwrap()
        };
        let mut with_nodes = Vec::new();
        let mut without_nodes = Vec::new();
        for run in 0..RUNS + 2 {
            let named = post(batch(run, true)).await;
            let unnamed = post(batch(run, false)).await;
            if run >= 2 {
                with_nodes.push(named);
                without_nodes.push(unnamed);
            }
        }
        let (named, _) = median(&mut with_nodes);
        let (unnamed, _) = median(&mut without_nodes);
        println!(
            "ingest of 1,000 records: naming a node each {:.1} ms, naming none {:.1} ms \
             (ratio {:.2})",
            named.as_secs_f64() * 1000.0,
            unnamed.as_secs_f64() * 1000.0,
            named.as_secs_f64() / unnamed.as_secs_f64()
        );
        // The billed pool's nodes carry the cloud ids the bill names.
        sqlx::query(
            "UPDATE capacity_intervals \
             SET labels = jsonb_build_object('provider_id', 'aws:///us-east-1a/i-' || node), \
                 resource_keys = ARRAY[node, 'i-' || node, 'us-east-1a/i-' || node] \
             WHERE pool_id = 'pool-0'",
        )
        .execute(&pool)
        .await
        .unwrap();
        let mut bill = String::from(
            "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,ChargeCategory,\
             ChargeDescription,ChargePeriodEnd,ChargePeriodStart,ConsumedQuantity,ConsumedUnit,\
             PricingCategory,ProviderName,RegionId,ResourceId,ServiceName,SkuId,Tags\n",
        );
        let start: chrono::DateTime<chrono::Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
        for n in (0..1000).step_by(4) {
            for hour in 0..720 {
                let from = start + chrono::TimeDelta::hours(hour);
                let until = from + chrono::TimeDelta::hours(1);
                bill.push_str(&format!(
                    "98.32,\"111\",\"USD\",\"2026-11-01 00:00:00\",\"Usage\",\
                     \"$98.32 per On Demand Linux p5.48xlarge Instance Hour\",\"{}\",\"{}\",1.0,\
                     \"Hours\",\"Standard\",\"AWS\",\"us-east-1\",\"i-node-{n:04}\",\
                     \"Amazon Elastic Compute Cloud\",\"P5\",NULL\n",
                    until.format("%Y-%m-%d %H:%M:%S"),
                    from.format("%Y-%m-%d %H:%M:%S"),
                ));
            }
        }
        let bytes = bill.len();
        let started = Instant::now();
        let parsed = taskledger::sources::focus::parse_bill(&bill).unwrap();
        let read = started.elapsed();
        let rows = parsed.rows.len();
        let (receipt, _) = taskledger::ledger::bills::post_bill(
            &pool,
            parsed,
            None,
            tz,
            &taskledger::domain::access::Actor::system("benchmark"),
        )
        .await
        .unwrap();
        println!(
            "a bill of {rows} rows ({:.1} MB): read {:.0} ms, stored {:.0} ms in all, \
             {} rows on nodes",
            bytes as f64 / 1e6,
            read.as_secs_f64() * 1000.0,
            started.elapsed().as_secs_f64() * 1000.0,
            receipt.matched_rows
        );
        drop(bill);
        let (mut fleet, mut billed_pool, mut unbilled_pool, mut reconciliation) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for run in 0..RUNS + 2 {
            let started = Instant::now();
            let mut conn = pool.acquire().await.unwrap();
            let window = CapacityWindow::load(
                &mut conn,
                None,
                month,
                tz,
                &WhatIf::default(),
                Detail::Pools,
            )
            .await
            .unwrap();
            assert_eq!(window.billed.len(), 250, "one price a node");
            drop(conn);
            let fleet_time = started.elapsed();
            let billed_time = get("/v1/pools/pool-0/utilisation?month=2026-11").await;
            let unbilled_time = get("/v1/pools/pool-2/utilisation?month=2026-11").await;
            let reconciliation_time = get("/v1/reports/monthly/2026-11/reconciliation").await;
            if run >= 2 {
                fleet.push(fleet_time);
                billed_pool.push(billed_time);
                unbilled_pool.push(unbilled_time);
                reconciliation.push(reconciliation_time);
            }
        }
        for (name, times) in [
            ("the fleet's month, a quarter of it billed", &mut fleet),
            (
                "the billed pool's utilisation (250 nodes)",
                &mut billed_pool,
            ),
            (
                "an unbilled pool's utilisation (250 nodes)",
                &mut unbilled_pool,
            ),
            (
                "the month's reconciliation (180,000 rows)",
                &mut reconciliation,
            ),
        ] {
            let (median, p95) = median(times);
            println!(
                "{name:<52} median {:>8.1} ms   p95 {:>8.1} ms",
                median.as_secs_f64() * 1000.0,
                p95.as_secs_f64() * 1000.0
            );
        }
        pool.close().await;
        cluster.stop().await.unwrap();
    });
}
