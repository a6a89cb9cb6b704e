//! Hours and months of the ledger time zone, as UTC instants.
//!
//! Rollups are kept per *local* hour and reports per *local* month, so every cut the cost
//! model makes has to land where the ledger time zone's wall clock turns. Two facts make
//! that more than `truncate to the hour`:
//!
//! - offsets are not whole hours everywhere (Asia/Kolkata is +05:30, so its hours begin at
//!   :30 UTC), and
//! - daylight saving changes the length of a day, a month (a Europe/Berlin March has 743
//!   hours) and, where the shift is 30 minutes (Australia/Lord_Howe), even of an hour.
//!
//! An hour boundary is therefore every instant at which the local clock shows a whole hour,
//! plus every change of UTC offset. The second rule only matters where an offset change does
//! not fall on a whole local hour: it keeps every hour inside one offset, so that its start
//! is one well-defined instant that can key a rollup. Every month boundary is an hour
//! boundary (a local midnight, or the offset change that skips it).

use chrono::{DateTime, Datelike, Days, LocalResult, Months, NaiveDate, Offset, TimeZone, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;

/// Converts GPU-seconds to GPU-hours.
pub const SECONDS_PER_HOUR: Decimal = Decimal::from_parts(3600, 0, 0, false, 0);

const WHOLE_HOUR_SECONDS: i64 = 3600;

/// One hour of the ledger time zone: `[start, end)` in UTC.
///
/// Normally 3600 s long; shorter only around an offset change that is not a whole hour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerHour {
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    /// First day of the ledger-time-zone month that holds this hour.
    pub month: NaiveDate,
}

impl LedgerHour {
    /// The ledger hour that holds instant `at`.
    pub fn holding(at: DateTime<Utc>, tz: Tz) -> Self {
        let offset = offset_seconds(tz, at);
        let whole_hour = at - seconds_past_whole_hour(at, offset);
        let start = if offset_seconds(tz, whole_hour) == offset {
            whole_hour
        } else {
            // The offset changed after the wall clock's whole hour: the hour starts there.
            first_second_where(whole_hour.timestamp(), at.timestamp(), |second| {
                offset_seconds(tz, instant(second)) == offset
            })
        };
        Self::starting(start, offset, tz)
    }

    /// The ledger hour right after this one.
    pub fn following(&self, tz: Tz) -> Self {
        Self::starting(self.end, offset_seconds(tz, self.end), tz)
    }

    fn starting(start: DateTime<Utc>, offset: i32, tz: Tz) -> Self {
        let next_whole_hour = start - seconds_past_whole_hour(start, offset)
            + chrono::Duration::seconds(WHOLE_HOUR_SECONDS);
        let last_second = next_whole_hour - chrono::Duration::seconds(1);
        let end = if offset_seconds(tz, last_second) == offset {
            next_whole_hour
        } else {
            // The offset changes before the next whole local hour: the hour ends there.
            first_second_where(start.timestamp(), last_second.timestamp(), |second| {
                offset_seconds(tz, instant(second)) != offset
            })
        };
        let local_start = instant(start.timestamp() + i64::from(offset));
        Self {
            start,
            end,
            month: first_of_month(local_start.date_naive()),
        }
    }
}

/// The ledger-time-zone month holding `month` (any day of it), as `[start, end)` in UTC.
///
/// A month starts at the first instant whose local date is in it: local midnight of its
/// first day, the earlier one when midnight happens twice, or the end of the gap when a
/// daylight-saving jump skips midnight.
pub fn month_bounds(month: NaiveDate, tz: Tz) -> (DateTime<Utc>, DateTime<Utc>) {
    let first_day = first_of_month(month);
    (
        first_instant_of_day(first_day, tz),
        first_instant_of_day(first_day + Months::new(1), tz),
    )
}

/// First day of the month of `day`: how months are named throughout the cost model.
pub fn first_of_month(day: NaiveDate) -> NaiveDate {
    day - Days::new(u64::from(day.day0()))
}

