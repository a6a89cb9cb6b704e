//! Money under concurrent change: price changes, FX changes, contracts created, moved and
//! deleted, and an owned card's TCO changed (its price, and when its depreciation ends)
//! while CI keeps posting records of the same models and months. Afterwards
//! every stored row must be what rating every record afresh stores, and every figure what
//! the cost model gives from the final contracts and rates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use chrono::NaiveDate;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::domain::rating::{BillingMode, rate_record};
use taskledger::domain::record::RecordKey;
use taskledger::ledger::rating;
use taskledger::store;

use crate::common::{TestApp, dec};
use crate::fixtures::{contract, record};
use crate::rollups::rated_state;

const NOVEMBER: &str = "/cost?month=2026-11&group_by=day";

/// The `i`-th batch of CI's: twenty records of H100 on demand, A100 spot and owned
/// (reserved) A100 for `vision` (USD) and H100 on demand for `euro` (EUR), across November.
fn batch(i: usize) -> Value {
    let records: Vec<_> = (0..20)
        .map(|j| {
            let day = 1 + (i * 7 + j) % 29;
            let hour = (i + j * 5) % 20;
            let started = format!("2026-11-{day:02}T{hour:02}:00:00Z");
            let ended = format!("2026-11-{day:02}T{:02}:30:00Z", hour + 3);
            let task = format!("b{i}-r{j}");
            let base = record(&task, &started, &ended).gpu_count((j % 4 + 1) as u32);
            let base = match j % 3 {
                0 => base,
                // Half the owned cards' records measured their energy (300 W a GPU).
                1 if j % 4 == 0 => base
                    .gpu_model("A100")
                    .billing_mode("reserved")
                    .with("energy_joules", 12_600 * 300 * (j % 4 + 1)),
                1 if j % 2 == 0 => base.gpu_model("A100").billing_mode("reserved"),
                1 => base.gpu_model("A100").billing_mode("spot"),
                _ => base.project("euro"),
            };
            match j % 4 {
                0 => base.gpu_seconds_busy(3600),
                1 => base.outcome("failed"),
                _ => base,
            }
        })
        .collect();
    serde_json::to_value(records).unwrap()
}

/// An owned A100 priced by its TCO, depreciated from 10 November 2026.
fn owned_a100() -> Value {
    json!({
        "name": "owned A100", "gpu_model": "A100", "billing_mode": "reserved",
        "currency": "USD", "valid_from": "2026-10-01T00:00:00Z",
        "tco": {
            "purchase_price_per_gpu": "15000", "salvage_value_per_gpu": "1860",
            "life_months": 12, "in_service_from": "2025-11-10T00:00:00Z",
            "power_kw_per_gpu": "0.5", "electricity_price_per_kwh": "0.25", "pue": "1.2",
            "other_per_gpu_month": "73"
        }
    })
}

