//! Prior-period adjustments (COST_MODEL.md §6): a closed month's report stays as it was
//! frozen, so what changes in that month afterwards is booked into the first open month after
//! it, line by line: what the line is now, less what the frozen report showed, less what
//! later closed months already booked for it.

use std::collections::{BTreeMap, BTreeSet};

use rust_decimal::Decimal;
use sqlx::PgConnection;

use super::lines::{LineKey, amounts_by_line, current_amounts};
use super::model::{AdjustmentLine, Amounts, MonthlyReport};
use crate::config::Settings;
use crate::domain::values::Month;
use crate::domain::what_if::WhatIf;
use crate::ledger::LedgerResult;
use crate::store::closes::CloseRow;

/// Adjustments booked into `month`: for each closed month whose first open successor is
/// `month`, what its lines are now, less what its frozen report showed, less what later
/// closed months already booked for it.
pub(super) async fn adjustments(
    conn: &mut PgConnection,
    mut aside: Option<&mut PgConnection>,
    month: Month,
    closes: &[CloseRow],
    what_if: &WhatIf,
    settings: &Settings,
) -> LedgerResult<Vec<AdjustmentLine>> {
    let frozen = frozen_reports(closes)?;
    let closed: BTreeSet<Month> = frozen.keys().copied().collect();
    let mut lines = Vec::new();
    for (&closed_month, report) in frozen.range(..month) {
        if booking_month(closed_month, &closed) != month {
            continue;
        }
        let now =
            current_amounts(conn, aside.as_deref_mut(), closed_month, what_if, settings).await?;
        let then = amounts_by_line(&report.projects, &report.shared, &report.pools);
        let later = frozen.range(closed_month.next()..month).map(|(_, r)| r);
        let booked = already_booked(closed_month, later);
        lines.extend(changes(closed_month, &now, &then, &booked));
    }
    Ok(lines)
}

/// The report each closed month was frozen with.
fn frozen_reports(closes: &[CloseRow]) -> LedgerResult<BTreeMap<Month, MonthlyReport>> {
    closes
        .iter()
        .map(|close| {
            let report = serde_json::from_str(&close.report_json).map_err(anyhow::Error::from)?;
            Ok((Month::from_first_day(close.month), report))
        })
        .collect()
}

/// The month that books the changes to `closed_month`: the first month after it that is not
/// closed.
fn booking_month(closed_month: Month, closed: &BTreeSet<Month>) -> Month {
    let mut booking = closed_month.next();
    while closed.contains(&booking) {
        booking = booking.next();
    }
    booking
}

/// What the adjustments of `later` reports booked for `closed_month`, per line.
fn already_booked<'a>(
    closed_month: Month,
    later: impl IntoIterator<Item = &'a MonthlyReport>,
) -> BTreeMap<LineKey, Amounts> {
    let mut booked: BTreeMap<LineKey, Amounts> = BTreeMap::new();
    for line in later
        .into_iter()
        .flat_map(|report| &report.adjustments)
        .filter(|line| line.belongs_to == closed_month)
    {
        let sum = booked
            .entry((line.project.clone(), line.currency.clone()))
            .or_default();
        *sum = sum.combine(&line.amounts, Decimal::ONE);
    }
    booked
}

