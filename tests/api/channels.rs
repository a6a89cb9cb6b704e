//! Notification channels: alerts and month closes reach Slack, Microsoft Teams, PagerDuty
//! and email receivers in each one's own format, once each, through the outbox; a receiver
//! that is down gets them when it is back, a deleted channel gets nothing more, and readers
//! never see a target's secret.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::ledger::mail::Mailer;
use taskledger::ledger::notify::Notifier;
use taskledger::workers::channels::ChannelDeliveries;

use taskledger::workers::webhooks::DeliveryPolicy;

use crate::alerts::{fire, quick_policy};
use crate::common::TestApp;
use crate::common::receivers::{Platform, Receiver};
use crate::common::smtp::{SmtpMode, SmtpSink};

const PUBLIC_URL: &str = "https://ledger.example.com";

fn notifier(smtp: Option<&SmtpSink>) -> Arc<Notifier> {
    let mailer = smtp.map(|sink| {
        Mailer::new(
            &sink.url(),
            "taskledger <alerts@example.com>",
            Some(sink.certificate_pem()),
        )
        .unwrap()
    });
    Arc::new(
        Notifier::new(
            mailer,
            Some(PUBLIC_URL.to_owned()),
            Some("channel-secret".to_owned()),
            Duration::from_secs(5),
        )
        .unwrap(),
    )
}

async fn channel(app: &TestApp, body: Value) -> Value {
    let response = app.post("/v1/channels", &app.admin, body).await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    response.json()
}

/// Creates a project with a monthly budget of 1000 USD.
pub(crate) async fn project(app: &TestApp, id: &str) -> taskledger::store::projects::ProjectRow {
    let response = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": id, "name": id, "currency": "USD", "default_monthly_budget": "1000"}),
        )
        .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    taskledger::store::projects::get(&app.pool, id)
        .await
        .unwrap()
        .unwrap()
}

