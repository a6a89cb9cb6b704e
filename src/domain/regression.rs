//! Efficiency regressions (COST_MODEL §11): a level shift of a workload's daily direct cost
//! per unit. The window's level (its last `window_days` complete ledger days) is compared
//! with the baseline's (the `baseline_days` before them); a regression needs the level to
//! exceed the baseline by the project's threshold, the extra cost to reach its daily
//! minimum, and enough completed records in the window to be more than noise.
//!
//! Medians, not means: one bad day (a node that crawled, a retry loop fixed by noon) moves a
//! mean and not a median, and the window's level is its lower median, so a shift shows on at
//! least half of the window's days with output before it counts. The relative and absolute
//! floors together keep small workloads from alerting on cents and large ones on noise.

use chrono::{Days, NaiveDate};
use rust_decimal::Decimal;

use crate::domain::efficiency::{UnitCostChange, WorkloadTotals, change};
use crate::domain::validation::Violations;

/// Decimal places of the medians, the change and the extra cost an alert carries.
pub const REGRESSION_SCALE: u32 = 12;

/// The median absolute deviation of normally distributed values times this is their
/// standard deviation.
const MAD_TO_SIGMA: Decimal = Decimal::from_parts(14826, 0, 0, false, 4);
/// How many of the baseline's robust standard deviations the window's level must rise by:
/// a shift a workload's own day-to-day noise explains is no regression.
pub const NOISE_SIGMAS: Decimal = Decimal::from_parts(3, 0, 0, false, 0);

/// How a project's workloads are judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegressionRule {
    /// The share by which the window's level must exceed the baseline's, e.g. 0.25.
    pub threshold: Decimal,
    /// The least extra cost per day, in the project's currency, worth an alert.
    pub min_extra_cost: Decimal,
    pub window_days: u32,
    pub baseline_days: u32,
    /// Completed records with output in the unit that must have ended in the window.
    pub min_records: u32,
}

pub const DEFAULT_RULE: RegressionRule = RegressionRule {
    threshold: Decimal::from_parts(25, 0, 0, false, 2),
    min_extra_cost: Decimal::from_parts(10, 0, 0, false, 0),
    window_days: 3,
    baseline_days: 14,
    min_records: 5,
};

/// The longest window and baseline, in days: a quarter of a year.
pub const MAX_DAYS: u32 = 92;
/// The most completed records a rule may require.
pub const MAX_MIN_RECORDS: u32 = 1_000_000;

impl RegressionRule {
    pub fn threshold(value: Decimal) -> Result<Decimal, String> {
        if value <= Decimal::ZERO || value > Decimal::from(100) {
            return Err(format!(
                "must be a share greater than 0 and at most 100 (0.25 is 25 %), got {value}"
            ));
        }
        Ok(value.normalize())
    }

    pub fn min_extra_cost(value: Decimal) -> Result<Decimal, String> {
        if value < Decimal::ZERO {
            return Err(format!("must be 0 or more, got {value}"));
        }
        Ok(value.normalize())
    }

    pub fn days(value: i64) -> Result<u32, String> {
        match u32::try_from(value) {
            Ok(days) if (1..=MAX_DAYS).contains(&days) => Ok(days),
            _ => Err(format!("must be from 1 to {MAX_DAYS} days, got {value}")),
        }
    }

    pub fn min_records(value: i64) -> Result<u32, String> {
        match u32::try_from(value) {
            Ok(records) if (1..=MAX_MIN_RECORDS).contains(&records) => Ok(records),
            _ => Err(format!("must be from 1 to {MAX_MIN_RECORDS}, got {value}")),
        }
    }