/// The adjustment of each line of `closed_month` that changed: now − frozen − already booked.
fn changes(
    closed_month: Month,
    now: &BTreeMap<LineKey, Amounts>,
    frozen: &BTreeMap<LineKey, Amounts>,
    booked: &BTreeMap<LineKey, Amounts>,
) -> Vec<AdjustmentLine> {
    let zero = Amounts::default();
    let keys: BTreeSet<&LineKey> = now.keys().chain(frozen.keys()).collect();
    keys.into_iter()
        .filter_map(|key| {
            let delta = now
                .get(key)
                .unwrap_or(&zero)
                .combine(frozen.get(key).unwrap_or(&zero), -Decimal::ONE)
                .combine(booked.get(key).unwrap_or(&zero), -Decimal::ONE);
            (!delta.is_zero()).then(|| AdjustmentLine {
                project: key.0.clone(),
                belongs_to: closed_month,
                currency: key.1.clone(),
                amounts: delta.normalized(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};

    use super::*;

    fn month(raw: &str) -> Month {
        Month::parse(raw).unwrap()
    }

    fn amounts(total: &str, idle: &str) -> Amounts {
        let total: Decimal = total.parse().unwrap();
        let idle: Decimal = idle.parse().unwrap();
        Amounts {
            total,
            productive: total - idle,
            idle,
            ..Amounts::default()
        }
    }

    fn unused(amount: &str) -> Amounts {
        let amount: Decimal = amount.parse().unwrap();
        Amounts {
            total: amount,
            unused_commitment: amount,
            ..Amounts::default()
        }
    }

    fn project(id: &str) -> LineKey {
        (Some(id.to_owned()), "USD".to_owned())
    }

    fn shared() -> LineKey {
        (None, "USD".to_owned())
    }

    fn report_with(adjustments: Vec<AdjustmentLine>) -> MonthlyReport {
        let at = Utc.with_ymd_and_hms(2026, 12, 1, 0, 0, 0).unwrap();
        MonthlyReport {
            month: month("2026-11"),
            closed: true,
            closed_at: Some(at),
            as_of: at,
            ends_at: Some(at),
            projects: Vec::new(),
            shared: Vec::new(),
            commitments: Vec::new(),
            pools: Vec::new(),
            adjustments,
            totals: Vec::new(),
            hypothetical: false,
            overrides: Vec::new(),
        }
    }

    fn adjustment(key: LineKey, belongs_to: &str, amounts: Amounts) -> AdjustmentLine {
        AdjustmentLine {
            project: key.0,
            belongs_to: month(belongs_to),
            currency: key.1,
            amounts,
        }
    }

    #[test]
    fn changes_are_booked_into_the_first_open_month() {
        let closed: BTreeSet<Month> = [month("2026-09"), month("2026-10"), month("2026-12")]
            .into_iter()
            .collect();
        assert_eq!(booking_month(month("2026-09"), &closed), month("2026-11"));
        assert_eq!(booking_month(month("2026-10"), &closed), month("2026-11"));
        assert_eq!(booking_month(month("2026-12"), &closed), month("2027-01"));
    }

    #[test]
    fn an_adjustment_is_now_less_frozen_less_already_booked() {
        let now = BTreeMap::from([
            (project("vision"), amounts("130.5", "10.5")),
            (project("speech"), amounts("40", "0")),
            (project("search"), amounts("7", "7")),
        ]);
        let frozen = BTreeMap::from([
            (project("vision"), amounts("100", "10")),
            (project("speech"), amounts("40", "0")),
            (shared(), unused("25")),
        ]);
        let booked = BTreeMap::from([(project("vision"), amounts("20", "0"))]);
        let lines = changes(month("2026-10"), &now, &frozen, &booked);
        let by_line: BTreeMap<LineKey, Amounts> = lines
            .iter()
            .map(|line| ((line.project.clone(), line.currency.clone()), line.amounts))
            .collect();
        assert_eq!(
            by_line,
            BTreeMap::from([
                (shared(), unused("-25")),
                (project("search"), amounts("7", "7")),
                (project("vision"), amounts("10.5", "0.5")),
            ]),
            "an unchanged line books nothing; a line gone since the close books its reversal"
        );
        assert!(lines.iter().all(|line| line.belongs_to == month("2026-10")));
    }

    #[test]
    fn adjustments_come_out_normalized() {
        let now = BTreeMap::from([(project("vision"), amounts("10.50", "0.50"))]);
        let frozen = BTreeMap::from([(project("vision"), amounts("10.00", "0.00"))]);
        let lines = changes(month("2026-10"), &now, &frozen, &BTreeMap::new());
        assert_eq!(lines[0].amounts.total.to_string(), "0.5");
        assert_eq!(lines[0].amounts.productive.to_string(), "0");
    }

    #[test]
    fn already_booked_sums_the_later_adjustments_of_the_month() {
        let november = report_with(vec![
            adjustment(project("vision"), "2026-10", amounts("5", "1")),
            adjustment(project("vision"), "2026-09", amounts("100", "0")),
        ]);
        let december = report_with(vec![
            adjustment(project("vision"), "2026-10", amounts("2.5", "0")),
            adjustment(shared(), "2026-10", unused("-3")),
        ]);
        let booked = already_booked(month("2026-10"), [&november, &december]);
        assert_eq!(
            booked,
            BTreeMap::from([
                (project("vision"), amounts("7.5", "1")),
                (shared(), unused("-3")),
            ])
        );
    }
}
