//! Stand-ins for the services taskledger notifies, served on 127.0.0.1 for a test: each one
//! accepts only the shape its platform documents and answers as the platform does, records
//! every request it gets, and can be taken down (503) and brought back up.
//!
//! - Slack incoming webhook: `200 ok`; `400 invalid_payload` for a body that is not a JSON
//!   object or whose blocks break Block Kit's rules (known block types, header text of at
//!   most 150 characters, section text of at most 3000, at most 10 fields of at most 2000,
//!   at most 50 blocks), as in
//!   <https://api.slack.com/changelog/2016-05-17-changes-to-errors-for-incoming-webhooks>;
//!   `400 no_text` for a message with neither `text` nor blocks, which is what Slack answers
//!   to a JSON object without them (<https://github.com/fluxcd/flagger/pull/1031>).
//! - Microsoft Teams Workflows webhook: `202` for a `message` of at most 28 KB whose
//!   attachments are Adaptive Cards, `413` for a larger one. The real trigger answers 202 to
//!   any request of a right size and the flow run fails afterwards ("Property 'type' must be
//!   'AdaptiveCard'"); this one answers 400 with the same reason at once, so that a test
//!   sees the failure.
//! - PagerDuty Events API v2 at `/v2/enqueue`: `202 {"status":"success",…}` or
//!   `400 {"status":"invalid event",…,"errors":[…]}`, checking the fields
//!   <https://developer.pagerduty.com/docs/events-api-v2/trigger-events/> requires.
//! - Generic: any request, `200`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// Which service a [`Receiver`] stands in for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Slack,
    Teams,
    PagerDuty,
    Generic,
}

impl Platform {
    /// The path the platform's URLs have: a receiver answers 404 on any other.
    fn path(self) -> &'static str {
        match self {
            Platform::Slack => "/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX",
            Platform::Teams => "/workflows/0123456789abcdef/triggers/manual/paths/invoke",
            Platform::PagerDuty => "/v2/enqueue",
            Platform::Generic => "/hook",
        }
    }
}

/// One request a receiver got, and the status it answered.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub status: StatusCode,
}

impl Received {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

struct Shared {
    platform: Platform,
    received: Mutex<Vec<Received>>,
    down: AtomicBool,
}

/// A receiver running on the test's runtime until it is dropped.
pub struct Receiver {
    address: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    pub async fn start(platform: Platform) -> Self {
        let shared = Arc::new(Shared {
            platform,
            received: Mutex::default(),
            down: AtomicBool::new(false),
        });
        let router = Router::new().fallback(receive).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        Self {
            address,
            shared,
            stop: Some(stop),
        }
    }

    /// The URL to post to, shaped like the platform's own.
    pub fn url(&self) -> String {
        format!("http://{}{}", self.address, self.shared.platform.path())
    }

    /// Every request so far, in the order they came.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Down, the receiver answers every request with 503, as a service being restarted does.
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// What a receiver answers.
struct Answer {
    status: StatusCode,
    content_type: &'static str,
    body: String,
}

impl Answer {
    fn text(status: StatusCode, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.to_owned(),
        }
    }

    fn json(status: StatusCode, body: Value) -> Self {
        Self {
            status,
            content_type: "application/json",
            body: body.to_string(),
        }
    }
}

async fn receive(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let answer = if shared.down.load(Ordering::SeqCst) {
        Answer::text(StatusCode::SERVICE_UNAVAILABLE, "down")
    } else if uri.path() != shared.platform.path() {
        Answer::text(StatusCode::NOT_FOUND, "not found")
    } else if method != Method::POST {
        Answer::text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
    } else {
        match shared.platform {
            Platform::Slack => match slack(&body) {
                Ok(()) => Answer::text(StatusCode::OK, "ok"),
                Err(error) => Answer::text(StatusCode::BAD_REQUEST, error),
            },
            Platform::Teams if body.len() > TEAMS_MESSAGE_BYTES => Answer::json(
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"error": "The payload is too large. The message size limit is 28 KB."}),
            ),
            Platform::Teams => match teams(&body) {
                Ok(()) => Answer::text(StatusCode::ACCEPTED, ""),
                Err(reason) => Answer::json(
                    StatusCode::BAD_REQUEST,
                    json!({"error": {"code": "InvalidRequestContent", "message": reason}}),
                ),
            },
            Platform::PagerDuty => pagerduty(&body),
            Platform::Generic => Answer::text(StatusCode::OK, ""),
        }
    };
    shared.received.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        headers,
        body: body.to_vec(),
        status: answer.status,
    });
    (
        answer.status,
        [(header::CONTENT_TYPE, answer.content_type)],
        answer.body,
    )
        .into_response()
}

