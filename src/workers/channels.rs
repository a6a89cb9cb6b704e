//! Delivers queued messages to notification channels: rendered in each channel's format,
//! retried with exponential back-off and jitter while the receiver is down or busy, given up
//! at once when it refuses the message itself, and safe with several replicas working the
//! same outbox.

use std::future::Future;
use std::sync::Arc;

use sqlx::PgPool;

use crate::ledger::alerting::{Attempt, NextStep};
use crate::ledger::channels::{self, DueMessage, Message};
use crate::ledger::notify::Notifier;
use crate::workers::webhooks::{DeliveryPolicy, count_attempt, work_outbox};

pub struct ChannelDeliveries {
    pool: PgPool,
    notifier: Arc<Notifier>,
    policy: DeliveryPolicy,
}

impl ChannelDeliveries {
    pub fn new(pool: PgPool, notifier: Arc<Notifier>, policy: DeliveryPolicy) -> Self {
        Self {
            pool,
            notifier,
            policy,
        }
    }

    /// Works the outbox until nothing is due; returns how many attempts were made.
    pub async fn deliver_due(&self) -> anyhow::Result<usize> {
        let mut attempts = 0;
        while self.deliver_next().await? {
            attempts += 1;
        }
        Ok(attempts)
    }

    /// Makes one attempt at the message due first; false when nothing is due.
    async fn deliver_next(&self) -> anyhow::Result<bool> {
        let Some((due, next)) = channels::deliver_next(&self.pool, async |due, message| {
            self.attempt(due, message).await
        })
        .await?
        else {
            return Ok(false);
        };
        if next == NextStep::GiveUp {
            tracing::warn!(message = %due.message_id, channel = %due.channel.id, "gave up delivering a message to a channel");
        }
        count_attempt(next);
        Ok(true)
    }

    async fn attempt(&self, due: &DueMessage, message: &Message) -> (Attempt, NextStep) {
        let outcome = self.notifier.send(&due.channel, message).await;
        let duration_ms = outcome.duration.as_millis().min(i32::MAX as u128) as i32;
        let (status_code, error, next) = match outcome.result {
            Ok(sent) => (sent.status_code, None, NextStep::Delivered),
            Err(failed) => {
                let next = match failed.permanent {
                    true => NextStep::GiveUp,
                    false => self.policy.after_failure(
                        due.attempts,
                        outcome.attempted_at,
                        due.created_at,
                    ),
                };
                (failed.status_code, Some(failed.error), next)
            }
        };
        (
            Attempt {
                attempted_at: outcome.attempted_at,
                status_code,
                error,
                duration_ms,
            },
            next,
        )
    }

    /// Delivers until `shutdown` completes, finishing an attempt under way first.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        work_outbox("channel", self.policy.poll_interval, shutdown, || {
            self.deliver_next()
        })
        .await
    }
}
