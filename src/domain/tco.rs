//! An owned card's price from what it costs (COST_MODEL §10): purchase price less salvage
//! spread over its life, other monthly costs, and the power it draws at the data centre's
//! PUE. The depreciation part ends by itself when the card's life does, so a contract priced
//! this way has up to two prices in time, its *phases*.

use chrono::{DateTime, Months, Utc};
use rust_decimal::Decimal;

use crate::domain::validation::Violations;
use crate::domain::values;

/// Hours in the average month (8,760 ÷ 12): what a monthly cost is spread over.
pub const HOURS_PER_MONTH: Decimal = Decimal::from_parts(730, 0, 0, false, 0);

/// Decimal places a derived price keeps: a year of a thousand GPUs at this scale is off the
/// exact rational price by less than 10^-12.
pub const PRICE_SCALE: u32 = 20;

/// The longest life a card may be given, in months (a century).
pub const MAX_LIFE_MONTHS: i64 = 1200;

/// What one owned GPU costs, as finance gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tco {
    pub purchase_price_per_gpu: Decimal,
    pub salvage_value_per_gpu: Decimal,
    pub life_months: u32,
    pub in_service_from: DateTime<Utc>,
    pub power_kw_per_gpu: Decimal,
    pub electricity_price_per_kwh: Decimal,
    pub pue: Decimal,
    pub other_per_gpu_month: Decimal,
}

/// A price per GPU-hour and the parts it is the sum of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriceParts {
    pub depreciation: Decimal,
    pub other: Decimal,
    pub power: Decimal,
}

impl PriceParts {
    /// The price per GPU-hour: the exact sum of the parts.
    pub fn total(&self) -> Decimal {
        self.depreciation + self.other + self.power
    }
}

/// The price per GPU-minute of a price per GPU-hour, at [`PRICE_SCALE`].
pub fn per_minute(per_hour: Decimal) -> Decimal {
    (per_hour / Decimal::from(60))
        .round_dp(PRICE_SCALE)
        .normalize()
}

/// One stretch of a contract's validity with one price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Phase {
    pub from: DateTime<Utc>,
    /// `None` means open-ended.
    pub until: Option<DateTime<Utc>>,
    pub parts: PriceParts,
}

impl Tco {
    /// The parts of the price while the card depreciates.
    pub fn parts(&self) -> PriceParts {
        let months = Decimal::from(self.life_months);
        PriceParts {
            depreciation: ((self.purchase_price_per_gpu - self.salvage_value_per_gpu)
                / (months * HOURS_PER_MONTH))
                .round_dp(PRICE_SCALE)
                .normalize(),
            ..self.parts_after_depreciation()
        }
    }

    /// The parts of the price once the card is fully depreciated.
    pub fn parts_after_depreciation(&self) -> PriceParts {
        PriceParts {
            depreciation: Decimal::ZERO,
            other: (self.other_per_gpu_month / HOURS_PER_MONTH)
                .round_dp(PRICE_SCALE)
                .normalize(),
            power: (self.power_kw_per_gpu * self.pue * self.electricity_price_per_kwh).normalize(),
        }
    }

    /// What one kWh the GPUs draw costs once the data centre's overhead is on it
    /// (`PUE × electricity price`).
    pub fn energy_price_per_kwh(&self) -> Decimal {
        (self.pue * self.electricity_price_per_kwh).normalize()
    }

    /// When the depreciation part ends: `life_months` calendar months after the card went
    /// into service (in UTC).
    pub fn depreciated_from(&self) -> DateTime<Utc> {
        self.in_service_from
            .checked_add_months(Months::new(self.life_months))
            .unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// The prices of a contract valid over `[from, until)`, in time order: one phase, or
    /// two when the card's life ends inside the validity.
    pub fn phases(&self, from: DateTime<Utc>, until: Option<DateTime<Utc>>) -> Vec<Phase> {
        let end = self.depreciated_from();
        if end <= from {
            vec![Phase {
                from,
                until,
                parts: self.parts_after_depreciation(),
            }]
        } else if until.is_some_and(|until| until <= end) {
            vec![Phase {
                from,
                until,
                parts: self.parts(),
            }]
        } else {
            vec![
                Phase {
                    from,
                    until: Some(end),
                    parts: self.parts(),
                },
                Phase {
                    from: end,
                    until,
                    parts: self.parts_after_depreciation(),
                },
            ]
        }
    }
}

/// A TCO as given: every field optional, so that a change names only what it changes.
#[derive(Debug, Clone, Default)]
pub struct NewTco<'a> {
    pub purchase_price_per_gpu: Option<Decimal>,
    pub salvage_value_per_gpu: Option<Decimal>,
    pub life_months: Option<i64>,
    pub in_service_from: Option<&'a str>,
    pub power_kw_per_gpu: Option<Decimal>,
    pub electricity_price_per_kwh: Option<Decimal>,
    pub pue: Option<Decimal>,
    pub other_per_gpu_month: Option<Decimal>,
}

