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

/// An alert event: a budget alert (`actual`, `forecast`) has its threshold, spend, budget and
/// burn; an idle-GPU alert (`idle_gpu`) has the record it judged and what it cost.
#[derive(Debug, Clone)]
pub struct AlertRow {
    pub project_id: String,
    pub id: Uuid,
    pub month: NaiveDate,
    pub threshold: Option<i32>,
    pub kind: String,
    pub currency: String,
    pub spend: Option<Decimal>,
    pub budget: Option<Decimal>,
    pub burn_pct: Option<Decimal>,
    pub forecast: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
    pub task_id: Option<String>,
    pub attempt: Option<i32>,
    pub gpu_model: Option<String>,
    pub gpu_count: Option<Decimal>,
    pub mig_profile: Option<String>,
    pub gpu_seconds_held: Option<Decimal>,
    pub idle_measure: Option<String>,
    pub idle_value: Option<Decimal>,
    pub idle_threshold: Option<Decimal>,
    pub min_gpu_hours: Option<Decimal>,
    pub cost: Option<Decimal>,
    pub node: Option<String>,
    pub pool_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub cost_per_hour: Option<Decimal>,
    /// The route (label key and value) of a route's budget alert or of a retry storm.
    pub route_key: Option<String>,
    pub route_value: Option<String>,
    /// The ledger hour of a retry storm judged on failed spend.
    pub storm_hour: Option<DateTime<Utc>>,
    /// A retry storm's cap (attempts per task, or failed spend per hour) and what went
    /// beyond it (the attempt, or the hour's failed spend).
    pub cap: Option<Decimal>,
    pub observed: Option<Decimal>,
    /// An efficiency regression's workload and unit, and what it found (see
    /// `ledger::regressions::RegressionAlert`).
    pub workload: Option<String>,
    pub output_unit: Option<String>,
    pub regression: Option<serde_json::Value>,
}

/// A zombie-capacity alert to fire for one idle stretch of a node.
#[derive(Debug, Clone)]
pub struct NewZombieAlert {
    pub project_id: String,
    /// The ledger month holding the stretch's start.
    pub month: NaiveDate,
    pub currency: String,
    pub node: String,
    pub pool_id: String,
    pub since: DateTime<Utc>,
    pub gpu_model: String,
    pub gpus: i32,
    /// The GPU-seconds idle so far.
    pub idle_gpu_seconds: Decimal,
    pub cost_per_hour: Option<Decimal>,
    pub cost_so_far: Option<Decimal>,
    pub fired_at: DateTime<Utc>,
}

/// Fires a zombie-capacity alert unless one fired for the same node and start; `None` then.
pub async fn fire_zombie(
    conn: &mut PgConnection,
    alert: &NewZombieAlert,
) -> sqlx::Result<Option<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, kind, currency, fired_at, node, \
                                   pool_id, since, gpu_model, gpu_count, gpu_seconds_held, \
                                   cost_per_hour, cost) \
         VALUES ($1, $2, $3, 'zombie_capacity', $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         ON CONFLICT (project_id, node, since) WHERE kind = 'zombie_capacity' DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
        alert.project_id,
        Uuid::new_v4(),
        alert.month,
        alert.currency,
        alert.fired_at,
        alert.node,
        alert.pool_id,
        alert.since,
        alert.gpu_model,
        Decimal::from(alert.gpus),
        alert.idle_gpu_seconds,
        alert.cost_per_hour,
        alert.cost_so_far,
    )
    .fetch_optional(conn)
    .await
}

/// An idle-GPU alert to fire for one record, once per task.
#[derive(Debug, Clone)]
pub struct NewIdleGpuAlert {
    pub project_id: String,
    pub task_id: String,
    pub attempt: i32,
    /// The ledger month holding the record's end.
    pub month: NaiveDate,
    pub currency: String,
    pub gpu_model: String,
    pub gpu_count: Decimal,
    pub mig_profile: Option<String>,
    pub gpu_seconds_held: Decimal,
    pub idle_measure: &'static str,
    pub idle_value: Decimal,
    pub idle_threshold: Decimal,
    pub min_gpu_hours: Decimal,
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
         ON CONFLICT (project_id, month, threshold, kind) WHERE route_key IS NULL DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
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

/// Fires a route's budget alert unless its `(project, route, month, threshold, kind)` already
/// fired; `None` then. Runs in the caller's transaction, as [`fire`] does.
pub async fn fire_route_budget(
    conn: &mut PgConnection,
    alert: &NewAlert,
    (key, value): (&str, &str),
) -> sqlx::Result<Option<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, threshold, kind, currency, spend, \
                                   budget, burn_pct, forecast, fired_at, route_key, route_value) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13) \
         ON CONFLICT (project_id, route_key, route_value, month, threshold, kind) \
             WHERE kind IN ('actual', 'forecast') AND route_key IS NOT NULL DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
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
        key,
        value,
    )
    .fetch_optional(conn)
    .await
}

