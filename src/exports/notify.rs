//! Messages people read where they work: an alert or a closed month as a Slack message, a
//! Microsoft Teams Adaptive Card, a PagerDuty Events API v2 event, or an email.
//!
//! The ledger says what happened as a [`Notice`]; this module only renders it in each
//! platform's own format. Text that users choose (project, task and node names) reaches every
//! format escaped for it, and text longer than a platform accepts is cut, ending in "…", so
//! that the platform posts a shortened message rather than refusing the whole of it. A cut
//! never splits an escape such as `&amp;`.
//!
//! Formats follow the platforms' published documentation:
//!
//! - Slack: messages with blocks still need `text`, used for notifications
//!   (<https://api.slack.com/methods/chat.postMessage>); escaping `&`, `<` and `>`
//!   (<https://api.slack.com/reference/surfaces/formatting#escaping>); up to 50 blocks in a
//!   message (<https://docs.slack.dev/reference/block-kit/blocks>); header text at most 150
//!   characters (<https://docs.slack.dev/reference/block-kit/blocks/header-block>); section
//!   text at most 3000 characters, at most 10 fields of at most 2000 characters each
//!   (<https://docs.slack.dev/reference/block-kit/blocks/section-block>); button text at most
//!   75 characters and URL at most 3000
//!   (<https://docs.slack.dev/reference/block-kit/block-elements/button-element>); the
//!   message `text` is truncated past 40,000 characters
//!   (<https://api.slack.com/changelog/2018-04-truncating-really-long-messages>).
//! - Microsoft Teams, through a Workflows "When a Teams webhook request is received" trigger:
//!   a `message` whose attachments are Adaptive Cards
//!   (<https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/connectors-using>,
//!   "Send Adaptive Cards using an Incoming Webhook"), of at most 28 KB
//!   (<https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/add-incoming-webhook>);
//!   card elements of schema 1.4
//!   (<https://adaptivecards.io/explorer/>: TextBlock, FactSet, Action.OpenUrl).
//! - PagerDuty Events API v2: a `trigger` with `payload.summary` of at most 1024 characters,
//!   `source`, one of four severities, and a `dedup_key` of at most 255 characters
//!   (<https://developer.pagerduty.com/docs/events-api-v2/trigger-events/>;
//!   <https://raw.githubusercontent.com/PagerDuty/api-schema/main/reference/events-v2/openapiv3.json>).
//! - Email: every user text in the HTML body is written as text, escaping `&`, `<`, `>`, `"`
//!   and `'`
//!   (<https://cheatsheetseries.owasp.org/cheatsheets/Cross_Site_Scripting_Prevention_Cheat_Sheet.html>);
//!   the subject is one line, as a header field cannot hold a bare CR or LF
//!   (<https://www.rfc-editor.org/rfc/rfc5322#section-2.2>).

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use uuid::Uuid;

/// How urgent a notice is, in PagerDuty's four severities (which Slack and Teams show as a
/// colour or style, and email in its subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Error,
    Warning,
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// What happened, said once for every platform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// The alert's id (PagerDuty's `dedup_key`, so repeats collapse), or the id of the
    /// month-close message.
    pub id: Uuid,
    /// `actual`, `forecast`, `idle_gpu`, `zombie_capacity`, `retry_storm`,
    /// `efficiency_regression`, `month_closed`, or `test`.
    pub kind: String,
    /// The project it is about; `None` for a closed month, which covers every project.
    pub project: Option<String>,
    /// One line: what crossed, e.g. "vision spent 80% of its November budget".
    pub title: String,
    /// A sentence or two with the figures that matter.
    pub summary: String,
    /// Label and value pairs, in order: spend, budget, forecast, task, node, cost…
    pub facts: Vec<(String, String)>,
    /// The dashboard page to act on it, when the service knows its public URL.
    pub link: Option<String>,
    pub severity: Severity,
    pub at: DateTime<Utc>,
}

/// The label of the link to the dashboard, on every platform.
const LINK_TEXT: &str = "Open in taskledger";

/// Slack's limits (see the module documentation for their sources).
const SLACK_MAX_BLOCKS: usize = 50;
const SLACK_HEADER_TEXT: usize = 150;
const SLACK_TEXT: usize = 3000;
const SLACK_FIELDS_PER_SECTION: usize = 10;
const SLACK_FIELD_TEXT: usize = 2000;
const SLACK_BUTTON_URL: usize = 3000;

/// The longest `payload.summary` PagerDuty accepts.
const PAGERDUTY_SUMMARY: usize = 1024;

