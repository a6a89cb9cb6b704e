//! Capacity (COST_MODEL.md §9): every paid GPU-hour of a node lands on exactly one line —
//! a job, the node's idle or down time charged by its pool's rule — and the figures are
//! hand-computed here.

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::workers::webhooks::Webhooks;

use crate::common::{Receiver, TestApp, assert_money, cost, dec};
use crate::fixtures::{contract, record};

fn at(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

fn settings(now: &str) -> Settings {
    Settings {
        clock: Clock::Fixed(at(now)),
        ..Settings::default()
    }
}

fn interval(node: &str, pool: &str, gpus: u32, from: &str, until: &str, state: &str) -> Value {
    json!({"node": node, "pool": pool, "gpu_model": "H100", "gpus": gpus,
           "billing_mode": "on_demand", "from": from, "until": until, "state": state})
}

async fn put_pool(app: &TestApp, id: &str, body: Value) {
    let response = app.put(&format!("/v1/pools/{id}"), &app.admin, body).await;
    assert!(response.status.is_success(), "{}", response.text());
}

async fn post_capacity(app: &TestApp, intervals: Value) -> Value {
    let response = app.post("/v1/capacity", &app.admin, intervals).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

/// Projects `vision` and `speech` (USD), H100s on demand at 2.00 per GPU-hour, and two
/// pools: `train` owned by `vision` (its idle and down time is `vision`'s), with node `a`
/// (8 GPUs) up 00:00–06:00 and down 06:00–08:00 on 2 November; and `shared`, owned by
/// nobody and split by usage, with node `b` (4 GPUs) up 00:00–10:00. On `a`, `vision` ran
/// 2 GPUs for 2 hours; on `b`, `vision` ran 1 GPU for 2 hours and `speech` 3 GPUs for 1.
pub(crate) async fn two_pools() -> TestApp {
    let app = TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await;
    app.create_project("vision", "USD").await;
    app.create_project("speech", "USD").await;
    contract("H100", "on_demand", "2.00").create(&app).await;
    put_pool(
        &app,
        "train",
        json!({"name": "Training", "owner_project": "vision"}),
    )
    .await;
    put_pool(
        &app,
        "shared",
        json!({"name": "Shared", "share_idle": "by_usage"}),
    )
    .await;
    post_capacity(
        &app,
        json!([
            interval(
                "a",
                "train",
                8,
                "2026-11-02T00:00:00Z",
                "2026-11-02T06:00:00Z",
                "up"
            ),
            interval(
                "a",
                "train",
                8,
                "2026-11-02T06:00:00Z",
                "2026-11-02T08:00:00Z",
                "down"
            ),
            interval(
                "b",
                "shared",
                4,
                "2026-11-02T00:00:00Z",
                "2026-11-02T10:00:00Z",
                "up"
            ),
        ]),
    )
    .await;
    app.ingest(json!([
        record("r1", "2026-11-02T01:00:00Z", "2026-11-02T03:00:00Z")
            .gpu_count(2)
            .with("nodes", json!(["a"])),
        record("r2", "2026-11-02T00:00:00Z", "2026-11-02T02:00:00Z").with("nodes", json!(["b"])),
        record("r3", "2026-11-02T04:00:00Z", "2026-11-02T05:00:00Z")
            .project("speech")
            .gpu_count(3)
            .with("nodes", json!(["b"])),
    ]))
    .await;
    app
}

fn part(view: &Value, name: &str) -> (Decimal, Decimal) {
    (dec(&view[name]["gpu_hours"]), dec(&view[name]["cost"]))
}

#[tokio::test]
async fn every_paid_gpu_hour_is_used_idle_or_down_and_idle_is_charged_by_the_pools_rule() {
    let app = two_pools().await;
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await;
    assert_eq!(train.status, StatusCode::OK, "{}", train.text());
    let train = train.json();
    assert_eq!(train["currency"], "USD");
    assert_eq!(
        part(&train, "paid"),
        (Decimal::from(64), Decimal::from(128))
    );
    assert_eq!(part(&train, "used"), (Decimal::from(4), Decimal::from(8)));
    assert_eq!(part(&train, "idle"), (Decimal::from(44), Decimal::from(88)));
    assert_eq!(part(&train, "down"), (Decimal::from(16), Decimal::from(32)));
    assert_money(&train["idle"]["share"], "0.6875");
    assert_eq!(train["nodes"].as_array().unwrap().len(), 1);
    assert_eq!(train["nodes"][0]["node"], "a");
    assert_eq!(train["days"][0]["day"], "2026-11-02");
    assert_money(&train["days"][0]["idle_gpu_hours"], "44");
    assert_eq!(
        train["charged_to"],
        json!([{"project": "vision", "capacity_idle": "88", "capacity_down": "32"}])
    );

    let shared = app
        .get("/v1/pools/shared/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(
        part(&shared, "paid"),
        (Decimal::from(40), Decimal::from(80))
    );
    assert_eq!(part(&shared, "used"), (Decimal::from(5), Decimal::from(10)));
    assert_eq!(
        part(&shared, "idle"),
        (Decimal::from(35), Decimal::from(70))
    );
    // By usage: vision put 2 GPU-hours on `b`, speech 3.
    assert_eq!(
        shared["charged_to"],
        json!([
            {"project": "speech", "capacity_idle": "42", "capacity_down": "0"},
            {"project": "vision", "capacity_idle": "28", "capacity_down": "0"},
        ])
    );

    let vision = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(&vision["breakdown"]["capacity_idle"], "116");
    assert_money(&vision["breakdown"]["capacity_down"], "32");
    assert_money(&vision["breakdown"]["unmeasured"], "12");
    assert_money(&vision["total"], "160");
    assert_money(&vision["waste"], "148");
    let speech = cost(
        &app,
        "/v1/projects/speech/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(&speech["breakdown"]["capacity_idle"], "42");
    assert_money(&speech["total"], "48");
    // Jobs and idle and down time together are exactly what the nodes were paid.
    assert_eq!(
        dec(&vision["total"]) + dec(&speech["total"]),
        Decimal::from(128 + 80)
    );

    let by_day = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01&group_by=day",
    )
    .await;
    let days = by_day["groups"].as_array().unwrap();
    assert_eq!(days.len(), 1);
    assert_money(&days[0]["breakdown"]["capacity_idle"], "116");

    let report = app
        .get("/v1/reports/monthly/2026-11", &app.admin)
        .await
        .json();
    let pools = report["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2);
    assert!(pools.iter().all(|p| p.get("nodes").is_none()));
    let totals = &report["totals"][0];
    assert_money(&totals["projects"], "208");
    assert_money(&totals["pools"], "0");
    let csv = app
        .get("/v1/reports/monthly/2026-11?format=csv", &app.admin)
        .await
        .text();
    let header = csv.lines().next().unwrap();
    assert!(
        header.contains("unused_commitment,capacity_idle,capacity_down,waste"),
        "{header}"
    );
}

#[tokio::test]
async fn idle_kept_on_the_pools_line_is_in_the_totals_and_nobodys_breakdown() {
    let app = two_pools().await;
    put_pool(
        &app,
        "shared",
        json!({"name": "Shared", "share_idle": "pool"}),
    )
    .await;
    let report = app
        .get("/v1/reports/monthly/2026-11", &app.admin)
        .await
        .json();
    let shared = report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "shared")
        .unwrap()
        .clone();
    assert_eq!(
        shared["kept_on_pool"],
        json!({"capacity_idle": "70", "capacity_down": "0"})
    );
    let totals = &report["totals"][0];
    assert_money(&totals["pools"], "70");
    assert_money(&totals["total"], "208");
    let csv = app
        .get("/v1/reports/monthly/2026-11?format=csv", &app.admin)
        .await
        .text();
    assert!(
        csv.lines()
            .any(|line| line.starts_with("pool,2026-11,,,shared,,,USD,70.00")),
        "{csv}"
    );
}

#[tokio::test]
async fn intervals_are_idempotent_and_overlaps_are_refused_with_a_pointer() {
    let app = TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await;
    app.create_project("vision", "USD").await;
    put_pool(
        &app,
        "train",
        json!({"name": "Training", "owner_project": "vision"}),
    )
    .await;
    let first = interval(
        "a",
        "train",
        8,
        "2026-11-02T00:00:00Z",
        "2026-11-02T06:00:00Z",
        "up",
    );
    let receipt = post_capacity(&app, json!([first.clone()])).await;
    assert_eq!(
        receipt,
        json!({"inserted": 1, "duplicates": 0, "replaced": 0})
    );
    let again = post_capacity(&app, json!([first.clone()])).await;
    assert_eq!(
        again,
        json!({"inserted": 0, "duplicates": 1, "replaced": 0})
    );

    let mut changed = first.clone();
    changed["gpus"] = json!(4);
    let conflict = app
        .post("/v1/capacity", &app.admin, json!([changed.clone()]))
        .await;
    conflict.problem(StatusCode::CONFLICT);
    assert_eq!(conflict.pointers(), vec!["/0"]);
    let replaced = app.put("/v1/capacity", &app.admin, json!([changed])).await;
    assert_eq!(replaced.status, StatusCode::OK, "{}", replaced.text());
    assert_eq!(replaced.json()["replaced"], 1);

    let overlapping = interval(
        "a",
        "train",
        8,
        "2026-11-02T05:00:00Z",
        "2026-11-02T09:00:00Z",
        "up",
    );
    let response = app
        .post("/v1/capacity", &app.admin, json!([overlapping]))
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/0/from"]);
    assert!(
        response.text().contains("2026-11-02T00:00:00Z"),
        "{}",
        response.text()
    );

    // Within one body, all or nothing: the good interval is not stored either.
    let body = json!([
        interval(
            "c",
            "train",
            8,
            "2026-11-03T00:00:00Z",
            "2026-11-03T06:00:00Z",
            "up"
        ),
        interval(
            "c",
            "train",
            8,
            "2026-11-03T05:00:00Z",
            "2026-11-03T07:00:00Z",
            "down"
        ),
        interval(
            "d",
            "nowhere",
            8,
            "2026-11-03T00:00:00Z",
            "2026-11-03T06:00:00Z",
            "up"
        ),
    ]);
    let response = app.post("/v1/capacity", &app.admin, body).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/1/from"]);
    let response = app
        .post(
            "/v1/capacity",
            &app.admin,
            json!([interval(
                "d",
                "nowhere",
                8,
                "2026-11-03T00:00:00Z",
                "2026-11-03T06:00:00Z",
                "up"
            )]),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/0/pool"]);
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM capacity_intervals")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, 1);

    // An ingest token of the owner may post; one of another project may not.
    app.create_project("speech", "USD").await;
    let own = app.token("ingest", &["vision"]).await;
    let other = app.token("ingest", &["speech"]).await;
    let next = json!([interval(
        "a",
        "train",
        8,
        "2026-11-02T06:00:00Z",
        "2026-11-02T07:00:00Z",
        "up"
    )]);
    assert_eq!(
        app.post("/v1/capacity", &other, next.clone()).await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        app.post("/v1/capacity", &own, next).await.status,
        StatusCode::OK
    );

    // A pool's rule is checked, and so is its owner.
    let response = app
        .put(
            "/v1/pools/x",
            &app.admin,
            json!({"name": "x", "share_idle": "owner"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/share_idle"]);
    let response = app
        .put(
            "/v1/pools/x",
            &app.admin,
            json!({"name": "x", "owner_project": "ghost"}),
        )
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/owner_project"]);
    let response = app
        .put("/v1/pools/Bad%20Id", &app.admin, json!({"name": "x"}))
        .await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["path:id"]);
}

#[tokio::test]
async fn overbooked_and_unmatched_time_is_shown_never_dropped() {
    let app = TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.00").create(&app).await;
    put_pool(
        &app,
        "train",
        json!({"name": "Training", "owner_project": "vision"}),
    )
    .await;
    post_capacity(
        &app,
        json!([interval(
            "a",
            "train",
            2,
            "2026-11-02T00:00:00Z",
            "2026-11-02T01:00:00Z",
            "up"
        )]),
    )
    .await;
    // 3 GPUs for an hour on a 2-GPU node, then an hour on it when nothing says it is there.
    app.ingest(json!([
        record("big", "2026-11-02T00:00:00Z", "2026-11-02T01:00:00Z")
            .gpu_count(3)
            .with("nodes", json!(["a"])),
        record("late", "2026-11-02T01:00:00Z", "2026-11-02T02:00:00Z").with("nodes", json!(["a"])),
    ]))
    .await;
    let view = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(part(&view, "paid").0, Decimal::from(2));
    assert_eq!(part(&view, "used").0, Decimal::from(2));
    assert_eq!(part(&view, "idle").0, Decimal::ZERO);
    assert_eq!(part(&view, "overbooked").0, Decimal::from(1));
    assert_money(&view["unmatched_gpu_hours"], "1");
    // The jobs keep their own cost: 4 GPU-hours at 2.00.
    let vision = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(&vision["total"], "8");
}

#[tokio::test]
async fn a_reservation_pricing_capacity_reports_no_unused_commitment() {
    let app = TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await;
    app.create_project("vision", "USD").await;
    contract("A100", "reserved", "1.50")
        .project("vision")
        .committed_gpus(4)
        .valid_from("2026-11-03T00:00:00Z")
        .valid_until("2026-11-04T00:00:00Z")
        .create(&app)
        .await;
    let before = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(&before["breakdown"]["unused_commitment"], "144");
    put_pool(
        &app,
        "owned",
        json!({"name": "Owned", "owner_project": "vision"}),
    )
    .await;
    let mut node = interval(
        "c",
        "owned",
        4,
        "2026-11-03T00:00:00Z",
        "2026-11-04T00:00:00Z",
        "up",
    );
    node["gpu_model"] = json!("A100");
    node["billing_mode"] = json!("reserved");
    post_capacity(&app, json!([node])).await;
    app.ingest(json!([record(
        "t",
        "2026-11-03T10:00:00Z",
        "2026-11-03T12:00:00Z"
    )
    .gpu_model("A100")
    .billing_mode("reserved")
    .gpu_count(2)
    .with("nodes", json!(["c"]))]))
        .await;
    let after = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    // 96 GPU-hours paid at 1.50: 4 used by the job (6.00), 92 idle (138.00), no unused
    // commitment on top.
    assert_money(&after["breakdown"]["unused_commitment"], "0");
    assert_money(&after["breakdown"]["capacity_idle"], "138");
    assert_money(&after["total"], "144");
    let report = app
        .get("/v1/reports/monthly/2026-11", &app.admin)
        .await
        .json();
    assert_eq!(report["commitments"], json!([]));
}

#[tokio::test]
async fn a_price_change_is_seen_by_the_next_read_and_compaction_changes_nothing() {
    let app = two_pools().await;
    let contracts = app.get("/v1/contracts", &app.admin).await.json();
    let id = contracts["items"][0]["id"].as_str().unwrap().to_owned();
    let response = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"price_per_gpu_hour": "3.00"}),
        )
        .await;
    assert!(response.status.is_success(), "{}", response.text());
    taskledger::store::rollups::compact(&app.pool)
        .await
        .unwrap();
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(part(&train, "paid").1, Decimal::from(192));
    assert_eq!(
        part(&train, "used").1 + part(&train, "idle").1 + part(&train, "down").1,
        part(&train, "paid").1
    );
    let vision = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    let b = &vision["breakdown"];
    let parts = [
        "productive",
        "idle",
        "unmeasured",
        "failed",
        "unused_commitment",
        "capacity_idle",
        "capacity_down",
    ]
    .iter()
    .map(|name| dec(&b[name]))
    .sum::<Decimal>();
    assert_eq!(parts, dec(&vision["total"]));
    assert_money(&vision["total"], "240");
}

/// Racing writers of one node's intervals never both store overlapping time; whatever the
/// order, the pool's month equals what the stored intervals and records give when computed
/// from scratch.
#[tokio::test]
async fn racing_posts_for_one_node_store_no_overlap_and_figures_match_a_recomputation() {
    let app = std::sync::Arc::new(TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await);
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.00").create(&app).await;
    put_pool(
        &app,
        "train",
        json!({"name": "Training", "owner_project": "vision"}),
    )
    .await;
    let mut writers = Vec::new();
    for writer in 0..8u32 {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let mut stored = 0;
            for round in 0..6u32 {
                // Every writer tries hours that overlap the others' by half.
                let start = (writer + round * 8) * 30;
                let from = at("2026-11-02T00:00:00Z") + chrono::Duration::minutes(i64::from(start));
                let until = from + chrono::Duration::minutes(60);
                let body = json!([interval(
                    "a",
                    "train",
                    8,
                    &from.to_rfc3339(),
                    &until.to_rfc3339(),
                    "up"
                )]);
                let response = app.post("/v1/capacity", &app.admin, body).await;
                match response.status {
                    StatusCode::OK => stored += 1,
                    StatusCode::UNPROCESSABLE_ENTITY => {}
                    other => panic!("{other}: {}", response.text()),
                }
                if round % 2 == 0 {
                    app.ingest(json!([record(
                        &format!("w{writer}-{round}"),
                        &from.to_rfc3339(),
                        &(from + chrono::Duration::minutes(20)).to_rfc3339(),
                    )
                    .gpu_count(8)
                    .with("nodes", json!(["a"]))]))
                        .await;
                }
            }
            stored
        }));
    }
    // Finance re-prices the nodes' contract meanwhile; its last price is 3.00.
    let contract_id = app.get("/v1/contracts", &app.admin).await.json()["items"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let pricer = {
        let app = app.clone();
        tokio::spawn(async move {
            for price in ["2.10", "2.40", "2.70", "3.00"] {
                let response = app
                    .patch(
                        &format!("/v1/contracts/{contract_id}"),
                        &app.admin,
                        json!({"price_per_gpu_hour": price}),
                    )
                    .await;
                assert!(response.status.is_success(), "{}", response.text());
                tokio::task::yield_now().await;
            }
        })
    };
    let mut stored = 0;
    for writer in writers {
        stored += writer.await.unwrap();
    }
    pricer.await.unwrap();
    let price = Decimal::from(3);
    let rows: Vec<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(
        "SELECT from_at, until_at FROM capacity_intervals WHERE node = 'a' ORDER BY from_at",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), stored);
    assert!(
        rows.windows(2).all(|w| w[0].1 <= w[1].0),
        "overlap stored: {rows:?}"
    );
    // From scratch: paid is 8 GPUs over the stored time; used is each record's 20 minutes
    // of 8 GPUs (9,600 GPU-seconds, inside the hour it started in), capped per hour by the
    // hour's up time (two records in an hour half of which is known overbook it);
    // everything at the last price.
    let records: Vec<DateTime<Utc>> =
        sqlx::query_scalar("SELECT started_at FROM job_records ORDER BY started_at")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let seconds = |from: DateTime<Utc>, until: DateTime<Utc>| {
        Decimal::from((until - from).num_seconds().max(0))
    };
    let hour_of = |at: DateTime<Utc>| at - chrono::Duration::seconds(at.timestamp() % 3600);
    let mut hours: std::collections::BTreeMap<DateTime<Utc>, Decimal> = Default::default();
    for started in &records {
        *hours.entry(hour_of(*started)).or_default() += Decimal::from(9600);
    }
    let used_seconds: Decimal = hours
        .iter()
        .map(|(hour, raw)| {
            let end = *hour + chrono::Duration::hours(1);
            let up: Decimal = rows
                .iter()
                .map(|(from, until)| {
                    seconds((*from).max(*hour), (*until).min(end)) * Decimal::from(8)
                })
                .sum();
            (*raw).min(up)
        })
        .sum();
    let paid_seconds: Decimal = rows
        .iter()
        .map(|(from, until)| seconds(*from, *until) * Decimal::from(8))
        .sum();
    let hours_of = |s: Decimal| (s / Decimal::from(3600)).round_dp(20).normalize();
    let cost_of = |s: Decimal| (s * price / Decimal::from(3600)).normalize();
    let view = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_eq!(
        part(&view, "paid"),
        (hours_of(paid_seconds), cost_of(paid_seconds))
    );
    assert_eq!(
        part(&view, "used"),
        (hours_of(used_seconds), cost_of(used_seconds))
    );
    let idle_seconds = paid_seconds - used_seconds;
    assert_eq!(
        part(&view, "idle"),
        (hours_of(idle_seconds), cost_of(idle_seconds))
    );
    // The owner pays its jobs by their contract and the idle time of its node.
    let vision = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-01&to=2026-12-01",
    )
    .await;
    assert_money(
        &vision["breakdown"]["capacity_idle"],
        &cost_of(idle_seconds).to_string(),
    );
    let jobs = Decimal::from(9600 * records.len() as i64);
    assert_money(
        &vision["total"],
        &(cost_of(jobs) + cost_of(idle_seconds)).to_string(),
    );
}

