//! The use cases: what the service does, each as one function that the HTTP layer, the
//! command line and the background workers call alike. A use case reads and writes through
//! `store`, computes with `domain`, owns its transactions, and reports failures as a
//! [`LedgerError`].

pub mod alert_event;
pub mod alerting;
pub mod audit;
pub mod bills;
pub mod capacity;
pub mod capacity_rollup;
pub mod carbon;
pub mod channels;
pub mod citus;
pub mod commitments;
pub mod cost;
pub mod demo;
pub mod efficiency;
pub mod error;
pub mod focus;
pub mod import;
pub mod ingest;
pub mod instruments;
pub mod mail;
pub mod notify;
pub mod planning;
pub mod pricing;
pub mod projects;
pub mod rating;
pub mod records;
pub mod regressions;
pub mod reports;
pub mod rightsizing;
pub mod routes;
pub mod sacct_import;
pub mod setup;
pub mod signin;
pub mod sources;
pub mod tasks;
pub mod tick;
pub mod tokens;
pub mod zombies;

pub use error::{LedgerError, LedgerResult};
