//! Idle-GPU alerts (COST_MODEL.md §8): a finished record that held at least the project's
//! minimum GPU-hours with SM activity (or, without it, busy share) under the project's
//! threshold fires one signed `idle_gpu` alert per task, carrying its rated cost.

use std::collections::BTreeSet;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::{Value, json};

use taskledger::workers::webhooks::{DeliveryPolicy, SIGNATURE_HEADER, Webhooks, sign};

use crate::common::{Receiver, TestApp};
use crate::fixtures::{contract, record};

const SECRET: &str = "test-webhook-secret";

fn webhooks(app: &TestApp) -> Webhooks {
    let policy = DeliveryPolicy {
        first_retry: Duration::from_millis(50),
        max_retry: Duration::from_millis(200),
        give_up_after: Duration::from_secs(60),
        request_timeout: Duration::from_secs(5),
        poll_interval: Duration::from_millis(20),
    };
    Webhooks::new(app.pool.clone(), SECRET.to_owned(), policy).unwrap()
}

/// Works the outbox until nothing is due and returns the ids of every alert the receiver has
/// got, counting an alert sent twice (a retry after a lost answer) once, as receivers do.
async fn deliver(app: &TestApp, receiver: &Receiver) -> BTreeSet<String> {
    let webhooks = webhooks(app);
    for _ in 0..200 {
        webhooks.deliver_due().await.unwrap();
        let pending: i64 =
            sqlx::query_scalar("SELECT count(*) FROM alert_deliveries WHERE state = 'pending'")
                .fetch_one(&app.pool)
                .await
                .unwrap();
        if pending == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    receiver
        .bodies()
        .iter()
        .map(|(_, body)| body["id"].as_str().unwrap().to_owned())
        .collect()
}

/// Project `vision` (USD, no budget, so no budget alert can fire) with `settings` and a
/// webhook; H100s at 2.37 per GPU-hour for everyone, and at 1.93 for `vision` from
/// 15 November 2026.
async fn app_with_project(webhook_url: &str, settings: Value) -> TestApp {
    let app = TestApp::spawn().await;
    let mut body = json!({"id": "vision", "name": "Vision", "currency": "USD",
                          "webhook_url": webhook_url});
    body.as_object_mut()
        .unwrap()
        .extend(settings.as_object().unwrap().clone());
    let response = app.post("/v1/projects", &app.admin, body).await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    contract("H100", "on_demand", "2.37").create(&app).await;
    contract("H100", "on_demand", "1.93")
        .named("vision H100")
        .project("vision")
        .valid_from("2026-11-15T00:00:00Z")
        .create(&app)
        .await;
    app
}

/// The project's alerts as `GET /v1/alerts` lists them, newest first.
async fn alerts(app: &TestApp) -> Vec<Value> {
    let response = app.get("/v1/alerts?project=vision", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()["items"].as_array().unwrap().clone()
}

/// The task ids of the project's idle-GPU alerts, in task id order.
async fn idle_tasks(app: &TestApp) -> Vec<String> {
    let mut tasks: Vec<String> = alerts(app)
        .await
        .iter()
        .map(|alert| {
            assert_eq!(alert["kind"], "idle_gpu", "{alert}");
            alert["idle_gpu"]["task_id"].as_str().unwrap().to_owned()
        })
        .collect();
    // Alerts fired in one transaction share their time, so their listed order is not theirs.
    tasks.sort();
    tasks
}

#[tokio::test]
async fn an_idle_record_fires_one_signed_alert_carrying_its_cost_once_per_task() {
    let receiver = Receiver::start(0).await;
    let app = app_with_project(&receiver.url, json!({})).await;
    // 4 GPUs from 11-14 22:00 to 11-15 02:00: 8 GPU-hours at 2.37 before the 15th, 8 at
    // the project's 1.93 after, over four hourly segments: 18.96 + 15.44 = 34.40.
    app.ingest(json!([record(
        "notebook",
        "2026-11-14T22:00:00Z",
        "2026-11-15T02:00:00Z"
    )
    .gpu_count(4)
    .with("gpu_util", "0.9")
    .with("sm_active", "0.03")]))
        .await;

    let delivered = deliver(&app, &receiver).await;
    assert_eq!(delivered.len(), 1);
    let raw = receiver.raw();
    for (headers, body) in &raw {
        assert_eq!(
            headers[SIGNATURE_HEADER].to_str().unwrap(),
            sign(SECRET, body)
        );
    }
    let body = &raw[0].1;
    let sent: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(sent["kind"], "idle_gpu");
    assert_eq!(sent["project"], "vision");
    assert_eq!(sent["month"], "2026-11");
    assert_eq!(sent["currency"], "USD");
    assert_eq!(sent["threshold"], Value::Null, "not a budget threshold");
    assert_eq!(sent["spend"], Value::Null);
    assert_eq!(
        sent["idle_gpu"],
        json!({
            "task_id": "notebook", "attempt": 1, "gpu_model": "H100", "gpu_count": "4",
            "mig_profile": null, "gpu_seconds_held": "57600", "measure": "sm_active",
            "activity": "0.03", "threshold": "0.05", "min_gpu_hours": "1", "cost": "34.40"
        })
    );

    // A second idle attempt of the same task, and a third in one batch with a fourth.
    app.ingest(json!([record(
        "notebook",
        "2026-11-16T00:00:00Z",
        "2026-11-16T05:00:00Z"
    )
    .attempt(2)
    .with("sm_active", "0"),]))
        .await;
    app.ingest(json!([
        record("notebook", "2026-11-17T00:00:00Z", "2026-11-17T05:00:00Z")
            .attempt(3)
            .gpu_seconds_busy(0),
        record("notebook", "2026-11-18T00:00:00Z", "2026-11-18T05:00:00Z")
            .attempt(4)
            .with("sm_active", "0.01"),
    ]))
    .await;
    assert_eq!(
        deliver(&app, &receiver).await,
        delivered,
        "the task's later idle attempts fire nothing"
    );

    let listed = alerts(&app).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0]["id"], sent["id"],
        "the listed id is the delivered one"
    );
    assert_eq!(listed[0]["delivery_state"], "delivered");
    assert_eq!(listed[0]["idle_gpu"], sent["idle_gpu"]);
    let month = app
        .get("/v1/alerts?project=vision&month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(month["items"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn busy_records_short_records_and_records_without_evidence_fire_none() {
    let receiver = Receiver::start(0).await;
    let app = app_with_project(&receiver.url, json!({})).await;
    app.ingest(json!([
        // Busy by SM activity, though its busy share alone would look idle: SM activity wins.
        record("busy", "2026-11-02T00:00:00Z", "2026-11-02T04:00:00Z")
            .gpu_seconds_busy(10)
            .with("sm_active", "0.6"),
        // Busy share 0.06, at or over the threshold.
        record("busy-share", "2026-11-02T00:00:00Z", "2026-11-02T02:00:00Z").gpu_seconds_busy(432),
        // Exactly at the threshold is not under it.
        record(
            "at-threshold",
            "2026-11-02T00:00:00Z",
            "2026-11-02T02:00:00Z"
        )
        .with("sm_active", "0.05"),
        // Idle, but 3599 GPU-seconds held: under the one GPU-hour minimum.
        record("short", "2026-11-02T00:00:00Z", "2026-11-02T00:59:59Z").with("sm_active", "0"),
        // Half a GPU for 90 minutes: 2700 GPU-seconds held.
        record("shared-gpu", "2026-11-02T00:00:00Z", "2026-11-02T01:30:00Z")
            .gpu_count("0.5")
            .with("sm_active", "0"),
        // Neither SM activity nor busy time: no evidence, whatever GPU-Util says.
        record(
            "no-evidence",
            "2026-11-02T00:00:00Z",
            "2026-11-02T08:00:00Z"
        )
        .with("gpu_util", "0"),
        // Idle by its busy share alone (100 of 7200 GPU-seconds): this one fires.
        record(
            "idle-by-busy",
            "2026-11-02T00:00:00Z",
            "2026-11-02T02:00:00Z"
        )
        .gpu_seconds_busy(100),
    ]))
    .await;
    assert_eq!(idle_tasks(&app).await, ["idle-by-busy"]);
    let alert = &alerts(&app).await[0]["idle_gpu"];
    assert_eq!(alert["measure"], "busy_share");
    assert_eq!(alert["activity"], "0.0138888888888888888888888889");
    assert_eq!(alert["cost"], "4.74", "2 GPU-hours at 2.37");
    assert_eq!(deliver(&app, &receiver).await.len(), 1);
}

#[tokio::test]
async fn the_projects_threshold_and_minimum_decide_and_null_turns_alerts_off() {
    let receiver = Receiver::start(0).await;
    let app = app_with_project(&receiver.url, json!({})).await;
    let project = app.get("/v1/projects/vision", &app.admin).await.json();
    assert_eq!(project["idle_gpu_threshold"], "0.05", "the default");
    assert_eq!(project["idle_gpu_min_gpu_hours"], "1", "the default");

    let low = |task: &str, day: u32| {
        record(
            task,
            &format!("2026-11-{day:02}T00:00:00Z"),
            &format!("2026-11-{day:02}T02:00:00Z"),
        )
        .with("sm_active", "0.08")
    };
    app.ingest(json!([low("before", 2)])).await;
    assert_eq!(
        idle_tasks(&app).await,
        Vec::<String>::new(),
        "0.08 is busy under 0.05"
    );

    let changed = app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"idle_gpu_threshold": "0.10", "idle_gpu_min_gpu_hours": 0.5}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    assert_eq!(changed.json()["idle_gpu_threshold"], "0.1");
    assert_eq!(changed.json()["idle_gpu_min_gpu_hours"], "0.5");
    app.ingest(json!([
        low("after", 3),
        // 40 minutes: under the default hour, over the project's half hour.
        record("short", "2026-11-04T00:00:00Z", "2026-11-04T00:40:00Z").with("sm_active", "0"),
    ]))
    .await;
    assert_eq!(idle_tasks(&app).await, ["after", "short"]);
    let after = alerts(&app).await;
    let after = after
        .iter()
        .find(|a| a["idle_gpu"]["task_id"] == "after")
        .unwrap();
    assert_eq!(after["idle_gpu"]["threshold"], "0.1");
    assert_eq!(after["idle_gpu"]["min_gpu_hours"], "0.5");
    assert_eq!(after["idle_gpu"]["cost"], "4.74");

    let off = app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"idle_gpu_threshold": null}),
        )
        .await;
    assert_eq!(off.status, StatusCode::OK, "{}", off.text());
    assert_eq!(off.json()["idle_gpu_threshold"], Value::Null);
    app.ingest(json!([record(
        "off",
        "2026-11-05T00:00:00Z",
        "2026-11-05T05:00:00Z"
    )
    .with("sm_active", "0")]))
        .await;
    assert_eq!(
        idle_tasks(&app).await,
        ["after", "short"],
        "off fires nothing"
    );
    assert_eq!(deliver(&app, &receiver).await.len(), 2);
}

