//! Email over real SMTP: the mailer against aiosmtpd, in plain text, with STARTTLS and with
//! implicit TLS, with and without AUTH.

use taskledger::ledger::mail::{Attachment, Mail, MailError, Mailer};

use crate::common::smtp::{SmtpMode, SmtpSink};

const FROM: &str = "taskledger <alerts@example.com>";

fn recipients() -> Vec<String> {
    vec![
        "Ops Team <ops@example.com>".to_owned(),
        "finance@example.com".to_owned(),
    ]
}

fn mail<'a>(to: &'a [String], attachments: &'a [Attachment]) -> Mail<'a> {
    Mail {
        to,
        subject: "Budget burn: project alpha at 92 %",
        text: "Project alpha has spent 92 % of its budget.\nSee the dashboard.",
        html: "<p>Project <b>alpha</b> has spent 92&nbsp;% of its budget.</p>",
        attachments,
    }
}

fn mailer_for(sink: &SmtpSink) -> Mailer {
    Mailer::new(&sink.url(), FROM, Some(sink.certificate_pem())).expect("a mailer")
}

/// Line endings as sent by a mail program: CRLF, made LF for comparing.
fn lf(text: &str) -> String {
    text.replace("\r\n", "\n").trim_end().to_owned()
}

#[tokio::test]
async fn starttls_with_auth_delivers_subject_bodies_and_recipients() {
    let sink = SmtpSink::start(SmtpMode::StartTls, Some(("alerts", "p@ss:w/rd")));
    let mailer = mailer_for(&sink);
    let to = recipients();

    let reply = mailer.send(&mail(&to, &[])).await.expect("sent");
    assert!(reply.starts_with("250"), "{reply}");

    let received = sink.messages();
    assert_eq!(received.len(), 1);
    let message = &received[0];
    assert_eq!(message.subject, "Budget burn: project alpha at 92 %");
    assert_eq!(message.from, "alerts@example.com");
    assert_eq!(message.mail_from, "alerts@example.com");
    assert_eq!(message.to, ["ops@example.com", "finance@example.com"]);
    assert_eq!(message.rcpt_tos, ["ops@example.com", "finance@example.com"]);
    assert_eq!(
        lf(&message.text),
        "Project alpha has spent 92 % of its budget.\nSee the dashboard."
    );
    assert_eq!(
        lf(&message.html),
        "<p>Project <b>alpha</b> has spent 92&nbsp;% of its budget.</p>"
    );
    assert!(message.attachments.is_empty());
    let raw = String::from_utf8_lossy(&message.raw);
    assert!(raw.contains("multipart/alternative"), "{raw}");
    assert!(!raw.contains("multipart/mixed"), "{raw}");
}

#[tokio::test]
async fn implicit_tls_delivers() {
    let sink = SmtpSink::start(SmtpMode::ImplicitTls, Some(("alerts", "secret")));
    assert!(sink.url().starts_with("smtps://"));
    let to = recipients();

    mailer_for(&sink).send(&mail(&to, &[])).await.expect("sent");

    let received = sink.messages();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].subject, "Budget burn: project alpha at 92 %");
    assert_eq!(received[0].rcpt_tos.len(), 2);
}

#[tokio::test]
async fn plain_text_without_auth_delivers() {
    let sink = SmtpSink::start(SmtpMode::Plain, None);
    let to = ["ops@example.com".to_owned()];

    Mailer::new(&sink.url(), FROM, None)
        .unwrap()
        .send(&mail(&to, &[]))
        .await
        .expect("sent");

    assert_eq!(sink.messages()[0].rcpt_tos, ["ops@example.com"]);
}

