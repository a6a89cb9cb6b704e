//! Real utilisation next to a project's cost (COST_MODEL.md §8): held-weighted averages of
//! the telemetry records report, with coverage; the cost that looks busy; the memory paid for
//! and not used; busy time from SM activity; MIG slices priced at g/7 of the card.

use std::str::FromStr;

use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, cost, dec};
use crate::fixtures::{NOVEMBER, Record, contract, record};

/// November 2026 on H100s at 2.50 per GPU-hour (on demand):
///
/// | rec | GPUs | held s | GPU-Util | SM | tensor | DRAM | memory | busy | cost |
/// | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |
/// | u1 | 2 | 14400 | 0.95 | 0.30 | 0.10 | — | 20 of 80 (default) | 4320 from SM | 10.00 |
/// | u2 | 1 | 7200 | 0.60 | 0.50 | — | 0.40 | 60 of 80 | 3600 from SM | 5.00 |
/// | u3 | 1 | 3600 | 0.90 | 0.20 | — | — | — | 1800 reported | 2.50 |
/// | u4 | 1 | 7200 | — | — | — | — | — | — | 5.00 |
/// | u5 | 2 × 3g.40gb | 7200 | — | 0.70 | — | — | 10 of 40 (the slice) | 5040 from SM | 7200 × 2.50 × 3/7 / 3600 = 15/7 |
fn records() -> Vec<Record> {
    vec![
        record("u1", "2026-11-02T10:00:00Z", "2026-11-02T12:00:00Z")
            .gpu_count(2)
            .with("gpu_util", "0.95")
            .with("sm_active", "0.30")
            .with("tensor_active", "0.10")
            .with("memory_peak_gib", 20)
            .label("team", "a"),
        record("u2", "2026-11-03T00:00:00Z", "2026-11-03T02:00:00Z")
            .with("gpu_util", 0.6)
            .with("sm_active", 0.5)
            .with("dram_active", 0.4)
            .with("memory_peak_gib", 60)
            .with("memory_total_gib", 80)
            .label("team", "a"),
        record("u3", "2026-11-04T00:00:00Z", "2026-11-04T01:00:00Z")
            .gpu_seconds_busy(1800)
            .with("gpu_util", "0.9")
            .with("sm_active", "0.2")
            .label("team", "b"),
        record("u4", "2026-11-05T00:00:00Z", "2026-11-05T02:00:00Z"),
        record("u5", "2026-11-06T00:00:00Z", "2026-11-06T01:00:00Z")
            .gpu_count(2)
            .with("mig_profile", "3g.40gb")
            .with("sm_active", "0.7")
            .with("memory_peak_gib", 10)
            .label("team", "b"),
    ]
}

async fn app_with_records() -> TestApp {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    app.ingest(records()).await;
    app
}

fn exact(raw: &str) -> Decimal {
    Decimal::from_str(raw).unwrap()
}

/// An amount compared to `places` decimal places.
fn assert_close(value: &Value, expected: Decimal, places: u32) {
    assert_eq!(
        dec(value).round_dp(places),
        expected.round_dp(places),
        "{value} is not {expected}"
    );
}

fn seventh_of(amount: &str) -> Decimal {
    exact(amount) / Decimal::from(7)
}

