//! Background work: alert delivery and the periodic re-evaluation of budget burn.

pub mod burn_tick;
pub mod webhooks;