#[tokio::test]
async fn an_attachment_arrives_byte_for_byte() {
    let sink = SmtpSink::start(SmtpMode::StartTls, None);
    let csv = "project,cost_usd,note\nalpha,1234.50,\"GPU, A100\"\nbeta,0.01,café\n"
        .as_bytes()
        .to_vec();
    let attachments = [Attachment {
        filename: "costs-2026-11.csv".to_owned(),
        content_type: "text/csv".to_owned(),
        bytes: csv.clone(),
    }];
    let to = recipients();

    mailer_for(&sink)
        .send(&mail(&to, &attachments))
        .await
        .expect("sent");

    let received = sink.messages();
    let message = &received[0];
    assert_eq!(message.attachments.len(), 1);
    let attachment = &message.attachments[0];
    assert_eq!(attachment.filename, "costs-2026-11.csv");
    assert_eq!(attachment.content_type, "text/csv");
    assert_eq!(attachment.bytes, csv);
    // The bodies are still there, beside the attachment.
    assert!(lf(&message.text).starts_with("Project alpha"));
    assert!(lf(&message.html).starts_with("<p>Project"));
    let raw = String::from_utf8_lossy(&message.raw);
    assert!(raw.contains("multipart/mixed"), "{raw}");
    assert!(raw.contains("multipart/alternative"), "{raw}");
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error_worth_retrying() {
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mailer = Mailer::new(&format!("smtp://127.0.0.1:{port}?tls=none"), FROM, None).unwrap();
    let to = recipients();

    let error = mailer.send(&mail(&to, &[])).await.unwrap_err();

    assert!(matches!(error, MailError::Connect(_)), "{error:?}");
    assert!(!error.is_permanent());
}

#[tokio::test]
async fn an_untrusted_certificate_is_a_tls_error() {
    let sink = SmtpSink::start(SmtpMode::ImplicitTls, None);
    let mailer = Mailer::new(&sink.url(), FROM, None).unwrap();
    let to = recipients();

    let error = mailer.send(&mail(&to, &[])).await.unwrap_err();

    assert!(matches!(error, MailError::Tls(_)), "{error:?}");
    assert!(sink.messages().is_empty());
}

#[tokio::test]
async fn required_starttls_that_the_server_does_not_offer_is_a_tls_error() {
    let sink = SmtpSink::start(SmtpMode::Plain, None);
    let url = format!("smtp://127.0.0.1:{}?tls=required", sink.port());
    let mailer = Mailer::new(&url, FROM, None).unwrap();
    let to = recipients();

    let error = mailer.send(&mail(&to, &[])).await.unwrap_err();

    assert!(matches!(error, MailError::Tls(_)), "{error:?}");
    assert!(sink.messages().is_empty());
}

#[tokio::test]
async fn a_wrong_password_is_permanent_and_not_shown() {
    let sink = SmtpSink::start(SmtpMode::StartTls, Some(("alerts", "right-password")));
    let wrong = "Wr0ng-S3cret";
    let url = format!(
        "smtp://alerts:{wrong}@127.0.0.1:{}?tls=required",
        sink.port()
    );
    let mailer = Mailer::new(&url, FROM, Some(sink.certificate_pem())).unwrap();
    let to = recipients();

    let error = mailer.send(&mail(&to, &[])).await.unwrap_err();

    assert!(
        matches!(error, MailError::Permanent { code: 535, .. }),
        "{error:?}"
    );
    assert!(error.is_permanent());
    for shown in [error.to_string(), format!("{error:?}")] {
        assert!(!shown.contains(wrong), "{shown}");
    }
    assert!(sink.messages().is_empty());
}

#[test]
fn neither_the_mailer_nor_a_bad_url_shows_the_password() {
    let secret = "Sup3r-Secret";
    let mailer = Mailer::new(
        &format!("smtp://alerts:{secret}@mail.example.com:587?tls=required"),
        FROM,
        None,
    )
    .unwrap();
    let shown = format!("{mailer:?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("alerts:***@mail.example.com"), "{shown}");

    for bad in [
        format!("smtp://alerts:{secret}@mail.example.com:notaport"),
        format!("smtpx://alerts:{secret}@mail.example.com"),
        format!("smtp://alerts:{secret}@mail.example.com?tls=sometimes"),
    ] {
        let error = Mailer::new(&bad, FROM, None).unwrap_err();
        for shown in [error.to_string(), format!("{error:?}")] {
            assert!(!shown.contains(secret), "{shown}");
            assert!(shown.contains("***"), "{shown}");
        }
    }
}
