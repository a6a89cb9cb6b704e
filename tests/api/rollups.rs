//! The rollups cost is read from: whole ledger months from the monthly tables, other whole
//! days from the daily ones and the hours around them from the hourly ones, delta rows folded in by compaction, daily rollups
//! rebuilt for another ledger time zone, and attempts of one task rated concurrently.

use std::str::FromStr;

use axum::http::StatusCode;
use futures::StreamExt;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::config::Settings;
use taskledger::domain::record::RecordKey;
use taskledger::ledger::rating;
use taskledger::store::rollups;

use crate::common::{TestApp, cost, dec};
use crate::fixtures::{
    NOVEMBER, contract, record, worked_example, worked_example_contracts, worked_example_records,
};

const NEW_YORK: chrono_tz::Tz = chrono_tz::America::New_York;

/// The figures of `[from, to)` summed straight from the stored segments (priced by their
/// contracts, all in the project's currency) and per-record figures, bypassing every rollup.
async fn from_segments(app: &TestApp, from: &str, to: &str) -> Value {
    let (held, productive, idle, unmeasured, failed): (
        Decimal,
        Decimal,
        Decimal,
        Decimal,
        Decimal,
    ) = sqlx::query_as(
        "SELECT coalesce(sum(s.gpu_seconds_held), 0), \
                round(coalesce(sum(s.productive_seconds * c.price_per_gpu_hour), 0) \
                      / 3600.000000000000000000000000, 20), \
                round(coalesce(sum(s.idle_seconds * c.price_per_gpu_hour), 0) \
                      / 3600.000000000000000000000000, 20), \
                round(coalesce(sum(s.unmeasured_seconds * c.price_per_gpu_hour), 0) \
                      / 3600.000000000000000000000000, 20), \
                round(coalesce(sum(s.failed_seconds * c.price_per_gpu_hour), 0) \
                      / 3600.000000000000000000000000, 20) \
         FROM rated_segments s LEFT JOIN contracts c ON c.id = s.contract_id \
         WHERE s.project_id = 'vision' \
           AND s.hour >= $1::timestamptz AND s.hour < $2::timestamptz",
    )
    .bind(from)
    .bind(to)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let (completed, retries): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE completes_task), coalesce(sum(retries), 0)::bigint \
         FROM rated_records WHERE project_id = 'vision' \
           AND end_hour >= $1::timestamptz AND end_hour < $2::timestamptz",
    )
    .bind(from)
    .bind(to)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    json!({
        "gpu_seconds_held": held.normalize().to_string(),
        "productive": productive.normalize().to_string(),
        "idle": idle.normalize().to_string(),
        "unmeasured": unmeasured.normalize().to_string(),
        "failed": failed.normalize().to_string(),
        "tasks_completed": completed,
        "retries": retries,
    })
}

fn figures(view: &Value) -> Value {
    let number = |path: &str| dec(view.pointer(path).unwrap()).normalize().to_string();
    json!({
        "gpu_seconds_held": number("/gpu_seconds_held"),
        "productive": number("/breakdown/productive"),
        "idle": number("/breakdown/idle"),
        "unmeasured": number("/breakdown/unmeasured"),
        "failed": number("/breakdown/failed"),
        "tasks_completed": view["tasks_completed"],
        "retries": view["retries"],
    })
}

/// Periods of a whole month, of whole months with days and hours around them, of whole
/// days, of hours around whole days, inside one day, and across the day New York leaves
/// daylight saving time (1 November 2026, a 25-hour day).
const PERIODS: [(&str, &str); 8] = [
    ("2026-09-27T09:00:00Z", "2026-11-03T07:00:00Z"),
    ("2026-10-14T09:00:00Z", "2027-01-03T07:00:00Z"),
    ("2026-11-01T04:00:00Z", "2026-12-01T05:00:00Z"),
    ("2026-10-31T04:00:00Z", "2026-11-02T05:00:00Z"),
    ("2026-11-14T23:00:00Z", "2026-11-20T13:00:00Z"),
    ("2026-11-10T02:00:00Z", "2026-11-10T09:00:00Z"),
    ("2026-11-01T05:00:00Z", "2026-11-21T04:00:00Z"),
    ("2026-11-15T01:00:00Z", "2026-11-16T05:00:00Z"),
];

/// Sums read from the rollups are rounded to 20 decimal places, group by group.
fn assert_same_figures(read: &Value, expected: &Value, period: &str) {
    let tolerance = Decimal::new(1, 18);
    for (name, value) in expected.as_object().unwrap() {
        match value.as_str() {
            Some(text) => {
                let difference = dec(&read[name]) - Decimal::from_str(text).unwrap();
                assert!(
                    difference.abs() <= tolerance,
                    "{period} {name}: read {} for {text}",
                    read[name]
                );
            }
            None => assert_eq!(&read[name], value, "{period} {name}"),
        }
    }
}

