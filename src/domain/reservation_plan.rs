//! How many GPUs to reserve (COST_MODEL.md §12), from the GPU-hours a model used hour by
//! hour over a look-back window.
//!
//! With `u_h` the GPU-hours used in hour `h` of the window's `H` hours, a reserved price `r`
//! and an on-demand price `o` per GPU-hour, committing `N` GPUs costs
//! `N × r × H + o × Σ_h max(0, u_h − N)`: the commitment every hour, and on-demand for what
//! goes beyond it. The curve is that cost for every whole `N` from 0 to the peak rounded up;
//! the recommendation is its cheapest point, the smallest `N` where several tie. With whole
//! GPUs in use every hour that is the smallest `N` with `#{h : u_h > N} ≤ H × r ÷ o`: one more
//! GPU pays `r × H` and saves `o` in each hour busier than `N`. Each hour's use is exact, so
//! the costs are exact to the last digit of the prices.

use chrono::{DateTime, Days, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use rust_decimal::prelude::ToPrimitive;

use super::capacity::pool_id;
use super::contract::SCOPE_CHARS;
use super::ledger_time::LedgerHour;
use super::period::parse_period;
use super::validation::Violations;
use super::values::{self, Currency};

/// The days a plan looks back over when no window is given.
pub const DEFAULT_LOOK_BACK_DAYS: u64 = 30;

/// What a plan is asked for, read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PlanQuery {
    pub gpu_model: String,
    pub pool: Option<String>,
    pub provider: Option<String>,
    /// `[from, to)`, on ledger hour boundaries.
    pub window: (DateTime<Utc>, DateTime<Utc>),
    pub reserved_price: Option<Decimal>,
    pub on_demand_price: Option<Decimal>,
    pub spot_price: Option<Decimal>,
    pub currency: Option<String>,
}

/// What a plan is asked for, as given (query parameters, command-line options). Each wrong
/// value is reported as `query:<name>`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlanRequest<'a> {
    pub gpu_model: Option<&'a str>,
    pub pool: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub month: Option<&'a str>,
    pub from: Option<&'a str>,
    pub to: Option<&'a str>,
    pub reserved_price: Option<&'a str>,
    pub on_demand_price: Option<&'a str>,
    pub spot_price: Option<&'a str>,
    pub currency: Option<&'a str>,
}

impl PlanRequest<'_> {
    /// The query, or every field that is wrong. Without `month`, `from` and `to`, the window
    /// is the [`DEFAULT_LOOK_BACK_DAYS`] ledger days before the one holding `now`.
    pub fn parse(&self, tz: Tz, now: DateTime<Utc>) -> Result<PlanQuery, Violations> {
        let mut v = Violations::default();
        let gpu_model = match self.gpu_model {
            Some(raw) => v.check("query:gpu_model", values::bounded_text(raw, SCOPE_CHARS)),
            None => {
                v.push("query:gpu_model", "give the GPU model to plan for");
                None
            }
        };
        let pool = self
            .pool
            .and_then(|raw| v.check("query:pool", pool_id(raw)));
        let provider = self
            .provider
            .and_then(|raw| v.check("query:provider", values::bounded_text(raw, SCOPE_CHARS)));
        let window = match (self.month, self.from, self.to) {
            (None, None, None) => Some(default_window(tz, now)),
            bounds => parse_period(bounds, tz, &mut v),
        };
        let reserved_price = price(&mut v, "reserved_price", self.reserved_price);
        let on_demand_price = price(&mut v, "on_demand_price", self.on_demand_price);
        let spot_price = price(&mut v, "spot_price", self.spot_price);
        let currency = self
            .currency
            .and_then(|raw| v.check("query:currency", Currency::parse(raw)))
            .map(|c| c.code().to_owned());
        match (gpu_model, window) {
            (Some(gpu_model), Some(window)) if v.is_empty() => Ok(PlanQuery {
                gpu_model,
                pool,
                provider,
                window,
                reserved_price,
                on_demand_price,
                spot_price,
                currency,
            }),
            _ => Err(v),
        }
    }
}

fn price(violations: &mut Violations, field: &str, raw: Option<&str>) -> Option<Decimal> {
    let raw = raw?;
    violations.check(
        &format!("query:{field}"),
        raw.trim()
            .parse::<Decimal>()
            .map_err(|_| format!("`{raw}` is not a decimal price"))
            .and_then(values::positive),
    )
}

