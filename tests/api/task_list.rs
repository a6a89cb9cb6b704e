//! The per-task ledger over HTTP: the worked example's tasks and one task's attempts, paging
//! that neither repeats nor skips a task, filters, CSV, and the law that a period's tasks add
//! up to the project's total less its unused commitment.

use std::collections::BTreeSet;

use axum::http::StatusCode;
use base64::Engine;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::store::rollups;

use crate::common::{TestApp, assert_money, cost, dec};
use crate::fixtures::{contract, record, worked_example};
use crate::tasks::{random_contracts, random_records};

/// Every task of a list, page by page through `next_cursor`, `limit` at a time.
async fn all_pages(app: &TestApp, path: &str, limit: u32) -> Vec<Value> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut url = format!("{path}&limit={limit}");
        if let Some(cursor) = &cursor {
            url.push_str(&format!("&cursor={cursor}"));
        }
        let response = app.get(&url, &app.admin).await;
        assert_eq!(
            response.status,
            StatusCode::OK,
            "{url}: {}",
            response.text()
        );
        let page = response.json();
        let page_items = page["items"].as_array().unwrap();
        assert!(page_items.len() <= limit as usize);
        items.extend(page_items.iter().cloned());
        match page["next_cursor"].as_str() {
            Some(next) => {
                assert!(
                    !page_items.is_empty(),
                    "a page with a next cursor has items"
                );
                cursor = Some(next.to_owned());
            }
            None => return items,
        }
    }
}

fn ids(items: &[Value]) -> Vec<&str> {
    items
        .iter()
        .map(|item| item["task_id"].as_str().unwrap())
        .collect()
}

fn task<'a>(items: &'a [Value], id: &str) -> &'a Value {
    items
        .iter()
        .find(|item| item["task_id"] == id)
        .unwrap_or_else(|| panic!("no task {id}"))
}

#[tokio::test]
async fn the_worked_example_task_by_task() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let response = app
        .get("/v1/projects/vision/tasks?month=2026-11", &app.admin)
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let page = response.json();
    assert_eq!(page["next_cursor"], Value::Null);
    let items = page["items"].as_array().unwrap();
    // Costliest first; t4 cost nothing (no contract prices a B200).
    assert_eq!(ids(items), ["t1", "t2", "t3", "t5", "t4"]);
    let totals: Vec<(&str, Decimal)> = items
        .iter()
        .map(|i| (i["task_id"].as_str().unwrap(), dec(&i["total"])))
        .collect();
    let d = |raw: &str| raw.parse::<Decimal>().unwrap();
    assert_eq!(
        totals,
        [
            ("t1", d("36")),
            ("t2", d("33.6")),
            ("t3", d("10")),
            ("t5", d("5")),
            ("t4", d("0"))
        ]
    );

    let t2 = task(items, "t2");
    assert_eq!(t2["status"], "completed");
    assert_eq!(t2["completed_at"], "2026-11-20T14:00:00Z");
    assert_eq!(
        (t2["attempts"].as_i64(), t2["failed_attempts"].as_i64()),
        (Some(2), Some(1))
    );
    assert_eq!(
        (t2["retries"].as_i64(), t2["failures"].as_i64()),
        (Some(1), Some(1))
    );
    assert_money(&t2["breakdown"]["failed"], "14.40");
    assert_money(&t2["breakdown"]["unmeasured"], "19.20");
    assert_money(&t2["waste"], "14.40");
    assert_money(&t2["final_cost"], "33.60");
    assert_eq!(dec(&t2["cost_per_unit"]), d("0.0000336"));
    assert_eq!(
        t2["output"],
        json!([{"unit": "tokens", "quantity": "1000000"}])
    );
    assert_eq!(t2["gpu_models"], json!(["H100"]));
    assert_eq!(t2["currency"], "USD");
    assert_eq!(t2["queue_wait_seconds"], Value::Null);

    let t1 = task(items, "t1");
    assert_money(&t1["breakdown"]["productive"], "27.00");
    assert_money(&t1["breakdown"]["idle"], "9.00");
    assert_eq!(dec(&t1["gpu_seconds_held"]), d("57600"));
    assert_eq!(dec(&t1["gpu_seconds_busy"]), d("43200"));

    // t5 ran from October's last hour: November holds half of it, its final cost both.
    let t5 = task(items, "t5");
    assert_money(&t5["total"], "5.00");
    assert_money(&t5["final_cost"], "10.00");
    assert_eq!(t5["first_started_at"], "2026-10-31T23:00:00Z");

    let t4 = task(items, "t4");
    assert_eq!(t4["status"], "failed");
    assert_eq!(t4["final_cost"], Value::Null);
    assert_eq!(t4["cost_per_unit"], Value::Null);
    assert_eq!(dec(&t4["unrated_gpu_seconds"]), d("3600"));

    // The tasks add up to the project less its unused commitment.
    let project = cost(&app, crate::fixtures::NOVEMBER).await;
    let sum: Decimal = items.iter().map(|i| dec(&i["total"])).sum();
    assert_eq!(
        sum,
        dec(&project["total"]) - dec(&project["breakdown"]["unused_commitment"])
    );
    assert_money(&json!(sum.to_string()), "84.60");

    // October holds only t5's first half; it has not ended there.
    let october = app
        .get("/v1/projects/vision/tasks?month=2026-10", &app.admin)
        .await
        .json();
    let october = october["items"].as_array().unwrap();
    assert_eq!(ids(october), ["t5"]);
    assert_money(&october[0]["total"], "5.00");
    assert_eq!(october[0]["attempts"], 0);
    assert_money(&october[0]["final_cost"], "10.00");
}

