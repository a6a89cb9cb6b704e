//! Notification channels as given to the API: a kind, where it delivers, and which projects
//! and alert kinds it receives, each field checked and every bad one named.

use super::validation::Violations;
use super::values::{self, ProjectId};

/// The platforms a channel delivers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChannelKind {
    Slack,
    Teams,
    Email,
    PagerDuty,
    Webhook,
}

impl ChannelKind {
    pub const ALL: [ChannelKind; 5] = [
        ChannelKind::Slack,
        ChannelKind::Teams,
        ChannelKind::Email,
        ChannelKind::PagerDuty,
        ChannelKind::Webhook,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Slack => "slack",
            ChannelKind::Teams => "teams",
            ChannelKind::Email => "email",
            ChannelKind::PagerDuty => "pagerduty",
            ChannelKind::Webhook => "webhook",
        }
    }

    pub fn parse(raw: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == raw)
            .ok_or_else(|| {
                format!(
                    "`{}` is not one of slack, teams, email, pagerduty, webhook",
                    values::truncate_for_message(raw)
                )
            })
    }
}

impl TryFrom<String> for ChannelKind {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Self::parse(&raw)
    }
}

/// What a channel may subscribe to: every alert kind, and the close of a month.
pub const MESSAGE_KINDS: [&str; 7] = [
    "actual",
    "forecast",
    "idle_gpu",
    "zombie_capacity",
    "retry_storm",
    "efficiency_regression",
    "month_closed",
];

/// PagerDuty's Events API v2 endpoint, where a `pagerduty` channel without a target sends.
pub const PAGERDUTY_EVENTS_URL: &str = "https://events.pagerduty.com/v2/enqueue";

/// The most addresses one email channel sends to.
pub const MAX_ADDRESSES: usize = 50;

/// The longest channel name, in characters.
const MAX_NAME: usize = 200;

/// A channel to create, as given.
#[derive(Debug, Clone, Copy)]
pub struct ChannelFields<'a> {
    pub name: &'a str,
    pub kind: &'a str,
    /// The incoming-webhook URL, or the email addresses; PagerDuty's events URL by default.
    pub target: Option<&'a str>,
    pub routing_key: Option<&'a str>,
    pub projects: Option<&'a [String]>,
    pub alert_kinds: Option<&'a [String]>,
}

/// A channel ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChannel {
    pub name: String,
    pub kind: ChannelKind,
    pub target: String,
    pub routing_key: Option<String>,
    pub projects: Option<Vec<String>>,
    pub alert_kinds: Option<Vec<String>>,
}

impl ChannelFields<'_> {
    /// The channel to store, or every field that is wrong.
    pub fn parse(&self) -> Result<NewChannel, Violations> {
        let mut v = Violations::default();
        let name = v.check("/name", values::bounded_text(self.name, MAX_NAME));
        let kind = v.check("/kind", ChannelKind::parse(self.kind));
        let target = match (kind, self.target) {
            (Some(ChannelKind::Email), Some(raw)) => v.check("/target", addresses(raw)),
            (Some(ChannelKind::PagerDuty), None) => Some(PAGERDUTY_EVENTS_URL.to_owned()),
            (Some(_), Some(raw)) => v.check("/target", values::webhook_url(raw)),
            (Some(kind), None) => {
                v.push(
                    "/target",
                    match kind {
                        ChannelKind::Email => "the email addresses to send to are required",
                        _ => "the incoming-webhook URL is required",
                    },
                );
                None
            }
            (None, _) => None,
        };
        let routing_key = match (kind, self.routing_key) {
            (Some(ChannelKind::PagerDuty), Some(key)) => v.check("/routing_key", routing_key(key)),
            (Some(ChannelKind::PagerDuty), None) => {
                v.push(
                    "/routing_key",
                    "a PagerDuty channel needs the integration key of an Events API v2 service",
                );
                None
            }
            (Some(_), Some(_)) => {
                v.push(
                    "/routing_key",
                    "only a pagerduty channel takes a routing key",
                );
                None
            }
            _ => None,
        };
        let projects = self.projects.map(|list| {
            let mut ids = Vec::new();
            if list.is_empty() {
                v.push(
                    "/projects",
                    "name at least one project, or leave it out for every project",
                );
            }
            for (i, raw) in list.iter().enumerate() {
                if let Some(id) = v.check(&format!("/projects/{i}"), ProjectId::parse(raw)) {
                    ids.push(id.as_str().to_owned());
                }
            }
            ids.sort();
            ids.dedup();
            ids
        });
        let alert_kinds = self.alert_kinds.map(|list| {
            if list.is_empty() {
                v.push(
                    "/alert_kinds",
                    "name at least one kind, or leave it out for every kind",
                );
            }
            let mut kinds = Vec::new();
            for (i, raw) in list.iter().enumerate() {
                if MESSAGE_KINDS.contains(&raw.as_str()) {
                    kinds.push(raw.clone());
                } else {
                    v.push(
                        format!("/alert_kinds/{i}"),
                        format!(
                            "`{}` is not one of {}",
                            values::truncate_for_message(raw),
                            MESSAGE_KINDS.join(", ")
                        ),
                    );
                }
            }
            kinds.sort();
            kinds.dedup();
            kinds
        });
        v.into_result()?;
        let (Some(name), Some(kind), Some(target)) = (name, kind, target) else {
            unreachable!("every required field either parsed or was reported")
        };
        Ok(NewChannel {
            name,
            kind,
            target,
            routing_key,
            projects,
            alert_kinds,
        })
    }
}