/// Stores intervals as a collector that knows them at `now` would, without judging them.
async fn store_known(app: &TestApp, intervals: Value, now: &str) {
    let intervals = taskledger::domain::capacity::parse_intervals(&intervals, at(now)).unwrap();
    let collector = taskledger::domain::access::Actor::system("collector");
    taskledger::ledger::capacity::post_capacity(
        &app.pool,
        intervals,
        false,
        chrono_tz::UTC,
        &collector,
    )
    .await
    .unwrap();
}

async fn judge_at(app: &TestApp, now: &str) -> usize {
    taskledger::ledger::zombies::judge(&app.pool, None, &settings(now))
        .await
        .unwrap()
}

#[tokio::test]
async fn a_node_idle_past_its_pools_limit_fires_one_alert_per_stretch() {
    let receiver = Receiver::start(0).await;
    let app = TestApp::spawn_with(settings("2026-11-02T09:40:00Z")).await;
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "vision", "name": "Vision", "currency": "USD", "webhook_url": receiver.url}),
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    contract("H100", "on_demand", "2.00").create(&app).await;
    put_pool(
        &app,
        "train",
        json!({"name": "Training", "owner_project": "vision", "zombie_after_minutes": 120}),
    )
    .await;
    // Up since midnight; a job ran 01:00–02:00; idle since 02:00, three hours at 05:00.
    store_known(
        &app,
        json!([interval(
            "a",
            "train",
            8,
            "2026-11-02T00:00:00Z",
            "2026-11-02T05:00:00Z",
            "up"
        )]),
        "2026-11-02T05:00:00Z",
    )
    .await;
    app.ingest(json!([record(
        "t",
        "2026-11-02T01:00:00Z",
        "2026-11-02T02:00:00Z"
    )
    .with("nodes", json!(["a"]))]))
        .await;
    // The first stretch (00:00–01:00) is shorter than two hours and does not fire.
    assert_eq!(judge_at(&app, "2026-11-02T05:00:00Z").await, 1);
    assert_eq!(
        judge_at(&app, "2026-11-02T05:00:00Z").await,
        0,
        "a stretch fires once"
    );
    let alerts: Vec<(String, DateTime<Utc>)> =
        sqlx::query_as("SELECT node, since FROM alert_events WHERE kind = 'zombie_capacity'")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(alerts, vec![("a".to_owned(), at("2026-11-02T02:00:00Z"))]);

    // A late record inside the stretch splits it; the alert stays and nothing fires again.
    app.ingest(json!([record(
        "late",
        "2026-11-02T02:30:00Z",
        "2026-11-02T02:45:00Z"
    )
    .with("nodes", json!(["a"]))]))
        .await;
    store_known(
        &app,
        json!([interval(
            "a",
            "train",
            8,
            "2026-11-02T05:00:00Z",
            "2026-11-02T06:00:00Z",
            "up"
        )]),
        "2026-11-02T06:00:00Z",
    )
    .await;
    assert_eq!(judge_at(&app, "2026-11-02T06:00:00Z").await, 0);

    // A job ends the stretch; idle again for two hours after it, the node fires again.
    app.ingest(json!([record(
        "again",
        "2026-11-02T06:00:00Z",
        "2026-11-02T07:00:00Z"
    )
    .with("nodes", json!(["a"]))]))
        .await;
    store_known(
        &app,
        json!([interval(
            "a",
            "train",
            8,
            "2026-11-02T06:00:00Z",
            "2026-11-02T09:30:00Z",
            "up"
        )]),
        "2026-11-02T09:30:00Z",
    )
    .await;
    assert_eq!(judge_at(&app, "2026-11-02T09:30:00Z").await, 1);
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM alert_events WHERE kind = 'zombie_capacity'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(count, 2);

    // Idle right now (09:40, its capacity known until 09:30): since 07:00, at 16 an hour.
    let zombies = app.get("/v1/capacity/zombies", &app.admin).await;
    assert_eq!(zombies.status, StatusCode::OK, "{}", zombies.text());
    let zombies = zombies.json();
    assert_eq!(zombies.as_array().unwrap().len(), 1, "{zombies}");
    assert_eq!(zombies[0]["node"], "a");
    assert_eq!(zombies[0]["since"], "2026-11-02T07:00:00Z");
    assert_money(&zombies[0]["cost_per_hour"], "16");
    assert_money(&zombies[0]["cost_so_far"], "40");
    let other_pool = app.get("/v1/capacity/zombies?pool=other", &app.admin).await;
    assert_eq!(other_pool.json(), json!([]));

    let webhooks = Webhooks::new(
        app.pool.clone(),
        "secret".to_owned(),
        crate::alerts::quick_policy(),
    )
    .unwrap();
    for _ in 0..20 {
        webhooks.deliver_due().await.unwrap();
    }
    let bodies = receiver.bodies();
    assert_eq!(bodies.len(), 2);
    let first = bodies
        .iter()
        .map(|(_, body)| body)
        .find(|body| body["zombie_capacity"]["since"] == "2026-11-02T02:00:00Z")
        .unwrap();
    assert_eq!(first["kind"], "zombie_capacity");
    assert_eq!(first["zombie_capacity"]["node"], "a");
    assert_eq!(first["zombie_capacity"]["pool"], "train");
    assert_eq!(first["zombie_capacity"]["gpus"], 8);
    assert_money(&first["zombie_capacity"]["cost_per_hour"], "16");
    assert_money(&first["zombie_capacity"]["cost_so_far"], "48");
}

