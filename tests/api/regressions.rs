//! Efficiency regressions: a level shift of a workload's daily direct cost per unit fires
//! one `efficiency_regression` alert with the three factors, once however often and
//! concurrently it is judged, and again only after the workload has recovered. Stable,
//! spiky, cheap and low-volume workloads fire nothing.
//!
//! Every figure is hand-computed from one contract: an H100 GPU-hour on demand at 2 USD, so
//! a 4-GPU record of one hour costs 8 and one of two hours 16.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::ledger::regressions;

use crate::common::{TestApp, assert_money};
use crate::fixtures::{Record, contract, record};

fn settings_at(at: &str) -> Settings {
    Settings {
        clock: Clock::Fixed(at.parse::<DateTime<Utc>>().unwrap()),
        ..Settings::default()
    }
}

/// The ledger day `n` of November 2026 at `hour`.
pub(crate) fn at(day: u32, hour: u32) -> String {
    format!("2026-11-{day:02}T{hour:02}:00:00Z")
}

/// Project `vision` in USD with a webhook nobody answers (its deliveries stay pending in the
/// outbox), the 2 USD H100 contract, and the clock at the end of November.
pub(crate) async fn app() -> TestApp {
    let app = TestApp::spawn_with(settings_at("2026-11-30T23:00:00Z")).await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD",
                   "webhook_url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    contract("H100", "on_demand", "2").create(&app).await;
    app
}

/// `per_day` completed records of `workload` on `day`, each on `gpus` H100s for `hours`
/// hours from 00:00, 03:00, … and making `tokens` tokens.
fn day_of(
    workload: &str,
    day: u32,
    per_day: u32,
    gpus: u32,
    hours: u32,
    tokens: u32,
) -> Vec<Record> {
    (0..per_day)
        .map(|i| {
            let start = i * 3;
            record(
                &format!("{workload}-{day}-{i}"),
                &at(day, start),
                &at(day, start + hours),
            )
            .gpu_count(gpus)
            .output(tokens, "tokens")
            .label("workload", workload)
        })
        .collect()
}

pub(crate) async fn judge(app: &TestApp, now: &str) -> usize {
    regressions::judge(&app.pool, Some("vision"), &settings_at(now))
        .await
        .unwrap()
        .fired
        .len()
}