const INVALID_PAYLOAD: &str = "invalid_payload";

/// A Slack message, or the error code Slack answers it with.
fn slack(body: &[u8]) -> Result<(), &'static str> {
    let message: Value = serde_json::from_slice(body).map_err(|_| INVALID_PAYLOAD)?;
    let message = message.as_object().ok_or(INVALID_PAYLOAD)?;
    let text = match message.get("text") {
        None | Some(Value::Null) => "",
        Some(Value::String(text)) => text.as_str(),
        Some(_) => return Err(INVALID_PAYLOAD),
    };
    let blocks = match message.get("blocks") {
        None | Some(Value::Null) => &[],
        Some(Value::Array(blocks)) => blocks.as_slice(),
        Some(_) => return Err(INVALID_PAYLOAD),
    };
    if blocks.len() > 50 {
        return Err(INVALID_PAYLOAD);
    }
    for block in blocks {
        slack_block(block)?;
    }
    let attachments = message
        .get("attachments")
        .and_then(Value::as_array)
        .is_some_and(|attachments| !attachments.is_empty());
    if text.trim().is_empty() && blocks.is_empty() && !attachments {
        return Err("no_text");
    }
    Ok(())
}

fn slack_block(block: &Value) -> Result<(), &'static str> {
    match block.get("type").and_then(Value::as_str) {
        Some("header") => slack_text(&block["text"], &["plain_text"], 150),
        Some("section") => {
            let text = block.get("text");
            let fields = block.get("fields");
            if text.is_none() && fields.is_none() {
                return Err(INVALID_PAYLOAD);
            }
            if let Some(text) = text {
                slack_text(text, &["plain_text", "mrkdwn"], 3000)?;
            }
            if let Some(fields) = fields {
                let fields = fields.as_array().ok_or(INVALID_PAYLOAD)?;
                if fields.is_empty() || fields.len() > 10 {
                    return Err(INVALID_PAYLOAD);
                }
                for field in fields {
                    slack_text(field, &["plain_text", "mrkdwn"], 2000)?;
                }
            }
            Ok(())
        }
        Some("context") => {
            let elements = slack_elements(block, 10)?;
            for element in elements {
                if element["type"] == "image" {
                    element["image_url"].as_str().ok_or(INVALID_PAYLOAD)?;
                } else {
                    slack_text(element, &["plain_text", "mrkdwn"], 3000)?;
                }
            }
            Ok(())
        }
        Some("actions") => {
            for element in slack_elements(block, 25)? {
                if element["type"] == "button" {
                    slack_text(&element["text"], &["plain_text"], 75)?;
                    slack_optional_string(element, "url", 3000)?;
                    slack_optional_string(element, "action_id", 255)?;
                } else {
                    element["type"].as_str().ok_or(INVALID_PAYLOAD)?;
                }
            }
            Ok(())
        }
        Some(
            "divider" | "image" | "rich_text" | "input" | "file" | "markdown" | "video" | "table"
            | "context_actions",
        ) => Ok(()),
        _ => Err(INVALID_PAYLOAD),
    }
}

fn slack_elements(block: &Value, max: usize) -> Result<&Vec<Value>, &'static str> {
    let elements = block["elements"].as_array().ok_or(INVALID_PAYLOAD)?;
    if elements.is_empty() || elements.len() > max {
        return Err(INVALID_PAYLOAD);
    }
    Ok(elements)
}

/// A text object of one of `kinds` whose text has 1 to `max` characters.
fn slack_text(object: &Value, kinds: &[&str], max: usize) -> Result<(), &'static str> {
    let kind = object["type"].as_str().ok_or(INVALID_PAYLOAD)?;
    let text = object["text"].as_str().ok_or(INVALID_PAYLOAD)?;
    let length = text.chars().count();
    if kinds.contains(&kind) && (1..=max).contains(&length) {
        Ok(())
    } else {
        Err(INVALID_PAYLOAD)
    }
}

