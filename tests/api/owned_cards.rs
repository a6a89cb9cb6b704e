//! Owned cards priced from what they cost (COST_MODEL §10): a TCO contract's derived price
//! and its parts, the drop when the cards are fully depreciated, changes that re-price, and
//! bad TCO input named by pointer. Figures are worked out by hand in the comments.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, cost};
use crate::fixtures::{contract, record};

const NOVEMBER: &str = "/v1/projects/vision/cost?month=2026-11&as_of=2027-01-01T00:00:00Z";
const OCTOBER: &str = "/v1/projects/vision/cost?month=2026-10&as_of=2027-01-01T00:00:00Z";

/// An owned A100: bought for 15,000, sold for 1,860 after 12 months in service from
/// 20 November 2025 (so fully depreciated from 20 November 2026), drawing 0.5 kW at PUE 1.2
/// and 0.25 a kWh, with 73 a month of other costs. Its price per GPU-hour:
/// depreciation 13,140 ÷ (12 × 730) = 1.5, other 73 ÷ 730 = 0.1, power 0.5 × 1.2 × 0.25 =
/// 0.15; 1.75 in all, 0.25 once depreciated.
fn owned_a100() -> Value {
    json!({
        "name": "owned A100", "gpu_model": "A100", "billing_mode": "reserved",
        "currency": "USD", "valid_from": "2026-10-01T00:00:00Z",
        "tco": {
            "purchase_price_per_gpu": "15000", "salvage_value_per_gpu": "1860",
            "life_months": 12, "in_service_from": "2025-11-20T00:00:00Z",
            "power_kw_per_gpu": "0.5", "electricity_price_per_kwh": "0.25", "pue": "1.2",
            "other_per_gpu_month": "73"
        }
    })
}

/// Records on owned A100s: one across the end of depreciation, one before, one after, and
/// one in October.
fn records() -> Vec<crate::fixtures::Record> {
    let a100 = |task: &str, from: &str, until: &str| {
        record(task, from, until)
            .gpu_model("A100")
            .billing_mode("reserved")
    };
    vec![
        // 2 GPUs, 2 hours before and 2 after midnight of the 20th.
        a100("across", "2026-11-19T22:00:00Z", "2026-11-20T02:00:00Z").gpu_count(2),
        a100("before", "2026-11-10T00:00:00Z", "2026-11-10T10:00:00Z"),
        a100("after", "2026-11-25T00:00:00Z", "2026-11-25T04:00:00Z"),
        a100("october", "2026-10-05T00:00:00Z", "2026-10-05T02:00:00Z"),
    ]
}

fn unprocessable(response: &crate::common::TestResponse) -> Vec<String> {
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        response.text()
    );
    response.pointers()
}

fn csv_rows(body: &[u8]) -> (Vec<String>, Vec<Vec<String>>) {
    let mut reader = csv::Reader::from_reader(body);
    let header = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let rows = reader
        .records()
        .map(|row| row.unwrap().iter().map(str::to_owned).collect())
        .collect();
    (header, rows)
}

async fn task_total(app: &TestApp, task: &str) -> Value {
    let detail = app
        .get(&format!("/v1/projects/vision/tasks/{task}"), &app.admin)
        .await;
    assert_eq!(detail.status, StatusCode::OK, "{}", detail.text());
    detail.json()["lifetime"]["total"].clone()
}