    /// A rule from a request: the fields given, the defaults for those left out; every bad
    /// field is reported at its pointer.
    pub fn parse(given: RuleFields, violations: &mut Violations) -> Option<RegressionRule> {
        let threshold = given
            .threshold
            .map(|t| violations.check("/threshold", Self::threshold(t)));
        let min_extra_cost = given
            .min_extra_cost
            .map(|c| violations.check("/min_extra_cost", Self::min_extra_cost(c)));
        let window_days = given
            .window_days
            .map(|d| violations.check("/window_days", Self::days(d)));
        let baseline_days = given
            .baseline_days
            .map(|d| violations.check("/baseline_days", Self::days(d)));
        let min_records = given
            .min_records
            .map(|r| violations.check("/min_records", Self::min_records(r)));
        let rule = RegressionRule {
            threshold: threshold.unwrap_or(Some(DEFAULT_RULE.threshold))?,
            min_extra_cost: min_extra_cost.unwrap_or(Some(DEFAULT_RULE.min_extra_cost))?,
            window_days: window_days.unwrap_or(Some(DEFAULT_RULE.window_days))?,
            baseline_days: baseline_days.unwrap_or(Some(DEFAULT_RULE.baseline_days))?,
            min_records: min_records.unwrap_or(Some(DEFAULT_RULE.min_records))?,
        };
        if rule.baseline_days < rule.window_days {
            violations.push(
                "/baseline_days",
                format!(
                    "must be at least window_days ({}): the baseline needs as many days with \
                     output as the window has days",
                    rule.window_days
                ),
            );
            return None;
        }
        Some(rule)
    }

    /// The window and baseline when the last complete ledger day is the day before `today`:
    /// `(baseline_first, window_first, today)`, each the first day of its span and `today` the
    /// end of the window (exclusive).
    pub fn spans(&self, today: NaiveDate) -> (NaiveDate, NaiveDate, NaiveDate) {
        let window_first = today - Days::new(u64::from(self.window_days));
        let baseline_first = window_first - Days::new(u64::from(self.baseline_days));
        (baseline_first, window_first, today)
    }

    /// Days with output the window needs: at least half of its days, so one day never makes
    /// a level on its own unless the window is a single day.
    pub fn window_days_needed(&self) -> usize {
        (self.window_days as usize).div_ceil(2)
    }
}

/// A rule's fields as a request gives them; those left out take the defaults.
#[derive(Debug, Clone, Copy, Default)]
pub struct RuleFields {
    pub threshold: Option<Decimal>,
    pub min_extra_cost: Option<Decimal>,
    pub window_days: Option<i64>,
    pub baseline_days: Option<i64>,
    pub min_records: Option<i64>,
}

/// What a workload spent and produced in one unit on one ledger day: its attempts that
/// ended on the day, each whole (failed ones included), and the output of the completed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DayCost {
    pub day: NaiveDate,
    pub totals: WorkloadTotals,
}

impl DayCost {
    fn cost_per_unit(&self) -> Option<Decimal> {
        (self.totals.quantity > Decimal::ZERO).then(|| self.totals.cost / self.totals.quantity)
    }
}

/// The sum of the days of `days` in `[from, to)`.
fn totals_between(days: &[DayCost], from: NaiveDate, to: NaiveDate) -> WorkloadTotals {
    days.iter()
        .filter(|d| d.day >= from && d.day < to)
        .fold(WorkloadTotals::default(), |sum, d| WorkloadTotals {
            cost: sum.cost + d.totals.cost,
            gpu_seconds_held: sum.gpu_seconds_held + d.totals.gpu_seconds_held,
            completed_gpu_seconds: sum.completed_gpu_seconds + d.totals.completed_gpu_seconds,
            quantity: sum.quantity + d.totals.quantity,
        })
}

/// The judgement of one workload and unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    /// Median daily cost per unit over the baseline's days with output.
    pub baseline_cost_per_unit: Decimal,
    /// Lower median daily cost per unit over the window's days with output.
    pub window_cost_per_unit: Decimal,
    /// The baseline's robust standard deviation: 1.4826 × the median absolute deviation of
    /// its days' cost per unit from their median.
    pub baseline_noise: Decimal,
    /// window ÷ baseline − 1; null when the baseline's cost per unit is zero.
    pub change: Option<Decimal>,
    /// (window − baseline level) × the window's output per day: what the shift costs a day.
    pub extra_cost_per_day: Decimal,
    pub baseline_days_with_output: usize,
    pub window_days_with_output: usize,
    pub records: u64,
    /// The change of the window's totals from the baseline's, split into price, throughput
    /// and overhead (COST_MODEL §11); none when either has no output.
    pub factors: Option<UnitCostChange>,
    pub regressed: bool,
}

