//! Projects, budgets, tokens, roles, the error format and the OpenAPI document.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::json;

use crate::common::TestApp;

#[tokio::test]
async fn health_and_readiness() {
    let app = TestApp::spawn().await;
    let health = app.call(Method::GET, "/healthz", None, None).await;
    assert_eq!(health.status, StatusCode::OK);
    let ready = app.call(Method::GET, "/readyz", None, None).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text());
}

#[tokio::test]
async fn readiness_fails_when_a_migration_is_missing() {
    let app = TestApp::spawn().await;
    let latest = taskledger::db::latest_migration_version();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(latest)
        .execute(&app.pool)
        .await
        .unwrap();
    let ready = app.call(Method::GET, "/readyz", None, None).await;
    ready.problem(StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn admin_creates_reads_and_changes_a_project() {
    let app = TestApp::spawn().await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "team": "perception", "currency": "USD",
                   "default_monthly_budget": "1000.00", "webhook_url": "http://127.0.0.1:9/hook"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let project = created.json();
    assert_eq!(project["alert_thresholds"], json!([50, 80, 100]));
    assert_eq!(project["default_monthly_budget"], "1000");

    let fetched = app.get("/v1/projects/vision", &app.admin).await.json();
    assert_eq!(fetched["name"], "Vision");
    assert_eq!(fetched["currency"], "USD");

    let changed = app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"team": null, "alert_thresholds": [25, 50, 90, 100], "default_monthly_budget": 1500.5}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    let changed = changed.json();
    assert_eq!(changed["team"], serde_json::Value::Null);
    assert_eq!(changed["name"], "Vision", "fields left out stay");
    assert_eq!(changed["alert_thresholds"], json!([25, 50, 90, 100]));
    assert_eq!(changed["default_monthly_budget"], "1500.5");
    assert_eq!(changed["webhook_url"], "http://127.0.0.1:9/hook");
}

#[tokio::test]
async fn a_taken_project_id_is_a_conflict() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let again = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "x", "currency": "EUR"}),
        )
        .await;
    again.problem(StatusCode::CONFLICT);
    assert_eq!(
        app.get("/v1/projects/vision", &app.admin).await.json()["currency"],
        "USD"
    );
}

#[tokio::test]
async fn invalid_project_fields_are_all_named() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "Vision!", "name": " ", "currency": "usd", "default_monthly_budget": "-5",
                   "alert_thresholds": [80, 50], "webhook_url": "ftp://x"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = response.pointers();
    pointers.sort();
    assert_eq!(
        pointers,
        vec![
            "/alert_thresholds",
            "/currency",
            "/default_monthly_budget",
            "/id",
            "/name",
            "/webhook_url"
        ]
    );
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM projects")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn thresholds_must_be_from_1_to_1000() {
    let app = TestApp::spawn().await;
    for bad in [json!([0, 50]), json!([50, 1001]), json!([])] {
        let response = app
            .post(
                "/v1/projects",
                &app.admin,
                json!({"id": "p", "name": "p", "currency": "USD", "alert_thresholds": bad}),
            )
            .await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), vec!["/alert_thresholds"]);
    }
    let ok = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "p", "name": "p", "currency": "USD", "alert_thresholds": [1, 1000]}),
        )
        .await;
    assert_eq!(ok.status, StatusCode::CREATED);
}

#[tokio::test]
async fn a_missing_or_bad_token_is_401_problem() {
    let app = TestApp::spawn().await;
    let missing = app
        .call(
            Method::POST,
            "/v1/projects",
            None,
            Some(json!({"id": "a", "name": "a", "currency": "USD"})),
        )
        .await;
    missing.problem(StatusCode::UNAUTHORIZED);
    assert_eq!(missing.headers[header::WWW_AUTHENTICATE], "Bearer");
    let bad = app.get("/v1/projects", "tl_not-a-real-token").await;
    bad.problem(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn an_unknown_field_is_422_naming_it() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "a", "name": "a", "currency": "USD", "budget": 5}),
        )
        .await;
    let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/budget"]);
    assert!(
        problem["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("unknown field")
    );
}

