//! Job-record ingestion: validation, idempotency, conflicts, scopes, corrections and reads.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::common::TestApp;
use crate::fixtures;

/// A record as a scheduler reports one: with provider, region, busy time, output and labels.
fn record(project: &str, task: &str, attempt: u32) -> Value {
    fixtures::record(task, "2026-11-20T10:00:00Z", "2026-11-20T11:30:00Z")
        .project(project)
        .attempt(attempt)
        .gpu_count(8)
        .billing_mode("spot")
        .provider("aws")
        .region("us-east-1")
        .gpu_seconds_busy("30100")
        .output("1000000", "tokens")
        .label("team", "perception")
        .label("pipeline", "nightly")
        .into()
}

fn batch(project: &str, tasks: std::ops::Range<usize>) -> Value {
    Value::Array(
        tasks
            .map(|i| record(project, &format!("task-{i}"), 1))
            .collect(),
    )
}

async fn count(app: &TestApp, table: &str) -> i64 {
    sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let ingest = app.token("ingest", &["vision"]).await;
    (app, ingest)
}

#[tokio::test]
async fn a_batch_is_stored_and_read_back() {
    let (app, ingest) = setup().await;
    let response = app
        .post("/v1/job-records", &ingest, batch("vision", 0..3))
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.json(), json!({"accepted": 3, "duplicates": 0}));
    let stored = app
        .get("/v1/projects/vision/job-records/task-1/1", &app.admin)
        .await;
    assert_eq!(stored.status, StatusCode::OK, "{}", stored.text());
    let stored = stored.json();
    assert_eq!(
        stored["record"]["gpu_seconds_held"], "43200",
        "default gpu_count × duration"
    );
    assert_eq!(stored["record"]["gpu_seconds_busy"], "30100");
    assert_eq!(
        stored["record"]["output"],
        json!({"quantity": "1000000", "unit": "tokens"})
    );
    assert_eq!(stored["record"]["labels"]["team"], "perception");
    assert_eq!(stored["record"]["version"], 1);
    assert_eq!(stored["history"], json!([]));
}

#[tokio::test]
async fn one_bad_record_rejects_the_batch_with_its_pointer_and_writes_nothing() {
    let (app, ingest) = setup().await;
    let mut records = batch("vision", 0..5);
    records[3]["ended_at"] = json!("2026-11-20T09:00:00Z");
    records[4]["gpu_count"] = json!(0);
    records[4]["outcome"] = json!("exploded");
    let response = app.post("/v1/job-records", &ingest, records).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = response.pointers();
    pointers.sort();
    assert_eq!(pointers, vec!["/3/ended_at", "/4/gpu_count", "/4/outcome"]);
    assert_eq!(count(&app, "job_records").await, 0);
}

#[tokio::test]
async fn posting_the_same_batch_twice_stores_it_once() {
    let (app, ingest) = setup().await;
    let first = app
        .post("/v1/job-records", &ingest, batch("vision", 0..50))
        .await;
    assert_eq!(first.json(), json!({"accepted": 50, "duplicates": 0}));
    let second = app
        .post("/v1/job-records", &ingest, batch("vision", 0..50))
        .await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.json(), json!({"accepted": 0, "duplicates": 50}));
    let overlapping = app
        .post("/v1/job-records", &ingest, batch("vision", 40..60))
        .await;
    assert_eq!(
        overlapping.json(),
        json!({"accepted": 10, "duplicates": 10})
    );
    assert_eq!(count(&app, "job_records").await, 60);
}

#[tokio::test]
async fn an_equal_record_spelled_differently_is_a_duplicate() {
    let (app, ingest) = setup().await;
    app.post(
        "/v1/job-records",
        &ingest,
        json!([record("vision", "t", 1)]),
    )
    .await;
    let mut respelled = record("vision", "t", 1);
    respelled["gpu_count"] = json!("8.0");
    respelled["started_at"] = json!("2026-11-20T11:00:00+01:00");
    respelled["gpu_seconds_held"] = json!(43200);
    let response = app
        .post("/v1/job-records", &ingest, json!([respelled]))
        .await;
    assert_eq!(response.json(), json!({"accepted": 0, "duplicates": 1}));
}

