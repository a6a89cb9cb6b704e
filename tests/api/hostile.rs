//! Hostile input and operator mistakes: values PostgreSQL cannot store (NUL bytes), secrets
//! in what readers see, and bootstrap tokens that must not come back.

use axum::http::StatusCode;
use base64::Engine;
use serde_json::{Value, json};

use taskledger::ledger::tokens::Bootstrap;

use crate::common::TestApp;
use crate::fixtures::record;

#[tokio::test]
async fn a_nul_byte_in_a_path_is_no_such_resource() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    for path in [
        "/v1/projects/vis%00ion",
        "/v1/projects/vision/job-records/t%00/1",
        "/v1/projects/vision/cost%00",
    ] {
        let response = app.get(path, &app.admin).await;
        response.problem(StatusCode::NOT_FOUND);
    }
}

#[tokio::test]
async fn a_nul_byte_in_a_query_value_is_named() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let response = app
        .get("/v1/projects/vision/job-records?task_id=a%00b", &app.admin)
        .await;
    let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["pointer"], "query:task_id");

    let response = app
        .get(
            "/v1/projects/vision/cost?month=2026-11&group_by=label:te%00am",
            &app.admin,
        )
        .await;
    let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["pointer"], "query:group_by");
}

#[tokio::test]
async fn a_nul_byte_in_a_cursor_is_not_a_cursor() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let project_cursor = engine.encode(r#""vis\u0000ion""#);
    let records_cursor = engine.encode(r#"["2026-11-01T00:00:00Z","t\u0000",1]"#);
    for path in [
        format!("/v1/projects?cursor={project_cursor}"),
        format!("/v1/projects/vision/job-records?cursor={records_cursor}"),
    ] {
        let response = app.get(&path, &app.admin).await;
        let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem["errors"][0]["pointer"], "query:cursor", "{path}");
    }
}

#[tokio::test]
async fn a_nul_byte_in_a_label_value_is_refused_with_its_pointer() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let posted = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!(
                [record("t1", "2026-11-20T10:00:00Z", "2026-11-20T11:00:00Z")
                    .label("team", "a\u{0}b")]
            ),
        )
        .await;
    let problem = posted.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["pointer"], "/0/labels/team");
}

const SLACK_HOOK: &str = "https://hooks.slack.com/services/T0001/B0001/s3cr3tT0k3n";

#[tokio::test]
async fn a_webhook_url_with_a_control_character_is_refused_not_rewritten() {
    let app = TestApp::spawn().await;
    for bad in [
        "https://hooks.example.com/a\u{0}b",
        "https://hooks.example.com/a\tb",
    ] {
        let response = app
            .post(
                "/v1/projects",
                &app.admin,
                json!({"id": "vision", "name": "Vision", "currency": "USD", "webhook_url": bad}),
            )
            .await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), ["/webhook_url"], "{bad:?}");
    }
    app.create_project("vision", "USD").await;
    let response = app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"webhook_url": "https://hooks.example.com/a\u{0}b"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["/webhook_url"]);
    let project = app.get("/v1/projects/vision", &app.admin).await.json();
    assert_eq!(project["webhook_url"], serde_json::Value::Null);
}

#[tokio::test]
async fn only_admins_see_a_webhook_url_whole() {
    let app = TestApp::spawn().await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD",
                   "default_monthly_budget": "100", "webhook_url": SLACK_HOOK}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    assert_eq!(created.json()["webhook_url"], SLACK_HOOK);

    let reader = app.token("reader", &["vision"]).await;
    let finance = app.token("finance", &[]).await;
    for token in [&reader, &finance] {
        let project = app.get("/v1/projects/vision", token).await.json();
        assert_eq!(project["webhook_url"], "https://hooks.slack.com/…");
        let listed = app.get("/v1/projects", token).await.json();
        assert_eq!(
            listed["items"][0]["webhook_url"],
            "https://hooks.slack.com/…"
        );
    }
    let project = app.get("/v1/projects/vision", &app.admin).await.json();
    assert_eq!(project["webhook_url"], SLACK_HOOK);

    // Spend past 50 % of the budget fires an alert bound for the webhook.
    crate::fixtures::contract("H100", "on_demand", "80")
        .create(&app)
        .await;
    app.ingest(json!([record(
        "t1",
        "2026-11-20T10:00:00Z",
        "2026-11-20T11:00:00Z"
    )]))
    .await;
    let alerts = app.get("/v1/alerts?project=vision", &reader).await.json();
    let alert = &alerts["items"][0];
    assert!(alert.is_object(), "an alert fired: {alerts}");
    assert_eq!(alert["webhook_url"], "https://hooks.slack.com/…");
    let alerts = app
        .get("/v1/alerts?project=vision", &app.admin)
        .await
        .json();
    assert_eq!(alerts["items"][0]["webhook_url"], SLACK_HOOK);
}