/// Teams refuses a webhook message over 28 KB, read here as 28,000 bytes. Within it, texts are
/// cut where a card would be hard to read anyway, so that more facts fit.
const TEAMS_MESSAGE_BYTES: usize = 28_000;
const TEAMS_TITLE_TEXT: usize = 150;
const TEAMS_SUMMARY_TEXT: usize = 3000;
const TEAMS_FACT_TEXT: usize = 500;

const ADAPTIVE_CARD_SCHEMA: &str = "http://adaptivecards.io/schemas/adaptive-card.json";
const ADAPTIVE_CARD_VERSION: &str = "1.4";
const ADAPTIVE_CARD_CONTENT_TYPE: &str = "application/vnd.microsoft.card.adaptive";

/// A Slack incoming-webhook message: the notice's title and summary as `text` for
/// notifications, and as blocks a header, the summary, the facts as fields (ten to a
/// section), a button to the dashboard when there is a link, and a context line with the
/// project, kind, severity and time.
pub fn slack(notice: &Notice) -> Value {
    let heading = heading(notice);
    let summary = notice.summary.trim();
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": fit(&heading, SLACK_HEADER_TEXT, verbatim)},
    })];
    if !summary.is_empty() {
        blocks.push(json!({
            "type": "section",
            "text": {"type": "mrkdwn", "text": fit(summary, SLACK_TEXT, slack_escape)},
        }));
    }
    // A URL cannot be shortened without breaking it: a link Slack would refuse gets no button.
    let button = notice
        .link
        .as_deref()
        .filter(|link| link.chars().count() <= SLACK_BUTTON_URL);
    let after_fields = 1 + usize::from(button.is_some());
    let sections = SLACK_MAX_BLOCKS - blocks.len() - after_fields;
    for fields in slack_fields(&notice.facts, sections).chunks(SLACK_FIELDS_PER_SECTION) {
        blocks.push(json!({"type": "section", "fields": fields}));
    }
    if let Some(url) = button {
        blocks.push(json!({
            "type": "actions",
            "elements": [{
                "type": "button",
                "action_id": "open_in_taskledger",
                "text": {"type": "plain_text", "text": LINK_TEXT},
                "url": url,
            }],
        }));
    }
    blocks.push(json!({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": fit(&footer(notice), SLACK_TEXT, slack_escape)}],
    }));
    let mut text = fit(&heading, SLACK_HEADER_TEXT, slack_escape);
    if !summary.is_empty() {
        text.push('\n');
        text.push_str(&fit(summary, SLACK_TEXT, slack_escape));
    }
    json!({"text": text, "blocks": blocks})
}

/// The facts as Slack fields, `*Label*` over the value, for at most `sections` sections:
/// when there are more facts than fit, the last field says how many were left out.
fn slack_fields(facts: &[(String, String)], sections: usize) -> Vec<Value> {
    let room = sections * SLACK_FIELDS_PER_SECTION;
    let field = |label: &str, value: &str| {
        let label = label.trim();
        // Slack refuses an empty text; a fact without a value shows a dash.
        let value = if value.trim().is_empty() {
            "—"
        } else {
            value
        };
        let text = if label.is_empty() {
            fit(value, SLACK_FIELD_TEXT, slack_escape)
        } else {
            // Half the room at most for the label, the rest for the value and the markup.
            let label = fit(label, SLACK_FIELD_TEXT / 2, slack_escape);
            let value_room = SLACK_FIELD_TEXT - label.chars().count() - "**\n".len();
            format!("*{label}*\n{}", fit(value, value_room, slack_escape))
        };
        json!({"type": "mrkdwn", "text": text})
    };
    if facts.len() <= room {
        return facts
            .iter()
            .map(|(label, value)| field(label, value))
            .collect();
    }
    let shown = room - 1;
    let mut fields: Vec<Value> = facts[..shown]
        .iter()
        .map(|(label, value)| field(label, value))
        .collect();
    fields.push(field("…", &format!("{} more", facts.len() - shown)));
    fields
}

