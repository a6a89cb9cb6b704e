//! The monthly report for finance: the worked example as JSON and CSV, safe CSV cells, month
//! close and prior-period adjustments.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};

use crate::common::{TestApp, TestResponse, assert_money};
use crate::fixtures::{contract, record, worked_example};

/// December 2nd: October and November have ended.
async fn app_in_december() -> TestApp {
    TestApp::spawn_with(Settings {
        clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    })
    .await
}

async fn report(app: &TestApp, path: &str) -> TestResponse {
    let response = app.get(path, &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response
}

fn csv_rows(response: &TestResponse) -> Vec<Vec<String>> {
    let mut reader = csv::Reader::from_reader(response.body.as_slice());
    reader
        .records()
        .map(|row| row.unwrap().iter().map(str::to_owned).collect())
        .collect()
}

fn row<'a>(rows: &'a [Vec<String>], kind: &str, project: &str) -> &'a Vec<String> {
    rows.iter()
        .find(|r| r[0] == kind && r[3] == project)
        .unwrap_or_else(|| panic!("no {kind} row for {project:?} in {rows:?}"))
}

#[tokio::test]
async fn the_worked_example_as_json_and_csv() {
    let app = app_in_december().await;
    worked_example(&app).await;
    let json = report(&app, "/v1/reports/monthly/2026-11").await.json();
    assert_eq!(json["month"], "2026-11");
    assert_eq!(json["closed"], false);
    let vision = &json["projects"][0];
    assert_eq!(vision["project"], "vision");
    assert_money(&vision["total"], "84.60");
    assert_money(&vision["breakdown"]["failed"], "14.40");
    assert_eq!(vision["tasks_completed"], 4);
    assert_money(&vision["cost_per_completed_task"], "21.15");
    assert_eq!(json["shared"][0]["currency"], "USD");
    assert_money(&json["shared"][0]["unused_commitment"], "1430");
    assert_eq!(
        json["totals"],
        json!([{"currency": "USD", "projects": vision["total"], "shared": json["shared"][0]["unused_commitment"], "pools": "0", "adjustments": "0", "total": json["totals"][0]["total"]}])
    );
    assert_money(&json["totals"][0]["total"], "1514.60");

    let csv = report(&app, "/v1/reports/monthly/2026-11?format=csv").await;
    assert_eq!(csv.content_type(), "text/csv; charset=utf-8");
    let rows = csv_rows(&csv);
    let vision = row(&rows, "project", "vision");
    assert_eq!(
        &vision[7..17],
        [
            "USD", "84.60", "37.00", "9.00", "24.20", "14.40", "0.00", "0.00", "0.00", "23.40"
        ]
    );
    assert_eq!(vision[20], "4");
    assert_eq!(vision[22], "21.15");
    let shared = row(&rows, "shared", "");
    assert_eq!(shared[8], "1430.00");
    let total = row(&rows, "total", "");
    assert_eq!((total[7].as_str(), total[8].as_str()), ("USD", "1514.60"));

    let by_accept = app
        .send(
            Request::builder()
                .uri("/v1/reports/monthly/2026-11")
                .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
                .header(header::ACCEPT, "text/csv")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(
        by_accept.body, csv.body,
        "Accept: text/csv is the same as ?format=csv"
    );
}

/// Finance's view of commitments: every reserved contract, shared or the project's own, with
/// what it committed and used; and each project's forecast next to its burn.
#[tokio::test]
async fn the_report_shows_each_commitment_used_and_each_projects_forecast() {
    let app = app_in_december().await;
    worked_example(&app).await;
    contract("A100", "reserved", "1.00")
        .named("own")
        .valid_from("2026-11-10T00:00:00Z")
        .valid_until("2026-11-12T00:00:00Z")
        .committed_gpus(2)
        .project("vision")
        .create(&app)
        .await;
    let json = report(&app, "/v1/reports/monthly/2026-11").await.json();
    let lines: Vec<(Value, Value, String, String, String, String)> = json["commitments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let text = |field: &str| c[field].as_str().unwrap().to_owned();
            (
                c["name"].clone(),
                c["project"].clone(),
                text("committed_gpu_hours"),
                text("used_gpu_hours"),
                text("unused_gpu_hours"),
                text("unused_commitment"),
            )
        })
        .collect();
    // R4 ran its 10 GPU-hours on the project's own reservation, which is more specific
    // than C4: C4 went wholly unused over November's 720 hours.
    let owned = |s: &str| s.to_owned();
    assert_eq!(
        lines,
        [
            (
                json!("C4"),
                Value::Null,
                owned("1440"),
                owned("0"),
                owned("1440"),
                owned("1440")
            ),
            (
                json!("own"),
                json!("vision"),
                owned("96"),
                owned("10"),
                owned("86"),
                owned("86")
            ),
        ]
    );
    assert_eq!(json["commitments"][0]["committed_gpus"], "2");
    assert_eq!(json["ends_at"], "2026-12-01T00:00:00Z");
    assert_eq!(json["as_of"], json["ends_at"], "November has ended");
    let vision = &json["projects"][0];
    // November has ended: the forecast is what was spent.
    assert_eq!(vision["forecast"], vision["total"]);
    assert_eq!(vision["forecast_pct"], Value::Null, "no budget");

    let budgeted = app
        .put(
            "/v1/projects/vision/budgets/2026-11",
            &app.admin,
            json!({"amount": "200"}),
        )
        .await;
    assert_eq!(budgeted.status, StatusCode::OK);
    let json = report(&app, "/v1/reports/monthly/2026-11").await.json();
    assert_eq!(
        json["projects"][0]["forecast_pct"],
        json["projects"][0]["burn_pct"]
    );
}

