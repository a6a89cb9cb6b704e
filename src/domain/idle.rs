//! Idle GPUs (COST_MODEL.md §8): a finished record that held GPUs for at least a project's
//! minimum while the chip did next to nothing — the notebook left open over a weekend, the
//! job stuck waiting on data — calls for one `idle_gpu` alert per task.
//!
//! How idle a record was is its SM activity when it reports one, else its reported busy
//! share (`gpu_seconds_busy / gpu_seconds_held`). A record with neither gives no evidence and
//! is never judged idle: busy time derived from SM activity is not a second opinion, and no
//! figure at all is not a zero.

use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::ledger_time::SECONDS_PER_HOUR;

/// The default threshold: under 5 % SM activity (or busy share) is idle.
pub const DEFAULT_THRESHOLD: Decimal = Decimal::from_parts(5, 0, 0, false, 2);
/// The default minimum: records that held less than one GPU-hour are not judged.
pub const DEFAULT_MIN_GPU_HOURS: Decimal = Decimal::ONE;

/// Which figure told how idle a record was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum IdleMeasure {
    /// `sm_active` as reported.
    SmActive,
    /// `gpu_seconds_busy / gpu_seconds_held`, for a record without `sm_active`.
    BusyShare,
}

impl IdleMeasure {
    pub fn as_str(&self) -> &'static str {
        match self {
            IdleMeasure::SmActive => "sm_active",
            IdleMeasure::BusyShare => "busy_share",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "sm_active" => Some(IdleMeasure::SmActive),
            "busy_share" => Some(IdleMeasure::BusyShare),
            _ => None,
        }
    }
}

/// How busy a record's GPUs were, and by which measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activity {
    pub measure: IdleMeasure,
    /// From 0 to 1.
    pub value: Decimal,
}

/// A record's activity: its SM activity, else its reported busy share; `None` without
/// either (or without held time to share the busy time over).
pub fn activity(
    held: Decimal,
    busy: Option<Decimal>,
    sm_active: Option<Decimal>,
) -> Option<Activity> {
    if let Some(sm) = sm_active {
        return Some(Activity {
            measure: IdleMeasure::SmActive,
            value: sm,
        });
    }
    let busy = busy?;
    (held > Decimal::ZERO).then(|| Activity {
        measure: IdleMeasure::BusyShare,
        value: (busy / held).normalize(),
    })
}

/// A project's idle-GPU settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdleGpuRule {
    /// Activity under this is idle; `None` turns idle-GPU alerts off.
    pub threshold: Option<Decimal>,
    /// Records that held fewer GPU-hours are not judged.
    pub min_gpu_hours: Decimal,
}

impl Default for IdleGpuRule {
    fn default() -> Self {
        Self {
            threshold: Some(DEFAULT_THRESHOLD),
            min_gpu_hours: DEFAULT_MIN_GPU_HOURS,
        }
    }
}

impl IdleGpuRule {
    /// The record's activity when it was idle under this rule; `None` when it was busy
    /// enough, held too little, gave no evidence, or the rule is off.
    pub fn idle(
        &self,
        held: Decimal,
        busy: Option<Decimal>,
        sm_active: Option<Decimal>,
    ) -> Option<Activity> {
        let threshold = self.threshold?;
        if held < self.min_gpu_hours * SECONDS_PER_HOUR {
            return None;
        }
        activity(held, busy, sm_active).filter(|a| a.value < threshold)
    }
}

/// A threshold as the API takes it: a share greater than 0 and at most 1.
pub fn threshold(value: Decimal) -> Result<Decimal, String> {
    if value > Decimal::ZERO && value <= Decimal::ONE {
        Ok(value.normalize())
    } else {
        Err(format!(
            "must be a share greater than 0 and at most 1 (null turns idle-GPU alerts off), \
             got {value}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use proptest::prelude::*;

    use super::*;

    fn d(s: &str) -> Decimal {
        Decimal::from_str(s).unwrap()
    }

    const HOUR: i64 = 3600;

    #[test]
    fn sm_activity_wins_over_the_busy_share() {
        let a = activity(d("7200"), Some(d("7200")), Some(d("0.01"))).unwrap();
        assert_eq!(a.measure, IdleMeasure::SmActive);
        assert_eq!(a.value, d("0.01"));
        let a = activity(d("7200"), Some(d("144")), None).unwrap();
        assert_eq!(a.measure, IdleMeasure::BusyShare);
        assert_eq!(a.value, d("0.02"));
    }

    #[test]
    fn no_figure_is_no_evidence() {
        assert_eq!(activity(d("7200"), None, None), None);
        assert_eq!(activity(d("0"), Some(d("0")), None), None);
        assert_eq!(IdleGpuRule::default().idle(d("7200"), None, None), None);
    }

    #[test]
    fn the_default_rule_judges_an_hour_or_more_under_five_percent() {
        let rule = IdleGpuRule::default();
        let idle = |held: i64, sm: &str| rule.idle(Decimal::from(held), None, Some(d(sm)));
        assert!(idle(HOUR, "0.04").is_some());
        assert!(idle(HOUR, "0.049999").is_some());
        assert!(
            idle(HOUR, "0.05").is_none(),
            "under the threshold, not at it"
        );
        assert!(idle(HOUR - 1, "0").is_none(), "less than a GPU-hour held");
        assert!(idle(10 * HOUR, "0.5").is_none());
    }

    #[test]
    fn a_rule_without_threshold_is_off() {
        let rule = IdleGpuRule {
            threshold: None,
            ..IdleGpuRule::default()
        };
        assert_eq!(rule.idle(d("360000"), Some(d("0")), Some(d("0"))), None);
    }

    #[test]
    fn thresholds_are_shares_above_zero() {
        assert_eq!(threshold(d("0.10")), Ok(d("0.1")));
        assert_eq!(threshold(d("1")), Ok(d("1")));
        assert!(threshold(d("0")).is_err());
        assert!(threshold(d("1.01")).is_err());
        assert!(threshold(d("-0.1")).is_err());
    }

    proptest! {
        /// Raising the threshold or lowering the minimum never stops a record being idle.
        #[test]
        fn a_looser_rule_finds_everything_a_stricter_one_does(
            held in 0i64..1_000_000,
            sm in 0u32..=1000,
            threshold in 1u32..=1000,
            looser_by in 0u32..=1000,
            minimum in 1i64..100,
            lower_by in 0i64..100,
        ) {
            let sm = Decimal::new(sm.into(), 3);
            let strict = IdleGpuRule {
                threshold: Some(Decimal::new(threshold.into(), 3)),
                min_gpu_hours: Decimal::from(minimum),
            };
            let loose = IdleGpuRule {
                threshold: Some(Decimal::new((threshold + looser_by).min(1000).into(), 3)),
                min_gpu_hours: Decimal::from((minimum - lower_by).max(1)),
            };
            let held = Decimal::from(held);
            if strict.idle(held, None, Some(sm)).is_some() {
                prop_assert!(loose.idle(held, None, Some(sm)).is_some());
            }
        }

        /// The busy share is exactly busy / held.
        #[test]
        fn the_busy_share_is_busy_over_held(held in 1i64..1_000_000, busy_permille in 0i64..=1000) {
            let held = Decimal::from(held);
            let busy = held * Decimal::new(busy_permille, 3);
            let a = activity(held, Some(busy), None).unwrap();
            prop_assert_eq!(a.value * held, busy);
        }
    }
}
