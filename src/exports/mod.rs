//! Formats the ledger's figures leave in for other tools: the FinOps FOCUS cost-and-usage
//! CSV, the audit log's CSV, and the rule that keeps every CSV cell a spreadsheet opens as
//! text.
//!
//! Pure: an export is rendered from figures the ledger has already read.

pub mod audit;
pub mod csv_cell;
pub mod focus;
pub mod notify;
