//! What-if prices (COST_MODEL §12) on the worked example, prices that apply when read after
//! a month was closed, and re-assignments a stopped service or a failed run left owing.

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::domain::rating::BillingMode;
use taskledger::store::rating::KindSpan;

use crate::common::{TestApp, assert_money, cost};
use crate::fixtures::{NOVEMBER, record, worked_example};

async fn app_in_december() -> TestApp {
    TestApp::spawn_with(Settings {
        clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    })
    .await
}

async fn close_october(app: &TestApp, finance: &str) {
    let closed = app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-10/close",
            Some(finance),
            None,
        )
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text());
}

fn get_ok(response: crate::common::TestResponse) -> Value {
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

#[tokio::test]
async fn cost_answers_at_what_if_prices_and_stores_nothing() {
    let app = app_in_december().await;
    let [c1, ..] = worked_example(&app).await;
    let real = cost(&app, NOVEMBER).await;
    assert_money(&real["total"], "84.60");
    assert!(real.get("hypothetical").is_none(), "{real}");

    // C1 at 3.50: R1's 8 GPU-hours before the 15th and R6's 2 November hours cost 10 more.
    let dearer = cost(&app, &format!("{NOVEMBER}&what_if={c1}:3.50")).await;
    assert_money(&dearer["total"], "94.60");
    assert_money(&dearer["breakdown"]["productive"], "43.00");
    assert_eq!(dearer["hypothetical"], true);
    assert_eq!(
        dearer["overrides"],
        json!([{"contract": c1, "gpu_model": null, "billing_mode": null,
                "price_per_gpu_hour": "3.5"}])
    );

    // H100 spot at 1.00 prices R2 and R3's 28 GPU-hours 5.60 lower; a B200 price rates R5.
    let what_if = "what_if=H100/spot:1.00&what_if=B200/on_demand:4";
    let kinds = cost(&app, &format!("{NOVEMBER}&{what_if}&group_by=gpu_model")).await;
    assert_money(&kinds["total"], "83.00");
    assert_money(&kinds["unrated_gpu_seconds"], "0");
    let b200 = kinds["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == "B200")
        .expect("a B200 group");
    assert_money(&b200["total"], "4");

    // Nothing was stored: the real figures read as before.
    assert_eq!(cost(&app, NOVEMBER).await, real);
}

#[tokio::test]
async fn bad_what_if_prices_are_refused_naming_the_parameter() {
    let app = app_in_december().await;
    worked_example(&app).await;
    for bad in ["H100:2", "H100/hourly:2", "H100/spot:-1", "nonsense"] {
        let response = app
            .get(&format!("{NOVEMBER}&what_if={bad}"), &app.admin)
            .await;
        let problem = response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            problem["errors"][0]["pointer"], "query:what_if",
            "{bad}: {problem}"
        );
    }
    let tasks = app
        .get(
            "/v1/projects/vision/tasks?month=2026-11&what_if=A100/spot",
            &app.admin,
        )
        .await;
    tasks.problem(StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn tasks_and_the_report_answer_at_what_if_prices() {
    let app = app_in_december().await;
    let [c1, _, _, c4] = worked_example(&app).await;
    let tasks = get_ok(
        app.get(
            &format!("/v1/projects/vision/tasks?month=2026-11&what_if={c1}:3.50"),
            &app.admin,
        )
        .await,
    );
    assert_eq!(tasks["hypothetical"], true);
    let t1 = tasks["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["task_id"] == "t1")
        .unwrap();
    // 8 GPU-hours at 3.50 and 8 at C2's 2.00; t1 is now the costliest task.
    assert_money(&t1["total"], "44");
    assert_money(&t1["final_cost"], "44");
    assert_eq!(tasks["items"][0]["task_id"], "t1");

    let finance = app.token("finance", &[]).await;
    let report = get_ok(
        app.get(
            &format!("/v1/reports/monthly/2026-11?what_if={c4}:2"),
            &finance,
        )
        .await,
    );
    assert_eq!(report["hypothetical"], true);
    // R4's 10 GPU-hours on C4 cost 10 more.
    assert_money(&report["projects"][0]["total"], "94.60");
    // C4's 1430 unused GPU-hours at 2.
    assert_money(&report["shared"][0]["unused_commitment"], "2860");

    // A closed month answers what-if prices from its rated data, and stays frozen.
    close_october(&app, &finance).await;
    let frozen = get_ok(app.get("/v1/reports/monthly/2026-10", &finance).await);
    let what_if = get_ok(
        app.get(
            &format!("/v1/reports/monthly/2026-10?what_if={c1}:5"),
            &finance,
        )
        .await,
    );
    assert_money(&what_if["projects"][0]["total"], "10");
    assert_eq!(what_if["closed"], false);
    assert_eq!(
        get_ok(app.get("/v1/reports/monthly/2026-10", &finance).await),
        frozen
    );
}

#[tokio::test]
async fn a_price_change_after_close_is_booked_as_an_adjustment() {
    let app = app_in_december().await;
    let [c1, ..] = worked_example(&app).await;
    let finance = app.token("finance", &[]).await;
    close_october(&app, &finance).await;
    // R6's October half, 2 GPU-hours, moves from 2.50 to 3.00 an hour.
    let patched = app
        .patch(
            &format!("/v1/contracts/{c1}"),
            &app.admin,
            json!({"price_per_gpu_hour": "3.00"}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.text());
    let october = get_ok(app.get("/v1/reports/monthly/2026-10", &finance).await);
    assert_money(&october["projects"][0]["total"], "5.00");
    let november = get_ok(app.get("/v1/reports/monthly/2026-11", &finance).await);
    let adjustments = november["adjustments"].as_array().unwrap();
    assert_eq!(adjustments.len(), 1, "{adjustments:?}");
    assert_eq!(adjustments[0]["belongs_to"], "2026-10");
    assert_money(&adjustments[0]["total"], "1");
}

/// An app with 2 H100 GPUs over two hours of November, and a 3.00 contract for them stored
/// with the re-assignment it owes, as a change does, by a service stopped before it ran it:
/// the hours are still unrated. Returns the job's id.
async fn owing_a_reassignment(app: &TestApp) -> uuid::Uuid {
    app.create_project("vision", "USD").await;
    app.ingest([record("t", "2026-11-03T00:00:00Z", "2026-11-03T02:00:00Z").gpu_count(2)])
        .await;
    let mut tx = app.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, \
                                valid_from) \
         VALUES (gen_random_uuid(), 'late', 'H100', 'on_demand', 3.00, 'USD', \
                 '2026-01-01T00:00:00Z')",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    let of = KindSpan {
        gpu_model: "H100".to_owned(),
        billing_mode: BillingMode::OnDemand,
        project: None,
        span: ("2026-01-01T00:00:00Z".parse().unwrap(), None),
    };
    let job = taskledger::ledger::rating::owe_reassignment(&mut tx, &of)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let owing = cost(app, NOVEMBER).await;
    assert_money(&owing["unrated_gpu_seconds"], "14400");
    job.id
}

async fn jobs_owed(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM rerating_jobs")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_reassignment_left_owing_is_finished_at_the_next_start() {
    let app = TestApp::spawn().await;
    owing_a_reassignment(&app).await;

    taskledger::ledger::setup::prepare(&app.pool, chrono_tz::UTC)
        .await
        .unwrap();
    let done = cost(&app, NOVEMBER).await;
    assert_money(&done["total"], "12");
    assert_money(&done["unrated_gpu_seconds"], "0");
    assert_eq!(jobs_owed(&app).await, 0);
}

#[tokio::test]
async fn a_reassignment_runs_on_one_replica_at_a_time_and_the_worker_finishes_it() {
    let app = TestApp::spawn().await;
    let job = owing_a_reassignment(&app).await;

    // Another replica is running the job: a turn here leaves it to that one.
    let mut elsewhere = app.pool.begin().await.unwrap();
    let claimed = taskledger::store::rating::claim_job(&mut elsewhere, job, false)
        .await
        .unwrap();
    assert!(claimed.is_some());
    let ran = taskledger::ledger::rating::finish_pending_jobs(&app.pool, chrono_tz::UTC)
        .await
        .unwrap();
    assert_eq!(ran, 0);
    assert_eq!(jobs_owed(&app).await, 1);
    assert_money(&cost(&app, NOVEMBER).await["unrated_gpu_seconds"], "14400");

    // That replica stops without finishing it: the worker of this one does.
    elsewhere.rollback().await.unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(taskledger::workers::reassignment::run(
        app.pool.clone(),
        chrono_tz::UTC,
        std::time::Duration::from_millis(20),
        async move {
            let _ = stopped.await;
        },
    ));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while jobs_owed(&app).await > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the worker did not finish the job"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    stop.send(()).unwrap();
    worker.await.unwrap();
    let done = cost(&app, NOVEMBER).await;
    assert_money(&done["total"], "12");
    assert_money(&done["unrated_gpu_seconds"], "0");
}
