//! Background work: alert delivery and the periodic re-evaluation of budget burn.

pub mod webhooks;
