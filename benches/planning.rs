//! How long commitment planning takes over a year of hourly use: 20 GPU models, each with a
//! reserved (committing 24 GPUs), an on-demand and a spot contract, and five records an hour
//! of each model for every hour from December 2025 to November 2026 (8,760 hours): three on
//! demand, one reserved and one on spot (a tenth of those preempted), of 1 to 8 GPUs with a
//! daily cycle, spread over ten projects. The reservations' usage is compacted into the daily
//! rollup as the service keeps it.
//!
//! Measured, alternating, through the router: one model's plan over the year, one model's
//! plan over a month, and the plans of all 20 models over the year one after another.
//!
//! Run with `cargo bench --bench planning`.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use tower::ServiceExt;

use taskledger::config::{Clock, Settings};
use taskledger::db::embedded::EmbeddedOptions;
use taskledger::domain::access::Role;
use taskledger::http::state::AppState;

#[path = "../tests/support/mod.rs"]
mod support;

const RUNS: usize = 7;

const LOAD: &str = r#"
INSERT INTO projects (id, name, currency)
SELECT 'p' || lpad(p::text, 3, '0'), 'project ' || p, 'USD' FROM generate_series(0, 9) p;

INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency,
                       valid_from, committed_gpus)
SELECT md5(m.model || k.mode)::uuid, m.model || ' ' || k.mode, m.model, k.mode, k.price,
       'USD', '2025-01-01T00:00:00Z', CASE WHEN k.mode = 'reserved' THEN 24 END
FROM (SELECT 'M' || lpad(m::text, 2, '0') AS model FROM generate_series(0, 19) m) m
CROSS JOIN (VALUES ('reserved', 1.60), ('on_demand', 2.80), ('spot', 1.10)) AS k(mode, price);

CREATE TEMP TABLE jobs AS
SELECT 'p' || lpad(((h + k + m) % 10)::text, 3, '0') AS project_id,
       'M' || lpad(m::text, 2, '0') AS gpu_model,
       'm' || m || '-h' || h || '-k' || k AS task_id,
       timestamptz '2025-12-01T00:00:00Z' + h * interval '1 hour' AS hour,
       CASE WHEN k < 3 THEN 'on_demand' WHEN k = 3 THEN 'reserved' ELSE 'spot' END AS mode,
       CASE WHEN k = 4 AND (h + m) % 10 = 0 THEN 'preempted' ELSE 'completed' END AS outcome,
       (1 + (h * 7 + m * 3 + k) % 4 + CASE WHEN h % 24 BETWEEN 8 AND 19 THEN 4 ELSE 0 END)
           * 3600 AS card_seconds
FROM generate_series(0, 8759) h, generate_series(0, 19) m, generate_series(0, 4) k;

INSERT INTO rated_segments (project_id, task_id, attempt, seq, hour, gpu_model, billing_mode,
                            outcome, contract_id, unrated_reason, output_unit,
                            gpu_seconds_held, gpu_seconds_busy, card_seconds,
                            productive_seconds, idle_seconds, unmeasured_seconds,
                            failed_seconds, output_quantity)
SELECT project_id, task_id, 1, 0, hour, gpu_model, mode, outcome,
       md5(gpu_model || mode)::uuid, NULL, NULL, card_seconds, NULL, card_seconds,
       0, 0, CASE WHEN outcome = 'completed' THEN card_seconds ELSE 0 END,
       CASE WHEN outcome = 'completed' THEN 0 ELSE card_seconds END, NULL
FROM jobs;

INSERT INTO rated_records (project_id, task_id, attempt, end_hour, gpu_model, billing_mode,
                           outcome, retries, failures, completes_task, fails_task)
SELECT project_id, task_id, 1, hour, gpu_model, mode, outcome, 0, 0,
       outcome = 'completed', outcome <> 'completed'
FROM jobs;

INSERT INTO contract_usage_hourly (contract_id, hour, project_id, segments, gpu_seconds_held,
                                   delta)
SELECT md5(gpu_model || mode)::uuid, hour, project_id, count(*), sum(card_seconds), 1
FROM jobs WHERE mode = 'reserved'
GROUP BY 1, 2, 3;

DROP TABLE jobs;
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
            support::create_migrated_database(|name| cluster.url(name), "bench_planning", 4).await;
        let started = Instant::now();
        {
            let mut conn = pool.acquire().await.unwrap();
            sqlx::raw_sql(LOAD).execute(&mut *conn).await.unwrap();
        }
        taskledger::store::rollups::compact(&pool)
            .await
            .unwrap()
            .expect("no other compaction");
        sqlx::raw_sql("VACUUM ANALYZE")
            .execute(&pool)
            .await
            .unwrap();
        let segments: i64 = sqlx::query_scalar("SELECT count(*) FROM rated_segments")
            .fetch_one(&pool)
            .await
            .unwrap();
        println!(
            "20 models × 8,760 hours: {segments} segments and records (load {:.1} s)",
            started.elapsed().as_secs_f64()
        );

        let settings = Settings {
            clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
            ..Settings::default()
        };
        let secret = support::insert_token(&pool, "bench", Role::Admin, &[]).await;
        let router = taskledger::http::app(AppState::new(pool.clone(), settings));
        let get = |uri: String| {
            let router = router.clone();
            let request = Request::get(uri)
                .header(header::AUTHORIZATION, format!("Bearer {secret}"))
                .body(Body::empty())
                .unwrap();
            async move {
                let started = Instant::now();
                let response = router.oneshot(request).await.unwrap();
                let status = response.status();
                let body = response.into_body().collect().await.unwrap().to_bytes();
                let elapsed = started.elapsed();
                assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
                (elapsed, body)
            }
        };
        let year = |model: usize| {
            format!(
                "/v1/planning/reservations?gpu_model=M{model:02}\
                 &from=2025-12-01&to=2026-12-01"
            )
        };
        let (_, body) = get(year(7)).await;
        let plan: serde_json::Value = serde_json::from_slice(&body).unwrap();
        println!(
            "one year of M07: {} hours, peak {} GPUs, reserve {} of them ({} a year against {} \
             committing 24); {} KiB of JSON",
            plan["hours"],
            plan["peak_gpus"],
            plan["recommended_gpus"],
            plan["cost_at_recommended"],
            plan["cost_today"],
            body.len() / 1024
        );
        let (mut one_year, mut one_month, mut all_models) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..RUNS + 2 {
            let (year_time, _) = get(year(run % 20)).await;
            let (month_time, _) = get(format!(
                "/v1/planning/reservations?gpu_model=M{:02}&month=2026-11",
                run % 20
            ))
            .await;
            let started = Instant::now();
            for model in 0..20 {
                get(year(model)).await;
            }
            let all_time = started.elapsed();
            if run >= 2 {
                one_year.push(year_time);
                one_month.push(month_time);
                all_models.push(all_time);
            }
        }
        for (label, times) in [
            ("one model's plan over a year (8,760 hours)", &mut one_year),
            ("one model's plan over a month", &mut one_month),
            ("all 20 models' plans over a year, in turn", &mut all_models),
        ] {
            let (median, p95) = median(times);
            println!(
                "{label:<46} median {:>8.1} ms   p95 {:>8.1} ms",
                median.as_secs_f64() * 1000.0,
                p95.as_secs_f64() * 1000.0
            );
        }
        pool.close().await;
        cluster.stop().await.unwrap();
    });
}
