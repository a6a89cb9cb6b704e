//! Budget burn: spend against the monthly budget, alerts at thresholds and forecast, each
//! fired once whatever re-evaluates spend.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::workers::webhooks::{DeliveryPolicy, SIGNATURE_HEADER, Webhooks, sign};

use crate::common::{Receiver, TestApp};
use crate::fixtures::{contract, record};

const SECRET: &str = "burn-test-secret";

fn at(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

async fn app_at(now: &str) -> TestApp {
    TestApp::spawn_with(Settings {
        clock: Clock::Fixed(at(now)),
        ..Settings::default()
    })
    .await
}

/// A project with a 1,000 USD monthly budget and H100 on-demand GPU-hours at 10 USD.
async fn budgeted_project(app: &TestApp, webhook: &str) {
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD",
                   "default_monthly_budget": "1000", "webhook_url": webhook}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    contract("H100", "on_demand", "10")
        .named("H100 list price")
        .create(app)
        .await;
}

async fn post(app: &TestApp, records: Value) -> Value {
    let response = app.post("/v1/job-records", &app.admin, records).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

async fn fired(app: &TestApp) -> BTreeSet<(String, i64)> {
    let alerts = app
        .get("/v1/alerts?project=vision&month=2026-11", &app.admin)
        .await
        .json();
    alerts["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["kind"].as_str().unwrap().to_owned(),
                a["threshold"].as_i64().unwrap(),
            )
        })
        .collect()
}

fn set(items: &[(&str, i64)]) -> BTreeSet<(String, i64)> {
    items.iter().map(|(k, t)| (k.to_string(), *t)).collect()
}

#[tokio::test]
async fn thresholds_and_forecast_fire_once_each_as_records_push_spend_up() {
    // 19 of November's 30 days have passed: the forecast is spend × 720 / 456.
    let app = app_at("2026-11-20T00:00:00Z").await;
    let receiver = Receiver::start(0).await;
    budgeted_project(&app, &receiver.url).await;

    let r1 = record("r1", "2026-11-10T00:00:00Z", "2026-11-10T13:00:00Z").gpu_count(4);
    post(&app, json!([r1])).await;
    assert_eq!(
        fired(&app).await,
        set(&[("actual", 50)]),
        "520 of 1000 spent"
    );

    let r2 = record("r2", "2026-11-11T00:00:00Z", "2026-11-11T09:00:00Z").gpu_count(2);
    post(&app, json!([r2])).await;
    assert_eq!(
        fired(&app).await,
        set(&[("actual", 50), ("forecast", 100)]),
        "700 spent: the run rate reaches 1105"
    );

    let r3 = record("r3", "2026-11-12T00:00:00Z", "2026-11-12T12:00:00Z");
    post(&app, json!([r3])).await;
    assert_eq!(
        fired(&app).await,
        set(&[("actual", 50), ("actual", 80), ("forecast", 100)])
    );

    let replay = post(&app, json!([r1, r2, r3])).await;
    assert_eq!(replay["duplicates"], 3);
    let r4 = record("r4", "2026-11-13T00:00:00Z", "2026-11-13T03:00:00Z");
    post(&app, json!([r4])).await;
    let raised = app
        .put(
            "/v1/projects/vision/budgets/2026-11",
            &app.admin,
            json!({"amount": "5000"}),
        )
        .await;
    assert_eq!(raised.status, StatusCode::OK);
    assert_eq!(
        fired(&app).await.len(),
        3,
        "nothing fires twice, and raising the budget un-fires nothing"
    );

    let burn = app
        .get("/v1/projects/vision/burn?month=2026-11", &app.admin)
        .await;
    assert_eq!(burn.status, StatusCode::OK, "{}", burn.text());
    let burn = burn.json();
    assert_eq!(burn["spend"], "850");
    assert_eq!(burn["budget"], "5000");
    assert_eq!(burn["burn_pct"], "17");
    let crossed: Vec<(&str, i64, bool)> = burn["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["kind"].as_str().unwrap(),
                t["percent"].as_i64().unwrap(),
                !t["crossed_at"].is_null(),
            )
        })
        .collect();
    assert_eq!(
        crossed,
        vec![
            ("actual", 50, true),
            ("actual", 80, true),
            ("actual", 100, false),
            ("forecast", 100, true)
        ]
    );

    let webhooks = Webhooks::new(
        app.pool.clone(),
        SECRET.to_owned(),
        DeliveryPolicy::default(),
    )
    .unwrap();
    assert_eq!(webhooks.deliver_due().await.unwrap(), 3);
    let delivered = receiver.raw();
    assert_eq!(delivered.len(), 3);
    for (headers, body) in &delivered {
        assert_eq!(
            headers[SIGNATURE_HEADER].to_str().unwrap(),
            sign(SECRET, body)
        );
    }
    let listed = app
        .get("/v1/alerts?project=vision", &app.admin)
        .await
        .json();
    for alert in listed["items"].as_array().unwrap() {
        assert_eq!(alert["delivery_state"], "delivered");
        assert_eq!(alert["deliveries"][0]["status_code"], 200);
    }
    let fifty = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["threshold"] == 50)
        .unwrap();
    assert_eq!(fifty["spend"], "520");
    assert_eq!(fifty["burn_pct"], "52");
}

