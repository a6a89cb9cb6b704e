//! Sending one message to one channel: rendered in the channel's format (Slack, Microsoft
//! Teams, PagerDuty, email, or the signed webhook document), posted or mailed, and the
//! receiver's answer told apart into delivered, worth retrying, or refused for good.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::domain::channel::{ChannelKind, address_list};
use crate::exports::notify::{self, Notice};
use crate::ledger::LedgerResult;
use crate::ledger::channels::{self, ChannelRow, Message};

/// The header carrying `sha256=<hex HMAC-SHA256 of the body>`.
pub const SIGNATURE_HEADER: &str = "X-Taskledger-Signature";

/// `sha256=` and the hex HMAC-SHA256 of `body` under `secret`.
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// What the receiver answered to a message it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sent {
    /// The HTTP status, or the mail server's reply code.
    pub status_code: Option<i32>,
    /// The start of what it answered.
    pub answer: String,
}

/// Why a message was not delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failed {
    pub status_code: Option<i32>,
    pub error: String,
    /// The receiver refused the message itself (a Slack `invalid_payload`, a revoked URL,
    /// an unknown mailbox): sending it again would be refused again.
    pub permanent: bool,
}

/// The outcome of one attempt and how long it took.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub attempted_at: DateTime<Utc>,
    pub duration: Duration,
    pub result: Result<Sent, Failed>,
}

/// How messages leave: an HTTP client, the mail server when one is configured, the public
/// URL that links point under, and the secret that signs webhook documents.
pub struct Notifier {
    http: reqwest::Client,
    mailer: Option<super::mail::Mailer>,
    public_url: Option<String>,
    webhook_secret: Option<String>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("mailer", &self.mailer)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

/// The most of a receiver's answer kept.
const MAX_ANSWER: usize = 500;

impl Notifier {
    pub fn new(
        mailer: Option<super::mail::Mailer>,
        public_url: Option<String>,
        webhook_secret: Option<String>,
        timeout: Duration,
    ) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .user_agent(concat!("taskledger/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            http,
            mailer,
            public_url: public_url.map(|url| url.trim_end_matches('/').to_owned()),
            webhook_secret,
        })
    }

    /// A notifier that mails nothing and links nowhere, for tests and one-off commands.
    pub fn unconfigured() -> Self {
        Self::new(None, None, None, Duration::from_secs(10)).expect("a default HTTP client")
    }

    /// The notice with its link under the public URL, or without a link when there is none.
    fn linked(&self, notice: &Notice) -> Notice {
        let mut notice = notice.clone();
        notice.link = match (&self.public_url, &notice.link) {
            (Some(base), Some(path)) if path.starts_with('/') => Some(format!("{base}{path}")),
            _ => None,
        };
        notice
    }

    /// Sends a test message to channel `id` now, outside the outbox, and says what its
    /// receiver answered.
    pub async fn test(
        &self,
        pool: &sqlx::PgPool,
        id: uuid::Uuid,
        now: DateTime<Utc>,
    ) -> LedgerResult<Outcome> {
        let channel = channels::get(pool, id).await?;
        let message = Message {
            notice: channels::test_notice(&channel, now),
            event: None,
            attachment: None,
        };
        Ok(self.send(&channel, &message).await)
    }

    /// Sends `message` to `channel` once.
    pub async fn send(&self, channel: &ChannelRow, message: &Message) -> Outcome {
        let attempted_at = Utc::now();
        let started = Instant::now();
        let notice = self.linked(&message.notice);
        let result = match channel.kind {
            ChannelKind::Slack => {
                self.post(&channel.target, &notify::slack(&notice), None)
                    .await
            }
            ChannelKind::Teams => {
                self.post(&channel.target, &notify::teams(&notice), None)
                    .await
            }
            ChannelKind::PagerDuty => {
                let key = channel.routing_key.as_deref().unwrap_or_default();
                self.post(&channel.target, &notify::pagerduty(&notice, key), None)
                    .await
            }
            ChannelKind::Webhook => {
                let document = match &message.event {
                    Some(event) => event.clone(),
                    None => serde_json::to_value(&notice).unwrap_or_default(),
                };
                self.post(&channel.target, &document, Some(notice.id)).await
            }
            ChannelKind::Email => self.mail(channel, &notice, message).await,
        };
        Outcome {
            attempted_at,
            duration: started.elapsed(),
            result,
        }
    }