fn slack_optional_string(object: &Value, key: &str, max: usize) -> Result<(), &'static str> {
    match object.get(key) {
        None => Ok(()),
        Some(Value::String(value)) if (1..=max).contains(&value.chars().count()) => Ok(()),
        Some(_) => Err(INVALID_PAYLOAD),
    }
}

/// "The message size limit is 28 KB. When the size exceeds 28 KB, you receive an error."
/// (<https://learn.microsoft.com/en-us/microsoftteams/platform/webhooks-and-connectors/how-to/add-incoming-webhook>)
const TEAMS_MESSAGE_BYTES: usize = 28 * 1024;

/// Card elements and actions up to schema 1.5, which Teams renders.
const CARD_ELEMENTS: [&str; 15] = [
    "TextBlock",
    "Image",
    "Media",
    "RichTextBlock",
    "Container",
    "ColumnSet",
    "FactSet",
    "ImageSet",
    "ActionSet",
    "Table",
    "Input.Text",
    "Input.Number",
    "Input.Date",
    "Input.Time",
    "Input.Toggle",
];
const CARD_ACTIONS: [&str; 5] = [
    "Action.OpenUrl",
    "Action.ShowCard",
    "Action.ToggleVisibility",
    "Action.Execute",
    "Action.Submit",
];

/// A Teams workflow message, or why the flow would fail on it.
fn teams(body: &[u8]) -> Result<(), String> {
    let message: Value = serde_json::from_slice(body)
        .map_err(|_| "The request body is not valid JSON".to_owned())?;
    if message["type"] != "message" {
        return Err("Property 'type' must be 'message'".to_owned());
    }
    let attachments = message["attachments"].as_array().ok_or_else(|| {
        "The result of the evaluation of 'foreach' expression \
         '@triggerOutputs()?['body']?['attachments']' must be a valid array"
            .to_owned()
    })?;
    if attachments.is_empty() {
        return Err("The message has no attachments".to_owned());
    }
    for attachment in attachments {
        if attachment["contentType"] != "application/vnd.microsoft.card.adaptive" {
            return Err(
                "Property 'contentType' must be 'application/vnd.microsoft.card.adaptive'"
                    .to_owned(),
            );
        }
        adaptive_card(&attachment["content"])?;
    }
    Ok(())
}

fn adaptive_card(card: &Value) -> Result<(), String> {
    if card["type"] != "AdaptiveCard" {
        return Err("Property 'type' must be 'AdaptiveCard'".to_owned());
    }
    if !card["version"].is_string() {
        return Err("Property 'version' must be a string".to_owned());
    }
    let body = card["body"]
        .as_array()
        .ok_or_else(|| "Property 'body' must be an array".to_owned())?;
    for element in body {
        let kind = element["type"].as_str().unwrap_or_default();
        if !CARD_ELEMENTS.contains(&kind) {
            return Err(format!("Unknown element type '{kind}'"));
        }
        if kind == "TextBlock" && !element["text"].is_string() {
            return Err("Property 'text' of a TextBlock must be a string".to_owned());
        }
        if kind == "FactSet" {
            let facts = element["facts"]
                .as_array()
                .ok_or_else(|| "Property 'facts' must be an array".to_owned())?;
            if facts
                .iter()
                .any(|fact| !fact["title"].is_string() || !fact["value"].is_string())
            {
                return Err("A fact needs a string 'title' and 'value'".to_owned());
            }
        }
    }
    if let Some(actions) = card.get("actions") {
        let actions = actions
            .as_array()
            .ok_or_else(|| "Property 'actions' must be an array".to_owned())?;
        for action in actions {
            let kind = action["type"].as_str().unwrap_or_default();
            if !CARD_ACTIONS.contains(&kind) {
                return Err(format!("Unknown action type '{kind}'"));
            }
            if kind == "Action.OpenUrl" && !action["url"].is_string() {
                return Err("Property 'url' of an Action.OpenUrl must be a string".to_owned());
            }
        }
    }
    Ok(())
}