/// The [`DEFAULT_LOOK_BACK_DAYS`] ledger days before the one holding `now`.
fn default_window(tz: Tz, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
    let today = now.with_timezone(&tz).date_naive();
    let start_of = |day: chrono::NaiveDate| {
        let midnight = day.and_hms_opt(0, 0, 0).expect("midnight");
        let at = midnight
            .and_local_timezone(tz)
            .earliest()
            .map_or_else(|| midnight.and_utc(), |t| t.with_timezone(&Utc));
        LedgerHour::holding(at, tz).start
    };
    (
        start_of(today - Days::new(DEFAULT_LOOK_BACK_DAYS)),
        start_of(today),
    )
}

/// The cost of committing `gpus` GPUs over the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurvePoint {
    pub gpus: u32,
    pub cost: Decimal,
}

/// What committing would have cost over a window, and the cheapest commitment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationCurve {
    /// `H`, the window's hours.
    pub hours: usize,
    /// The GPU-hours used in the busiest hour.
    pub peak: Decimal,
    /// The GPU-hours used over the window.
    pub used_gpu_hours: Decimal,
    /// `r ÷ o`: the share of its hours a reserved GPU must be busy to cost no more than
    /// on-demand.
    pub break_even_utilisation: Decimal,
    pub recommended_gpus: u32,
    pub cost_at_recommended: Decimal,
    /// The hours whose use goes beyond the recommendation, paid on-demand.
    pub hours_above_recommended: usize,
    /// The share of the recommended GPUs' hours in use.
    pub utilisation_at_recommended: Decimal,
    /// For `gpus` = 0, 1, …, ⌈peak⌉.
    pub curve: Vec<CurvePoint>,
}

/// The cost curve of `use_by_hour` (one entry per hour of the window, zero where nothing
/// ran) at reserved price `reserved` and on-demand price `on_demand` (both per GPU-hour, in
/// one currency, `on_demand` > 0).
pub fn reservation_curve(
    use_by_hour: &[Decimal],
    reserved: Decimal,
    on_demand: Decimal,
) -> ReservationCurve {
    let hours = use_by_hour.len();
    let mut sorted: Vec<Decimal> = use_by_hour
        .iter()
        .map(|u| (*u).max(Decimal::ZERO))
        .collect();
    sorted.sort_unstable();
    let peak = sorted.last().copied().unwrap_or_default();
    let used: Decimal = sorted.iter().sum();
    // `above[i]`: the use of hours `i..` summed, so that the use beyond `N` is
    // `above[i] − N × (H − i)` with `i` the first hour busier than `N`.
    let mut above = vec![Decimal::ZERO; hours + 1];
    for i in (0..hours).rev() {
        above[i] = above[i + 1] + sorted[i];
    }
    let top = peak.ceil().to_u32().unwrap_or(u32::MAX);
    let window = Decimal::from(hours as u64);
    let mut curve = Vec::with_capacity(top as usize + 1);
    let mut first_above = 0;
    let mut best: Option<(u32, Decimal, usize)> = None;
    for gpus in 0..=top {
        let n = Decimal::from(gpus);
        while first_above < hours && sorted[first_above] <= n {
            first_above += 1;
        }
        let busier = hours - first_above;
        let beyond = above[first_above] - n * Decimal::from(busier as u64);
        let cost = n * reserved * window + on_demand * beyond;
        if best.is_none_or(|(_, least, _)| cost < least) {
            best = Some((gpus, cost, busier));
        }
        curve.push(CurvePoint { gpus, cost });
    }
    let (recommended_gpus, cost_at_recommended, hours_above_recommended) =
        best.unwrap_or((0, Decimal::ZERO, 0));
    let committed = Decimal::from(recommended_gpus) * window;
    let utilisation_at_recommended = if committed.is_zero() {
        Decimal::ZERO
    } else {
        let n = Decimal::from(recommended_gpus);
        sorted.iter().map(|u| (*u).min(n)).sum::<Decimal>() / committed
    };
    ReservationCurve {
        hours,
        peak,
        used_gpu_hours: used,
        break_even_utilisation: reserved / on_demand,
        recommended_gpus,
        cost_at_recommended,
        hours_above_recommended,
        utilisation_at_recommended,
        curve,
    }
}

