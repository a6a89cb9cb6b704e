//! Routes: budgets and retry caps on a label value of a project's records. A route's budget
//! fires the project's thresholds for the spend of its records only; a task with an attempt
//! beyond the attempts cap, or a ledger hour whose failed attempts cost more than the hourly
//! cap, fires one `retry_storm` alert, once, however often and concurrently it is judged.
//!
//! Every figure is hand-computed from one contract: an H100 GPU-hour on demand at 10 USD.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::ledger::alerting;

use crate::common::{TestApp, assert_money};
use crate::fixtures::{contract, record};

/// Two days of November have passed: spend counts, and no forecast is made before 72 hours.
const NOW: &str = "2026-11-03T00:00:00Z";

fn settings() -> Settings {
    Settings {
        clock: Clock::Fixed(NOW.parse::<DateTime<Utc>>().unwrap()),
        ..Settings::default()
    }
}

/// Project `vision` in USD with a 300 USD monthly budget and a webhook nobody answers (so
/// its deliveries stay pending in the outbox), and the 10 USD H100 contract.
async fn app() -> TestApp {
    let app = TestApp::spawn_with(settings()).await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD",
                   "default_monthly_budget": "300",
                   "webhook_url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    contract("H100", "on_demand", "10").create(&app).await;
    app
}