#[tokio::test]
async fn totals_are_rounded_from_unrounded_sums() {
    let app = app_in_december().await;
    for id in ["a", "b", "c"] {
        app.create_project(id, "USD").await;
    }
    app.post(
        "/v1/contracts",
        &app.admin,
        contract("H100", "on_demand", "0.015").named("odd").into(),
    )
    .await;
    // Each project: one GPU-hour at 0.015 → 0.015, shown 0.02 (half-even); 3 × 0.015 = 0.045 → 0.04.
    for id in ["a", "b", "c"] {
        app.ingest([record("t", "2026-11-03T00:00:00Z", "2026-11-03T01:00:00Z").project(id)])
            .await;
    }
    let rows = csv_rows(&report(&app, "/v1/reports/monthly/2026-11?format=csv").await);
    assert_eq!(row(&rows, "project", "a")[8], "0.02");
    assert_eq!(
        row(&rows, "total", "")[8],
        "0.04",
        "not 0.06, the sum of rounded rows"
    );
}

#[tokio::test]
async fn formula_like_names_and_labels_arrive_as_text() {
    let app = app_in_december().await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "evil", "name": "=cmd|' /C calc'!A0", "team": "@team", "currency": "USD"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED);
    app.post(
        "/v1/contracts",
        &app.admin,
        contract("H100", "on_demand", "2").named("list").into(),
    )
    .await;
    app.ingest([record("t", "2026-11-03T00:00:00Z", "2026-11-03T01:00:00Z")
        .project("evil")
        .label("pipeline", "=HYPERLINK(\"x\")")])
        .await;
    let csv = report(
        &app,
        "/v1/reports/monthly/2026-11?format=csv&group_by=label:pipeline",
    )
    .await;
    let rows = csv_rows(&csv);
    let project = row(&rows, "project", "evil");
    assert_eq!(project[4], "'=cmd|' /C calc'!A0");
    assert_eq!(project[5], "'@team");
    let group = row(&rows, "group", "evil");
    assert_eq!(group[6], "'=HYPERLINK(\"x\")");
    assert_eq!(group[8], "2.00");
    for line in csv.text().lines() {
        for cell in csv::ReaderBuilder::new()
            .has_headers(false)
            .from_reader(line.as_bytes())
            .records()
            .flatten()
            .next()
            .unwrap()
            .iter()
        {
            assert!(
                !cell.starts_with(['=', '+', '@']),
                "{cell} would run as a formula"
            );
        }
    }
}

#[tokio::test]
async fn closing_october_freezes_it_and_a_late_record_becomes_a_november_adjustment() {
    let app = app_in_december().await;
    worked_example(&app).await;
    let finance = app.token("finance", &[]).await;

    let closed = app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-10/close",
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text());
    assert_eq!(closed.json()["closed"], true);
    app.call(
        Method::POST,
        "/v1/reports/monthly/2026-10/close",
        Some(&finance),
        None,
    )
    .await
    .problem(StatusCode::CONFLICT);
    app.call(
        Method::POST,
        "/v1/reports/monthly/2026-12/close",
        Some(&finance),
        None,
    )
    .await
    .problem(StatusCode::CONFLICT);

    let october_json = report(&app, "/v1/reports/monthly/2026-10").await.body;
    let october_csv = report(&app, "/v1/reports/monthly/2026-10?format=csv")
        .await
        .body;
    assert_money(
        &serde_json::from_slice::<Value>(&october_json).unwrap()["projects"][0]["total"],
        "5.00",
    );

    // A late October record: 2 H100 GPU-hours on demand at 2.50.
    let late = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([record("late", "2026-10-20T10:00:00Z", "2026-10-20T11:00:00Z").gpu_count(2)]),
        )
        .await;
    assert_eq!(
        late.json()["accepted"],
        1,
        "records of a closed month are still accepted"
    );

    assert_eq!(
        report(&app, "/v1/reports/monthly/2026-10").await.body,
        october_json,
        "October's JSON is frozen"
    );
    assert_eq!(
        report(&app, "/v1/reports/monthly/2026-10?format=csv")
            .await
            .body,
        october_csv,
        "October's CSV is byte-identical"
    );

    let november = report(&app, "/v1/reports/monthly/2026-11").await.json();
    let adjustments = november["adjustments"].as_array().unwrap();
    assert_eq!(adjustments.len(), 1, "{adjustments:?}");
    assert_eq!(adjustments[0]["project"], "vision");
    assert_eq!(adjustments[0]["belongs_to"], "2026-10");
    assert_money(&adjustments[0]["total"], "5.00");
    assert_money(&adjustments[0]["unmeasured"], "5.00");
    assert_money(&november["projects"][0]["total"], "84.60");
    assert_money(&november["totals"][0]["adjustments"], "5.00");
    assert_money(&november["totals"][0]["total"], "1519.60");
    let rows = csv_rows(&report(&app, "/v1/reports/monthly/2026-11?format=csv").await);
    let adjustment = row(&rows, "adjustment", "vision");
    assert_eq!(
        (adjustment[2].as_str(), adjustment[8].as_str()),
        ("2026-10", "5.00")
    );

    // Once November is closed with the adjustment, it is not booked again in December.
    let closed = app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-11/close",
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text());
    let december = report(&app, "/v1/reports/monthly/2026-12").await.json();
    assert_eq!(december["adjustments"], json!([]));
}

