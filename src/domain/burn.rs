//! Budget burn and the alerts it calls for (COST_MODEL.md §5).

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use serde::Serialize;
use utoipa::ToSchema;

use super::summary;

/// The forecast alert fires when the run rate reaches this percentage of the budget.
pub const FORECAST_THRESHOLD: i32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// Spend so far reached the threshold.
    Actual,
    /// The linear forecast for the month reached the budget.
    Forecast,
}

impl AlertKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            AlertKind::Actual => "actual",
            AlertKind::Forecast => "forecast",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "actual" => Some(AlertKind::Actual),
            "forecast" => Some(AlertKind::Forecast),
            _ => None,
        }
    }
}

/// A project's burn of one month's budget at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Burn {
    pub budget: Option<Decimal>,
    pub spend: Decimal,
    pub burn_pct: Option<Decimal>,
    pub forecast: Option<Decimal>,
    pub forecast_pct: Option<Decimal>,
}

pub fn burn(
    spend: Decimal,
    budget: Option<Decimal>,
    month: NaiveDate,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> Burn {
    let forecast = summary::forecast(spend, month, as_of, tz);
    let pct = |amount: Decimal| budget.and_then(|budget| summary::burn_pct(amount, budget));
    Burn {
        budget,
        spend,
        burn_pct: pct(spend),
        forecast,
        forecast_pct: forecast.and_then(pct),
    }
}

/// Every alert this burn has reached: each actual threshold at or below the burn, and the
/// forecast alert once the forecast reaches the budget. Firing is idempotent downstream, so
/// the full list is returned every time, not only what is new.
pub fn alerts_reached(burn: &Burn, thresholds: &[i32]) -> Vec<(i32, AlertKind)> {
    let mut reached: Vec<(i32, AlertKind)> = match burn.burn_pct {
        Some(pct) => thresholds
            .iter()
            .filter(|&&threshold| pct >= Decimal::from(threshold))
            .map(|&threshold| (threshold, AlertKind::Actual))
            .collect(),
        None => Vec::new(),
    };
    if burn
        .forecast_pct
        .is_some_and(|pct| pct >= Decimal::from(FORECAST_THRESHOLD))
    {
        reached.push((FORECAST_THRESHOLD, AlertKind::Forecast));
    }
    reached
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(text: &str) -> Decimal {
        text.parse().unwrap()
    }

    fn november() -> NaiveDate {
        NaiveDate::from_ymd_opt(2026, 11, 1).unwrap()
    }

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn thresholds_fire_at_or_above_the_burn() {
        let b = burn(
            dec("800"),
            Some(dec("1000")),
            november(),
            at("2026-11-02T00:00:00Z"),
            chrono_tz::UTC,
        );
        assert_eq!(b.burn_pct, Some(dec("80")));
        assert_eq!(b.forecast, None, "no forecast before 72 hours");
        assert_eq!(
            alerts_reached(&b, &[50, 80, 100]),
            vec![(50, AlertKind::Actual), (80, AlertKind::Actual)]
        );
    }

    #[test]
    fn the_forecast_alert_fires_when_the_run_rate_passes_the_budget() {
        // 10 days of 30 gone, a third of the budget plus a little spent: forecast above 100%.
        let b = burn(
            dec("340"),
            Some(dec("1000")),
            november(),
            at("2026-11-11T00:00:00Z"),
            chrono_tz::UTC,
        );
        assert_eq!(b.forecast, Some(dec("1020")));
        assert_eq!(b.forecast_pct, Some(dec("102")));
        assert_eq!(
            alerts_reached(&b, &[50, 80, 100]),
            vec![(100, AlertKind::Forecast)]
        );
        let under = burn(
            dec("330"),
            Some(dec("1000")),
            november(),
            at("2026-11-11T00:00:00Z"),
            chrono_tz::UTC,
        );
        assert_eq!(alerts_reached(&under, &[50, 80, 100]), vec![]);
    }

    #[test]
    fn no_budget_no_alerts() {
        let b = burn(
            dec("5000"),
            None,
            november(),
            at("2026-11-20T00:00:00Z"),
            chrono_tz::UTC,
        );
        assert_eq!(b.burn_pct, None);
        assert_eq!(alerts_reached(&b, &[50, 80, 100]), vec![]);
    }
}
