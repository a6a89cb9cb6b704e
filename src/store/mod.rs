//! The SQL layer: one file per aggregate. The use cases in `ledger` call these functions;
//! nothing else speaks SQL.

pub mod alerts;
pub mod closes;
pub mod contracts;
pub mod cost;
pub mod exports;
pub mod fx_rates;
pub mod projects;
pub mod rating;
pub mod records;
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
