//! Folds the rollups' delta rows into their compacted rows, so that reads stay small while
//! writers keep appending. Replicas take turns: compaction holds a lock across them.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;

use crate::workers::{RunOutcome, record_run};

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

pub async fn run(pool: PgPool, interval: Duration, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        match crate::store::rollups::compact(&pool).await {
            Ok(Some(done)) => {
                record_run("compaction", RunOutcome::Ran);
                if done.delta_rows > 0 {
                    tracing::debug!(
                        delta_rows = done.delta_rows,
                        emptied_rows = done.emptied_rows,
                        "rollups compacted"
                    );
                }
            }
            Ok(None) => record_run("compaction", RunOutcome::Locked),
            Err(error) => tracing::warn!(error = format!("{error:#}"), "rollup compaction failed"),
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
