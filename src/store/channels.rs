//! Notification channels and their outbox.

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::channel::{ChannelKind, NewChannel};

#[derive(Debug, Clone)]
pub struct ChannelRow {
    pub id: Uuid,
    pub name: String,
    pub kind: ChannelKind,
    pub target: String,
    pub routing_key: Option<String>,
    pub projects: Option<Vec<String>>,
    pub alert_kinds: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
}

/// `query!` of `$head`, then a channel's columns, then `$tail` (literals), each row a
/// [`ChannelRow`].
macro_rules! with_channel_columns {
    ($head:literal, $tail:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head
                + "id, name, kind, target, routing_key, projects, alert_kinds, created_at"
                + $tail
            $(, $arg)*
        )
        .try_map(|r| {
            Ok(ChannelRow {
                id: r.id,
                name: r.name,
                kind: super::decoded("kind", r.kind)?,
                target: r.target,
                routing_key: r.routing_key,
                projects: r.projects,
                alert_kinds: r.alert_kinds,
                created_at: r.created_at,
            })
        })
    };
}

pub async fn insert(conn: &mut PgConnection, channel: &NewChannel) -> sqlx::Result<ChannelRow> {
    with_channel_columns!(
        "INSERT INTO channels (id, name, kind, target, routing_key, projects, alert_kinds) \
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING ",
        "",
        Uuid::new_v4(),
        channel.name,
        channel.kind.as_str(),
        channel.target,
        channel.routing_key,
        channel.projects.as_deref(),
        channel.alert_kinds.as_deref(),
    )
    .fetch_one(conn)
    .await
}

/// The channels not deleted, oldest first.
pub async fn active(conn: &mut PgConnection) -> sqlx::Result<Vec<ChannelRow>> {
    with_channel_columns!(
        "SELECT ",
        " FROM channels WHERE deleted_at IS NULL ORDER BY created_at, id"
    )
    .fetch_all(conn)
    .await
}

/// One channel not deleted.
pub async fn get(pool: &PgPool, id: Uuid) -> sqlx::Result<Option<ChannelRow>> {
    with_channel_columns!(
        "SELECT ",
        " FROM channels WHERE id = $1 AND deleted_at IS NULL",
        id
    )
    .fetch_optional(pool)
    .await
}

/// Marks a channel deleted and cancels what it still had to deliver (call it in a
/// transaction); the channel as it was, `None` when there was no such channel.
pub async fn delete(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<ChannelRow>> {
    let deleted = with_channel_columns!(
        "UPDATE channels SET deleted_at = now() WHERE id = $1 AND deleted_at IS NULL \
         RETURNING ",
        "",
        id
    )
    .fetch_optional(&mut *conn)
    .await?;
    sqlx::query!(
        "UPDATE channel_deliveries SET state = 'cancelled', finished_at = now() \
         WHERE channel_id = $1 AND state = 'pending'",
        id
    )
    .execute(&mut *conn)
    .await?;
    Ok(deleted)
}

/// A message to queue for a channel.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub project_id: String,
    pub message_id: Uuid,
    pub channel_id: Uuid,
    pub body: Value,
}

