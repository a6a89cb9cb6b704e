//! The audit log: every change recorded once with its actor, before and after; the chain
//! verifies and names where it was tampered with; the CSV re-hashes to the same chain.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::Connection;

use taskledger::config::{Clock, Settings};
use taskledger::domain::audit::canonical_json;
use taskledger::exports::csv_cell::read_reversible_cell;

use crate::bills::post_bill;
use crate::common::TestApp;
use crate::fixtures::{contract, record};

const FOCUS_SAMPLE: &str = include_str!("../fixtures/focus/focus_sample.csv");

async fn app_in_december() -> TestApp {
    TestApp::spawn_with(Settings {
        clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    })
    .await
}

/// Every entry, in seq order, read page by page as `token`.
async fn entries(app: &TestApp, query: &str, token: &str) -> Vec<Value> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = format!("/v1/audit?limit=1000{query}");
        if let Some(cursor) = &cursor {
            path.push_str(&format!("&cursor={cursor}"));
        }
        let response = app.get(&path, token).await;
        assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        let page = response.json();
        all.extend(page["items"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return all,
        }
    }
}

async fn verify(app: &TestApp) -> Value {
    let response = app.get("/v1/audit/verify", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

async fn token_id(app: &TestApp, token: &str) -> String {
    let current = app.get("/v1/tokens/current", token).await.json();
    current["id"].as_str().unwrap().to_owned()
}

fn ok(response: crate::common::TestResponse) -> Value {
    assert!(response.status.is_success(), "{}", response.text());
    if response.body.is_empty() {
        Value::Null
    } else {
        response.json()
    }
}

#[tokio::test]
async fn every_change_is_recorded_once_with_its_actor_before_and_after() {
    let app = app_in_december().await;
    let admin_id = token_id(&app, &app.admin).await;
    let finance = app.token("finance", &[]).await;
    let finance_id = token_id(&app, &finance).await;

    let project = json!({"id": "vision", "name": "Vision", "currency": "USD",
                         "webhook_url": "https://hooks.example.com/secret-path"});
    ok(app.post("/v1/projects", &app.admin, project).await);
    ok(app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"team": "perception"}),
        )
        .await);
    let ingest = app.token("ingest", &["vision"]).await;
    ok(app
        .put(
            "/v1/projects/vision/budgets/2026-11",
            &finance,
            json!({"amount": "1000"}),
        )
        .await);
    ok(app
        .put(
            "/v1/projects/vision/budgets/2026-11",
            &finance,
            json!({"amount": "1200.50"}),
        )
        .await);
    let contract_id = ok(app
        .post(
            "/v1/contracts",
            &finance,
            contract("H100", "on_demand", "2.50").into(),
        )
        .await)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(app
        .patch(
            &format!("/v1/contracts/{contract_id}"),
            &finance,
            json!({"price_per_gpu_hour": "2.75"}),
        )
        .await);
    let owned = json!({
        "name": "owned A100", "gpu_model": "A100", "billing_mode": "reserved",
        "currency": "USD", "valid_from": "2026-10-01T00:00:00Z",
        "tco": {"purchase_price_per_gpu": "15000", "salvage_value_per_gpu": "1860",
                "life_months": 12, "in_service_from": "2025-11-20T00:00:00Z",
                "power_kw_per_gpu": "0.5", "electricity_price_per_kwh": "0.25", "pue": "1.2",
                "other_per_gpu_month": "73"}
    });
    let owned_id = ok(app.post("/v1/contracts", &finance, owned).await)["id"]
        .as_str()
        .unwrap()
        .to_owned();
    ok(app
        .delete(&format!("/v1/contracts/{owned_id}"), &finance)
        .await);
    ok(app
        .put(
            "/v1/fx-rates/2026-11/USD/EUR",
            &finance,
            json!({"rate": "0.92"}),
        )
        .await);
    ok(app
        .put(
            "/v1/fx-rates/2026-11/USD/EUR",
            &finance,
            json!({"rate": "0.93"}),
        )
        .await);
    ok(app.delete("/v1/fx-rates/2026-11/USD/EUR", &finance).await);
    ok(app
        .put(
            "/v1/grid-intensity/2026-11/eu-west-3",
            &finance,
            json!({"g_co2e_per_kwh": "56"}),
        )
        .await);
    ok(app
        .delete("/v1/grid-intensity/2026-11/eu-west-3", &finance)
        .await);
    let issued = ok(app
        .post(
            "/v1/tokens",
            &app.admin,
            json!({"role": "reader", "projects": ["vision"], "name": "dashboards"}),
        )
        .await);
    let issued_id = issued["id"].as_str().unwrap().to_owned();
    let issued_secret = issued["token"].as_str().unwrap().to_owned();
    ok(app
        .delete(&format!("/v1/tokens/{issued_id}"), &app.admin)
        .await);
    let channel = ok(app
        .post(
            "/v1/channels",
            &app.admin,
            json!({"name": "ML", "kind": "slack",
                   "target": "https://hooks.slack.com/services/T000/B000/SECRETPART"}),
        )
        .await);
    let channel_id = channel["id"].as_str().unwrap().to_owned();
    ok(app
        .delete(&format!("/v1/channels/{channel_id}"), &app.admin)
        .await);
    ok(app
        .put(
            "/v1/pools/gpu",
            &finance,
            json!({"name": "GPU nodes", "owner_project": "vision", "share_idle": "owner"}),
        )
        .await);
    ok(app
        .put(
            "/v1/pools/gpu",
            &finance,
            json!({"name": "GPU partition", "owner_project": "vision", "share_idle": "owner"}),
        )
        .await);
    let interval = |gpus: u32| {
        json!({"node": "n1", "pool": "gpu", "gpu_model": "H100", "gpus": gpus,
               "billing_mode": "on_demand", "from": "2026-11-01T00:00:00Z",
               "until": "2026-11-02T00:00:00Z", "state": "up"})
    };
    ok(app
        .post("/v1/capacity", &ingest, json!([interval(8)]))
        .await);
    // The same interval again is a duplicate: no change, no entry.
    ok(app
        .post("/v1/capacity", &ingest, json!([interval(8)]))
        .await);
    ok(app
        .put("/v1/capacity", &app.admin, json!([interval(4)]))
        .await);
    let bill = post_bill(
        &app,
        "/v1/bills",
        FOCUS_SAMPLE.as_bytes().to_vec(),
        "text/csv",
    )
    .await;
    let bill_id = ok(bill)["bill_id"].as_str().unwrap().to_owned();
    // Records are data, not changes: ingest writes no entry; a correction does.
    app.ingest(vec![record(
        "t1",
        "2026-11-02T00:00:00Z",
        "2026-11-02T01:00:00Z",
    )])
    .await;
    ok(app
        .put(
            "/v1/projects/vision/job-records/t1/1",
            &app.admin,
            record("t1", "2026-11-02T00:00:00Z", "2026-11-02T01:00:00Z")
                .gpu_seconds_busy("1800")
                .correction(),
        )
        .await);
    ok(app
        .put(
            "/v1/projects/vision/routes/route/summarise",
            &finance,
            json!({"monthly_budget": "200"}),
        )
        .await);
    ok(app
        .delete("/v1/projects/vision/routes/route/summarise", &finance)
        .await);
    ok(app
        .put(
            "/v1/projects/vision/efficiency/regressions",
            &app.admin,
            json!({"enabled": false}),
        )
        .await);
    ok(app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-11/close",
            Some(&finance),
            None,
        )
        .await);

    let log = entries(&app, "", &finance).await;
    let made: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|e| {
            (
                e["entity"].as_str().unwrap(),
                e["action"].as_str().unwrap(),
                e["actor"]["id"].as_str().unwrap(),
            )
        })
        .collect();
    let (a, f) = (admin_id.as_str(), finance_id.as_str());
    let ingest_id = token_id(&app, &ingest).await;
    let expected = vec![
        ("token", "create", a),
        ("project", "create", a),
        ("project", "update", a),
        ("token", "create", a),
        ("budget", "create", f),
        ("budget", "update", f),
        ("contract", "create", f),
        ("contract", "update", f),
        ("contract", "create", f),
        ("contract", "delete", f),
        ("fx_rate", "create", f),
        ("fx_rate", "update", f),
        ("fx_rate", "delete", f),
        ("grid_intensity", "create", f),
        ("grid_intensity", "delete", f),
        ("token", "create", a),
        ("token", "revoke", a),
        ("channel", "create", a),
        ("channel", "delete", a),
        ("pool", "create", f),
        ("pool", "update", f),
        ("capacity_interval", "create", ingest_id.as_str()),
        ("capacity_interval", "replace", a),
        ("bill", "import", a),
        ("job_record", "correct", a),
        ("route", "create", f),
        ("route", "delete", f),
        ("efficiency_regression_rule", "create", a),
        ("month_close", "close", f),
    ];
    assert_eq!(made, expected, "{log:#?}");
    let seqs: Vec<i64> = log.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=expected.len() as i64).collect::<Vec<_>>());
    for entry in &log {
        assert_eq!(entry["actor"]["kind"], "token");
        let creates = ["create", "import", "close"].contains(&entry["action"].as_str().unwrap());
        let deletes = entry["action"] == "delete";
        assert_eq!(entry["before"].is_null(), creates, "{entry}");
        assert_eq!(entry["after"].is_null(), deletes, "{entry}");
        assert_eq!(entry["hash"].as_str().unwrap().len(), 64);
    }
    let find = |entity: &str, action: &str| {
        log.iter()
            .find(|e| e["entity"] == entity && e["action"] == action)
            .unwrap()
    };
    let names = |entity: &str| {
        log.iter()
            .filter(|e| e["entity"] == entity)
            .map(|e| e["actor"]["name"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(names("pool"), ["finance token", "finance token"]);

    let price = find("contract", "update");
    assert_eq!(price["entity_id"], contract_id.as_str());
    assert_eq!(price["before"]["price_per_gpu_hour"], "2.5");
    assert_eq!(price["after"]["price_per_gpu_hour"], "2.75");
    let owned = find("contract", "delete");
    assert_eq!(owned["before"]["tco"]["life_months"], 12);
    assert_eq!(owned["before"]["tco"]["pue"], "1.2");
    let budget = find("budget", "update");
    assert_eq!(budget["entity_id"], "vision/2026-11");
    assert_eq!(budget["before"]["amount"], "1000");
    assert_eq!(budget["after"]["amount"], "1200.5");
    let rate = find("fx_rate", "update");
    assert_eq!(rate["entity_id"], "2026-11/USD/EUR");
    assert_eq!(
        (&rate["before"]["rate"], &rate["after"]["rate"]),
        (&json!("0.92"), &json!("0.93"))
    );
    let project = find("project", "update");
    assert_eq!(project["before"]["team"], Value::Null);
    assert_eq!(project["after"]["team"], "perception");
    assert_eq!(
        project["after"]["webhook_url"],
        "https://hooks.example.com/…"
    );
    let revoked = find("token", "revoke");
    assert_eq!(revoked["entity_id"], issued_id.as_str());
    assert_eq!(revoked["before"]["revoked_at"], Value::Null);
    assert!(revoked["after"]["revoked_at"].is_string());
    assert_eq!(revoked["after"]["name"], "dashboards");
    let channel = find("channel", "create");
    assert_eq!(channel["after"]["target"], "https://hooks.slack.com/…");
    let replaced = find("capacity_interval", "replace");
    assert_eq!(replaced["entity_id"], "n1@2026-11-01T00:00:00Z");
    assert_eq!(
        (&replaced["before"]["gpus"], &replaced["after"]["gpus"]),
        (&json!(8), &json!(4))
    );
    let bill = find("bill", "import");
    assert_eq!(bill["entity_id"], bill_id.as_str());
    assert!(bill["after"]["rows"].as_i64().unwrap() > 0);
    let corrected = find("job_record", "correct");
    assert_eq!(corrected["entity_id"], "vision/t1/1");
    assert_eq!(corrected["before"]["gpu_seconds_busy"], Value::Null);
    assert_eq!(corrected["after"]["gpu_seconds_busy"], "1800");
    let close = find("month_close", "close");
    assert_eq!(close["entity_id"], "2026-11");
    assert!(close["after"]["totals"].is_array());

    // No secret is in the log: not a token's secret, a channel's URL path or a webhook's.
    let text = serde_json::to_string(&log).unwrap();
    for secret in [
        issued_secret.as_str(),
        "SECRETPART",
        "secret-path",
        "secret_sha256",
    ] {
        assert!(!text.contains(secret), "{secret} is in the log");
    }
    // Money is never a JSON number.
    for entry in &log {
        for snapshot in [&entry["before"], &entry["after"]] {
            for key in ["price_per_gpu_hour", "amount", "rate", "monthly_budget"] {
                assert!(!snapshot[key].is_number(), "{key} is a number in {entry}");
            }
        }
    }

    let verification = verify(&app).await;
    assert_eq!(
        verification,
        json!({"entries": expected.len(), "valid": true, "first_broken_seq": null})
    );
}

#[tokio::test]
async fn the_service_records_its_own_changes_as_the_system() {
    let app = TestApp::spawn().await;
    let outcome =
        taskledger::ledger::tokens::bootstrap_admin(&app.pool, Some("tl_bootstrap-secret"))
            .await
            .unwrap();
    assert!(matches!(
        outcome,
        taskledger::ledger::tokens::Bootstrap::Configured
    ));
    // A second start with the same secret changes nothing.
    taskledger::ledger::tokens::bootstrap_admin(&app.pool, Some("tl_bootstrap-secret"))
        .await
        .unwrap();
    // A new secret creates its token and revokes the previous one, in one change.
    taskledger::ledger::tokens::bootstrap_admin(&app.pool, Some("tl_another-secret"))
        .await
        .unwrap();
    let log = entries(&app, "&actor=bootstrap", &app.admin).await;
    let made: Vec<(&str, &str, &str)> = log
        .iter()
        .map(|e| {
            (
                e["actor"]["kind"].as_str().unwrap(),
                e["entity"].as_str().unwrap(),
                e["action"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        made,
        [
            ("system", "token", "create"),
            ("system", "token", "revoke"),
            ("system", "token", "create"),
        ]
    );
    assert_eq!(log[0]["entity_id"], log[1]["entity_id"]);
    assert_eq!(log[0]["after"]["name"], "bootstrap");
    assert_eq!(verify(&app).await["valid"], true);
}

#[tokio::test]
async fn a_change_that_fails_writes_no_entry() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let id = contract("H100", "on_demand", "2.50").create(&app).await;
    let before = entries(&app, "", &app.admin).await.len();

    app.post(
        "/v1/contracts",
        &app.admin,
        contract("H100", "on_demand", "-1").into(),
    )
    .await
    .problem(StatusCode::UNPROCESSABLE_ENTITY);
    // The same model, mode and scope over the same time: a conflict.
    app.post(
        "/v1/contracts",
        &app.admin,
        contract("H100", "on_demand", "3").into(),
    )
    .await
    .problem(StatusCode::CONFLICT);
    app.patch(
        &format!("/v1/contracts/{id}"),
        &app.admin,
        json!({"valid_until": "2000-01-01T00:00:00Z"}),
    )
    .await
    .problem(StatusCode::UNPROCESSABLE_ENTITY);
    app.post(
        "/v1/projects",
        &app.admin,
        json!({"id": "vision", "name": "again", "currency": "USD"}),
    )
    .await
    .problem(StatusCode::CONFLICT);
    app.put(
        "/v1/projects/nowhere/budgets/2026-11",
        &app.admin,
        json!({"amount": "5"}),
    )
    .await
    .problem(StatusCode::NOT_FOUND);
    app.delete("/v1/fx-rates/2026-11/USD/EUR", &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);
    app.put(
        "/v1/pools/gpu",
        &app.admin,
        json!({"name": "x", "owner_project": "nowhere"}),
    )
    .await
    .problem(StatusCode::UNPROCESSABLE_ENTITY);
    app.delete(&format!("/v1/tokens/{}", uuid::Uuid::new_v4()), &app.admin)
        .await
        .problem(StatusCode::NOT_FOUND);

    assert_eq!(entries(&app, "", &app.admin).await.len(), before);
    assert_eq!(verify(&app).await["valid"], true);
}

#[tokio::test]
async fn only_admin_and_finance_read_the_log() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let finance = app.token("finance", &[]).await;
    for role in ["reader", "ingest"] {
        let token = app.token(role, &["vision"]).await;
        for path in ["/v1/audit", "/v1/audit/verify", "/v1/audit?format=csv"] {
            app.get(path, &token).await.problem(StatusCode::FORBIDDEN);
        }
    }
    app.call(Method::GET, "/v1/audit", None, None)
        .await
        .problem(StatusCode::UNAUTHORIZED);
    assert_eq!(app.get("/v1/audit", &finance).await.status, StatusCode::OK);
    assert_eq!(
        app.get("/v1/audit/verify", &finance).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn filters_and_cursor_pages_select_entries() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let finance = app.token("finance", &[]).await;
    let finance_id = token_id(&app, &finance).await;
    let first = contract("H100", "on_demand", "2.50").create(&app).await;
    let second = contract("A100", "on_demand", "1.50").create(&app).await;
    for price in ["2.60", "2.70", "2.80"] {
        let path = format!("/v1/contracts/{first}");
        ok(app
            .patch(&path, &finance, json!({"price_per_gpu_hour": price}))
            .await);
    }
    let all = entries(&app, "", &app.admin).await;

    let of_first = entries(
        &app,
        &format!("&entity=contract&entity_id={first}"),
        &finance,
    )
    .await;
    assert_eq!(of_first.len(), 4);
    assert!(of_first.iter().all(|e| e["entity_id"] == first.as_str()));
    let updates = entries(&app, "&entity=contract&action=update", &finance).await;
    assert_eq!(updates.len(), 3);
    let by_finance = entries(&app, &format!("&actor={finance_id}"), &finance).await;
    assert_eq!(by_finance, updates);
    let of_second = entries(&app, &format!("&entity_id={second}"), &finance).await;
    assert_eq!(of_second.len(), 1);

    // Pages of two, each continuing after the last, make up the whole log.
    let mut paged = Vec::new();
    let mut path = "/v1/audit?limit=2".to_owned();
    loop {
        let page = app.get(&path, &finance).await.json();
        let items = page["items"].as_array().unwrap();
        assert!(items.len() <= 2);
        paged.extend(items.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(cursor) => path = format!("/v1/audit?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(paged, all);

    // A window in time: from the third entry's instant on, before the last one's.
    let at =
        |e: &Value| -> chrono::DateTime<chrono::Utc> { e["at"].as_str().unwrap().parse().unwrap() };
    let (third, last) = (at(&all[2]), at(all.last().unwrap()));
    let rfc3339 =
        |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    let windowed = entries(
        &app,
        &format!("&from={}&to={}", rfc3339(third), rfc3339(last)),
        &finance,
    )
    .await;
    assert!(!windowed.is_empty());
    assert!(windowed.iter().all(|e| at(e) >= third && at(e) < last));
    let expected: Vec<&Value> = all
        .iter()
        .filter(|e| at(e) >= third && at(e) < last)
        .collect();
    assert_eq!(windowed.iter().collect::<Vec<_>>(), expected);

    for (query, pointer) in [
        ("from=yesterday", "query:from"),
        ("to=2026-13-01T00:00:00Z", "query:to"),
        (
            "from=2026-11-02T00:00:00Z&to=2026-11-01T00:00:00Z",
            "query:to",
        ),
        ("limit=0", "query:limit"),
        ("cursor=nonsense", "query:cursor"),
        ("format=xml", "query:format"),
        ("entity=", "query:entity"),
        ("format=csv&limit=5", "query:limit"),
    ] {
        let response = app.get(&format!("/v1/audit?{query}"), &finance).await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), [pointer], "{query}");
    }
}

/// A superuser connection to the test's database, as someone with direct access to it.
async fn superuser(app: &TestApp) -> sqlx::PgConnection {
    sqlx::PgConnection::connect(&app.database_url)
        .await
        .unwrap()
}

#[tokio::test]
async fn the_log_cannot_be_changed_through_sql_and_tampering_is_named() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let id = contract("H100", "on_demand", "2.50").create(&app).await;
    for price in ["2.60", "2.70", "2.80"] {
        let path = format!("/v1/contracts/{id}");
        ok(app
            .patch(&path, &app.admin, json!({"price_per_gpu_hour": price}))
            .await);
    }
    assert_eq!(verify(&app).await["valid"], true);
    let seq_of_price = |price: &str| {
        let price = price.to_owned();
        move |entries: &Vec<Value>| {
            entries
                .iter()
                .find(|e| e["after"]["price_per_gpu_hour"] == price.as_str())
                .unwrap()["seq"]
                .as_i64()
                .unwrap()
        }
    };
    let log = entries(&app, "", &app.admin).await;
    let edited = seq_of_price("2.7")(&log);

    // The service's own connection is refused every edit.
    for statement in [
        "UPDATE audit_log SET after = '{}' WHERE seq = 1",
        "DELETE FROM audit_log WHERE seq = 1",
        "TRUNCATE audit_log",
    ] {
        let error = sqlx::query(statement).execute(&app.pool).await.unwrap_err();
        assert!(
            error.to_string().contains("append-only"),
            "{statement}: {error}"
        );
    }
    assert_eq!(entries(&app, "", &app.admin).await, log);

    if crate::common::on_citus() {
        // Citus refuses to turn a trigger off on a reference table, and each worker's copy
        // refuses the edit on its own: the tampering below cannot be done through the
        // coordinator.
        return;
    }
    // Someone who turns the trigger off and lowers a price is named.
    let mut conn = superuser(&app).await;
    sqlx::raw_sql(&format!(
        "ALTER TABLE audit_log DISABLE TRIGGER USER; \
         UPDATE audit_log SET after = jsonb_set(after, '{{price_per_gpu_hour}}', '\"0.01\"') \
         WHERE seq = {edited}; \
         ALTER TABLE audit_log ENABLE TRIGGER USER;"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(
        verify(&app).await,
        json!({"entries": log.len(), "valid": false, "first_broken_seq": edited})
    );
    // A change made after the tampering is still appended, and the break stays named.
    ok(app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"name": "later"}),
        )
        .await);
    assert_eq!(verify(&app).await["first_broken_seq"], edited);
}

#[tokio::test]
async fn a_removed_entry_is_named() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let id = contract("H100", "on_demand", "2.50").create(&app).await;
    for price in ["2.60", "2.70", "2.80"] {
        let path = format!("/v1/contracts/{id}");
        ok(app
            .patch(&path, &app.admin, json!({"price_per_gpu_hour": price}))
            .await);
    }
    let total = entries(&app, "", &app.admin).await.len() as i64;
    let mut conn = superuser(&app).await;
    let removed = sqlx::raw_sql(
        "SET session_replication_role = replica; \
         DELETE FROM audit_log WHERE seq = 3; \
         SET session_replication_role = origin;",
    )
    .execute(&mut conn)
    .await;
    if crate::common::on_citus() {
        // The coordinator's replication role does not reach the workers, whose trigger
        // refuses the removal.
        let error = removed.unwrap_err().to_string();
        assert!(error.contains("append-only"), "{error}");
        return;
    }
    removed.unwrap();
    let verification = verify(&app).await;
    assert_eq!(verification["valid"], false);
    assert_eq!(verification["first_broken_seq"], 3);
    assert_eq!(verification["entries"], total - 1);

    // The last entry removed, with the head left as it was, is missing too.
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    app.create_project("audio", "USD").await;
    let mut conn = superuser(&app).await;
    let last: i64 = sqlx::query_scalar("SELECT max(seq) FROM audit_log")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    sqlx::raw_sql(&format!(
        "SET session_replication_role = replica; \
         DELETE FROM audit_log WHERE seq = {last}; \
         SET session_replication_role = origin;"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(verify(&app).await["first_broken_seq"], last);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_each_get_one_entry_in_one_unbroken_chain() {
    let app = TestApp::spawn().await;
    let projects = ["p0", "p1", "p2", "p3"];
    for project in projects {
        app.create_project(project, "USD").await;
    }
    let mut contracts = Vec::new();
    for model in ["H100", "A100", "L4", "T4"] {
        contracts.push(contract(model, "on_demand", "1").create(&app).await);
    }
    let before = entries(&app, "", &app.admin).await.len();
    let app = std::sync::Arc::new(app);
    const WRITERS: usize = 16;
    const ROUNDS: usize = 6;
    let mut tasks = Vec::new();
    for writer in 0..WRITERS {
        let app = app.clone();
        let contracts = contracts.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let response = match (writer + round) % 3 {
                    0 => {
                        let id = &contracts[writer % contracts.len()];
                        let price = format!("{}.{writer:02}{round}", round + 1);
                        app.patch(
                            &format!("/v1/contracts/{id}"),
                            &app.admin,
                            json!({"price_per_gpu_hour": price}),
                        )
                        .await
                    }
                    1 => {
                        let to = ["EUR", "GBP", "JPY", "CHF"][writer % 4];
                        let rate = format!("0.{writer:02}{round}1");
                        app.put(
                            &format!("/v1/fx-rates/2026-11/USD/{to}"),
                            &app.admin,
                            json!({"rate": rate}),
                        )
                        .await
                    }
                    _ => {
                        let project = projects[writer % projects.len()];
                        app.patch(
                            &format!("/v1/projects/{project}"),
                            &app.admin,
                            json!({"name": format!("{project} {writer} {round}")}),
                        )
                        .await
                    }
                };
                assert!(response.status.is_success(), "{}", response.text());
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }

    let log = entries(&app, "", &app.admin).await;
    let seqs: Vec<i64> = log.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert_eq!(seqs, (1..=log.len() as i64).collect::<Vec<_>>());
    assert_eq!(log.len(), before + WRITERS * ROUNDS);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in &log[before..] {
        *counts.entry(entry["entity"].as_str().unwrap()).or_default() += 1;
    }
    let expected = |kind: usize| {
        (0..WRITERS)
            .flat_map(|w| (0..ROUNDS).map(move |r| (w + r) % 3))
            .filter(|k| *k == kind)
            .count()
    };
    assert_eq!(counts["contract"], expected(0));
    assert_eq!(counts["fx_rate"], expected(1));
    assert_eq!(counts["project"], expected(2));
    // Each FX rate was created once, then updated, each update's `before` being the rate
    // the one before it set: the row lock orders the writers of one rate.
    for to in ["EUR", "GBP", "JPY", "CHF"] {
        let of_rate: Vec<&Value> = log
            .iter()
            .filter(|e| e["entity_id"] == format!("2026-11/USD/{to}"))
            .collect();
        assert_eq!(of_rate[0]["action"], "create");
        for pair in of_rate.windows(2) {
            assert_eq!(pair[1]["action"], "update");
            assert_eq!(pair[1]["before"]["rate"], pair[0]["after"]["rate"]);
        }
    }
    for id in &contracts {
        let of_contract: Vec<&Value> = log
            .iter()
            .filter(|e| e["entity_id"] == id.as_str())
            .collect();
        for pair in of_contract.windows(2) {
            assert_eq!(
                pair[1]["before"]["price_per_gpu_hour"],
                pair[0]["after"]["price_per_gpu_hour"]
            );
        }
    }
    assert_eq!(
        verify(&app).await,
        json!({"entries": log.len(), "valid": true, "first_broken_seq": null})
    );
}

/// `cell`'s field: one leading `'` removed where the export put one.
fn field(record: &csv::StringRecord, index: usize) -> String {
    read_reversible_cell(&record[index]).to_owned()
}

fn json_string(text: &str) -> String {
    Value::String(text.to_owned()).to_string()
}

#[tokio::test]
async fn the_csv_re_hashes_to_the_same_chain() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    // A token whose name a spreadsheet would run, quoted and with a comma, makes a change.
    let named = ok(app
        .post(
            "/v1/tokens",
            &app.admin,
            json!({"role": "finance", "name": "=HYPERLINK(\"x\") 'quoted', \"ü\""}),
        )
        .await);
    let finance = named["token"].as_str().unwrap().to_owned();
    let id = contract("H100", "on_demand", "2.50").create(&app).await;
    ok(app
        .patch(
            &format!("/v1/contracts/{id}"),
            &finance,
            json!({"name": "-list, \"price\""}),
        )
        .await);
    let log = entries(&app, "", &app.admin).await;

    let request = Request::get("/v1/audit")
        .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
        .header(header::ACCEPT, "text/csv")
        .body(Body::empty())
        .unwrap();
    let response = app.send(request).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.content_type(), "text/csv; charset=utf-8");
    let mut reader = csv::Reader::from_reader(response.body.as_slice());
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        taskledger::exports::audit::COLUMNS
    );
    let mut previous = "0".repeat(64);
    let mut rows = 0;
    for (record, entry) in reader.records().zip(&log) {
        let record = record.unwrap();
        for cell in record.iter() {
            assert!(
                !cell.starts_with(['=', '+', '-', '@']),
                "{cell} opens as a formula"
            );
        }
        let hashed = format!(
            r#"{{"action":{},"actor":{{"id":{},"kind":{},"name":{}}},"after":{},"at":{},"before":{},"entity":{},"entity_id":{},"seq":{}}}"#,
            json_string(&field(&record, 5)),
            json_string(&field(&record, 3)),
            json_string(&field(&record, 2)),
            json_string(&field(&record, 4)),
            field(&record, 9),
            json_string(&record[1]),
            field(&record, 8),
            json_string(&field(&record, 6)),
            json_string(&field(&record, 7)),
            &record[0],
        );
        assert_eq!(record[10], previous);
        let mut digest = Sha256::new();
        digest.update(hex::decode(&record[10]).unwrap());
        digest.update(hashed.as_bytes());
        let hash = hex::encode(digest.finalize());
        assert_eq!(hash, record[11]);
        assert_eq!(hash, entry["hash"].as_str().unwrap());
        assert_eq!(field(&record, 4), entry["actor"]["name"].as_str().unwrap());
        previous = hash;
        rows += 1;
    }
    assert_eq!(rows, log.len());

    // The same filters as the list.
    let filtered = app
        .get(&format!("/v1/audit?format=csv&entity_id={id}"), &app.admin)
        .await;
    let lines = csv::Reader::from_reader(filtered.body.as_slice())
        .records()
        .count();
    assert_eq!(lines, 2);
}

/// Snapshots are hashed as built and verified as read back from `jsonb`: their canonical
/// form must survive PostgreSQL's normalisation (keys reordered by length, whitespace
/// dropped, numbers stored as `numeric`).
#[tokio::test]
async fn canonical_json_survives_a_jsonb_round_trip() {
    let app = TestApp::spawn().await;
    let snapshots = [
        json!({"price_per_gpu_hour": "2.50", "a": 1, "bb": [3, {"zz": null, "y": true}]}),
        json!({"é": "ü\u{1}\"\\/\n\t\u{2028}", "ä": "😀", "A": -12, "": "empty key"}),
        serde_json::from_str::<Value>(r#"{"big": 123456789012345678901234567890, "neg": -7}"#)
            .unwrap(),
        json!({"amount": rust_decimal::Decimal::new(120050, 2), "gpus": 8, "labels": {}}),
        json!([]),
    ];
    for snapshot in snapshots {
        let text = canonical_json(&snapshot);
        let back: Value = sqlx::query_scalar("SELECT $1::text::jsonb")
            .bind(&text)
            .fetch_one(&app.pool)
            .await
            .unwrap();
        assert_eq!(canonical_json(&back), text);
    }
}

/// The auditor's script of `docs/operations.md`, as written there.
fn auditor_script() -> String {
    let guide = include_str!("../../docs/operations.md");
    let start = guide
        .find("<!-- audit-recipe -->")
        .expect("the recipe's start marker");
    let end = guide
        .find("<!-- /audit-recipe -->")
        .expect("the recipe's end marker");
    let block = &guide[start..end];
    let code = block.split("```python\n").nth(1).expect("a python block");
    code.split("```").next().unwrap().to_owned()
}

/// Runs the auditor's script on `csv`; its exit status and what it printed.
fn run_auditor_script(csv: &[u8]) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("verify-audit.py");
    std::fs::write(&script, auditor_script()).unwrap();
    let dump = dir.path().join("audit.csv");
    std::fs::write(&dump, csv).unwrap();
    let output = std::process::Command::new("python3")
        .arg(&script)
        .arg(&dump)
        .output()
        .expect("python3 runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), said.trim().to_owned())
}

/// `csv` with its rows changed by `change` (rows without the header).
fn edited_csv(csv: &[u8], change: impl FnOnce(&mut Vec<Vec<String>>)) -> Vec<u8> {
    let mut reader = csv::Reader::from_reader(csv);
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let mut rows: Vec<Vec<String>> = reader
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect();
    change(&mut rows);
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(&header).unwrap();
    for row in rows {
        writer.write_record(&row).unwrap();
    }
    writer.into_inner().unwrap()
}

#[tokio::test]
async fn the_operations_guides_script_verifies_an_export_and_names_tampering() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let named = ok(app
        .post(
            "/v1/tokens",
            &app.admin,
            json!({"role": "finance", "name": "'=SUM(A1) ünïcödé, \"quoted\""}),
        )
        .await);
    let finance = named["token"].as_str().unwrap().to_owned();
    let id = contract("H100", "on_demand", "2.50").create(&app).await;
    for price in ["2.60", "2.70"] {
        let path = format!("/v1/contracts/{id}");
        ok(app
            .patch(&path, &finance, json!({"price_per_gpu_hour": price}))
            .await);
    }
    let log = entries(&app, "", &app.admin).await;
    let csv = app.get("/v1/audit?format=csv", &app.admin).await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.text());

    let (intact, said) = run_auditor_script(&csv.body);
    assert!(intact, "{said}");
    let last = log.last().unwrap()["hash"].as_str().unwrap();
    assert_eq!(
        said,
        format!("{} entries, chain intact, last hash {last}", log.len())
    );

    // The third entry's `after` lowered: named at its seq.
    let edited = edited_csv(&csv.body, |rows| {
        rows[2][9] = rows[2][9].replace("2.5", "0.01");
    });
    let (intact, said) = run_auditor_script(&edited);
    assert!(!intact);
    assert_eq!(
        said,
        "seq 3 is not what was recorded: its hash does not match"
    );
    // The second entry removed: named as missing.
    let removed = edited_csv(&csv.body, |rows| {
        rows.remove(1);
    });
    let (intact, said) = run_auditor_script(&removed);
    assert!(!intact);
    assert_eq!(said, "seq 2 is missing");
}