async fn put_route(app: &TestApp, value: &str, body: Value) -> Value {
    let response = app
        .put(
            &format!("/v1/projects/vision/routes/route/{value}"),
            &app.admin,
            body,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

async fn alerts(app: &TestApp) -> Vec<Value> {
    let response = app.get("/v1/alerts?project=vision", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()["items"].as_array().unwrap().clone()
}

/// The alerts as `(kind, threshold, route value)`, sorted.
async fn budget_alerts(app: &TestApp) -> Vec<(String, Option<i64>, Option<String>)> {
    let mut fired: Vec<_> = alerts(app)
        .await
        .iter()
        .map(|a| {
            (
                a["kind"].as_str().unwrap().to_owned(),
                a["threshold"].as_i64(),
                a["route"]["value"].as_str().map(str::to_owned),
            )
        })
        .collect();
    fired.sort();
    fired
}

fn storms(alerts: &[Value]) -> Vec<&Value> {
    alerts
        .iter()
        .filter(|a| a["kind"] == "retry_storm")
        .collect()
}

async fn burn(app: &TestApp, value: &str) -> Value {
    let response = app
        .get(
            &format!("/v1/projects/vision/routes/route/{value}/burn?month=2026-11"),
            &app.admin,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

fn actual(threshold: i64, route: Option<&str>) -> (String, Option<i64>, Option<String>) {
    (
        "actual".to_owned(),
        Some(threshold),
        route.map(str::to_owned),
    )
}

#[tokio::test]
async fn a_routes_budget_fires_its_thresholds_once_on_its_own_spend() {
    let app = app().await;
    put_route(&app, "summarise", json!({"monthly_budget": "100"})).await;
    put_route(&app, "translate", json!({"monthly_budget": "1000"})).await;

    // summarise 4 h = 40 of 100; translate 3 h = 30 of 1000; unlabelled 5 h = 50. The
    // project spends 120 of 300.
    let s1 =
        record("s1", "2026-11-01T00:00:00Z", "2026-11-01T04:00:00Z").label("route", "summarise");
    let t1 =
        record("t1", "2026-11-01T00:00:00Z", "2026-11-01T03:00:00Z").label("route", "translate");
    let u1 = record("u1", "2026-11-01T05:00:00Z", "2026-11-01T10:00:00Z");
    app.ingest(json!([s1, t1, u1])).await;
    assert_eq!(budget_alerts(&app).await, vec![], "40 % and 3 % and 40 %");
    assert_money(&burn(&app, "summarise").await["spend"], "40");

    // summarise + 2 h = 60: its 50 % fires; the project's 140 of 300 does not.
    let s2 =
        record("s2", "2026-11-01T10:00:00Z", "2026-11-01T12:00:00Z").label("route", "summarise");
    app.ingest(json!([s2])).await;
    assert_eq!(
        budget_alerts(&app).await,
        vec![actual(50, Some("summarise"))]
    );

    // summarise + 2 h = 80: its 80 % fires; the project reaches 160 of 300, its own 50 %.
    let s3 =
        record("s3", "2026-11-02T00:00:00Z", "2026-11-02T02:00:00Z").label("route", "summarise");
    app.ingest(json!([s3])).await;
    let expected = vec![
        actual(50, None),
        actual(50, Some("summarise")),
        actual(80, Some("summarise")),
    ];
    assert_eq!(budget_alerts(&app).await, expected);

    // Duplicates, and the periodic evaluation, fire nothing more.
    let replay = app
        .post("/v1/job-records", &app.admin, json!([s1, s2, s3, t1, u1]))
        .await;
    assert_eq!(replay.json()["duplicates"], 5, "{}", replay.text());
    alerting::evaluate_current_month(&app.pool, &settings()).await;
    alerting::evaluate_all(
        &app.pool,
        [(
            "vision".to_owned(),
            taskledger::domain::values::month_holding(NOW.parse().unwrap(), chrono_tz::UTC),
        )],
        &settings(),
    )
    .await;
    assert_eq!(budget_alerts(&app).await, expected);

    let summarise = burn(&app, "summarise").await;
    assert_eq!(
        summarise["route"],
        json!({"key": "route", "value": "summarise"})
    );
    assert_eq!(summarise["month"], "2026-11");
    assert_eq!(summarise["currency"], "USD");
    assert_money(&summarise["budget"], "100");
    assert_money(&summarise["spend"], "80");
    assert_money(&summarise["burn_pct"], "80");
    assert!(
        summarise["forecast"].is_null(),
        "48 hours of the month have passed"
    );
    let crossed: Vec<(i64, &str, bool)> = summarise["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["percent"].as_i64().unwrap(),
                t["kind"].as_str().unwrap(),
                !t["crossed_at"].is_null(),
            )
        })
        .collect();
    assert_eq!(
        crossed,
        vec![
            (50, "actual", true),
            (80, "actual", true),
            (100, "actual", false),
            (100, "forecast", false)
        ]
    );
    let translate = burn(&app, "translate").await;
    assert_money(&translate["spend"], "30");
    assert_money(&translate["burn_pct"], "3");

    // The project's own burn is its whole spend, and lists only its own alert.
    let project = app
        .get("/v1/projects/vision/burn?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&project["spend"], "160");
    let project_crossed: Vec<i64> = project["thresholds"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| !t["crossed_at"].is_null())
        .map(|t| t["percent"].as_i64().unwrap())
        .collect();
    assert_eq!(project_crossed, vec![50]);

    // The route's alerts carry their figures and wait in the outbox like the others.
    let fired = alerts(&app).await;
    let eighty = fired
        .iter()
        .find(|a| a["threshold"] == 80)
        .expect("the 80 % alert");
    assert_money(&eighty["spend"], "80");
    assert_money(&eighty["budget"], "100");
    assert_money(&eighty["burn_pct"], "80");
    assert_eq!(eighty["delivery_state"], "pending");
}

#[tokio::test]
async fn a_task_beyond_the_attempts_cap_storms_once() {
    let app = app().await;
    put_route(&app, "summarise", json!({"max_attempts_per_task": 3})).await;
    let attempt = |task: &str, n: u32| {
        let hour = format!("2026-11-01T{:02}:00:00Z", n);
        let end = format!("2026-11-01T{:02}:30:00Z", n);
        record(task, &hour, &end)
            .attempt(n)
            .outcome(if n < 5 { "failed" } else { "completed" })
            .label("route", "summarise")
    };

    app.ingest(json!([attempt("a", 1), attempt("a", 2), attempt("a", 3)]))
        .await;
    app.ingest(json!([attempt("b", 1), attempt("b", 2), attempt("b", 3)]))
        .await;
    assert!(
        storms(&alerts(&app).await).is_empty(),
        "3 attempts are within the cap"
    );

    app.ingest(json!([attempt("a", 4), attempt("a", 5)])).await;
    let fired = alerts(&app).await;
    let storms = storms(&fired);
    assert_eq!(storms.len(), 1, "{fired:?}");
    let storm = storms[0];
    assert_eq!(
        storm["route"],
        json!({"key": "route", "value": "summarise"})
    );
    assert_eq!(storm["retry_storm"]["trigger"], "max_attempts_per_task");
    assert_eq!(storm["retry_storm"]["task_id"], "a");
    assert_eq!(
        storm["retry_storm"]["attempt"], 4,
        "the first attempt beyond the cap"
    );
    assert!(storm["retry_storm"]["hour"].is_null());
    assert_money(&storm["retry_storm"]["cap"], "3");
    assert_money(&storm["retry_storm"]["observed"], "4");
    assert_eq!(storm["month"], "2026-11");
    assert_eq!(storm["delivery_state"], "pending");

    // A later attempt of the same task, and the periodic evaluation, fire nothing more.
    app.ingest(json!([attempt("a", 6)])).await;
    alerting::evaluate_current_month(&app.pool, &settings()).await;
    assert_eq!(self::storms(&alerts(&app).await).len(), 1);
}

#[tokio::test]
async fn failed_spend_above_the_hourly_cap_storms_once_for_that_hour() {
    let app = app().await;
    put_route(
        &app,
        "summarise",
        json!({"max_failed_spend_per_hour": "10.00"}),
    )
    .await;
    let routed =
        |task: &str, start: &str, end: &str| record(task, start, end).label("route", "summarise");
    app.ingest(json!([
        // 10:00–11:00: failed 1 GPU × 0.5 h = 5.00, preempted 2 GPUs × 0.5 h = 10.00: 15.00
        // failed, above 10.00. The completed attempt's 20.00 is no failed spend.
        routed("f", "2026-11-01T10:00:00Z", "2026-11-01T10:30:00Z").outcome("failed"),
        routed("f", "2026-11-01T10:30:00Z", "2026-11-01T11:00:00Z")
            .attempt(2)
            .gpu_count(2)
            .outcome("preempted"),
        routed("f", "2026-11-01T10:00:00Z", "2026-11-01T11:00:00Z")
            .attempt(3)
            .gpu_count(2),
        // 12:00–13:00: cancelled 1 GPU × 0.9 h = 9.00, within the cap; the unlabelled failed
        // 5.00 in the same hour is not the route's.
        routed("g", "2026-11-01T12:00:00Z", "2026-11-01T12:54:00Z").outcome("cancelled"),
        record("other", "2026-11-01T12:00:00Z", "2026-11-01T12:30:00Z").outcome("failed"),
        // 14:30–15:30 on 2 GPUs: 20.00 failed split 10.00 / 10.00 over two hours, each at
        // the cap and not above it.
        routed("h", "2026-11-01T14:30:00Z", "2026-11-01T15:30:00Z")
            .gpu_count(2)
            .outcome("failed"),
    ]))
    .await;

    let fired = alerts(&app).await;
    let storms = storms(&fired);
    assert_eq!(storms.len(), 1, "{fired:?}");
    let storm = &storms[0]["retry_storm"];
    assert_eq!(storm["trigger"], "max_failed_spend_per_hour");
    assert_eq!(storm["hour"], "2026-11-01T10:00:00Z");
    assert!(storm["task_id"].is_null());
    assert_money(&storm["cap"], "10");
    assert_money(&storm["observed"], "15");

    alerting::evaluate_current_month(&app.pool, &settings()).await;
    assert_eq!(self::storms(&alerts(&app).await).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_ingests_crossing_a_cap_fire_one_alert() {
    let app = app().await;
    put_route(
        &app,
        "summarise",
        json!({"max_attempts_per_task": 3, "max_failed_spend_per_hour": "10"}),
    )
    .await;
    let failed = |n: u32, start: &str, end: &str| {
        record("a", start, end)
            .attempt(n)
            .outcome("failed")
            .label("route", "summarise")
    };
    app.ingest(json!([
        failed(1, "2026-11-01T00:00:00Z", "2026-11-01T00:10:00Z"),
        failed(2, "2026-11-01T01:00:00Z", "2026-11-01T01:10:00Z"),
        failed(3, "2026-11-01T02:00:00Z", "2026-11-01T02:10:00Z"),
    ]))
    .await;
    assert!(storms(&alerts(&app).await).is_empty());

    // Each request holds one attempt beyond the cap and 6.00 of failed spend in 10:00–11:00:
    // each alone would fire the task's storm, and only the two together the hour's (12.00).
    let first = json!([failed(4, "2026-11-01T10:00:00Z", "2026-11-01T10:36:00Z")]);
    let second = json!([failed(5, "2026-11-01T10:24:00Z", "2026-11-01T11:00:00Z")]);
    let (a, b) = tokio::join!(
        app.post("/v1/job-records", &app.admin, first),
        app.post("/v1/job-records", &app.admin, second),
    );
    assert_eq!(a.status, StatusCode::OK, "{}", a.text());
    assert_eq!(b.status, StatusCode::OK, "{}", b.text());

    let fired = alerts(&app).await;
    let storms = storms(&fired);
    let by_task: Vec<&&Value> = storms
        .iter()
        .filter(|a| a["retry_storm"]["trigger"] == "max_attempts_per_task")
        .collect();
    let by_hour: Vec<&&Value> = storms
        .iter()
        .filter(|a| a["retry_storm"]["trigger"] == "max_failed_spend_per_hour")
        .collect();
    assert_eq!(by_task.len(), 1, "{fired:?}");
    assert_eq!(by_hour.len(), 1, "{fired:?}");
    assert_money(&by_hour[0]["retry_storm"]["observed"], "12");
    let outbox: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM alert_deliveries d JOIN alert_events e \
             ON e.project_id = d.project_id AND e.id = d.alert_id \
         WHERE e.kind = 'retry_storm'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(outbox, 2, "one delivery per alert");
}

#[tokio::test]
async fn routes_are_validated_and_only_finance_or_admin_set_them() {
    let app = app().await;
    let path = "/v1/projects/vision/routes/route/summarise";

    let bad = app
        .put(
            path,
            &app.admin,
            json!({"monthly_budget": "-5", "max_attempts_per_task": 0,
                   "max_failed_spend_per_hour": "0"}),
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        bad.pointers(),
        vec![
            "/monthly_budget",
            "/max_attempts_per_task",
            "/max_failed_spend_per_hour"
        ]
    );
    let not_money = app
        .put(path, &app.admin, json!({"monthly_budget": "lots"}))
        .await;
    not_money.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(not_money.pointers(), vec!["/monthly_budget"]);
    let nothing = app.put(path, &app.admin, json!({})).await;
    nothing.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(nothing.pointers(), vec![""]);
    let unknown = app.put(path, &app.admin, json!({"budget": "5"})).await;
    unknown.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let bad_label = app
        .put(
            "/v1/projects/vision/routes/bad%20key/summarise",
            &app.admin,
            json!({"monthly_budget": "5"}),
        )
        .await;
    bad_label.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad_label.pointers(), vec!["path:label_key"]);

    let reader = app.token("reader", &["vision"]).await;
    let finance = app.token("finance", &[]).await;
    let refused = app.put(path, &reader, json!({"monthly_budget": "5"})).await;
    refused.problem(StatusCode::FORBIDDEN);
    let set = app
        .put(
            path,
            &finance,
            json!({"monthly_budget": "200.00", "max_attempts_per_task": 3}),
        )
        .await;
    assert_eq!(set.status, StatusCode::OK, "{}", set.text());
    let route = set.json();
    assert_money(&route["monthly_budget"], "200");
    assert_eq!(route["max_attempts_per_task"], 3);
    assert!(route["max_failed_spend_per_hour"].is_null());
    assert_eq!(route["currency"], "USD");

    let listed = app.get("/v1/projects/vision/routes", &reader).await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text());
    assert_eq!(listed.json().as_array().unwrap().len(), 1);
    assert_eq!(
        app.get(path, &reader).await.json()["label_value"],
        "summarise"
    );
    let burn = app
        .get(&format!("{path}/burn?month=2026-11"), &reader)
        .await;
    assert_eq!(burn.status, StatusCode::OK, "{}", burn.text());
    app.delete(path, &reader)
        .await
        .problem(StatusCode::FORBIDDEN);

    // A PUT replaces: what it leaves out is cleared.
    let replaced = put_route(&app, "summarise", json!({"max_failed_spend_per_hour": "7"})).await;
    assert!(replaced["monthly_budget"].is_null());
    assert!(replaced["max_attempts_per_task"].is_null());

    app.put(
        "/v1/projects/nope/routes/route/summarise",
        &app.admin,
        json!({"monthly_budget": "5"}),
    )
    .await
    .problem(StatusCode::NOT_FOUND);
    app.get("/v1/projects/nope/routes", &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);

    let deleted = app.delete(path, &finance).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    app.get(path, &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
    app.delete(path, &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
}