async fn assert_periods_match_segments(app: &TestApp) {
    for (from, to) in PERIODS {
        let view = cost(
            app,
            &format!("/v1/projects/vision/cost?from={from}&to={to}&as_of=2027-01-01T00:00:00Z"),
        )
        .await;
        assert_same_figures(
            &figures(&view),
            &from_segments(app, from, to).await,
            &format!("[{from}, {to})"),
        );
    }
}

/// The project lines of November's monthly report.
async fn report_projects(app: &TestApp) -> Value {
    let report = app.get("/v1/reports/monthly/2026-11", &app.admin).await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.text());
    report.json()["projects"].clone()
}

async fn pending(app: &TestApp) -> i64 {
    rollups::pending_deltas(&mut app.pool.acquire().await.unwrap())
        .await
        .unwrap()
}

async fn compact(app: &TestApp) -> rollups::Compaction {
    rollups::compact(&app.pool).await.unwrap().unwrap()
}

#[tokio::test]
async fn any_period_reads_the_same_figures_as_its_segments() {
    let app = TestApp::spawn_with(Settings {
        timezone: NEW_YORK,
        ..Settings::default()
    })
    .await;
    worked_example(&app).await;
    // Hours and days before October and days after it, for the period that holds them all.
    app.ingest([
        record("t6", "2026-09-29T10:00:00Z", "2026-09-30T03:00:00Z")
            .gpu_count(2)
            .gpu_seconds_busy(100000),
        record("t7", "2026-09-27T10:00:00Z", "2026-09-27T20:00:00Z").outcome("failed"),
        record("t8", "2026-11-02T12:00:00Z", "2026-11-02T15:00:00Z"),
    ])
    .await;
    assert_periods_match_segments(&app).await;

    // Days are New York days: R1 runs 17:00–21:00 on the 14th there.
    let by_day = cost(
        &app,
        "/v1/projects/vision/cost?month=2026-11&as_of=2027-01-01T00:00:00Z&group_by=day",
    )
    .await;
    let keys: Vec<&str> = by_day["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        [
            "2026-11-02",
            "2026-11-09",
            "2026-11-10",
            "2026-11-14",
            "2026-11-20"
        ],
        "{by_day}"
    );

    compact(&app).await;
    assert_periods_match_segments(&app).await;
}

#[tokio::test]
async fn compaction_folds_deltas_in_and_changes_no_figure() {
    let app = TestApp::spawn().await;
    let [_, _, c3, _] = worked_example(&app).await;
    let groupings = [
        "",
        "&group_by=day",
        "&group_by=gpu_model",
        "&group_by=outcome",
    ];
    let mut before = Vec::new();
    for group_by in groupings {
        before.push(cost(&app, &format!("{NOVEMBER}{group_by}")).await);
    }
    let report_before = report_projects(&app).await;
    assert!(!before[0]["total"].is_null(), "{}", before[0]);
    assert_eq!(report_before[0]["total"], before[0]["total"]);
    assert!(pending(&app).await > 0);

    let done = compact(&app).await;
    assert!(done.delta_rows > 0);
    assert_eq!(pending(&app).await, 0);
    for (group_by, expected) in groupings.iter().zip(&before) {
        assert_eq!(
            &cost(&app, &format!("{NOVEMBER}{group_by}")).await,
            expected
        );
    }
    assert_eq!(report_projects(&app).await, report_before);
    // Compacted rows are one per key.
    let compacted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM cost_daily WHERE delta = 0 \
         GROUP BY project_id, day, gpu_model, billing_mode, outcome, contract_id, \
                  unrated_reason, output_unit ORDER BY 1 DESC LIMIT 1",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(compacted, 1);

    // Deleting C3 unrates R2 and R3: their rows under C3 net to nothing and are removed
    // when compacted, and the figures stay those of the segments throughout.
    let deleted = app.delete(&format!("/v1/contracts/{c3}"), &app.admin).await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT, "{}", deleted.text());
    let after_delete = cost(&app, &format!("{NOVEMBER}&group_by=gpu_model")).await;
    assert!(pending(&app).await > 0);
    let done = compact(&app).await;
    assert!(done.emptied_rows > 0, "{done:?}");
    assert_eq!(
        cost(&app, &format!("{NOVEMBER}&group_by=gpu_model")).await,
        after_delete
    );
    assert_eq!(
        report_projects(&app).await[0]["total"],
        cost(&app, NOVEMBER).await["total"]
    );
    for table in [
        "cost_hourly",
        "cost_daily",
        "cost_monthly",
        "contract_usage_hourly",
    ] {
        let under_c3: i64 = sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {table} WHERE contract_id = $1::uuid"
        ))
        .bind(&c3)
        .fetch_one(&app.pool)
        .await
        .unwrap();
        assert_eq!(under_c3, 0, "{table}");
    }
    let empty: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM cost_hourly WHERE segments = 0) \
              + (SELECT count(*) FROM cost_daily WHERE segments = 0) \
              + (SELECT count(*) FROM cost_monthly WHERE segments = 0) \
              + (SELECT count(*) FROM cost_monthly_kinds WHERE segments = 0) \
              + (SELECT count(*) FROM records_monthly WHERE records = 0) \
              + (SELECT count(*) FROM records_hourly WHERE records = 0) \
              + (SELECT count(*) FROM records_daily WHERE records = 0)",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(empty, 0);
    assert_periods_match_segments(&app).await;
}

