//! Delivers fired alerts from the outbox to each project's webhook: signed, retried with
//! exponential back-off and jitter until a 2xx or a final give-up, safe with several
//! replicas working the same outbox.

use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use rand::Rng;
use sqlx::PgPool;

use crate::ledger::alerting::{self, Attempt, DueDelivery, NextStep};
use crate::ledger::instruments::{ALERT_DELIVERIES, ALERT_DELIVERY_FAILURES};
use crate::ledger::notify;

pub use crate::ledger::notify::{SIGNATURE_HEADER, sign};

#[derive(Debug, Clone)]
pub struct DeliveryPolicy {
    /// Wait before the second attempt; each later wait doubles, up to `max_retry`.
    pub first_retry: Duration,
    pub max_retry: Duration,
    /// After this long since the alert fired, the delivery is given up (and recorded so).
    pub give_up_after: Duration,
    pub request_timeout: Duration,
    /// How often the outbox is checked when it was empty.
    pub poll_interval: Duration,
}

impl Default for DeliveryPolicy {
    fn default() -> Self {
        Self {
            first_retry: Duration::from_secs(5),
            max_retry: Duration::from_secs(3600),
            give_up_after: Duration::from_secs(72 * 3600),
            request_timeout: Duration::from_secs(10),
            poll_interval: Duration::from_secs(1),
        }
    }
}

impl DeliveryPolicy {
    /// What follows a failed attempt at a message queued at `created_at` that had failed
    /// `attempts_before` times: another try after the back-off, or giving up once that try
    /// would come after `give_up_after`.
    pub fn after_failure(
        &self,
        attempts_before: i32,
        attempted_at: DateTime<Utc>,
        created_at: DateTime<Utc>,
    ) -> NextStep {
        let failed_attempts = u32::try_from(attempts_before + 1).unwrap_or(u32::MAX);
        let retry_at = attempted_at
            + chrono::Duration::from_std(self.backoff(failed_attempts))
                .unwrap_or(chrono::Duration::MAX);
        let deadline = created_at
            + chrono::Duration::from_std(self.give_up_after).unwrap_or(chrono::Duration::MAX);
        if retry_at > deadline {
            NextStep::GiveUp
        } else {
            NextStep::RetryAt(retry_at)
        }
    }

    /// The wait after `attempts` failed attempts: exponential, capped, with "equal jitter"
    /// (half fixed, half random) so that receivers coming back are not hit by a thundering
    /// herd.
    pub fn backoff(&self, attempts: u32) -> Duration {
        let exponential = self
            .first_retry
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(20))
            .min(self.max_retry);
        let half = exponential / 2;
        half + half.mul_f64(rand::thread_rng().r#gen::<f64>())
    }
}

pub struct Webhooks {
    pool: PgPool,
    client: reqwest::Client,
    secret: String,
    policy: DeliveryPolicy,
}

impl Webhooks {
    pub fn new(pool: PgPool, secret: String, policy: DeliveryPolicy) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .timeout(policy.request_timeout)
            .user_agent(concat!("taskledger/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self {
            pool,
            client,
            secret,
            policy,
        })
    }

    /// Works the outbox until nothing is due; returns how many attempts were made.
    pub async fn deliver_due(&self) -> anyhow::Result<usize> {
        let mut attempts = 0;
        while self.deliver_next().await? {
            attempts += 1;
        }
        Ok(attempts)
    }

    /// Makes one attempt at the delivery due first; false when nothing is due.
    async fn deliver_next(&self) -> anyhow::Result<bool> {
        let Some((delivery, next)) =
            alerting::deliver_next(&self.pool, async |delivery| self.attempt(delivery).await)
                .await?
        else {
            return Ok(false);
        };
        if next == NextStep::GiveUp {
            tracing::warn!(alert = %delivery.alert_id, url = %delivery.url, "gave up delivering an alert");
        }
        count_attempt(next);
        Ok(true)
    }

    async fn attempt(&self, delivery: &DueDelivery) -> (Attempt, NextStep) {
        let attempted_at = Utc::now();
        let started = Instant::now();
        let response = self
            .client
            .post(&delivery.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(
                SIGNATURE_HEADER,
                sign(&self.secret, delivery.body.as_bytes()),
            )
            .header("X-Taskledger-Alert-Id", delivery.alert_id.to_string())
            .body(delivery.body.clone())
            .send()
            .await;
        let duration_ms = started.elapsed().as_millis().min(i32::MAX as u128) as i32;
        let (status_code, error) = match response {
            Ok(response) if response.status().is_success() => {
                (Some(i32::from(response.status().as_u16())), None)
            }
            Ok(response) => (
                Some(i32::from(response.status().as_u16())),
                Some(format!("the receiver answered {}", response.status())),
            ),
            Err(error) => (None, Some(notify::describe(error))),
        };
        let next = match error {
            None => NextStep::Delivered,
            Some(_) => {
                self.policy
                    .after_failure(delivery.attempts, attempted_at, delivery.created_at)
            }
        };
        (
            Attempt {
                attempted_at,
                status_code,
                error,
                duration_ms,
            },
            next,
        )
    }

    /// Delivers until `shutdown` completes. An attempt under way is finished first (it is
    /// bounded by the request timeout): stopping halfway would leave a delivery the receiver
    /// got recorded as not made, to be sent again.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        work_outbox("alert", self.policy.poll_interval, shutdown, || {
            self.deliver_next()
        })
        .await
    }
}

/// Counts an attempt in `taskledger_alert_deliveries_total` by what came of it, and a failed
/// one in `taskledger_alert_delivery_failures_total`.
pub fn count_attempt(next: NextStep) {
    let result = match next {
        NextStep::Delivered => "delivered",
        NextStep::RetryAt(_) => "retry",
        NextStep::GiveUp => "gave_up",
    };
    if next != NextStep::Delivered {
        metrics::counter!(ALERT_DELIVERY_FAILURES).increment(1);
    }
    metrics::counter!(ALERT_DELIVERIES, "result" => result).increment(1);
}

/// Works an outbox until `shutdown` completes: one attempt after another while something is
/// due, then a look every `poll_interval`. An attempt under way is finished first.
pub async fn work_outbox<F, Fut>(
    what: &'static str,
    poll_interval: Duration,
    shutdown: impl Future<Output = ()>,
    mut deliver_next: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    tokio::pin!(shutdown);
    loop {
        let more_due = match deliver_next().await {
            Ok(more_due) => more_due,
            Err(error) => {
                tracing::error!(error = ?error, outbox = what, "delivery failed; retrying");
                false
            }
        };
        let pause = if more_due {
            Duration::ZERO
        } else {
            poll_interval
        };
        tokio::select! {
            biased;
            () = &mut shutdown => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_hmac_sha256_hex() {
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_a_cap() {
        let policy = DeliveryPolicy {
            first_retry: Duration::from_secs(4),
            max_retry: Duration::from_secs(60),
            ..DeliveryPolicy::default()
        };
        for _ in 0..100 {
            let first = policy.backoff(1);
            assert!(first >= Duration::from_secs(2) && first <= Duration::from_secs(4));
            let third = policy.backoff(3);
            assert!(third >= Duration::from_secs(8) && third <= Duration::from_secs(16));
            let capped = policy.backoff(30);
            assert!(capped >= Duration::from_secs(30) && capped <= Duration::from_secs(60));
        }
    }
}