/// A message for a Microsoft Teams Workflows webhook: one Adaptive Card (schema 1.4) with
/// the title, the summary, the facts as a fact set and a context line, and an
/// `Action.OpenUrl` to the dashboard when there is a link. The whole message stays within
/// Teams' 28 KB: facts that would pass it are left out, and the last fact says how many.
pub fn teams(notice: &Notice) -> Value {
    let colour = match notice.severity {
        Severity::Critical | Severity::Error => "Attention",
        Severity::Warning => "Warning",
        Severity::Info => "Default",
    };
    let summary = fit(notice.summary.trim(), TEAMS_SUMMARY_TEXT, verbatim);
    let facts: Vec<Value> = notice
        .facts
        .iter()
        .map(|(label, value)| {
            json!({
                "title": fit(label, TEAMS_FACT_TEXT, verbatim),
                "value": fit(value, TEAMS_FACT_TEXT, verbatim),
            })
        })
        .collect();
    let message = |facts: &[Value]| {
        let mut body = vec![json!({
            "type": "TextBlock",
            "text": fit(&heading(notice), TEAMS_TITLE_TEXT, verbatim),
            "weight": "Bolder",
            "size": "Medium",
            "color": colour,
            "wrap": true,
        })];
        if !summary.is_empty() {
            body.push(json!({"type": "TextBlock", "text": summary, "wrap": true}));
        }
        if !facts.is_empty() {
            body.push(json!({"type": "FactSet", "facts": facts}));
        }
        body.push(json!({
            "type": "TextBlock",
            "text": footer(notice),
            "size": "Small",
            "isSubtle": true,
            "wrap": true,
        }));
        let mut card = json!({
            "$schema": ADAPTIVE_CARD_SCHEMA,
            "type": "AdaptiveCard",
            "version": ADAPTIVE_CARD_VERSION,
            "body": body,
        });
        if let Some(link) = &notice.link {
            card["actions"] = json!([{"type": "Action.OpenUrl", "title": LINK_TEXT, "url": link}]);
        }
        json!({
            "type": "message",
            "attachments": [{
                "contentType": ADAPTIVE_CARD_CONTENT_TYPE,
                "contentUrl": null,
                "content": card,
            }],
        })
    };
    let whole = message(&facts);
    if whole.to_string().len() <= TEAMS_MESSAGE_BYTES {
        return whole;
    }
    // A fact adds its own JSON and a comma; the message around them is measured with the
    // fact that says how many were left out, the longest it can be.
    let more = |left_out: usize| json!({"title": "…", "value": format!("{left_out} more")});
    let mut size = message(&[more(facts.len())]).to_string().len();
    let mut kept = Vec::new();
    for fact in &facts {
        size += fact.to_string().len() + 1;
        if size > TEAMS_MESSAGE_BYTES {
            break;
        }
        kept.push(fact.clone());
    }
    kept.push(more(facts.len() - kept.len()));
    message(&kept)
}

/// A PagerDuty Events API v2 `trigger` for the integration of `routing_key`. The notice's id
/// is the `dedup_key`, so a notice sent twice is one alert; its title is the alert's summary;
/// its facts are the custom details.
pub fn pagerduty(notice: &Notice, routing_key: &str) -> Value {
    let project = notice.project.as_deref().filter(|p| !p.is_empty());
    let mut payload = json!({
        "summary": fit(&heading(notice), PAGERDUTY_SUMMARY, verbatim),
        "source": project.map_or_else(|| "taskledger".to_owned(), |p| format!("taskledger/{p}")),
        "severity": notice.severity.as_str(),
        "timestamp": notice.at.to_rfc3339_opts(SecondsFormat::Secs, true),
        "group": notice.kind,
        "class": notice.kind,
        "custom_details": custom_details(&notice.facts),
    });
    if let Some(project) = project {
        payload["component"] = json!(project);
    }
    let mut event = json!({
        "routing_key": routing_key,
        "event_action": "trigger",
        "dedup_key": notice.id.hyphenated().to_string(),
        "payload": payload,
        "client": "taskledger",
    });
    if let Some(link) = &notice.link {
        event["links"] = json!([{"href": link, "text": LINK_TEXT}]);
        event["client_url"] = json!(link);
    }
    event
}

/// The facts as one JSON object. A JSON object has no order and one value per key, so a
/// label seen again gets its rank: "Task", "Task (2)".
fn custom_details(facts: &[(String, String)]) -> Map<String, Value> {
    let mut details = Map::new();
    for (label, value) in facts {
        let mut key = label.clone();
        let mut rank = 1;
        while details.contains_key(&key) {
            rank += 1;
            key = format!("{label} ({rank})");
        }
        details.insert(key, json!(value));
    }
    details
}

/// An email: a one-line subject, a plain-text body and an HTML body with inline styles only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Email {
    /// `[taskledger] ` and the title, with the severity when it is above info.
    pub subject: String,
    /// The title, summary, facts as `Label: value` lines, the link, and the context line.
    pub text: String,
    /// The same as a small HTML document: the facts in a table, the link as an anchor.
    pub html: String,
}

