//! The cost of a project over a period: COST_MODEL.md's worked example end to end, re-rating
//! through contract and FX changes, grouping, and who may read it.

use std::str::FromStr;

use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, cost, dec};
use crate::fixtures::{NOVEMBER, contract, record, worked_example, worked_example_records};

#[tokio::test]
async fn the_worked_example_to_the_cent() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let november = cost(&app, NOVEMBER).await;

    assert_eq!(november["project"], "vision");
    assert_eq!(november["currency"], "USD");
    assert_eq!(november["from"], "2026-11-01T00:00:00Z");
    assert_eq!(november["to"], "2026-12-01T00:00:00Z");
    assert_money(&november["total"], "84.60");
    let breakdown = &november["breakdown"];
    assert_money(&breakdown["productive"], "37.00");
    assert_money(&breakdown["idle"], "9.00");
    assert_money(&breakdown["unmeasured"], "24.20");
    assert_money(&breakdown["failed"], "14.40");
    assert_money(&breakdown["unused_commitment"], "0");
    assert_money(&november["waste"], "23.40");
    // R1 57600 + R2 43200 + R3 57600 + R4 36000 + R5 3600 + R6's November half 7200.
    assert_money(&november["gpu_seconds_held"], "205200");
    assert_money(&november["gpu_seconds_busy"], "79200");
    assert_money(&november["unrated_gpu_seconds"], "3600");
    assert_eq!(
        november["unrated"],
        json!([{"reason": "no_contract", "gpu_model": "B200", "gpu_seconds": "3600"}])
    );
    assert_eq!(november["tasks_completed"], 4);
    assert_eq!(
        november["tasks_failed"], 1,
        "t4 failed; t2 completed on retry"
    );
    assert_eq!(november["retries"], 1);
    assert_eq!(november["failures"], 1);
    assert_money(&november["cost_per_completed_task"], "21.15");

    let output = november["output"].as_array().unwrap();
    let tokens = output.iter().find(|o| o["unit"] == "tokens").unwrap();
    assert_money(&tokens["quantity"], "3000000");
    assert_money(&tokens["direct_cost_per_unit"], "0.0000184");
    let loaded_per_million = dec(&tokens["loaded_cost_per_unit"]) * Decimal::from(1_000_000);
    assert_eq!(
        loaded_per_million.round_dp(6),
        Decimal::from_str("22.174359").unwrap()
    );
    assert_eq!(
        dec(&tokens["loaded_cost_per_unit"]),
        Decimal::from_str("0.0000184").unwrap() * Decimal::from_str("84.60").unwrap()
            / Decimal::from_str("70.20").unwrap()
    );
    let samples = output.iter().find(|o| o["unit"] == "samples").unwrap();
    assert_money(&samples["quantity"], "500");
    assert_money(&samples["direct_cost_per_unit"], "0.02");
    assert_eq!(november["groups"], json!([]));

    let october = cost(
        &app,
        "/v1/projects/vision/cost?month=2026-10&as_of=2027-01-01T00:00:00Z",
    )
    .await;
    assert_money(&october["total"], "5.00");
    assert_money(&october["breakdown"]["unmeasured"], "5.00");
    assert_eq!(october["tasks_completed"], 0);
    assert_eq!(october["cost_per_completed_task"], Value::Null);
}

#[tokio::test]
async fn adding_the_missing_contract_rates_the_unrated_seconds() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    contract("B200", "on_demand", "3.00")
        .named("B200")
        .valid_from("2026-11-01T00:00:00Z")
        .create(&app)
        .await;
    let november = cost(&app, NOVEMBER).await;
    assert_money(&november["unrated_gpu_seconds"], "0");
    assert_eq!(november["unrated"], json!([]));
    assert_money(&november["total"], "87.60");
    assert_money(&november["breakdown"]["failed"], "17.40");
}

