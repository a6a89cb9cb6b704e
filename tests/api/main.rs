//! Integration tests: one binary, so the embedded PostgreSQL starts once per run.

mod alerts;
mod audit;
mod bills;
mod browser;
mod burn;
mod capacity;
mod capacity_rollup;
mod channels;
mod citus_placement;
mod commitments;
mod common;
mod contracts;
mod cost;
mod dashboard;
mod demo;
mod efficiency;
mod fixtures;
mod focus;
mod foundation;
mod hostile;
mod idle_alerts;
mod import;
mod ingest;
mod jobs;
mod kubernetes;
mod mail;
mod notify_formats;
mod owned_cards;
mod planning;
mod price_races;
#[path = "../support/prometheus.rs"]
mod prometheus;
mod queue_wait;
mod regressions;
mod reports;
mod rightsizing;
mod rollups;
mod routes;
mod signin;
mod signin_browser;
mod slurm;
#[path = "../support/mod.rs"]
mod support;
#[path = "../support/citus.rs"]
mod support_citus;
mod task_list;
mod tasks;
mod utilisation;
mod what_if;