async fn bootstrap(app: &TestApp, secret: &str) -> Bootstrap {
    taskledger::ledger::tokens::bootstrap_admin(&app.pool, Some(secret))
        .await
        .unwrap()
}

async fn admits(app: &TestApp, secret: &str) -> bool {
    app.get("/v1/tokens", secret).await.status == StatusCode::OK
}

#[tokio::test]
async fn a_revoked_bootstrap_token_stays_revoked_across_restarts() {
    let app = TestApp::spawn().await;
    assert!(matches!(
        bootstrap(&app, "first-secret").await,
        Bootstrap::Configured
    ));
    assert!(admits(&app, "first-secret").await);
    let tokens = app.get("/v1/tokens", &app.admin).await.json();
    let id = tokens["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "bootstrap")
        .expect("the bootstrap token is listed")["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let revoked = app.delete(&format!("/v1/tokens/{id}"), &app.admin).await;
    assert_eq!(revoked.status, StatusCode::NO_CONTENT);

    // A restart with the same secret does not bring it back.
    assert!(matches!(
        bootstrap(&app, "first-secret").await,
        Bootstrap::ConfiguredButRevoked
    ));
    assert!(!admits(&app, "first-secret").await);
    // A new secret gives a new admin token.
    assert!(matches!(
        bootstrap(&app, "second-secret").await,
        Bootstrap::Configured
    ));
    assert!(admits(&app, "second-secret").await);
    assert!(!admits(&app, "first-secret").await);
}

#[tokio::test]
async fn a_new_bootstrap_secret_replaces_the_old_one() {
    let app = TestApp::spawn().await;
    bootstrap(&app, "old-secret").await;
    assert!(admits(&app, "old-secret").await);
    bootstrap(&app, "new-secret").await;
    assert!(admits(&app, "new-secret").await);
    assert!(
        !admits(&app, "old-secret").await,
        "the old secret stops working"
    );
    // Starting again with the new secret changes nothing.
    bootstrap(&app, "new-secret").await;
    assert!(admits(&app, "new-secret").await);
    assert!(
        admits(&app, &app.admin).await,
        "other admin tokens are untouched"
    );
}

#[tokio::test]
async fn loose_numbers_and_non_currencies_are_refused() {
    let app = TestApp::spawn().await;
    let project = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "XXX"}),
        )
        .await;
    let problem = project.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["pointer"], "/currency");

    app.create_project("vision", "USD").await;
    for count in ["1_000", "+1", ".5"] {
        let posted = app
            .post(
                "/v1/job-records",
                &app.admin,
                json!([
                    record("t1", "2026-11-20T10:00:00Z", "2026-11-20T11:00:00Z").gpu_count(count)
                ]),
            )
            .await;
        let problem = posted.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem["errors"][0]["pointer"], "/0/gpu_count", "{count}");
    }
}