/// The unused commitment of `vision`'s November, and the month's report line of its
/// reservation `id` (committed and unused GPU-hours, unused commitment).
async fn reservation_figures(app: &TestApp, id: &str) -> (Decimal, [Decimal; 3]) {
    let view = cost(app, NOVEMBER).await;
    let report = app.get("/v1/reports/monthly/2026-11", &app.admin).await;
    assert_eq!(report.status, StatusCode::OK, "{}", report.text());
    let report = report.json();
    let line = report["commitments"]
        .as_array()
        .unwrap()
        .iter()
        .find(|line| line["id"] == id)
        .unwrap_or_else(|| panic!("no line of {id} in {report}"))
        .clone();
    (
        dec(&view["breakdown"]["unused_commitment"]),
        [
            "committed_gpu_hours",
            "unused_gpu_hours",
            "unused_commitment",
        ]
        .map(|figure| dec(&line[figure])),
    )
}

/// The hours, segments and GPU-seconds of each compacted day of contract `id`'s usage.
async fn usage_days(app: &TestApp, id: &str) -> Vec<(String, Vec<String>, Vec<i64>, Vec<Decimal>)> {
    sqlx::query_as(
        "SELECT day::text, ARRAY(SELECT to_char(h AT TIME ZONE 'UTC', 'DD HH24:MI') \
                                 FROM unnest(hours) h), segments, used \
         FROM contract_usage_daily WHERE contract_id = $1::uuid ORDER BY day",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn numeric_arrays_read_as_sqlx_reads_them() {
    // Usage arrays are read with a decoder of their own: it must give the very decimals, at
    // the very scales, that sqlx's gives, including sums of divided GPU-seconds.
    let app = TestApp::spawn().await;
    let values = "ARRAY[0, 0.000, 3600, 14400.00, -12.5, 1e-20, 10800 * 3 / 7.0, \
                  10800 * 3 / 7.0 + 3600 * 5 / 7.0, 123456789012.1234567890123456, \
                  79228162514264337593543950335, -1e-28, 1234.5e10]::numeric[]";
    let ours: Vec<taskledger::store::numeric::Numeric> =
        sqlx::query_scalar(&format!("SELECT {values}"))
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let sqlx_reads: Vec<Decimal> = sqlx::query_scalar(&format!("SELECT {values}"))
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let text = |values: &mut dyn Iterator<Item = Decimal>| {
        values.map(|value| value.to_string()).collect::<Vec<_>>()
    };
    assert_eq!(
        text(&mut ours.into_iter().map(|numeric| numeric.0)),
        text(&mut sqlx_reads.into_iter())
    );
}

#[tokio::test]
async fn a_reservations_usage_nets_the_same_compacted_or_not() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let id = contract("A100", "reserved", "1.50")
        .project("vision")
        .valid_from("2026-11-01T00:00:00Z")
        .valid_until("2026-12-01T00:00:00Z")
        .committed_gpus(2)
        .create(&app)
        .await;
    let on_the_reservation = |task: &str, from: &str, to: &str, gpus: i64| {
        record(task, from, to)
            .gpu_model("A100")
            .billing_mode("reserved")
            .gpu_count(gpus)
    };
    // Two records share 11:00 on the 3rd, and one runs across midnight into the 4th: 1 of 2
    // GPU-hours used at 10:00, 2 at 11:00, 1 at 23:00 and at 00:00.
    app.ingest([
        on_the_reservation("a", "2026-11-03T10:00:00Z", "2026-11-03T12:00:00Z", 1),
        on_the_reservation("b", "2026-11-03T11:00:00Z", "2026-11-03T11:30:00Z", 2),
        on_the_reservation("c", "2026-11-03T23:00:00Z", "2026-11-04T01:00:00Z", 1),
    ])
    .await;
    let unused = |gpu_hours: i64| Decimal::from(gpu_hours);
    let price = Decimal::from_str("1.50").unwrap();
    let expected = |used: i64| {
        (
            unused(1440 - used) * price,
            [
                unused(1440),
                unused(1440 - used),
                unused(1440 - used) * price,
            ],
        )
    };
    assert_eq!(reservation_figures(&app, &id).await, expected(5));
    assert!(
        usage_days(&app, &id).await.is_empty(),
        "nothing compacted yet"
    );

    compact(&app).await;
    assert_eq!(reservation_figures(&app, &id).await, expected(5));
    let at = |hours: &[&str]| hours.iter().map(|h| (*h).to_owned()).collect::<Vec<_>>();
    let seconds = |values: &[i64]| values.iter().map(|&v| Decimal::from(v)).collect::<Vec<_>>();
    assert_eq!(
        usage_days(&app, &id).await,
        [
            (
                "2026-11-03".to_owned(),
                at(&["03 10:00", "03 11:00", "03 23:00"]),
                vec![1, 2, 1],
                seconds(&[3600, 7200, 3600]),
            ),
            (
                "2026-11-04".to_owned(),
                at(&["04 00:00"]),
                vec![1],
                seconds(&[3600])
            ),
        ]
    );

    // More usage in a compacted hour and in a new one is read from the delta rows until it
    // is folded into the days' rows, where it lands in hour order.
    app.ingest([
        on_the_reservation("d", "2026-11-03T10:00:00Z", "2026-11-03T11:00:00Z", 1),
        on_the_reservation("e", "2026-11-03T05:00:00Z", "2026-11-03T06:00:00Z", 1),
    ])
    .await;
    assert!(pending(&app).await > 0);
    assert_eq!(reservation_figures(&app, &id).await, expected(7));
    compact(&app).await;
    assert_eq!(pending(&app).await, 0);
    assert_eq!(reservation_figures(&app, &id).await, expected(7));
    assert_eq!(
        usage_days(&app, &id).await[0],
        (
            "2026-11-03".to_owned(),
            at(&["03 05:00", "03 10:00", "03 11:00", "03 23:00"]),
            vec![1, 2, 2, 1],
            seconds(&[3600, 7200, 7200, 3600]),
        )
    );

    // Ending the reservation with the 3rd takes the 4th's hour off it, and with it the 4th's
    // row: 3 days of 2 GPUs, 6 GPU-hours of them used.
    let ended = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &app.admin,
            json!({"valid_until": "2026-11-04T00:00:00Z"}),
        )
        .await;
    assert_eq!(ended.status, StatusCode::OK, "{}", ended.text());
    compact(&app).await;
    assert_eq!(usage_days(&app, &id).await.len(), 1);
    assert_eq!(
        reservation_figures(&app, &id).await,
        (
            unused(138) * price,
            [unused(144), unused(138), unused(138) * price]
        )
    );
}