/// The route, month and currency every retry storm of one evaluation shares.
#[derive(Debug, Clone, Copy)]
pub struct StormOf<'a> {
    pub project_id: &'a str,
    pub route: (&'a str, &'a str),
    /// The ledger month evaluated: holding the attempt's end, or the hour.
    pub month: NaiveDate,
    pub currency: &'a str,
    pub fired_at: DateTime<Utc>,
}

/// Fires a `retry_storm` alert for each `(task, attempt)` whose task has none yet for the
/// route, with the attempts cap. The unique index `alert_events_retry_storm_task_once`
/// decides: of two transactions firing for the same task, the second waits for the first and
/// then inserts nothing.
pub async fn fire_retry_storm_tasks(
    conn: &mut PgConnection,
    of: StormOf<'_>,
    cap: i32,
    attempts: &[(String, i32)],
) -> sqlx::Result<Vec<AlertRow>> {
    if attempts.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = attempts.iter().map(|_| Uuid::new_v4()).collect();
    let tasks: Vec<String> = attempts.iter().map(|(task, _)| task.clone()).collect();
    let numbers: Vec<i32> = attempts.iter().map(|(_, attempt)| *attempt).collect();
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, kind, currency, fired_at, route_key, \
                                   route_value, task_id, attempt, cap, observed) \
         SELECT $1, k.id, $2, 'retry_storm', $3, $4, $5, $6, k.task_id, k.attempt, $7, k.attempt \
         FROM UNNEST($8::uuid[], $9::text[], $10::int[]) WITH ORDINALITY \
              AS k(id, task_id, attempt, position) \
         ORDER BY k.position \
         ON CONFLICT (project_id, route_key, route_value, task_id) \
             WHERE kind = 'retry_storm' AND task_id IS NOT NULL DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
        of.project_id,
        of.month,
        of.currency,
        of.fired_at,
        of.route.0,
        of.route.1,
        Decimal::from(cap),
        &ids,
        &tasks,
        &numbers,
    )
    .fetch_all(conn)
    .await
}

/// Fires a `retry_storm` alert for each `(ledger hour, failed spend)` that has none yet for
/// the route, with the failed-spend cap. The unique index
/// `alert_events_retry_storm_hour_once` keeps it to one per hour, as for tasks.
pub async fn fire_retry_storm_hours(
    conn: &mut PgConnection,
    of: StormOf<'_>,
    cap: Decimal,
    hours: &[(DateTime<Utc>, Decimal)],
) -> sqlx::Result<Vec<AlertRow>> {
    if hours.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = hours.iter().map(|_| Uuid::new_v4()).collect();
    let starts: Vec<DateTime<Utc>> = hours.iter().map(|(hour, _)| *hour).collect();
    let spends: Vec<Decimal> = hours.iter().map(|(_, spend)| *spend).collect();
    sqlx::query_as!(
        AlertRow,
        "INSERT INTO alert_events (project_id, id, month, kind, currency, fired_at, route_key, \
                                   route_value, storm_hour, cap, observed) \
         SELECT $1, k.id, $2, 'retry_storm', $3, $4, $5, $6, k.hour, $7, k.spend \
         FROM UNNEST($8::uuid[], $9::timestamptz[], $10::numeric[]) WITH ORDINALITY \
              AS k(id, hour, spend, position) \
         ORDER BY k.position \
         ON CONFLICT (project_id, route_key, route_value, storm_hour) \
             WHERE kind = 'retry_storm' AND storm_hour IS NOT NULL DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
        of.project_id,
        of.month,
        of.currency,
        of.fired_at,
        of.route.0,
        of.route.1,
        cap,
        &ids,
        &starts,
        &spends,
    )
    .fetch_all(conn)
    .await
}

/// A route's budget alerts fired for one month, for its burn.
pub async fn fired_for_route_in_month(
    pool: &PgPool,
    project: &str,
    (key, value): (&str, &str),
    month: NaiveDate,
) -> sqlx::Result<Vec<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "SELECT project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, cost, \
                node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, observed, \
                workload, output_unit, regression \
         FROM alert_events \
         WHERE project_id = $1 AND route_key = $2 AND route_value = $3 AND month = $4 \
           AND kind IN ('actual', 'forecast') \
         ORDER BY kind, threshold",
        project,
        key,
        value,
        month,
    )
    .fetch_all(pool)
    .await
}

