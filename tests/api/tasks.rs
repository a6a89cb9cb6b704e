//! What each task cost, kept by the rating path per ledger month: the worked
//! example per task, and the law that a project's tasks add up to the project's figures
//! less its unused commitment, over months, days and odd periods, through compaction,
//! re-pricing, corrections and a change of ledger time zone.

use std::collections::BTreeMap;

use axum::http::StatusCode;
use chrono::{DateTime, Duration, TimeZone, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde_json::json;

use taskledger::config::Settings;
use taskledger::domain::task::TaskFigures;
use taskledger::store::{rollups, tasks};

use crate::common::{TestApp, cost, dec};
use crate::fixtures::{NOVEMBER, Record, contract, record, worked_example};

const NEW_YORK: Tz = chrono_tz::America::New_York;

fn at(raw: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(raw).unwrap().to_utc()
}

async fn task_figures(
    app: &TestApp,
    (from, to): (&str, &str),
    tz: Tz,
) -> BTreeMap<String, TaskFigures> {
    let mut conn = app.pool.acquire().await.unwrap();
    tasks::period_figures(&mut conn, "vision", (at(from), at(to)), tz)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn the_worked_example_per_task() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let november = ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z");
    let figures = task_figures(&app, november, chrono_tz::UTC).await;
    let totals: Vec<(&str, Decimal, i64)> = figures
        .iter()
        .map(|(task, f)| (task.as_str(), f.total(), f.attempts))
        .collect();
    let cents = |raw: &str| raw.parse::<Decimal>().unwrap();
    assert_eq!(
        totals,
        [
            ("t1", cents("36.00"), 1),
            ("t2", cents("33.60"), 2),
            ("t3", cents("10.00"), 1),
            ("t4", Decimal::ZERO, 1),
            ("t5", cents("5.00"), 1),
        ]
    );
    let t2 = &figures["t2"];
    assert_eq!((t2.failed, t2.unmeasured), (cents("14.40"), cents("19.20")));
    assert_eq!((t2.failed_attempts, t2.retries, t2.failures), (1, 1, 1));
    assert_eq!(t2.output["tokens"], cents("1000000"));
    assert_eq!(figures["t4"].unrated_gpu_seconds, cents("3600"));
    assert_eq!(figures["t4"].failed_attempts, 1);

    let project = cost(&app, NOVEMBER).await;
    let sum: Decimal = figures.values().map(TaskFigures::total).sum();
    assert_eq!(sum, cents("84.60"));
    assert_eq!(
        sum,
        dec(&project["total"]) - dec(&project["breakdown"]["unused_commitment"])
    );

    // t5 began in October's last hour: half of it is October's, its lifetime is both.
    let october = ("2026-10-01T00:00:00Z", "2026-11-01T00:00:00Z");
    let t5_october = &task_figures(&app, october, chrono_tz::UTC).await["t5"];
    assert_eq!(
        (t5_october.total(), t5_october.attempts),
        (cents("5.00"), 0)
    );
    let lifetime = ("2026-10-01T00:00:00Z", "2026-12-01T00:00:00Z");
    assert_eq!(
        task_figures(&app, lifetime, chrono_tz::UTC).await["t5"].total(),
        cents("10.00")
    );

    let statuses: Vec<(String, Option<String>, Option<DateTime<Utc>>)> = sqlx::query_as(
        "SELECT task_id, status, completed_at FROM tasks WHERE project_id = 'vision' \
         ORDER BY task_id",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let statuses: Vec<(&str, &str, Option<DateTime<Utc>>)> = statuses
        .iter()
        .map(|(task, status, completed)| (task.as_str(), status.as_deref().unwrap(), *completed))
        .collect();
    assert_eq!(
        statuses,
        [
            ("t1", "completed", Some(at("2026-11-15T02:00:00Z"))),
            ("t2", "completed", Some(at("2026-11-20T14:00:00Z"))),
            ("t3", "completed", Some(at("2026-11-10T10:00:00Z"))),
            ("t4", "failed", None),
            ("t5", "completed", Some(at("2026-11-01T01:00:00Z"))),
        ]
    );
}

#[tokio::test]
async fn a_record_queued_after_it_started_is_refused() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let late = record("t1", "2026-11-20T10:00:00Z", "2026-11-20T11:00:00Z")
        .queued_at("2026-11-20T10:30:00Z");
    let response = app.post("/v1/job-records", &app.admin, json!([late])).await;
    response.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), vec!["/0/queued_at"]);
}

/// A small deterministic generator, so that a failing case can be replayed.
pub struct Lcg(pub u64);

impl Lcg {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % n
    }
}

