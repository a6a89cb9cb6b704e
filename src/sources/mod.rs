//! Adapters from the formats other systems write to the ledger's inputs: Slurm's accounting
//! and node listings, Kubernetes pods and nodes as Prometheus holds them, FOCUS cloud bills,
//! and the demo's replayed cluster trace.
//!
//! Pure like the domain (no files, processes, database or clock: callers hand in text and
//! instants), but kept apart from it: the domain holds the cost rules and the values they
//! act on; a source only translates a foreign format into those values, naming what it
//! could not read.

pub mod batch;
pub mod demo;
pub mod focus;
pub mod kubernetes;
pub mod slurm;