async fn alerts(app: &TestApp, project: &str) -> Vec<Value> {
    app.get(&format!("/v1/alerts?project={project}"), &app.admin)
        .await
        .json()["items"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn a_budget_alert_reaches_slack_teams_pagerduty_and_email_once_each_in_their_formats() {
    let app = TestApp::spawn().await;
    let vision = project(&app, "vision").await;
    let slack = Receiver::start(Platform::Slack).await;
    let teams = Receiver::start(Platform::Teams).await;
    let pagerduty = Receiver::start(Platform::PagerDuty).await;
    let smtp = SmtpSink::start(SmtpMode::StartTls, Some(("ledger", "s3cret")));
    channel(
        &app,
        json!({"name": "ML", "kind": "slack", "target": slack.url()}),
    )
    .await;
    channel(
        &app,
        json!({"name": "Finance", "kind": "teams", "target": teams.url()}),
    )
    .await;
    channel(
        &app,
        json!({"name": "On-call", "kind": "pagerduty", "target": pagerduty.url(),
               "routing_key": "R0UTINGKEY0123456789abcdefABCDEF"}),
    )
    .await;
    channel(
        &app,
        json!({"name": "Finance mail", "kind": "email",
               "target": "finance@example.com, cfo@example.com"}),
    )
    .await;

    fire(&app, &vision, 850).await;
    let worker = ChannelDeliveries::new(app.pool.clone(), notifier(Some(&smtp)), quick_policy());
    assert_eq!(
        worker.deliver_due().await.unwrap(),
        2 * 4,
        "two alerts, four channels"
    );
    assert_eq!(
        worker.deliver_due().await.unwrap(),
        0,
        "nothing is sent twice"
    );

    let fired = alerts(&app, "vision").await;
    assert_eq!(fired.len(), 2);
    let eighty = fired.iter().find(|a| a["threshold"] == 80).unwrap();
    let id = eighty["id"].as_str().unwrap();

    assert_eq!(slack.received().len(), 2);
    for got in slack.received() {
        assert_eq!(got.status, StatusCode::OK, "Slack took it");
    }
    let slack_message = slack
        .received()
        .into_iter()
        .map(|r| r.json())
        .find(|m| m["text"].as_str().unwrap().contains("80%"))
        .expect("the 80% alert reached Slack");
    assert!(
        slack_message["text"].as_str().unwrap().contains("vision"),
        "{slack_message}"
    );
    let text = slack_message.to_string();
    assert!(text.contains("850.00 USD"), "the spend is named: {text}");
    assert!(text.contains("1000.00 USD"), "the budget is named: {text}");
    assert!(
        text.contains("https://ledger.example.com/#project=vision&month=2026-11"),
        "it links to the project's page: {text}"
    );

    assert_eq!(teams.received().len(), 2);
    assert!(
        teams
            .received()
            .iter()
            .all(|r| r.status == StatusCode::ACCEPTED)
    );
    let card = &teams.received()[0].json()["attachments"][0];
    assert_eq!(
        card["contentType"],
        "application/vnd.microsoft.card.adaptive"
    );

    let events: Vec<Value> = pagerduty.received().iter().map(|r| r.json()).collect();
    assert_eq!(events.len(), 2);
    assert!(
        pagerduty
            .received()
            .iter()
            .all(|r| r.status == StatusCode::ACCEPTED)
    );
    let event = events
        .iter()
        .find(|e| e["dedup_key"] == id)
        .expect("dedup_key is the alert id");
    assert_eq!(event["event_action"], "trigger");
    assert_eq!(
        event["payload"]["severity"], "error",
        "80% of a budget is an error"
    );

    let mails = smtp.messages();
    assert_eq!(mails.len(), 2, "{:#}", json!(fired));
    let mail = mails.iter().find(|m| m.subject.contains("80%")).unwrap();
    assert_eq!(mail.rcpt_tos, ["finance@example.com", "cfo@example.com"]);
    assert!(mail.text.contains("850.00 USD"), "{}", mail.text);
    assert!(mail.html.contains("850.00 USD"), "{}", mail.html);

    let listed = &eighty["channels"];
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    for delivery in listed.as_array().unwrap() {
        assert_eq!(delivery["state"], "delivered", "{delivery}");
        assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1);
    }
}

#[tokio::test]
async fn a_receiver_down_gets_the_alert_when_it_is_back_and_a_refused_one_is_given_up() {
    let app = TestApp::spawn().await;
    let vision = project(&app, "vision").await;
    let slack = Receiver::start(Platform::Slack).await;
    let generic = Receiver::start(Platform::Generic).await;
    channel(
        &app,
        json!({"name": "ML", "kind": "slack", "target": slack.url()}),
    )
    .await;
    // Slack's own answer to the generic alert document: refused for good.
    let wrong = format!("{}/wrong", generic.url().trim_end_matches("/hook"));
    channel(
        &app,
        json!({"name": "Broken", "kind": "slack", "target": wrong}),
    )
    .await;
    slack.set_down(true);

    fire(&app, &vision, 600).await;
    // The retry waits a second, so that the first round makes exactly the two first attempts
    // however long they take.
    let policy = DeliveryPolicy {
        first_retry: Duration::from_secs(1),
        max_retry: Duration::from_secs(1),
        ..quick_policy()
    };
    let worker = ChannelDeliveries::new(app.pool.clone(), notifier(None), policy);
    assert_eq!(worker.deliver_due().await.unwrap(), 2);
    let channels = alerts(&app, "vision").await[0]["channels"].clone();
    let down = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel_name"] == "ML")
        .unwrap();
    assert_eq!(down["state"], "pending", "{down}");
    assert_eq!(down["attempts"][0]["status_code"], 503);

    slack.set_down(false);
    let mut delivered = false;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        worker.deliver_due().await.unwrap();
        let channels = alerts(&app, "vision").await[0]["channels"].clone();
        let ml = channels
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["channel_name"] == "ML")
            .unwrap()
            .clone();
        if ml["state"] == "delivered" {
            delivered = true;
            break;
        }
    }
    assert!(delivered, "the receiver got it once it was back");
    let took: Vec<_> = slack
        .received()
        .into_iter()
        .filter(|r| r.status == StatusCode::OK)
        .collect();
    assert_eq!(took.len(), 1, "delivered once");

    let channels = alerts(&app, "vision").await[0]["channels"].clone();
    let broken = channels
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel_name"] == "Broken")
        .unwrap();
    assert_eq!(broken["state"], "gave_up", "a 404 is not retried: {broken}");
}