#[tokio::test]
async fn a_changed_repost_is_a_conflict_naming_the_record_and_writes_nothing() {
    let (app, ingest) = setup().await;
    app.post("/v1/job-records", &ingest, batch("vision", 0..3))
        .await;
    let mut records = batch("vision", 2..6);
    records[0]["outcome"] = json!("failed");
    let response = app.post("/v1/job-records", &ingest, records).await;
    let problem = response.problem(StatusCode::CONFLICT);
    assert_eq!(response.pointers(), vec!["/0"]);
    assert!(
        problem["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("vision/task-2/1")
    );
    assert_eq!(
        count(&app, "job_records").await,
        3,
        "the new records of the batch were not written"
    );
    let stored = app
        .get("/v1/projects/vision/job-records/task-2/1", &app.admin)
        .await
        .json();
    assert_eq!(stored["record"]["outcome"], "completed");
}

#[tokio::test]
async fn a_retry_moved_across_a_month_boundary_is_still_the_same_key() {
    let (app, ingest) = setup().await;
    let mut october = record("vision", "t", 1);
    october["started_at"] = json!("2026-10-31T23:00:00Z");
    october["ended_at"] = json!("2026-11-01T00:30:00Z");
    october["gpu_seconds_busy"] = Value::Null;
    app.post("/v1/job-records", &ingest, json!([october])).await;
    let november = record("vision", "t", 1);
    app.post("/v1/job-records", &ingest, json!([november]))
        .await
        .problem(StatusCode::CONFLICT);
    assert_eq!(count(&app, "job_records").await, 1);
}

#[tokio::test]
async fn copies_inside_one_batch_collapse_or_conflict() {
    let (app, ingest) = setup().await;
    let same = json!([
        record("vision", "a", 1),
        record("vision", "a", 1),
        record("vision", "b", 1)
    ]);
    let response = app.post("/v1/job-records", &ingest, same).await;
    assert_eq!(response.json(), json!({"accepted": 2, "duplicates": 1}));

    let mut changed = record("vision", "c", 1);
    changed["retries"] = json!(2);
    let differing = json!([record("vision", "c", 1), record("vision", "d", 1), changed]);
    let response = app.post("/v1/job-records", &ingest, differing).await;
    response.problem(StatusCode::CONFLICT);
    assert_eq!(response.pointers(), vec!["/0", "/2"]);
    assert_eq!(count(&app, "job_records").await, 2);
}

#[tokio::test]
async fn an_ingest_token_cannot_write_to_another_project() {
    let (app, ingest) = setup().await;
    app.create_project("other", "USD").await;
    let records = json!([
        record("vision", "a", 1),
        record("other", "b", 1),
        record("other", "c", 1)
    ]);
    let response = app.post("/v1/job-records", &ingest, records).await;
    response.problem(StatusCode::FORBIDDEN);
    assert_eq!(response.pointers(), vec!["/1/project", "/2/project"]);
    assert_eq!(count(&app, "job_records").await, 0);

    let reader = app.token("reader", &["vision"]).await;
    app.post(
        "/v1/job-records",
        &reader,
        json!([record("vision", "a", 1)]),
    )
    .await
    .problem(StatusCode::FORBIDDEN);
    let admin = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([record("other", "b", 1)]),
        )
        .await;
    assert_eq!(admin.json(), json!({"accepted": 1, "duplicates": 0}));
}

#[tokio::test]
async fn records_of_unknown_projects_are_invalid() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([record("ghost", "a", 1)]),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/0/project"]);
}

#[tokio::test]
async fn ndjson_bodies_are_accepted() {
    let (app, ingest) = setup().await;
    let lines: Vec<String> = (0..4)
        .map(|i| record("vision", &format!("n{i}"), 1).to_string())
        .collect();
    let body = format!("{}\n\n{}\n", lines[..2].join("\n"), lines[2..].join("\n"));
    let request = Request::builder()
        .method(Method::POST)
        .uri("/v1/job-records")
        .header(header::AUTHORIZATION, format!("Bearer {ingest}"))
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from(body))
        .unwrap();
    let response = app.send(request).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.json(), json!({"accepted": 4, "duplicates": 0}));

    let broken = Request::builder()
        .method(Method::POST)
        .uri("/v1/job-records")
        .header(header::AUTHORIZATION, format!("Bearer {ingest}"))
        .header(header::CONTENT_TYPE, "application/x-ndjson")
        .body(Body::from(format!("{}\n{{\"project\": \n", lines[0])))
        .unwrap();
    let problem = app.send(broken).await.problem(StatusCode::BAD_REQUEST);
    assert!(problem["detail"].as_str().unwrap().contains("line 2"));
}