#[tokio::test]
async fn a_task_attempt_by_attempt() {
    let app = TestApp::spawn().await;
    let [_, _, c3, _] = worked_example(&app).await;
    let response = app.get("/v1/projects/vision/tasks/t2", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let t2 = response.json();
    assert_eq!(t2["status"], "completed");
    assert_money(&t2["final_cost"], "33.60");
    assert_money(&t2["lifetime"]["total"], "33.60");
    assert_eq!(t2["lifetime"]["attempts"], 2);
    assert_eq!(t2["lifetime"]["failed_attempts"], 1);
    let months = t2["months"].as_array().unwrap();
    assert_eq!(months.len(), 1);
    assert_eq!(months[0]["month"], "2026-11");
    assert_money(&months[0]["total"], "33.60");

    let attempts = t2["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    let (first, second) = (&attempts[0], &attempts[1]);
    assert_eq!(
        (first["attempt"].as_i64(), first["outcome"].as_str()),
        (Some(1), Some("preempted"))
    );
    assert_eq!(first["completes_task"], false);
    assert_money(&first["total"], "14.40");
    assert_money(&first["breakdown"]["failed"], "14.40");
    assert_eq!(second["outcome"], "completed");
    assert_eq!(second["completes_task"], true);
    assert_money(&second["total"], "19.20");
    assert_money(&second["breakdown"]["unmeasured"], "19.20");
    assert_eq!(
        second["output"],
        json!({"unit": "tokens", "quantity": "1000000"})
    );
    for attempt in attempts {
        let contracts = attempt["contracts"].as_array().unwrap();
        assert_eq!(contracts.len(), 1, "{attempt}");
        assert_eq!(contracts[0]["contract_id"], c3.as_str());
        assert_eq!(contracts[0]["name"], "C3");
        assert_eq!(
            dec(&contracts[0]["price_per_gpu_hour"]),
            Decimal::new(12, 1)
        );
        assert_eq!(contracts[0]["cost"], attempt["total"]);
        assert_eq!(attempt["unrated"], json!([]));
    }

    // t1 changed contract at midnight of the 15th: both priced it.
    let t1 = app
        .get("/v1/projects/vision/tasks/t1", &app.admin)
        .await
        .json();
    let used: Vec<(&str, Decimal)> = t1["attempts"][0]["contracts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["name"].as_str().unwrap(), dec(&c["cost"])))
        .collect();
    assert_eq!(used, [("C1", Decimal::from(20)), ("C2", Decimal::from(16))]);
    assert_money(&t1["cost_per_unit"], "0.000018");

    // No contract prices t4's B200: its hour is unrated, with the reason.
    let t4 = app
        .get("/v1/projects/vision/tasks/t4", &app.admin)
        .await
        .json();
    assert_eq!(t4["status"], "failed");
    assert_eq!(t4["final_cost"], Value::Null);
    assert_eq!(t4["attempts"][0]["fails_task"], true);
    assert_eq!(
        t4["attempts"][0]["unrated"],
        json!([{"reason": "no_contract", "gpu_seconds": "3600"}])
    );

    // t5's lifetime spans October and November.
    let t5 = app
        .get("/v1/projects/vision/tasks/t5", &app.admin)
        .await
        .json();
    let months: Vec<(&str, Decimal)> = t5["months"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["month"].as_str().unwrap(), dec(&m["total"])))
        .collect();
    assert_eq!(
        months,
        [("2026-10", Decimal::from(5)), ("2026-11", Decimal::from(5))]
    );
    assert_money(&t5["final_cost"], "10.00");

    let missing = app.get("/v1/projects/vision/tasks/nope", &app.admin).await;
    missing.problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn queue_wait_per_attempt_and_per_task() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.00").create(&app).await;
    app.ingest([
        record("q", "2026-11-12T00:00:00Z", "2026-11-12T01:00:00Z")
            .queued_at("2026-11-11T23:45:00Z")
            .outcome("failed"),
        record("q", "2026-11-12T02:00:00Z", "2026-11-12T03:00:00Z")
            .attempt(2)
            .queued_at("2026-11-12T01:59:30Z"),
        record("q", "2026-11-12T04:00:00Z", "2026-11-12T05:00:00Z").attempt(3),
    ])
    .await;
    let list = app
        .get("/v1/projects/vision/tasks?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(
        dec(&list["items"][0]["queue_wait_seconds"]),
        Decimal::from(930)
    );
    let detail = app
        .get("/v1/projects/vision/tasks/q", &app.admin)
        .await
        .json();
    let waits: Vec<Value> = detail["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["queue_wait_seconds"].clone())
        .collect();
    assert_eq!(waits, [json!("900"), json!("30"), Value::Null]);
    assert_eq!(
        dec(&detail["lifetime"]["queue_wait_seconds"]),
        Decimal::from(930)
    );
    // Sorted by queue wait, the task that waited comes before one that reported none.
    app.ingest([record("r", "2026-11-13T00:00:00Z", "2026-11-13T01:00:00Z")])
        .await;
    let by_wait = app
        .get(
            "/v1/projects/vision/tasks?month=2026-11&sort=queue_wait",
            &app.admin,
        )
        .await
        .json();
    assert_eq!(ids(by_wait["items"].as_array().unwrap()), ["q", "r"]);
}

/// Pages of every sort, both orders and three kinds of period list each task once, in the
/// order the sort names, and add up to the project's figures less its unused commitment.
#[tokio::test]
async fn pages_list_every_task_once_and_add_up() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let on_demand = random_contracts(&app).await;
    app.ingest(random_records(5)).await;
    // Ties on cost: tasks that cost exactly the same.
    app.ingest([
        record("tie-a", "2026-11-05T00:00:00Z", "2026-11-05T01:00:00Z"),
        record("tie-b", "2026-11-05T00:00:00Z", "2026-11-05T01:00:00Z"),
        record("tie-c", "2026-11-05T00:00:00Z", "2026-11-05T01:00:00Z"),
    ])
    .await;
    let periods = [
        "month=2026-11",
        "from=2026-11-10&to=2026-11-11",
        "from=2026-11-03T05:00:00Z&to=2026-11-17T19:00:00Z",
    ];
    let check = |stage: &'static str| {
        let app = &app;
        async move {
            for period in periods {
                let base = format!("/v1/projects/vision/tasks?{period}");
                let whole = all_pages(app, &base, 1000).await;
                let expected: BTreeSet<&str> = ids(&whole).into_iter().collect();
                assert_eq!(expected.len(), whole.len(), "{stage} {period}");
                let project = cost(
                    app,
                    &format!("/v1/projects/vision/cost?{period}&as_of=2027-01-01T00:00:00Z"),
                )
                .await;
                let sum: Decimal = whole.iter().map(|i| dec(&i["total"])).sum();
                assert_eq!(
                    sum,
                    dec(&project["total"]) - dec(&project["breakdown"]["unused_commitment"]),
                    "{stage} {period}"
                );
                let held: Decimal = whole.iter().map(|i| dec(&i["gpu_seconds_held"])).sum();
                assert_eq!(held, dec(&project["gpu_seconds_held"]), "{stage} {period}");
                for sort in ["cost", "waste", "gpu_hours", "queue_wait", "started_at"] {
                    for order in ["desc", "asc"] {
                        let path = format!("{base}&sort={sort}&order={order}");
                        let paged = all_pages(app, &path, 4).await;
                        let listed = ids(&paged);
                        let unique: BTreeSet<&str> = listed.iter().copied().collect();
                        assert_eq!(listed.len(), unique.len(), "{stage} {path}: a task repeats");
                        assert_eq!(unique, expected, "{stage} {path}: a task is missing");
                        let key = |item: &Value| match sort {
                            "cost" => dec(&item["total"]),
                            "waste" => dec(&item["waste"]),
                            "gpu_hours" => dec(&item["gpu_seconds_held"]),
                            "queue_wait" => item["queue_wait_seconds"]
                                .as_str()
                                .map_or(Decimal::ZERO, |s| s.parse().unwrap()),
                            _ => Decimal::from(
                                chrono::DateTime::parse_from_rfc3339(
                                    item["first_started_at"].as_str().unwrap(),
                                )
                                .unwrap()
                                .timestamp(),
                            ),
                        };
                        for pair in paged.windows(2) {
                            let (a, b) = (key(&pair[0]), key(&pair[1]));
                            let (ida, idb) = (&pair[0]["task_id"], &pair[1]["task_id"]);
                            let in_order = match order {
                                "desc" => a > b || (a == b && ida.as_str() < idb.as_str()),
                                _ => a < b || (a == b && ida.as_str() > idb.as_str()),
                            };
                            assert!(in_order, "{stage} {path}: {ida} then {idb}");
                        }
                    }
                }
            }
        }
    };
    check("rated").await;
    rollups::compact(&app.pool).await.unwrap().unwrap();
    check("compacted").await;
    let repriced = app
        .patch(
            &format!("/v1/contracts/{on_demand}"),
            &app.admin,
            json!({"price_per_gpu_hour": "5.40"}),
        )
        .await;
    assert_eq!(repriced.status, StatusCode::OK, "{}", repriced.text());
    check("repriced").await;
}

#[tokio::test]
async fn filters_narrow_the_list() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let listed = |query: &'static str| {
        let app = &app;
        async move {
            let response = app
                .get(
                    &format!("/v1/projects/vision/tasks?month=2026-11&{query}"),
                    &app.admin,
                )
                .await;
            assert_eq!(
                response.status,
                StatusCode::OK,
                "{query}: {}",
                response.text()
            );
            let page = response.json();
            let mut ids: Vec<String> = ids(page["items"].as_array().unwrap())
                .into_iter()
                .map(str::to_owned)
                .collect();
            ids.sort();
            ids
        }
    };
    assert_eq!(listed("status=failed").await, ["t4"]);
    assert_eq!(listed("status=completed").await, ["t1", "t2", "t3", "t5"]);
    assert_eq!(listed("gpu_model=A100").await, ["t3"]);
    assert_eq!(listed("label.team=perception").await, ["t1", "t2"]);
    assert_eq!(
        listed("label.team=perception&gpu_model=A100").await,
        Vec::<String>::new()
    );
    assert_eq!(listed("label.team=search&status=completed").await, ["t3"]);
    assert_eq!(listed("label.nobody=x").await, Vec::<String>::new());
}

