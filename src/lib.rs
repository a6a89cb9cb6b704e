//! taskledger: what each finished GPU task really cost.
//!
//! Dependencies point one way, left to right:
//!
//! `domain` ← `sources`, `exports`, `store` (with `db`) ← `ledger` (with `config`) ← `http`,
//! `workers`, `cli`, `collectors` ← `server`
//!
//! - `domain`: validated values, access rules and the cost model (pure, no I/O);
//! - `sources`: pure adapters from Slurm, Kubernetes, FOCUS bills and the demo trace to
//!   domain inputs; `exports`: pure formats for other tools (the FOCUS CSV);
//! - `store`: the SQL layer, one module per aggregate, compile-checked but for the
//!   statements assembled at run time; `db` connects, migrates and runs the embedded
//!   cluster;
//! - `config`: the settings the use cases read (time zone, clock);
//! - `ledger`: the use cases (ingest, pricing, cost, alerting, reports, FOCUS export,
//!   tokens, import), each owning its transactions, and the only door to `store` and `db`;
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