#[tokio::test]
async fn more_than_10000_records_is_413_saying_the_limit() {
    let (app, ingest) = setup().await;
    let records: Vec<Value> = (0..10_001)
        .map(|i| json!({"task_id": format!("t{i}")}))
        .collect();
    let response = app
        .post("/v1/job-records", &ingest, Value::Array(records))
        .await;
    let problem = response.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert!(problem["detail"].as_str().unwrap().contains("10000"));
}

#[tokio::test]
async fn numbers_and_times_are_checked_strictly() {
    let (app, ingest) = setup().await;
    let mut bad = record("vision", "a", 1);
    bad["gpu_seconds_held"] = json!("1e40");
    bad["started_at"] = json!("2026-11-20 10:00:00");
    bad["gpu_seconds_busy"] = json!("NaN");
    bad["labels"] = json!({"x": {"nested": true}});
    let response = app.post("/v1/job-records", &ingest, json!([bad])).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = response.pointers();
    pointers.sort();
    assert_eq!(
        pointers,
        vec![
            "/0/gpu_seconds_busy",
            "/0/gpu_seconds_held",
            "/0/labels/x",
            "/0/started_at"
        ]
    );
    let mut mig = record("vision", "mig", 1);
    mig["gpu_count"] = json!("0.142857");
    mig["gpu_seconds_busy"] = Value::Null;
    let ok = app.post("/v1/job-records", &ingest, json!([mig])).await;
    assert_eq!(
        ok.status,
        StatusCode::OK,
        "a fractional GPU count is valid: {}",
        ok.text()
    );
}

#[tokio::test]
async fn concurrent_clients_posting_overlapping_batches_store_each_key_once() {
    let (app, ingest) = setup().await;
    let app = std::sync::Arc::new(app);
    let mut clients = Vec::new();
    for client in 0..16usize {
        let app = app.clone();
        let ingest = ingest.clone();
        clients.push(tokio::spawn(async move {
            let start = client * 25;
            let response = app
                .post(
                    "/v1/job-records",
                    &ingest,
                    batch("vision", start..start + 100),
                )
                .await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
            let counts = response.json();
            (
                counts["accepted"].as_u64().unwrap(),
                counts["duplicates"].as_u64().unwrap(),
            )
        }));
    }
    let mut accepted = 0;
    let mut duplicates = 0;
    for client in clients {
        let (a, d) = client.await.unwrap();
        accepted += a;
        duplicates += d;
    }
    let keys = 15 * 25 + 100;
    assert_eq!(accepted, keys as u64, "each key accepted exactly once");
    assert_eq!(accepted + duplicates, 1600);
    assert_eq!(count(&app, "job_records").await, keys as i64);
}

#[tokio::test]
async fn corrections_keep_every_previous_version() {
    let (app, ingest) = setup().await;
    app.post(
        "/v1/job-records",
        &ingest,
        json!([record("vision", "t/with slash", 1)]),
    )
    .await;
    let path = "/v1/projects/vision/job-records/t%2Fwith%20slash/1";
    let mut corrected = record("vision", "t/with slash", 1);
    corrected["outcome"] = json!("failed");
    corrected.as_object_mut().unwrap().remove("project");
    let response = app.put(path, &ingest, corrected.clone()).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let body = response.json();
    assert_eq!(body["record"]["outcome"], "failed");
    assert_eq!(body["record"]["version"], 2);
    assert_eq!(body["history"].as_array().unwrap().len(), 1);
    assert_eq!(body["history"][0]["version"], 1);
    assert_eq!(body["history"][0]["record"]["outcome"], "completed");
    assert!(body["history"][0]["replaced_by"].is_string());

    let again = app.put(path, &ingest, corrected.clone()).await.json();
    assert_eq!(
        again["record"]["version"], 2,
        "an identical correction changes nothing"
    );

    let fetched = app.get(path, &app.admin).await.json();
    assert_eq!(fetched["history"].as_array().unwrap().len(), 1);
    let mut repost = corrected.clone();
    repost["project"] = json!("vision");
    let repost = app.post("/v1/job-records", &ingest, json!([repost])).await;
    assert_eq!(
        repost.json(),
        json!({"accepted": 0, "duplicates": 1}),
        "the corrected content is now the stored one"
    );
}

