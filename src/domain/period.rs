//! The period a query names: a ledger month, or `from` and `to` on ledger hour boundaries.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::ledger_time::{LedgerHour, month_bounds};
use super::validation::Violations;
use super::values::{Month, parse_day_or_instant};

/// A period bound: a date, or a time on a ledger hour boundary.
fn period_bound(raw: &str, tz: Tz) -> Result<DateTime<Utc>, String> {
    let at = parse_day_or_instant(raw, tz)?;
    let hour = LedgerHour::holding(at, tz);
    if hour.start != at {
        return Err(format!(
            "must start a ledger hour (costs are kept per hour of {}): use {} or {}",
            tz.name(),
            hour.start
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            hour.end.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    Ok(at)
}

/// The period a query names: `month`, or `from` and `to`; what is wrong is reported to
/// `violations` as `query:<name>`.
pub fn parse_period(
    (month, from, to): (Option<&str>, Option<&str>, Option<&str>),
    tz: Tz,
    violations: &mut Violations,
) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
    match (month, from, to) {
        (Some(month), None, None) => violations
            .check("query:month", Month::parse(month))
            .map(|month| month_bounds(month.first_day(), tz)),
        (None, Some(from), Some(to)) => {
            let from = violations.check("query:from", period_bound(from, tz));
            let to = violations.check("query:to", period_bound(to, tz));
            match from.zip(to) {
                Some((from, to)) if from >= to => {
                    violations.push("query:to", "must be after from");
                    None
                }
                bounds => bounds,
            }
        }
        (Some(_), _, _) => {
            violations.push("query:month", "give either month or from and to, not both");
            None
        }
        (None, None, _) => {
            violations.push("query:from", "give month, or from and to");
            None
        }
        (None, Some(_), None) => {
            violations.push("query:to", "give to with from");
            None
        }
    }
}
