//! A reservation's whole days are netted in the database, from each day's sorted usage, and
//! must leave exactly the unused commitment its hours leave netted one by one.

use chrono::{DateTime, Duration, Utc};
use rust_decimal::Decimal;
use uuid::Uuid;

use taskledger::config::Settings;
use taskledger::domain::commitment::{LedgerWindow, unused_commitment_by_day};
use taskledger::domain::rating::{BillingMode, Contract};
use taskledger::store::{cost, rollups};

use crate::common::TestApp;
use crate::fixtures::{contract, record};

fn utc(text: &str) -> DateTime<Utc> {
    text.parse().unwrap()
}

/// The reservation of `id` as netting sees it.
fn reservation(id: &str, from: &str, until: &str) -> Contract {
    Contract {
        id: id.parse().unwrap(),
        gpu_model: "A100".into(),
        billing_mode: BillingMode::Reserved,
        project: Some("vision".into()),
        provider: None,
        region: None,
        valid_from: utc(from),
        valid_until: Some(utc(until)),
        price_per_gpu_hour: Decimal::new(150, 2),
        currency: "USD".into(),
        committed_gpus: Some(Decimal::from(3)),
        power_price_per_gpu_hour: Decimal::ZERO,
        energy_price_per_kwh: Decimal::ZERO,
    }
}

/// Each ledger day's netting of `reservation` over `window`, its whole days netted in the
/// database, and the same with every hour read and netted one by one; and how many days the
/// database netted.
async fn netted_both_ways(
    app: &TestApp,
    reservation: &Contract,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
    tz: chrono_tz::Tz,
) -> (
    Vec<taskledger::domain::commitment::UnusedCommitment>,
    Vec<taskledger::domain::commitment::UnusedCommitment>,
    usize,
) {
    let window = LedgerWindow::new(from, to, tz);
    let ids: Vec<Uuid> = vec![reservation.id];
    let whole = vec![(reservation.id, window.whole_days(reservation).unwrap())];
    let mut conn = app.pool.acquire().await.unwrap();
    let netted = cost::contract_usage(
        &mut conn,
        (from, to),
        &ids,
        tz,
        &whole,
        &window.regular_days(),
        None,
    )
    .await
    .unwrap()
    .remove(&reservation.id)
    .unwrap_or_default();
    let hourly = cost::contract_usage(&mut conn, (from, to), &ids, tz, &[], &[], None)
        .await
        .unwrap()
        .remove(&reservation.id)
        .unwrap_or_default();
    assert!(hourly.capped_days.is_empty());
    // The delta rows read apart are read only on one snapshot, and then net as in one
    // statement.
    assert!(
        cost::pending_usage(&mut conn, (from, to), &ids)
            .await
            .unwrap()
            .is_none()
    );
    let mut snapshot = taskledger::store::snapshot(&app.pool).await.unwrap();
    let pending = cost::pending_usage(&mut snapshot, (from, to), &ids)
        .await
        .unwrap()
        .expect("read on a snapshot");
    let apart = cost::contract_usage(
        &mut snapshot,
        (from, to),
        &ids,
        tz,
        &whole,
        &window.regular_days(),
        Some(pending),
    )
    .await
    .unwrap()
    .remove(&reservation.id)
    .unwrap_or_default();
    snapshot.commit().await.unwrap();
    assert_eq!(apart, netted);
    (
        unused_commitment_by_day(reservation, &netted.hours, &netted.capped_days, &window),
        unused_commitment_by_day(reservation, &hourly.hours, &[], &window),
        netted.capped_days.len(),
    )
}