#[tokio::test]
async fn a_deleted_channel_stops_at_once_and_channels_receive_only_what_they_subscribe_to() {
    let app = TestApp::spawn().await;
    let vision = project(&app, "vision").await;
    let nlp = project(&app, "nlp").await;
    let all = Receiver::start(Platform::Slack).await;
    let vision_only = Receiver::start(Platform::Slack).await;
    let forecasts_only = Receiver::start(Platform::Slack).await;
    let doomed = Receiver::start(Platform::Slack).await;
    channel(
        &app,
        json!({"name": "All", "kind": "slack", "target": all.url()}),
    )
    .await;
    channel(
        &app,
        json!({"name": "Vision", "kind": "slack", "target": vision_only.url(), "projects": ["vision"]}),
    )
    .await;
    channel(
        &app,
        json!({"name": "Forecasts", "kind": "slack", "target": forecasts_only.url(),
               "alert_kinds": ["forecast"]}),
    )
    .await;
    let gone = channel(
        &app,
        json!({"name": "Gone", "kind": "slack", "target": doomed.url()}),
    )
    .await;

    fire(&app, &vision, 600).await;
    fire(&app, &nlp, 600).await;
    let deleted = app
        .delete(
            &format!("/v1/channels/{}", gone["id"].as_str().unwrap()),
            &app.admin,
        )
        .await;
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);

    let worker = ChannelDeliveries::new(app.pool.clone(), notifier(None), quick_policy());
    worker.deliver_due().await.unwrap();
    assert_eq!(all.received().len(), 2, "every project's alert");
    assert_eq!(vision_only.received().len(), 1, "only vision's");
    assert!(
        vision_only.received()[0]
            .json()
            .to_string()
            .contains("vision")
    );
    assert_eq!(forecasts_only.received().len(), 0, "no forecast fired");
    assert_eq!(doomed.received().len(), 0, "deleted before it was sent");
    let listed = alerts(&app, "vision").await[0]["channels"].clone();
    let cancelled = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel_name"] == "Gone")
        .unwrap();
    assert_eq!(cancelled["state"], "cancelled");

    // An alert fired after the delete is not even queued for it.
    fire(&app, &vision, 850).await;
    worker.deliver_due().await.unwrap();
    assert_eq!(doomed.received().len(), 0);
}

#[tokio::test]
async fn closing_a_month_emails_the_report_with_its_csv_attached() {
    let app = TestApp::spawn_with(Settings {
        clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    })
    .await;
    app.create_project("vision", "USD").await;
    let smtp = SmtpSink::start(SmtpMode::ImplicitTls, None);
    channel(
        &app,
        json!({"name": "Close", "kind": "email", "target": "finance@example.com",
               "alert_kinds": ["month_closed"]}),
    )
    .await;
    let finance = app.token("finance", &[]).await;
    let closed = app
        .call(
            Method::POST,
            "/v1/reports/monthly/2026-10/close",
            Some(&finance),
            None,
        )
        .await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.text());

    let worker = ChannelDeliveries::new(app.pool.clone(), notifier(Some(&smtp)), quick_policy());
    assert_eq!(worker.deliver_due().await.unwrap(), 1);
    let mails = smtp.messages();
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    assert!(
        mail.subject.contains("October 2026 is closed"),
        "{}",
        mail.subject
    );
    assert!(
        mail.text
            .contains("https://ledger.example.com/#page=finance&month=2026-10")
    );
    assert_eq!(mail.attachments.len(), 1);
    let attachment = &mail.attachments[0];
    assert_eq!(attachment.filename, "taskledger-report-2026-10.csv");
    assert_eq!(attachment.content_type, "text/csv");
    let csv = app
        .get("/v1/reports/monthly/2026-10?format=csv", &app.admin)
        .await
        .body;
    assert_eq!(
        attachment.bytes, csv,
        "the attachment is the closed month's report"
    );
}

