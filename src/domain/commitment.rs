//! Unused commitment of a reserved contract, hour by hour (COST_MODEL.md §3).
//!
//! A commitment is paid every hour whether or not GPUs run, so the hours nobody used are
//! waste in their own right. They are counted per ledger hour, the grain of the rollups,
//! because usage in one hour cannot make up for idleness in another.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;

use super::ledger_time::{LedgerHour, SECONDS_PER_HOUR, seconds_between};
use super::rating::{BillingMode, Contract};

/// The commitment left unused in one ledger hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnusedCommitment {
    /// Start of the ledger hour.
    pub hour: DateTime<Utc>,
    /// The ledger month holding the hour.
    pub month: NaiveDate,
    /// The GPU-hours committed in the part of the hour inside the window.
    pub committed_gpu_hours: Decimal,
    pub unused_gpu_hours: Decimal,
    /// In the contract's currency.
    pub cost: Decimal,
}

/// Unused commitment of `contract` for every ledger hour of
/// `[valid_from, valid_until) ∩ [from, to)`, zero-unused hours included.
///
/// `used_gpu_seconds_by_hour` holds the GPU-seconds of the segments rated by this contract,
/// keyed by the start of their ledger hour. For a month in progress the caller passes
/// `to = min(as_of, month end)`. An hour cut by the window's edges is committed pro rata:
/// `committed_gpus × the hours of it inside the window`; its usage is taken whole, as the
/// rollup has no finer grain. A contract that is not reserved or commits no GPUs has no
/// unused commitment.
pub fn unused_commitment(
    contract: &Contract,
    used_gpu_seconds_by_hour: &BTreeMap<DateTime<Utc>, Decimal>,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    tz: Tz,
) -> Vec<UnusedCommitment> {
    let hours = ledger_hours(from, to, tz);
    unused_commitment_in(contract, used_gpu_seconds_by_hour, &hours, from, to)
}