/// Contracts whose prices per GPU-second have few decimals, so that every figure a
/// segment carries is short: sums then round alike however they are grouped. The
/// reservation is the project's, so that its unused commitment shows in the law.
pub async fn random_contracts(app: &TestApp) -> String {
    let on_demand = contract("H100", "on_demand", "3.60").create(app).await;
    contract("H100", "spot", "1.80").create(app).await;
    contract("A100", "reserved", "0.72")
        .project("vision")
        .valid_from("2026-11-01T00:00:00Z")
        .valid_until("2026-12-01T00:00:00Z")
        .committed_gpus(2)
        .create(app)
        .await;
    on_demand
}

/// Attempts of 40 tasks from late October to late November, of every outcome, some on a
/// model no contract prices.
pub fn random_records(seed: u64) -> Vec<Record> {
    let mut random = Lcg(seed);
    let origin = at("2026-10-20T00:00:00Z");
    let mut records = Vec::new();
    for task in 0..40 {
        for attempt in 1..=1 + random.below(3) {
            let started = origin + Duration::minutes(random.below(60 * 24 * 36) as i64);
            let minutes = 10 + random.below(60 * 30) as i64;
            let ended = started + Duration::minutes(minutes);
            let gpus = 1 + random.below(4) as i64;
            let (model, mode) = match random.below(4) {
                0 => ("H100", "spot"),
                1 => ("A100", "reserved"),
                2 => ("B200", "on_demand"),
                _ => ("H100", "on_demand"),
            };
            let outcome = ["completed", "completed", "failed", "preempted", "cancelled"]
                [random.below(5) as usize];
            let format = |t: DateTime<Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let mut r = record(&format!("task-{task}"), &format(started), &format(ended))
                .attempt(attempt as u32)
                .gpu_model(model)
                .billing_mode(mode)
                .gpu_count(gpus)
                .outcome(outcome)
                .retries(random.below(3) as u32)
                .failures(random.below(2) as u32);
            match random.below(3) {
                0 => r = r.gpu_seconds_busy(gpus * minutes * 60),
                1 => r = r.gpu_seconds_busy(gpus * minutes * 30),
                _ => {}
            }
            if random.below(2) == 0 {
                r = r.queued_at(&format(
                    started - Duration::seconds(random.below(900) as i64),
                ));
            }
            if random.below(3) > 0 {
                let unit = ["tokens", "samples"][random.below(2) as usize];
                r = r.output((1 + random.below(1000)).to_string(), unit);
            }
            records.push(r);
        }
    }
    records
}

/// The figures of every task over `[from, to)` summed straight from the segments and
/// per-record figures, bypassing the per-task days and months.
async fn from_hours(app: &TestApp, (from, to): (&str, &str)) -> Vec<(String, Decimal, i64, i64)> {
    sqlx::query_as(
        "SELECT h.task_id, \
                round(coalesce(sum(h.card_seconds * c.price_per_gpu_hour), 0) \
                      / 3600.000000000000000000000000, 20), \
                sum(h.attempts)::bigint, sum(h.queue_waits)::bigint \
         FROM task_hourly h LEFT JOIN contracts c ON c.id = h.contract_id \
         WHERE h.project_id = 'vision' \
           AND h.hour >= $1::timestamptz AND h.hour < $2::timestamptz \
         GROUP BY h.task_id ORDER BY h.task_id",
    )
    .bind(from)
    .bind(to)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

/// The project's figures and the sums of its tasks' figures agree over `[from, to)`, and
/// each task's figures are those of its segments and records.
async fn assert_tasks_add_up(app: &TestApp, period: (&str, &str), tz: Tz) {
    let figures = task_figures(app, period, tz).await;
    let mut sum = TaskFigures::default();
    figures.values().for_each(|task| sum.merge(task));
    let path = format!(
        "/v1/projects/vision/cost?from={}&to={}&as_of=2027-01-01T00:00:00Z",
        period.0, period.1
    );
    let project = cost(app, &path).await;
    let context = format!("{period:?}: {project}");
    assert_eq!(
        sum.total(),
        dec(&project["total"]) - dec(&project["breakdown"]["unused_commitment"]),
        "{context}"
    );
    assert!(!dec(&project["total"]).is_zero(), "{context}");
    for (part, value) in [
        ("productive", sum.productive),
        ("idle", sum.idle),
        ("unmeasured", sum.unmeasured),
        ("failed", sum.failed),
    ] {
        assert_eq!(
            value,
            dec(&project["breakdown"][part]),
            "{part} of {context}"
        );
    }
    assert_eq!(
        sum.gpu_seconds_held,
        dec(&project["gpu_seconds_held"]),
        "{context}"
    );
    assert_eq!(
        sum.gpu_seconds_busy,
        dec(&project["gpu_seconds_busy"]),
        "{context}"
    );
    assert_eq!(
        sum.unrated_gpu_seconds,
        dec(&project["unrated_gpu_seconds"]),
        "{context}"
    );
    assert_eq!(
        sum.retries,
        project["retries"].as_i64().unwrap(),
        "{context}"
    );
    assert_eq!(
        sum.failures,
        project["failures"].as_i64().unwrap(),
        "{context}"
    );
    // The project lists a unit also where its records' cost falls but none ended.
    let output: BTreeMap<String, Decimal> = project["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|view| {
            (
                view["unit"].as_str().unwrap().to_owned(),
                dec(&view["quantity"]),
            )
        })
        .filter(|(_, quantity)| !quantity.is_zero())
        .collect();
    assert_eq!(sum.output, output, "{context}");

    let expected = from_hours(app, period).await;
    let read: Vec<(String, Decimal, i64, i64)> = figures
        .iter()
        .map(|(task, f)| (task.clone(), f.total(), f.attempts, f.queue_waits))
        .collect();
    assert_eq!(read, expected, "{period:?}");
    let emptied: i64 =
        sqlx::query_scalar("SELECT count(*) FROM task_monthly WHERE segments = 0 AND attempts = 0")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(emptied, 0);
}