/// The notice as an email.
pub fn email(notice: &Notice) -> Email {
    let heading = heading(notice);
    let summary = notice.summary.trim();
    let link = notice.link.as_deref();
    let severity = match notice.severity {
        Severity::Critical => "Critical: ",
        Severity::Error => "Error: ",
        Severity::Warning => "Warning: ",
        Severity::Info => "",
    };
    let subject = format!("[taskledger] {severity}{heading}");

    let mut text = format!("{heading}\n\n");
    if !summary.is_empty() {
        text.push_str(summary);
        text.push_str("\n\n");
    }
    for (label, value) in &notice.facts {
        text.push_str(&format!("{label}: {value}\n"));
    }
    if !notice.facts.is_empty() {
        text.push('\n');
    }
    if let Some(link) = link {
        text.push_str(&format!("{LINK_TEXT}: {link}\n\n"));
    }
    text.push_str(&footer(notice));
    text.push('\n');

    let mut html = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>{}</title></head>\n\
         <body style=\"font-family: Arial, Helvetica, sans-serif; color: #1f2328;\">\n\
         <h1 style=\"font-size: 18px;\">{}</h1>\n",
        html_text(&heading),
        html_text(&heading),
    );
    if !summary.is_empty() {
        html.push_str(&format!("<p>{}</p>\n", html_text(summary)));
    }
    if !notice.facts.is_empty() {
        html.push_str("<table style=\"border-collapse: collapse;\">\n");
        for (label, value) in &notice.facts {
            html.push_str(&format!(
                "<tr><th scope=\"row\" style=\"text-align: left; padding: 4px 12px 4px 0;\">{}</th>\
                 <td style=\"padding: 4px 0;\">{}</td></tr>\n",
                html_text(label),
                html_text(value),
            ));
        }
        html.push_str("</table>\n");
    }
    if let Some(link) = link {
        // Only a web address becomes an anchor: a `javascript:` or `data:` one stays text.
        if is_web_address(link) {
            html.push_str(&format!(
                "<p><a href=\"{}\">{LINK_TEXT}</a></p>\n",
                html_text(link)
            ));
        } else {
            html.push_str(&format!("<p>{LINK_TEXT}: {}</p>\n", html_text(link)));
        }
    }
    html.push_str(&format!(
        "<p style=\"color: #656d76; font-size: 12px;\">{}</p>\n</body>\n</html>\n",
        html_text(&footer(notice))
    ));
    Email {
        subject,
        text,
        html,
    }
}

fn is_web_address(link: &str) -> bool {
    let lower = link.trim_start().to_ascii_lowercase();
    lower.starts_with("https://") || lower.starts_with("http://")
}

/// The title on one line, or the kind when the title is blank: every platform needs one.
fn heading(notice: &Notice) -> String {
    let title = one_line(&notice.title);
    if title.is_empty() {
        format!("taskledger {}", one_line(&notice.kind))
    } else {
        title
    }
}

/// What the notice is about, in small print: project, kind, severity and time.
fn footer(notice: &Notice) -> String {
    let mut parts = Vec::with_capacity(4);
    if let Some(project) = notice.project.as_deref().filter(|p| !p.is_empty()) {
        parts.push(one_line(project));
    }
    parts.push(one_line(&notice.kind));
    parts.push(notice.severity.as_str().to_owned());
    parts.push(notice.at.format("%Y-%m-%d %H:%M UTC").to_string());
    parts.join(" · ")
}

/// `text` with line breaks and other control characters turned into single spaces.
fn one_line(text: &str) -> String {
    text.split(|c: char| c.is_control() || c.is_whitespace())
        .filter(|word| !word.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a format writes a character, when not as itself.
type Escape = fn(char) -> Option<&'static str>;

fn verbatim(_: char) -> Option<&'static str> {
    None
}

/// Slack's control characters in text objects.
fn slack_escape(c: char) -> Option<&'static str> {
    match c {
        '&' => Some("&amp;"),
        '<' => Some("&lt;"),
        '>' => Some("&gt;"),
        _ => None,
    }
}

/// The characters that end text or an attribute value in HTML.
fn html_escape(c: char) -> Option<&'static str> {
    match c {
        '&' => Some("&amp;"),
        '<' => Some("&lt;"),
        '>' => Some("&gt;"),
        '"' => Some("&quot;"),
        '\'' => Some("&#x27;"),
        _ => None,
    }
}

fn html_text(text: &str) -> String {
    fit(text, usize::MAX, html_escape)
}

