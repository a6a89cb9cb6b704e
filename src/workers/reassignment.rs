//! Finishes the re-assignments a contract change owes when its own run did not: the change's
//! request failed or was dropped part-way, or its replica stopped. Until then the records of
//! that model and billing mode keep the contracts they were assigned before the change, so
//! the worker looks for such jobs often. Each job is run by one replica at a time: whoever
//! runs it holds its lock.

use std::future::Future;
use std::time::Duration;

use chrono_tz::Tz;
use sqlx::PgPool;

use crate::ledger::rating;
use crate::workers::{RunOutcome, record_run};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

const JOB: &str = "reassignment";

pub async fn run(pool: PgPool, tz: Tz, interval: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        match rating::finish_pending_jobs(&pool, tz).await {
            Ok(0) => {}
            Ok(jobs) => {
                record_run(JOB, RunOutcome::Ran);
                tracing::info!(jobs, "finished re-assignments a contract change owed");
            }
            Err(error) => {
                tracing::warn!(error = format!("{error:#}"), "a re-assignment failed")
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
