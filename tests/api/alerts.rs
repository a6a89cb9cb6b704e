//! Alert delivery: the outbox, signatures, retries, restarts and replicas.

use std::time::Duration;

use axum::http::StatusCode;
use chrono::{TimeZone, Utc};
use rust_decimal::Decimal;
use serde_json::json;

use taskledger::domain::burn;
use taskledger::domain::values::Month;
use taskledger::workers::webhooks::{DeliveryPolicy, SIGNATURE_HEADER, Webhooks, sign};

use crate::common::{Receiver, TestApp};

const SECRET: &str = "test-webhook-secret";

pub(crate) fn quick_policy() -> DeliveryPolicy {
    DeliveryPolicy {
        first_retry: Duration::from_millis(50),
        max_retry: Duration::from_millis(200),
        give_up_after: Duration::from_secs(60),
        request_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(20),
    }
}

async fn project_with_webhook(app: &TestApp, url: &str) -> taskledger::store::projects::ProjectRow {
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD",
                   "default_monthly_budget": "1000", "webhook_url": url}),
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    taskledger::store::projects::get(&app.pool, "vision")
        .await
        .unwrap()
        .unwrap()
}

/// Fires the alerts a spend reaches in November 2026, as of the 2nd (no forecast yet).
pub(crate) async fn fire(
    app: &TestApp,
    project: &taskledger::store::projects::ProjectRow,
    spend: i64,
) -> usize {
    let month = Month::parse("2026-11").unwrap();
    let as_of = Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap();
    let b = burn::burn(
        Decimal::from(spend),
        Some(Decimal::from(1000)),
        month.first_day(),
        as_of,
        chrono_tz::UTC,
    );
    let reached = burn::alerts_reached(&b, &project.alert_thresholds);
    taskledger::ledger::alerting::fire_reached(&app.pool, project, month, &b, &reached, as_of)
        .await
        .unwrap()
        .len()
}

/// The project's only alert, once its delivery is finished.
async fn delivered_alert(app: &TestApp) -> serde_json::Value {
    for _ in 0..200 {
        let alert = app
            .get("/v1/alerts?project=vision", &app.admin)
            .await
            .json()["items"][0]
            .clone();
        if alert["delivery_state"] != "pending" {
            return alert;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the alert was not delivered in time");
}

#[tokio::test]
async fn an_alert_fires_once_and_is_delivered_signed_with_a_stable_id() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start(0).await;
    let project = project_with_webhook(&app, &receiver.url).await;
    assert_eq!(fire(&app, &project, 600).await, 1, "50% fired");
    assert_eq!(fire(&app, &project, 650).await, 0, "50% fires once");
    assert_eq!(fire(&app, &project, 850).await, 1, "80% fired");

    let webhooks = Webhooks::new(app.pool.clone(), SECRET.to_owned(), quick_policy()).unwrap();
    assert_eq!(webhooks.deliver_due().await.unwrap(), 2);
    assert_eq!(
        webhooks.deliver_due().await.unwrap(),
        0,
        "nothing is sent twice"
    );

    let raw = receiver.raw();
    assert_eq!(raw.len(), 2);
    for (headers, body) in &raw {
        assert_eq!(
            headers[SIGNATURE_HEADER].to_str().unwrap(),
            sign(SECRET, body)
        );
        assert_eq!(headers["content-type"], "application/json");
    }
    let bodies = receiver.bodies();
    let thresholds: Vec<i64> = bodies
        .iter()
        .map(|(_, b)| b["threshold"].as_i64().unwrap())
        .collect();
    assert_eq!(
        thresholds
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>(),
        [50, 80].into()
    );
    let fifty = &bodies.iter().find(|(_, b)| b["threshold"] == 50).unwrap().1;
    assert_eq!(fifty["spend"], "600");
    assert_eq!(fifty["budget"], "1000");
    assert_eq!(fifty["burn_pct"], "60");
    assert_eq!(fifty["kind"], "actual");
    assert_eq!(fifty["month"], "2026-11");

    let listed = app
        .get("/v1/alerts?project=vision&month=2026-11", &app.admin)
        .await;
    assert_eq!(listed.status, StatusCode::OK, "{}", listed.text());
    let items = listed.json()["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2);
    for item in &items {
        assert_eq!(item["delivery_state"], "delivered");
        assert_eq!(item["deliveries"].as_array().unwrap().len(), 1);
        assert_eq!(item["deliveries"][0]["status_code"], 200);
        let id = item["id"].as_str().unwrap();
        assert!(
            bodies.iter().any(|(_, b)| b["id"] == id),
            "the listed id is the delivered id"
        );
    }
}

#[tokio::test]
async fn a_receiver_that_is_down_for_a_while_still_gets_the_alert() {
    let app = TestApp::spawn().await;
    let address = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap()
    };
    let project = project_with_webhook(&app, &format!("http://{address}/hook")).await;
    fire(&app, &project, 500).await;
    let webhooks = Webhooks::new(app.pool.clone(), SECRET.to_owned(), quick_policy()).unwrap();
    assert_eq!(
        webhooks.deliver_due().await.unwrap(),
        1,
        "one failed attempt while down"
    );

    let receiver = Receiver::start_on(address, 2).await;
    let worker = tokio::spawn(async move {
        webhooks
            .run(tokio::time::sleep(Duration::from_secs(10)))
            .await;
    });
    let alert = delivered_alert(&app).await;
    worker.abort();
    assert_eq!(alert["delivery_state"], "delivered");
    let attempts = alert["deliveries"].as_array().unwrap();
    assert_eq!(attempts.len(), 4, "refused, 500, 500, 200: {attempts:?}");
    assert_eq!(attempts[0]["status_code"], serde_json::Value::Null);
    assert!(attempts[0]["error"].as_str().unwrap().contains("connect"));
    assert_eq!(attempts[1]["status_code"], 500);
    assert_eq!(attempts[3]["status_code"], 200);
    let ids: std::collections::BTreeSet<String> = receiver
        .bodies()
        .iter()
        .map(|(_, b)| b["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 1, "every retry carries the same id");
}

#[tokio::test]
async fn a_restart_between_firing_and_delivery_loses_nothing() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start(0).await;
    let project = project_with_webhook(&app, &receiver.url).await;
    fire(&app, &project, 1200).await;
    // The process that fired is gone; a new one (another pool, another worker) delivers.
    let other_pool = taskledger::db::connect(&app.database_url, 2).await.unwrap();
    let webhooks = Webhooks::new(other_pool, SECRET.to_owned(), quick_policy()).unwrap();
    assert_eq!(webhooks.deliver_due().await.unwrap(), 3);
    assert_eq!(receiver.raw().len(), 3);
}

#[tokio::test]
async fn two_replicas_never_send_the_same_alert() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start(0).await;
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD", "default_monthly_budget": "1000",
                   "webhook_url": receiver.url, "alert_thresholds": [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]}),
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED);
    let project = taskledger::store::projects::get(&app.pool, "vision")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fire(&app, &project, 1000).await, 10);
    let replicas: Vec<_> = (0..2)
        .map(|_| Webhooks::new(app.pool.clone(), SECRET.to_owned(), quick_policy()).unwrap())
        .collect();
    let (a, b) = tokio::join!(replicas[0].deliver_due(), replicas[1].deliver_due());
    assert_eq!(a.unwrap() + b.unwrap(), 10);
    let ids: Vec<String> = receiver
        .bodies()
        .iter()
        .map(|(_, b)| b["id"].as_str().unwrap().to_owned())
        .collect();
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), 10);
    assert_eq!(unique.len(), 10);
}