/// The distinct days of `cost_daily`, and the segments `cost_monthly` holds for October.
async fn days_and_october(app: &TestApp) -> (Vec<String>, i64) {
    let days: Vec<chrono::NaiveDate> =
        sqlx::query_scalar("SELECT DISTINCT day FROM cost_daily ORDER BY 1")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    let october: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(segments), 0)::bigint FROM cost_monthly WHERE month = '2026-10-01'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    (days.iter().map(|d| d.to_string()).collect(), october)
}

#[tokio::test]
async fn daily_and_monthly_rollups_are_rebuilt_for_another_ledger_time_zone() {
    // Rated in UTC, then read in New York: the hours are the same, the days are not.
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let utc = rollups::align_to_time_zone(&app.pool, chrono_tz::UTC).await;
    assert!(utc.unwrap());
    let again = rollups::align_to_time_zone(&app.pool, chrono_tz::UTC).await;
    assert!(!again.unwrap());
    // R1 runs 22:00–02:00 UTC across the 14th and 15th; R5 has one hour in October.
    let (days, october) = days_and_october(&app).await;
    assert!(days.contains(&"2026-11-15".to_owned()), "{days:?}");
    assert_eq!(october, 1);

    assert!(
        rollups::align_to_time_zone(&app.pool, NEW_YORK)
            .await
            .unwrap()
    );
    assert!(
        !rollups::align_to_time_zone(&app.pool, NEW_YORK)
            .await
            .unwrap()
    );
    // In New York R1 runs 17:00–21:00 on the 14th, and R5 19:00–21:00 on 31 October.
    let (days, october) = days_and_october(&app).await;
    assert!(!days.contains(&"2026-11-15".to_owned()), "{days:?}");
    assert_eq!(october, 2);
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
    assert_periods_match_segments(&new_york).await;
    // The report sums every project's months by kind, rebuilt for New York's months too.
    for month in ["2026-10", "2026-11"] {
        let report = new_york
            .get(&format!("/v1/reports/monthly/{month}"), &new_york.admin)
            .await;
        assert_eq!(report.status, StatusCode::OK, "{}", report.text());
        let view = cost(
            &new_york,
            &format!("/v1/projects/vision/cost?month={month}&as_of=2027-01-01T00:00:00Z"),
        )
        .await;
        assert!(!view["total"].is_null(), "{view}");
        assert_eq!(
            report.json()["projects"][0]["total"],
            view["total"],
            "{month}"
        );
    }
}