/// What committing `gpus` GPUs (any amount, a reservation may commit a fraction) would have
/// cost over the window: `gpus × r × H + o × Σ_h max(0, u_h − gpus)`.
pub fn commitment_cost(
    use_by_hour: &[Decimal],
    gpus: Decimal,
    reserved: Decimal,
    on_demand: Decimal,
) -> Decimal {
    let beyond: Decimal = use_by_hour
        .iter()
        .map(|u| (*u - gpus).max(Decimal::ZERO))
        .sum();
    gpus * reserved * Decimal::from(use_by_hour.len() as u64) + on_demand * beyond
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(raw: &str) -> Decimal {
        raw.parse().unwrap()
    }

    fn uses(raw: &[i64]) -> Vec<Decimal> {
        raw.iter().map(|u| Decimal::from(*u)).collect()
    }

    #[test]
    fn a_small_profile_has_its_hand_computed_curve_and_optimum() {
        // Ten hours: 4 GPUs in use for 2 of them, 2 for 3, 1 for 3, none for 2.
        // r = 1, o = 2.5: H × r ÷ o = 4 busier hours are worth a GPU.
        let use_by_hour = uses(&[4, 4, 2, 2, 2, 1, 1, 1, 0, 0]);
        let plan = reservation_curve(&use_by_hour, d("1"), d("2.5"));
        // N=0: 17 × 2.5 = 42.5; N=1: 10 + 2.5 × 9 = 32.5; N=2: 20 + 2.5 × 4 = 30;
        // N=3: 30 + 2.5 × 2 = 35; N=4: 40.
        let costs: Vec<(u32, Decimal)> = plan.curve.iter().map(|p| (p.gpus, p.cost)).collect();
        assert_eq!(
            costs,
            [
                (0, d("42.5")),
                (1, d("32.5")),
                (2, d("30")),
                (3, d("35")),
                (4, d("40"))
            ]
        );
        assert_eq!(plan.recommended_gpus, 2);
        assert_eq!(plan.cost_at_recommended, d("30"));
        assert_eq!(plan.hours_above_recommended, 2);
        assert_eq!(plan.break_even_utilisation, d("0.4"));
        assert_eq!(plan.peak, d("4"));
        assert_eq!(plan.used_gpu_hours, d("17"));
        // In use of 2 × 10 reserved GPU-hours: 2 + 2 + 2 + 2 + 2 + 1 + 1 + 1 = 13.
        assert_eq!(plan.utilisation_at_recommended, d("0.65"));
        // The rule: the smallest N with #{u_h > N} ≤ H r / o = 4.
        let rule = (0..=4)
            .find(|n| {
                use_by_hour
                    .iter()
                    .filter(|u| **u > Decimal::from(*n))
                    .count()
                    <= 4
            })
            .unwrap();
        assert_eq!(rule, plan.recommended_gpus);
        for point in &plan.curve {
            assert_eq!(
                commitment_cost(&use_by_hour, Decimal::from(point.gpus), d("1"), d("2.5")),
                point.cost
            );
        }
    }

    #[test]
    fn ties_go_to_the_fewest_gpus() {
        // r × H = o × busier hours at N = 1: committing 1 or 2 costs the same as 1.
        // Four hours, use 2, 2, 0, 0; r = 1, o = 2. N=0: 8; N=1: 4 + 4 = 8; N=2: 8.
        let plan = reservation_curve(&uses(&[2, 2, 0, 0]), d("1"), d("2"));
        assert!(plan.curve.iter().all(|p| p.cost == d("8")));
        assert_eq!(plan.recommended_gpus, 0);
        assert_eq!(plan.utilisation_at_recommended, Decimal::ZERO);
    }

    #[test]
    fn fractional_use_is_priced_exactly_and_a_dear_reservation_reserves_nothing() {
        let use_by_hour = vec![d("0.5"), d("1.25"), d("0")];
        let plan = reservation_curve(&use_by_hour, d("0.9"), d("1.1"));
        // N=0: 1.75 × 1.1 = 1.925; N=1: 2.7 + 0.25 × 1.1 = 2.975; N=2: 5.4.
        assert_eq!(plan.curve.len(), 3);
        assert_eq!(plan.curve[0].cost, d("1.925"));
        assert_eq!(plan.curve[1].cost, d("2.975"));
        assert_eq!(plan.curve[2].cost, d("5.4"));
        assert_eq!(plan.recommended_gpus, 0);
        let none = reservation_curve(&[], d("1"), d("2"));
        assert_eq!(
            none.curve,
            [CurvePoint {
                gpus: 0,
                cost: d("0")
            }]
        );
        assert_eq!(
            commitment_cost(&use_by_hour, d("0.5"), d("2"), d("4")),
            d("6")
        );
    }
}