/// Fires an idle-GPU alert for each record whose task has none yet, with the record's cost:
/// its card-seconds priced per contract and ledger month (of the time zone `tz`) in the
/// project's currency, at the prices in force when it fires (held time without a contract
/// or FX rate adds nothing, as in every cost figure). Of several attempts of one
/// task in `alerts`, the first fires. Runs in the caller's transaction, after the records
/// were rated, so an alert commits exactly when the record that fired it does.
pub async fn fire_idle_gpu(
    conn: &mut PgConnection,
    alerts: &[NewIdleGpuAlert],
    fired_at: DateTime<Utc>,
    tz: &str,
) -> sqlx::Result<Vec<AlertRow>> {
    if alerts.is_empty() {
        return Ok(Vec::new());
    }
    let column = |f: fn(&NewIdleGpuAlert) -> String| alerts.iter().map(f).collect::<Vec<_>>();
    let decimals = |f: fn(&NewIdleGpuAlert) -> Decimal| alerts.iter().map(f).collect::<Vec<_>>();
    let ids: Vec<Uuid> = alerts.iter().map(|_| Uuid::new_v4()).collect();
    let attempts: Vec<i32> = alerts.iter().map(|a| a.attempt).collect();
    let months: Vec<NaiveDate> = alerts.iter().map(|a| a.month).collect();
    let mig_profiles: Vec<Option<String>> = alerts.iter().map(|a| a.mig_profile.clone()).collect();
    sqlx::query_as!(
        AlertRow,
        "WITH k AS ( \
           SELECT * \
           FROM UNNEST($1::text[], $2::uuid[], $3::date[], $4::text[], $5::text[], $6::int[], \
                       $7::text[], $8::numeric[], $9::text[], $10::numeric[], $11::text[], \
                       $12::numeric[], $13::numeric[], $14::numeric[]) \
                WITH ORDINALITY AS k(project_id, id, month, currency, task_id, attempt, \
                                     gpu_model, gpu_count, mig_profile, held, measure, value, \
                                     threshold, min_gpu_hours, position)), \
         g AS ( \
           SELECT s.project_id, s.task_id, s.attempt, s.contract_id, \
                  date_trunc('month', s.hour AT TIME ZONE $16)::date AS month, \
                  sum(s.card_seconds) AS seconds \
           FROM rated_segments s \
           WHERE (s.project_id, s.task_id, s.attempt) \
                 IN (SELECT project_id, task_id, attempt FROM k) \
             AND s.contract_id IS NOT NULL \
           GROUP BY 1, 2, 3, 4, 5), \
         costs AS ( \
           SELECT g.project_id, g.task_id, g.attempt, \
                  round(COALESCE(sum(g.seconds \
                        * CASE WHEN c.currency = p.currency THEN c.price_per_gpu_hour \
                               ELSE c.price_per_gpu_hour * x.rate END \
                        / 3600.000000000000000000000000), 0), 20) AS cost \
           FROM g \
           JOIN contracts c ON c.id = g.contract_id \
           JOIN projects p ON p.id = g.project_id \
           LEFT JOIN fx_rates x ON x.month = g.month AND x.from_currency = c.currency \
                AND x.to_currency = p.currency \
           GROUP BY 1, 2, 3) \
         INSERT INTO alert_events (project_id, id, month, kind, currency, fired_at, task_id, \
                                   attempt, gpu_model, gpu_count, mig_profile, \
                                   gpu_seconds_held, idle_measure, idle_value, \
                                   idle_threshold, min_gpu_hours, cost) \
         SELECT k.project_id, k.id, k.month, 'idle_gpu', k.currency, $15, k.task_id, \
                k.attempt, k.gpu_model, k.gpu_count, k.mig_profile, k.held, k.measure, \
                k.value, k.threshold, k.min_gpu_hours, \
                coalesce(costs.cost, round(0::numeric, 20)) \
         FROM k LEFT JOIN costs \
           ON (costs.project_id, costs.task_id, costs.attempt) \
              = (k.project_id, k.task_id, k.attempt) \
         ORDER BY k.position \
         ON CONFLICT (project_id, task_id) WHERE kind = 'idle_gpu' DO NOTHING \
         RETURNING project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                   forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                   gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, \
                   cost, node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, \
                   observed, workload, output_unit, regression",
        &column(|a| a.project_id.clone()),
        &ids,
        &months,
        &column(|a| a.currency.clone()),
        &column(|a| a.task_id.clone()),
        &attempts,
        &column(|a| a.gpu_model.clone()),
        &decimals(|a| a.gpu_count),
        &mig_profiles as &[Option<String>],
        &decimals(|a| a.gpu_seconds_held),
        &column(|a| a.idle_measure.to_owned()),
        &decimals(|a| a.idle_value),
        &decimals(|a| a.idle_threshold),
        &decimals(|a| a.min_gpu_hours),
        fired_at,
        tz,
    )
    .fetch_all(conn)
    .await
}