/// The first instant whose local date is `day`: where a ledger day begins.
pub fn first_instant_of_day(day: NaiveDate, tz: Tz) -> DateTime<Utc> {
    let midnight = day.and_time(chrono::NaiveTime::MIN);
    match tz.from_local_datetime(&midnight) {
        LocalResult::Single(at) => at.with_timezone(&Utc),
        LocalResult::Ambiguous(earliest, _) => earliest.with_timezone(&Utc),
        LocalResult::None => {
            // No offset in use anywhere is 16 h or more from UTC, so the day starts within
            // 16 h of midnight read as UTC.
            let window = 16 * WHOLE_HOUR_SECONDS;
            let midnight_as_utc = midnight.and_utc().timestamp();
            first_second_where(
                midnight_as_utc - window,
                midnight_as_utc + window,
                |second| second + i64::from(offset_seconds(tz, instant(second))) >= midnight_as_utc,
            )
        }
    }
}

/// The exact length of `[start, end)` in seconds, to the nanosecond.
pub fn seconds_between(start: DateTime<Utc>, end: DateTime<Utc>) -> Decimal {
    let nanos = |at: DateTime<Utc>| {
        i128::from(at.timestamp()) * 1_000_000_000 + i128::from(at.timestamp_subsec_nanos())
    };
    // Chrono instants are less than 2·10^22 ns apart: far inside Decimal's 7.9·10^28.
    Decimal::from_i128_with_scale(nanos(end) - nanos(start), 9).normalize()
}

fn offset_seconds(tz: Tz, at: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&at.naive_utc())
        .fix()
        .local_minus_utc()
}

/// How far the local wall clock at `at` is past its last whole hour.
fn seconds_past_whole_hour(at: DateTime<Utc>, offset: i32) -> chrono::Duration {
    let local_seconds = at.timestamp() + i64::from(offset);
    chrono::Duration::seconds(local_seconds.rem_euclid(WHOLE_HOUR_SECONDS))
        + chrono::Duration::nanoseconds(i64::from(at.timestamp_subsec_nanos()))
}

/// Binary search for the first whole second in `(low, high]` where `holds` turns true,
/// given that it is false at `low`, true at `high`, and changes once in between (offset
/// changes fall on whole seconds).
fn first_second_where(mut low: i64, mut high: i64, holds: impl Fn(i64) -> bool) -> DateTime<Utc> {
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if holds(middle) {
            high = middle;
        } else {
            low = middle;
        }
    }
    instant(high)
}

