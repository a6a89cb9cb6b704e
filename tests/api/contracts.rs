//! Contracts: who may change them, validation, and the overlap rule.

use axum::http::StatusCode;
use serde_json::json;

use crate::common::TestApp;
use crate::fixtures::{Contract, contract};

fn list_price(valid_from: &str) -> Contract {
    contract("H100", "on_demand", "2.50")
        .named("list price")
        .valid_from(valid_from)
}

#[tokio::test]
async fn finance_manages_contracts_and_others_may_not() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let finance = app.token("finance", &[]).await;
    let created = app
        .post(
            "/v1/contracts",
            &finance,
            list_price("2026-01-01T01:00:00+01:00").into(),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let created = created.json();
    assert_eq!(created["valid_from"], "2026-01-01T00:00:00Z");
    assert_eq!(created["price_per_gpu_hour"], "2.5");
    assert_eq!(created["valid_until"], serde_json::Value::Null);
    let id = created["id"].as_str().unwrap();

    let listed = app.get("/v1/contracts", &finance).await.json();
    assert_eq!(listed["items"][0]["id"], id);
    let one = app.get(&format!("/v1/contracts/{id}"), &finance).await;
    assert_eq!(one.json()["name"], "list price");

    for role in ["reader", "ingest"] {
        let token = app.token(role, &["vision"]).await;
        app.get("/v1/contracts", &token)
            .await
            .problem(StatusCode::FORBIDDEN);
        app.post(
            "/v1/contracts",
            &token,
            list_price("2027-01-01T00:00:00Z").into(),
        )
        .await
        .problem(StatusCode::FORBIDDEN);
        app.patch(&format!("/v1/contracts/{id}"), &token, json!({"name": "x"}))
            .await
            .problem(StatusCode::FORBIDDEN);
        app.delete(&format!("/v1/contracts/{id}"), &token)
            .await
            .problem(StatusCode::FORBIDDEN);
    }
    app.get("/v1/contracts/not-a-uuid", &finance)
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_equally_specific_overlap_is_a_conflict_naming_the_other() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let first_id = list_price("2026-01-01T00:00:00Z")
        .valid_until("2026-07-01T00:00:00Z")
        .create(&app)
        .await;

    let overlapping = app
        .post(
            "/v1/contracts",
            &app.admin,
            list_price("2026-06-30T00:00:00Z").into(),
        )
        .await;
    let problem = overlapping.problem(StatusCode::CONFLICT);
    assert!(
        problem["detail"].as_str().unwrap().contains(&first_id),
        "{problem}"
    );

    // Back to back is no overlap; a narrower scope is not equally specific.
    let next_id = list_price("2026-07-01T00:00:00Z").create(&app).await;
    let scoped = list_price("2026-03-01T00:00:00Z").project("vision");
    scoped.clone().create(&app).await;
    scoped.provider("acme").create(&app).await;

    // Stretching the first one over the next is refused too, and changes nothing.
    let stretched = app
        .patch(
            &format!("/v1/contracts/{first_id}"),
            &app.admin,
            json!({"valid_until": null}),
        )
        .await;
    let problem = stretched.problem(StatusCode::CONFLICT);
    assert!(problem["detail"].as_str().unwrap().contains(&next_id));
    let unchanged = app
        .get(&format!("/v1/contracts/{first_id}"), &app.admin)
        .await
        .json();
    assert_eq!(unchanged["valid_until"], "2026-07-01T00:00:00Z");
}

#[tokio::test]
async fn concurrent_overlapping_creates_cannot_both_succeed() {
    let app = TestApp::spawn().await;
    let attempts = (0..4).map(|_| {
        app.post(
            "/v1/contracts",
            &app.admin,
            list_price("2026-01-01T00:00:00Z").into(),
        )
    });
    let statuses: Vec<StatusCode> = futures::future::join_all(attempts)
        .await
        .iter()
        .map(|r| r.status)
        .collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == StatusCode::CREATED)
            .count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == StatusCode::CREATED || *s == StatusCode::CONFLICT)
    );
}

#[tokio::test]
async fn invalid_fields_are_named_by_pointer() {
    let app = TestApp::spawn().await;
    let response = app
        .post(
            "/v1/contracts",
            &app.admin,
            contract("H100", "on_demand", "-1")
                .named(" ")
                .currency("usd")
                .valid_from("2026-01-01T00:00:00")
                .project("nope")
                .region(&"x".repeat(101))
                .committed_gpus(2)
                .into(),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        response.pointers(),
        [
            "/name",
            "/price_per_gpu_hour",
            "/currency",
            "/valid_from",
            "/region",
            "/project"
        ]
    );

    let response = app
        .post(
            "/v1/contracts",
            &app.admin,
            contract("H100", "on_demand", 0.5)
                .named("n")
                .valid_until("2025-01-01T00:00:00Z")
                .committed_gpus(2)
                .into(),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["/valid_until", "/committed_gpus"]);

    let response = app
        .post(
            "/v1/contracts",
            &app.admin,
            contract("H100", "hourly", "1").named("n").into(),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["/billing_mode"]);

    let id = list_price("2026-01-01T00:00:00Z").create(&app).await;
    let response = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"price_per_gpu_hour": "0", "valid_until": "2025-12-31T00:00:00Z"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["/price_per_gpu_hour", "/valid_until"]);
    let response = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"gpu_model": "A100"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["/gpu_model"]);
}