#[tokio::test]
async fn bad_queries_name_the_parameter() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    app.create_project("other", "USD").await;
    let base = "/v1/projects/vision/tasks?month=2026-11";
    for (query, pointer) in [
        ("&sort=price", "query:sort"),
        ("&order=up", "query:order"),
        ("&status=running", "query:status"),
        ("&limit=0", "query:limit"),
        ("&cursor=xyz", "query:cursor"),
        ("&colour=red", "query:colour"),
        ("&format=xml", "query:format"),
        ("&label.=x", "query:label."),
        ("&month=2026-12", "query:month"),
    ] {
        let response = app.get(&format!("{base}{query}"), &app.admin).await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), [pointer], "{query}");
    }
    let response = app.get("/v1/projects/vision/tasks", &app.admin).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["query:from"]);

    // A cursor continues only the list it came from.
    let first = app
        .get(&format!("{base}&sort=cost&limit=2"), &app.admin)
        .await
        .json();
    let cursor = first["next_cursor"].as_str().unwrap();
    for other in [
        format!("{base}&sort=waste&cursor={cursor}"),
        format!("{base}&sort=cost&order=asc&cursor={cursor}"),
        format!("{base}&status=completed&cursor={cursor}"),
        format!("/v1/projects/vision/tasks?month=2026-10&cursor={cursor}"),
    ] {
        let response = app.get(&other, &app.admin).await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), ["query:cursor"], "{other}");
    }
    let next = app
        .get(
            &format!("{base}&sort=cost&limit=2&cursor={cursor}"),
            &app.admin,
        )
        .await;
    assert_eq!(next.status, StatusCode::OK);
    assert_eq!(ids(next.json()["items"].as_array().unwrap()), ["t3", "t5"]);

    // A cursor whose position was altered is refused, whatever the list is sorted by, and
    // so is one whose position is not a plain finite number.
    for sort in ["cost", "waste", "gpu_hours", "queue_wait", "started_at"] {
        let first = app
            .get(&format!("{base}&sort={sort}&limit=1"), &app.admin)
            .await
            .json();
        let cursor = first["next_cursor"].as_str().unwrap();
        let mut decoded: Value = serde_json::from_slice(
            &base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(cursor)
                .unwrap(),
        )
        .unwrap();
        for bad in [
            "abc",
            "",
            "0x10",
            "1_000",
            "NaN",
            "inf",
            "1e400",
            "-Infinity",
        ] {
            decoded["after"]["value"] = json!(bad);
            let altered = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(serde_json::to_vec(&decoded).unwrap());
            let response = app
                .get(
                    &format!("{base}&sort={sort}&limit=1&cursor={altered}"),
                    &app.admin,
                )
                .await;
            response.problem(StatusCode::UNPROCESSABLE_ENTITY);
            assert_eq!(response.pointers(), ["query:cursor"], "{sort}: {bad:?}");
        }
    }

    // A reader of another project sees neither the list nor a task.
    let reader = app.token("reader", &["other"]).await;
    for path in [base, "/v1/projects/vision/tasks/t1"] {
        app.get(path, &reader).await.problem(StatusCode::NOT_FOUND);
    }
    let own = app.token("reader", &["vision"]).await;
    assert_eq!(app.get(base, &own).await.status, StatusCode::OK);
    assert_eq!(
        app.get("/v1/projects/vision/tasks/t1", &own).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn the_list_as_csv() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    app.ingest([record(
        "=HYPERLINK(\"x\")",
        "2026-11-22T00:00:00Z",
        "2026-11-22T01:00:00Z",
    )
    .gpu_count(8)])
        .await;
    let request = axum::http::Request::get("/v1/projects/vision/tasks?month=2026-11&limit=3")
        .header("authorization", format!("Bearer {}", app.admin))
        .header("accept", "text/csv")
        .body(axum::body::Body::empty())
        .unwrap();
    let response = app.send(request).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.content_type(), "text/csv; charset=utf-8");
    let cursor = response.headers["x-next-cursor"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut reader = csv::Reader::from_reader(response.body.as_slice());
    let header = reader.headers().unwrap().clone();
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let column = |row: &csv::StringRecord, name: &str| {
        row[header.iter().position(|h| h == name).unwrap()].to_owned()
    };
    let listed: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| {
            (
                column(r, "task_id"),
                column(r, "total"),
                column(r, "final_cost"),
            )
        })
        .collect();
    assert_eq!(
        listed,
        [
            ("t1".into(), "36.00".into(), "36.00".into()),
            ("t2".into(), "33.60".into(), "33.60".into()),
            // 8 H100s for an hour at 2.00 under C2.
            ("'=HYPERLINK(\"x\")".into(), "16.00".into(), "16.00".into()),
        ]
    );
    assert_eq!(column(&rows[1], "output"), "tokens=1000000");
    assert_eq!(column(&rows[1], "completed_at"), "2026-11-20T14:00:00Z");
    assert_eq!(column(&rows[1], "cost_per_unit"), "0.0000336");
    assert_eq!(column(&rows[1], "failed"), "14.40");

    let rest = app
        .get(
            &format!("/v1/projects/vision/tasks?month=2026-11&limit=3&format=csv&cursor={cursor}"),
            &app.admin,
        )
        .await;
    assert_eq!(rest.status, StatusCode::OK, "{}", rest.text());
    assert!(!rest.headers.contains_key("x-next-cursor"));
    let rest: Vec<String> = csv::Reader::from_reader(rest.body.as_slice())
        .records()
        .map(|r| r.unwrap()[0].to_owned())
        .collect();
    assert_eq!(rest, ["t3", "t5", "t4"]);
}
