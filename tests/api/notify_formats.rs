//! Each renderer's output, posted over HTTP to a stand-in that accepts only its platform's
//! documented shape, is accepted for every kind of notice; and what the platforms refuse, the
//! stand-ins refuse too, so that their acceptance means something.

use chrono::{TimeZone, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};
use taskledger::exports::notify::{self, Notice, Severity};
use uuid::Uuid;

use crate::common::receivers::{Platform, Receiver};

const ROUTING_KEY: &str = "0123456789abcdef0123456789abcdef";

fn notice(kind: &str, project: Option<&str>, title: &str, summary: &str) -> Notice {
    Notice {
        id: Uuid::new_v4(),
        kind: kind.to_owned(),
        project: project.map(str::to_owned),
        title: title.to_owned(),
        summary: summary.to_owned(),
        facts: Vec::new(),
        link: None,
        severity: Severity::Info,
        at: Utc.with_ymd_and_hms(2026, 11, 20, 14, 5, 0).unwrap(),
    }
}

fn fact(label: &str, value: &str) -> (String, String) {
    (label.to_owned(), value.to_owned())
}

/// A budget alert, an idle GPU, zombie capacity, a closed month, and one made of the worst a
/// user can name things with, at lengths past every platform's limits.
fn notices() -> Vec<Notice> {
    let budget = Notice {
        facts: vec![
            fact("Spend", "8,000.00 USD"),
            fact("Budget", "10,000.00 USD"),
            fact("Forecast", "11,900.00 USD"),
        ],
        link: Some("https://ledger.example.com/projects/vision".to_owned()),
        severity: Severity::Warning,
        ..notice(
            "forecast",
            Some("vision"),
            "vision will spend 119% of its November budget",
            "At this pace vision ends November at 11,900.00 USD of 10,000.00 USD.",
        )
    };
    let idle_gpu = Notice {
        facts: vec![
            fact("Task", "train-resnet/run-42"),
            fact("Node", "gpu-node-07"),
            fact("Idle GPU time", "3.5 h"),
            fact("Cost of idle time", "98.00 USD"),
        ],
        link: Some("https://ledger.example.com/tasks/train-resnet".to_owned()),
        severity: Severity::Error,
        ..notice(
            "idle_gpu",
            Some("vision"),
            "train-resnet/run-42 left 4 GPUs idle for 3.5 hours",
            "Its GPUs were under 5% busy from 09:00 to 12:30.",
        )
    };
    let zombie = Notice {
        facts: vec![
            fact("Pool", "a100-reserved"),
            fact("Nodes", "3"),
            fact("Cost", "412.80 USD"),
        ],
        severity: Severity::Critical,
        ..notice(
            "zombie_capacity",
            Some("research"),
            "3 reserved A100 nodes ran no task for 48 hours",
            "Their commitment keeps being charged while nothing runs on them.",
        )
    };
    let month_closed = Notice {
        facts: vec![
            fact("Month", "2026-11"),
            fact("Total", "182,340.17 USD"),
            fact("Projects", "14"),
        ],
        link: Some("https://ledger.example.com/reports/2026-11".to_owned()),
        ..notice(
            "month_closed",
            None,
            "November 2026 is closed",
            "Every project's charges for November are final.",
        )
    };
    let hostile = Notice {
        facts: (1..=70)
            .map(|i| fact(&format!("<b>&co {i}"), &"<&>".repeat(900)))
            .collect(),
        link: Some("https://ledger.example.com/projects/%3Cb%3E%26co?a=1&b=2".to_owned()),
        severity: Severity::Critical,
        ..notice(
            "actual",
            Some("<b>&co"),
            &format!("<b>&co <!channel> {}", "spent ".repeat(300)),
            &"<b>&co & \"quotes\" 'too' ".repeat(400),
        )
    };
    vec![budget, idle_gpu, zombie, month_closed, hostile]
}

async fn post(url: &str, body: &Value) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

async fn post_raw(url: &str, body: &'static str) -> (StatusCode, String) {
    let response = reqwest::Client::new()
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

#[tokio::test]
async fn slack_accepts_every_notice_rendered_for_it() {
    let slack = Receiver::start(Platform::Slack).await;
    let notices = notices();
    for notice in &notices {
        let message = notify::slack(notice);
        assert_eq!(
            post(&slack.url(), &message).await,
            (StatusCode::OK, "ok".to_owned()),
            "{message}"
        );
    }
    let received = slack.received();
    assert_eq!(received.len(), notices.len());
    for (request, notice) in received.iter().zip(&notices) {
        assert_eq!(request.status, StatusCode::OK);
        assert_eq!(request.json(), notify::slack(notice));
        assert_eq!(
            request.headers[reqwest::header::CONTENT_TYPE],
            "application/json"
        );
    }
}

#[tokio::test]
async fn teams_accepts_every_notice_rendered_for_it() {
    let teams = Receiver::start(Platform::Teams).await;
    for notice in &notices() {
        let message = notify::teams(notice);
        let (status, body) = post(&teams.url(), &message).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    }
    assert!(
        teams
            .received()
            .iter()
            .all(|request| request.status == StatusCode::ACCEPTED)
    );
}

#[tokio::test]
async fn pagerduty_accepts_every_notice_rendered_for_it_under_its_id() {
    let pagerduty = Receiver::start(Platform::PagerDuty).await;
    assert!(pagerduty.url().ends_with("/v2/enqueue"));
    for notice in &notices() {
        let event = notify::pagerduty(notice, ROUTING_KEY);
        let (status, body) = post(&pagerduty.url(), &event).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            answer,
            json!({"status": "success", "message": "Event processed", "dedup_key": notice.id.to_string()})
        );
    }
    assert!(
        pagerduty
            .received()
            .iter()
            .all(|request| request.path == "/v2/enqueue")
    );
}

