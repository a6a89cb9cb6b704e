//! Unused commitment of a reserved contract, hour by hour (COST_MODEL.md §3).
//!
//! A commitment is paid every hour whether or not GPUs run, so the hours nobody used are
//! waste in their own right. They are counted per ledger hour, the grain of the rollups,
//! because usage in one hour cannot make up for idleness in another.

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};
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

/// GPU-seconds a contract rated per ledger hour, keyed by the hour's start, in hour order.
pub type HourlyUsage = [(DateTime<Utc>, Decimal)];

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
    used_gpu_seconds_by_hour: &HourlyUsage,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    tz: Tz,
) -> Vec<UnusedCommitment> {
    let window = LedgerWindow::new(from, to, tz);
    netted_hours(contract, used_gpu_seconds_by_hour, &window)
        .map(|(_, hour, seconds)| seconds.charge(hour.start, hour.month, contract))
        .collect()
}

/// The ledger hours that hold some of `[from, to)`, in order.
fn ledger_hours(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Vec<LedgerHour> {
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

/// A window `[from, to)` with its ledger hours, and where each ledger day begins among them:
/// a caller netting many contracts over one window finds them once.
pub struct LedgerWindow {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub hours: Vec<LedgerHour>,
    /// The length of each of `hours`, in whole seconds and nanoseconds.
    lengths: Vec<TimeDelta>,
    /// The index of each ledger day's first hour in `hours`, in order.
    day_starts: Vec<usize>,
}

impl LedgerWindow {
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Self {
        let hours = ledger_hours(from, to, tz);
        let mut day_starts = Vec::new();
        let mut last_day = None;
        for (index, hour) in hours.iter().enumerate() {
            let day = hour.start.with_timezone(&tz).date_naive();
            if last_day != Some(day) {
                day_starts.push(index);
                last_day = Some(day);
            }
        }
        let lengths = hours.iter().map(|hour| hour.end - hour.start).collect();
        Self {
            from,
            to,
            hours,
            lengths,
            day_starts,
        }
    }

    /// The index in `hours` of the first hour of the ledger day after the one holding hour
    /// `index`, or the number of hours after the last day.
    fn next_day_start(&self, index: usize) -> usize {
        let day = self.day_starts.partition_point(|&start| start <= index);
        self.day_starts
            .get(day)
            .copied()
            .unwrap_or(self.hours.len())
    }
}

/// Committed and unused GPU-seconds of a stretch of hours.
#[derive(Debug, Clone, Copy, Default)]
struct NettedSeconds {
    committed: Decimal,
    unused: Decimal,
}

impl NettedSeconds {
    fn charge(
        self,
        hour: DateTime<Utc>,
        month: NaiveDate,
        contract: &Contract,
    ) -> UnusedCommitment {
        UnusedCommitment {
            hour,
            month,
            committed_gpu_hours: self.committed / SECONDS_PER_HOUR,
            unused_gpu_hours: self.unused / SECONDS_PER_HOUR,
            cost: self.unused * contract.price_per_gpu_hour / SECONDS_PER_HOUR,
        }
    }
}

/// Each ledger hour of `window` inside the contract's validity, with its index in the
/// window's hours and the GPU-seconds it commits and leaves unused; nothing for a contract
/// that commits no reserved GPUs.
fn netted_hours<'a>(
    contract: &Contract,
    used_gpu_seconds_by_hour: &'a HourlyUsage,
    window: &'a LedgerWindow,
) -> impl Iterator<Item = (usize, &'a LedgerHour, NettedSeconds)> + 'a {
    let committed_gpus = contract
        .committed_gpus
        .filter(|_| contract.billing_mode == BillingMode::Reserved)
        .unwrap_or_default();
    let start = window.from.max(contract.valid_from);
    let end = contract
        .valid_until
        .map_or(window.to, |until| until.min(window.to));
    let (first, last) = if committed_gpus.is_zero() || start >= end {
        (0, 0)
    } else {
        // The hours from the one holding `start` to the one holding the last instant before
        // `end`.
        (
            window.hours.partition_point(|hour| hour.end <= start),
            window.hours.partition_point(|hour| hour.start < end),
        )
    };
    let hours = &window.hours[first..last];
    let lengths = &window.lengths[first..last];
    let first_used = hours.first().map_or(0, |hour| {
        used_gpu_seconds_by_hour.partition_point(|(at, _)| *at < hour.start)
    });
    let mut used = used_gpu_seconds_by_hour[first_used..].iter().peekable();
    // Hours inside the validity commit the same GPU-seconds per length, so they are worked
    // out once per length; only the hours its edges cut are measured.
    let mut committed_of: Option<(TimeDelta, Decimal)> = None;
    hours
        .iter()
        .zip(lengths)
        .enumerate()
        .map(move |(offset, (hour, &length))| {
            let committed = if hour.start >= start && hour.end <= end {
                match committed_of {
                    Some((whole, committed)) if whole == length => committed,
                    _ => {
                        let committed = committed_gpus * seconds_between(hour.start, hour.end);
                        committed_of = Some((length, committed));
                        committed
                    }
                }
            } else {
                committed_gpus * seconds_between(hour.start.max(start), hour.end.min(end))
            };
            while used.next_if(|(at, _)| *at < hour.start).is_some() {}
            let used_seconds = used
                .next_if(|(at, _)| *at == hour.start)
                .map_or(Decimal::ZERO, |(_, seconds)| *seconds);
            let unused = (committed - used_seconds).max(Decimal::ZERO);
            (first + offset, hour, NettedSeconds { committed, unused })
        })
}

/// [`unused_commitment`] over the ledger hours of `window`, summed per ledger day: one entry
/// per day with some commitment, whose `hour` is the first of the day's hours netted. The
/// GPU-seconds of a day are summed before they become GPU-hours and money, so a month of a
/// reservation's hours costs a few dozen divisions rather than one per hour; a day lies in one
/// ledger month, so every figure grouped by day or coarser sums these exactly as it would the
/// hours.
pub fn unused_commitment_by_day(
    contract: &Contract,
    used_gpu_seconds_by_hour: &HourlyUsage,
    window: &LedgerWindow,
) -> Vec<UnusedCommitment> {
    let mut days = Vec::new();
    let mut day: Option<(&LedgerHour, usize, NettedSeconds)> = None;
    for (index, hour, seconds) in netted_hours(contract, used_gpu_seconds_by_hour, window) {
        match &mut day {
            Some((_, next_day, sums)) if index < *next_day => {
                sums.committed += seconds.committed;
                sums.unused += seconds.unused;
            }
            _ => {
                if let Some((first, _, sums)) = day.take() {
                    days.push(sums.charge(first.start, first.month, contract));
                }
                day = Some((hour, window.next_day_start(index), seconds));
            }
        }
    }
    if let Some((first, _, sums)) = day {
        days.push(sums.charge(first.start, first.month, contract));
    }
    days
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
        let used = [
            (utc("2026-11-01T00:00:00Z"), Decimal::from(3600)),
            (utc("2026-11-01T01:00:00Z"), Decimal::from(3 * 3600)),
        ];
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
            &[],
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
            &[],
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
    fn a_contract_valid_in_part_of_a_window_is_netted_over_its_hours_only() {
        // Berlin's clocks go back at 01:00Z on 25 October 2026; the contract starts mid-hour
        // before that and ends two hours later. Usage before it must not count.
        let tz = chrono_tz::Europe::Berlin;
        let window = (utc("2026-10-24T22:00:00Z"), utc("2026-10-25T23:00:00Z"));
        let contract = Contract {
            valid_from: utc("2026-10-25T00:30:00Z"),
            valid_until: Some(utc("2026-10-25T03:00:00Z")),
            ..reserved(Some(Decimal::ONE))
        };
        let used = [
            (utc("2026-10-24T23:00:00Z"), Decimal::from(3600)),
            (utc("2026-10-25T00:00:00Z"), Decimal::from(1800)),
            (utc("2026-10-25T02:00:00Z"), Decimal::from(900)),
        ];
        let ledger = LedgerWindow::new(window.0, window.1, tz);
        assert_eq!(
            ledger.hours.len(),
            25,
            "the day the clocks go back has 25 hours"
        );
        let charges = unused_commitment(&contract, &used, window.0, window.1, tz);
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
        let october = NaiveDate::from_ymd_opt(2026, 10, 1).unwrap();
        assert!(charges.iter().all(|c| c.month == october));
        assert_eq!(
            unused_commitment_by_day(&contract, &used, &ledger),
            [UnusedCommitment {
                hour: utc("2026-10-25T00:00:00Z"),
                month: october,
                committed_gpu_hours: Decimal::new(25, 1),
                unused_gpu_hours: Decimal::new(175, 2),
                cost: Decimal::new(2625, 3),
            }],
            "the same hours summed over their one ledger day"
        );
    }

    #[test]
    fn a_day_sums_its_hours_and_days_follow_the_ledger_time_zone() {
        // Kolkata's days begin at 18:30Z; the window holds the end of one and a whole other.
        let tz = Asia::Kolkata;
        let window = (utc("2026-11-01T12:30:00Z"), utc("2026-11-02T18:30:00Z"));
        let contract = reserved(Some(Decimal::new(3, 0)));
        let used: Vec<_> = (0..30)
            .map(|h| {
                let hour = window.0 + chrono::Duration::hours(h);
                (hour, Decimal::new(1000 * h + 7, 1))
            })
            .collect();
        let hours = unused_commitment(&contract, &used, window.0, window.1, tz);
        let days =
            unused_commitment_by_day(&contract, &used, &LedgerWindow::new(window.0, window.1, tz));
        assert_eq!(
            days.iter().map(|d| d.hour).collect::<Vec<_>>(),
            [utc("2026-11-01T12:30:00Z"), utc("2026-11-01T18:30:00Z")]
        );
        for (day, hours) in days.iter().zip([&hours[..6], &hours[6..]]) {
            let sum = |figure: fn(&UnusedCommitment) -> Decimal| -> Decimal {
                hours.iter().map(figure).sum()
            };
            assert_eq!(day.committed_gpu_hours, sum(|h| h.committed_gpu_hours));
            let close = |a: Decimal, b: Decimal| (a - b).abs() < Decimal::new(1, 24);
            assert!(
                close(day.unused_gpu_hours, sum(|h| h.unused_gpu_hours)),
                "{day:?}"
            );
            assert!(close(day.cost, sum(|h| h.cost)), "{day:?}");
        }
        assert_eq!(hours.len(), 30);
        assert!(hours.iter().all(|h| h.month == days[0].month));
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
            let charges = unused_commitment(&contract, &[], whole_month.0, whole_month.1, UTC);
            assert!(charges.is_empty());
        }
    }
}
