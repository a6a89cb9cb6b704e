//! The capacity rollup: what a read takes from it equals what the intervals and the rated
//! segments give when worked out from scratch, hour by hour — in a time zone with a
//! 25-hour day, with a contract changing mid-hour, a node moving pools mid-hour, multi-node,
//! overbooked and unmatched records, corrections, compaction, and writers racing.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use uuid::Uuid;

use taskledger::config::{Clock, Settings};
use taskledger::domain::capacity::{
    CapacitySeconds, NodeDay, PriceBook, ShareIdle, capacity_figures,
};
use taskledger::domain::capacity_plan::{Detail, WindowFigures};
use taskledger::domain::ledger_time::{first_of_month, month_bounds};
use taskledger::domain::what_if::WhatIf;
use taskledger::ledger::capacity::CapacityWindow;
use taskledger::store;
use taskledger::store::capacity::IntervalsOf;

use crate::common::TestApp;
use crate::fixtures::{contract, record};

const BERLIN: Tz = chrono_tz::Europe::Berlin;

fn at(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

fn settings(now: &str) -> Settings {
    Settings {
        clock: Clock::Fixed(at(now)),
        timezone: BERLIN,
        ..Settings::default()
    }
}

fn interval(node: &str, pool: &str, model: &str, from: &str, until: &str, state: &str) -> Value {
    let (gpus, mode) = if model == "H100" {
        (8, "on_demand")
    } else {
        (4, "spot")
    };
    json!({"node": node, "pool": pool, "gpu_model": model, "gpus": gpus,
           "billing_mode": mode, "from": from, "until": until, "state": state})
}

async fn put_pool(app: &TestApp, id: &str, body: Value) {
    let response = app.put(&format!("/v1/pools/{id}"), &app.admin, body).await;
    assert!(response.status.is_success(), "{}", response.text());
}

async fn post_capacity(app: &TestApp, intervals: Value) {
    let response = app.post("/v1/capacity", &app.admin, intervals).await;
    assert!(response.status.is_success(), "{}", response.text());
}

/// A deterministic stream of numbers.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

fn minutes(at: DateTime<Utc>, minutes: u64) -> DateTime<Utc> {
    at + TimeDelta::minutes(minutes as i64)
}

/// Three pools (owned, split by usage, kept) over October and November in Berlin: node
/// `a` (owned) with a down stretch; node `b` moving from `shared` to `kept` mid-hour; node
/// `c`, A100s no contract prices, known only from 8 November; H100 priced by one contract
/// until 10 November 11:30 and another after.
async fn fleet(app: &TestApp) {
    app.create_project("vision", "USD").await;
    app.create_project("speech", "USD").await;
    contract("H100", "on_demand", "2.00")
        .valid_from("2026-01-01T00:00:00Z")
        .valid_until("2026-11-10T11:30:00Z")
        .create(app)
        .await;
    contract("H100", "on_demand", "2.60")
        .valid_from("2026-11-10T11:30:00Z")
        .create(app)
        .await;
    put_pool(
        app,
        "train",
        json!({"name": "Training", "owner_project": "vision"}),
    )
    .await;
    put_pool(
        app,
        "shared",
        json!({"name": "Shared", "share_idle": "by_usage"}),
    )
    .await;
    put_pool(app, "kept", json!({"name": "Kept", "share_idle": "pool"})).await;
    post_capacity(
        app,
        json!([
            interval(
                "a",
                "train",
                "H100",
                "2026-10-20T00:00:00Z",
                "2026-11-05T10:15:00Z",
                "up"
            ),
            interval(
                "a",
                "train",
                "H100",
                "2026-11-05T10:15:00Z",
                "2026-11-05T13:45:00Z",
                "down"
            ),
            interval(
                "a",
                "train",
                "H100",
                "2026-11-05T13:45:00Z",
                "2026-11-20T00:00:00Z",
                "up"
            ),
            interval(
                "b",
                "shared",
                "H100",
                "2026-10-20T00:00:00Z",
                "2026-11-12T15:20:00Z",
                "up"
            ),
            interval(
                "b",
                "kept",
                "H100",
                "2026-11-12T15:20:00Z",
                "2026-11-20T00:00:00Z",
                "up"
            ),
            interval(
                "c",
                "kept",
                "A100",
                "2026-11-08T00:00:00Z",
                "2026-11-18T00:00:00Z",
                "up"
            ),
        ]),
    )
    .await;
}

/// Records on the nodes, in batches: one or two nodes each, up to 5 hours, some of them
/// on hours with no interval, some overbooking a node.
async fn records(app: &TestApp, seed: u64, prefix: &str, count: usize) {
    let mut lcg = Lcg(seed);
    let start = at("2026-10-24T00:00:00Z");
    let nodes = [
        json!(["a"]),
        json!(["b"]),
        json!(["c"]),
        json!(["a", "b"]),
        json!(["b", "c"]),
    ];
    let mut batch = Vec::new();
    for i in 0..count {
        let from = minutes(start, lcg.below(27 * 24 * 60));
        let until = minutes(from, 1 + lcg.below(5 * 60));
        let project = if lcg.below(3) == 0 {
            "speech"
        } else {
            "vision"
        };
        let (model, mode) = match lcg.below(5) {
            2 => ("A100", "spot"),
            _ => ("H100", "on_demand"),
        };
        let on = nodes[lcg.below(nodes.len() as u64) as usize].clone();
        batch.push(
            record(
                &format!("{prefix}{i}"),
                &from.to_rfc3339(),
                &until.to_rfc3339(),
            )
            .project(project)
            .gpu_model(model)
            .billing_mode(mode)
            .gpu_count(1 + lcg.below(8))
            .with("nodes", on),
        );
        if batch.len() == 40 {
            app.ingest(std::mem::take(&mut batch)).await;
        }
    }
    if !batch.is_empty() {
        app.ingest(batch).await;
    }
}

/// The figures of `window` worked out from scratch: every interval, every rated segment's
/// time on its nodes, hour by hour, gathered per pool, day and contract and per pool, node,
/// month and contract.
async fn from_scratch(
    app: &TestApp,
    window: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
) -> (
    WindowFigures,
    BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>,
) {
    let mut conn = app.pool.acquire().await.unwrap();
    let intervals =
        store::capacity::intervals(&mut conn, IntervalsOf::Pools(None), window.0, window.1)
            .await
            .unwrap();
    let pools = store::capacity::list_pools(&mut conn).await.unwrap();
    let owners: HashMap<String, Option<String>> = pools
        .iter()
        .map(|p| (p.id.clone(), p.owner_project.clone()))
        .collect();
    let nodes: Vec<String> = ["a", "b", "c"].map(str::to_owned).to_vec();
    let usage = store::capacity::node_usage(&mut conn, &nodes, window.0, window.1)
        .await
        .unwrap();
    let contracts: Vec<_> = store::contracts::for_kinds(
        &mut conn,
        &["H100".to_owned(), "A100".to_owned()],
        &["on_demand".to_owned(), "spot".to_owned()],
    )
    .await
    .unwrap()
    .iter()
    .map(|row| row.to_domain())
    .collect();
    let book = PriceBook {
        owners: &owners,
        contracts: &contracts,
        ..PriceBook::default()
    };
    let figures = capacity_figures(&intervals, &usage, &book, window, tz);
    let mut days: BTreeMap<(String, NaiveDate, Option<Uuid>, String), CapacitySeconds> =
        BTreeMap::new();
    let mut node_months: BTreeMap<(String, String, NaiveDate, Option<Uuid>), CapacitySeconds> =
        BTreeMap::new();
    for NodeDay {
        pool,
        node,
        gpu_model,
        day,
        month,
        contract_id,
        seconds,
        ..
    } in &figures.days
    {
        days.entry((pool.clone(), *day, *contract_id, gpu_model.clone()))
            .or_default()
            .add(seconds);
        node_months
            .entry((pool.clone(), node.clone(), *month, *contract_id))
            .or_default()
            .add(seconds);
    }
    let by_usage: Vec<String> = pools
        .iter()
        .filter(|p| p.share_idle == ShareIdle::ByUsage)
        .map(|p| p.id.clone())
        .collect();
    let weights = figures
        .usage
        .iter()
        .filter(|((pool, _), _)| by_usage.contains(pool))
        .map(|(key, shares)| (key.clone(), shares.clone()))
        .collect();
    let mut scratch = WindowFigures {
        unmatched: figures.unmatched.clone(),
        ..WindowFigures::default()
    };
    for ((pool, day, contract_id, gpu_model), seconds) in days {
        scratch
            .days
            .push(taskledger::domain::capacity_plan::PoolDay {
                pool,
                day,
                month: first_of_month(day),
                contract_id,
                billing_mode: if gpu_model == "H100" {
                    taskledger::domain::rating::BillingMode::OnDemand
                } else {
                    taskledger::domain::rating::BillingMode::Spot
                },
                gpu_model,
                seconds,
            });
    }
    for ((pool, node, month, contract_id), seconds) in node_months {
        scratch
            .nodes
            .push(taskledger::domain::capacity_plan::NodeMonth {
                pool,
                node,
                month,
                contract_id,
                gpu_model: String::new(),
                gpus: 0,
                seconds,
            });
    }
    (scratch, weights)
}

async fn read(app: &TestApp, window: (DateTime<Utc>, DateTime<Utc>), tz: Tz) -> WindowFigures {
    let mut tx = store::snapshot(&app.pool).await.unwrap();
    let capacity =
        CapacityWindow::load(&mut tx, None, window, tz, &WhatIf::default(), Detail::Nodes)
            .await
            .unwrap();
    tx.commit().await.unwrap();
    capacity.figures
}

/// The read equals the figures from scratch: per pool, day and contract, per node and
/// month, the unmatched time, and (over whole months) the `by_usage` weights.
async fn assert_read_matches_scratch(
    app: &TestApp,
    window: (DateTime<Utc>, DateTime<Utc>),
    whole_months: bool,
) -> WindowFigures {
    let read = read(app, window, BERLIN).await;
    let (scratch, weights) = from_scratch(app, window, BERLIN).await;
    let days = |figures: &WindowFigures| -> Vec<(String, NaiveDate, Option<Uuid>, String, CapacitySeconds)> {
        figures
            .days
            .iter()
            .map(|d| (d.pool.clone(), d.day, d.contract_id, d.gpu_model.clone(), d.seconds))
            .collect()
    };
    let nodes = |figures: &WindowFigures| -> Vec<(String, String, NaiveDate, Option<Uuid>, CapacitySeconds)> {
        figures
            .nodes
            .iter()
            .map(|n| (n.pool.clone(), n.node.clone(), n.month, n.contract_id, n.seconds))
            .collect()
    };
    assert_eq!(days(&read), days(&scratch), "per pool and day");
    assert_eq!(nodes(&read), nodes(&scratch), "per node and month");
    assert_eq!(read.unmatched, scratch.unmatched, "unmatched");
    if whole_months {
        assert_eq!(read.usage, weights, "by_usage weights");
    }
    read
}

#[tokio::test]
async fn the_rollup_read_equals_the_figures_worked_out_from_scratch() {
    let app = TestApp::spawn_with(settings("2026-11-25T00:00:00Z")).await;
    fleet(&app).await;
    records(&app, 7, "t", 400).await;
    let october = month_bounds(NaiveDate::from_ymd_opt(2026, 10, 1).unwrap(), BERLIN);
    let november = month_bounds(NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(), BERLIN);
    assert_eq!(
        october.1 - october.0,
        TimeDelta::hours(31 * 24 + 1),
        "October in Berlin has a 25-hour day"
    );
    assert_read_matches_scratch(&app, october, true).await;
    let read = assert_read_matches_scratch(&app, november, true).await;
    // The cases this test is for are there: down and overbooked time, time no interval
    // covers, two contracts, unpriced time, and by_usage weights.
    assert!(read.days.iter().any(|d| !d.seconds.overbooked.is_zero()));
    assert!(read.days.iter().any(|d| !d.seconds.down.is_zero()));
    assert!(!read.unmatched.is_empty());
    let contracts: std::collections::BTreeSet<Option<Uuid>> =
        read.days.iter().map(|d| d.contract_id).collect();
    assert_eq!(contracts.len(), 3, "two contracts and none");
    assert!(!read.usage.is_empty());
    // A window that cuts days, across the contract change and b's move.
    let cut = (at("2026-11-09T13:37:00Z"), at("2026-11-14T02:10:00Z"));
    assert_read_matches_scratch(&app, cut, false).await;

    // Corrections move records to other nodes and times; compaction folds the deltas.
    let mut lcg = Lcg(99);
    for i in (0..400).step_by(7) {
        let from = minutes(at("2026-11-01T00:00:00Z"), lcg.below(18 * 24 * 60));
        let mut corrected = record(
            &format!("t{i}"),
            &from.to_rfc3339(),
            &minutes(from, 30 + lcg.below(600)).to_rfc3339(),
        )
        .gpu_count(1 + lcg.below(8))
        .with(
            "nodes",
            json!([["a"], ["b"], ["c"]][lcg.below(3) as usize].clone()),
        )
        .correction();
        corrected.as_object_mut().unwrap().remove("project");
        // The record keeps its project: read it back.
        let stored = sqlx::query_scalar::<_, String>(
            "SELECT project_id FROM job_records WHERE task_id = $1",
        )
        .bind(format!("t{i}"))
        .fetch_one(&app.pool)
        .await
        .unwrap();
        let response = app
            .put(
                &format!("/v1/projects/{stored}/job-records/t{i}/1"),
                &app.admin,
                corrected,
            )
            .await;
        assert!(response.status.is_success(), "{}", response.text());
    }
    assert_read_matches_scratch(&app, november, true).await;
    store::rollups::compact(&app.pool).await.unwrap().unwrap();
    assert_eq!(
        sqlx::query_scalar::<_, i64>(
            "SELECT (SELECT count(*) FROM capacity_usage_hourly WHERE delta <> 0) \
                  + (SELECT count(*) FROM capacity_pool_days WHERE delta <> 0) \
                  + (SELECT count(*) FROM capacity_pool_weights WHERE delta <> 0)"
        )
        .fetch_one(&app.pool)
        .await
        .unwrap(),
        0
    );
    assert_read_matches_scratch(&app, november, true).await;
    assert_read_matches_scratch(&app, october, true).await;
}

type NodeDayRow = (
    String,
    NaiveDate,
    String,
    Decimal,
    Decimal,
    Vec<String>,
    Vec<Decimal>,
);

/// Every rollup row as stored, and the sums kept from them.
async fn rollup_rows(
    conn: &mut sqlx::PgConnection,
) -> (Vec<NodeDayRow>, Vec<(String, NaiveDate, Decimal)>) {
    let days = sqlx::query_as(
        "SELECT node, day, pool_id, used, overbooked, usage_projects, usage_seconds \
         FROM capacity_node_days ORDER BY node, day, pool_id",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    let unmatched = sqlx::query_as(
        "SELECT node, day, gpu_seconds FROM capacity_unmatched_days ORDER BY node, day",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    (days, unmatched)
}

async fn query_rows<T>(app: &TestApp, sql: &str) -> Vec<T>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    sqlx::query_as(sql).fetch_all(&app.pool).await.unwrap()
}

/// Writers race on the same nodes: record batches, corrections that move records between
/// nodes, capacity posts and replacements, price changes and compaction. Afterwards every
/// level of the rollup is what working it out again from the stored intervals and segments
/// gives, and so is the read.
#[tokio::test]
async fn racing_writers_leave_the_rollup_a_rebuild_from_scratch_makes() {
    let app = std::sync::Arc::new(TestApp::spawn_with(settings("2026-11-25T00:00:00Z")).await);
    fleet(&app).await;
    records(&app, 3, "s", 120).await;
    let mut writers = Vec::new();
    for writer in 0..4u64 {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            records(&app, 100 + writer, &format!("w{writer}-"), 120).await;
        }));
    }
    {
        // Corrections move the first records to other nodes and hours.
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let mut lcg = Lcg(5);
            for i in 0..60 {
                let from = minutes(at("2026-11-02T00:00:00Z"), lcg.below(17 * 24 * 60));
                let body = record(
                    &format!("s{i}"),
                    &from.to_rfc3339(),
                    &minutes(from, 10 + lcg.below(300)).to_rfc3339(),
                )
                .gpu_count(1 + lcg.below(8))
                .with(
                    "nodes",
                    json!([["a"], ["b"], ["c"], ["a", "c"]])[lcg.below(4) as usize].clone(),
                )
                .correction();
                let project: String =
                    sqlx::query_scalar("SELECT project_id FROM job_records WHERE task_id = $1")
                        .bind(format!("s{i}"))
                        .fetch_one(&app.pool)
                        .await
                        .unwrap();
                let response = app
                    .put(
                        &format!("/v1/projects/{project}/job-records/s{i}/1"),
                        &app.admin,
                        body,
                    )
                    .await;
                assert!(response.status.is_success(), "{}", response.text());
            }
        }));
    }
    {
        // Capacity grows hour by hour past 20 November, and c's interval is replaced with
        // fewer GPUs, while records land on those hours.
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            for hour in 0..12 {
                let from = at("2026-11-20T00:00:00Z") + TimeDelta::minutes(30 * hour);
                let until = from + TimeDelta::minutes(30);
                post_capacity(
                    &app,
                    json!([
                        interval(
                            "a",
                            "train",
                            "H100",
                            &from.to_rfc3339(),
                            &until.to_rfc3339(),
                            "up"
                        ),
                        interval(
                            "b",
                            "kept",
                            "H100",
                            &from.to_rfc3339(),
                            &until.to_rfc3339(),
                            "up"
                        ),
                    ]),
                )
                .await;
                if hour == 5 {
                    let mut replaced = interval(
                        "c",
                        "kept",
                        "A100",
                        "2026-11-08T00:00:00Z",
                        "2026-11-18T00:00:00Z",
                        "up",
                    );
                    replaced["gpus"] = json!(2);
                    let response = app.put("/v1/capacity", &app.admin, json!([replaced])).await;
                    assert!(response.status.is_success(), "{}", response.text());
                }
            }
        }));
    }
    {
        let app = app.clone();
        writers.push(tokio::spawn(async move {
            let contracts = app.get("/v1/contracts", &app.admin).await.json();
            let id = contracts["items"][0]["id"].as_str().unwrap().to_owned();
            for price in ["2.10", "2.20", "2.30", "2.40"] {
                let response = app
                    .patch(
                        &format!("/v1/contracts/{id}"),
                        &app.admin,
                        json!({"price_per_gpu_hour": price}),
                    )
                    .await;
                assert!(response.status.is_success(), "{}", response.text());
                store::rollups::compact(&app.pool).await.unwrap();
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }

    // The hourly level equals the rated segments spread over their records' nodes.
    let hourly: Vec<(String, String, DateTime<Utc>, Decimal)> = query_rows(
        &app,
        "SELECT project_id, node, hour, sum(gpu_seconds) FROM capacity_usage_hourly \
         GROUP BY 1, 2, 3 HAVING sum(gpu_seconds) <> 0 ORDER BY 1, 2, 3",
    )
    .await;
    let scratch: Vec<(String, String, DateTime<Utc>, Decimal)> = query_rows(
        &app,
        "SELECT s.project_id, n.node, s.hour, sum(round(s.card_seconds / cardinality(r.nodes), 20)) \
         FROM job_records r CROSS JOIN LATERAL unnest(r.nodes) AS n(node) \
         JOIN rated_segments s \
           ON (s.project_id, s.task_id, s.attempt) = (r.project_id, r.task_id, r.attempt) \
         WHERE r.nodes IS NOT NULL \
         GROUP BY 1, 2, 3 HAVING sum(round(s.card_seconds / cardinality(r.nodes), 20)) <> 0 \
         ORDER BY 1, 2, 3",
    )
    .await;
    assert!(hourly.len() > 1000, "{} node-hours", hourly.len());
    assert_eq!(hourly, scratch, "the hourly level");
    // The sums kept from the node-day rows equal the rows summed.
    let pool_days: Vec<(String, NaiveDate, Decimal, Decimal)> = query_rows(
        &app,
        "SELECT pool_id, day, sum(used), sum(overbooked) FROM capacity_pool_days \
         GROUP BY 1, 2 HAVING (sum(used), sum(overbooked)) <> (0, 0) ORDER BY 1, 2",
    )
    .await;
    let summed: Vec<(String, NaiveDate, Decimal, Decimal)> = query_rows(
        &app,
        "SELECT pool_id, day, sum(used), sum(overbooked) FROM capacity_node_days \
         GROUP BY 1, 2 HAVING (sum(used), sum(overbooked)) <> (0, 0) ORDER BY 1, 2",
    )
    .await;
    assert_eq!(pool_days, summed, "per pool and day");
    let weights: Vec<(String, NaiveDate, String, Decimal)> = query_rows(
        &app,
        "SELECT pool_id, month, project_id, sum(gpu_seconds) FROM capacity_pool_weights \
         GROUP BY 1, 2, 3 HAVING sum(gpu_seconds) <> 0 ORDER BY 1, 2, 3",
    )
    .await;
    let summed: Vec<(String, NaiveDate, String, Decimal)> = query_rows(
        &app,
        "SELECT d.pool_id, date_trunc('month', d.day)::date, u.project, sum(u.seconds) \
         FROM capacity_node_days d, unnest(d.usage_projects, d.usage_seconds) AS u(project, seconds) \
         GROUP BY 1, 2, 3 HAVING sum(u.seconds) <> 0 ORDER BY 1, 2, 3",
    )
    .await;
    assert_eq!(weights, summed, "by_usage weights");
    // The node-day rows equal those a rebuild from the intervals and the hourly level makes.
    let mut tx = app.pool.begin().await.unwrap();
    let stored = rollup_rows(&mut tx).await;
    store::capacity::lock_rollup(&mut tx).await.unwrap();
    taskledger::ledger::capacity_rollup::rebuild(&mut tx, BERLIN)
        .await
        .unwrap();
    let rebuilt = rollup_rows(&mut tx).await;
    tx.rollback().await.unwrap();
    assert!(stored.0.len() > 50, "{} node-day rows", stored.0.len());
    assert_eq!(stored, rebuilt, "the node-day rows");
    let november = month_bounds(NaiveDate::from_ymd_opt(2026, 11, 1).unwrap(), BERLIN);
    assert_read_matches_scratch(&app, november, true).await;
}