#[tokio::test]
async fn reports_are_for_finance_and_check_their_parameters() {
    let app = app_in_december().await;
    app.create_project("vision", "USD").await;
    let reader = app.token("reader", &["vision"]).await;
    app.get("/v1/reports/monthly/2026-11", &reader)
        .await
        .problem(StatusCode::FORBIDDEN);
    app.call(
        Method::POST,
        "/v1/reports/monthly/2026-10/close",
        Some(&reader),
        None,
    )
    .await
    .problem(StatusCode::FORBIDDEN);
    let bad = app
        .get("/v1/reports/monthly/2026-13?format=xls", &app.admin)
        .await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    let finance = app.token("finance", &[]).await;
    assert_eq!(
        app.get("/v1/reports/monthly/2026-11", &finance)
            .await
            .status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_report_command_prints_the_same_report() {
    let app = app_in_december().await;
    worked_example(&app).await;
    let closed = app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-10/close",
            Some(&app.admin),
            None,
        )
        .await;
    assert_eq!(closed.status, StatusCode::OK);
    for format in ["csv", "json"] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .args([
                "--database-url",
                &app.database_url,
                "report",
                "--month",
                "2026-10",
                "--format",
                format,
            ])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let http = report(
            &app,
            &format!("/v1/reports/monthly/2026-10?format={format}"),
        )
        .await;
        assert_eq!(
            String::from_utf8_lossy(&output.stdout).trim_end(),
            http.text().trim_end()
        );
    }
}

/// The report reads its commitments on a second connection while the projects' sums are read
/// on the first: both must see one snapshot, whatever commits in between, and a pool with no
/// connection to spare leaves the report on its first connection alone.
#[tokio::test]
async fn the_second_connection_of_a_report_sees_the_first_ones_snapshot() {
    let app = app_in_december().await;
    worked_example(&app).await;
    let (projects, records) = (
        "SELECT count(*) FROM projects",
        "SELECT count(*) FROM job_records",
    );
    let mut snapshot = taskledger::store::snapshot(&app.pool).await.unwrap();
    async fn count(conn: &mut sqlx::PgConnection, sql: &str) -> i64 {
        sqlx::query_scalar(sql).fetch_one(conn).await.unwrap()
    }
    let before = (
        count(&mut snapshot, projects).await,
        count(&mut snapshot, records).await,
    );
    let mut aside = taskledger::store::snapshot_aside(&app.pool, &mut snapshot)
        .await
        .unwrap()
        .expect("the pool has a connection to spare");
    app.create_project("late", "USD").await;
    let late = record("late", "2026-11-20T00:00:00Z", "2026-11-20T01:00:00Z");
    let stored = app.post("/v1/job-records", &app.admin, json!([late])).await;
    assert_eq!(stored.status, StatusCode::OK, "{}", stored.text());
    let mut now = app.pool.acquire().await.unwrap();
    assert_eq!(
        (
            count(&mut now, projects).await,
            count(&mut now, records).await
        ),
        (before.0 + 1, before.1 + 1),
        "the project and the record were stored"
    );
    drop(now);
    // On Citus the exported snapshot is the coordinator's, which holds the reference tables
    // (`projects`); the second connection reads the workers (`job_records`) on snapshots of
    // its own, which is why a report gives it statements of reference tables alone.
    assert_eq!(
        count(&mut aside, projects).await,
        before.0,
        "the second connection reads the first one's snapshot"
    );
    if !crate::common::on_citus() {
        assert_eq!(count(&mut aside, records).await, before.1);
    }
    drop(aside);

    // Every other connection of the pool taken: no second connection, and no wait for one.
    let mut taken = Vec::new();
    while let Ok(Ok(conn)) =
        tokio::time::timeout(std::time::Duration::from_millis(200), app.pool.acquire()).await
    {
        taken.push(conn);
    }
    let aside = taskledger::store::snapshot_aside(&app.pool, &mut snapshot)
        .await
        .unwrap();
    assert!(aside.is_none());
    drop(taken);
    snapshot.commit().await.unwrap();
}
