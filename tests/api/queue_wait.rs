//! Queue wait next to a project's cost (COST_MODEL.md §7): over the attempts that started in
//! the period and reported `queued_at`, whole and per group, exact nearest-rank percentiles.

use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::config::Settings;

use crate::common::{TestApp, assert_money, cost, dec};
use crate::fixtures::{NOVEMBER, Record, contract, record};

const NEW_YORK: chrono_tz::Tz = chrono_tz::America::New_York;

/// Attempts around November 2026 (UTC) and how long each waited:
/// - `a` 30 s and its retry 119.75 s, on the 2nd;
/// - `c` 3600 s on an A100, queued on the 2nd, started at midnight starting the 3rd;
/// - `d` 10 s on the 3rd, and `e` on the 3rd without `queued_at`: no wait, not an attempt
///   that counts;
/// - `f` 10800 s, started on 31 October: outside November though it ends there;
/// - `g` 2700 s, started on the 30th and ending in December;
/// - `h` 0 s, on an A100, queued the instant it started;
/// - `i` on a B200 without `queued_at`.
///
/// November's waits are thus 0, 10, 30, 119.75, 2700 and 3600 s.
fn attempts() -> Vec<Record> {
    vec![
        record("a", "2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z")
            .queued_at("2026-11-02T09:59:30Z")
            .outcome("failed")
            .label("team", "search"),
        record("a", "2026-11-02T12:00:00Z", "2026-11-02T13:00:00Z")
            .attempt(2)
            .queued_at("2026-11-02T11:58:00.25Z")
            .label("team", "search"),
        record("c", "2026-11-03T00:00:00Z", "2026-11-03T02:00:00Z")
            .gpu_model("A100")
            .queued_at("2026-11-02T23:00:00Z")
            .label("team", "vision"),
        record("d", "2026-11-03T05:00:00Z", "2026-11-03T06:00:00Z")
            .queued_at("2026-11-03T04:59:50Z")
            .billing_mode("spot"),
        record("e", "2026-11-03T06:00:00Z", "2026-11-03T07:00:00Z"),
        record("f", "2026-10-31T23:00:00Z", "2026-11-01T01:00:00Z")
            .queued_at("2026-10-31T20:00:00Z"),
        record("g", "2026-11-30T23:00:00Z", "2026-12-01T02:00:00Z")
            .queued_at("2026-11-30T22:15:00Z")
            .label("team", "search"),
        record("h", "2026-11-30T10:00:00Z", "2026-11-30T10:30:00Z")
            .gpu_model("A100")
            .queued_at("2026-11-30T10:00:00Z"),
        record("i", "2026-11-12T00:00:00Z", "2026-11-12T01:00:00Z").gpu_model("B200"),
    ]
}

async fn app_with_attempts(settings: Settings) -> TestApp {
    let app = TestApp::spawn_with(settings).await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    contract("H100", "spot", "1.20").create(&app).await;
    contract("A100", "on_demand", "1.00").create(&app).await;
    app.ingest(attempts()).await;
    app
}

/// `{attempts, p50_seconds, p95_seconds, total_seconds}` as expected.
fn wait(attempts: i64, p50: &str, p95: &str, total: &str) -> Value {
    json!({"attempts": attempts, "p50_seconds": p50, "p95_seconds": p95, "total_seconds": total})
}

/// November's: of the six waits 0, 10, 30, 119.75, 2700 and 3600 s, the 3rd and the 6th.
fn november_whole() -> Value {
    wait(6, "30", "3600", "6459.75")
}

fn group<'a>(view: &'a Value, key: &str) -> &'a Value {
    view["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"] == key)
        .unwrap_or_else(|| panic!("no group {key} in {}", view["groups"]))
}

/// The groups' queue wait `attempts` and `total_seconds` add up to the whole's.
fn assert_attempts_and_totals_add_up(view: &Value) {
    let groups = view["groups"].as_array().unwrap();
    let waits: Vec<&Value> = groups
        .iter()
        .map(|g| &g["queue_wait"])
        .filter(|w| !w.is_null())
        .collect();
    let attempts: i64 = waits.iter().map(|w| w["attempts"].as_i64().unwrap()).sum();
    let total: Decimal = waits.iter().map(|w| dec(&w["total_seconds"])).sum();
    assert_eq!(Value::from(attempts), view["queue_wait"]["attempts"]);
    assert_eq!(total, dec(&view["queue_wait"]["total_seconds"]));
}

