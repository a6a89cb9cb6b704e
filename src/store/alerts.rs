//! Alert events, their outbox and every delivery attempt.

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

#[derive(Debug, Clone)]
pub struct NewAlert {
    pub project_id: String,
    pub month: NaiveDate,
    pub threshold: i32,
    pub kind: &'static str,
    pub currency: String,
    pub spend: Decimal,
    pub budget: Decimal,
    pub burn_pct: Decimal,
    pub forecast: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct AlertRow {
    pub project_id: String,
    pub id: Uuid,
    pub month: NaiveDate,
    pub threshold: i32,
    pub kind: String,
    pub currency: String,
    pub spend: Decimal,
    pub budget: Decimal,
    pub burn_pct: Decimal,
    pub forecast: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
}

/// The alerts waiting in the outbox.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutboxBacklog {
    pub pending: i64,
    /// Since the oldest of them fired; 0 when none waits.
    pub oldest_age_seconds: f64,
}

pub async fn outbox_backlog(pool: &PgPool) -> sqlx::Result<OutboxBacklog> {
    let row = sqlx::query!(
        r#"SELECT count(*) AS "pending!",
                  coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8 AS "oldest_age_seconds!"
           FROM alert_deliveries WHERE state = 'pending'"#
    )
    .fetch_one(pool)
    .await?;
    Ok(OutboxBacklog {
        pending: row.pending,
        oldest_age_seconds: row.oldest_age_seconds,
    })
}

/// Fires an alert unless its `(project, month, threshold, kind)` already fired; `None` then.
/// Runs in the caller's transaction, so the event and its outbox row commit together.
pub async fn fire(conn: &mut PgConnection, alert: &NewAlert) -> sqlx::Result<Option<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, threshold, kind, currency, spend, \
                                   budget, burn_pct, forecast, fired_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT ON CONSTRAINT alert_events_once DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at",
        alert.project_id,
        Uuid::new_v4(),
        alert.month,
        alert.threshold,
        alert.kind,
        alert.currency,
        alert.spend,
        alert.budget,
        alert.burn_pct,
        alert.forecast,
        alert.fired_at,
    )
    .fetch_optional(conn)
    .await
}

/// Puts a fired alert in the outbox.
pub async fn enqueue_delivery(
    conn: &mut PgConnection,
    alert: &AlertRow,
    url: &str,
    body: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO alert_deliveries (project_id, alert_id, url, body) VALUES ($1, $2, $3, $4)",
        alert.project_id,
        alert.id,
        url,
        body,
    )
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(Debug, Clone)]
pub struct DueDelivery {
    pub project_id: String,
    pub alert_id: Uuid,
    pub url: String,
    pub body: String,
    pub attempts: i32,
    pub created_at: DateTime<Utc>,
}

/// Claims one due delivery for the caller's transaction. `SKIP LOCKED` lets several
/// replicas work the outbox at once without ever sending the same alert together.
pub async fn claim_due(conn: &mut PgConnection) -> sqlx::Result<Option<DueDelivery>> {
    sqlx::query_as!(
        DueDelivery,
        "SELECT project_id, alert_id, url, body, attempts, created_at FROM alert_deliveries \
         WHERE state = 'pending' AND next_attempt_at <= now() \
         ORDER BY next_attempt_at LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .fetch_optional(conn)
    .await
}

/// The result of one attempt.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub attempted_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: i32,
}