#[tokio::test]
async fn delivery_is_given_up_after_a_bounded_time_and_recorded() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start(usize::MAX).await;
    let project = project_with_webhook(&app, &receiver.url).await;
    fire(&app, &project, 500).await;
    let policy = DeliveryPolicy {
        give_up_after: Duration::from_millis(150),
        ..quick_policy()
    };
    let webhooks = Webhooks::new(app.pool.clone(), SECRET.to_owned(), policy).unwrap();
    let worker = tokio::spawn(async move {
        webhooks
            .run(tokio::time::sleep(Duration::from_secs(5)))
            .await;
    });
    let alert = delivered_alert(&app).await;
    worker.abort();
    assert_eq!(alert["delivery_state"], "gave_up");
    assert!(!receiver.raw().is_empty());
}

#[tokio::test]
async fn alerts_are_listed_only_to_those_who_may_read_the_project() {
    let app = TestApp::spawn().await;
    let receiver = Receiver::start(0).await;
    let project = project_with_webhook(&app, &receiver.url).await;
    app.create_project("other", "USD").await;
    fire(&app, &project, 900).await;
    let reader = app.token("reader", &["vision"]).await;
    let outsider = app.token("reader", &["other"]).await;
    assert_eq!(
        app.get("/v1/alerts", &reader).await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        app.get("/v1/alerts", &outsider).await.json()["items"],
        json!([])
    );
    app.get("/v1/alerts?project=vision", &outsider)
        .await
        .problem(StatusCode::NOT_FOUND);
    let bad = app.get("/v1/alerts?month=2026-13", &reader).await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.pointers(), vec!["query:month"]);
}

#[tokio::test]
async fn a_receiver_that_hangs_up_leaves_no_part_of_the_url_for_readers() {
    // Chat webhooks carry their secret in the path and query. A receiver that accepts the
    // connection and closes it makes the HTTP client fail with the URL in its message.
    let app = TestApp::spawn().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let hang_up = tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            drop(stream);
        }
    });
    let url = format!("http://{address}/services/T0SECRET/B1SECRET/xyzSECRET?token=SECRET");
    let project = project_with_webhook(&app, &url).await;
    fire(&app, &project, 500).await;
    let webhooks = Webhooks::new(app.pool.clone(), SECRET.to_owned(), quick_policy()).unwrap();
    assert_eq!(webhooks.deliver_due().await.unwrap(), 1);
    hang_up.abort();

    let stored: Vec<Option<String>> =
        sqlx::query_scalar("SELECT error FROM alert_delivery_attempts")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let error = stored[0].clone().expect("the attempt failed");
    assert!(error.starts_with("request failed"), "{error}");
    assert!(!error.contains("SECRET"), "stored: {error}");

    // A message stored before, with the URL in it, is masked when shown to non-admins too.
    sqlx::query("UPDATE alert_delivery_attempts SET error = $1")
        .bind(format!("error sending request for url ({url}): closed"))
        .execute(&app.pool)
        .await
        .unwrap();
    let reader = app.token("reader", &["vision"]).await;
    let finance = app.token("finance", &[]).await;
    for token in [&reader, &finance] {
        let listed = app.get("/v1/alerts?project=vision", token).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.text());
        let text = listed.text();
        assert!(!text.contains("SECRET"), "{text}");
        let alert = &listed.json()["items"][0];
        assert_eq!(
            alert["deliveries"][0]["error"],
            format!(
                "error sending request for url (http://{}/…): closed",
                address.ip()
            )
        );
        assert_eq!(alert["webhook_url"], format!("http://{}/…", address.ip()));
    }
    let admin = app.get("/v1/alerts?project=vision", &app.admin).await;
    assert_eq!(admin.json()["items"][0]["webhook_url"], url);
}
