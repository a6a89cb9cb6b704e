//! Getting a database ready to serve: migrations, rollups in the ledger time zone, and the
//! secret alert webhooks are signed with.

use chrono_tz::Tz;
use sqlx::PgPool;

use crate::domain::access::generate_secret;
use crate::ledger::{capacity_rollup, rating};
use crate::store;

/// The database a process works on, and the embedded database's state as the supervisor that
/// restarts it reports it.
pub use crate::db::Database;
pub use crate::db::supervisor::{ClusterState, ClusterStatus};

/// Applies pending migrations, makes the daily and monthly rollups those of `tz`, and
/// finishes the re-assignments a stopped service left owing; true when the rollups had to be
/// rebuilt.
pub async fn prepare(pool: &PgPool, tz: Tz) -> anyhow::Result<bool> {
    crate::db::migrate(pool).await?;
    let rebuilt = store::rollups::align_to_time_zone(pool, tz).await?;
    if capacity_rollup::align_to_time_zone(pool, tz).await? {
        tracing::info!(time_zone = tz.name(), "capacity rollup built");
    }
    let finished = rating::finish_pending_jobs(pool, tz).await?;
    if finished > 0 {
        tracing::info!(
            jobs = finished,
            "finished the re-assignments left by a stopped service"
        );
    }
    Ok(rebuilt)
}

/// `configured` (from `TASKLEDGER_WEBHOOK_SECRET`), or else a secret generated once and kept
/// in the database, so that every replica signs alike.
pub async fn webhook_secret(pool: &PgPool, configured: Option<&str>) -> anyhow::Result<String> {
    match configured {
        Some(secret) => Ok(secret.to_owned()),
        None => Ok(store::settings::get_or_create(pool, "webhook_secret", generate_secret).await?),
    }
}

/// The newest migration the database has applied; `None` before the first.
pub async fn applied_migration(pool: &PgPool) -> sqlx::Result<Option<i64>> {
    store::applied_migration(pool).await
}

/// The newest migration this build carries.
pub fn latest_migration() -> i64 {
    crate::db::latest_migration_version()
}