#[tokio::test]
async fn a_tco_contract_answers_with_its_price_its_parts_and_when_depreciation_ends() {
    let app = TestApp::spawn().await;
    let created = app.post("/v1/contracts", &app.admin, owned_a100()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let created = created.json();
    assert_money(&created["price_per_gpu_hour"], "1.75");
    // 1.75 ÷ 60, kept to 20 places.
    assert_money(&created["price_per_gpu_minute"], "0.02916666666666666667");
    assert_money(&created["price_parts"]["depreciation"], "1.5");
    assert_money(&created["price_parts"]["other"], "0.1");
    assert_money(&created["price_parts"]["power"], "0.15");
    assert_eq!(created["depreciated_from"], "2026-11-20T00:00:00Z");
    assert_eq!(created["valid_until"], Value::Null);
    assert_eq!(created["tco"]["life_months"], 12);
    let phases = created["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2);
    assert_eq!(phases[0]["until"], "2026-11-20T00:00:00Z");
    assert_eq!(phases[1]["from"], "2026-11-20T00:00:00Z");
    assert_money(&phases[1]["price_per_gpu_hour"], "0.25");
    assert_money(&phases[1]["price_per_gpu_minute"], "0.00416666666666666667");
    assert_money(&phases[1]["price_parts"]["depreciation"], "0");

    // One contract is listed, as it was given, and it is what its id answers.
    let id = created["id"].as_str().unwrap();
    let listed = app.get("/v1/contracts", &app.admin).await.json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);
    assert_eq!(listed["items"][0]["id"], id);
    assert_eq!(listed["items"][0]["valid_until"], Value::Null);

    // A contract with a price answers with it per minute too, and no parts.
    let plain = app
        .post(
            "/v1/contracts",
            &app.admin,
            contract("H100", "on_demand", "3").into(),
        )
        .await
        .json();
    assert_money(&plain["price_per_gpu_minute"], "0.05");
    assert_eq!(plain["price_parts"], Value::Null);
    assert_eq!(plain["phases"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn the_price_drops_when_the_cards_are_depreciated_and_changes_re_price() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let created = app.post("/v1/contracts", &app.admin, owned_a100()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let id = created.json()["id"].as_str().unwrap().to_owned();
    app.ingest(records()).await;

    // across: 2 GPUs × 2 h × 1.75 + 2 × 2 × 0.25 = 7 + 1 = 8; before: 10 × 1.75 = 17.5;
    // after: 4 × 0.25 = 1; November 26.5. October: 2 × 1.75 = 3.5.
    assert_money(&cost(&app, NOVEMBER).await["total"], "26.5");
    assert_money(&task_total(&app, "across").await, "8");
    assert_money(&task_total(&app, "after").await, "1");
    assert_money(&cost(&app, OCTOBER).await["total"], "3.5");

    // What an idle minute costs, before and after the drop, to a reader of the project.
    let reader = app.token("reader", &["vision"]).await;
    let before = app
        .get(
            "/v1/projects/vision/prices?at=2026-11-10T00:00:00Z",
            &reader,
        )
        .await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.text());
    let before = before.json();
    assert_eq!(before["items"].as_array().unwrap().len(), 1);
    assert_eq!(before["items"][0]["gpu_model"], "A100");
    assert_money(
        &before["items"][0]["price_per_gpu_minute"],
        "0.02916666666666666667",
    );
    assert_money(
        &before["items"][0]["project_price_per_gpu_minute"],
        "0.02916666666666666667",
    );
    assert_money(&before["items"][0]["price_parts"]["depreciation"], "1.5");
    let after = app
        .get(
            "/v1/projects/vision/prices?at=2026-11-20T00:00:00Z",
            &reader,
        )
        .await
        .json();
    assert_money(&after["items"][0]["price_per_gpu_hour"], "0.25");
    assert_money(&after["items"][0]["price_parts"]["depreciation"], "0");
    let fleet = app
        .get("/v1/prices?at=2026-11-20T00:00:00Z", &app.admin)
        .await;
    assert_eq!(fleet.status, StatusCode::OK, "{}", fleet.text());
    assert_money(
        &fleet.json()["items"][0]["price_per_gpu_minute"],
        "0.00416666666666666667",
    );
    let forbidden = app.get("/v1/prices", &reader).await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    let early = app
        .get(
            "/v1/projects/vision/prices?at=2026-09-01T00:00:00Z",
            &reader,
        )
        .await
        .json();
    assert!(early["items"].as_array().unwrap().is_empty());

    // Electricity at 0.5: power 0.3, so 1.9 and 0.4 an hour.
    // across 2 × 2 × 1.9 + 2 × 2 × 0.4 = 9.2; before 19; after 1.6; November 29.8.
    let changed = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"tco": {"electricity_price_per_kwh": "0.5"}}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    assert_money(&changed.json()["price_per_gpu_hour"], "1.9");
    assert_money(&cost(&app, NOVEMBER).await["total"], "29.8");
    assert_money(&task_total(&app, "across").await, "9.2");

    // In service five days later: depreciated from the 25th, so `across` is priced at 1.9
    // throughout (15.2) and `after` still at 0.4 (1.6): November 15.2 + 19 + 1.6 = 35.8.
    let moved = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"tco": {"in_service_from": "2025-11-25T00:00:00Z"}}),
        )
        .await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.text());
    assert_eq!(moved.json()["depreciated_from"], "2026-11-25T00:00:00Z");
    assert_money(&cost(&app, NOVEMBER).await["total"], "35.8");
    assert_money(&task_total(&app, "across").await, "15.2");
    // October was priced during depreciation all along: 2 × 1.9.
    assert_money(&cost(&app, OCTOBER).await["total"], "3.8");

    // A plain price in place of the TCO: 2 an hour everywhere; November 2 × 4 × 2 + 20 + 8.
    let priced = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"tco": null, "price_per_gpu_hour": "2"}),
        )
        .await;
    assert_eq!(priced.status, StatusCode::OK, "{}", priced.text());
    assert_eq!(priced.json()["phases"].as_array().unwrap().len(), 1);
    assert_money(&cost(&app, NOVEMBER).await["total"], "44");

    // And back to the TCO: every field is required again.
    let back = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"tco": owned_a100()["tco"]}),
        )
        .await;
    assert_eq!(back.status, StatusCode::OK, "{}", back.text());
    assert_money(&cost(&app, NOVEMBER).await["total"], "26.5");

    // Deleting the contract leaves every A100 hour unrated.
    let deleted = app.delete(&format!("/v1/contracts/{id}"), &app.admin).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);
    let november = cost(&app, NOVEMBER).await;
    assert_money(&november["total"], "0");
    // 2 × 4 h + 10 h + 4 h of GPU time.
    assert_money(&november["unrated_gpu_seconds"], "79200");
}

