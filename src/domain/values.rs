//! Newtypes that are parsed once at the boundary, so the core never sees an unchecked value.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use rust_decimal::{Decimal, RoundingStrategy};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A project id: a lowercase slug, 1–63 characters of `a-z`, `0-9` and `-`, starting with a
/// letter or digit.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProjectId(String);

impl ProjectId {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let valid = !raw.is_empty()
            && raw.len() <= 63
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !raw.starts_with('-')
            && !raw.ends_with('-');
        if valid {
            Ok(Self(raw.to_owned()))
        } else {
            Err(format!(
                "`{}` is not a project id: use 1-63 lowercase letters, digits and inner hyphens",
                truncate_for_message(raw)
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ProjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An ISO 4217 currency code (`USD`, `EUR`, `CNY`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Currency(iso_currency::Currency);

impl Currency {
    /// A currency money can be kept in: ISO 4217 codes without a minor unit (`XXX`, `XTS`,
    /// precious metals, special drawing rights) are refused.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let currency = iso_currency::Currency::from_code(raw).ok_or_else(|| {
            format!(
                "`{}` is not an ISO 4217 currency code",
                truncate_for_message(raw)
            )
        })?;
        if currency.exponent().is_none() {
            return Err(format!(
                "`{raw}` is an ISO 4217 code without a minor unit, not a currency to keep money in"
            ));
        }
        Ok(Self(currency))
    }

    pub fn code(&self) -> &'static str {
        self.0.code()
    }

    /// Digits after the decimal point of the currency's minor unit (2 for USD, 0 for JPY).
    pub fn minor_unit_digits(&self) -> u32 {
        self.0.exponent().map(u32::from).unwrap_or(2)
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// A calendar month `YYYY-MM` of the ledger time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Month(NaiveDate);

impl Month {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let invalid = || {
            format!(
                "`{}` is not a month: use YYYY-MM",
                truncate_for_message(raw)
            )
        };
        if raw.len() != 7 || raw.as_bytes()[4] != b'-' {
            return Err(invalid());
        }
        let year: i32 = raw[..4].parse().map_err(|_| invalid())?;
        let month: u32 = raw[5..].parse().map_err(|_| invalid())?;
        if !(1970..=9999).contains(&year) {
            return Err(invalid());
        }
        NaiveDate::from_ymd_opt(year, month, 1)
            .map(Self)
            .ok_or_else(invalid)
    }

    pub fn from_first_day(first_day: NaiveDate) -> Self {
        Self(first_day.with_day(1).expect("day 1 exists in every month"))
    }

    /// The first day of the month.
    pub fn first_day(&self) -> NaiveDate {
        self.0
    }

    pub fn next(&self) -> Self {
        Self(
            self.0
                .checked_add_months(chrono::Months::new(1))
                .expect("months stay within chrono's range"),
        )
    }
}

impl fmt::Display for Month {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m"))
    }
}

impl FromStr for Month {
    type Err = String;
    fn from_str(raw: &str) -> Result<Self, String> {
        Self::parse(raw)
    }
}

impl Serialize for Month {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Month {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// An instant given as RFC 3339 with an explicit offset; a time without one is ambiguous.
pub fn parse_instant(raw: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(raw.trim())
        .map(|at| at.with_timezone(&Utc))
        .map_err(|_| {
            format!(
                "`{}` is not an RFC 3339 time with an offset (e.g. 2026-11-20T10:00:00Z)",
                truncate_for_message(raw)
            )
        })
}

/// The months of the ledger that a period overlaps.
pub fn months_between(from: DateTime<Utc>, to: DateTime<Utc>, tz: chrono_tz::Tz) -> Vec<Month> {
    let first = Month::from_first_day(from.with_timezone(&tz).date_naive());
    let last = Month::from_first_day(to.with_timezone(&tz).date_naive());
    let mut months = vec![first];
    while *months.last().expect("starts non-empty") < last {
        let next = months.last().expect("starts non-empty").next();
        months.push(next);
    }
    months
}

/// The ledger month holding `at`.
pub fn month_holding(at: DateTime<Utc>, tz: chrono_tz::Tz) -> Month {
    Month::from_first_day(at.with_timezone(&tz).date_naive())
}

/// Money rounded half-even to the currency's minor unit (2 for USD, 0 for JPY), with every
/// minor digit shown (`84.60`).
pub fn round_money(amount: Decimal, currency: &str) -> Decimal {
    let digits = Currency::parse(currency)
        .map(|c| c.minor_unit_digits())
        .unwrap_or(2);
    let mut rounded = amount.round_dp_with_strategy(digits, RoundingStrategy::MidpointNearestEven);
    rounded.rescale(digits);
    rounded
}

/// An RFC 3339 instant, or a `YYYY-MM-DD` date standing for the first instant of that day in
/// the ledger time zone.
pub fn parse_day_or_instant(raw: &str, tz: chrono_tz::Tz) -> Result<DateTime<Utc>, String> {
    match NaiveDate::parse_from_str(raw, "%Y-%m-%d") {
        Ok(day) => Ok(crate::domain::ledger_time::first_instant_of_day(day, tz)),
        Err(_) => parse_instant(raw).map_err(|_| {
            format!(
                "`{}` is neither a YYYY-MM-DD date nor an RFC 3339 time with an offset",
                truncate_for_message(raw)
            )
        }),
    }
}

/// A strictly positive amount of money or quantity.
pub fn positive(value: Decimal) -> Result<Decimal, String> {
    if value > Decimal::ZERO {
        Ok(value.normalize())
    } else {
        Err(format!("must be greater than 0, got {value}"))
    }
}

/// Alert thresholds in percent of the monthly budget: 1 to 1000, strictly ascending.
pub fn alert_thresholds(values: &[i64]) -> Result<Vec<i32>, String> {
    if values.is_empty() {
        return Err("give at least one threshold".to_owned());
    }
    if values.len() > 20 {
        return Err("give at most 20 thresholds".to_owned());
    }
    if let Some(bad) = values.iter().find(|v| !(1..=1000).contains(*v)) {
        return Err(format!(
            "thresholds are percentages from 1 to 1000, got {bad}"
        ));
    }
    if values.windows(2).any(|pair| pair[0] >= pair[1]) {
        return Err("thresholds must be strictly ascending".to_owned());
    }
    Ok(values.iter().map(|v| *v as i32).collect())
}

/// A bounded, non-blank text such as a name.
pub fn bounded_text(raw: &str, max_chars: usize) -> Result<String, String> {
    let trimmed = raw.trim();
    if trimmed.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if trimmed.chars().count() > max_chars {
        return Err(format!("must be at most {max_chars} characters"));
    }
    if trimmed.chars().any(char::is_control) {
        return Err("must not contain control characters".to_owned());
    }
    Ok(trimmed.to_owned())
}

/// The longest node name: a Kubernetes node name is a DNS subdomain of at most 253 characters.
pub const MAX_NODE_CHARS: usize = 253;

/// A node's name as its cluster spells it (a Kubernetes node, a Slurm node, a cloud
/// instance): 1 to 253 characters, none of them white space or control characters.
pub fn node_name(raw: &str) -> Result<String, String> {
    if raw.is_empty() {
        Err("must not be empty".to_owned())
    } else if raw.chars().count() > MAX_NODE_CHARS {
        Err(format!("must be at most {MAX_NODE_CHARS} characters"))
    } else if raw.chars().any(|c| c.is_whitespace() || c.is_control()) {
        Err("must not contain white space or control characters".to_owned())
    } else {
        Ok(raw.to_owned())
    }
}

/// An absolute `http` or `https` URL for webhooks.
pub fn webhook_url(raw: &str) -> Result<String, String> {
    // A URL parser drops some control characters and percent-encodes others, so the URL
    // stored would not be the one given.
    if raw.chars().any(char::is_control) {
        return Err("must not contain control characters".to_owned());
    }
    let url = url::Url::parse(raw).map_err(|e| format!("not a valid URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err("must be an absolute http or https URL".to_owned());
    }
    if raw.len() > 2000 {
        return Err("must be at most 2000 characters".to_owned());
    }
    Ok(url.to_string())
}

/// A webhook URL as a non-admin sees it: scheme and host only, since the path and query of
/// many webhooks (Slack's, for one) are the secret that lets anyone post to them.
pub fn masked_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(url) => match url.host_str() {
            Some(host) => format!("{}://{host}/…", url.scheme()),
            None => "…".to_owned(),
        },
        Err(_) => "…".to_owned(),
    }
}

/// The URL without its password, in the user part or as a `password` parameter, for
/// messages.
pub fn redacted_url(url: &str) -> String {
    let Ok(mut parsed) = url::Url::parse(url) else {
        return "(an unparsable URL)".to_owned();
    };
    if parsed.password().is_some() {
        let _ = parsed.set_password(Some("***"));
    }
    let hides_password = parsed
        .query_pairs()
        .any(|(name, _)| name.eq_ignore_ascii_case("password"));
    if hides_password {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if name.eq_ignore_ascii_case("password") {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// `text` with every `http://` or `https://` URL in it masked as [`masked_url`] masks one: a
/// URL runs to the first whitespace, quote, parenthesis or angle bracket.
pub fn masked_urls_in(text: &str) -> String {
    // ASCII lowercasing keeps every byte where it was.
    let lower = text.to_ascii_lowercase();
    let mut masked = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(found) = ["http://", "https://"]
        .iter()
        .filter_map(|scheme| lower[from..].find(scheme))
        .min()
    {
        let start = from + found;
        masked.push_str(&text[from..start]);
        let end = text[start..]
            .find(|c: char| c.is_whitespace() || "\"'()<>".contains(c))
            .map_or(text.len(), |length| start + length);
        masked.push_str(&masked_url(&text[start..end]));
        from = end;
    }
    masked.push_str(&text[from..]);
    masked
}

pub fn truncate_for_message(raw: &str) -> String {
    raw.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_url_with_a_control_character_is_refused() {
        assert!(webhook_url("https://hooks.example.com/x?token=1").is_ok());
        for bad in [
            "https://hooks.example.com/x\u{0}y",
            "https://hooks.example.com/x\ty",
            "https://hooks.example.com/x\ny",
            "\u{1f}https://hooks.example.com/",
            "https://hooks.example.com/\u{7f}",
        ] {
            assert_eq!(
                webhook_url(bad),
                Err("must not contain control characters".to_owned()),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn urls_in_a_text_keep_their_scheme_and_host_only() {
        let text = "request failed: error sending request for url \
                    (https://hooks.example.com/services/T0/B1/secret?token=abc): closed; \
                    was HTTP://Old.Example:8443/x?k=v and \"http://h/p\" and http://";
        let masked = masked_urls_in(text);
        for secret in ["services", "secret", "token", "abc", "/x", "k=v", "/p"] {
            assert!(!masked.contains(secret), "{secret} in {masked}");
        }
        assert_eq!(
            masked,
            "request failed: error sending request for url (https://hooks.example.com/…): \
             closed; was http://old.example/… and \"http://h/…\" and …"
        );
        assert_eq!(masked_urls_in("no address here"), "no address here");
    }

    #[test]
    fn project_ids_are_lowercase_slugs() {
        assert!(ProjectId::parse("vision").is_ok());
        assert!(ProjectId::parse("team-7-nlp").is_ok());
        for bad in ["", "Vision", "-x", "x-", "a b", "a_b", &"a".repeat(64)] {
            assert!(ProjectId::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn currencies_are_iso_4217() {
        assert_eq!(Currency::parse("USD").unwrap().minor_unit_digits(), 2);
        assert_eq!(Currency::parse("JPY").unwrap().minor_unit_digits(), 0);
        assert!(Currency::parse("usd").is_err());
        assert!(Currency::parse("XYZ").is_err());
    }

    #[test]
    fn months_parse_and_step() {
        let november = Month::parse("2026-11").unwrap();
        assert_eq!(november.to_string(), "2026-11");
        assert_eq!(november.next().to_string(), "2026-12");
        assert_eq!(
            Month::parse("2026-12").unwrap().next().to_string(),
            "2027-01"
        );
        for bad in ["2026-13", "2026-1", "26-11", "2026/11", "2026-00"] {
            assert!(Month::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn thresholds_are_bounded_and_ascending() {
        assert_eq!(alert_thresholds(&[50, 80, 100]).unwrap(), vec![50, 80, 100]);
        assert!(alert_thresholds(&[]).is_err());
        assert!(alert_thresholds(&[0, 50]).is_err());
        assert!(alert_thresholds(&[50, 1001]).is_err());
        assert!(alert_thresholds(&[80, 50]).is_err());
        assert!(alert_thresholds(&[50, 50]).is_err());
    }

    #[test]
    fn a_masked_url_keeps_only_scheme_and_host() {
        assert_eq!(
            masked_url("https://hooks.slack.com/services/T000/B000/XXXX?x=1"),
            "https://hooks.slack.com/…"
        );
        assert_eq!(masked_url("http://127.0.0.1:9/hook"), "http://127.0.0.1/…");
        assert_eq!(masked_url("not a url"), "…");
    }

    #[test]
    fn only_currencies_with_a_minor_unit_keep_money() {
        for good in ["USD", "EUR", "JPY", "BHD", "XAF", "XOF", "CNY"] {
            assert!(Currency::parse(good).is_ok(), "{good}");
        }
        for bad in ["XXX", "XTS", "XAU", "XDR", "usd", "ABC"] {
            assert!(Currency::parse(bad).is_err(), "{bad}");
        }
    }
}