#[tokio::test]
async fn idle_gpu_settings_are_validated_with_the_field_named() {
    let app = TestApp::spawn().await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "quiet", "name": "Quiet", "currency": "EUR", "idle_gpu_threshold": null}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    assert_eq!(
        created.json()["idle_gpu_threshold"],
        Value::Null,
        "created off"
    );

    let bad = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "bad", "name": "Bad", "currency": "EUR",
                   "idle_gpu_threshold": "1.5", "idle_gpu_min_gpu_hours": "-1"}),
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        bad.pointers(),
        ["/idle_gpu_threshold", "/idle_gpu_min_gpu_hours"]
    );
    for body in [
        json!({"idle_gpu_threshold": 0}),
        json!({"idle_gpu_threshold": "-0.01"}),
        json!({"idle_gpu_min_gpu_hours": 0}),
    ] {
        let response = app
            .patch("/v1/projects/quiet", &app.admin, body.clone())
            .await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        let field = body.as_object().unwrap().keys().next().unwrap().clone();
        assert_eq!(response.pointers(), [format!("/{field}")], "{body}");
    }
    let unchanged = app.get("/v1/projects/quiet", &app.admin).await.json();
    assert_eq!(unchanged["idle_gpu_threshold"], Value::Null);
    assert_eq!(unchanged["idle_gpu_min_gpu_hours"], "1");
}

#[tokio::test]
async fn a_correction_that_makes_a_record_idle_fires_its_tasks_alert() {
    let receiver = Receiver::start(0).await;
    let app = app_with_project(&receiver.url, json!({})).await;
    let busy = record("train", "2026-11-20T00:00:00Z", "2026-11-20T03:00:00Z")
        .gpu_count(2)
        .with("sm_active", "0.7");
    app.ingest(json!([busy.clone()])).await;
    assert_eq!(idle_tasks(&app).await, Vec::<String>::new());

    let path = "/v1/projects/vision/job-records/train/1";
    let idle = busy.with("sm_active", "0.01").correction();
    let response = app.put(path, &app.admin, idle.clone()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(idle_tasks(&app).await, ["train"]);
    // 6 GPU-hours at the project's 1.93.
    assert_eq!(alerts(&app).await[0]["idle_gpu"]["cost"], "11.58");

    let again = idle.clone();
    let mut idler = idle;
    idler["sm_active"] = json!("0");
    for body in [again, idler] {
        let response = app.put(path, &app.admin, body).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    }
    assert_eq!(idle_tasks(&app).await, ["train"], "once per task");
    assert_eq!(deliver(&app, &receiver).await.len(), 1);
}