/// Each kind of change, in turn: a price, an FX rate, a contract created and deleted, a
/// contract's validity moved, and the owned card's electricity price and in-service date
/// (which moves where its price drops).
async fn change(
    app: &TestApp,
    round: usize,
    (standing, owned): (&str, &str),
    scoped: &mut Option<String>,
) {
    let ok = |response: crate::common::TestResponse, what: &str| {
        assert!(
            response.status.is_success(),
            "{what}: {} {}",
            response.status,
            response.text()
        );
    };
    match round % 6 {
        0 => {
            let price = format!("2.{:02}", 10 + round % 80);
            let response = app
                .patch(
                    &format!("/v1/contracts/{standing}"),
                    &app.admin,
                    json!({"price_per_gpu_hour": price}),
                )
                .await;
            ok(response, "re-pricing");
        }
        1 => {
            let rate = format!("0.9{}", round % 10);
            let response = app
                .put(
                    "/v1/fx-rates/2026-11/USD/EUR",
                    &app.admin,
                    json!({"rate": rate}),
                )
                .await;
            ok(response, "an FX rate");
        }
        2 => match scoped.take() {
            None => {
                let response = app
                    .post(
                        "/v1/contracts",
                        &app.admin,
                        contract("A100", "spot", format!("1.{}", round % 10))
                            .named("A100 spot")
                            .valid_from("2026-11-05T00:00:00Z")
                            .valid_until("2026-11-25T00:00:00Z")
                            .into(),
                    )
                    .await;
                assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
                *scoped = Some(response.json()["id"].as_str().unwrap().to_owned());
            }
            Some(id) => {
                let response = app.delete(&format!("/v1/contracts/{id}"), &app.admin).await;
                ok(response, "deleting a contract");
            }
        },
        3 => {
            let from = format!("2026-11-{:02}T00:00:00Z", 1 + round % 20);
            let response = app
                .post(
                    "/v1/contracts",
                    &app.admin,
                    contract("H100", "on_demand", "3.00")
                        .named("vision H100")
                        .project("vision")
                        .valid_from(&from)
                        .into(),
                )
                .await;
            assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
            let id = response.json()["id"].as_str().unwrap().to_owned();
            let moved = format!("2026-11-{:02}T00:00:00Z", 3 + round % 20);
            let response = app
                .patch(
                    &format!("/v1/contracts/{id}"),
                    &app.admin,
                    json!({"valid_from": moved}),
                )
                .await;
            ok(response, "moving a contract's validity");
            let response = app.delete(&format!("/v1/contracts/{id}"), &app.admin).await;
            ok(response, "deleting a contract");
        }
        5 => {
            let in_service = format!("2025-11-{:02}T06:00:00Z", 1 + round % 28);
            let electricity = format!("0.{}", 20 + round % 30);
            let response = app
                .patch(
                    &format!("/v1/contracts/{owned}"),
                    &app.admin,
                    json!({"tco": {"in_service_from": in_service}}),
                )
                .await;
            ok(response, "moving where an owned card's price drops");
            let response = app
                .patch(
                    &format!("/v1/contracts/{owned}"),
                    &app.admin,
                    json!({"tco": {"electricity_price_per_kwh": electricity}}),
                )
                .await;
            ok(response, "an owned card's electricity price");
        }
        _ => {
            let response = app.delete("/v1/fx-rates/2026-11/USD/EUR", &app.admin).await;
            ok(response, "deleting an FX rate");
            let response = app
                .put(
                    "/v1/fx-rates/2026-11/USD/EUR",
                    &app.admin,
                    json!({"rate": "0.93"}),
                )
                .await;
            ok(response, "an FX rate");
        }
    }
}

/// What a reader sees: each project's November by day, and its tasks.
async fn figures(app: &TestApp) -> BTreeMap<String, Value> {
    let mut figures = BTreeMap::new();
    for project in ["vision", "euro"] {
        let cost = app
            .get(&format!("/v1/projects/{project}{NOVEMBER}"), &app.admin)
            .await;
        assert_eq!(cost.status, StatusCode::OK, "{}", cost.text());
        let mut cost = cost.json();
        cost.as_object_mut().unwrap().remove("as_of");
        figures.insert(format!("{project} cost"), cost);
        let tasks = app
            .get(
                &format!("/v1/projects/{project}/tasks?month=2026-11&limit=1000"),
                &app.admin,
            )
            .await;
        assert_eq!(tasks.status, StatusCode::OK, "{}", tasks.text());
        figures.insert(format!("{project} tasks"), tasks.json());
    }
    figures
}