#[tokio::test]
async fn a_price_change_shows_at_once_and_its_reversal_restores_every_figure() {
    let app = TestApp::spawn().await;
    let [c1, ..] = worked_example(&app).await;
    let by_day = format!("{NOVEMBER}&group_by=day");
    let before = (cost(&app, NOVEMBER).await, cost(&app, &by_day).await);

    let changed = app
        .patch(
            &format!("/v1/contracts/{c1}"),
            &app.admin,
            json!({"price_per_gpu_hour": "3.00"}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    assert_money(&changed.json()["price_per_gpu_hour"], "3.00");
    let repriced = cost(&app, NOVEMBER).await;
    // R1's 8 GPU-hours before the 15th and R6's 2 November GPU-hours, 0.50 dearer each.
    assert_money(&repriced["total"], "89.60");
    assert_money(&repriced["breakdown"]["productive"], "40.00");

    // Shortening it leaves R6 (and R1's first half) without a contract.
    let shortened = app
        .patch(
            &format!("/v1/contracts/{c1}"),
            &app.admin,
            json!({"valid_until": "2026-11-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(shortened.status, StatusCode::OK, "{}", shortened.text());
    let unrated = cost(&app, NOVEMBER).await;
    assert_money(&unrated["unrated_gpu_seconds"], "39600");

    let restored = app
        .patch(
            &format!("/v1/contracts/{c1}"),
            &app.admin,
            json!({"price_per_gpu_hour": "2.50", "valid_until": null}),
        )
        .await;
    assert_eq!(restored.status, StatusCode::OK, "{}", restored.text());
    let after = (cost(&app, NOVEMBER).await, cost(&app, &by_day).await);
    assert_eq!(after, before);
}

#[tokio::test]
async fn deleting_a_contract_unrates_what_it_priced() {
    let app = TestApp::spawn().await;
    let [_, c2, ..] = worked_example(&app).await;
    let deleted = app.delete(&format!("/v1/contracts/{c2}"), &app.admin).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    // R1's second half falls back to C1: 8 GPU-hours at 2.50 instead of 2.00.
    assert_money(&cost(&app, NOVEMBER).await["total"], "88.60");
    app.get(&format!("/v1/contracts/{c2}"), &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn foreign_prices_convert_at_the_months_rate() {
    let app = TestApp::spawn().await;
    app.create_project("speech", "USD").await;
    contract("L40S", "on_demand", "2.00")
        .named("EU")
        .currency("EUR")
        .create(&app)
        .await;
    app.ingest([record("a", "2026-11-02T00:00:00Z", "2026-11-02T03:00:00Z")
        .project("speech")
        .gpu_model("L40S")])
        .await;
    let path = "/v1/projects/speech/cost?month=2026-11&as_of=2027-01-01T00:00:00Z";
    let unconverted = cost(&app, path).await;
    assert_money(&unconverted["total"], "0");
    assert_eq!(
        unconverted["unrated"],
        json!([{"reason": "no_fx_rate", "gpu_model": "L40S", "gpu_seconds": "10800"}])
    );

    let rate = app
        .put(
            "/v1/fx-rates/2026-11/EUR/USD",
            &app.admin,
            json!({"rate": "1.10"}),
        )
        .await;
    assert_eq!(rate.status, StatusCode::OK, "{}", rate.text());
    assert_eq!(rate.json()["rate"], "1.1");
    let converted = cost(&app, path).await;
    assert_money(&converted["total"], "6.60");
    assert_money(&converted["unrated_gpu_seconds"], "0");

    let rates = app.get("/v1/fx-rates", &app.admin).await.json();
    assert_eq!(rates["items"][0]["month"], "2026-11");
    assert_eq!(rates["items"][0]["from"], "EUR");

    let deleted = app.delete("/v1/fx-rates/2026-11/EUR/USD", &app.admin).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    assert_eq!(cost(&app, path).await, unconverted);
    app.delete("/v1/fx-rates/2026-11/EUR/USD", &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
    let reader = app.token("reader", &["speech"]).await;
    app.put(
        "/v1/fx-rates/2026-11/EUR/USD",
        &reader,
        json!({"rate": "1.10"}),
    )
    .await
    .problem(StatusCode::FORBIDDEN);
    let bad = app
        .put(
            "/v1/fx-rates/2026-13/EUR/EUR",
            &app.admin,
            json!({"rate": "-1"}),
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.pointers(), ["path:month", "path:to", "/rate"]);
}

/// A price change reads the keys of what it re-rates a page at a time (10,000 keys): every
/// record is re-rated, the last page's too, whether a contract or an FX rate changed.
#[tokio::test]
async fn a_price_change_re_rates_every_record_past_a_page_of_keys() {
    const RECORDS: usize = 10_001;
    let app = TestApp::spawn().await;
    app.create_project("speech", "USD").await;
    let eu = contract("L40S", "on_demand", "2.00")
        .named("EU")
        .currency("EUR")
        .create(&app)
        .await;
    let set_rate = |rate: &'static str| {
        let app = &app;
        async move {
            let response = app
                .put(
                    "/v1/fx-rates/2026-11/EUR/USD",
                    &app.admin,
                    json!({ "rate": rate }),
                )
                .await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        }
    };
    set_rate("1.10").await;
    let records: Vec<_> = (0..RECORDS)
        .map(|i| {
            record(
                &format!("t{i:05}"),
                "2026-11-02T00:00:00Z",
                "2026-11-02T01:00:00Z",
            )
            .project("speech")
            .gpu_model("L40S")
        })
        .collect();
    for batch in records.chunks(10_000) {
        app.ingest(batch).await;
    }
    let path = "/v1/projects/speech/cost?month=2026-11&as_of=2027-01-01T00:00:00Z";
    // One GPU-hour each at 2.00 EUR, 1.10 USD to the euro.
    assert_money(&cost(&app, path).await["total"], "22002.20");

    let changed = app
        .patch(
            &format!("/v1/contracts/{eu}"),
            &app.admin,
            json!({"price_per_gpu_hour": "3.00"}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    assert_money(&cost(&app, path).await["total"], "33003.30");

    set_rate("1.20").await;
    let repriced = cost(&app, path).await;
    assert_money(&repriced["total"], "36003.60");
    assert_money(&repriced["unrated_gpu_seconds"], "0");
}

/// Every figure of a group list, summed, equals the top-level figure.
fn assert_groups_add_up(report: &Value) {
    let groups = report["groups"].as_array().unwrap();
    assert!(!groups.is_empty());
    let money =
        |path: &str| -> Decimal { groups.iter().map(|g| dec(g.pointer(path).unwrap())).sum() };
    for path in [
        "/total",
        "/waste",
        "/gpu_seconds_held",
        "/gpu_seconds_busy",
        "/unrated_gpu_seconds",
        "/breakdown/productive",
        "/breakdown/idle",
        "/breakdown/unmeasured",
        "/breakdown/failed",
        "/breakdown/unused_commitment",
    ] {
        assert_eq!(money(path), dec(report.pointer(path).unwrap()), "{path}");
    }
    for count in ["tasks_completed", "tasks_failed", "retries", "failures"] {
        let sum: i64 = groups.iter().map(|g| g[count].as_i64().unwrap()).sum();
        assert_eq!(Value::from(sum), report[count], "{count}");
    }
}

#[tokio::test]
async fn groups_add_up_to_the_total_for_every_dimension() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    // A project-scoped commitment, so that unused commitment is spread over groups too.
    contract("A100", "reserved", "1.00")
        .named("own")
        .valid_from("2026-11-10T00:00:00Z")
        .valid_until("2026-11-12T00:00:00Z")
        .committed_gpus(2)
        .project("vision")
        .create(&app)
        .await;
    for group_by in [
        "day",
        "month",
        "gpu_model",
        "billing_mode",
        "gpu_model,billing_mode",
        "outcome",
        "label:team",
    ] {
        let report = cost(&app, &format!("{NOVEMBER}&group_by={group_by}")).await;
        assert_groups_add_up(&report);
    }

    let by_model = cost(&app, &format!("{NOVEMBER}&group_by=gpu_model")).await;
    let keys: Vec<&str> = by_model["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["A100", "B200", "H100"]);
    // R4 now runs on the project's own reservation: 10 of its 2 × 48 committed GPU-hours.
    let a100 = &by_model["groups"][0];
    assert_money(&a100["breakdown"]["unused_commitment"], "86");
    assert_money(&a100["breakdown"]["productive"], "10");

    let by_team = cost(&app, &format!("{NOVEMBER}&group_by=label:team")).await;
    let groups = by_team["groups"].as_array().unwrap();
    let team = |key: Value| groups.iter().find(|g| g["key"] == key).unwrap().clone();
    // t1 (36.00) and both attempts of t2 (14.40 + 19.20).
    assert_money(&team(json!("perception"))["total"], "69.60");
    assert_eq!(team(json!("perception"))["tasks_completed"], 2);
    assert_money(&team(json!("search"))["total"], "10.00");
    // Unlabelled records (R5, R6) and the unused commitment have no key.
    assert_money(&team(Value::Null)["total"], "91.00");

    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    let day = |key: &str| {
        by_day["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap()
            .clone()
    };
    // R1 from 22:00 on the 14th: two hours at 2.50 on 4 GPUs.
    assert_money(&day("2026-11-14")["total"], "20.00");
    assert_eq!(day("2026-11-14")["tasks_completed"], 0);
    assert_eq!(day("2026-11-15")["tasks_completed"], 1);
}

/// What a completed task cost on each GPU model as bought: the worked example by model and
/// billing mode together.
#[tokio::test]
async fn groups_by_model_and_billing_mode_compare_the_cost_of_a_finished_task() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let report = cost(&app, &format!("{NOVEMBER}&group_by=gpu_model,billing_mode")).await;
    assert_groups_add_up(&report);
    let groups = report["groups"].as_array().unwrap();
    let keys: Vec<&str> = groups.iter().map(|g| g["key"].as_str().unwrap()).collect();
    assert_eq!(
        keys,
        [
            "A100/reserved",
            "B200/on_demand",
            "H100/on_demand",
            "H100/spot"
        ]
    );
    let group = |key: &str| groups.iter().find(|g| g["key"] == key).unwrap();
    // t1 (36.00) and November's half of t5 (5.00), both completed on on-demand H100s.
    assert_money(&group("H100/on_demand")["total"], "41.00");
    assert_eq!(group("H100/on_demand")["tasks_completed"], 2);
    assert_money(&group("H100/on_demand")["cost_per_completed_task"], "20.50");
    // t2: its preempted attempt's 14.40 is part of what the finished task cost on spot.
    assert_money(&group("H100/spot")["total"], "33.60");
    assert_money(&group("H100/spot")["waste"], "14.40");
    assert_money(&group("H100/spot")["cost_per_completed_task"], "33.60");
    assert_money(
        &group("H100/spot")["output"][0]["direct_cost_per_unit"],
        "0.0000192",
    );
    assert_money(&group("A100/reserved")["cost_per_completed_task"], "10.00");
    assert_eq!(group("B200/on_demand")["tasks_failed"], 1);
    assert_eq!(
        group("B200/on_demand")["cost_per_completed_task"],
        Value::Null
    );

    let reversed = app
        .get(
            "/v1/projects/vision/cost?month=2026-11&group_by=billing_mode,gpu_model",
            &app.admin,
        )
        .await;
    assert_eq!(
        reversed.problem(StatusCode::UNPROCESSABLE_ENTITY)["errors"][0]["pointer"],
        "query:group_by"
    );
}

#[tokio::test]
async fn unused_commitment_accrues_up_to_as_of() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("A100", "reserved", "1.50")
        .named("own")
        .valid_from("2026-11-01T00:00:00Z")
        .committed_gpus(2)
        .project("vision")
        .create(&app)
        .await;
    app.ingest([record("x", "2026-11-01T01:00:00Z", "2026-11-01T03:00:00Z")
        .gpu_model("A100")
        .billing_mode("reserved")])
        .await;
    let at = |as_of: &str| format!("/v1/projects/vision/cost?month=2026-11&as_of={as_of}");
    // 10 committed hours × 2 GPUs, of which 2 GPU-hours used: 18 unused GPU-hours × 1.50.
    let early = cost(&app, &at("2026-11-01T10:00:00Z")).await;
    assert_money(&early["breakdown"]["unused_commitment"], "27");
    assert_money(&early["total"], "30");
    assert_money(&early["waste"], "27");
    // Half an hour more: one more committed GPU-hour, pro rata.
    let later = cost(&app, &at("2026-11-01T10:30:00Z")).await;
    assert_money(&later["breakdown"]["unused_commitment"], "28.5");
    let before_month = cost(&app, &at("2026-10-20T00:00:00Z")).await;
    assert_money(&before_month["breakdown"]["unused_commitment"], "0");
}

#[tokio::test]
async fn periods_must_be_ledger_hours_and_parameters_are_named() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let hours = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-14T22:00:00Z&to=2026-11-15&as_of=2027-01-01T00:00:00Z",
    )
    .await;
    assert_money(&hours["total"], "20.00");
    let days = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(&days["total"], "84.60");
    assert_eq!(days["from"], "2026-11-01T00:00:00Z");

    for (query, pointer) in [
        ("from=2026-11-14T22:30:00Z&to=2026-11-15", "query:from"),
        ("from=2026-11-15&to=2026-11-14", "query:to"),
        ("month=2026-13", "query:month"),
        ("month=2026-11&group_by=team", "query:group_by"),
        ("month=2026-11&as_of=yesterday", "query:as_of"),
        ("", "query:from"),
    ] {
        let response = app
            .get(&format!("/v1/projects/vision/cost?{query}"), &app.admin)
            .await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), [pointer], "{query}");
    }
}

#[tokio::test]
async fn only_readers_of_the_project_see_its_cost() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    app.create_project("speech", "USD").await;
    let own = app.token("reader", &["vision"]).await;
    let other = app.token("reader", &["speech"]).await;
    let ingest = app.token("ingest", &["vision"]).await;
    let finance = app.token("finance", &[]).await;
    assert_eq!(app.get(NOVEMBER, &own).await.status, StatusCode::OK);
    assert_eq!(app.get(NOVEMBER, &finance).await.status, StatusCode::OK);
    app.get(NOVEMBER, &other)
        .await
        .problem(StatusCode::NOT_FOUND);
    app.get(NOVEMBER, &ingest)
        .await
        .problem(StatusCode::NOT_FOUND);
    app.get("/v1/projects/nope/cost?month=2026-11", &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_corrected_record_is_re_rated_and_its_task_recounted() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let before = cost(&app, NOVEMBER).await;
    let [_, _, r3, ..] = worked_example_records();
    let r3 = |outcome: &str| r3.clone().outcome(outcome).correction();
    let path = "/v1/projects/vision/job-records/t2/2";
    let corrected = app.put(path, &app.admin, r3("failed")).await;
    assert_eq!(corrected.status, StatusCode::OK, "{}", corrected.text());
    let after = cost(&app, NOVEMBER).await;
    assert_eq!(after["tasks_completed"], 3);
    assert_eq!(
        after["tasks_failed"], 2,
        "t2 has no completed attempt any more"
    );
    assert_money(&after["breakdown"]["failed"], "33.60");
    assert_money(&after["breakdown"]["unmeasured"], "5.00");
    assert_money(&after["total"], "84.60");
    let tokens = after["output"].as_array().unwrap();
    assert_money(
        &tokens.iter().find(|o| o["unit"] == "tokens").unwrap()["quantity"],
        "2000000",
    );

    let reverted = app.put(path, &app.admin, r3("completed")).await;
    assert_eq!(reverted.status, StatusCode::OK, "{}", reverted.text());
    assert_eq!(cost(&app, NOVEMBER).await, before);
}