#[tokio::test]
async fn the_months_utilisation_is_weighted_by_held_time_with_its_coverage() {
    let app = app_with_records().await;
    let view = cost(&app, NOVEMBER).await;

    // Held: 14400 + 7200 + 3600 + 7200 + 7200 = 39600 GPU-seconds.
    assert_money(&view["gpu_seconds_held"], "39600");
    // Busy: u1 14400 × 0.30 + u2 7200 × 0.50 + u3 as reported + u5 7200 × 0.70; u4 none.
    assert_money(&view["gpu_seconds_busy"], "14760");
    // Cost: 10 + 5 + 2.50 + 5 + 15/7, the slice at 3/7 of the card's 2 × 2.50.
    assert_close(&view["total"], exact("22.5") + seventh_of("15"), 20);
    // Productive: 10 × 0.30 + 5 × 0.50 + 2.50 × 1800/3600 + 15/7 × 0.70; u4 is unmeasured.
    assert_close(
        &view["breakdown"]["productive"],
        exact("3") + exact("2.5") + exact("1.25") + seventh_of("10.5"),
        18,
    );
    assert_money(&view["breakdown"]["unmeasured"], "5");

    let u = &view["utilisation"];
    // GPU-Util: (14400 × 0.95 + 7200 × 0.60 + 3600 × 0.90) / 25200 = 21240 / 25200.
    assert_money(&u["gpu_util"], "0.842857");
    assert_money(&u["coverage"]["gpu_util"], "0.636364");
    // SM: (4320 + 3600 + 720 + 5040) / 32400 = 13680 / 32400.
    assert_money(&u["sm_active"], "0.422222");
    assert_money(&u["coverage"]["sm_active"], "0.818182");
    assert_money(&u["tensor_active"], "0.1");
    assert_money(&u["coverage"]["tensor_active"], "0.363636");
    assert_money(&u["dram_active"], "0.4");
    assert_money(&u["coverage"]["dram_active"], "0.181818");
    // Memory used: (14400 × 20/80 + 7200 × 60/80 + 7200 × 10/40) / 28800 = 10800 / 28800.
    assert_money(&u["memory_used_share"], "0.375");
    assert_money(&u["coverage"]["memory_used_share"], "0.727273");
    assert_money(&view["unused_memory_gpu_seconds"], "18000");
    // Unused memory's cost: 10 × 0.75 + 5 × 0.25 + 15/7 × 0.75.
    assert_close(
        &view["unused_memory_cost"],
        exact("8.75") + seventh_of("11.25"),
        18,
    );
    // Looks busy: u1 (0.95 with SM 0.30) and u3 (0.90 with SM 0.20); u2's SM is 0.50.
    assert_money(&view["looks_busy_cost"], "12.50");
}