    async fn post(
        &self,
        url: &str,
        document: &serde_json::Value,
        signed_as: Option<uuid::Uuid>,
    ) -> Result<Sent, Failed> {
        let body = serde_json::to_vec(document).map_err(|error| Failed {
            status_code: None,
            error: format!("the message could not be written: {error}"),
            permanent: true,
        })?;
        let mut request = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json");
        if let Some(id) = signed_as {
            if let Some(secret) = &self.webhook_secret {
                request = request.header(SIGNATURE_HEADER, sign(secret, &body));
            }
            request = request.header("X-Taskledger-Alert-Id", id.to_string());
        }
        let response = request.body(body).send().await.map_err(|error| Failed {
            status_code: None,
            error: describe(error),
            permanent: false,
        })?;
        let status = response.status();
        let answer: String = response
            .text()
            .await
            .unwrap_or_default()
            .chars()
            .take(MAX_ANSWER)
            .collect();
        let code = Some(i32::from(status.as_u16()));
        if status.is_success() {
            Ok(Sent {
                status_code: code,
                answer,
            })
        } else {
            let retry = status.is_server_error()
                || status == reqwest::StatusCode::REQUEST_TIMEOUT
                || status == reqwest::StatusCode::TOO_MANY_REQUESTS;
            Err(Failed {
                status_code: code,
                error: match answer.trim() {
                    "" => format!("the receiver answered {status}"),
                    said => format!("the receiver answered {status}: {said}"),
                },
                permanent: !retry,
            })
        }
    }

    async fn mail(
        &self,
        channel: &ChannelRow,
        notice: &Notice,
        message: &Message,
    ) -> Result<Sent, Failed> {
        let Some(mailer) = &self.mailer else {
            return Err(Failed {
                status_code: None,
                error: "no mail server is configured (TASKLEDGER_SMTP_URL)".to_owned(),
                permanent: false,
            });
        };
        let email = notify::email(notice);
        let attachments = match &message.attachment {
            Some(attachment) => vec![super::mail::Attachment {
                filename: attachment.filename.clone(),
                content_type: attachment.content_type.clone(),
                bytes: attachment.bytes().map_err(|error| Failed {
                    status_code: None,
                    error: format!("the attachment cannot be read: {error}"),
                    permanent: true,
                })?,
            }],
            None => Vec::new(),
        };
        let to = address_list(&channel.target);
        let mail = super::mail::Mail {
            to: &to,
            subject: &email.subject,
            text: &email.text,
            html: &email.html,
            attachments: &attachments,
        };
        match mailer.send(&mail).await {
            Ok(reply) => Ok(Sent {
                status_code: reply_code(&reply),
                answer: reply.chars().take(MAX_ANSWER).collect(),
            }),
            Err(error) => Err(Failed {
                status_code: None,
                permanent: error.is_permanent(),
                error: error.to_string(),
            }),
        }
    }
}

/// The three-digit code a mail server's reply starts with.
fn reply_code(reply: &str) -> Option<i32> {
    reply.get(..3).and_then(|code| code.parse().ok())
}

/// What went wrong with a request, for the delivery's record, which finance readers see:
/// never the receiver's URL, whose path often carries the secret.
pub fn describe(error: reqwest::Error) -> String {
    if error.is_timeout() {
        return "the receiver did not answer in time".to_owned();
    }
    if error.is_connect() {
        return "cannot connect to the receiver".to_owned();
    }
    let error = error.without_url();
    let mut text = format!("request failed: {error}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