#[tokio::test]
async fn attempts_of_one_task_rated_concurrently_count_the_task_once() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let [c1, ..] = worked_example_contracts();
    c1.create(&app).await;
    // Eight batches, each holding one completed attempt of every one of 50 tasks.
    let batches: Vec<Value> = (1..=8)
        .map(|attempt| {
            Value::Array(
                (0..50)
                    .map(|task| {
                        record(
                            &format!("t{task}"),
                            &format!("2026-11-03T{attempt:02}:00:00Z"),
                            &format!("2026-11-03T{attempt:02}:30:00Z"),
                        )
                        .attempt(attempt)
                        .into()
                    })
                    .collect(),
            )
        })
        .collect();
    let posts = batches.into_iter().map(|batch| {
        let app = &app;
        async move {
            let response = app.post("/v1/job-records", &app.admin, batch).await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        }
    });
    futures::future::join_all(posts).await;
    let view = cost(&app, NOVEMBER).await;
    assert_eq!(view["tasks_completed"], 50, "{view}");
    assert_eq!(
        dec(&view["total"]),
        Decimal::from_str("500").unwrap(),
        "400 half-hours at 2.50 an hour"
    );
}

/// What a database migrated before the appended rollups holds for two rated records: C1's
/// four hours of t1 (57,600 GPU-seconds, 75% busy, 2,000,000 tokens) and two hours of t3 on
/// the project's own reservation C4 (2 GPUs committed for 24 hours).
const RATED_BEFORE_DELTAS: &str = r#"
INSERT INTO projects (id, name, currency) VALUES ('vision', 'Vision', 'USD');
INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from)
VALUES ('00000000-0000-0000-0000-0000000000c1', 'C1', 'H100', 'on_demand', 2.50, 'USD',
        '2026-01-01T00:00:00Z');
INSERT INTO contracts (id, name, gpu_model, billing_mode, price_per_gpu_hour, currency, valid_from,
                       valid_until, project_id, committed_gpus)
VALUES ('00000000-0000-0000-0000-0000000000c4', 'C4', 'A100', 'reserved', 1.00, 'USD',
        '2026-11-10T00:00:00Z', '2026-11-11T00:00:00Z', 'vision', 2);
INSERT INTO job_records (project_id, task_id, attempt, gpu_model, gpu_count, billing_mode,
                         started_at, ended_at, gpu_seconds_held, gpu_seconds_busy, outcome,
                         output_quantity, output_unit, content_hash)
VALUES ('vision', 't1', 1, 'H100', 4, 'on_demand', '2026-11-14T22:00:00Z', '2026-11-15T02:00:00Z',
        57600, 43200, 'completed', 2000000, 'tokens', '\x01'),
       ('vision', 't3', 1, 'A100', 1, 'reserved', '2026-11-10T00:00:00Z', '2026-11-10T02:00:00Z',
        7200, 7200, 'completed', NULL, NULL, '\x02');
INSERT INTO rated_segments
SELECT 'vision', 't1', 1, s, '2026-11-14T22:00:00Z'::timestamptz + s * interval '1 hour', 'H100',
       'on_demand', 'completed', '00000000-0000-0000-0000-0000000000c1', NULL, 'tokens', 14400,
       10800, 10, 7.5, 2.5, 0, 0, CASE WHEN s = 3 THEN 2000000 END
FROM generate_series(0, 3) s;
INSERT INTO rated_segments
SELECT 'vision', 't3', 1, s, '2026-11-10T00:00:00Z'::timestamptz + s * interval '1 hour', 'A100',
       'reserved', 'completed', '00000000-0000-0000-0000-0000000000c4', NULL, NULL, 3600, 3600, 1, 1,
       0, 0, 0, NULL
FROM generate_series(0, 1) s;
INSERT INTO rated_records VALUES
  ('vision', 't1', 1, '2026-11-15T02:00:00Z', 'H100', 'on_demand', 'completed', 0, 0, true, false),
  ('vision', 't3', 1, '2026-11-10T02:00:00Z', 'A100', 'reserved', 'completed', 0, 0, true, false);
INSERT INTO cost_hourly
SELECT project_id, hour, gpu_model, billing_mode, outcome, contract_id, unrated_reason, output_unit,
       count(*), sum(gpu_seconds_held), coalesce(sum(gpu_seconds_busy), 0), coalesce(sum(cost), 0),
       sum(productive), sum(idle), sum(unmeasured), sum(failed), coalesce(sum(output_quantity), 0)