/// The FOCUS export has the idle and down time as charge lines of their own: on the project
/// charged with it, or on the pool's sub-account when the pool keeps it.
#[tokio::test]
async fn the_focus_export_bills_idle_and_down_time_to_whoever_is_charged() {
    let app = two_pools().await;
    put_pool(
        &app,
        "shared",
        json!({"name": "Shared", "share_idle": "pool"}),
    )
    .await;
    let response = app.get("/v1/exports/focus/2026-11", &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let mut reader = csv::Reader::from_reader(response.body.as_slice());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let column = |name: &str| header.iter().position(|h| h == name).unwrap();
    let rows: Vec<Vec<String>> = reader
        .records()
        .map(|r| r.unwrap().iter().map(str::to_owned).collect())
        .collect();
    let find = |sub_account: &str, description: &str| {
        rows.iter()
            .find(|r| {
                r[column("SubAccountId")] == sub_account
                    && r[column("ChargeDescription")].starts_with(description)
            })
            .unwrap_or_else(|| panic!("no {description} row for {sub_account}"))
            .clone()
    };
    let idle = find(
        "projects/vision",
        "Idle time of H100 on_demand nodes of pool train",
    );
    assert_money(&json!(idle[column("BilledCost")]), "88");
    assert_money(&json!(idle[column("PricingQuantity")]), "44");
    let down = find(
        "projects/vision",
        "Down time of H100 on_demand nodes of pool train",
    );
    assert_money(&json!(down[column("BilledCost")]), "32");
    let kept = find(
        "pools/shared",
        "Idle time of H100 on_demand nodes of pool shared",
    );
    assert_money(&json!(kept[column("BilledCost")]), "70");
    // Every paid GPU-hour once: the jobs, and the nodes' idle and down time.
    let billed: Decimal = rows
        .iter()
        .map(|r| dec(&json!(r[column("BilledCost")])))
        .sum();
    assert_eq!(billed, Decimal::from(208));
}

#[tokio::test]
async fn a_record_stored_without_nodes_and_sent_again_with_them_is_a_duplicate() {
    let app = TestApp::spawn_with(settings("2026-11-20T00:00:00Z")).await;
    app.create_project("vision", "USD").await;
    let plain = record("r1", "2026-11-02T01:00:00Z", "2026-11-02T03:00:00Z");
    app.ingest(json!([plain.clone()])).await;
    let again = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([plain.clone().with("nodes", json!(["gpu-a"]))]),
        )
        .await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(again.json()["duplicates"], 1);
    assert_eq!(again.json()["accepted"], 0);
    let stored = app
        .get("/v1/projects/vision/job-records/r1/1", &app.admin)
        .await;
    assert!(
        stored.json()["record"]
            .get("nodes")
            .is_none_or(Value::is_null)
    );
    // Changed otherwise, it is still a conflict.
    let changed = app
        .post(
            "/v1/job-records",
            &app.admin,
            json!([plain.clone().gpu_count(2).with("nodes", json!(["gpu-a"]))]),
        )
        .await;
    assert_eq!(changed.status, StatusCode::CONFLICT, "{}", changed.text());
    // Stored with nodes, sent with other nodes: a conflict.
    let placed = record("r2", "2026-11-02T01:00:00Z", "2026-11-02T03:00:00Z");
    app.ingest(json!([placed.clone().with("nodes", json!(["gpu-a"]))]))
        .await;
    for nodes in [json!(["gpu-b"]), Value::Null] {
        let body = if nodes.is_null() {
            json!([placed.clone()])
        } else {
            json!([placed.clone().with("nodes", nodes)])
        };
        let moved = app.post("/v1/job-records", &app.admin, body).await;
        assert_eq!(moved.status, StatusCode::CONFLICT, "{}", moved.text());
    }
}