/// Queues messages, each once per channel: a message queued again for the same channel is
/// left as it was.
pub async fn enqueue(conn: &mut PgConnection, outgoing: &[Outgoing]) -> sqlx::Result<()> {
    if outgoing.is_empty() {
        return Ok(());
    }
    let projects: Vec<&str> = outgoing.iter().map(|o| o.project_id.as_str()).collect();
    let messages: Vec<Uuid> = outgoing.iter().map(|o| o.message_id).collect();
    let channels: Vec<Uuid> = outgoing.iter().map(|o| o.channel_id).collect();
    let bodies: Vec<Value> = outgoing.iter().map(|o| o.body.clone()).collect();
    sqlx::query!(
        "INSERT INTO channel_deliveries (project_id, message_id, channel_id, body) \
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::uuid[], $4::jsonb[]) \
         ON CONFLICT DO NOTHING",
        &projects as &[&str],
        &messages,
        &channels,
        &bodies,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Cancels the pending messages of deleted channels: those a transaction queued while it
/// raced the channel's delete (which cancelled the ones committed before it).
pub async fn cancel_for_deleted(conn: &mut PgConnection) -> sqlx::Result<u64> {
    Ok(sqlx::query!(
        "UPDATE channel_deliveries d SET state = 'cancelled', finished_at = now() \
         FROM channels c \
         WHERE c.id = d.channel_id AND c.deleted_at IS NOT NULL AND d.state = 'pending'"
    )
    .execute(conn)
    .await?
    .rows_affected())
}

/// A queued message claimed for an attempt, with the channel it goes to.
#[derive(Debug, Clone)]
pub struct DueMessage {
    pub project_id: String,
    pub message_id: Uuid,
    pub body: Value,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
    pub channel: ChannelRow,
}

/// Claims one due message of a channel not deleted, for the caller's transaction, the way
/// `alerts::claim_due` claims a webhook delivery: the earliest due messages are read without
/// a lock, then locked one at a time by their key with `SKIP LOCKED`, so several replicas
/// work the outbox without sending a message twice at once, and each lock stays on the
/// project's shard when the table is distributed.
pub async fn claim_due(conn: &mut PgConnection) -> sqlx::Result<Option<DueMessage>> {
    let candidates = sqlx::query!(
        "SELECT d.project_id, d.message_id, d.channel_id \
         FROM channel_deliveries d JOIN channels c ON c.id = d.channel_id \
         WHERE d.state = 'pending' AND d.next_attempt_at <= now() AND c.deleted_at IS NULL \
         ORDER BY d.next_attempt_at, d.project_id, d.message_id, d.channel_id LIMIT $1",
        super::alerts::CLAIM_CANDIDATES,
    )
    .fetch_all(&mut *conn)
    .await?;
    for candidate in candidates {
        let Some(row) = sqlx::query!(
            "SELECT project_id, message_id, body, attempts, created_at FROM channel_deliveries \
             WHERE project_id = $1 AND message_id = $2 AND channel_id = $3 \
               AND state = 'pending' AND next_attempt_at <= now() \
             FOR UPDATE SKIP LOCKED",
            candidate.project_id,
            candidate.message_id,
            candidate.channel_id,
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            continue;
        };
        // A channel deleted since the candidates were read is skipped; its delete cancels
        // the message once this transaction lets go of it.
        let Some(channel) = with_channel_columns!(
            "SELECT ",
            " FROM channels WHERE id = $1 AND deleted_at IS NULL",
            candidate.channel_id
        )
        .fetch_optional(&mut *conn)
        .await?
        else {
            continue;
        };
        return Ok(Some(DueMessage {
            project_id: row.project_id,
            message_id: row.message_id,
            body: row.body,
            attempts: row.attempts,
            created_at: row.created_at,
            channel,
        }));
    }
    Ok(None)
}

/// Records an attempt at a claimed message and what comes next.
pub async fn record_attempt(
    conn: &mut PgConnection,
    message: &DueMessage,
    attempt: &super::alerts::Attempt,
    next: super::alerts::NextStep,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO channel_delivery_attempts \
             (project_id, message_id, channel_id, attempt, attempted_at, status_code, error, \
              duration_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        message.project_id,
        message.message_id,
        message.channel.id,
        message.attempts + 1,
        attempt.attempted_at,
        attempt.status_code,
        attempt.error,
        attempt.duration_ms,
    )
    .execute(&mut *conn)
    .await?;
    let (state, next_attempt_at) = next.stored();
    sqlx::query!(
        "UPDATE channel_deliveries SET attempts = attempts + 1, state = $4, \
             next_attempt_at = COALESCE($5, next_attempt_at), finished_at = $6 \
         WHERE project_id = $1 AND message_id = $2 AND channel_id = $3",
        message.project_id,
        message.message_id,
        message.channel.id,
        state,
        next_attempt_at,
        super::alerts::finished_at(state, attempt),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A message's delivery to one channel, with the channel's name and kind.
#[derive(Debug, Clone)]
pub struct ChannelDeliveryRow {
    pub project_id: String,
    pub message_id: Uuid,
    pub channel_id: Uuid,
    pub channel_name: String,
    pub channel_kind: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// An attempt at a message's delivery to a channel.
#[derive(Debug, Clone)]
pub struct ChannelAttemptRow {
    pub project_id: String,
    pub message_id: Uuid,
    pub channel_id: Uuid,
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: i32,
}

/// The channel deliveries of the given messages `(project, message id)`, with their
/// attempts in order.
pub async fn deliveries_of(
    pool: &PgPool,
    messages: &[(String, Uuid)],
) -> sqlx::Result<(Vec<ChannelDeliveryRow>, Vec<ChannelAttemptRow>)> {
    let projects: Vec<&str> = messages.iter().map(|(p, _)| p.as_str()).collect();
    let ids: Vec<Uuid> = messages.iter().map(|(_, id)| *id).collect();
    let deliveries = sqlx::query_as!(
        ChannelDeliveryRow,
        "SELECT d.project_id, d.message_id, d.channel_id, c.name AS channel_name, \
                c.kind AS channel_kind, d.state, d.attempts, d.next_attempt_at, d.created_at, \
                d.finished_at \
         FROM UNNEST($1::text[], $2::uuid[]) AS k(p, m) \
         JOIN channel_deliveries d ON d.project_id = k.p AND d.message_id = k.m \
         JOIN channels c ON c.id = d.channel_id \
         ORDER BY c.created_at, c.id",
        &projects as &[&str],
        &ids,
    )
    .fetch_all(pool)
    .await?;
    with_attempts(pool, deliveries).await
}

/// A channel's latest deliveries, newest first, with their attempts.
pub async fn recent_of_channel(
    pool: &PgPool,
    channel: Uuid,
    limit: i64,
) -> sqlx::Result<(Vec<ChannelDeliveryRow>, Vec<ChannelAttemptRow>)> {
    let deliveries = sqlx::query_as!(
        ChannelDeliveryRow,
        "SELECT d.project_id, d.message_id, d.channel_id, c.name AS channel_name, \
                c.kind AS channel_kind, d.state, d.attempts, d.next_attempt_at, d.created_at, \
                d.finished_at \
         FROM channel_deliveries d JOIN channels c ON c.id = d.channel_id \
         WHERE d.channel_id = $1 \
         ORDER BY d.created_at DESC, d.message_id DESC LIMIT $2",
        channel,
        limit,
    )
    .fetch_all(pool)
    .await?;
    with_attempts(pool, deliveries).await
}

/// The deliveries with every attempt made at them, in order.
async fn with_attempts(
    pool: &PgPool,
    deliveries: Vec<ChannelDeliveryRow>,
) -> sqlx::Result<(Vec<ChannelDeliveryRow>, Vec<ChannelAttemptRow>)> {
    let projects: Vec<&str> = deliveries.iter().map(|d| d.project_id.as_str()).collect();
    let messages: Vec<Uuid> = deliveries.iter().map(|d| d.message_id).collect();
    let channels: Vec<Uuid> = deliveries.iter().map(|d| d.channel_id).collect();
    let attempts = sqlx::query_as!(
        ChannelAttemptRow,
        "SELECT t.project_id, t.message_id, t.channel_id, t.attempt, t.attempted_at, \
                t.status_code, t.error, t.duration_ms \
         FROM UNNEST($1::text[], $2::uuid[], $3::uuid[]) AS k(p, m, c) \
         JOIN channel_delivery_attempts t \
           ON t.project_id = k.p AND t.message_id = k.m AND t.channel_id = k.c \
         ORDER BY t.attempt",
        &projects as &[&str],
        &messages,
        &channels,
    )
    .fetch_all(pool)
    .await?;
    Ok((deliveries, attempts))
}
