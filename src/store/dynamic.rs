//! The statements whose text is assembled at run time, and so checked by PostgreSQL when they
//! run rather than by the compiler when it builds.
//!
//! Every other statement in `store` is a `query!`, `query_as!` or `query_scalar!` macro,
//! checked against the migrated schema at build time (or against `.sqlx/` offline). A
//! statement goes through this module only when its text cannot be one literal:
//!
//! - its filters or rows are optional or variable in number (a report's filters, a batch's
//!   `VALUES` lists assembled through [`super::binder::Binder`]);
//! - it names a table, column or function chosen at run time (the rollup families and their
//!   levels, the rating lock of a contract kind);
//! - PostgreSQL takes no parameter where the value goes (`SET TRANSACTION SNAPSHOT '…'`).
//!
//! Each caller says which of these it is where it calls. A fixed statement never comes here:
//! `tests/architecture.rs` refuses a string literal passed to these functions and any
//! run-time-checked statement elsewhere in `store`.

use sqlx::postgres::{PgArguments, PgRow, Postgres};
use sqlx::query::{Query, QueryAs, QueryScalar};

/// A statement assembled at run time, without parameters or binding them one by one.
pub fn query(sql: &str) -> Query<'_, Postgres, PgArguments> {
    sqlx::query(sql)
}

/// A statement assembled at run time, returning rows as `O`.
pub fn query_as<'q, O>(sql: &'q str) -> QueryAs<'q, Postgres, O, PgArguments>
where
    O: for<'r> sqlx::FromRow<'r, PgRow>,
{
    sqlx::query_as(sql)
}

/// A statement assembled at run time, returning one column.
pub fn query_scalar<'q, O>(sql: &'q str) -> QueryScalar<'q, Postgres, O, PgArguments>
where
    (O,): for<'r> sqlx::FromRow<'r, PgRow>,
{
    sqlx::query_scalar(sql)
}

/// A statement assembled at run time with its parameters already bound.
pub fn query_with(sql: &str, arguments: PgArguments) -> Query<'_, Postgres, PgArguments> {
    sqlx::query_with(sql, arguments)
}

/// A statement assembled at run time with its parameters already bound, returning rows as `O`.
pub fn query_as_with<O>(sql: &str, arguments: PgArguments) -> QueryAs<'_, Postgres, O, PgArguments>
where
    O: for<'r> sqlx::FromRow<'r, PgRow>,
{
    sqlx::query_as_with(sql, arguments)
}