/// Why a workload was not judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotJudged {
    /// Fewer completed records in the window than the rule asks.
    TooFewRecords,
    /// Too few days with output in the window (half of its days) or the baseline (as many
    /// as the window has days).
    TooFewDays,
}

/// The median: the middle value, or the mean of the middle two.
fn median(mut values: Vec<Decimal>) -> Option<Decimal> {
    values.sort_unstable();
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / Decimal::TWO),
    }
}

/// The lower median: the middle value, or the lower of the middle two.
fn lower_median(mut values: Vec<Decimal>) -> Option<Decimal> {
    values.sort_unstable();
    let n = values.len();
    (n > 0).then(|| values[(n - 1) / 2])
}

/// Judges one workload in one unit: `days` are its days (any order, days outside both spans
/// ignored), `records` its completed records with output in the unit that ended in the
/// window, `today` the ledger day after the window.
pub fn judge(
    rule: &RegressionRule,
    days: &[DayCost],
    records: u64,
    today: NaiveDate,
) -> Result<Verdict, NotJudged> {
    if records < u64::from(rule.min_records) {
        return Err(NotJudged::TooFewRecords);
    }
    let (baseline_first, window_first, end) = rule.spans(today);
    let in_span = |from: NaiveDate, to: NaiveDate| -> Vec<Decimal> {
        days.iter()
            .filter(|d| d.day >= from && d.day < to)
            .filter_map(DayCost::cost_per_unit)
            .collect()
    };
    let baseline = in_span(baseline_first, window_first);
    let window = in_span(window_first, end);
    if window.len() < rule.window_days_needed() || baseline.len() < rule.window_days as usize {
        return Err(NotJudged::TooFewDays);
    }
    let (baseline_days_with_output, window_days_with_output) = (baseline.len(), window.len());
    let base = median(baseline.clone()).ok_or(NotJudged::TooFewDays)?;
    let spread = median(baseline.iter().map(|v| (*v - base).abs()).collect())
        .ok_or(NotJudged::TooFewDays)?;
    let noise = spread * MAD_TO_SIGMA;
    let level = lower_median(window).ok_or(NotJudged::TooFewDays)?;
    let window_totals = totals_between(days, window_first, end);
    let baseline_totals = totals_between(days, baseline_first, window_first);
    let factors = baseline_totals
        .factors()
        .zip(window_totals.factors())
        .and_then(|(b, w)| change(&b, &w));
    let quantity_per_day = window_totals.quantity / Decimal::from(rule.window_days);
    let extra_cost_per_day = (level - base) * quantity_per_day;
    let change = (!base.is_zero()).then(|| level / base - Decimal::ONE);
    let regressed = level > base * (Decimal::ONE + rule.threshold)
        && level - base > noise * NOISE_SIGMAS
        && extra_cost_per_day >= rule.min_extra_cost
        && extra_cost_per_day > Decimal::ZERO;
    let round = |value: Decimal| value.round_dp(REGRESSION_SCALE).normalize();
    Ok(Verdict {
        baseline_cost_per_unit: round(base),
        window_cost_per_unit: round(level),
        baseline_noise: round(noise),
        change: change.map(round),
        extra_cost_per_day: round(extra_cost_per_day),
        baseline_days_with_output,
        window_days_with_output,
        records,
        factors,
        regressed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::efficiency::Factor;
    use chrono::Datelike;

    fn day(d: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, d).unwrap()
    }

    /// `cost` for `quantity` units made in one GPU-hour per unit of cost.
    fn spent(d: u32, cost: Decimal, quantity: Decimal) -> DayCost {
        let held = cost * Decimal::from(3600);
        DayCost {
            day: day(d),
            totals: WorkloadTotals {
                cost,
                gpu_seconds_held: held,
                completed_gpu_seconds: held,
                quantity,
            },
        }
    }

    /// Nov 1–14 baseline at `base` per unit, Nov 15–17 window at `window`, 100 units a day.
    fn series(base: i64, window: [i64; 3]) -> Vec<DayCost> {
        let hundred = Decimal::from(100);
        let mut days: Vec<DayCost> = (1..=14)
            .map(|d| spent(d, Decimal::from(base * 100), hundred))
            .collect();
        for (i, cost) in window.into_iter().enumerate() {
            days.push(spent(15 + i as u32, Decimal::from(cost * 100), hundred));
        }
        days
    }

    #[test]
    fn a_level_shift_regresses_and_one_bad_day_does_not() {
        let shifted = judge(&DEFAULT_RULE, &series(1, [2, 2, 2]), 5, day(18)).unwrap();
        assert!(shifted.regressed);
        assert_eq!(shifted.change, Some(Decimal::ONE));
        // One more unit of cost on each of 100 units a day.
        assert_eq!(shifted.extra_cost_per_day, Decimal::from(100));
        // One GPU-hour per unit of cost at the same price: twice the GPU-hours per unit.
        let factors = shifted.factors.unwrap();
        assert_eq!(factors.throughput, Decimal::TWO);
        assert_eq!(factors.price, Decimal::ONE);
        assert_eq!(factors.largest, Some(Factor::Throughput));
        let spike = judge(&DEFAULT_RULE, &series(1, [1, 5, 1]), 5, day(18)).unwrap();
        assert!(!spike.regressed);
        assert_eq!(spike.window_cost_per_unit, Decimal::ONE);
    }

    #[test]
    fn both_floors_and_the_record_minimum_hold_it_back() {
        // +20 % is under the 25 % threshold.
        let small = series(10, [12, 12, 12]);
        assert!(!judge(&DEFAULT_RULE, &small, 50, day(18)).unwrap().regressed);
        // +100 % but 0.05 a day more: under the minimum extra cost of 10.
        let cents: Vec<DayCost> = series(1, [2, 2, 2])
            .into_iter()
            .map(|d| {
                let scale = Decimal::from(2000);
                spent(
                    d.day.day(),
                    d.totals.cost / scale,
                    d.totals.quantity / scale,
                )
            })
            .collect();
        let verdict = judge(&DEFAULT_RULE, &cents, 50, day(18)).unwrap();
        assert_eq!(verdict.extra_cost_per_day, Decimal::new(5, 2));
        assert!(!verdict.regressed);
        assert_eq!(
            judge(&DEFAULT_RULE, &series(1, [2, 2, 2]), 4, day(18)),
            Err(NotJudged::TooFewRecords)
        );
    }

    #[test]
    fn too_few_days_with_output_are_not_judged() {
        let mut days = series(1, [2, 2, 2]);
        days.retain(|d| d.day != day(16) && d.day != day(17));
        assert_eq!(
            judge(&DEFAULT_RULE, &days, 9, day(18)),
            Err(NotJudged::TooFewDays)
        );
        let fresh: Vec<DayCost> = series(1, [2, 2, 2])
            .into_iter()
            .filter(|d| d.day >= day(13))
            .collect();
        assert_eq!(
            judge(&DEFAULT_RULE, &fresh, 9, day(18)),
            Err(NotJudged::TooFewDays)
        );
    }

    #[test]
    fn medians_are_exact() {
        assert_eq!(
            median(vec![Decimal::ONE, Decimal::from(4)]),
            Some(Decimal::new(25, 1))
        );
        assert_eq!(
            lower_median(vec![Decimal::from(4), Decimal::ONE]),
            Some(Decimal::ONE)
        );
        assert_eq!(median(Vec::new()), None);
    }

    #[test]
    fn rule_fields_are_bounded() {
        assert!(RegressionRule::threshold(Decimal::ZERO).is_err());
        assert!(RegressionRule::threshold(Decimal::new(25, 2)).is_ok());
        assert!(RegressionRule::min_extra_cost(Decimal::NEGATIVE_ONE).is_err());
        assert!(RegressionRule::days(0).is_err());
        assert!(RegressionRule::days(93).is_err());
        assert!(RegressionRule::min_records(0).is_err());
        let mut violations = Violations::default();
        let short = RuleFields {
            window_days: Some(7),
            baseline_days: Some(5),
            ..RuleFields::default()
        };
        assert_eq!(RegressionRule::parse(short, &mut violations), None);
        assert_eq!(violations.len(), 1);
        let mut violations = Violations::default();
        assert_eq!(
            RegressionRule::parse(RuleFields::default(), &mut violations),
            Some(DEFAULT_RULE)
        );
    }
}