#[tokio::test]
async fn slack_refuses_what_slack_refuses() {
    let slack = Receiver::start(Platform::Slack).await;
    let generic_alert = json!({
        "id": Uuid::new_v4(),
        "kind": "actual",
        "project": "vision",
        "threshold": 80,
        "spend": "8000.00",
        "currency": "USD",
    });
    assert_eq!(
        post(&slack.url(), &generic_alert).await,
        (StatusCode::BAD_REQUEST, "no_text".to_owned()),
        "a JSON object without text or blocks"
    );
    let invalid_payload = (StatusCode::BAD_REQUEST, "invalid_payload".to_owned());
    assert_eq!(post_raw(&slack.url(), "text=hello").await, invalid_payload);
    assert_eq!(post(&slack.url(), &json!(["hello"])).await, invalid_payload);

    let mut message = notify::slack(&notices()[0]);
    message["blocks"][0]["text"]["text"] = json!("h".repeat(151));
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "a long header"
    );

    let mut message = notify::slack(&notices()[0]);
    message["blocks"][0]["text"]["type"] = json!("mrkdwn");
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "a mrkdwn header"
    );

    let mut message = notify::slack(&notices()[0]);
    message["blocks"][1]["text"]["text"] = json!("s".repeat(3001));
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "a long section"
    );

    let field = json!({"type": "mrkdwn", "text": "*Spend*\n1"});
    let message = json!({"text": "t", "blocks": [{"type": "section", "fields": vec![field; 11]}]});
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "11 fields"
    );

    let divider = json!({"type": "divider"});
    let message = json!({"text": "t", "blocks": vec![divider; 51]});
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "51 blocks"
    );

    let message = json!({"text": "t", "blocks": [{"type": "banner", "text": "t"}]});
    assert_eq!(
        post(&slack.url(), &message).await,
        invalid_payload,
        "an unknown block"
    );

    assert_eq!(
        post(&slack.url(), &json!({"text": "hello"})).await,
        (StatusCode::OK, "ok".to_owned()),
        "text alone is a message"
    );
}

#[tokio::test]
async fn teams_and_pagerduty_refuse_each_others_formats() {
    let teams = Receiver::start(Platform::Teams).await;
    let pagerduty = Receiver::start(Platform::PagerDuty).await;
    let notice = &notices()[0];

    let (status, body) = post(&teams.url(), &notify::slack(notice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let bare_card = notify::teams(notice)["attachments"][0]["content"].clone();
    let (status, body) = post(&teams.url(), &bare_card).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");

    let (status, body) = post(&pagerduty.url(), &notify::teams(notice)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["status"], "invalid event");
    assert!(!answer["errors"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn pagerduty_refuses_an_event_its_documentation_rules_out() {
    let pagerduty = Receiver::start(Platform::PagerDuty).await;
    let valid = notify::pagerduty(&notices()[0], ROUTING_KEY);
    let refused = |change: fn(&mut Value)| {
        let mut event = valid.clone();
        change(&mut event);
        event
    };
    let cases = [
        (
            refused(|e| e["routing_key"] = json!("short")),
            "Length of 'routing_key' is incorrect (should be 32 characters)",
        ),
        (
            refused(|e| e["event_action"] = json!("escalate")),
            "'event_action' is invalid",
        ),
        (
            refused(|e| e["payload"]["severity"] = json!("fatal")),
            "'payload.severity' is invalid",
        ),
        (
            refused(|e| e["payload"]["summary"] = json!("s".repeat(1025))),
            "'payload.summary' is longer than 1024 characters",
        ),
        (
            refused(|e| e["payload"].as_object_mut().unwrap().clear()),
            "'payload.source' is missing or blank",
        ),
    ];
    for (event, error) in cases {
        let (status, body) = post(&pagerduty.url(), &event).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["status"], "invalid event");
        assert_eq!(answer["message"], "Event object is invalid");
        assert!(
            answer["errors"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e.as_str().unwrap().starts_with(error)),
            "{error} in {body}"
        );
    }
    let (status, body) = post_raw(&pagerduty.url(), "{not json").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("JSON parse error"));
}

#[tokio::test]
async fn a_receiver_goes_down_and_comes_back_recording_every_request() {
    let generic = Receiver::start(Platform::Generic).await;
    let email = notify::email(&notices()[1]);
    let body = json!({"subject": email.subject, "text": email.text, "html": email.html});

    generic.set_down(true);
    assert_eq!(
        post(&generic.url(), &body).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    generic.set_down(false);
    assert_eq!(post(&generic.url(), &body).await.0, StatusCode::OK);

    let received = generic.received();
    let statuses: Vec<StatusCode> = received.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [StatusCode::SERVICE_UNAVAILABLE, StatusCode::OK]);
    assert!(
        received
            .iter()
            .all(|r| r.path == "/hook" && r.json() == body)
    );
    assert_eq!(received[1].body, serde_json::to_vec(&body).unwrap());
}
