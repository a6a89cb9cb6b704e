//! The SQL layer: one file per aggregate. The use cases in `ledger` call these functions;
//! nothing else speaks SQL.

pub mod alerts;
pub mod binder;
pub mod closes;
pub mod contracts;
pub mod cost;
pub mod exports;
pub mod fx_rates;
pub mod jobs;
pub mod numeric;
pub mod prices;
pub mod projects;
pub mod rating;
pub mod records;
pub mod rightsizing;
pub mod rollups;
pub mod settings;
pub mod tasks;
pub mod tokens;

use sqlx::{PgPool, Postgres, Transaction};

pub type Pool = PgPool;

/// A read-only transaction on one snapshot, so that the parts of an export or a report agree
/// with each other even while records are being rated.
pub async fn snapshot(pool: &PgPool) -> sqlx::Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// Whether a database error is a violation of the named constraint.
pub fn is_constraint_violation(error: &sqlx::Error, constraint: &str) -> bool {
    match error {
        sqlx::Error::Database(db) => db.constraint() == Some(constraint),
        _ => false,
    }
}

/// The newest migration applied successfully, if any.
pub async fn applied_migration(pool: &PgPool) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
        .fetch_one(pool)
        .await
}

/// Whether a database error means the database cannot be reached (down, restarting, or
/// every connection busy) rather than that a statement failed: worth retrying later.
pub fn is_outage(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)
    )
}