#[tokio::test]
async fn corrections_are_checked() {
    let (app, ingest) = setup().await;
    app.create_project("other", "USD").await;
    app.post(
        "/v1/job-records",
        &ingest,
        json!([record("vision", "t", 1)]),
    )
    .await;
    let path = "/v1/projects/vision/job-records/t/1";
    let mut mismatched = record("vision", "t", 2);
    mismatched["outcome"] = json!("failed");
    let response = app.put(path, &ingest, mismatched).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/attempt"]);
    let mut invalid = record("vision", "t", 1);
    invalid["gpu_seconds_busy"] = json!(999999);
    let response = app.put(path, &ingest, invalid).await;
    assert_eq!(response.pointers(), vec!["/gpu_seconds_busy"]);
    app.put(
        "/v1/projects/vision/job-records/missing/1",
        &ingest,
        record("vision", "missing", 1),
    )
    .await
    .problem(StatusCode::NOT_FOUND);
    let reader = app.token("reader", &["vision"]).await;
    app.put(path, &reader, record("vision", "t", 1))
        .await
        .problem(StatusCode::FORBIDDEN);
    let outsider = app.token("ingest", &["other"]).await;
    app.put(path, &outsider, record("vision", "t", 1))
        .await
        .problem(StatusCode::NOT_FOUND);
    let stored = app.get(path, &app.admin).await.json();
    assert_eq!(stored["record"]["version"], 1);
}

#[tokio::test]
async fn records_are_listed_with_filters_and_pages() {
    let (app, ingest) = setup().await;
    let mut records = Vec::new();
    for day in 1..=9 {
        let mut r = record("vision", &format!("d{day}"), 1);
        r["started_at"] = json!(format!("2026-11-0{day}T10:00:00Z"));
        r["ended_at"] = json!(format!("2026-11-0{day}T11:00:00Z"));
        r["gpu_seconds_busy"] = json!(20000);
        if day % 3 == 0 {
            r["outcome"] = json!("failed");
        }
        records.push(r);
    }
    let posted = app
        .post("/v1/job-records", &ingest, Value::Array(records))
        .await;
    assert_eq!(posted.json(), json!({"accepted": 9, "duplicates": 0}));
    let reader = app.token("reader", &["vision"]).await;

    let mut seen = Vec::new();
    let mut path =
        "/v1/projects/vision/job-records?from=2026-11-02&to=2026-11-08T10:00:00Z&limit=2"
            .to_owned();
    loop {
        let page = app.get(&path, &reader).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text());
        let page = page.json();
        for item in page["items"].as_array().unwrap() {
            seen.push(item["task_id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => {
                path = format!(
                    "/v1/projects/vision/job-records?from=2026-11-02&to=2026-11-08T10:00:00Z&limit=2&cursor={cursor}"
                )
            }
            None => break,
        }
    }
    assert_eq!(seen, vec!["d2", "d3", "d4", "d5", "d6", "d7"]);

    let failed = app
        .get("/v1/projects/vision/job-records?outcome=failed", &reader)
        .await
        .json();
    let tasks: Vec<&str> = failed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(tasks, vec!["d3", "d6", "d9"]);
    let one = app
        .get("/v1/projects/vision/job-records?task_id=d4", &reader)
        .await
        .json();
    assert_eq!(one["items"].as_array().unwrap().len(), 1);

    let bad = app
        .get(
            "/v1/projects/vision/job-records?from=yesterday&outcome=meh",
            &reader,
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = bad.pointers();
    pointers.sort();
    assert_eq!(pointers, vec!["query:from", "query:outcome"]);
    app.create_project("other", "USD").await;
    let outsider = app.token("reader", &["other"]).await;
    app.get("/v1/projects/vision/job-records", &outsider)
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn the_example_script_posts_a_record_over_http() {
    let (app, ingest) = setup().await;
    let served = app.serve().await;
    let url = served.url();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/api/examples/post-job-record.sh"
    );
    let run = || {
        let url = url.clone();
        let ingest = ingest.clone();
        tokio::process::Command::new("bash")
            .arg(script)
            .args([
                "vision",
                "nightly-42",
                "H100",
                "8",
                "2026-11-20T10:00:00Z",
                "2026-11-20T11:30:00Z",
                "completed",
            ])
            .env("TASKLEDGER_URL", url)
            .env("TASKLEDGER_TOKEN", ingest)
            .output()
    };
    let first = run().await.unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&first.stdout).trim(),
        r#"{"accepted":1,"duplicates":0}"#
    );
    let again = run().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&again.stdout).trim(),
        r#"{"accepted":0,"duplicates":1}"#
    );
    served.stop().await;
}