#[tokio::test]
async fn twenty_concurrent_ingests_that_cross_80_percent_fire_one_alert() {
    let app = std::sync::Arc::new(app_at("2026-11-02T00:00:00Z").await);
    let receiver = Receiver::start(0).await;
    budgeted_project(&app, &receiver.url).await;
    let mut clients = Vec::new();
    for client in 0..20 {
        let app = app.clone();
        clients.push(tokio::spawn(async move {
            // 4.5 GPU-hours: 45 USD each, 900 in all.
            let task = format!("c{client}");
            let body = json!([
                record(&task, "2026-11-01T10:00:00Z", "2026-11-01T13:00:00Z").gpu_count("1.5")
            ]);
            let response = app.post("/v1/job-records", &app.admin, body).await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        }));
    }
    for client in clients {
        client.await.unwrap();
    }
    assert_eq!(fired(&app).await, set(&[("actual", 50), ("actual", 80)]));
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM alert_events WHERE threshold = 80")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count, 1);
    let burn = app.get("/v1/projects/vision/burn", &app.admin).await.json();
    assert_eq!(burn["spend"], "900");
    assert_eq!(
        burn["forecast"],
        Value::Null,
        "no forecast in the first 72 hours"
    );
}

#[tokio::test]
async fn the_periodic_check_fires_on_accrued_unused_commitment_alone() {
    let app = app_at("2026-11-20T00:00:00Z").await;
    let receiver = Receiver::start(0).await;
    budgeted_project(&app, &receiver.url).await;
    contract("A100", "reserved", "1")
        .named("two owned A100s")
        .project("vision")
        .committed_gpus(2)
        .valid_from("2026-11-01T00:00:00Z")
        .create(&app)
        .await;
    sqlx::query("DELETE FROM alert_deliveries")
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM alert_events")
        .execute(&app.pool)
        .await
        .unwrap();
    assert!(fired(&app).await.is_empty());

    // No record arrives; 456 hours × 2 unused GPUs have accrued by now.
    taskledger::workers::burn_tick::run(
        app.pool.clone(),
        Settings {
            clock: Clock::Fixed(at("2026-11-20T00:00:00Z")),
            ..Settings::default()
        },
        Duration::from_secs(3600),
        std::future::ready(()),
    )
    .await;
    assert_eq!(
        fired(&app).await,
        set(&[("actual", 50), ("actual", 80), ("forecast", 100)])
    );
    let burn = app
        .get("/v1/projects/vision/burn?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(burn["spend"], "912");
    assert_eq!(burn["forecast"], "1440");
}

#[tokio::test]
async fn burn_answers_as_of_an_earlier_time_and_checks_its_parameters() {
    let app = app_at("2026-11-20T00:00:00Z").await;
    budgeted_project(&app, "http://127.0.0.1:9/hook").await;
    post(
        &app,
        json!([
            record("a", "2026-11-05T00:00:00Z", "2026-11-05T10:00:00Z"),
            record("b", "2026-11-15T00:00:00Z", "2026-11-15T10:00:00Z")
        ]),
    )
    .await;
    let early = app
        .get(
            "/v1/projects/vision/burn?month=2026-11&as_of=2026-11-10T00:00:00Z",
            &app.admin,
        )
        .await
        .json();
    assert_eq!(early["spend"], "100", "only what was spent by the 10th");
    assert!(
        early["forecast"].as_str().unwrap().starts_with("333.3333"),
        "100 × 720 / 216"
    );
    // The spend as it grew, day by day up to the day holding as_of.
    let days = |burn: &Value| -> Vec<(String, String)> {
        burn["days"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["day"].as_str().unwrap().to_owned(),
                    d["spend"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let early_days = days(&early);
    assert_eq!(early_days.len(), 10, "1 to 10 November: {early_days:?}");
    assert_eq!(early_days[3], ("2026-11-04".to_owned(), "0".to_owned()));
    assert_eq!(early_days[4], ("2026-11-05".to_owned(), "100".to_owned()));
    assert_eq!(early_days[9], ("2026-11-10".to_owned(), "100".to_owned()));
    let now = app
        .get("/v1/projects/vision/burn?month=2026-11", &app.admin)
        .await
        .json();
    let now_days = days(&now);
    assert_eq!(now_days.len(), 20);
    assert_eq!(now_days[13].1, "100");
    assert_eq!(now_days[14], ("2026-11-15".to_owned(), "200".to_owned()));
    assert_eq!(now_days[19].1, now["spend"].as_str().unwrap());
    let bad = app
        .get(
            "/v1/projects/vision/burn?month=11-2026&as_of=today",
            &app.admin,
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = bad.pointers();
    pointers.sort();
    assert_eq!(pointers, vec!["query:as_of", "query:month"]);
}