#[tokio::test]
async fn each_group_has_the_utilisation_of_its_own_records() {
    let app = app_with_records().await;
    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    let day = |key: &str| -> Value {
        by_day["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap_or_else(|| panic!("no group {key}"))
            .clone()
    };
    assert_money(&day("2026-11-02")["utilisation"]["gpu_util"], "0.95");
    assert_money(&day("2026-11-02")["looks_busy_cost"], "10");
    assert_money(&day("2026-11-02")["unused_memory_gpu_seconds"], "10800");
    assert_eq!(day("2026-11-05")["utilisation"], Value::Null);
    assert_eq!(day("2026-11-05")["looks_busy_cost"], Value::Null);
    assert_eq!(day("2026-11-05")["unused_memory_gpu_seconds"], Value::Null);
    // The slice: 7200 slice-seconds at 3/7 of 2.50 an hour.
    assert_close(&day("2026-11-06")["total"], seventh_of("15"), 20);
    assert_money(
        &day("2026-11-06")["utilisation"]["memory_used_share"],
        "0.25",
    );
    assert_eq!(day("2026-11-06")["utilisation"]["gpu_util"], Value::Null);
    assert_eq!(day("2026-11-06")["looks_busy_cost"], Value::Null);

    let by_team = cost(&app, &format!("{NOVEMBER}&group_by=label:team")).await;
    let team = |key: Value| -> Value {
        by_team["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap()
            .clone()
    };
    // a: u1 and u2; b: u3 and u5; none: u4.
    assert_money(&team(json!("a"))["looks_busy_cost"], "10");
    assert_money(&team(json!("b"))["looks_busy_cost"], "2.5");
    // (14400 × 0.30 + 7200 × 0.50) / 21600.
    assert_money(&team(json!("a"))["utilisation"]["sm_active"], "0.366667");
    assert_money(
        &team(json!("b"))["utilisation"]["coverage"]["sm_active"],
        "1",
    );
    assert_eq!(team(Value::Null)["utilisation"], Value::Null);
    assert_money(&team(json!("a"))["unused_memory_gpu_seconds"], "12600");
}

#[tokio::test]
async fn a_correction_and_compaction_keep_the_utilisation_exact() {
    let app = app_with_records().await;
    // u3 loses its GPU-Util: it no longer looks busy.
    let corrected = record("u3", "2026-11-04T00:00:00Z", "2026-11-04T01:00:00Z")
        .gpu_seconds_busy(1800)
        .with("sm_active", "0.2")
        .label("team", "b");
    let response = app
        .put(
            "/v1/projects/vision/job-records/u3/1",
            &app.admin,
            corrected.correction(),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let view = cost(&app, NOVEMBER).await;
    assert_money(&view["looks_busy_cost"], "10");
    // (13680 − 3240... ) GPU-Util is now u1 and u2 only: 18000 / 21600.
    assert_money(&view["utilisation"]["gpu_util"], "0.833333");
    taskledger::store::rollups::compact(&app.pool)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cost(&app, NOVEMBER).await, view);
    // A day read from the hourly rollups agrees with the month read from the monthly one.
    let days = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-02T00:00:00Z&to=2026-11-07T00:00:00Z&as_of=2027-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(days["utilisation"], view["utilisation"]);
}

#[tokio::test]
async fn records_without_telemetry_show_no_utilisation() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    app.ingest(vec![record(
        "plain",
        "2026-11-02T10:00:00Z",
        "2026-11-02T11:00:00Z",
    )])
    .await;
    let view = cost(&app, NOVEMBER).await;
    assert_eq!(view["utilisation"], Value::Null);
    assert_eq!(view["looks_busy_cost"], Value::Null);
    assert_eq!(view["unused_memory_gpu_seconds"], Value::Null);
    assert_eq!(view["unused_memory_cost"], Value::Null);
    let stored = app
        .get("/v1/projects/vision/job-records/plain/1", &app.admin)
        .await
        .json();
    assert!(stored["record"].get("gpu_util").is_none(), "{stored}");
    assert!(stored["record"]["gpu_model"].is_string(), "{stored}");
}

#[tokio::test]
async fn bad_telemetry_is_refused_naming_the_field() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let ingest = app.token("ingest", &["vision"]).await;
    let base = || record("bad", "2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z");
    let cases = [
        (base().with("gpu_util", 91), "/0/gpu_util", "from 0 to 1"),
        (
            base().with("sm_active", "-0.1"),
            "/0/sm_active",
            "from 0 to 1",
        ),
        (
            base().with("tensor_active", "x"),
            "/0/tensor_active",
            "decimal",
        ),
        (
            base().with("memory_peak_gib", 90),
            "/0/memory_peak_gib",
            "80 GiB",
        ),
        (
            base()
                .with("memory_peak_gib", 50)
                .with("memory_total_gib", 40),
            "/0/memory_peak_gib",
            "memory_total_gib",
        ),
        (
            base().with("memory_total_gib", 0),
            "/0/memory_total_gib",
            "greater than 0",
        ),
        (
            base().with("mig_profile", "3g.20gb"),
            "/0/mig_profile",
            "1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
        (
            base().gpu_model("L40S").with("mig_profile", "1g.12gb"),
            "/0/mig_profile",
            "no MIG profiles",
        ),
        (
            base().gpu_model("TPU").with("mig_profile", "1g.10gb"),
            "/0/mig_profile",
            "H100 80GB",
        ),
    ];
    for (body, pointer, message) in cases {
        let response = app.post("/v1/job-records", &ingest, json!([body])).await;
        let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        let errors = problem["errors"].as_array().unwrap();
        assert!(
            errors.iter().any(
                |e| e["pointer"] == pointer && e["message"].as_str().unwrap().contains(message)
            ),
            "{pointer} / {message}: {problem}"
        );
    }
    // Nothing of the refused batches was stored.
    let listed = app
        .get("/v1/projects/vision/job-records", &app.admin)
        .await
        .json();
    assert_eq!(listed["items"], json!([]));
}

#[tokio::test]
async fn a_record_keeps_its_telemetry_and_a_slice_its_profile() {
    let app = app_with_records().await;
    let found = app
        .get("/v1/projects/vision/job-records/u5/1", &app.admin)
        .await
        .json();
    let u5 = &found["record"];
    assert_eq!(u5["mig_profile"], "3g.40gb");
    assert_money(&u5["memory_total_gib"], "40");
    assert_money(&u5["sm_active"], "0.7");
    // The task page shows the attempt's telemetry, and its busy time from SM activity.
    let task = app
        .get("/v1/projects/vision/tasks/u5", &app.admin)
        .await
        .json();
    let attempt = &task["attempts"][0];
    assert_eq!(attempt["mig_profile"], "3g.40gb");
    assert_money(&attempt["gpu_seconds_busy"], "5040");
    assert_close(&attempt["total"], seventh_of("15"), 20);
    // The same record posted again, the slice spelt as another driver does, is a duplicate.
    let ingest = app.token("ingest", &["vision"]).await;
    let again = record("u5", "2026-11-06T00:00:00Z", "2026-11-06T01:00:00Z")
        .gpu_count(2)
        .with("mig_profile", "MIG-3g.39gb")
        .with("sm_active", "0.70")
        .with("memory_peak_gib", 10)
        .with("memory_total_gib", 40)
        .label("team", "b");
    let response = app.post("/v1/job-records", &ingest, json!([again])).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.json()["duplicates"], 1);
}

