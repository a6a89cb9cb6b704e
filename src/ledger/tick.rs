//! The periodic judgement: budget burn grows with accrued unused commitment and forecasts
//! even when no record arrives, and nodes still up grow idler with time. Once an hour the
//! same tick judges workloads for efficiency regressions.

use sqlx::PgPool;

use crate::config::Settings;
use crate::ledger::{alerting, regressions, zombies};
use crate::store;

/// The periodic burn and zombie judgement, run by one replica at a time and at most once per
/// `interval`: `None` when another replica holds the tick, `Some(false)` when it ran within
/// the interval, `Some(true)` when it ran now.
pub async fn run_due(
    pool: &PgPool,
    settings: &Settings,
    job: &str,
    interval: std::time::Duration,
) -> sqlx::Result<Option<bool>> {
    let Some(lock) = store::jobs::try_lock(pool, store::jobs::BURN_TICK).await? else {
        return Ok(None);
    };
    let ran = store::jobs::claim_due_run(pool, job, interval).await?;
    if ran {
        alerting::evaluate_current_month(pool, settings).await;
        if let Err(error) = zombies::judge(pool, None, settings).await {
            tracing::warn!(error = %error, "judging zombie capacity failed");
        }
        match store::jobs::claim_due_run(pool, regressions::JOB, regressions::INTERVAL).await {
            Ok(true) => {
                if let Err(error) = regressions::judge(pool, None, settings).await {
                    tracing::warn!(error = %error, "judging efficiency regressions failed");
                }
            }
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(error = %error, "scheduling efficiency regressions failed")
            }
        }
    }
    lock.release().await?;
    Ok(Some(ran))
}