FROM rated_segments GROUP BY 1, 2, 3, 4, 5, 6, 7, 8;
INSERT INTO records_hourly
SELECT project_id, end_hour, gpu_model, billing_mode, outcome, count(*), sum(retries),
       sum(failures), count(*) FILTER (WHERE completes_task), count(*) FILTER (WHERE fails_task)
FROM rated_records GROUP BY 1, 2, 3, 4, 5;
"#;

#[tokio::test]
async fn rated_data_survives_the_upgrade_to_appended_rollups() {
    let app = TestApp::spawn().await;
    // The test's database, emptied and migrated only as far as month close (0004).
    sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public")
        .execute(&app.pool)
        .await
        .unwrap();
    app.pool.close().await;
    let earlier = tempfile::tempdir().unwrap();
    let migrations = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for entry in std::fs::read_dir(&migrations).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if name.as_str() < "0005" {
            std::fs::copy(&path, earlier.path().join(name)).unwrap();
        }
    }
    let pool = taskledger::db::connect(&app.database_url, 4).await.unwrap();
    sqlx::migrate::Migrator::new(earlier.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    sqlx::raw_sql(RATED_BEFORE_DELTAS)
        .execute(&pool)
        .await
        .unwrap();
    taskledger::store::tokens::insert(
        &mut pool.acquire().await.unwrap(),
        "admin",
        taskledger::domain::access::Role::Admin,
        &[],
        &taskledger::domain::access::hash_secret(&app.admin),
    )
    .await
    .unwrap();

    // Then upgraded, as `serve` does at start.
    taskledger::db::migrate(&pool).await.unwrap();
    assert!(
        rollups::align_to_time_zone(&pool, chrono_tz::UTC)
            .await
            .unwrap()
    );
    let upgraded = TestApp {
        router: taskledger::http::app(taskledger::http::state::AppState::new(
            pool.clone(),
            Settings::default(),
        )),
        pool,
        admin: app.admin.clone(),
        database: app.database.clone(),
        database_url: app.database_url.clone(),
    };
    let view = cost(&upgraded, NOVEMBER).await;
    // 40 for t1, 2 for t3, and 46 of C4's 48 committed GPU-hours unused.
    assert_eq!(dec(&view["total"]), Decimal::from(88), "{view}");
    assert_eq!(
        dec(&view["breakdown"]["unused_commitment"]),
        Decimal::from(46)
    );
    assert_eq!(view["tasks_completed"], 2);
    // The tasks were backfilled from what was rated, and priced when read.
    let tasks = upgraded
        .get("/v1/projects/vision/tasks?month=2026-11", &upgraded.admin)
        .await
        .json();
    let finals: Vec<(String, String)> = tasks["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["task_id"].to_string(), t["final_cost"].to_string()))
        .collect();
    assert_eq!(
        finals,
        [
            ("\"t1\"".into(), "\"40\"".into()),
            ("\"t3\"".into(), "\"2\"".into()),
        ]
    );
    let by_day = cost(&upgraded, &format!("{NOVEMBER}&group_by=day")).await;
    let totals: Vec<(String, String)> = by_day["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["key"].to_string(), g["total"].to_string()))
        .collect();
    assert_eq!(
        totals,
        [
            ("\"2026-11-10\"".into(), "\"48\"".into()),
            ("\"2026-11-14\"".into(), "\"20\"".into()),
            ("\"2026-11-15\"".into(), "\"20\"".into()),
        ]
    );

    // The migrated rows take further changes: a new price, and another attempt of t1.
    let patched = upgraded
        .patch(
            "/v1/contracts/00000000-0000-0000-0000-0000000000c1",
            &upgraded.admin,
            json!({"price_per_gpu_hour": "3.00"}),
        )
        .await;
    assert_eq!(patched.status, StatusCode::OK, "{}", patched.text());
    upgraded
        .ingest([record("t1", "2026-11-16T00:00:00Z", "2026-11-16T01:00:00Z").attempt(2)])
        .await;
    let view = cost(&upgraded, NOVEMBER).await;
    assert_eq!(
        dec(&view["total"]),
        Decimal::from(48 + 3 + 2 + 46),
        "{view}"
    );
    assert_eq!(view["tasks_completed"], 2);
    compact(&upgraded).await;
    assert_eq!(cost(&upgraded, NOVEMBER).await, view);
    assert_periods_match_segments(&upgraded).await;
}

#[tokio::test]
async fn compaction_racing_writers_loses_nothing() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let [c1, ..] = worked_example_contracts();
    c1.create(&app).await;
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactor = {
        let pool = app.pool.clone();
        let done = done.clone();
        tokio::spawn(async move {
            let mut runs = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if rollups::compact(&pool).await.unwrap().is_some() {
                    runs += 1;
                }
            }
            runs
        })
    };
    // Twenty batches of 40 records from four writers, over the same hours, days and month.
    let posts = (0..20).map(|batch| {
        let app = &app;
        async move {
            let records: Vec<Value> = (0..40)
                .map(|i| {
                    let day = 3 + i % 4;
                    let hour = i % 20;
                    record(
                        &format!("b{batch}-{i}"),
                        &format!("2026-11-{day:02}T{hour:02}:00:00Z"),
                        &format!("2026-11-{day:02}T{:02}:30:00Z", hour + 2),
                    )
                    .gpu_count(1 + i % 3)
                    .outcome(if i % 5 == 0 { "failed" } else { "completed" })
                    .into()
                })
                .collect();
            let response = app
                .post("/v1/job-records", &app.admin, Value::Array(records))
                .await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
        }
    });
    futures::stream::iter(posts)
        .buffer_unordered(4)
        .collect::<Vec<_>>()
        .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(compactor.await.unwrap() > 0);

    compact(&app).await;
    assert_eq!(pending(&app).await, 0);
    let view = cost(&app, NOVEMBER).await;
    assert_eq!(view["tasks_completed"], 20 * 32);
    assert_same_figures(
        &figures(&view),
        &from_segments(&app, "2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z").await,
        "November",
    );
}

