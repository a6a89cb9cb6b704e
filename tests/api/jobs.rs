//! Periodic background jobs across replicas: one at a time, once per interval.

use std::time::Duration;

use taskledger::store::jobs::{self, BURN_TICK, COMPACTION};

use crate::common::TestApp;

#[tokio::test]
async fn a_job_lock_is_held_by_one_session_at_a_time_and_per_job() {
    let app = TestApp::spawn().await;
    let held = jobs::try_lock(&app.pool, BURN_TICK).await.unwrap();
    assert!(held.is_some());
    assert!(
        jobs::try_lock(&app.pool, BURN_TICK)
            .await
            .unwrap()
            .is_none()
    );
    let other_job = jobs::try_lock(&app.pool, COMPACTION).await.unwrap();
    assert!(other_job.is_some());
    assert_eq!(
        taskledger::store::rollups::compact(&app.pool)
            .await
            .unwrap(),
        None
    );
    other_job.unwrap().release().await.unwrap();
    assert!(
        taskledger::store::rollups::compact(&app.pool)
            .await
            .unwrap()
            .is_some()
    );
    held.unwrap().release().await.unwrap();
    assert!(
        jobs::try_lock(&app.pool, BURN_TICK)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test]
async fn a_periodic_run_is_claimed_once_per_interval() {
    let app = TestApp::spawn().await;
    let interval = Duration::from_secs(3600);
    assert!(
        jobs::claim_due_run(&app.pool, "burn_tick", interval)
            .await
            .unwrap()
    );
    assert!(
        !jobs::claim_due_run(&app.pool, "burn_tick", interval)
            .await
            .unwrap()
    );
    assert!(
        jobs::claim_due_run(&app.pool, "other", interval)
            .await
            .unwrap()
    );
    let short = Duration::from_millis(200);
    tokio::time::sleep(short).await;
    assert!(
        jobs::claim_due_run(&app.pool, "burn_tick", short)
            .await
            .unwrap()
    );
    assert!(
        !jobs::claim_due_run(&app.pool, "burn_tick", short)
            .await
            .unwrap()
    );
}