#[tokio::test]
async fn bad_tco_input_is_refused_field_by_field() {
    let app = TestApp::spawn().await;
    let mut bad = owned_a100();
    bad["tco"]["life_months"] = json!(0);
    bad["tco"]["pue"] = json!("0.9");
    bad["tco"]["electricity_price_per_kwh"] = json!("-0.1");
    bad["tco"]["in_service_from"] = json!("last spring");
    let refused = app.post("/v1/contracts", &app.admin, bad).await;
    assert_eq!(
        unprocessable(&refused),
        [
            "/tco/life_months",
            "/tco/in_service_from",
            "/tco/electricity_price_per_kwh",
            "/tco/pue"
        ]
    );

    let mut above = owned_a100();
    above["tco"]["salvage_value_per_gpu"] = json!("20000");
    let refused = app.post("/v1/contracts", &app.admin, above).await;
    assert_eq!(unprocessable(&refused), ["/tco/salvage_value_per_gpu"]);

    let mut both = owned_a100();
    both["price_per_gpu_hour"] = json!("2");
    let refused = app.post("/v1/contracts", &app.admin, both).await;
    assert_eq!(unprocessable(&refused), ["/tco"]);

    let mut on_demand = owned_a100();
    on_demand["billing_mode"] = json!("on_demand");
    let refused = app.post("/v1/contracts", &app.admin, on_demand).await;
    assert_eq!(unprocessable(&refused), ["/tco"]);

    let mut neither = owned_a100();
    neither.as_object_mut().unwrap().remove("tco");
    let refused = app.post("/v1/contracts", &app.admin, neither).await;
    assert_eq!(unprocessable(&refused), ["/price_per_gpu_hour"]);

    let mut partial = owned_a100();
    partial["tco"] = json!({"purchase_price_per_gpu": "15000"});
    let refused = app.post("/v1/contracts", &app.admin, partial).await;
    assert_eq!(
        unprocessable(&refused),
        ["/tco/life_months", "/tco/in_service_from"]
    );

    let mut unknown = owned_a100();
    unknown["tco"]["wattage"] = json!(700);
    let refused = app.post("/v1/contracts", &app.admin, unknown).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.text()
    );

    // Nothing was stored; a TCO contract's price is changed through its TCO.
    assert!(
        app.get("/v1/contracts", &app.admin).await.json()["items"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let id = app
        .post("/v1/contracts", &app.admin, owned_a100())
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let refused = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"price_per_gpu_hour": "2"}),
        )
        .await;
    assert_eq!(unprocessable(&refused), ["/price_per_gpu_hour"]);
    let refused = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"tco": {"pue": "0.5"}}),
        )
        .await;
    assert_eq!(unprocessable(&refused), ["/tco/pue"]);
    let unchanged = app.get(&format!("/v1/contracts/{id}"), &app.admin).await;
    assert_money(&unchanged.json()["price_per_gpu_hour"], "1.75");
}