/// Whether a channel with these subscriptions receives a message of `kind` about `project`
/// (`None`: a message about every project, such as a closed month).
pub fn subscribes(
    projects: Option<&[String]>,
    alert_kinds: Option<&[String]>,
    project: Option<&str>,
    kind: &str,
) -> bool {
    let project_matches = match (projects, project) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(list), Some(project)) => list.iter().any(|p| p == project),
    };
    let kind_matches = alert_kinds.is_none_or(|kinds| kinds.iter().any(|k| k == kind));
    project_matches && kind_matches
}

/// A comma-separated list of email addresses, each `local@domain`, at most
/// [`MAX_ADDRESSES`]; stored as given, trimmed and joined by `, `.
pub fn addresses(raw: &str) -> Result<String, String> {
    let list: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if list.is_empty() {
        return Err("name at least one email address".to_owned());
    }
    if list.len() > MAX_ADDRESSES {
        return Err(format!("at most {MAX_ADDRESSES} addresses"));
    }
    for address in &list {
        address_ok(address).map_err(|why| {
            format!(
                "`{}` is not an email address: {why}",
                values::truncate_for_message(address)
            )
        })?;
    }
    Ok(list.join(", "))
}

/// The addresses of a stored email target.
pub fn address_list(target: &str) -> Vec<String> {
    target
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_owned)
        .collect()
}