fn non_negative(value: Decimal) -> Result<Decimal, String> {
    if value >= Decimal::ZERO {
        Ok(value.normalize())
    } else {
        Err(format!("must be 0 or more, got {value}"))
    }
}

impl NewTco<'_> {
    /// The TCO these fields give over `base` (the contract's current one, for a change):
    /// fields not given keep `base`'s; without a base the purchase price, life and
    /// in-service date are required, salvage, power, electricity and other costs default to
    /// 0 and PUE to 1. Each bad field is reported under `pointer` (`/tco/life_months`).
    pub fn parse(&self, pointer: &str, base: Option<&Tco>, v: &mut Violations) -> Option<Tco> {
        let at = |field: &str| format!("{pointer}/{field}");
        let required = |v: &mut Violations, field: &str| {
            v.push(
                at(field),
                "required when a contract is first priced by its TCO",
            );
        };
        let purchase = match (self.purchase_price_per_gpu, base) {
            (Some(value), _) => v.check(&at("purchase_price_per_gpu"), values::positive(value)),
            (None, Some(base)) => Some(base.purchase_price_per_gpu),
            (None, None) => {
                required(v, "purchase_price_per_gpu");
                None
            }
        };
        let amount =
            |v: &mut Violations, field: &str, given: Option<Decimal>, old: Decimal| match given {
                Some(value) => v.check(&at(field), non_negative(value)),
                None => Some(old),
            };
        let salvage = amount(
            v,
            "salvage_value_per_gpu",
            self.salvage_value_per_gpu,
            base.map_or(Decimal::ZERO, |b| b.salvage_value_per_gpu),
        );
        let life = match (self.life_months, base) {
            (Some(months), _) if (1..=MAX_LIFE_MONTHS).contains(&months) => Some(months as u32),
            (Some(months), _) => {
                v.push(
                    at("life_months"),
                    format!(
                        "must be a whole number of months from 1 to {MAX_LIFE_MONTHS}, got {months}"
                    ),
                );
                None
            }
            (None, Some(base)) => Some(base.life_months),
            (None, None) => {
                required(v, "life_months");
                None
            }
        };
        let in_service = match (self.in_service_from, base) {
            (Some(raw), _) => v.check(&at("in_service_from"), values::parse_instant(raw)),
            (None, Some(base)) => Some(base.in_service_from),
            (None, None) => {
                required(v, "in_service_from");
                None
            }
        };
        let power = amount(
            v,
            "power_kw_per_gpu",
            self.power_kw_per_gpu,
            base.map_or(Decimal::ZERO, |b| b.power_kw_per_gpu),
        );
        let electricity = amount(
            v,
            "electricity_price_per_kwh",
            self.electricity_price_per_kwh,
            base.map_or(Decimal::ZERO, |b| b.electricity_price_per_kwh),
        );
        let pue = match self.pue {
            Some(pue) if pue >= Decimal::ONE => Some(pue.normalize()),
            Some(pue) => {
                v.push(
                    at("pue"),
                    format!("a PUE is 1 or more (facility power ÷ IT power), got {pue}"),
                );
                None
            }
            None => Some(base.map_or(Decimal::ONE, |b| b.pue)),
        };
        let other = amount(
            v,
            "other_per_gpu_month",
            self.other_per_gpu_month,
            base.map_or(Decimal::ZERO, |b| b.other_per_gpu_month),
        );
        let tco = Tco {
            purchase_price_per_gpu: purchase?,
            salvage_value_per_gpu: salvage?,
            life_months: life?,
            in_service_from: in_service?,
            power_kw_per_gpu: power?,
            electricity_price_per_kwh: electricity?,
            pue: pue?,
            other_per_gpu_month: other?,
        };
        if tco.salvage_value_per_gpu > tco.purchase_price_per_gpu {
            v.push(
                at("salvage_value_per_gpu"),
                format!(
                    "a card cannot be sold for more than it cost: {} is above the purchase price {}",
                    tco.salvage_value_per_gpu, tco.purchase_price_per_gpu
                ),
            );
            return None;
        }
        Some(tco)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h100() -> Tco {
        // 30,000 bought, 3,000 back after three years, 0.7 kW at PUE 1.25 and 0.12 a kWh,
        // 146 a month for hosting, network and support.
        Tco {
            purchase_price_per_gpu: Decimal::from(30_000),
            salvage_value_per_gpu: Decimal::from(3_000),
            life_months: 36,
            in_service_from: "2024-01-15T00:00:00Z".parse().unwrap(),
            power_kw_per_gpu: Decimal::new(7, 1),
            electricity_price_per_kwh: Decimal::new(12, 2),
            pue: Decimal::new(125, 2),
            other_per_gpu_month: Decimal::from(146),
        }
    }

    #[test]
    fn the_price_is_the_sum_of_its_hand_computed_parts() {
        let parts = h100().parts();
        // 27,000 ÷ (36 × 730) = 27,000 ÷ 26,280 = 1.027397260273972602739726…
        assert_eq!(
            parts.depreciation,
            "1.02739726027397260274".parse::<Decimal>().unwrap()
        );
        assert_eq!(parts.other, Decimal::new(2, 1)); // 146 ÷ 730
        assert_eq!(parts.power, Decimal::new(105, 3)); // 0.7 × 1.25 × 0.12
        assert_eq!(
            parts.total(),
            "1.33239726027397260274".parse::<Decimal>().unwrap()
        );
        assert_eq!(
            per_minute(parts.total()),
            "0.02220662100456621005".parse::<Decimal>().unwrap()
        );
        assert_eq!(
            h100().parts_after_depreciation().total(),
            Decimal::new(305, 3)
        );
        assert_eq!(h100().energy_price_per_kwh(), Decimal::new(15, 2));
    }

    #[test]
    fn the_depreciation_part_ends_with_the_cards_life() {
        let tco = h100();
        let end: DateTime<Utc> = "2027-01-15T00:00:00Z".parse().unwrap();
        assert_eq!(tco.depreciated_from(), end);
        let from = "2026-01-01T00:00:00Z".parse().unwrap();
        let phases = tco.phases(from, None);
        assert_eq!(phases.len(), 2);
        assert_eq!((phases[0].from, phases[0].until), (from, Some(end)));
        assert_eq!((phases[1].from, phases[1].until), (end, None));
        assert_eq!(phases[1].parts.depreciation, Decimal::ZERO);
        let before_end = tco.phases(from, Some(end));
        assert_eq!(before_end.len(), 1);
        assert_eq!(before_end[0].parts, tco.parts());
        let after_end = tco.phases(end, None);
        assert_eq!(after_end.len(), 1);
        assert_eq!(after_end[0].parts, tco.parts_after_depreciation());
    }

    #[test]
    fn bad_fields_are_named_and_missing_ones_required_without_a_base() {
        let mut v = Violations::default();
        let given = NewTco {
            purchase_price_per_gpu: Some(Decimal::from(1000)),
            salvage_value_per_gpu: Some(Decimal::from(2000)),
            life_months: Some(0),
            pue: Some(Decimal::new(9, 1)),
            power_kw_per_gpu: Some(Decimal::from(-1)),
            ..NewTco::default()
        };
        assert_eq!(given.parse("/tco", None, &mut v), None);
        let pointers: Vec<String> = v.into_vec().into_iter().map(|e| e.pointer).collect();
        assert_eq!(
            pointers,
            [
                "/tco/life_months",
                "/tco/in_service_from",
                "/tco/power_kw_per_gpu",
                "/tco/pue"
            ]
        );
        let mut v = Violations::default();
        let salvage_above = NewTco {
            salvage_value_per_gpu: Some(Decimal::from(40_000)),
            ..NewTco::default()
        };
        assert_eq!(salvage_above.parse("/tco", Some(&h100()), &mut v), None);
        assert_eq!(v.into_vec()[0].pointer, "/tco/salvage_value_per_gpu");
        let mut v = Violations::default();
        let change = NewTco {
            electricity_price_per_kwh: Some(Decimal::new(20, 2)),
            ..NewTco::default()
        };
        let changed = change.parse("/tco", Some(&h100()), &mut v).unwrap();
        assert!(v.is_empty());
        assert_eq!(changed.parts().power, Decimal::new(175, 3));
        assert_eq!(changed.life_months, 36);
    }
}