/// PagerDuty's answer to an event.
fn pagerduty(body: &[u8]) -> Answer {
    let unrecognised = || {
        Answer::json(
            StatusCode::BAD_REQUEST,
            json!({
                "status": "Unrecognized object",
                "message": "Event object format is unrecognized",
                "errors": ["JSON parse error"],
            }),
        )
    };
    let Ok(Value::Object(event)) = serde_json::from_slice::<Value>(body) else {
        return unrecognised();
    };
    let errors = pagerduty_errors(&event);
    if !errors.is_empty() {
        return Answer::json(
            StatusCode::BAD_REQUEST,
            json!({"status": "invalid event", "message": "Event object is invalid", "errors": errors}),
        );
    }
    let dedup_key = event["dedup_key"]
        .as_str()
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_owned);
    Answer::json(
        StatusCode::ACCEPTED,
        json!({"status": "success", "message": "Event processed", "dedup_key": dedup_key}),
    )
}

fn pagerduty_errors(event: &Map<String, Value>) -> Vec<String> {
    let mut errors = Vec::new();
    match event.get("routing_key").and_then(Value::as_str) {
        Some(key) if key.chars().count() == 32 => {}
        Some(key) if !key.is_empty() => {
            errors.push("Length of 'routing_key' is incorrect (should be 32 characters)".to_owned())
        }
        _ => errors.push("'routing_key' is missing or blank".to_owned()),
    }
    let action = event.get("event_action").and_then(Value::as_str);
    if !matches!(action, Some("trigger" | "acknowledge" | "resolve")) {
        errors.push(
            "'event_action' is invalid (must be one of the following: 'trigger', \
             'acknowledge' or 'resolve')"
                .to_owned(),
        );
    }
    match event.get("dedup_key") {
        None | Some(Value::Null) if action != Some("trigger") => {
            errors.push("'dedup_key' is missing or blank".to_owned())
        }
        None | Some(Value::Null) => {}
        Some(Value::String(key)) if (1..=255).contains(&key.chars().count()) => {}
        Some(_) => errors.push("'dedup_key' must be a string of 1 to 255 characters".to_owned()),
    }
    if action == Some("trigger") {
        match event.get("payload").and_then(Value::as_object) {
            Some(payload) => errors.extend(pagerduty_payload_errors(payload)),
            None => errors.push("'payload' is missing or not an object".to_owned()),
        }
        for link in event
            .get("links")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !link["href"].is_string() {
                errors.push("'links' entries need an 'href'".to_owned());
            }
        }
        for image in event
            .get("images")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if !image["src"].is_string() {
                errors.push("'images' entries need a 'src'".to_owned());
            }
        }
    }
    errors
}

fn pagerduty_payload_errors(payload: &Map<String, Value>) -> Vec<String> {
    let mut errors = Vec::new();
    let blank = |key: &str| {
        payload
            .get(key)
            .and_then(Value::as_str)
            .is_none_or(|value| value.trim().is_empty())
    };
    if blank("summary") {
        errors.push("'payload.summary' is missing or blank".to_owned());
    } else if payload["summary"].as_str().unwrap().chars().count() > 1024 {
        errors.push("'payload.summary' is longer than 1024 characters".to_owned());
    }
    if blank("source") {
        errors.push("'payload.source' is missing or blank".to_owned());
    }
    if !matches!(
        payload.get("severity").and_then(Value::as_str),
        Some("critical" | "error" | "warning" | "info")
    ) {
        errors.push(
            "'payload.severity' is invalid (must be one of the following: 'critical', \
             'warning', 'error' or 'info')"
                .to_owned(),
        );
    }
    if let Some(timestamp) = payload.get("timestamp") {
        let valid = timestamp
            .as_str()
            .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok());
        if !valid {
            errors.push("'payload.timestamp' is not an ISO 8601 date and time".to_owned());
        }
    }
    if payload
        .get("custom_details")
        .is_some_and(|d| !d.is_object())
    {
        errors.push("'payload.custom_details' must be an object".to_owned());
    }
    for key in ["component", "group", "class"] {
        if payload.get(key).is_some_and(|value| !value.is_string()) {
            errors.push(format!("'payload.{key}' must be a string"));
        }
    }
    errors
}