/// An addr-spec as mail servers take it: a local part and a domain of dot-separated labels,
/// no spaces, quotes, angle brackets or control characters (RFC 5321 §4.1.2, without the
/// quoted forms nobody sends alerts to).
fn address_ok(address: &str) -> Result<(), &'static str> {
    if address.len() > 254 {
        return Err("longer than 254 characters");
    }
    let (local, domain) = address.rsplit_once('@').ok_or("no @")?;
    if local.is_empty() || local.len() > 64 {
        return Err("the part before @ must have 1 to 64 characters");
    }
    let atext = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-/=?^_`{|}~.".contains(c);
    if !local.chars().all(atext)
        || local.starts_with('.')
        || local.ends_with('.')
        || local.contains("..")
    {
        return Err("the part before @ has a character mail does not take there");
    }
    let labels: Vec<&str> = domain.split('.').collect();
    let label_ok = |l: &&str| {
        !l.is_empty()
            && l.len() <= 63
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if domain.is_empty() || !labels.iter().all(label_ok) {
        return Err("the domain is not a host name");
    }
    Ok(())
}

/// A PagerDuty integration key: 32 letters and digits as PagerDuty issues them; any other
/// non-blank key of up to 64 visible characters is taken too, and PagerDuty judges it.
fn routing_key(raw: &str) -> Result<String, String> {
    let key = raw.trim();
    if key.is_empty() || key.len() > 64 || !key.chars().all(|c| c.is_ascii_graphic()) {
        return Err(
            "must be the 32-character integration key of an Events API v2 service".to_owned(),
        );
    }
    Ok(key.to_owned())
}

/// A target as a reader who is not an admin sees it: a URL's scheme and host, an address's
/// domain.
pub fn masked_target(kind: ChannelKind, target: &str) -> String {
    match kind {
        ChannelKind::Email => address_list(target)
            .iter()
            .map(|address| match address.rsplit_once('@') {
                Some((_, domain)) => format!("…@{domain}"),
                None => "…".to_owned(),
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => values::masked_url(target),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slack() -> ChannelFields<'static> {
        ChannelFields {
            name: "ML on-call",
            kind: "slack",
            target: Some("https://hooks.slack.com/services/T000/B000/XXXX"),
            routing_key: None,
            projects: None,
            alert_kinds: None,
        }
    }

    #[test]
    fn a_slack_channel_takes_its_webhook() {
        let channel = slack().parse().unwrap();
        assert_eq!(channel.kind, ChannelKind::Slack);
        assert_eq!(channel.projects, None);
    }

    #[test]
    fn pagerduty_needs_a_key_and_defaults_its_url() {
        let pd = ChannelFields {
            kind: "pagerduty",
            target: None,
            routing_key: Some("R0UTINGKEY0123456789abcdefABCDEF"),
            ..slack()
        };
        let channel = pd.parse().unwrap();
        assert_eq!(channel.target, PAGERDUTY_EVENTS_URL);
        let keyless = ChannelFields {
            routing_key: None,
            ..pd
        };
        let pointers: Vec<String> = keyless
            .parse()
            .unwrap_err()
            .into_vec()
            .into_iter()
            .map(|e| e.pointer)
            .collect();
        assert_eq!(pointers, ["/routing_key"]);
    }

    #[test]
    fn every_bad_field_is_named() {
        let projects = ["Vision!".to_owned()];
        let kinds = ["weekly".to_owned()];
        let bad = ChannelFields {
            name: "",
            kind: "email",
            target: Some("finance@example.com, not an address"),
            routing_key: Some("x"),
            projects: Some(&projects),
            alert_kinds: Some(&kinds),
        };
        let pointers: Vec<String> = bad
            .parse()
            .unwrap_err()
            .into_vec()
            .into_iter()
            .map(|e| e.pointer)
            .collect();
        assert_eq!(
            pointers,
            [
                "/name",
                "/target",
                "/routing_key",
                "/projects/0",
                "/alert_kinds/0"
            ]
        );
    }

    #[test]
    fn addresses_are_checked_one_by_one() {
        assert_eq!(
            addresses(" finance@example.com ,ops+gpu@corp.example ").unwrap(),
            "finance@example.com, ops+gpu@corp.example"
        );
        for bad in [
            "", "a@", "@b.c", "a b@c.d", "a@-b.c", "<a@b.c>", "a..b@c.d", "a@b..c",
        ] {
            assert!(addresses(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn subscriptions_narrow_by_project_and_kind() {
        let vision = ["vision".to_owned()];
        let budget = ["actual".to_owned(), "month_closed".to_owned()];
        assert!(subscribes(None, None, Some("nlp"), "idle_gpu"));
        assert!(subscribes(Some(&vision), None, Some("vision"), "idle_gpu"));
        assert!(!subscribes(Some(&vision), None, Some("nlp"), "idle_gpu"));
        assert!(!subscribes(Some(&vision), None, None, "month_closed"));
        assert!(subscribes(None, Some(&budget), None, "month_closed"));
        assert!(!subscribes(None, Some(&budget), Some("vision"), "forecast"));
    }

    #[test]
    fn readers_see_no_secret() {
        assert_eq!(
            masked_target(ChannelKind::Email, "finance@example.com, a@corp.example"),
            "…@example.com, …@corp.example"
        );
        let masked = masked_target(
            ChannelKind::Slack,
            "https://hooks.slack.com/services/T000/B000/XXXX",
        );
        assert!(!masked.contains("XXXX"), "{masked}");
    }
}