/// Project `vision` on the owned A100 in November, with the grid of `dc-1` at 400 g a kWh:
/// `metered` (4 h, 1.6 kWh measured, 3 h busy, 1,000 tokens), `estimated` (2 h, no energy,
/// 1,000 tokens) and `elsewhere` (2 h, 0.8 kWh in `dc-2`, which has no intensity; failed).
pub(crate) async fn metered_month(app: &TestApp) {
    app.create_project("vision", "USD").await;
    let created = app.post("/v1/contracts", &app.admin, owned_a100()).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let intensity = app
        .put(
            "/v1/grid-intensity/2026-11/dc-1",
            &app.admin,
            json!({"g_co2e_per_kwh": "400"}),
        )
        .await;
    assert_eq!(intensity.status, StatusCode::OK, "{}", intensity.text());
    app.ingest(vec![
        // 4 h at 400 W: 1.6 kWh, 3 of the 4 hours busy.
        a100("metered", "2026-11-10T00:00:00Z", "2026-11-10T04:00:00Z")
            .gpu_seconds_busy(10800)
            .with("energy_joules", "5760000")
            .output("1000", "tokens"),
        a100("estimated", "2026-11-11T00:00:00Z", "2026-11-11T02:00:00Z").output("1000", "tokens"),
        // 2 h at 400 W in a region without an intensity, failed.
        a100("elsewhere", "2026-11-12T00:00:00Z", "2026-11-12T02:00:00Z")
            .with("region", "dc-2")
            .outcome("failed")
            .with("energy_joules", 2880000),
    ])
    .await;
}

fn a100(task: &str, from: &str, until: &str) -> crate::fixtures::Record {
    record(task, from, until)
        .gpu_model("A100")
        .billing_mode("reserved")
        .with("region", "dc-1")
}

