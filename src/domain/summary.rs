//! Figures derived from a period's aggregated sums (COST_MODEL.md §4–5).
//!
//! They work on totals, never on rows, because the model's ratios are ratios of sums:
//! averaging per-record unit costs would weigh a tiny run like a huge one.

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;

use super::ledger_time::{month_bounds, seconds_between};

/// A run rate over fewer hours than this says more about one job than about the month.
const FORECAST_AFTER_HOURS: i64 = 72;

/// `total / tasks_completed`; `None` when no task completed. Failed attempts, idle time
/// and unused commitment stay in the numerator on purpose: they are what finished work cost.
pub fn cost_per_completed_task(total: Decimal, tasks_completed: u64) -> Option<Decimal> {
    (tasks_completed > 0).then(|| total / Decimal::from(tasks_completed))
}

/// Cost per unit of useful output (tokens, samples, ...), in the project's currency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitCosts {
    /// What the completed records that produced the output cost, per unit.
    pub direct_per_unit: Option<Decimal>,
    /// The direct cost scaled up so that all overheads (failures, idle, unused
    /// commitment) are spread over finished work.
    pub loaded_per_unit: Option<Decimal>,
}

/// Unit costs of one output unit: `direct_cost / quantity`, and that times
/// `total / completed_cost`. Each is `None` where its divisor is zero.
pub fn unit_costs(
    direct_cost: Decimal,
    quantity: Decimal,
    total: Decimal,
    completed_cost: Decimal,
) -> UnitCosts {
    let direct_per_unit = direct_cost.checked_div(quantity);
    UnitCosts {
        direct_per_unit,
        loaded_per_unit: direct_per_unit
            .and_then(|direct| (direct * total).checked_div(completed_cost)),
    }
}

/// `spend / budget × 100`; `None` for a zero budget, whose burn has no percentage.
pub fn burn_pct(spend: Decimal, budget: Decimal) -> Option<Decimal> {
    (spend * Decimal::ONE_HUNDRED).checked_div(budget)
}

/// The month's spend extrapolated linearly to its end: `spend × hours_in_month /
/// hours_elapsed`, with both lengths exact (a Europe/Berlin October has 745 hours).
///
/// `None` until 72 hours of the month have passed. Once `as_of` is past the month's end the
/// forecast is the spend itself.
pub fn forecast(spend: Decimal, month: NaiveDate, as_of: DateTime<Utc>, tz: Tz) -> Option<Decimal> {
    let (start, end) = month_bounds(month, tz);
    let elapsed_until = as_of.min(end);
    if elapsed_until - start < TimeDelta::hours(FORECAST_AFTER_HOURS) {
        return None;
    }
    Some(spend * seconds_between(start, end) / seconds_between(start, elapsed_until))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::{Europe, UTC};

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().expect("test instants are valid RFC 3339")
    }

    fn november() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 1).expect("valid date")
    }

    #[test]
    fn no_completed_task_has_no_cost_per_task() {
        assert_eq!(cost_per_completed_task(Decimal::TEN, 0), None);
        assert_eq!(
            cost_per_completed_task(Decimal::TEN, 4),
            Some(Decimal::new(25, 1))
        );
    }

    #[test]
    fn unit_costs_need_output_and_completed_cost() {
        let none = UnitCosts {
            direct_per_unit: None,
            loaded_per_unit: None,
        };
        assert_eq!(
            unit_costs(Decimal::TEN, Decimal::ZERO, Decimal::TEN, Decimal::TEN),
            none
        );
        let direct_only = unit_costs(Decimal::ZERO, Decimal::TEN, Decimal::TEN, Decimal::ZERO);
        assert_eq!(direct_only.direct_per_unit, Some(Decimal::ZERO));
        assert_eq!(direct_only.loaded_per_unit, None);
        let both = unit_costs(
            Decimal::TEN,
            Decimal::TWO,
            Decimal::from(30),
            Decimal::from(20),
        );
        assert_eq!(both.direct_per_unit, Some(Decimal::from(5)));
        assert_eq!(both.loaded_per_unit, Some(Decimal::new(75, 1)));
    }

    #[test]
    fn burn_is_a_percentage_of_the_budget() {
        assert_eq!(
            burn_pct(Decimal::from(80), Decimal::from(200)),
            Some(Decimal::from(40))
        );
        assert_eq!(burn_pct(Decimal::ONE, Decimal::ZERO), None);
    }

    #[test]
    fn forecast_waits_for_72_hours() {
        let spend = Decimal::from(72);
        assert_eq!(
            forecast(spend, november(), utc("2026-11-03T23:59:59Z"), UTC),
            None
        );
        assert_eq!(
            forecast(spend, november(), utc("2026-11-04T00:00:00Z"), UTC),
            Some(Decimal::from(720))
        );
        assert_eq!(
            forecast(spend, november(), utc("2026-10-15T00:00:00Z"), UTC),
            None
        );
    }

    #[test]
    fn forecast_uses_the_real_length_of_a_daylight_saving_month() {
        // Europe/Berlin's October 2026 runs from 2026-09-30T22:00Z for 745 hours.
        let october = NaiveDate::from_ymd_opt(2026, 10, 1).expect("valid date");
        let as_of = utc("2026-10-03T22:00:00Z");
        assert_eq!(
            forecast(Decimal::from(72), october, as_of, Europe::Berlin),
            Some(Decimal::from(745))
        );
    }

    #[test]
    fn forecast_of_a_finished_month_is_its_spend() {
        let spend = Decimal::new(8460, 2);
        assert_eq!(
            forecast(spend, november(), utc("2027-01-05T00:00:00Z"), UTC),
            Some(spend)
        );
    }
}