/// A month, a day, hours across days, and a month with hours on either side of it.
const UTC_PERIODS: [(&str, &str); 4] = [
    ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z"),
    ("2026-11-10T00:00:00Z", "2026-11-11T00:00:00Z"),
    ("2026-11-03T05:00:00Z", "2026-11-17T19:00:00Z"),
    ("2026-10-25T07:00:00Z", "2026-12-02T05:00:00Z"),
];

async fn assert_periods_add_up(app: &TestApp, periods: &[(&str, &str)], tz: Tz) {
    for &period in periods {
        assert_tasks_add_up(app, period, tz).await;
    }
}

#[tokio::test]
async fn tasks_add_up_to_the_project_through_compaction_repricing_and_corrections() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let on_demand = random_contracts(&app).await;
    let records = random_records(7);
    for batch in records.chunks(25) {
        app.ingest(batch).await;
    }
    assert_periods_add_up(&app, &UTC_PERIODS, chrono_tz::UTC).await;

    rollups::compact(&app.pool).await.unwrap().unwrap();
    assert_periods_add_up(&app, &UTC_PERIODS, chrono_tz::UTC).await;

    let repriced = app
        .patch(
            &format!("/v1/contracts/{on_demand}"),
            &app.admin,
            json!({"price_per_gpu_hour": "7.20"}),
        )
        .await;
    assert_eq!(repriced.status, StatusCode::OK, "{}", repriced.text());
    assert_periods_add_up(&app, &UTC_PERIODS, chrono_tz::UTC).await;

    // The first attempt of a task moves from the 10th to the 20th of November.
    let moved = record("task-0", "2026-11-20T03:00:00Z", "2026-11-20T05:30:00Z")
        .gpu_count(2)
        .outcome("failed")
        .queued_at("2026-11-20T02:59:00Z");
    let corrected = app
        .put(
            "/v1/projects/vision/job-records/task-0/1",
            &app.admin,
            moved.correction(),
        )
        .await;
    assert_eq!(corrected.status, StatusCode::OK, "{}", corrected.text());
    assert_periods_add_up(&app, &UTC_PERIODS, chrono_tz::UTC).await;
    rollups::compact(&app.pool).await.unwrap().unwrap();
    assert_periods_add_up(&app, &UTC_PERIODS, chrono_tz::UTC).await;
}

#[tokio::test]
async fn tasks_add_up_in_another_ledger_time_zone() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    random_contracts(&app).await;
    app.ingest(random_records(11)).await;
    assert!(
        rollups::align_to_time_zone(&app.pool, NEW_YORK)
            .await
            .unwrap()
    );
    let new_york = TestApp {
        router: taskledger::http::app(app.state(Settings {
            timezone: NEW_YORK,
            ..Settings::default()
        })),
        pool: app.pool.clone(),
        admin: app.admin.clone(),
        database: app.database.clone(),
        database_url: app.database_url.clone(),
    };
    let start_of = |day: (i32, u32, u32)| {
        NEW_YORK
            .with_ymd_and_hms(day.0, day.1, day.2, 0, 0, 0)
            .unwrap()
            .to_utc()
            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    };
    let (month_start, month_end) = (start_of((2026, 11, 1)), start_of((2026, 12, 1)));
    let (day_start, day_end) = (start_of((2026, 11, 10)), start_of((2026, 11, 11)));
    let periods = [
        (month_start.as_str(), month_end.as_str()),
        (day_start.as_str(), day_end.as_str()),
        ("2026-11-03T05:00:00Z", "2026-11-17T19:00:00Z"),
        ("2026-10-25T07:00:00Z", "2026-12-02T05:00:00Z"),
    ];
    assert_periods_add_up(&new_york, &periods, NEW_YORK).await;
    // Records rated after the rebuild are kept in New York months as well.
    new_york
        .ingest([record("late", "2026-11-10T03:00:00Z", "2026-11-10T07:00:00Z").gpu_count(3)])
        .await;
    assert_periods_add_up(&new_york, &periods, NEW_YORK).await;
}
