//! Routes: budgets and retry caps on one label value of a project's records (COST_MODEL
//! "Route budgets and retry storms" in `docs/cost-model.md`).
//!
//! A route's spend is the cost of the records carrying its label value, nothing else (the
//! project's unused commitment belongs to no route); its budget burns as a project's does
//! ([`crate::domain::burn`]). A retry storm is either a task with an attempt beyond the
//! route's `max_attempts_per_task`, or a ledger hour in which the route's failed attempts
//! (outcome other than `completed`) cost more than its `max_failed_spend_per_hour`.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::record::{label_key, label_text};
use crate::domain::validation::Violations;
use crate::domain::values;

/// One label value of a project's records, validated as a record's label is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RouteLabel {
    key: String,
    value: String,
}

impl RouteLabel {
    /// The key and value of a route as given in a path; errors at `path:label_key` and
    /// `path:label_value`.
    pub fn parse(key: &str, value: &str, violations: &mut Violations) -> Option<Self> {
        let key = violations.check("path:label_key", label_key(key));
        let value = violations.check("path:label_value", label_text(value));
        Some(Self {
            key: key?,
            value: value?,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn value(&self) -> &str {
        &self.value
    }
}

/// The label a route is.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RouteRef {
    pub key: String,
    pub value: String,
}

/// What may be set on a route; at least one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteLimits {
    /// The route's budget for every month, in the project's currency.
    pub monthly_budget: Option<Decimal>,
    /// An attempt numbered above it fires one `retry_storm` alert for its task.
    pub max_attempts_per_task: Option<i32>,
    /// Failed attempts costing more than it within one ledger hour fire one `retry_storm`
    /// alert for that hour.
    pub max_failed_spend_per_hour: Option<Decimal>,
}

/// The largest `max_attempts_per_task` taken: attempts are `int4`.
pub const MAX_ATTEMPTS_CAP: i64 = i32::MAX as i64;

impl RouteLimits {
    /// The limits as given, each checked at its pointer (`/monthly_budget`, …); a body
    /// setting none of them is refused at the root pointer.
    pub fn parse(
        monthly_budget: Option<Decimal>,
        max_attempts_per_task: Option<i64>,
        max_failed_spend_per_hour: Option<Decimal>,
        violations: &mut Violations,
    ) -> Option<Self> {
        if monthly_budget.is_none()
            && max_attempts_per_task.is_none()
            && max_failed_spend_per_hour.is_none()
        {
            violations.push(
                "",
                "set at least one of monthly_budget, max_attempts_per_task and \
                 max_failed_spend_per_hour",
            );
            return None;
        }
        let before = violations.len();
        let limits = Self {
            monthly_budget: monthly_budget
                .and_then(|b| violations.check("/monthly_budget", values::positive(b))),
            max_attempts_per_task: max_attempts_per_task
                .and_then(|cap| violations.check("/max_attempts_per_task", attempts_cap(cap))),
            max_failed_spend_per_hour: max_failed_spend_per_hour.and_then(|cap| {
                violations.check("/max_failed_spend_per_hour", values::positive(cap))
            }),
        };
        (violations.len() == before).then_some(limits)
    }
}

fn attempts_cap(cap: i64) -> Result<i32, String> {
    match cap {
        1..=MAX_ATTEMPTS_CAP => Ok(cap as i32),
        _ => Err(format!("must be from 1 to {MAX_ATTEMPTS_CAP}, got {cap}")),
    }
}

/// A ledger hour whose failed spend went beyond the cap: a retry storm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StormHour {
    pub hour: DateTime<Utc>,
    pub failed_spend: Decimal,
}

/// The hours of `failed_by_hour` (ledger hour, failed spend) whose failed spend is above
/// `cap`; spend equal to the cap is within it.
pub fn storm_hours(failed_by_hour: &[(DateTime<Utc>, Decimal)], cap: Decimal) -> Vec<StormHour> {
    failed_by_hour
        .iter()
        .filter(|(_, spend)| *spend > cap)
        .map(|&(hour, failed_spend)| StormHour { hour, failed_spend })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use proptest::prelude::*;

    use super::*;

    fn dec(text: &str) -> Decimal {
        Decimal::from_str(text).unwrap()
    }

    #[test]
    fn a_route_is_named_as_a_record_label_is() {
        let mut violations = Violations::default();
        let route = RouteLabel::parse("route", "summarise", &mut violations).unwrap();
        assert_eq!((route.key(), route.value()), ("route", "summarise"));
        assert!(RouteLabel::parse("bad key", " ", &mut violations).is_none());
        let pointers: Vec<String> = violations
            .into_vec()
            .into_iter()
            .map(|e| e.pointer)
            .collect();
        assert_eq!(pointers, ["path:label_key", "path:label_value"]);
    }

    #[test]
    fn limits_name_each_bad_field_and_need_one_set() {
        let mut violations = Violations::default();
        assert!(RouteLimits::parse(None, None, None, &mut violations).is_none());
        assert!(
            RouteLimits::parse(Some(dec("-1")), Some(0), Some(dec("0")), &mut violations).is_none()
        );
        let pointers: Vec<String> = violations
            .into_vec()
            .into_iter()
            .map(|e| e.pointer)
            .collect();
        assert_eq!(
            pointers,
            [
                "",
                "/monthly_budget",
                "/max_attempts_per_task",
                "/max_failed_spend_per_hour"
            ]
        );
        let mut violations = Violations::default();
        let limits = RouteLimits::parse(None, Some(3), Some(dec("10.00")), &mut violations);
        assert_eq!(
            limits,
            Some(RouteLimits {
                monthly_budget: None,
                max_attempts_per_task: Some(3),
                max_failed_spend_per_hour: Some(dec("10")),
            })
        );
    }

    proptest! {
        /// An hour storms exactly when its failed spend is above the cap, and keeps its spend.
        #[test]
        fn storm_hours_are_those_above_the_cap(
            cents in proptest::collection::vec(0i64..5_000, 0..48),
            cap_cents in 0i64..5_000,
        ) {
            let start: DateTime<Utc> = "2026-11-01T00:00:00Z".parse().unwrap();
            let hours: Vec<(DateTime<Utc>, Decimal)> = cents
                .iter()
                .enumerate()
                .map(|(i, c)| (start + chrono::Duration::hours(i as i64), Decimal::new(*c, 2)))
                .collect();
            let cap = Decimal::new(cap_cents, 2);
            let storms = storm_hours(&hours, cap);
            prop_assert_eq!(storms.len(), cents.iter().filter(|c| **c > cap_cents).count());
            for storm in storms {
                prop_assert!(storm.failed_spend > cap);
                prop_assert!(hours.contains(&(storm.hour, storm.failed_spend)));
            }
        }
    }
}
