//! taskledger: what each finished GPU task really cost.
//!
//! - `domain`: validated values, access rules and the cost model (pure, no I/O);
//! - `store`: the SQL layer, one module per aggregate;
//! - `http`: the REST API, one module per resource, with its OpenAPI description;
//! - `db`: connecting to PostgreSQL, the embedded cluster and migrations;
//! - `app` and `cli`: the running service and its command line.

pub mod alerting;
pub mod app;
pub mod cli;
pub mod db;
pub mod domain;
pub mod error;
pub mod http;
pub mod import;
pub mod ingest;
pub mod reports;
pub mod store;
pub mod workers;