#[tokio::test]
async fn measured_energy_replaces_the_power_estimate_and_gives_kwh_and_emissions() {
    let app = TestApp::spawn().await;
    metered_month(&app).await;

    // metered: 4 h × (1.5 + 0.1) + 1.6 kWh × 1.2 × 0.25 = 6.4 + 0.48 = 6.88, three quarters
    // productive (5.16) and a quarter idle (1.72); estimated: 2 × 1.75 = 3.5, unmeasured;
    // elsewhere: 2 × 1.6 + 0.8 × 0.3 = 3.44, failed.
    let november = cost(&app, NOVEMBER).await;
    assert_money(&november["total"], "13.82");
    assert_money(&november["breakdown"]["productive"], "5.16");
    assert_money(&november["breakdown"]["idle"], "1.72");
    assert_money(&november["breakdown"]["unmeasured"], "3.5");
    assert_money(&november["breakdown"]["failed"], "3.44");
    assert_money(&task_total(&app, "metered").await, "6.88");

    // 2.4 kWh over 6 of the 8 GPU-hours; per token over the completed records with tokens:
    // 1.6 kWh ÷ 2,000 tokens, with 4 of their 6 GPU-hours measured.
    let energy = &november["energy"];
    assert_money(&energy["kwh"], "2.4");
    assert_money(&energy["coverage"], "0.75");
    assert_eq!(energy["kwh_per_unit"][0]["unit"], "tokens");
    assert_money(&energy["kwh_per_unit"][0]["kwh"], "0.0008");
    assert_money(&energy["kwh_per_unit"][0]["coverage"], "0.666667");
    // Only dc-1 has an intensity: 1.6 kWh × PUE 1.2 × 400 g = 768 g, over 4 of 8 GPU-hours.
    assert_money(&november["emissions"]["kg_co2e"], "0.768");
    assert_money(&november["emissions"]["coverage"], "0.5");

    // By day, each group has its own.
    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    let groups = by_day["groups"].as_array().unwrap();
    assert_money(&groups[0]["energy"]["kwh"], "1.6");
    assert_eq!(groups[1]["energy"], Value::Null);
    assert_eq!(groups[2]["emissions"]["kg_co2e"], Value::Null);
    assert_money(&groups[2]["emissions"]["coverage"], "0");

    // Per task, in the list (and as CSV) and over its lifetime.
    let tasks = app
        .get(
            "/v1/projects/vision/tasks?month=2026-11&sort=started_at&order=asc",
            &app.admin,
        )
        .await
        .json();
    let metered = &tasks["items"][0];
    assert_eq!(metered["task_id"], "metered");
    assert_money(&metered["energy"]["kwh"], "1.6");
    assert_money(&metered["energy"]["coverage"], "1");
    assert_money(&metered["energy"]["kwh_per_unit"][0]["kwh"], "0.0016");
    assert_money(&metered["emissions"]["kg_co2e"], "0.768");
    assert_eq!(tasks["items"][1]["energy"], Value::Null);
    assert_eq!(tasks["items"][2]["emissions"]["kg_co2e"], Value::Null);
    let request = axum::http::Request::get(
        "/v1/projects/vision/tasks?month=2026-11&sort=started_at&order=asc",
    )
    .header("authorization", format!("Bearer {}", app.admin))
    .header("accept", "text/csv")
    .body(axum::body::Body::empty())
    .unwrap();
    let csv = app.send(request).await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.text());
    let (header, rows) = csv_rows(&csv.body);
    let at =
        |row: usize, name: &str| rows[row][header.iter().position(|h| h == name).unwrap()].clone();
    assert_eq!(at(0, "energy_kwh"), "1.6");
    assert_eq!(at(0, "kg_co2e"), "0.768");
    assert_eq!(at(1, "energy_kwh"), "");
    let detail = app
        .get("/v1/projects/vision/tasks/metered", &app.admin)
        .await
        .json();
    assert_money(&detail["energy"]["kwh"], "1.6");
    assert_eq!(detail["attempts"][0]["energy_joules"], "5760000");

    // The monthly report carries them, in JSON and in CSV.
    let report = app
        .get("/v1/reports/monthly/2026-11", &app.admin)
        .await
        .json();
    assert_money(&report["projects"][0]["energy"]["kwh"], "2.4");
    assert_money(&report["projects"][0]["emissions"]["kg_co2e"], "0.768");
    let csv = app
        .get("/v1/reports/monthly/2026-11?format=csv", &app.admin)
        .await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.text());
    let (header, rows) = csv_rows(&csv.body);
    let project = rows.iter().find(|row| row[0] == "project").unwrap();
    let column = |name: &str| project[header.iter().position(|h| h == name).unwrap()].clone();
    assert_eq!(column("energy_kwh"), "2.4");
    assert_eq!(column("energy_coverage"), "0.75");
    assert_eq!(column("kg_co2e"), "0.768");
    assert_eq!(column("emissions_coverage"), "0.5");

    // dc-2's intensity once entered counts at once: 0.8 × 1.2 × 250 g = 240 g more.
    let intensity = app
        .put(
            "/v1/grid-intensity/2026-11/dc-2",
            &app.admin,
            json!({"g_co2e_per_kwh": 250}),
        )
        .await;
    assert_eq!(intensity.status, StatusCode::OK, "{}", intensity.text());
    let november = cost(&app, NOVEMBER).await;
    assert_money(&november["emissions"]["kg_co2e"], "1.008");
    assert_money(&november["emissions"]["coverage"], "0.75");
    let listed = app.get("/v1/grid-intensity", &app.admin).await.json();
    assert_eq!(listed["items"].as_array().unwrap().len(), 2);
    assert_eq!(listed["items"][1]["region"], "dc-2");

    // Energy is refused when negative or a thousand times too large.
    let refused = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([
                a100("bad", "2026-11-13T00:00:00Z", "2026-11-13T01:00:00Z")
                    .with("energy_joules", "-1"),
                a100("milli", "2026-11-13T00:00:00Z", "2026-11-13T01:00:00Z")
                    .with("energy_joules", "2520000000"),
            ]),
        )
        .await;
    assert_eq!(
        unprocessable(&refused),
        ["/0/energy_joules", "/1/energy_joules"]
    );
    let refused = app
        .put(
            "/v1/grid-intensity/2026-13/dc-1",
            &app.admin,
            json!({"g_co2e_per_kwh": "-3"}),
        )
        .await;
    assert_eq!(unprocessable(&refused), ["path:month", "/g_co2e_per_kwh"]);
    let reader = app.token("reader", &["vision"]).await;
    let forbidden = app
        .put(
            "/v1/grid-intensity/2026-11/dc-1",
            &reader,
            json!({"g_co2e_per_kwh": 1}),
        )
        .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
}
