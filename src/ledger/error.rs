//! The one error of the use cases: what went wrong in terms a caller can act on. The HTTP
//! layer turns it into a problem document; the command line into one line of text.

use crate::db;
use crate::domain::validation::{FieldError, Violations};
use crate::ledger::instruments;
use crate::store;

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// The request names invalid values; each field error says which and why.
    #[error("the request is invalid")]
    Invalid(Vec<FieldError>),
    #[error("{0}")]
    NotFound(String),
    /// The request contradicts what is stored; the field errors point at the cause.
    #[error("{0}")]
    Conflict(String, Vec<FieldError>),
    /// The database cannot be reached just now; the same request may succeed later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    /// Anything else; its cause chain is kept for the log, never shown to a client.
    #[error(transparent)]
    Internal(anyhow::Error),
}

pub type LedgerResult<T> = Result<T, LedgerError>;

impl LedgerError {
    pub fn invalid(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError::new(pointer, message)])
    }

    pub fn conflict(detail: impl Into<String>) -> Self {
        Self::Conflict(detail.into(), Vec::new())
    }
}

impl From<Violations> for LedgerError {
    fn from(violations: Violations) -> Self {
        Self::Invalid(violations.into_vec())
    }
}

impl From<sqlx::Error> for LedgerError {
    fn from(error: sqlx::Error) -> Self {
        if is_outage(&error) {
            count_pool_timeout(&error);
            Self::Unavailable(error.to_string())
        } else {
            Self::Internal(anyhow::Error::new(error).context("a database statement failed"))
        }
    }
}

impl From<anyhow::Error> for LedgerError {
    /// An outage anywhere in the cause chain is still an outage.
    fn from(error: anyhow::Error) -> Self {
        let outage = error
            .chain()
            .filter_map(|cause| cause.downcast_ref::<sqlx::Error>())
            .find(|cause| is_outage(cause))
            .inspect(|cause| count_pool_timeout(cause))
            .map(ToString::to_string);
        match outage {
            Some(cause) => Self::Unavailable(cause),
            None => Self::Internal(error),
        }
    }
}

/// A call that waited for a pool connection as long as it may: the pool is too small for
/// the load, or the database too slow.
fn count_pool_timeout(error: &sqlx::Error) {
    if matches!(error, sqlx::Error::PoolTimedOut) {
        metrics::counter!(instruments::DB_POOL_TIMEOUTS).increment(1);
    }
}

/// The database is down, restarting or out of connections: no fault of the request.
fn is_outage(error: &sqlx::Error) -> bool {
    store::is_outage(error) || db::is_server_unavailable(error)
}
