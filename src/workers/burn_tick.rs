//! Re-evaluates budget burn periodically: spend grows with accrued unused commitment even
//! when no record arrives, and a forecast crosses the budget as the month goes by. The same
//! tick judges the nodes still up for zombie capacity: idleness grows with time too. Replicas
//! share the schedule: one of them runs each tick, and never two at once.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::Settings;
use crate::ledger::tick;
use crate::workers::{RunOutcome, record_run};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);

const JOB: &str = "burn_tick";

pub async fn run(
    pool: PgPool,
    settings: Settings,
    interval: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        match tick(&pool, &settings, interval).await {
            Ok(outcome) => record_run(JOB, outcome),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "the burn tick failed"),
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

/// Runs the tick if no other replica is running it and none ran it within `interval`.
async fn tick(pool: &PgPool, settings: &Settings, interval: Duration) -> sqlx::Result<RunOutcome> {
    Ok(match tick::run_due(pool, settings, JOB, interval).await? {
        None => RunOutcome::Locked,
        Some(true) => RunOutcome::Ran,
        Some(false) => RunOutcome::NotDue,
    })
}