/// Puts fired alerts in the outbox: `(alert, url, body)` each.
pub async fn enqueue_deliveries(
    conn: &mut PgConnection,
    deliveries: &[(&AlertRow, &str, String)],
) -> sqlx::Result<()> {
    if deliveries.is_empty() {
        return Ok(());
    }
    let projects: Vec<String> = deliveries
        .iter()
        .map(|(a, _, _)| a.project_id.clone())
        .collect();
    let ids: Vec<Uuid> = deliveries.iter().map(|(a, _, _)| a.id).collect();
    let urls: Vec<String> = deliveries.iter().map(|(_, u, _)| (*u).to_owned()).collect();
    let bodies: Vec<String> = deliveries.iter().map(|(_, _, b)| b.clone()).collect();
    sqlx::query!(
        "INSERT INTO alert_deliveries (project_id, alert_id, url, body) \
         SELECT * FROM UNNEST($1::text[], $2::uuid[], $3::text[], $4::text[])",
        &projects,
        &ids,
        &urls,
        &bodies,
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

/// How many of the earliest due deliveries a claim considers.
pub const CLAIM_CANDIDATES: i64 = 16;

/// Claims one due delivery for the caller's transaction. The earliest due deliveries are
/// read without a lock, then locked one at a time by their key with `SKIP LOCKED`: several
/// replicas work the outbox at once without ever sending the same alert together, and each
/// lock names its project, so it stays on one shard when the table is distributed by project.
pub async fn claim_due(conn: &mut PgConnection) -> sqlx::Result<Option<DueDelivery>> {
    let candidates = sqlx::query!(
        "SELECT project_id, alert_id FROM alert_deliveries \
         WHERE state = 'pending' AND next_attempt_at <= now() \
         ORDER BY next_attempt_at, project_id, alert_id LIMIT $1",
        CLAIM_CANDIDATES,
    )
    .fetch_all(&mut *conn)
    .await?;
    for candidate in candidates {
        let claimed = sqlx::query_as!(
            DueDelivery,
            "SELECT project_id, alert_id, url, body, attempts, created_at FROM alert_deliveries \
             WHERE project_id = $1 AND alert_id = $2 \
               AND state = 'pending' AND next_attempt_at <= now() \
             FOR UPDATE SKIP LOCKED",
            candidate.project_id,
            candidate.alert_id,
        )
        .fetch_optional(&mut *conn)
        .await?;
        if claimed.is_some() {
            return Ok(claimed);
        }
    }
    Ok(None)
}

/// When a delivery in `state` after `attempt` finished: at the attempt, unless it is still
/// pending. Computed here, not with `now()` in the statement: Citus allows only immutable
/// functions in an UPDATE's CASE.
pub fn finished_at(state: &str, attempt: &Attempt) -> Option<DateTime<Utc>> {
    (state != "pending").then_some(attempt.attempted_at)
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
    let (state, next_attempt_at) = next.stored();
    sqlx::query!(
        "UPDATE alert_deliveries SET attempts = attempts + 1, state = $3, \
             next_attempt_at = COALESCE($4, next_attempt_at), finished_at = $5 \
         WHERE project_id = $1 AND alert_id = $2",
        delivery.project_id,
        delivery.alert_id,
        state,
        next_attempt_at,
        finished_at(state, attempt),
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

impl NextStep {
    /// The state an outbox row is left in, and when its next attempt is due if any.
    pub fn stored(self) -> (&'static str, Option<DateTime<Utc>>) {
        match self {
            NextStep::Delivered => ("delivered", None),
            NextStep::RetryAt(at) => ("pending", Some(at)),
            NextStep::GiveUp => ("gave_up", None),
        }
    }
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
                forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, cost, \
                node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, observed, \
                workload, output_unit, regression \
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

/// Budget alerts fired for one project and month, for the burn endpoint.
pub async fn fired_in_month(
    pool: &PgPool,
    project: &str,
    month: NaiveDate,
) -> sqlx::Result<Vec<AlertRow>> {
    sqlx::query_as!(
        AlertRow,
        "SELECT project_id, id, month, threshold, kind, currency, spend, budget, burn_pct, \
                forecast, fired_at, task_id, attempt, gpu_model, gpu_count, mig_profile, \
                gpu_seconds_held, idle_measure, idle_value, idle_threshold, min_gpu_hours, cost, \
                node, pool_id, since, cost_per_hour, route_key, route_value, storm_hour, cap, observed, \
                workload, output_unit, regression \
         FROM alert_events \
         WHERE project_id = $1 AND month = $2 AND kind IN ('actual', 'forecast') \
           AND route_key IS NULL \
         ORDER BY kind, threshold",
        project,
        month,
    )
    .fetch_all(pool)
    .await
}