async fn regression_alerts(app: &TestApp) -> Vec<Value> {
    let response = app.get("/v1/alerts?project=vision", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"] == "efficiency_regression")
        .cloned()
        .collect()
}

async fn pending_deliveries(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM alert_deliveries WHERE state = 'pending'")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

/// Days 1–14 of the baseline and the days of a window for every workload of the scenario:
/// - `summarise`: 2 records a day of 4 GPUs × 1 h making 100 tokens each (16 USD for 200
///   tokens, 0.08 a token), then from day 15 two hours each (32 USD, 0.16 a token): +100 %
///   and 16 USD a day more. It regresses.
/// - `translate`: the same 0.08 throughout. Stable.
/// - `spiky`: 0.08, but day 16 at 5 GPU-hours a record (0.4 a token): one bad day of three.
/// - `cheap`: 1 GPU, so 4 USD a day for 200 tokens, doubling to 8: +100 % but only 4 USD a
///   day more, under the minimum of 10.
/// - `rare`: one record a day of 4 GPUs, doubling from day 15: +100 % and 8 USD a day more,
///   but 3 records in the window, under the minimum of 5.
pub(crate) fn scenario(days: std::ops::RangeInclusive<u32>, shifted_from: u32) -> Vec<Record> {
    let mut records = Vec::new();
    for day in days {
        let shifted = day >= shifted_from;
        let hours = if shifted { 2 } else { 1 };
        records.extend(day_of("summarise", day, 2, 4, hours, 100));
        records.extend(day_of("translate", day, 2, 4, 1, 100));
        let spike = if day == 16 { 5 } else { 1 };
        records.extend(day_of("spiky", day, 2, 4, spike, 100));
        records.extend(day_of("cheap", day, 2, 1, hours, 100));
        records.extend(day_of("rare", day, 1, 4, hours, 100));
    }
    records
}

#[tokio::test]
async fn a_level_shift_fires_once_with_its_factors_and_stable_cheap_spiky_or_rare_workloads_do_not()
{
    let app = app().await;
    app.ingest(scenario(1..=17, 15)).await;

    // Day 18: the window is days 15–17, the baseline days 1–14.
    assert_eq!(judge(&app, &at(18, 1)).await, 1);
    let fired = regression_alerts(&app).await;
    assert_eq!(fired.len(), 1, "{fired:#?}");
    let alert = &fired[0];
    assert_eq!(alert["month"], "2026-11");
    assert_eq!(alert["currency"], "USD");
    assert_eq!(alert["threshold"], Value::Null);
    let found = &alert["efficiency_regression"];
    assert_eq!(found["workload"], "summarise");
    assert_eq!(found["unit"], "tokens");
    assert_eq!(found["window_from"], "2026-11-15");
    assert_eq!(found["window_to"], "2026-11-17");
    assert_eq!(found["baseline_from"], "2026-11-01");
    assert_money(&found["baseline_cost_per_unit"], "0.08");
    assert_money(&found["window_cost_per_unit"], "0.16");
    assert_money(&found["change"], "1");
    assert_money(&found["extra_cost_per_day"], "16");
    assert_eq!(found["records"], 6);
    assert_money(&found["threshold"], "0.25");
    assert_money(&found["min_extra_cost"], "10");
    // Same price per GPU-hour, twice the GPU-hours per token, nothing failed.
    assert_money(&found["factors"]["price"], "1");
    assert_money(&found["factors"]["throughput"], "2");
    assert_money(&found["factors"]["overhead"], "1");
    assert_eq!(found["largest"], "throughput");
    assert_eq!(pending_deliveries(&app).await, 1, "one outbox row");

    // Judged again, the same day or the next, the level shift fires nothing more.
    assert_eq!(judge(&app, &at(18, 5)).await, 0);
    app.ingest(scenario(18..=18, 15)).await;
    assert_eq!(judge(&app, &at(19, 1)).await, 0);
    assert_eq!(regression_alerts(&app).await.len(), 1);

    // The API shows the rule (the defaults) and the workload's state.
    let status = app
        .get("/v1/projects/vision/efficiency/regressions", &app.admin)
        .await;
    assert_eq!(status.status, StatusCode::OK, "{}", status.text());
    let status = status.json();
    assert_eq!(status["rule"]["enabled"], true);
    assert_eq!(status["rule"]["customised"], false);
    assert_eq!(status["rule"]["window_days"], 3);
    assert_eq!(status["rule"]["baseline_days"], 14);
    assert_eq!(status["rule"]["min_records"], 5);
    let states = status["workloads"].as_array().unwrap();
    assert_eq!(states.len(), 1, "{states:#?}");
    assert_eq!(states[0]["workload"], "summarise");
    assert_eq!(states[0]["regressed"], true);
    assert_eq!(states[0]["since"], "2026-11-15");
}

#[tokio::test]
async fn a_workload_fires_again_only_after_it_has_recovered() {
    let app = app().await;
    // Shifted on days 15–17, back to 0.08 on days 18–20, shifted again from day 21.
    let mut records = scenario(1..=17, 15);
    records.extend(scenario(18..=20, 99));
    records.extend(scenario(21..=23, 21));
    app.ingest(records).await;

    assert_eq!(judge(&app, &at(18, 1)).await, 1);
    // Day 21: the window 18–20 is back at 0.08 against a baseline (4–17) whose median is
    // 0.08: recovered, and re-armed.
    assert_eq!(judge(&app, &at(21, 1)).await, 0);
    let status = app
        .get(
            "/v1/projects/vision/efficiency/regressions",
            &app.token("reader", &["vision"]).await,
        )
        .await
        .json();
    let state = &status["workloads"][0];
    assert_eq!(state["regressed"], false, "{status:#?}");
    assert_eq!(state["recovered_on"], "2026-11-21");
    // Day 24: the window 21–23 at 0.16 against a baseline (7–20) of eleven days at 0.08 and
    // three at 0.16, median 0.08: a second level shift, a second alert.
    assert_eq!(judge(&app, &at(24, 1)).await, 1);
    let fired = regression_alerts(&app).await;
    let mut windows: Vec<&str> = fired
        .iter()
        .map(|a| a["efficiency_regression"]["window_from"].as_str().unwrap())
        .collect();
    windows.sort();
    assert_eq!(windows, ["2026-11-15", "2026-11-21"]);
}

#[tokio::test]
async fn judges_racing_fire_one_alert() {
    let app = app().await;
    app.ingest(scenario(1..=17, 15)).await;
    let now = settings_at(&at(18, 1));
    let judges: Vec<_> = (0..4)
        .map(|_| {
            let pool = app.pool.clone();
            tokio::spawn(async move { regressions::judge(&pool, Some("vision"), &now).await })
        })
        .collect();
    let mut fired = 0;
    for judge in judges {
        fired += judge.await.unwrap().unwrap().fired.len();
    }
    assert_eq!(fired, 1);
    assert_eq!(regression_alerts(&app).await.len(), 1);
    assert_eq!(pending_deliveries(&app).await, 1);
}

#[tokio::test]
async fn the_rule_is_the_projects_to_set_and_bad_fields_are_named() {
    let app = app().await;
    app.ingest(scenario(1..=17, 15)).await;

    // Off: nothing fires.
    let off = app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &app.admin,
            json!({"enabled": false}),
        )
        .await;
    assert_eq!(off.status, StatusCode::OK, "{}", off.text());
    assert_eq!(off.json()["rule"]["customised"], true);
    assert_eq!(judge(&app, &at(18, 1)).await, 0);

    // A minimum extra cost of 3 a day lets `cheap` (4 a day more) fire as well as
    // `summarise`; the PUT judges at once, at the service's clock (day 30, whose window
    // 27–29 holds no records), so the tick of day 18 fires them.
    let lower = app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &app.admin,
            json!({"min_extra_cost": "3"}),
        )
        .await;
    assert_eq!(lower.status, StatusCode::OK, "{}", lower.text());
    assert_money(&lower.json()["rule"]["min_extra_cost"], "3");
    assert_eq!(judge(&app, &at(18, 1)).await, 2);
    let mut workloads: Vec<String> = regression_alerts(&app)
        .await
        .iter()
        .map(|a| {
            a["efficiency_regression"]["workload"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    workloads.sort();
    assert_eq!(workloads, ["cheap", "summarise"]);

    let bad = app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &app.admin,
            json!({"threshold": "0", "min_extra_cost": "-1", "window_days": 0,
                   "min_records": 0}),
        )
        .await;
    assert_eq!(
        bad.pointers(),
        [
            "/threshold",
            "/min_extra_cost",
            "/window_days",
            "/min_records"
        ]
    );
    let short = app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &app.admin,
            json!({"window_days": 7, "baseline_days": 5}),
        )
        .await;
    assert_eq!(short.pointers(), ["/baseline_days"]);
    let reader = app.token("reader", &["vision"]).await;
    let refused = app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &reader,
            json!({}),
        )
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // The refused changes left the rule as it was.
    let status = app
        .get("/v1/projects/vision/efficiency/regressions", &reader)
        .await
        .json();
    assert_money(&status["rule"]["min_extra_cost"], "3");
    assert_eq!(status["rule"]["window_days"], 3);
}
