//! The SQL layer: one file per aggregate. Handlers call these functions; nothing else
//! speaks SQL.

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
pub mod tokens;

use sqlx::PgPool;

pub type Pool = PgPool;

/// Whether a database error is a violation of the named constraint.
pub fn is_constraint_violation(error: &sqlx::Error, constraint: &str) -> bool {
    match error {
        sqlx::Error::Database(db) => db.constraint() == Some(constraint),
        _ => false,
    }
}