/// What rating stores, every table's rows in key order as text: delta rows summed per key
/// (numbers without trailing zeros), contracts by name.
pub(crate) async fn rated_state(app: &TestApp) -> Vec<(&'static str, Vec<String>)> {
    let tables = [
        ("rated_segments", "project_id, task_id, attempt, seq"),
        ("rated_records", "project_id, task_id, attempt"),
        (
            "cost_daily",
            "project_id, day, gpu_model, billing_mode, outcome, contract_id, unrated_reason, \
             output_unit",
        ),
        (
            "cost_monthly",
            "project_id, month, gpu_model, billing_mode, outcome, contract_id, unrated_reason, \
             output_unit",
        ),
        (
            "util_daily",
            "project_id, day, gpu_model, billing_mode, outcome, contract_id",
        ),
        (
            "util_monthly",
            "project_id, month, gpu_model, billing_mode, outcome, contract_id",
        ),
        (
            "records_monthly",
            "project_id, month, gpu_model, billing_mode, outcome",
        ),
        ("contract_usage_hourly", "contract_id, hour, project_id"),
        (
            "task_monthly",
            "project_id, month, task_id, contract_id, gpu_model, billing_mode",
        ),
        ("tasks", "project_id, task_id"),
    ];
    let mut state = Vec::new();
    for (table, key) in tables {
        let columns: Vec<(String, String)> = sqlx::query_as(
            "SELECT column_name::text, data_type::text FROM information_schema.columns \
             WHERE table_name = $1 ORDER BY ordinal_position",
        )
        .bind(table)
        .fetch_all(&app.pool)
        .await
        .unwrap();
        let summed = columns.iter().any(|(name, _)| name == "delta");
        let named = |column: &str| match column {
            "contract_id" => {
                "(SELECT c.name FROM contracts c WHERE c.id = t.contract_id)".to_owned()
            }
            _ => format!("t.{column}::text"),
        };
        let keys: Vec<String> = key.split(", ").map(named).collect();
        let values: Vec<String> = columns
            .iter()
            .filter(|(name, _)| name != "delta" && !key.split(", ").any(|k| k == name))
            .map(|(name, kind)| match kind.as_str() {
                "numeric" | "bigint" | "integer" if summed => {
                    format!("trim_scale(sum(t.{name})::numeric)::text")
                }
                _ => format!("min({})", named(name)),
            })
            .collect();
        let rows: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT concat_ws('|', {keys}) || ' = ' || concat_ws('|', {values}) \
             FROM {table} t GROUP BY {keys} ORDER BY {keys}",
            keys = keys.join(", "),
            values = values.join(", "),
        ))
        .fetch_all(&app.pool)
        .await
        .unwrap();
        state.push((table, rows));
    }
    state
}

/// The worked example, with records that carry telemetry and MIG slices, one across
/// October's end and one priced in euros, C1 and the reservation C4 at these prices and
/// November's euro at this rate.
async fn priced_example(app: &TestApp, (c1, c4, euro): (&str, &str, &str)) -> [String; 4] {
    app.create_project("vision", "USD").await;
    contract("L40S", "on_demand", "2.00")
        .named("EU")
        .currency("EUR")
        .create(app)
        .await;
    put_euro(app, euro).await;
    let [first, second, third, fourth] = worked_example_contracts();
    let ids = [
        first.with("price_per_gpu_hour", c1).create(app).await,
        second.create(app).await,
        third.create(app).await,
        fourth.with("price_per_gpu_hour", c4).create(app).await,
    ];
    app.ingest(worked_example_records()).await;
    app.ingest([
        record("u1", "2026-11-03T00:00:00Z", "2026-11-03T05:30:00Z")
            .gpu_seconds_busy(9000)
            .with("gpu_util", "0.95")
            .with("sm_active", "0.2")
            .with("memory_peak_gib", 30)
            .output(70, "samples"),
        record("u2", "2026-11-06T00:00:00Z", "2026-11-06T01:00:00Z")
            .gpu_count(2)
            .with("mig_profile", "3g.40gb")
            .with("sm_active", "0.7"),
        record("u3", "2026-11-12T03:00:00Z", "2026-11-12T09:00:00Z")
            .gpu_model("A100")
            .billing_mode("reserved")
            .gpu_count(3)
            .outcome("failed"),
        record("u4", "2026-10-30T20:00:00Z", "2026-11-02T04:00:00Z").gpu_seconds_busy(100000),
        record("u5", "2026-11-07T10:00:00Z", "2026-11-07T13:20:00Z")
            .gpu_model("L40S")
            .gpu_seconds_busy(7000),
    ])
    .await;
    ids
}