/// `text` written through `escape` in at most `max` characters: when it is longer, as many
/// whole characters as fit before a final "…". The cut is made before escaping, so that it
/// never splits an escape.
fn fit(text: &str, max: usize, escape: Escape) -> String {
    let width = |c: char| escape(c).map_or(1, |escaped| escaped.chars().count());
    let whole: usize = text.chars().map(width).sum();
    let room = if whole <= max {
        whole
    } else {
        max.saturating_sub(1)
    };
    let mut out = String::with_capacity(text.len().min(room.saturating_mul(4)));
    let mut used = 0;
    for c in text.chars() {
        let w = width(c);
        if used + w > room {
            break;
        }
        used += w;
        match escape(c) {
            Some(escaped) => out.push_str(escaped),
            None => out.push(c),
        }
    }
    if whole > max {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    const ROUTING_KEY: &str = "0123456789abcdef0123456789abcdef";

    fn budget() -> Notice {
        Notice {
            id: Uuid::from_u128(0x5eed),
            kind: "actual".to_owned(),
            project: Some("vision".to_owned()),
            title: "vision spent 80% of its November budget".to_owned(),
            summary: "8,000.00 USD of 10,000.00 USD by 20 November.".to_owned(),
            facts: vec![
                ("Spend".to_owned(), "8,000.00 USD".to_owned()),
                ("Budget".to_owned(), "10,000.00 USD".to_owned()),
                ("Forecast".to_owned(), "11,900.00 USD".to_owned()),
            ],
            link: Some("https://ledger.example.com/projects/vision".to_owned()),
            severity: Severity::Warning,
            at: Utc.with_ymd_and_hms(2026, 11, 20, 14, 5, 0).unwrap(),
        }
    }

    fn hostile() -> Notice {
        Notice {
            project: Some("<b>&co".to_owned()),
            title: "<b>&co spent 80%".to_owned(),
            summary: "<!channel> <b>&co is at \"80%\" & 'rising'".to_owned(),
            facts: vec![("Project".to_owned(), "<b>&co".to_owned())],
            ..budget()
        }
    }

    fn unlinked() -> Notice {
        Notice {
            link: None,
            ..budget()
        }
    }

    fn facts(n: usize) -> Vec<(String, String)> {
        (1..=n)
            .map(|i| (format!("Fact {i}"), format!("value {i}")))
            .collect()
    }

    fn blocks(message: &Value) -> &Vec<Value> {
        message["blocks"].as_array().unwrap()
    }

    fn of_type<'a>(message: &'a Value, kind: &str) -> Vec<&'a Value> {
        blocks(message)
            .iter()
            .filter(|b| b["type"] == kind)
            .collect()
    }

    fn field_texts(message: &Value) -> Vec<String> {
        of_type(message, "section")
            .iter()
            .filter_map(|s| s["fields"].as_array())
            .flatten()
            .map(|f| f["text"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Every mrkdwn text of a Slack message, and its fallback text.
    fn slack_texts(message: &Value) -> Vec<String> {
        let mut texts = vec![message["text"].as_str().unwrap().to_owned()];
        for block in blocks(message) {
            if block["text"]["type"] == "mrkdwn" {
                texts.push(block["text"]["text"].as_str().unwrap().to_owned());
            }
            for list in ["fields", "elements"] {
                for item in block[list].as_array().into_iter().flatten() {
                    if item["type"] == "mrkdwn" {
                        texts.push(item["text"].as_str().unwrap().to_owned());
                    }
                }
            }
        }
        texts
    }

    fn chars(value: &Value) -> usize {
        value.as_str().unwrap().chars().count()
    }

    #[test]
    fn slack_has_fallback_text_header_summary_fields_button_and_context() {
        let message = slack(&budget());
        assert_eq!(
            message["text"],
            "vision spent 80% of its November budget\n8,000.00 USD of 10,000.00 USD by 20 November."
        );
        let kinds: Vec<&str> = blocks(&message)
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(
            kinds,
            ["header", "section", "section", "actions", "context"]
        );
        let header = &blocks(&message)[0]["text"];
        assert_eq!(header["type"], "plain_text");
        assert_eq!(header["text"], "vision spent 80% of its November budget");
        assert_eq!(blocks(&message)[1]["text"]["type"], "mrkdwn");
        assert_eq!(
            field_texts(&message),
            [
                "*Spend*\n8,000.00 USD",
                "*Budget*\n10,000.00 USD",
                "*Forecast*\n11,900.00 USD"
            ]
        );
        let button = &of_type(&message, "actions")[0]["elements"][0];
        assert_eq!(button["type"], "button");
        assert_eq!(button["url"], "https://ledger.example.com/projects/vision");
        assert_eq!(button["text"]["text"], "Open in taskledger");
        assert_eq!(
            of_type(&message, "context")[0]["elements"][0]["text"],
            "vision · actual · warning · 2026-11-20 14:05 UTC"
        );
    }

    #[test]
    fn slack_escapes_its_control_characters_in_user_text() {
        let message = slack(&hostile());
        let texts = slack_texts(&message);
        for text in &texts {
            assert!(!text.contains('<') && !text.contains('>'), "{text}");
            assert!(
                !text
                    .replace("&amp;", "")
                    .replace("&lt;", "")
                    .replace("&gt;", "")
                    .contains('&'),
                "a bare & in {text}"
            );
        }
        assert!(texts.iter().any(|t| t.contains("&lt;b&gt;&amp;co")));
        assert!(texts.iter().any(|t| t.contains("&lt;!channel&gt;")));
        assert_eq!(field_texts(&message), ["*Project*\n&lt;b&gt;&amp;co"]);
        // A header is plain text, which Slack shows as written.
        assert_eq!(blocks(&message)[0]["text"]["text"], "<b>&co spent 80%");
    }

    #[test]
    fn slack_texts_are_cut_at_slack_limits_without_splitting_an_escape() {
        let notice = Notice {
            title: "t".repeat(400),
            summary: "&".repeat(2000),
            facts: vec![("Task".to_owned(), "<".repeat(1000))],
            ..budget()
        };
        let message = slack(&notice);
        let header = &blocks(&message)[0]["text"]["text"];
        assert_eq!(chars(header), 150);
        assert!(header.as_str().unwrap().ends_with("t…"));
        let summary = blocks(&message)[1]["text"]["text"].as_str().unwrap();
        assert!(summary.chars().count() <= 3000);
        assert!(
            summary.ends_with("&amp;…"),
            "{}",
            &summary[summary.len() - 20..]
        );
        assert_eq!(summary.matches("&amp;").count(), 2999 / 5);
        let field = &field_texts(&message)[0];
        assert!(field.chars().count() <= 2000);
        assert!(field.ends_with("&lt;…"));
        assert!(chars(&message["text"]) <= 150 + 1 + 3000);
    }

    #[test]
    fn slack_splits_facts_into_sections_of_ten_in_their_order() {
        let notice = Notice {
            facts: facts(25),
            ..budget()
        };
        let message = slack(&notice);
        let sections: Vec<usize> = of_type(&message, "section")
            .iter()
            .filter_map(|s| s["fields"].as_array().map(Vec::len))
            .collect();
        assert_eq!(sections, [10, 10, 5]);
        let expected: Vec<String> = (1..=25).map(|i| format!("*Fact {i}*\nvalue {i}")).collect();
        assert_eq!(field_texts(&message), expected);
    }

    #[test]
    fn slack_keeps_to_fifty_blocks_and_says_how_many_facts_were_left_out() {
        let notice = Notice {
            facts: facts(1000),
            ..budget()
        };
        let message = slack(&notice);
        assert_eq!(blocks(&message).len(), 50);
        let fields = field_texts(&message);
        assert_eq!(fields.len(), 46 * 10);
        assert_eq!(fields[458], "*Fact 459*\nvalue 459");
        assert_eq!(fields[459], "*…*\n541 more");
        assert_eq!(blocks(&message)[49]["type"], "context");
    }

    #[test]
    fn a_slack_field_is_never_empty() {
        let notice = Notice {
            facts: vec![
                (String::new(), " ".to_owned()),
                ("Node".to_owned(), String::new()),
            ],
            ..budget()
        };
        assert_eq!(field_texts(&slack(&notice)), ["—", "*Node*\n—"]);
    }

    #[test]
    fn slack_without_a_link_has_no_button() {
        let message = slack(&unlinked());
        assert!(of_type(&message, "actions").is_empty());
        assert!(!message.to_string().contains("button"));
    }

    #[test]
    fn slack_leaves_out_a_button_whose_url_slack_would_refuse() {
        let notice = Notice {
            link: Some(format!("https://ledger.example.com/{}", "a".repeat(3000))),
            ..budget()
        };
        assert!(of_type(&slack(&notice), "actions").is_empty());
    }

    #[test]
    fn a_blank_title_still_gives_slack_a_header() {
        let notice = Notice {
            title: " \n ".to_owned(),
            summary: String::new(),
            ..budget()
        };
        let message = slack(&notice);
        assert_eq!(blocks(&message)[0]["text"]["text"], "taskledger actual");
        assert_eq!(message["text"], "taskledger actual");
        assert_eq!(
            of_type(&message, "section").len(),
            1,
            "no empty summary section"
        );
    }

    #[test]
    fn teams_gets_one_adaptive_card_in_a_message() {
        let message = teams(&budget());
        assert_eq!(message["type"], "message");
        let attachments = message["attachments"].as_array().unwrap();
        assert_eq!(attachments.len(), 1);
        assert_eq!(
            attachments[0]["contentType"],
            "application/vnd.microsoft.card.adaptive"
        );
        assert!(attachments[0]["contentUrl"].is_null());
        let card = &attachments[0]["content"];
        assert_eq!(
            card["$schema"],
            "http://adaptivecards.io/schemas/adaptive-card.json"
        );
        assert_eq!(card["type"], "AdaptiveCard");
        assert_eq!(card["version"], "1.4");
        let body = card["body"].as_array().unwrap();
        assert_eq!(body[0]["type"], "TextBlock");
        assert_eq!(body[0]["text"], "vision spent 80% of its November budget");
        assert_eq!(body[0]["weight"], "Bolder");
        assert_eq!(body[0]["size"], "Medium");
        assert_eq!(body[0]["wrap"], true);
        assert_eq!(body[0]["color"], "Warning");
        assert_eq!(
            body[1]["text"],
            "8,000.00 USD of 10,000.00 USD by 20 November."
        );
        assert_eq!(body[1]["wrap"], true);
        assert_eq!(body[2]["type"], "FactSet");
        assert_eq!(
            body[2]["facts"],
            json!([
                {"title": "Spend", "value": "8,000.00 USD"},
                {"title": "Budget", "value": "10,000.00 USD"},
                {"title": "Forecast", "value": "11,900.00 USD"},
            ])
        );
        assert_eq!(
            card["actions"],
            json!([{
                "type": "Action.OpenUrl",
                "title": "Open in taskledger",
                "url": "https://ledger.example.com/projects/vision",
            }])
        );
    }

    #[test]
    fn teams_uses_only_adaptive_card_1_4_elements() {
        let known = ["TextBlock", "FactSet"];
        for notice in [budget(), unlinked(), hostile()] {
            let card = &teams(&notice)["attachments"][0]["content"];
            for element in card["body"].as_array().unwrap() {
                assert!(known.contains(&element["type"].as_str().unwrap()));
            }
        }
    }

    #[test]
    fn teams_keeps_within_28_kb_leaving_out_the_last_facts() {
        let notice = Notice {
            summary: "s".repeat(10_000),
            facts: (1..=200)
                .map(|i| (format!("Fact {i}"), "v".repeat(1000)))
                .collect(),
            ..budget()
        };
        let message = teams(&notice);
        assert!(message.to_string().len() <= 28_000);
        let card = &message["attachments"][0]["content"];
        let summary = card["body"][1]["text"].as_str().unwrap();
        assert_eq!(summary.chars().count(), 3000);
        let facts = card["body"][2]["facts"].as_array().unwrap();
        let (more, shown) = facts.split_last().unwrap();
        assert!(shown.len() > 10);
        for (i, fact) in shown.iter().enumerate() {
            assert_eq!(fact["title"], format!("Fact {}", i + 1));
            assert_eq!(fact["value"].as_str().unwrap().chars().count(), 500);
        }
        assert_eq!(more["title"], "…");
        assert_eq!(more["value"], format!("{} more", 200 - shown.len()));
    }

    #[test]
    fn teams_without_a_link_has_no_action() {
        let card = &teams(&unlinked())["attachments"][0]["content"];
        assert!(card.get("actions").is_none());
    }

    #[test]
    fn pagerduty_triggers_an_alert_keyed_by_the_notice_id() {
        let notice = budget();
        let event = pagerduty(&notice, ROUTING_KEY);
        assert_eq!(event["routing_key"], ROUTING_KEY);
        assert_eq!(event["event_action"], "trigger");
        assert_eq!(event["dedup_key"], "00000000-0000-0000-0000-000000005eed");
        assert_eq!(event["dedup_key"], notice.id.to_string());
        let payload = &event["payload"];
        assert_eq!(
            payload["summary"],
            "vision spent 80% of its November budget"
        );
        assert_eq!(payload["source"], "taskledger/vision");
        assert_eq!(payload["severity"], "warning");
        assert_eq!(payload["timestamp"], "2026-11-20T14:05:00Z");
        let at = DateTime::parse_from_rfc3339(payload["timestamp"].as_str().unwrap()).unwrap();
        assert_eq!(at, notice.at);
        assert_eq!(payload["component"], "vision");
        assert_eq!(payload["group"], "actual");
        assert_eq!(payload["class"], "actual");
        assert_eq!(
            payload["custom_details"],
            json!({"Spend": "8,000.00 USD", "Budget": "10,000.00 USD", "Forecast": "11,900.00 USD"})
        );
        assert_eq!(
            event["links"],
            json!([{"href": "https://ledger.example.com/projects/vision", "text": "Open in taskledger"}])
        );
        assert_eq!(event["client"], "taskledger");
        assert_eq!(
            event["client_url"],
            "https://ledger.example.com/projects/vision"
        );
    }

    #[test]
    fn pagerduty_severities_are_the_four_it_knows() {
        for (severity, name) in [
            (Severity::Critical, "critical"),
            (Severity::Error, "error"),
            (Severity::Warning, "warning"),
            (Severity::Info, "info"),
        ] {
            let notice = Notice {
                severity,
                ..budget()
            };
            assert_eq!(pagerduty(&notice, ROUTING_KEY)["payload"]["severity"], name);
        }
    }

    #[test]
    fn pagerduty_cuts_the_summary_at_1024_characters() {
        let notice = Notice {
            title: "é".repeat(2000),
            ..budget()
        };
        let summary = &pagerduty(&notice, ROUTING_KEY)["payload"]["summary"];
        assert_eq!(chars(summary), 1024);
        assert!(summary.as_str().unwrap().ends_with("é…"));
    }

    #[test]
    fn pagerduty_without_a_link_or_project_has_no_links_and_no_component() {
        let notice = Notice {
            kind: "month_closed".to_owned(),
            project: None,
            link: None,
            severity: Severity::Info,
            ..budget()
        };
        let event = pagerduty(&notice, ROUTING_KEY);
        assert!(event.get("links").is_none());
        assert!(event.get("client_url").is_none());
        assert_eq!(event["payload"]["source"], "taskledger");
        assert!(event["payload"].get("component").is_none());
    }

    #[test]
    fn pagerduty_keeps_every_fact_when_labels_repeat() {
        let notice = Notice {
            facts: vec![
                ("Task".to_owned(), "a".to_owned()),
                ("Task".to_owned(), "b".to_owned()),
            ],
            ..budget()
        };
        assert_eq!(
            pagerduty(&notice, ROUTING_KEY)["payload"]["custom_details"],
            json!({"Task": "a", "Task (2)": "b"})
        );
    }

    #[test]
    fn an_email_subject_is_one_line() {
        let notice = Notice {
            title: "vision\r\nBcc: someone@example.com\nspent 80%".to_owned(),
            ..budget()
        };
        let email = email(&notice);
        assert_eq!(
            email.subject,
            "[taskledger] Warning: vision Bcc: someone@example.com spent 80%"
        );
        assert!(!email.subject.contains(['\r', '\n']));
        let info = Notice {
            severity: Severity::Info,
            ..budget()
        };
        assert_eq!(
            super::email(&info).subject,
            "[taskledger] vision spent 80% of its November budget"
        );
    }

    #[test]
    fn an_email_text_lists_summary_facts_in_order_and_link() {
        let email = email(&budget());
        assert_eq!(
            email.text,
            "vision spent 80% of its November budget\n\n\
             8,000.00 USD of 10,000.00 USD by 20 November.\n\n\
             Spend: 8,000.00 USD\nBudget: 10,000.00 USD\nForecast: 11,900.00 USD\n\n\
             Open in taskledger: https://ledger.example.com/projects/vision\n\n\
             vision · actual · warning · 2026-11-20 14:05 UTC\n"
        );
    }

    #[test]
    fn an_email_html_escapes_user_text_and_tables_the_facts_in_order() {
        let email = email(&hostile());
        let html = &email.html;
        assert!(!html.contains("<b>"), "{html}");
        assert!(html.contains("&lt;b&gt;&amp;co spent 80%"));
        assert!(html.contains("&quot;80%&quot; &amp; &#x27;rising&#x27;"));
        assert!(html.contains(
            "<tr><th scope=\"row\" style=\"text-align: left; padding: 4px 12px 4px 0;\">Project</th>\
             <td style=\"padding: 4px 0;\">&lt;b&gt;&amp;co</td></tr>"
        ));
        assert!(html.contains("<a href=\"https://ledger.example.com/projects/vision\">"));
        assert!(!html.contains("http-equiv") && !html.contains("<link") && !html.contains("<img"));

        let ordered = super::email(&Notice {
            facts: facts(12),
            ..budget()
        })
        .html;
        let positions: Vec<usize> = (1..=12)
            .map(|i| ordered.find(&format!(">Fact {i}<")).unwrap())
            .collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn an_email_without_a_link_has_no_anchor() {
        let email = email(&unlinked());
        assert!(!email.html.contains("<a "));
        assert!(!email.text.contains("Open in taskledger"));
    }

    #[test]
    fn an_email_link_that_is_not_a_web_address_is_not_an_anchor() {
        let notice = Notice {
            link: Some("javascript:alert(1)".to_owned()),
            ..budget()
        };
        let html = email(&notice).html;
        assert!(!html.contains("<a "));
        assert!(html.contains("Open in taskledger: javascript:alert(1)"));
    }

    #[test]
    fn fit_counts_escaped_characters() {
        assert_eq!(fit("a<b", 9, slack_escape), "a&lt;b");
        assert_eq!(fit("a<b", 6, slack_escape), "a&lt;b");
        assert_eq!(fit("a<b", 5, slack_escape), "a…");
        assert_eq!(fit("abc", 3, verbatim), "abc");
        assert_eq!(fit("abcd", 3, verbatim), "ab…");
    }
}
