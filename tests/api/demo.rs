//! The demo: loaded through the use cases into a fresh database, it shows through the API
//! what it promises — five projects over a complete month and the month so far, budgets
//! crossed at 50, 80 and 100 %, failed and preempted attempts, retried tasks, a reserved
//! contract in use with some of it unused, and tokens of each role.

use std::collections::BTreeMap;
use std::time::Instant;

use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

use taskledger::config::{Clock, Settings};
use taskledger::ledger::LedgerError;
use taskledger::ledger::demo::{self, Loaded};
use taskledger::ledger::regressions;

use crate::common::{TestApp, dec};

/// The demo's "now": twenty days into November 2026, so October is complete.
const UNTIL: &str = "2026-11-20T12:00:00Z";

fn until() -> DateTime<Utc> {
    UNTIL.parse().unwrap()
}

async fn demo_app() -> (TestApp, Loaded) {
    let settings = Settings {
        clock: Clock::Fixed(until()),
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    let started = Instant::now();
    let loaded = demo::load(&app.pool, until(), &settings).await.unwrap();
    eprintln!(
        "demo loaded in {:.1} s: {} records",
        started.elapsed().as_secs_f64(),
        loaded.records.accepted
    );
    (app, loaded)
}

fn items(response: &Value) -> &Vec<Value> {
    response["items"].as_array().expect("a page")
}

#[tokio::test]
async fn the_demo_shows_every_part_of_the_ledger() {
    let (app, loaded) = demo_app().await;
    let finance = loaded.tokens.finance.token.clone();
    assert_eq!(loaded.window.previous.to_string(), "2026-10");
    assert_eq!(loaded.window.current.to_string(), "2026-11");
    assert!(loaded.records.accepted > 5_000, "{:?}", loaded.records);
    assert!(loaded.records.problems.is_empty());
    assert_eq!(loaded.records.duplicates, 0);
    for reason in ["no GPU", "never scheduled"] {
        assert!(loaded.records.skipped[reason] > 0, "{reason}");
    }

    let projects = app.get("/v1/projects", &finance).await.json();
    let currencies: BTreeMap<String, String> = items(&projects)
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["currency"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(currencies.len(), 5);
    assert_eq!(currencies["speech"], "EUR");

    // October, complete: each project's burn is near its target, so the thresholds crossed
    // are known, and exactly those alerts fired.
    let mut crossed = BTreeMap::new();
    for (project, budget) in &loaded.budgets {
        let burn = app
            .get(
                &format!("/v1/projects/{}/burn?month=2026-10", project.id),
                &finance,
            )
            .await;
        assert_eq!(burn.status, StatusCode::OK, "{}", burn.text());
        let burn = burn.json();
        assert_eq!(dec(&burn["budget"]), *budget);
        let pct = dec(&burn["burn_pct"]);
        let target = Decimal::from(project.target_burn_pct);
        assert!(
            (pct - target).abs() <= target / Decimal::from(20),
            "{}: {pct}",
            project.id
        );
        let alerts = app
            .get(
                &format!("/v1/alerts?project={}&month=2026-10", project.id),
                &finance,
            )
            .await
            .json();
        let actual: Vec<&Value> = items(&alerts)
            .iter()
            .filter(|a| a["kind"] == "actual")
            .collect();
        for alert in &actual {
            let fired_at: DateTime<Utc> = alert["fired_at"].as_str().unwrap().parse().unwrap();
            assert!(
                fired_at < loaded.window.boundary,
                "fired in October, when spend crossed it: {alert}"
            );
        }
        let mut fired: Vec<i64> = actual
            .iter()
            .map(|a| a["threshold"].as_i64().unwrap())
            .collect();
        fired.sort_unstable();
        let expected: Vec<i64> = [50, 80, 100]
            .into_iter()
            .filter(|&t| pct >= Decimal::from(t))
            .collect();
        assert_eq!(fired, expected, "{}", project.id);
        crossed.insert(project.id, fired.len());
    }
    assert_eq!(crossed["llm"], 3, "one project spent past its budget");
    assert_eq!(crossed["vision"], 2);
    assert_eq!(crossed["recsys"], 1);
    assert_eq!(crossed["search"], 0);

    // November so far: spend and a forecast against the same budget.
    let burn = app
        .get("/v1/projects/llm/burn?month=2026-11", &finance)
        .await
        .json();
    assert!(dec(&burn["spend"]) > Decimal::ZERO);
    assert!(!burn["forecast"].is_null(), "{burn}");

    // Failed and preempted attempts, and tasks that completed on a retry.
    let mut outcomes = BTreeMap::new();
    let mut retried = 0;
    for project in currencies.keys() {
        let cost = app
            .get(
                &format!("/v1/projects/{project}/cost?month=2026-10&group_by=outcome"),
                &finance,
            )
            .await
            .json();
        for group in cost["groups"].as_array().unwrap() {
            if let Some(key) = group["key"].as_str() {
                *outcomes.entry(key.to_owned()).or_insert(Decimal::ZERO) += dec(&group["total"]);
            }
        }
        let tasks = app
            .get(
                &format!("/v1/projects/{project}/tasks?month=2026-10&status=completed&limit=1000"),
                &finance,
            )
            .await
            .json();
        retried += items(&tasks)
            .iter()
            .filter(|t| t["failed_attempts"].as_i64().unwrap() > 0)
            .count();
    }
    for outcome in ["completed", "failed", "preempted"] {
        assert!(
            outcomes.get(outcome).is_some_and(|c| *c > Decimal::ZERO),
            "{outcome}: {outcomes:?}"
        );
    }
    assert!(
        retried > 5,
        "{retried} tasks completed after a failed attempt"
    );

    // The owned A100s: used by some projects, priced by their TCO; their idle time is their
    // pool's, so no unused commitment is shared.
    let mut reserved_hours = Decimal::ZERO;
    for project in currencies.keys() {
        let cost = app
            .get(
                &format!("/v1/projects/{project}/cost?month=2026-10&group_by=billing_mode"),
                &finance,
            )
            .await
            .json();
        for group in cost["groups"].as_array().unwrap() {
            if group["key"] == "reserved" {
                reserved_hours += dec(&group["gpu_seconds_held"]) / Decimal::from(3600);
            }
        }
    }
    let report = app
        .get("/v1/reports/monthly/2026-10", &finance)
        .await
        .json();
    assert!(reserved_hours > Decimal::ZERO);
    assert!(loaded.committed_gpus >= Decimal::ONE);
    assert!(
        report["shared"].as_array().unwrap().is_empty(),
        "{}",
        report["shared"]
    );
    let owned = report["pools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|line| line["pool"] == "a100")
        .unwrap();
    // October is before the cards' depreciation ends: their idle hours at the full TCO price.
    let price = taskledger::sources::demo::owned_a100(loaded.window)
        .parts()
        .total();
    let idle_price = dec(&owned["idle"]["cost"]) / dec(&owned["idle"]["gpu_hours"]);
    assert!(
        (idle_price - price).abs() < Decimal::new(1, 9),
        "{idle_price} is not {price}"
    );
    // Their exporter measured energy, and their region has a grid intensity.
    let energy: Decimal = report["projects"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|line| line["energy"]["kwh"].as_str())
        .map(|kwh| kwh.parse::<Decimal>().unwrap())
        .sum();
    assert!(energy > Decimal::ZERO);
    assert!(
        report["projects"]
            .as_array()
            .unwrap()
            .iter()
            .any(|line| line["emissions"]["kg_co2e"].is_string())
    );

    // The cluster's nodes are capacity: every pool pays for more than its jobs used, jobs
    // name the nodes they were placed on, and the idle time stays on the pools' lines.
    let pools = report["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 7, "a pool per model");
    let mut kept = Decimal::ZERO;
    for line in pools {
        let paid = dec(&line["paid"]["gpu_hours"]);
        let used = dec(&line["used"]["gpu_hours"]);
        let idle = dec(&line["idle"]["gpu_hours"]);
        assert!(paid > Decimal::ZERO && idle > Decimal::ZERO, "{line}");
        assert_eq!(
            paid,
            used + idle + dec(&line["down"]["gpu_hours"]),
            "{line}"
        );
        assert!(line["charged_to"].as_array().unwrap().is_empty());
        kept += dec(&line["kept_on_pool"]["capacity_idle"]);
    }
    assert!(
        pools
            .iter()
            .any(|line| dec(&line["used"]["gpu_hours"]) > Decimal::ZERO)
    );
    let usd = report["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["currency"] == "USD")
        .unwrap();
    assert_eq!(dec(&usd["pools"]), kept);
    let a100 = app
        .get("/v1/pools/a100/utilisation?month=2026-10", &finance)
        .await
        .json();
    let nodes = a100["nodes"].as_array().unwrap();
    assert!(nodes.len() >= 2, "{}", a100["nodes"]);
    for node in nodes {
        let hours = |part: &str| dec(&node[part]["gpu_hours"]);
        assert_eq!(
            hours("paid"),
            hours("used") + hours("idle") + hours("down"),
            "{node}"
        );
    }

    // Finance can close the complete month, not the one in progress.
    let open = app
        .post("/v1/reports/monthly/2026-11/close", &finance, Value::Null)
        .await;
    assert_eq!(open.status, StatusCode::CONFLICT, "{}", open.text());
    let closed = app
        .post("/v1/reports/monthly/2026-10/close", &finance, Value::Null)
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text());

    // The reader sees its two projects only.
    let readable = app
        .get("/v1/projects", &loaded.tokens.reader.token)
        .await
        .json();
    let ids: Vec<&str> = items(&readable)
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, demo::READER_PROJECTS);
    let admin = app.get("/v1/tokens", &loaded.tokens.admin.token).await;
    assert_eq!(admin.status, StatusCode::OK);
}

#[tokio::test]
async fn the_demo_loads_only_into_an_empty_database() {
    let settings = Settings {
        clock: Clock::Fixed(until()),
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    app.create_project("vision", "USD").await;
    let refused = demo::load(&app.pool, until(), &settings).await.unwrap_err();
    assert!(refused.to_string().contains("exists already"), "{refused}");
    let later = demo::load(
        &app.pool,
        "2026-11-21T00:00:00Z".parse().unwrap(),
        &settings,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&later, LedgerError::Invalid(errors) if errors[0].pointer == "/until"),
        "{later:?}"
    );
}

/// How often efficiency regressions fire on the demo's trace: every ledger day from the
/// first with a full baseline and window to the demo's "now" is judged as the tick judges
/// it, carrying the workloads' states from day to day.
#[tokio::test]
async fn efficiency_regressions_fire_rarely_on_the_demo() {
    let (app, loaded) = demo_app().await;
    let tz = Settings::default().timezone;
    let first = loaded.window.start.with_timezone(&tz).date_naive() + chrono::Days::new(17);
    let last = until().with_timezone(&tz).date_naive();
    let (mut days, mut judged, mut regressed) = (0, 0, 0);
    let mut fired = Vec::new();
    let mut day = first;
    while day <= last {
        let now = taskledger::domain::ledger_time::first_instant_of_day(day, tz)
            + chrono::Duration::hours(1);
        let settings = Settings {
            clock: Clock::Fixed(now),
            ..Settings::default()
        };
        let judgement = regressions::judge(&app.pool, None, &settings)
            .await
            .unwrap();
        days += 1;
        judged += judgement.judged;
        regressed += judgement.regressed;
        for row in judgement.fired {
            fired.push(format!(
                "{day}: {}/{} {}",
                row.project_id,
                row.workload.unwrap_or_default(),
                row.regression.unwrap_or_default()
            ));
        }
        day = day + chrono::Days::new(1);
    }
    eprintln!(
        "{days} days judged: {judged} workload-days judged, {regressed} regressed, {} alerts",
        fired.len()
    );
    for alert in &fired {
        eprintln!("  {alert}");
    }
    assert!(judged > 0, "the demo has workloads to judge");
    // Measured: 9 alerts over 419 workload-days judged, most of them a workload moved to
    // a dearer GPU model (price the largest factor).
    assert!(
        fired.len() * 40 <= judged,
        "at most one alert per 40 workload-days judged: {fired:#?}"
    );
}
