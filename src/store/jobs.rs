//! Background jobs shared by every replica on one database: an advisory lock per job, so
//! that one replica at a time runs it, and a schedule kept in the database, so that the
//! replicas together run a periodic job once per interval rather than once each.

use std::time::Duration;

use sqlx::{PgPool, Postgres, Transaction};

/// The advisory lock (a two-key PostgreSQL advisory lock) that a job holds while it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobLockKey(pub i32, pub i32);

/// Rollup compaction, and the rebuild of the rollups for another ledger time zone, which
/// must not run beside it: one transaction at a time across replicas.
pub const COMPACTION: JobLockKey = JobLockKey(0x726f_6c6c, 1);

/// The periodic re-evaluation of budget burn.
pub const BURN_TICK: JobLockKey = JobLockKey(0x6275_726e, 1);

/// A job's lock, held by an open transaction on a connection of its own: the lock goes with
/// the connection, so a replica that dies mid-run leaves nothing held. The transaction writes
/// nothing, so it holds back no vacuum.
pub struct JobLock(Transaction<'static, Postgres>);

/// Takes `key` unless another session holds it.
pub async fn try_lock(pool: &PgPool, key: JobLockKey) -> sqlx::Result<Option<JobLock>> {
    let mut tx = pool.begin().await?;
    let locked = sqlx::query_scalar!("SELECT pg_try_advisory_xact_lock($1, $2)", key.0, key.1)
        .fetch_one(&mut *tx)
        .await?;
    if locked == Some(true) {
        Ok(Some(JobLock(tx)))
    } else {
        tx.rollback().await?;
        Ok(None)
    }
}

impl JobLock {
    pub async fn release(self) -> sqlx::Result<()> {
        self.0.rollback().await
    }
}

/// Claims the run of `job` that is due now: true, and the next run due `interval` from now,
/// when no replica started one within the last `interval`; false otherwise.
pub async fn claim_due_run(pool: &PgPool, job: &str, interval: Duration) -> sqlx::Result<bool> {
    // A little slack, so that a replica whose timer fires a moment early still finds it due.
    let slack_micros = i64::try_from(interval.as_micros() * 9 / 10).unwrap_or(i64::MAX);
    // The run is stamped with the database's clock in whole microseconds, so the condition
    // compares whole numbers only, as Citus requires of the WHERE of an ON CONFLICT.
    let claimed = sqlx::query_scalar!(
        "INSERT INTO settings (key, value) \
         VALUES ('job_last_run_micros:' || $1::text, \
                 ((extract(epoch FROM now()) * 1000000)::bigint)::text) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value \
         WHERE settings.value::bigint <= EXCLUDED.value::bigint - $2 \
         RETURNING key",
        job,
        slack_micros,
    )
    .fetch_optional(pool)
    .await?;
    Ok(claimed.is_some())
}