/// Every record rated again from scratch, in one transaction.
async fn rate_everything_again(app: &TestApp) {
    let rows: Vec<(String, String, i32, i64)> = sqlx::query_as(
        "SELECT project_id, task_id, attempt, \
                ceil(extract(epoch FROM ended_at - started_at) / 3600)::bigint + 2 \
         FROM job_records ORDER BY 1, 2, 3",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let keys: Vec<(RecordKey, i64)> = rows
        .into_iter()
        .map(|(project, task_id, attempt, bound)| {
            let key = RecordKey {
                project,
                task_id,
                attempt,
            };
            (key, bound)
        })
        .collect();
    let mut tx = app.pool.begin().await.unwrap();
    rating::hold_contract_sets(
        &mut tx,
        [
            ("H100".to_owned(), BillingMode::OnDemand),
            ("A100".to_owned(), BillingMode::Spot),
            ("A100".to_owned(), BillingMode::Reserved),
        ],
    )
    .await
    .unwrap();
    let touched = rating::rate_in_bounded_calls(&mut tx, &keys, chrono_tz::UTC, false)
        .await
        .unwrap();
    taskledger::ledger::capacity_rollup::refresh_rated(&mut tx, touched, chrono_tz::UTC)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Each project's cost of November as the pure cost model gives it from the stored
/// records, the contracts and the FX rates, segment by segment.
async fn oracle_totals(app: &TestApp) -> BTreeMap<String, Decimal> {
    let mut conn = app.pool.acquire().await.unwrap();
    let tasks: Vec<(String, String)> =
        sqlx::query_as("SELECT DISTINCT project_id, task_id FROM job_records ORDER BY 1, 2")
            .fetch_all(&mut *conn)
            .await
            .unwrap();
    let tasks: Vec<(&str, &str)> = tasks
        .iter()
        .map(|(p, t)| (p.as_str(), t.as_str()))
        .collect();
    let attempts = store::rating::load_attempts(&mut conn, &tasks)
        .await
        .unwrap();
    let contracts: Vec<_> = store::contracts::for_kinds(
        &mut conn,
        &["H100".to_owned(), "A100".to_owned(), "A100".to_owned()],
        &[
            "on_demand".to_owned(),
            "spot".to_owned(),
            "reserved".to_owned(),
        ],
    )
    .await
    .unwrap()
    .iter()
    .map(store::contracts::ContractRow::to_domain)
    .collect();
    let november = NaiveDate::from_ymd_opt(2026, 11, 1).unwrap();
    let fx = store::fx_rates::table(
        &mut conn,
        november,
        november,
        &["USD".to_owned(), "EUR".to_owned()],
    )
    .await
    .unwrap();
    let mut totals: BTreeMap<String, Decimal> = BTreeMap::new();
    for attempt in &attempts {
        let telemetry = attempt.telemetry.to_telemetry();
        let record = attempt.to_rate(&telemetry);
        for segment in rate_record(&record, &contracts, &fx, chrono_tz::UTC) {
            if segment.month == november {
                *totals.entry(attempt.project_id.clone()).or_default() +=
                    segment.cost.unwrap_or_default();
            }
        }
    }
    totals
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changes_racing_ingest_leave_every_figure_as_rating_from_scratch_gives() {
    let app = Arc::new(TestApp::spawn().await);
    app.create_project("vision", "USD").await;
    app.create_project("euro", "EUR").await;
    let standing = contract("H100", "on_demand", "2.00")
        .named("H100 on demand")
        .create(&app)
        .await;
    let owned = app.post("/v1/contracts", &app.admin, owned_a100()).await;
    assert_eq!(owned.status, StatusCode::CREATED, "{}", owned.text());
    let owned = owned.json()["id"].as_str().unwrap().to_owned();
    let response = app
        .put(
            "/v1/fx-rates/2026-11/USD/EUR",
            &app.admin,
            json!({"rate": "0.92"}),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());

    let changing = Arc::new(AtomicBool::new(true));
    let ci = {
        let (app, changing) = (app.clone(), changing.clone());
        tokio::spawn(async move {
            let mut posted = 0;
            while changing.load(Ordering::SeqCst) || posted < 40 {
                let response = app.post("/v1/job-records", &app.admin, batch(posted)).await;
                assert_eq!(response.status, StatusCode::OK, "{}", response.text());
                posted += 1;
            }
            posted
        })
    };
    let mut scoped = None;
    for round in 0..42 {
        change(&app, round, (&standing, &owned), &mut scoped).await;
    }
    changing.store(false, Ordering::SeqCst);
    let posted = ci.await.unwrap();
    assert!(posted >= 40);

    let stored = rated_state(&app).await;
    let read = figures(&app).await;
    let oracle = oracle_totals(&app).await;
    for project in ["vision", "euro"] {
        let total = dec(&read[&format!("{project} cost")]["total"]);
        let expected = oracle[project];
        assert!(
            (total - expected).abs() < Decimal::new(1, 12),
            "{project}: read {total}, the cost model gives {expected}"
        );
    }
    rate_everything_again(&app).await;
    assert_eq!(
        rated_state(&app).await,
        stored,
        "a record kept an assignment that no longer holds"
    );
    assert_eq!(figures(&app).await, read);
}