/// The instant `unix_seconds` after the epoch; clamped, though every caller passes seconds
/// within a day of a valid instant.
fn instant(unix_seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(unix_seconds, 0).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::{America, Asia, Australia, Europe};

    fn utc(text: &str) -> DateTime<Utc> {
        text.parse().expect("test instants are valid RFC 3339")
    }

    fn day(year: i32, month: u32, day: u32) -> NaiveDate {
        NaiveDate::from_ymd_opt(year, month, day).expect("test dates are valid")
    }

    #[test]
    fn hours_of_a_half_hour_zone_start_at_half_past_utc() {
        let hour = LedgerHour::holding(utc("2026-11-20T10:10:00Z"), Asia::Kolkata);
        assert_eq!(hour.start, utc("2026-11-20T09:30:00Z"));
        assert_eq!(hour.end, utc("2026-11-20T10:30:00Z"));
        assert_eq!(
            hour.following(Asia::Kolkata).end,
            utc("2026-11-20T11:30:00Z")
        );
    }

    #[test]
    fn the_local_month_can_begin_the_previous_utc_day() {
        // 2026-11-01 00:00 in Kolkata is 2026-10-31 18:30 UTC.
        let hour = LedgerHour::holding(utc("2026-10-31T18:30:00Z"), Asia::Kolkata);
        assert_eq!(hour.month, day(2026, 11, 1));
        let before = LedgerHour::holding(utc("2026-10-31T18:29:59Z"), Asia::Kolkata);
        assert_eq!(before.month, day(2026, 10, 1));
        assert_eq!(before.end, hour.start);
    }

    #[test]
    fn daylight_saving_months_have_743_and_745_hours() {
        let hours = |month| {
            let (start, end) = month_bounds(month, Europe::Berlin);
            (end - start).num_hours()
        };
        assert_eq!(hours(day(2026, 3, 1)), 743);
        assert_eq!(hours(day(2026, 10, 1)), 745);
        assert_eq!(hours(day(2026, 11, 1)), 720);
        assert_eq!(
            month_bounds(day(2026, 11, 17), Europe::Berlin),
            (utc("2026-10-31T23:00:00Z"), utc("2026-11-30T23:00:00Z"))
        );
    }

    #[test]
    fn hours_cross_a_daylight_saving_change_without_gap_or_overlap() {
        // Berlin falls back at 01:00 UTC on 2026-10-25: local 02:00-03:00 happens twice.
        let mut hour = LedgerHour::holding(utc("2026-10-24T23:00:00Z"), Europe::Berlin);
        for expected_start in [
            "2026-10-24T23:00:00Z",
            "2026-10-25T00:00:00Z",
            "2026-10-25T01:00:00Z",
        ] {
            assert_eq!(hour.start, utc(expected_start));
            assert_eq!(hour.end - hour.start, chrono::Duration::hours(1));
            hour = hour.following(Europe::Berlin);
        }
    }

    #[test]
    fn a_half_hour_daylight_saving_shift_makes_a_half_hour() {
        // Lord Howe moves from +10:30 to +11:00 at 02:00 local on 2026-10-04,
        // i.e. at 2026-10-03T15:30Z; local 02:30-03:00 is a 30-minute hour.
        let hour = LedgerHour::holding(utc("2026-10-03T15:40:00Z"), Australia::Lord_Howe);
        assert_eq!(hour.start, utc("2026-10-03T15:30:00Z"));
        assert_eq!(hour.end, utc("2026-10-03T16:00:00Z"));
        let before = LedgerHour::holding(utc("2026-10-03T15:20:00Z"), Australia::Lord_Howe);
        assert_eq!(before.start, utc("2026-10-03T14:30:00Z"));
        assert_eq!(before.end, hour.start);
    }

    #[test]
    fn a_month_whose_midnight_is_skipped_starts_when_the_clock_jumps() {
        // Asunción jumped from 2023-09-30 24:00 (-04) straight to 2023-10-01 01:00 (-03).
        let (october_start, _) = month_bounds(day(2023, 10, 1), America::Asuncion);
        assert_eq!(october_start, utc("2023-10-01T04:00:00Z"));
        let (_, september_end) = month_bounds(day(2023, 9, 1), America::Asuncion);
        assert_eq!(september_end, october_start);
    }

    #[test]
    fn a_month_whose_midnight_happens_twice_starts_at_the_first() {
        // Havana falls back from 01:00 (-04) to 00:00 (-05) on 2026-11-01.
        let (start, _) = month_bounds(day(2026, 11, 1), America::Havana);
        assert_eq!(start, utc("2026-11-01T04:00:00Z"));
        assert_eq!(
            LedgerHour::holding(start, America::Havana).month,
            day(2026, 11, 1)
        );
    }

    proptest::proptest! {
        /// Whatever the zone, hours tile time, each starts at a whole local hour or where the
        /// offset changes, and lies inside the month it names.
        #[test]
        fn hours_tile_time_in_every_zone(
            tz in proptest::sample::select(chrono_tz::TZ_VARIANTS.to_vec()),
            second in 946_684_800..2_208_988_800i64, // 2000 to 2040
            nano in 0..1_000_000_000u32,
        ) {
            let at = DateTime::from_timestamp(second, nano).expect("in range");
            let hour = LedgerHour::holding(at, tz);
            proptest::prop_assert!(hour.start <= at && at < hour.end);
            proptest::prop_assert!(hour.end - hour.start <= chrono::Duration::hours(1));
            proptest::prop_assert_eq!(LedgerHour::holding(hour.end - chrono::Duration::nanoseconds(1), tz), hour);
            proptest::prop_assert_eq!(LedgerHour::holding(hour.end, tz), hour.following(tz));
            proptest::prop_assert_eq!(hour.following(tz).start, hour.end);

            let offset = offset_seconds(tz, hour.start);
            let whole_local_hour = seconds_past_whole_hour(hour.start, offset).is_zero();
            let offset_changes = offset_seconds(tz, hour.start - chrono::Duration::seconds(1)) != offset;
            proptest::prop_assert!(whole_local_hour || offset_changes);

            let local_day = hour.start.with_timezone(&tz).date_naive();
            proptest::prop_assert_eq!(hour.month, first_of_month(local_day));
            let (month_start, month_end) = month_bounds(hour.month, tz);
            proptest::prop_assert!(month_start <= hour.start && hour.end <= month_end);
        }
    }
}
