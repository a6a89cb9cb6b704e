//! Folds the rollups' delta rows into their compacted rows, so that reads stay small while
//! writers keep appending. Replicas take turns: compaction holds a lock across them.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::ledger::instruments;
use crate::workers::{RunOutcome, record_run};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

pub async fn run(pool: PgPool, interval: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    instruments::process_started();
    loop {
        let started = Instant::now();
        match crate::ledger::rating::compact(&pool).await {
            Ok(Some(done)) => {
                instruments::compaction_done(done.delta_rows, started.elapsed());
                record_run("compaction", RunOutcome::Ran);
                if done.delta_rows > 0 {
                    tracing::debug!(
                        delta_rows = done.delta_rows,
                        emptied_rows = done.emptied_rows,
                        "rollups compacted"
                    );
                }
            }
            Ok(None) => {
                instruments::compaction_done_elsewhere();
                record_run("compaction", RunOutcome::Locked);
            }
            Err(error) => tracing::warn!(error = format!("{error:#}"), "rollup compaction failed"),
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
