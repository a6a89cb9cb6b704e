//! taskledger: what each finished GPU task really cost.
//!
//! Dependencies point one way, left to right:
//!
//! `domain` ← `store` (with `db`) ← `ledger` (with `config`) ← `http`, `workers`, `cli`,
//! `collectors` ← `server`
//!
//! - `domain`: validated values, access rules and the cost model (pure, no I/O);
//! - `store`: the SQL layer, one module per aggregate; `db` connects, migrates and runs the
//!   embedded cluster;
//! - `config`: the settings the use cases read (time zone, clock);
//! - `ledger`: the use cases (ingest, pricing, cost, alerting, reports, FOCUS export,
//!   tokens, import), each owning its transactions;
//! - `http`: the REST API, one module per resource, with its OpenAPI description;
//! - `workers`: background work (alert delivery, burn re-evaluation, rollup compaction);
//! - `cli`: the command line's arguments and one-off commands;
//! - `collectors`: read a scheduler's finished jobs on a schedule (Slurm's sacct, Kubernetes
//!   pods in Prometheus) and store or post them;
//! - `server`: the wiring — parses the command line, opens the database, starts the
//!   workers and serves.

pub mod cli;
pub mod collectors;
pub mod config;
pub mod db;
pub mod domain;
pub mod exports;
pub mod http;
pub mod ledger;
pub mod server;
pub mod sources;
pub mod store;
pub mod workers;