/// The ledger hours that hold some of `[from, to)`, in order.
pub fn ledger_hours(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Vec<LedgerHour> {
    let mut hours = Vec::new();
    if from >= to {
        return hours;
    }
    let mut hour = LedgerHour::holding(from, tz);
    while hour.start < to {
        let next = hour.following(tz);
        hours.push(hour);
        hour = next;
    }
    hours
}

/// [`unused_commitment`] over `hours`, the ledger hours of `[from, to)` as [`ledger_hours`]
/// gives them: a caller netting many contracts over one window finds its hours once.
pub fn unused_commitment_in(
    contract: &Contract,
    used_gpu_seconds_by_hour: &BTreeMap<DateTime<Utc>, Decimal>,
    hours: &[LedgerHour],
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Vec<UnusedCommitment> {
    let Some(committed_gpus) = contract
        .committed_gpus
        .filter(|_| contract.billing_mode == BillingMode::Reserved)
    else {
        return Vec::new();
    };
    let start = from.max(contract.valid_from);
    let end = contract.valid_until.map_or(to, |until| until.min(to));
    if start >= end {
        return Vec::new();
    }
    // The hours from the one holding `start` to the one holding the last instant before `end`.
    let first = hours.partition_point(|hour| hour.end <= start);
    let last = hours.partition_point(|hour| hour.start < end);
    let mut charges = Vec::with_capacity(last.saturating_sub(first));
    let mut used = used_gpu_seconds_by_hour.range(hours.get(first).map_or(start, |h| h.start)..);
    let mut next_used = used.next();
    // Whole hours commit the same GPU-hours, so they are worked out once.
    let mut committed_of: Option<(Decimal, Decimal, Decimal)> = None;
    for hour in &hours[first..last] {
        let seconds = seconds_between(hour.start.max(start), hour.end.min(end));
        let (committed_seconds, committed_gpu_hours) = match committed_of {
            Some((cached, committed_seconds, committed_gpu_hours)) if cached == seconds => {
                (committed_seconds, committed_gpu_hours)
            }
            _ => {
                let committed_seconds = committed_gpus * seconds;
                let committed_gpu_hours = committed_seconds / SECONDS_PER_HOUR;
                committed_of = Some((seconds, committed_seconds, committed_gpu_hours));
                (committed_seconds, committed_gpu_hours)
            }
        };
        while next_used.is_some_and(|(at, _)| *at < hour.start) {
            next_used = used.next();
        }
        let used_seconds = match next_used {
            Some((at, seconds)) if *at == hour.start => *seconds,
            _ => Decimal::ZERO,
        };
        let unused_seconds = (committed_seconds - used_seconds).max(Decimal::ZERO);
        charges.push(UnusedCommitment {
            hour: hour.start,
            month: hour.month,
            committed_gpu_hours,
            unused_gpu_hours: unused_seconds / SECONDS_PER_HOUR,
            cost: unused_seconds * contract.price_per_gpu_hour / SECONDS_PER_HOUR,
        });
    }
    charges
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::{Asia, UTC};
    use uuid::Uuid;

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().expect("test instants are valid RFC 3339")
    }

    fn reserved(committed_gpus: Option<Decimal>) -> Contract {
        Contract {
            id: Uuid::from_u128(4),
            gpu_model: "A100".into(),
            billing_mode: BillingMode::Reserved,
            project: None,
            provider: None,
            region: None,
            valid_from: utc("2026-11-01T00:00:00Z"),
            valid_until: Some(utc("2026-12-01T00:00:00Z")),
            price_per_gpu_hour: Decimal::new(150, 2),
            currency: "USD".into(),
            committed_gpus,
        }
    }

    #[test]
    fn usage_is_netted_per_hour_and_never_below_zero() {
        let contract = reserved(Some(Decimal::TWO));
        let used = BTreeMap::from([
            (utc("2026-11-01T00:00:00Z"), Decimal::from(3600)),
            (utc("2026-11-01T01:00:00Z"), Decimal::from(3 * 3600)),
        ]);
        let charges = unused_commitment(
            &contract,
            &used,
            utc("2026-11-01T00:00:00Z"),
            utc("2026-11-01T03:00:00Z"),
            UTC,
        );
        let unused: Vec<Decimal> = charges.iter().map(|c| c.unused_gpu_hours).collect();
        assert_eq!(unused, [Decimal::ONE, Decimal::ZERO, Decimal::TWO]);
        assert_eq!(charges[2].cost, Decimal::new(300, 2));
        let committed: Vec<Decimal> = charges.iter().map(|c| c.committed_gpu_hours).collect();
        assert_eq!(committed, [Decimal::TWO; 3]);
    }

    #[test]
    fn edge_hours_count_pro_rata_and_validity_clips_the_window() {
        let contract = reserved(Some(Decimal::TWO));
        let charges = unused_commitment(
            &contract,
            &BTreeMap::new(),
            utc("2026-10-31T22:00:00Z"),
            utc("2026-11-01T01:15:00Z"),
            UTC,
        );
        let hours: Vec<_> = charges
            .iter()
            .map(|c| (c.hour, c.unused_gpu_hours))
            .collect();
        assert_eq!(
            hours,
            [
                (utc("2026-11-01T00:00:00Z"), Decimal::TWO),
                (utc("2026-11-01T01:00:00Z"), Decimal::new(5, 1)),
            ]
        );
    }

    #[test]
    fn hours_follow_the_ledger_time_zone() {
        let contract = reserved(Some(Decimal::ONE));
        let charges = unused_commitment(
            &contract,
            &BTreeMap::new(),
            utc("2026-11-01T00:00:00Z"),
            utc("2026-11-01T02:00:00Z"),
            Asia::Kolkata,
        );
        let hours: Vec<_> = charges
            .iter()
            .map(|c| (c.hour, c.unused_gpu_hours))
            .collect();
        assert_eq!(
            hours,
            [
                (utc("2026-10-31T23:30:00Z"), Decimal::new(5, 1)),
                (utc("2026-11-01T00:30:00Z"), Decimal::ONE),
                (utc("2026-11-01T01:30:00Z"), Decimal::new(5, 1)),
            ]
        );
    }

    #[test]
    fn hours_found_once_for_a_window_net_a_contract_valid_in_part_of_it() {
        // Berlin's clocks go back at 01:00Z on 25 October 2026; the contract starts mid-hour
        // before that and ends two hours later. Usage before it must not count.
        let tz = chrono_tz::Europe::Berlin;
        let window = (utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"));
        let contract = Contract {
            valid_from: utc("2026-10-25T00:30:00Z"),
            valid_until: Some(utc("2026-10-25T03:00:00Z")),
            ..reserved(Some(Decimal::ONE))
        };
        let used = BTreeMap::from([
            (utc("2026-10-24T23:00:00Z"), Decimal::from(3600)),
            (utc("2026-10-25T00:00:00Z"), Decimal::from(1800)),
            (utc("2026-10-25T02:00:00Z"), Decimal::from(900)),
        ]);
        let hours = ledger_hours(window.0, window.1, tz);
        assert_eq!(hours.len(), 25, "the day the clocks go back has 25 hours");
        let charges = unused_commitment_in(&contract, &used, &hours, window.0, window.1);
        let netted: Vec<_> = charges
            .iter()
            .map(|c| (c.hour, c.committed_gpu_hours, c.unused_gpu_hours))
            .collect();
        assert_eq!(
            netted,
            [
                (
                    utc("2026-10-25T00:00:00Z"),
                    Decimal::new(5, 1),
                    Decimal::ZERO
                ),
                (utc("2026-10-25T01:00:00Z"), Decimal::ONE, Decimal::ONE),
                (
                    utc("2026-10-25T02:00:00Z"),
                    Decimal::ONE,
                    Decimal::new(75, 2)
                ),
            ]
        );
        assert!(
            charges
                .iter()
                .all(|c| c.month == NaiveDate::from_ymd_opt(2026, 10, 1).unwrap())
        );
        assert_eq!(
            charges,
            unused_commitment(&contract, &used, window.0, window.1, tz),
            "the same as netting the contract alone"
        );
    }

    #[test]
    fn without_a_commitment_nothing_is_unused() {
        let whole_month = (utc("2026-11-01T00:00:00Z"), utc("2026-12-01T00:00:00Z"));
        let uncommitted = reserved(None);
        let on_demand = Contract {
            billing_mode: BillingMode::OnDemand,
            ..reserved(Some(Decimal::TWO))
        };
        for contract in [uncommitted, on_demand] {
            let charges = unused_commitment(
                &contract,
                &BTreeMap::new(),
                whole_month.0,
                whole_month.1,
                UTC,
            );
            assert!(charges.is_empty());
        }
    }
}
