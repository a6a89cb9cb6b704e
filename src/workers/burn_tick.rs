//! Re-evaluates budget burn periodically: spend grows with accrued unused commitment even
//! when no record arrives, and a forecast crosses the budget as the month goes by. The same
//! tick judges the nodes still up for zombie capacity: idleness grows with time too. Replicas
//! share the schedule: one of them runs each tick, and never two at once.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

use crate::config::Settings;
use crate::store::jobs;
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
    let Some(lock) = jobs::try_lock(pool, jobs::BURN_TICK).await? else {
        return Ok(RunOutcome::Locked);
    };
    let outcome = if jobs::claim_due_run(pool, JOB, interval).await? {
        crate::ledger::alerting::evaluate_current_month(pool, settings).await;
        if let Err(error) = crate::ledger::zombies::judge(pool, None, settings).await {
            tracing::warn!(error = %error, "judging zombie capacity failed");
        }
        RunOutcome::Ran
    } else {
        RunOutcome::NotDue
    };
    lock.release().await?;
    Ok(outcome)
}