#[tokio::test]
async fn a_database_that_refuses_is_reported_at_once_without_its_password() {
    // Nothing listens on port 1 of the loopback address.
    let url = "postgres://taskledger@127.0.0.1:1/taskledger?password=hunter2";
    let started = std::time::Instant::now();
    let error = taskledger::db::connect(url, 1)
        .await
        .expect_err("nothing listens there");
    let message = format!("{error:#}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(message.contains("Connection refused"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
}

#[tokio::test]
async fn pages_outside_the_api_answer_errors_as_problems() {
    let app = TestApp::spawn().await;
    let missing = app
        .call(axum::http::Method::GET, "/docs/no-such-page", None, None)
        .await;
    missing.problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_key_repeated_in_a_job_record_is_refused_with_its_pointer() {
    use axum::body::Body;
    use axum::http::{Request, header};

    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let one = serde_json::to_string(&serde_json::Value::from(record(
        "t1",
        "2026-11-20T10:00:00Z",
        "2026-11-20T11:00:00Z",
    )))
    .unwrap();
    let repeated = one.replacen('{', r#"{"gpu_count": 64, "#, 1);
    for (content_type, body, pointer) in [
        (
            "application/json",
            format!("[{one}, {repeated}]"),
            "/1/gpu_count",
        ),
        (
            "application/x-ndjson",
            format!("{one}\n{repeated}\n"),
            "/1/gpu_count",
        ),
    ] {
        let request = Request::post("/v1/job-records")
            .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .unwrap();
        let problem = app
            .send(request)
            .await
            .problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{content_type}");
    }
    let stored = app.get("/v1/projects/vision/job-records", &app.admin).await;
    assert_eq!(stored.json()["items"], json!([]), "nothing was written");
}

#[tokio::test]
async fn a_database_outage_answers_503_soon_with_retry_after() {
    use axum::body::Body;
    use axum::http::{Request, header};
    use tower::ServiceExt;

    // A pool whose server is down: every connection attempt is refused.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(taskledger::db::ACQUIRE_TIMEOUT)
        .connect_lazy("postgres://taskledger@127.0.0.1:1/taskledger")
        .unwrap();
    let router = taskledger::http::app(taskledger::http::state::AppState::new(
        pool,
        Default::default(),
    ));
    for (path, patience) in [("/readyz", 2), ("/v1/projects", 5)] {
        let started = std::time::Instant::now();
        let response = router
            .clone()
            .oneshot(
                Request::get(path)
                    .header(header::AUTHORIZATION, "Bearer some-token")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let waited = started.elapsed();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE, "{path}");
        assert!(
            response.headers().contains_key(header::RETRY_AFTER),
            "{path}"
        );
        assert_eq!(
            response.headers()[header::CONTENT_TYPE],
            "application/problem+json"
        );
        assert!(
            waited < std::time::Duration::from_secs(patience),
            "{path} took {waited:?}"
        );
    }
}

#[tokio::test]
async fn a_record_spanning_a_century_is_refused_at_once() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let started = std::time::Instant::now();
    let posted = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([record("t1", "1900-01-01T00:00:00Z", "2026-11-01T00:00:00Z")]),
        )
        .await;
    let waited = started.elapsed();
    let problem = posted.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let pointers: Vec<&str> = problem["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["pointer"].as_str().unwrap())
        .collect();
    assert_eq!(pointers, ["/0/started_at", "/0/ended_at"], "{problem}");
    assert!(
        waited < std::time::Duration::from_secs(1),
        "took {waited:?}"
    );

    // The default limit is 31 days: a record of 31 days is stored, one of 32 is not.
    let month_long = record("t2", "2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z");
    app.ingest(json!([month_long])).await;
    let too_long = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([record("t3", "2026-09-30T00:00:00Z", "2026-11-01T00:00:00Z")]),
        )
        .await;
    let problem = too_long.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem["errors"][0]["pointer"], "/0/ended_at");
}

#[tokio::test]
async fn a_batch_of_long_records_is_rated_in_bounded_calls_to_the_cent() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    crate::fixtures::contract("H100", "on_demand", "1.00")
        .create(&app)
        .await;
    // 100 records of 744 hours: more segments than one rating call makes.
    let records: Vec<serde_json::Value> = (0..100)
        .map(|i| {
            record(
                &format!("long-{i:03}"),
                "2026-10-01T00:00:00Z",
                "2026-11-01T00:00:00Z",
            )
            .into()
        })
        .collect();
    app.ingest(records).await;
    let october = crate::common::cost(&app, "/v1/projects/vision/cost?month=2026-10").await;
    crate::common::assert_money(&october["total"], "74400");
    crate::common::assert_money(&october["gpu_seconds_held"], "267840000");
    // They end at November's first instant, where they complete.
    let november = crate::common::cost(&app, "/v1/projects/vision/cost?month=2026-11").await;
    assert_eq!(november["tasks_completed"], 100);
}

/// A batch within the record and byte limits whose records together span more ledger hours
/// than one request may rate is refused at once, saying how many of them fit, and nothing is
/// written; as many as fit are stored.
#[tokio::test]
async fn a_batch_spanning_more_hours_than_a_request_may_rate_is_refused_saying_what_fits() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    // 31 days each: 744 ledger hours, bounded at 746 with the spares for cuts.
    let month_long = |count: usize| -> Vec<Value> {
        (0..count)
            .map(|i| {
                json!({"project": "vision", "task_id": format!("long-{i}"), "gpu_model": "H100",
                       "gpu_count": 1, "started_at": "2026-10-01T00:00:00Z",
                       "ended_at": "2026-11-01T00:00:00Z", "outcome": "completed"})
            })
            .collect()
    };
    let started = std::time::Instant::now();
    let response = app
        .post("/v1/job-records", &app.admin, json!(month_long(1341)))
        .await;
    let problem = response.problem(StatusCode::PAYLOAD_TOO_LARGE);
    let detail = problem["detail"].as_str().unwrap();
    assert!(detail.contains("at most 1340 records"), "{detail}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "refused before rating"
    );
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM job_records")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0);
    let response = app
        .post("/v1/job-records", &app.admin, json!(month_long(3)))
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
}
