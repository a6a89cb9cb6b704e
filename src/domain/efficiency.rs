//! Why cost per unit moved (COST_MODEL §11): for one workload and output unit over a period,
//! `cost per unit = price per GPU-hour × GPU-hours per unit of completed work × overhead`,
//! where overhead is all GPU-hours over those of completed attempts. The ratio of two
//! periods' cost per unit is the product of the three factors' ratios.

use rust_decimal::Decimal;
use rust_decimal::MathematicalOps;

/// Decimal places of the factors and the ratio, as of every sum the figures carry.
const FACTOR_SCALE: u32 = 20;

/// What a workload spent and produced in one period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkloadTotals {
    /// The cost of all its attempts' GPU time (productive, idle, unmeasured and failed).
    pub cost: Decimal,
    pub gpu_seconds_held: Decimal,
    /// GPU-seconds held of its completed attempts with output in the unit.
    pub completed_gpu_seconds: Decimal,
    /// Output in the unit of its completed attempts.
    pub quantity: Decimal,
}

/// The three factors of cost per unit in one period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitCostFactors {
    pub cost_per_unit: Decimal,
    pub price_per_gpu_hour: Decimal,
    pub gpu_hours_per_unit: Decimal,
    /// All GPU-hours ÷ GPU-hours of completed attempts, at least 1.
    pub overhead: Decimal,
}

const SECONDS_PER_HOUR: Decimal = Decimal::from_parts(3600, 0, 0, false, 0);

impl WorkloadTotals {
    /// The factors, when the period has GPU time and completed output in the unit.
    pub fn factors(&self) -> Option<UnitCostFactors> {
        if self.quantity <= Decimal::ZERO || self.completed_gpu_seconds <= Decimal::ZERO {
            return None;
        }
        Some(UnitCostFactors {
            cost_per_unit: self.cost / self.quantity,
            price_per_gpu_hour: self.cost * SECONDS_PER_HOUR / self.gpu_seconds_held,
            gpu_hours_per_unit: self.completed_gpu_seconds / SECONDS_PER_HOUR / self.quantity,
            overhead: self.gpu_seconds_held / self.completed_gpu_seconds,
        })
    }
}

/// Which factor moved cost per unit most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Factor {
    Price,
    Throughput,
    Overhead,
}

impl Factor {
    pub fn as_str(&self) -> &'static str {
        match self {
            Factor::Price => "price",
            Factor::Throughput => "throughput",
            Factor::Overhead => "overhead",
        }
    }
}

/// The change from a baseline to a period: the ratio of cost per unit and its three
/// factors, whose product it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitCostChange {
    pub ratio: Decimal,
    pub price: Decimal,
    pub throughput: Decimal,
    pub overhead: Decimal,
    /// The factor furthest from 1 on a log scale (a halving moves as much as a doubling);
    /// none when nothing moved.
    pub largest: Option<Factor>,
}

fn rounded(value: Decimal) -> Decimal {
    value.round_dp(FACTOR_SCALE).normalize()
}

/// The change from `baseline` to `period`, when both have a cost per unit above zero.
pub fn change(baseline: &UnitCostFactors, period: &UnitCostFactors) -> Option<UnitCostChange> {
    if baseline.cost_per_unit.is_zero() || period.cost_per_unit.is_zero() {
        return None;
    }
    let price = period.price_per_gpu_hour / baseline.price_per_gpu_hour;
    let throughput = period.gpu_hours_per_unit / baseline.gpu_hours_per_unit;
    let overhead = period.overhead / baseline.overhead;
    let distance = |factor: Decimal| factor.ln().abs();
    let largest = [
        (Factor::Price, price),
        (Factor::Throughput, throughput),
        (Factor::Overhead, overhead),
    ]
    .into_iter()
    .filter(|(_, value)| *value != Decimal::ONE)
    .max_by_key(|(_, value)| distance(*value))
    .map(|(factor, _)| factor);
    Some(UnitCostChange {
        ratio: rounded(period.cost_per_unit / baseline.cost_per_unit),
        price: rounded(price),
        throughput: rounded(throughput),
        overhead: rounded(overhead),
        largest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn totals(cost: i64, held: i64, completed: i64, quantity: i64) -> WorkloadTotals {
        WorkloadTotals {
            cost: Decimal::from(cost),
            gpu_seconds_held: Decimal::from(held),
            completed_gpu_seconds: Decimal::from(completed),
            quantity: Decimal::from(quantity),
        }
    }

    #[test]
    fn a_slower_card_shows_as_throughput() {
        // Baseline: 10 GPU-hours at 2 make 100 units. Period: the same price, 15 GPU-hours
        // for the same 100 units: cost per unit 0.2 → 0.3, all of it throughput.
        let baseline = totals(20, 36_000, 36_000, 100).factors().unwrap();
        let period = totals(30, 54_000, 54_000, 100).factors().unwrap();
        let moved = change(&baseline, &period).unwrap();
        assert_eq!(moved.ratio, Decimal::new(15, 1));
        assert_eq!(moved.throughput, Decimal::new(15, 1));
        assert_eq!(moved.price, Decimal::ONE);
        assert_eq!(moved.overhead, Decimal::ONE);
        assert_eq!(moved.largest, Some(Factor::Throughput));
    }

    #[test]
    fn no_output_has_no_factors() {
        assert_eq!(totals(10, 3600, 0, 0).factors(), None);
        assert_eq!(totals(10, 3600, 3600, 0).factors(), None);
    }

    proptest! {
        #[test]
        fn the_factors_multiply_to_the_ratio(
            b in (1i64..10_000, 1i64..100_000, 1i64..100_000, 1i64..10_000),
            p in (1i64..10_000, 1i64..100_000, 1i64..100_000, 1i64..10_000),
        ) {
            let side = |(cost, completed, failed, quantity): (i64, i64, i64, i64)| {
                totals(cost, completed + failed, completed, quantity).factors().unwrap()
            };
            let moved = change(&side(b), &side(p)).unwrap();
            let (price, throughput, overhead) = (moved.price, moved.throughput, moved.overhead);
            let product = price * throughput * overhead;
            // Each factor is rounded to FACTOR_SCALE places, which moves the product by up to
            // half a unit of that place times the other two factors; a ratio of tens of
            // millions moves by more than 10^-15 (one run drew throughput 60,790,768 at price
            // 32.1). The ratio is rounded too, and a product of 28 significant digits.
            let unit = Decimal::new(1, FACTOR_SCALE);
            let bound = (price * throughput + price * overhead + throughput * overhead + Decimal::ONE)
                * unit
                + moved.ratio * Decimal::new(1, 25);
            prop_assert!((product - moved.ratio).abs() <= bound, "{moved:?}");
            prop_assert!(moved.overhead > Decimal::ZERO);
        }
    }
}