#[tokio::test]
async fn malformed_json_wrong_content_type_and_oversized_bodies_are_problems() {
    let app = TestApp::spawn().await;
    let request = |content_type: &str, body: Vec<u8>| {
        Request::builder()
            .method(Method::POST)
            .uri("/v1/projects")
            .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from(body))
            .unwrap()
    };
    app.send(request("application/json", b"{\"id\": ".to_vec()))
        .await
        .problem(StatusCode::BAD_REQUEST);
    app.send(request("text/plain", b"{}".to_vec()))
        .await
        .problem(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let huge = vec![b' '; taskledger::http::extract::MAX_BODY_BYTES + 1];
    let too_large = app.send(request("application/json", huge)).await;
    let problem = too_large.problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert!(problem["detail"].as_str().unwrap().contains("16 MiB"));
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let app = TestApp::spawn().await;
    app.get("/v1/nothing-here", &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
    app.call(Method::DELETE, "/v1/projects", Some(&app.admin), None)
        .await
        .problem(StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn readers_see_only_their_projects_and_get_404_for_others() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "USD").await;
    app.create_project("beta", "EUR").await;
    let reader = app.token("reader", &["alpha"]).await;

    assert_eq!(
        app.get("/v1/projects/alpha", &reader).await.status,
        StatusCode::OK
    );
    let hidden = app.get("/v1/projects/beta", &reader).await;
    let problem = hidden.problem(StatusCode::NOT_FOUND);
    let missing = app.get("/v1/projects/gamma", &reader).await.json();
    assert_eq!(
        problem["detail"].as_str().unwrap().replace("beta", "gamma"),
        missing["detail"]
    );
    app.get("/v1/projects/beta/budgets", &reader)
        .await
        .problem(StatusCode::NOT_FOUND);

    let listed = app.get("/v1/projects", &reader).await.json();
    let ids: Vec<&str> = listed["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["alpha"]);

    app.patch("/v1/projects/alpha", &reader, json!({"name": "x"}))
        .await
        .problem(StatusCode::FORBIDDEN);
    app.post(
        "/v1/projects",
        &reader,
        json!({"id": "c", "name": "c", "currency": "USD"}),
    )
    .await
    .problem(StatusCode::FORBIDDEN);
    app.put(
        "/v1/projects/alpha/budgets/2026-11",
        &reader,
        json!({"amount": "10"}),
    )
    .await
    .problem(StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn ingest_tokens_cannot_read_projects() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "USD").await;
    let ingest = app.token("ingest", &["alpha"]).await;
    app.get("/v1/projects/alpha", &ingest)
        .await
        .problem(StatusCode::NOT_FOUND);
    assert_eq!(
        app.get("/v1/projects", &ingest).await.json()["items"],
        json!([])
    );
    app.get("/v1/tokens", &ingest)
        .await
        .problem(StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn every_token_reads_its_own_role_and_projects() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "USD").await;
    let ingest = app.token("ingest", &["alpha"]).await;
    let finance = app.token("finance", &[]).await;
    let own = app.get("/v1/tokens/current", &ingest).await;
    assert_eq!(own.status, StatusCode::OK, "{}", own.text());
    assert_eq!(own.json()["role"], "ingest");
    assert_eq!(own.json()["projects"], json!(["alpha"]));
    let own = app.get("/v1/tokens/current", &finance).await.json();
    assert_eq!(
        (own["role"].clone(), own["projects"].clone()),
        (json!("finance"), json!([]))
    );
    app.get("/v1/tokens/current", "tl_wrong")
        .await
        .problem(StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn finance_sets_budgets_for_any_project() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "EUR").await;
    let finance = app.token("finance", &[]).await;
    let put = app
        .put(
            "/v1/projects/alpha/budgets/2026-11",
            &finance,
            json!({"amount": "2500.50"}),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text());
    assert_eq!(put.json()["amount"], "2500.5");
    assert_eq!(put.json()["currency"], "EUR");
    let replaced = app
        .put(
            "/v1/projects/alpha/budgets/2026-11",
            &finance,
            json!({"amount": 3000}),
        )
        .await;
    assert_eq!(replaced.json()["amount"], "3000");
    let listed = app.get("/v1/projects/alpha/budgets", &finance).await.json();
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["month"], "2026-11");

    let bad = app
        .put(
            "/v1/projects/alpha/budgets/2026-13",
            &finance,
            json!({"amount": "0"}),
        )
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let mut pointers = bad.pointers();
    pointers.sort();
    assert_eq!(pointers, vec!["/amount", "path:month"]);
    app.put(
        "/v1/projects/nope/budgets/2026-11",
        &finance,
        json!({"amount": "1"}),
    )
    .await
    .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn tokens_are_shown_once_stored_hashed_and_revoked_at_once() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "USD").await;
    let created = app
        .post(
            "/v1/tokens",
            &app.admin,
            json!({"role": "reader", "projects": ["alpha"], "name": "dash"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let created = created.json();
    let secret = created["token"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();

    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT secret_sha256 FROM api_tokens WHERE id = $1::uuid")
            .bind(&id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(stored, taskledger::domain::access::hash_secret(&secret));
    let listed = app.get("/v1/tokens", &app.admin).await;
    assert!(
        !listed.text().contains(&secret),
        "a listing never shows secrets"
    );

    assert_eq!(
        app.get("/v1/projects/alpha", &secret).await.status,
        StatusCode::OK
    );
    assert_eq!(
        app.delete(&format!("/v1/tokens/{id}"), &app.admin)
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    app.get("/v1/projects/alpha", &secret)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    app.delete(&format!("/v1/tokens/{id}"), &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn token_scopes_are_checked() {
    let app = TestApp::spawn().await;
    app.create_project("alpha", "USD").await;
    let cases = [
        (json!({"role": "reader", "name": "x"}), "/projects"),
        (
            json!({"role": "ingest", "projects": ["missing"], "name": "x"}),
            "/projects/0",
        ),
        (
            json!({"role": "finance", "projects": ["alpha"], "name": "x"}),
            "/projects",
        ),
        (json!({"role": "owner", "name": "x"}), "/role"),
    ];
    for (body, pointer) in cases {
        let response = app.post("/v1/tokens", &app.admin, body.clone()).await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), vec![pointer], "{body}");
    }
    let reader = app.token("reader", &["alpha"]).await;
    app.post(
        "/v1/tokens",
        &reader,
        json!({"role": "admin", "name": "escalate"}),
    )
    .await
    .problem(StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn lists_paginate_with_a_cursor() {
    let app = TestApp::spawn().await;
    for id in ["a1", "a2", "a3", "a4", "a5"] {
        app.create_project(id, "USD").await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/projects?limit=2".to_owned();
    loop {
        let page = app.get(&path, &app.admin).await.json();
        for item in page["items"].as_array().unwrap() {
            seen.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/projects?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen, vec!["a1", "a2", "a3", "a4", "a5"]);
    let bad = app.get("/v1/projects?limit=0", &app.admin).await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.pointers(), vec!["query:limit"]);
    app.get("/v1/projects?cursor=garbage", &app.admin)
        .await
        .problem(StatusCode::UNPROCESSABLE_ENTITY);
    let unknown = app.get("/v1/projects?limt=5", &app.admin).await;
    unknown.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(unknown.pointers(), vec!["query:limt"]);
}

#[tokio::test]
async fn committed_openapi_document_equals_the_served_one() {
    let app = TestApp::spawn().await;
    let served = app.call(Method::GET, "/openapi.json", None, None).await;
    assert_eq!(served.status, StatusCode::OK);
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/api/openapi.json"))
            .expect("api/openapi.json is committed"),
    )
    .unwrap();
    assert!(
        served.json() == committed,
        "api/openapi.json is stale; regenerate it with `cargo run -- openapi > api/openapi.json`"
    );
    let docs = app.call(Method::GET, "/docs/", None, None).await;
    assert_eq!(docs.status, StatusCode::OK);
    assert!(docs.text().contains("swagger"));
}

#[tokio::test]
async fn a_real_listening_server_answers() {
    let app = TestApp::spawn().await;
    let served = app.serve().await;
    let address = served.address;
    let client = reqwest::Client::new();
    let ready = client
        .get(format!("http://{address}/readyz"))
        .send()
        .await
        .unwrap();
    assert_eq!(ready.status(), 200);
    let created = client
        .post(format!("http://{address}/v1/projects"))
        .bearer_auth(&app.admin)
        .json(&json!({"id": "live", "name": "Live", "currency": "USD"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    served.stop().await;
}