#[tokio::test]
async fn channels_are_for_admins_and_finance_check_their_fields_and_hide_secrets_from_finance() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let finance = app.token("finance", &[]).await;
    let reader = app.token("reader", &["vision"]).await;
    let secret_url = "https://hooks.slack.com/services/T000/B000/SECRETSECRET";
    let created = channel(
        &app,
        json!({"name": "ML", "kind": "slack", "target": secret_url}),
    )
    .await;
    assert_eq!(created["target"], secret_url, "admins see it whole");
    let pd = channel(
        &app,
        json!({"name": "On-call", "kind": "pagerduty", "routing_key": "R0UTINGKEY0123456789abcdefABCDEF"}),
    )
    .await;
    assert_eq!(pd["target"], "https://events.pagerduty.com/v2/enqueue");

    let seen = app.get("/v1/channels", &finance).await;
    assert_eq!(seen.status, StatusCode::OK);
    let text = seen.text();
    assert!(!text.contains("SECRETSECRET"), "{text}");
    assert!(!text.contains("R0UTINGKEY0123456789abcdef"), "{text}");
    assert!(text.contains("…CDEF"), "{text}");
    app.get("/v1/channels", &reader)
        .await
        .problem(StatusCode::FORBIDDEN);
    app.post(
        "/v1/channels",
        &reader,
        json!({"name": "x", "kind": "slack", "target": secret_url}),
    )
    .await
    .problem(StatusCode::FORBIDDEN);

    let bad = app
        .post(
            "/v1/channels",
            &finance,
            json!({"name": "", "kind": "email", "target": "not an address",
                   "projects": ["nope"], "alert_kinds": ["weekly"]}),
        )
        .await;
    assert_eq!(
        bad.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        bad.text()
    );
    assert_eq!(bad.pointers(), ["/name", "/target", "/alert_kinds/0"]);
    let unknown = app
        .post(
            "/v1/channels",
            &finance,
            json!({"name": "x", "kind": "slack", "target": secret_url, "projects": ["nope"]}),
        )
        .await;
    assert_eq!(unknown.pointers(), ["/projects/0"]);
    app.delete(&format!("/v1/channels/{}", uuid::Uuid::new_v4()), &finance)
        .await
        .problem(StatusCode::NOT_FOUND);
    assert_eq!(
        app.get("/v1/channels", &finance)
            .await
            .json()
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[tokio::test]
async fn a_test_message_reports_what_the_receiver_answered() {
    let app = TestApp::spawn().await;
    let slack = Receiver::start(Platform::Slack).await;
    let created = channel(
        &app,
        json!({"name": "ML", "kind": "slack", "target": slack.url()}),
    )
    .await;
    let path = format!("/v1/channels/{}/test", created["id"].as_str().unwrap());
    let mut app = app;
    app.router =
        taskledger::http::app(app.state(Settings::default()).with_notifier(notifier(None)));

    let answered = app.post(&path, &app.admin, json!({})).await;
    assert_eq!(answered.status, StatusCode::OK, "{}", answered.text());
    let result = answered.json();
    assert_eq!(result["delivered"], true, "{result}");
    assert_eq!(result["status_code"], 200);
    assert_eq!(result["answer"], "ok");
    assert_eq!(slack.received().len(), 1);
    assert!(
        slack.received()[0].json()["text"]
            .as_str()
            .unwrap()
            .contains("Test message")
    );

    slack.set_down(true);
    let result = app.post(&path, &app.admin, json!({})).await.json();
    assert_eq!(result["delivered"], false, "{result}");
    assert_eq!(result["status_code"], 503);
    assert!(
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM channel_deliveries")
            .fetch_one(&app.pool)
            .await
            .unwrap()
            == 0,
        "a test message is not queued"
    );
}

#[tokio::test]
async fn alerts_fired_while_a_channel_is_deleted_never_reach_it() {
    let app = TestApp::spawn().await;
    let doomed = Receiver::start(Platform::Slack).await;
    let kept = Receiver::start(Platform::Slack).await;
    let gone = channel(
        &app,
        json!({"name": "Gone", "kind": "slack", "target": doomed.url()}),
    )
    .await;
    channel(
        &app,
        json!({"name": "Kept", "kind": "slack", "target": kept.url()}),
    )
    .await;
    let mut projects = Vec::new();
    for i in 0..8 {
        projects.push(project(&app, &format!("p{i}")).await);
    }
    // Eight projects fire their alerts while the channel is deleted: whichever transactions
    // read the channel before the delete committed queue a message for it, and none is sent.
    let firing: Vec<_> = projects
        .iter()
        .map(|p| {
            let app = &app;
            async move { fire(app, p, 850).await }
        })
        .collect();
    let path = format!("/v1/channels/{}", gone["id"].as_str().unwrap());
    let (_, deleted) = tokio::join!(
        futures::future::join_all(firing),
        app.delete(&path, &app.admin)
    );
    assert_eq!(deleted.status, StatusCode::NO_CONTENT);

    let worker = ChannelDeliveries::new(app.pool.clone(), notifier(None), quick_policy());
    worker.deliver_due().await.unwrap();
    assert_eq!(
        doomed.received().len(),
        0,
        "nothing leaves for a deleted channel"
    );
    assert_eq!(
        kept.received().len(),
        16,
        "two alerts for each of eight projects"
    );
    let pending: i64 =
        sqlx::query_scalar("SELECT count(*) FROM channel_deliveries WHERE state = 'pending'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        pending, 0,
        "what was queued for it was cancelled or never claimed"
    );
}

#[tokio::test]
async fn two_replicas_never_send_the_same_message() {
    let app = TestApp::spawn().await;
    let slack = Receiver::start(Platform::Slack).await;
    channel(
        &app,
        json!({"name": "Everything", "kind": "slack", "target": slack.url()}),
    )
    .await;
    for i in 0..12 {
        let project = project(&app, &format!("p{i}")).await;
        fire(&app, &project, 850).await;
    }
    let replicas: Vec<_> = (0..2)
        .map(|_| ChannelDeliveries::new(app.pool.clone(), notifier(None), quick_policy()))
        .collect();
    let (a, b) = tokio::join!(replicas[0].deliver_due(), replicas[1].deliver_due());
    assert_eq!(
        a.unwrap() + b.unwrap(),
        24,
        "two alerts for each of twelve projects"
    );
    let bodies: Vec<Vec<u8>> = slack.received().into_iter().map(|r| r.body).collect();
    let unique: std::collections::BTreeSet<&Vec<u8>> = bodies.iter().collect();
    assert_eq!(bodies.len(), 24);
    assert_eq!(unique.len(), 24, "no message was sent twice");
}