async fn put_euro(app: &TestApp, rate: &str) {
    let put = app
        .put(
            "/v1/fx-rates/2026-11/EUR/USD",
            &app.admin,
            json!({ "rate": rate }),
        )
        .await;
    assert_eq!(put.status, StatusCode::OK, "{}", put.text());
}

/// Row versions of what a price change should leave alone, in key order.
async fn row_versions(app: &TestApp, table: &str) -> String {
    let order = match table {
        "rated_segments" => "project_id, task_id, attempt, seq",
        _ => "project_id, task_id, attempt",
    };
    sqlx::query_scalar(&format!(
        "SELECT string_agg(xmin::text, ',' ORDER BY {order}) FROM {table}"
    ))
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_price_or_rate_change_writes_no_rated_row_and_every_figure_reads_it() {
    let settings = || Settings {
        timezone: NEW_YORK,
        ..Settings::default()
    };
    let (app, at_new_prices) = futures::join!(
        TestApp::spawn_with(settings()),
        TestApp::spawn_with(settings())
    );
    let [c1, _, _, c4] = priced_example(&app, ("2.50", "1.00", "1.10")).await;
    priced_example(&at_new_prices, ("3.10", "0.85", "1.25")).await;
    let before = rated_state(&app).await;
    let records = row_versions(&app, "rated_records").await;
    let stored_segments = row_versions(&app, "rated_segments").await;
    let old_cost = cost(&app, NOVEMBER).await;

    for (id, price) in [(&c1, "3.10"), (&c4, "0.85")] {
        let changed = app
            .patch(
                &format!("/v1/contracts/{id}"),
                &app.admin,
                json!({"price_per_gpu_hour": price}),
            )
            .await;
        assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    }
    put_euro(&app, "1.25").await;
    // What is stored holds no price: it is the same before and after, and the same as
    // what rating at the new prices stores.
    let after = rated_state(&app).await;
    assert_eq!(after, before);
    assert_eq!(after, rated_state(&at_new_prices).await);
    assert_eq!(row_versions(&app, "rated_records").await, records);
    assert_eq!(row_versions(&app, "rated_segments").await, stored_segments);
    // Every figure read reflects the new prices.
    let new_cost = cost(&app, NOVEMBER).await;
    assert_ne!(new_cost, old_cost);
    assert_eq!(new_cost, cost(&at_new_prices, NOVEMBER).await);

    // A new name or commitment re-rates nothing; the commitment is read as it is.
    let segments = row_versions(&app, "rated_segments").await;
    let (_, [committed, unused, _]) = reservation_figures(&app, &c4).await;
    let renamed = app
        .patch(
            &format!("/v1/contracts/{c4}"),
            &app.admin,
            json!({"name": "C4 renewed", "committed_gpus": 3}),
        )
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.text());
    assert_eq!(row_versions(&app, "rated_segments").await, segments);
    let (_, [committed_now, unused_now, _]) = reservation_figures(&app, &c4).await;
    // C4 runs through UTC's November, 716 hours of New York's: a third GPU commits 716 more
    // GPU-hours, all unused but the 6 hours u3 ran on three.
    assert_eq!(committed_now - committed, Decimal::from(716));
    assert_eq!(unused_now - unused, Decimal::from(710));
}

#[tokio::test]
async fn rating_a_rated_record_as_fresh_fails_and_double_counts_nothing() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let before = rated_state(&app).await;
    let key = RecordKey {
        project: "vision".to_owned(),
        task_id: "t1".to_owned(),
        attempt: 1,
    };
    let mut tx = app.pool.begin().await.unwrap();
    let rated = rating::rate_records(&mut tx, &[key], chrono_tz::UTC, true).await;
    let error = rated.expect_err("t1's segments were stored a second time");
    assert!(
        format!("{error:#}").contains("rated_segments_pkey"),
        "{error:#}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(rated_state(&app).await, before);
}
