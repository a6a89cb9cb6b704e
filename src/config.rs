//! What the running service is configured with: the ledger time zone and the clock.

use chrono::{DateTime, Utc};

/// Settings every use case may read.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Where days and months begin.
    pub timezone: chrono_tz::Tz,
    /// What "now" is: the system clock, or a fixed instant for reproducible runs.
    pub clock: Clock,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timezone: chrono_tz::UTC,
            clock: Clock::System,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    System,
    Fixed(DateTime<Utc>),
}

impl Clock {
    pub fn now(&self) -> DateTime<Utc> {
        match self {
            Clock::System => Utc::now(),
            Clock::Fixed(at) => *at,
        }
    }
}