#[tokio::test]
async fn the_monthly_report_shows_the_headline_next_to_the_cost() {
    let app = app_with_records().await;
    let json = app
        .get("/v1/reports/monthly/2026-11", &app.admin)
        .await
        .json();
    let line = &json["projects"][0];
    assert_eq!(line["project"], "vision");
    assert_money(&line["utilisation"]["gpu_util"], "0.842857");
    assert_money(&line["looks_busy_cost"], "12.5");

    let csv = app
        .get("/v1/reports/monthly/2026-11?format=csv", &app.admin)
        .await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.text());
    let mut reader = csv::Reader::from_reader(csv.body.as_slice());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let project = reader
        .records()
        .map(|row| row.unwrap())
        .find(|row| &row[0] == "project")
        .unwrap();
    let column = |name: &str| -> String {
        let index = header.iter().position(|h| h == name).unwrap();
        project[index].to_owned()
    };
    // GPU-Util 84 % against SM active 42 %; of the memory reported, 1 − 0.375 went unused.
    assert_eq!(column("gpu_util"), "0.8429");
    assert_eq!(column("sm_active"), "0.4222");
    assert_eq!(column("unused_memory_share"), "0.625");
    assert_eq!(column("looks_busy_cost"), "12.50");
}

#[tokio::test]
async fn slices_use_a_reserved_card_by_their_share_of_it() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "reserved", "7.00")
        .project("vision")
        .committed_gpus(1)
        .valid_from("2026-11-02T00:00:00Z")
        .valid_until("2026-11-02T02:00:00Z")
        .create(&app)
        .await;
    // Three 1g slices for an hour: 3/7 of a card-hour, priced 3 × 7.00 × 1/7 = 3.00, leave
    // 4/7 of the first hour's committed card unused (4.00), and the second hour's whole card
    // (7.00). Counted as three cards, they would leave nothing unused in the first hour.
    app.ingest(vec![
        record("sliced", "2026-11-02T00:00:00Z", "2026-11-02T01:00:00Z")
            .billing_mode("reserved")
            .gpu_count(3)
            .with("mig_profile", "1g.10gb"),
    ])
    .await;
    let view = cost(&app, NOVEMBER).await;
    assert_money(&view["gpu_seconds_held"], "10800");
    assert_close(&view["breakdown"]["unmeasured"], exact("3"), 18);
    assert_close(&view["breakdown"]["unused_commitment"], exact("11"), 18);
    assert_close(&view["total"], exact("14"), 18);
}

#[tokio::test]
async fn csv_and_ndjson_imports_take_the_same_fields() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("dcgm.csv");
    std::fs::write(
        &csv,
        "project,task_id,gpu_model,gpu_count,started_at,ended_at,outcome,gpu_util,sm_active,memory_peak_gib,mig_profile\n\
         vision,i1,H100,1,2026-11-02T10:00:00Z,2026-11-02T12:00:00Z,completed,0.95,0.30,20,\n\
         vision,i2,H100,2,2026-11-06T00:00:00Z,2026-11-06T01:00:00Z,completed,,0.7,10,3g.40gb\n\
         vision,i3,H100,1,2026-11-06T00:00:00Z,2026-11-06T01:00:00Z,completed,1.5,,,\n",
    )
    .unwrap();
    let ndjson = dir.path().join("dcgm.ndjson");
    std::fs::write(
        &ndjson,
        format!(
            "{}\n",
            json!(
                record("n1", "2026-11-03T00:00:00Z", "2026-11-03T02:00:00Z")
                    .with("dram_active", 0.4)
                    .with("memory_peak_gib", 60)
                    .with("memory_total_gib", 80)
            )
        ),
    )
    .unwrap();
    let summary =
        taskledger::ledger::import::import_files(&app.pool, &[csv, ndjson], &Default::default())
            .await
            .unwrap();
    assert_eq!(summary.accepted, 3);
    assert_eq!(summary.rejected.len(), 1);
    assert!(
        summary.rejected[0].reason.contains("gpu_util"),
        "{:?}",
        summary.rejected
    );
    let i2 = app
        .get("/v1/projects/vision/job-records/i2/1", &app.admin)
        .await
        .json();
    assert_eq!(i2["record"]["mig_profile"], "3g.40gb");
    assert_money(&i2["record"]["memory_total_gib"], "40");
    let view = cost(&app, NOVEMBER).await;
    // i1: 7200 × 0.30, i2: 7200 × 0.70 busy.
    assert_money(&view["gpu_seconds_busy"], "7200");
    assert_money(&view["utilisation"]["dram_active"], "0.4");
}