#[tokio::test]
async fn queue_wait_counts_the_attempts_that_start_in_the_period() {
    let app = app_with_attempts(Settings::default()).await;
    let november = cost(&app, NOVEMBER).await;
    assert_eq!(
        november["queue_wait"],
        november_whole(),
        "nearest rank, without f (started in October), e and i (no queued_at)"
    );
    // Queue wait is not money: five on-demand H100 hours (a, its retry, e, and one hour each
    // of f and g), one spot H100 hour (d) and two and a half A100 hours (c, h).
    assert_money(&november["total"], "16.20");

    // g's last two hours cost in December, but its wait belongs to November.
    let december = cost(
        &app,
        "/v1/projects/vision/cost?month=2026-12&as_of=2027-01-01T00:00:00Z",
    )
    .await;
    assert!(dec(&december["total"]) > Decimal::ZERO);
    assert_eq!(december["queue_wait"], Value::Null);

    let october = cost(
        &app,
        "/v1/projects/vision/cost?month=2026-10&as_of=2027-01-01T00:00:00Z",
    )
    .await;
    assert_eq!(october["queue_wait"], wait(1, "10800", "10800", "10800"));

    // A period of hours holding only a's retry and the start of c.
    let hours = cost(
        &app,
        "/v1/projects/vision/cost?from=2026-11-02T12:00:00Z&to=2026-11-03T01:00:00Z",
    )
    .await;
    assert_eq!(hours["queue_wait"], wait(2, "119.75", "3600", "3719.75"));
}

#[tokio::test]
async fn each_group_has_the_queue_wait_of_its_attempts() {
    let app = app_with_attempts(Settings::default()).await;

    let by_model = cost(&app, &format!("{NOVEMBER}&group_by=gpu_model")).await;
    // 10, 30, 119.75 and 2700 on H100s; 0 and 3600 on A100s.
    assert_eq!(
        group(&by_model, "H100")["queue_wait"],
        wait(4, "30", "2700", "2859.75")
    );
    assert_eq!(
        group(&by_model, "A100")["queue_wait"],
        wait(2, "0", "3600", "3600")
    );
    assert_eq!(group(&by_model, "B200")["queue_wait"], Value::Null);
    assert_eq!(by_model["queue_wait"], november_whole());

    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    assert_eq!(
        group(&by_day, "2026-11-02")["queue_wait"],
        wait(2, "30", "119.75", "149.75")
    );
    // c waited from the 2nd but started on the 3rd.
    assert_eq!(
        group(&by_day, "2026-11-03")["queue_wait"],
        wait(2, "10", "3600", "3610")
    );
    assert_eq!(
        group(&by_day, "2026-11-30")["queue_wait"],
        wait(2, "0", "2700", "2700")
    );
    // f's last hour costs on the 1st; it started in October.
    assert!(dec(&group(&by_day, "2026-11-01")["total"]) > Decimal::ZERO);
    assert_eq!(group(&by_day, "2026-11-01")["queue_wait"], Value::Null);
    assert_eq!(group(&by_day, "2026-11-12")["queue_wait"], Value::Null);

    let by_team = cost(&app, &format!("{NOVEMBER}&group_by=label:team")).await;
    assert_eq!(
        group(&by_team, "search")["queue_wait"],
        wait(3, "119.75", "2700", "2849.75")
    );
    let unlabelled = by_team["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"].is_null())
        .unwrap();
    assert_eq!(unlabelled["queue_wait"], wait(2, "0", "10", "10"));

    for group_by in [
        "day",
        "month",
        "gpu_model",
        "billing_mode",
        "outcome",
        "label:team",
    ] {
        let view = cost(&app, &format!("{NOVEMBER}&group_by={group_by}")).await;
        assert_attempts_and_totals_add_up(&view);
        assert_eq!(view["queue_wait"], november_whole(), "{group_by}");
    }
}

#[tokio::test]
async fn days_and_months_of_queue_wait_are_those_of_the_ledger_time_zone() {
    let app = app_with_attempts(Settings {
        timezone: NEW_YORK,
        ..Settings::default()
    })
    .await;
    // New York's November starts at 04:00 UTC on the 1st and ends at 05:00 UTC on
    // 1 December: the same six attempts.
    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    assert_eq!(by_day["queue_wait"], november_whole());
    // c started at 19:00 on the 2nd in New York, d at midnight starting the 3rd.
    assert_eq!(
        group(&by_day, "2026-11-02")["queue_wait"],
        wait(3, "119.75", "3600", "3749.75")
    );
    assert_eq!(
        group(&by_day, "2026-11-03")["queue_wait"],
        wait(1, "10", "10", "10")
    );
    assert_attempts_and_totals_add_up(&by_day);
}

#[tokio::test]
async fn queue_wait_is_null_where_no_attempt_reported_it() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    app.ingest([record("t", "2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z")])
        .await;
    let by_day = cost(&app, &format!("{NOVEMBER}&group_by=day")).await;
    assert_eq!(by_day["queue_wait"], Value::Null);
    assert_eq!(group(&by_day, "2026-11-02")["queue_wait"], Value::Null);
    // The field is there, null, not left out.
    assert!(by_day.as_object().unwrap().contains_key("queue_wait"));
}

#[tokio::test]
async fn waits_of_days_are_counted_in_seconds() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    app.ingest([
        record("long", "2026-11-12T02:00:00Z", "2026-11-12T03:00:00Z")
            .queued_at("2026-11-11T00:00:00.5Z"),
        record("short", "2026-11-12T02:00:00Z", "2026-11-12T03:00:00Z")
            .queued_at("2026-11-12T01:59:57Z"),
    ])
    .await;
    // A day, two hours less half a second; and 3 s.
    assert_eq!(
        cost(&app, NOVEMBER).await["queue_wait"],
        wait(2, "3", "93599.5", "93602.5")
    );
}
