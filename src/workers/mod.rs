//! Background work: alert delivery, the periodic re-evaluation of budget burn and rollup
//! compaction.

pub mod burn_tick;
pub mod compaction;
pub mod webhooks;