#[tokio::test]
async fn whole_days_netted_in_the_database_leave_what_their_hours_leave() {
    // Kolkata's ledger hours begin at half past the UTC hour and its days at 18:30 UTC.
    let tz = chrono_tz::Asia::Kolkata;
    let app = TestApp::spawn_with(Settings {
        timezone: tz,
        ..Settings::default()
    })
    .await;
    app.create_project("vision", "USD").await;
    let (valid_from, valid_until) = ("2026-11-02T07:10:00Z", "2026-11-20T13:00:00Z");
    let id = contract("A100", "reserved", "1.50")
        .project("vision")
        .valid_from(valid_from)
        .valid_until(valid_until)
        .committed_gpus(3)
        .create(&app)
        .await;
    let reservation = reservation(&id, valid_from, valid_until);
    // Records of 1 to 6 GPUs, some of a third of a second more than whole minutes, so that
    // hours use less than, exactly or more than the 3 committed GPUs, and some none.
    let records = |first: i64, count: i64| -> Vec<_> {
        (first..first + count)
            .map(|i| {
                let start = utc("2026-11-01T00:30:00Z") + Duration::minutes(i * 337 % 30_000);
                let end = start + Duration::minutes(20 + i * 53 % 200);
                let end = if i % 3 == 0 {
                    end + Duration::milliseconds(333)
                } else {
                    end
                };
                record(&format!("r{i}"), &start.to_rfc3339(), &end.to_rfc3339())
                    .gpu_model("A100")
                    .billing_mode("reserved")
                    .gpu_count(1 + i % 6)
            })
            .collect()
    };
    app.ingest(records(0, 150)).await;
    rollups::compact(&app.pool).await.unwrap().unwrap();
    let month = (utc("2026-10-31T18:30:00Z"), utc("2026-11-30T18:30:00Z"));
    // The test's database never recorded a ledger time zone, so its rows were compacted per
    // UTC day, and each holds hours of two Kolkata days: they are netted hour by hour.
    let (netted, hourly, capped) = netted_both_ways(&app, &reservation, month, tz).await;
    assert_eq!(netted, hourly);
    assert_eq!(capped, 0);

    // As the service does at start, the rollups are rebuilt for its time zone.
    assert!(rollups::align_to_time_zone(&app.pool, tz).await.unwrap());
    let (netted, hourly, capped) = netted_both_ways(&app, &reservation, month, tz).await;
    assert_eq!(netted, hourly);
    assert!(capped >= 15, "{capped} days netted in the database");
    let some_over = sqlx::query_scalar::<_, bool>(
        "SELECT bool_or(u > 10800) AND bool_or(u < 10800) AND bool_or(u = 10800) \
         FROM contract_usage_daily, unnest(used) u",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(some_over, "hours use less, exactly and more than committed");

    // Days with usage not yet compacted are netted hour by hour; a window ending mid-day
    // nets its last day hour by hour.
    app.ingest(records(150, 12)).await;
    assert!(rollups::delta_rows(&app.pool).await.unwrap() > 0);
    let until_mid_day = (month.0, utc("2026-11-12T09:10:00Z"));
    for window in [month, until_mid_day] {
        let (netted, hourly, capped) = netted_both_ways(&app, &reservation, window, tz).await;
        assert_eq!(netted, hourly, "{window:?}");
        assert!(capped >= 5, "{capped} days netted in the database");
    }
    rollups::compact(&app.pool).await.unwrap().unwrap();
    let (netted, hourly, _) = netted_both_ways(&app, &reservation, month, tz).await;
    assert_eq!(netted, hourly);

    // The report and the project's cost carry the same unused commitment.
    let report = app.get("/v1/reports/monthly/2026-11", &app.admin).await;
    let line = report.json()["commitments"][0].clone();
    let unused: Decimal = hourly.iter().map(|day| day.cost).sum();
    let shown = crate::common::dec(&line["unused_commitment"]);
    assert!(
        (shown - unused).abs() < Decimal::new(1, 12),
        "{line}: {unused}"
    );
    assert!(unused > Decimal::from(500), "{unused}");
}

#[tokio::test]
async fn netting_stays_exact_while_compaction_races_ingest_on_a_reservation() {
    // Four writers post a reservation's records while compaction folds them into the sorted
    // day rows; then the database's netting must equal netting recomputed from the segments.
    let tz = chrono_tz::UTC;
    let app = TestApp::spawn().await;
    assert!(rollups::align_to_time_zone(&app.pool, tz).await.unwrap());
    app.create_project("vision", "USD").await;
    let (valid_from, valid_until) = ("2026-11-01T00:00:00Z", "2026-12-01T00:00:00Z");
    let id = contract("A100", "reserved", "1.50")
        .project("vision")
        .valid_from(valid_from)
        .valid_until(valid_until)
        .committed_gpus(3)
        .create(&app)
        .await;
    let reservation = reservation(&id, valid_from, valid_until);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let compactor = {
        let (pool, done) = (app.pool.clone(), done.clone());
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
    let posts = (0..16).map(|batch| {
        let app = &app;
        async move {
            let records: Vec<_> = (0..25)
                .map(|i| {
                    let start = utc("2026-11-02T00:00:00Z")
                        + Duration::minutes((batch * 25 + i) * 211 % 40_000);
                    let end = start + Duration::minutes(30 + i * 37 % 240);
                    record(
                        &format!("b{batch}-{i}"),
                        &start.to_rfc3339(),
                        &end.to_rfc3339(),
                    )
                    .gpu_model("A100")
                    .billing_mode("reserved")
                    .gpu_count(1 + i % 4)
                })
                .collect();
            app.ingest(records).await;
        }
    });
    futures::StreamExt::collect::<Vec<_>>(futures::StreamExt::buffer_unordered(
        futures::stream::iter(posts),
        4,
    ))
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert!(compactor.await.unwrap() > 0);
    rollups::compact(&app.pool).await.unwrap().unwrap();

    let month = (utc(valid_from), utc(valid_until));
    let (netted, _, capped) = netted_both_ways(&app, &reservation, month, tz).await;
    assert!(capped >= 20, "{capped} days netted in the database");
    // From scratch: each hour's GPU-seconds summed straight from the rated segments.
    let hours: Vec<(DateTime<Utc>, Decimal)> = sqlx::query_as(
        "SELECT hour, sum(gpu_seconds_held) FROM rated_segments \
         WHERE contract_id = $1 GROUP BY hour ORDER BY hour",
    )
    .bind(reservation.id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert!(hours.len() > 300, "{} hours used", hours.len());
    let window = LedgerWindow::new(month.0, month.1, tz);
    assert_eq!(
        netted,
        unused_commitment_by_day(&reservation, &hours, &[], &window)
    );
}
