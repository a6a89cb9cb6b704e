//! What the running service is configured with: the ledger time zone and the clock.

use chrono::{DateTime, TimeDelta, Utc};

use crate::domain::record::RecordRules;

/// Settings every use case may read.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// Where days and months begin.
    pub timezone: chrono_tz::Tz,
    /// What "now" is: the system clock, or a fixed instant for reproducible runs.
    pub clock: Clock,
    /// The longest a job record may last (`ended_at − started_at`).
    pub max_record_duration: TimeDelta,
}

impl Settings {
    /// What a job record is checked against now.
    pub fn record_rules(&self) -> RecordRules {
        RecordRules {
            now: self.clock.now(),
            max_duration: self.max_record_duration,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            timezone: chrono_tz::UTC,
            clock: Clock::System,
            max_record_duration: RecordRules::DEFAULT_MAX_DURATION,
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