/// Records an attempt and what comes next: delivered, another try at `retry_at`, or given up.
pub async fn record_attempt(
    conn: &mut PgConnection,
    delivery: &DueDelivery,
    attempt: &Attempt,
    next: NextStep,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO alert_delivery_attempts \
             (project_id, alert_id, attempt, attempted_at, status_code, error, duration_ms) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        delivery.project_id,
        delivery.alert_id,
        delivery.attempts + 1,
        attempt.attempted_at,
        attempt.status_code,
        attempt.error,
        attempt.duration_ms,
    )
    .execute(&mut *conn)
    .await?;
    let (state, next_attempt_at) = match next {
        NextStep::Delivered => ("delivered", None),
        NextStep::RetryAt(at) => ("pending", Some(at)),
        NextStep::GiveUp => ("gave_up", None),
    };
    sqlx::query!(
        "UPDATE alert_deliveries SET attempts = attempts + 1, state = $3, \
             next_attempt_at = COALESCE($4, next_attempt_at), \
             finished_at = CASE WHEN $3 = 'pending' THEN NULL ELSE now() END \
         WHERE project_id = $1 AND alert_id = $2",
        delivery.project_id,
        delivery.alert_id,
        state,
        next_attempt_at,
    )
    .execute(conn)
    .await?;
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    Delivered,
    RetryAt(DateTime<Utc>),
    GiveUp,
}

#[derive(Debug, Clone)]
pub struct DeliveryRow {
    pub project_id: String,
    pub alert_id: Uuid,
    pub url: String,
    pub state: String,
    pub attempts: i32,
    pub next_attempt_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Clone)]
pub struct AttemptRow {
    pub project_id: String,
    pub alert_id: Uuid,
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: i32,
}

/// Alerts of the given projects (all when `None`), optionally of one month, newest first
/// (continuing before `before`), with their deliveries and attempts.
pub async fn list(
    pool: &PgPool,
    projects: Option<&[String]>,
    month: Option<NaiveDate>,
    before: Option<(DateTime<Utc>, Uuid)>,
    limit: i64,
) -> sqlx::Result<(Vec<AlertRow>, Vec<DeliveryRow>, Vec<AttemptRow>)> {
    let alerts = sqlx::query_as!(
        AlertRow,
        "SELECT project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                forecast, fired_at \
         FROM alert_events \
         WHERE ($1::text[] IS NULL OR project_id = ANY($1)) AND ($2::date IS NULL OR month = $2) \
           AND ($3::timestamptz IS NULL OR (fired_at, id) < ($3, $4)) \
         ORDER BY fired_at DESC, id DESC LIMIT $5",
        projects as Option<&[String]>,
        month,
        before.map(|(at, _)| at),
        before.map(|(_, id)| id),
        limit,
    )
    .fetch_all(pool)
    .await?;
    let projects: Vec<String> = alerts.iter().map(|a| a.project_id.clone()).collect();
    let ids: Vec<Uuid> = alerts.iter().map(|a| a.id).collect();
    let deliveries = sqlx::query_as!(
        DeliveryRow,
        "SELECT d.project_id, d.alert_id, d.url, d.state, d.attempts, d.next_attempt_at, \
                d.finished_at \
         FROM UNNEST($1::text[], $2::uuid[]) AS k(p, a) \
         JOIN alert_deliveries d ON d.project_id = k.p AND d.alert_id = k.a",
        &projects,
        &ids,
    )
    .fetch_all(pool)
    .await?;
    let attempts = sqlx::query_as!(
        AttemptRow,
        "SELECT t.project_id, t.alert_id, t.attempt, t.attempted_at, t.status_code, t.error, \
                t.duration_ms \
         FROM UNNEST($1::text[], $2::uuid[]) AS k(p, a) \
         JOIN alert_delivery_attempts t ON t.project_id = k.p AND t.alert_id = k.a \
         ORDER BY t.attempt",
        &projects,
        &ids,
    )
    .fetch_all(pool)
    .await?;
    Ok((alerts, deliveries, attempts))
}

/// Alerts fired for one project and month, for the burn endpoint.
pub async fn fired_in_month(
    pool: &PgPool,
    project: &str,
    month: NaiveDate,
) -> sqlx::Result<Vec<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "SELECT project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                forecast, fired_at \
         FROM alert_events WHERE project_id = $1 AND month = $2 \
         ORDER BY kind, threshold",
        project,
        month,
    )
    .fetch_all(pool)
    .await
}
