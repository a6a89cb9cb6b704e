//! The domain: validated values, access rules and the cost model, free of I/O.

pub mod access;
pub mod burn;
pub mod capacity;
pub mod capacity_plan;
pub mod commitment;
pub mod contract;
pub mod csv_cell;
pub mod demo;
pub mod figures;
pub mod focus;
pub mod gpu;
pub mod idle;
pub mod kubernetes;
pub mod ledger_time;
pub mod rating;
pub mod record;
pub mod rightsizing;
pub mod slurm;
pub mod source;
pub mod summary;
pub mod task;
pub mod utilisation;
pub mod validation;
pub mod values;
pub mod what_if;
