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
    let Some(span) = Span::of(contract, &window) else {
        return Vec::new();
    };
    netted_hours(
        &span,
        used_gpu_seconds_by_hour,
        &window,
        span.first..span.last,
    )
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
    /// The ledger date of each of `day_starts`.
    days: Vec<NaiveDate>,
}

/// The ledger days, from `first` to `last`, whose every hour lies inside a reservation's
/// validity and the window and lasts a whole hour (`LedgerWindow::whole_days`): each hour of
/// them commits `hour_seconds`, so netting such a day needs only its hours' usage, each
/// capped at `hour_seconds`, summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WholeDays {
    pub first: NaiveDate,
    pub last: NaiveDate,
    pub hour_seconds: Decimal,
}

impl LedgerWindow {
    pub fn new(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Self {
        let hours = ledger_hours(from, to, tz);
        let mut day_starts = Vec::new();
        let mut days = Vec::new();
        for (index, hour) in hours.iter().enumerate() {
            let day = hour.start.with_timezone(&tz).date_naive();
            if days.last() != Some(&day) {
                day_starts.push(index);
                days.push(day);
            }
        }
        let lengths = hours.iter().map(|hour| hour.end - hour.start).collect();
        Self {
            from,
            to,
            hours,
            lengths,
            day_starts,
            days,
        }
    }

    /// The position in `day_starts` of the ledger day holding hour `index`.
    fn day_of(&self, index: usize) -> usize {
        self.day_starts.partition_point(|&start| start <= index) - 1
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

    /// The ledger days of the window whose every hour is a whole hour long (all of them but
    /// where a time zone's offset moves by less than an hour), each with where its hours in
    /// the window begin and end.
    pub fn regular_days(&self) -> Vec<(NaiveDate, DateTime<Utc>, DateTime<Utc>)> {
        let whole = TimeDelta::seconds(WHOLE_HOUR);
        self.day_starts
            .iter()
            .enumerate()
            .filter_map(|(day, &first)| {
                let end = self
                    .day_starts
                    .get(day + 1)
                    .copied()
                    .unwrap_or(self.hours.len());
                self.lengths[first..end]
                    .iter()
                    .all(|length| *length == whole)
                    .then(|| {
                        (
                            self.days[day],
                            self.hours[first].start,
                            self.hours[end - 1].end,
                        )
                    })
            })
            .collect()
    }

    /// The days of the window `contract` commits whole (see [`WholeDays`]), irregular days
    /// included (see [`Self::regular_days`]); `None` when it commits no whole day of it.
    pub fn whole_days(&self, contract: &Contract) -> Option<WholeDays> {
        let span = Span::of(contract, self)?;
        let mut whole = self.day_starts.iter().enumerate().filter(|&(day, &first)| {
            let end = self
                .day_starts
                .get(day + 1)
                .copied()
                .unwrap_or(self.hours.len());
            first >= span.first
                && end <= span.last
                && self.hours[first].start >= span.start
                && self.hours[end - 1].end <= span.end
        });
        let (first, _) = whole.next()?;
        let last = whole.next_back().map_or(first, |(day, _)| day);
        Some(WholeDays {
            first: self.days[first],
            last: self.days[last],
            hour_seconds: span.committed_gpus * SECONDS_PER_HOUR,
        })
    }
}

const WHOLE_HOUR: i64 = 3600;

/// The part of a window a reservation commits GPUs in: `[start, end)`, the window's hours
/// `first..last` holding it.
struct Span {
    committed_gpus: Decimal,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    first: usize,
    last: usize,
}

impl Span {
    /// `None` for a contract that commits no reserved GPUs in the window.
    fn of(contract: &Contract, window: &LedgerWindow) -> Option<Self> {
        let committed_gpus = contract
            .committed_gpus
            .filter(|gpus| contract.billing_mode == BillingMode::Reserved && !gpus.is_zero())?;
        let start = window.from.max(contract.valid_from);
        let end = contract
            .valid_until
            .map_or(window.to, |until| until.min(window.to));
        if start >= end {
            return None;
        }
        // The hours from the one holding `start` to the one holding the last instant before
        // `end`.
        Some(Self {
            committed_gpus,
            start,
            end,
            first: window.hours.partition_point(|hour| hour.end <= start),
            last: window.hours.partition_point(|hour| hour.start < end),
        })
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

/// The window's hours `range` (inside the span), each with its index in the window's hours
/// and the GPU-seconds it commits and leaves unused.
fn netted_hours<'a>(
    span: &'a Span,
    used_gpu_seconds_by_hour: &'a HourlyUsage,
    window: &'a LedgerWindow,
    range: std::ops::Range<usize>,
) -> impl Iterator<Item = (usize, &'a LedgerHour, NettedSeconds)> + 'a {
    let first = range.start;
    let hours = &window.hours[range.clone()];
    let lengths = &window.lengths[range];
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
            let committed = if hour.start >= span.start && hour.end <= span.end {
                match committed_of {
                    Some((whole, committed)) if whole == length => committed,
                    _ => {
                        let committed = span.committed_gpus * seconds_between(hour.start, hour.end);
                        committed_of = Some((length, committed));
                        committed
                    }
                }
            } else {
                span.committed_gpus
                    * seconds_between(hour.start.max(span.start), hour.end.min(span.end))
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
///
/// `capped_days` gives, in day order, for some of the contract's whole days
/// ([`LedgerWindow::whole_days`]) that are regular ([`LedgerWindow::regular_days`]), the sum over the day's hours of
/// their usage capped at [`WholeDays::hour_seconds`]: such a day leaves
/// `its hours × hour_seconds` less that sum unused, and `used_gpu_seconds_by_hour` need not
/// hold its hours. Every other day is netted hour by hour.
pub fn unused_commitment_by_day(
    contract: &Contract,
    used_gpu_seconds_by_hour: &HourlyUsage,
    capped_days: &[(NaiveDate, Decimal)],
    window: &LedgerWindow,
) -> Vec<UnusedCommitment> {
    let Some(span) = Span::of(contract, window) else {
        return Vec::new();
    };
    let hour_seconds = span.committed_gpus * SECONDS_PER_HOUR;
    let mut capped = capped_days.iter().peekable();
    let mut days = Vec::new();
    let mut index = span.first;
    while index < span.last {
        let end = window.next_day_start(index).min(span.last);
        let day = window.days[window.day_of(index)];
        while capped.next_if(|(at, _)| *at < day).is_some() {}
        let sums = match capped.next_if(|(at, _)| *at == day) {
            Some((_, capped)) => {
                let committed = hour_seconds * Decimal::from(end - index);
                NettedSeconds {
                    committed,
                    unused: committed - capped,
                }
            }
            None => netted_hours(&span, used_gpu_seconds_by_hour, window, index..end).fold(
                NettedSeconds::default(),
                |sums, (_, _, seconds)| NettedSeconds {
                    committed: sums.committed + seconds.committed,
                    unused: sums.unused + seconds.unused,
                },
            ),
        };
        let first = &window.hours[index];
        days.push(sums.charge(first.start, first.month, contract));
        index = end;
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
            power_price_per_gpu_hour: Decimal::ZERO,
            energy_price_per_kwh: Decimal::ZERO,
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
            unused_commitment_by_day(&contract, &used, &[], &ledger),
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
        let days = unused_commitment_by_day(
            &contract,
            &used,
            &[],
            &LedgerWindow::new(window.0, window.1, tz),
        );
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

    type CappedDays = Vec<(NaiveDate, Decimal)>;

    /// Each whole, regular day of `contract` in `window` with its hours' usage capped at the
    /// hour's commitment and summed, as the database sums them, and the usage without those
    /// days' hours.
    fn capped(
        contract: &Contract,
        used: &[(DateTime<Utc>, Decimal)],
        window: &LedgerWindow,
        tz: Tz,
    ) -> (CappedDays, Vec<(DateTime<Utc>, Decimal)>) {
        let whole = window.whole_days(contract).unwrap();
        let regular: Vec<NaiveDate> = window.regular_days().iter().map(|d| d.0).collect();
        let is_capped = |hour: &DateTime<Utc>| {
            let day = hour.with_timezone(&tz).date_naive();
            (whole.first..=whole.last).contains(&day) && regular.contains(&day)
        };
        let mut days: Vec<(NaiveDate, Decimal)> = Vec::new();
        for (hour, seconds) in used.iter().filter(|(hour, _)| is_capped(hour)) {
            let day = hour.with_timezone(&tz).date_naive();
            let capped = (*seconds).min(whole.hour_seconds);
            match days.last_mut() {
                Some((last, sum)) if *last == day => *sum += capped,
                _ => days.push((day, capped)),
            }
        }
        let rest = used.iter().filter(|(hour, _)| !is_capped(hour)).copied();
        (days, rest.collect())
    }

    #[test]
    fn whole_days_netted_from_capped_sums_equal_the_hours_netted_one_by_one() {
        // Lord Howe moves its clocks by half an hour on 4 October 2026, Berlin by an hour on
        // 25 October; the contract starts and ends mid-day.
        for tz in [
            UTC,
            Asia::Kolkata,
            chrono_tz::Europe::Berlin,
            chrono_tz::Australia::Lord_Howe,
        ] {
            let (from, to) = (utc("2026-09-30T00:00:00Z"), utc("2026-11-02T00:00:00Z"));
            let window = LedgerWindow::new(from, to, tz);
            let contract = Contract {
                valid_from: utc("2026-10-01T05:45:00Z"),
                valid_until: Some(utc("2026-10-30T17:20:00Z")),
                ..reserved(Some(Decimal::new(25, 1)))
            };
            let used: Vec<_> = window
                .hours
                .iter()
                .enumerate()
                .filter(|(i, _)| i % 7 != 3)
                .map(|(i, hour)| (hour.start, Decimal::new((i as i64 * 7919) % 12000, 1)))
                .collect();
            let whole = window.whole_days(&contract).unwrap();
            assert_eq!(whole.hour_seconds, Decimal::from(9000));
            let local_day = |at: DateTime<Utc>| at.with_timezone(&tz).date_naive();
            assert_eq!(
                whole.first,
                local_day(contract.valid_from).succ_opt().unwrap()
            );
            let until = contract.valid_until.unwrap();
            assert_eq!(whole.last, local_day(until).pred_opt().unwrap(), "{tz}");
            let regular = window.regular_days();
            let irregular: Vec<NaiveDate> = window
                .days
                .iter()
                .filter(|day| !regular.iter().any(|r| r.0 == **day))
                .copied()
                .collect();
            let expected_irregular: &[NaiveDate] = if tz == chrono_tz::Australia::Lord_Howe {
                &[NaiveDate::from_ymd_opt(2026, 10, 4).unwrap()]
            } else {
                &[]
            };
            assert_eq!(irregular, expected_irregular, "{tz}");
            let (days, rest) = capped(&contract, &used, &window, tz);
            assert!(days.len() > 25, "{tz}: {}", days.len());
            assert_eq!(
                unused_commitment_by_day(&contract, &rest, &days, &window),
                unused_commitment_by_day(&contract, &used, &[], &window),
                "{tz}"
            );
        }
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
