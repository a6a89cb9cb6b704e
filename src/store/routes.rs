//! Routes of a project (a label value with a budget and retry caps), and the records and
//! failed spend their retry-storm alerts are judged on.

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};

#[derive(Debug, Clone)]
pub struct RouteRow {
    pub project_id: String,
    pub label_key: String,
    pub label_value: String,
    pub monthly_budget: Option<Decimal>,
    pub max_attempts_per_task: Option<i32>,
    pub max_failed_spend_per_hour: Option<Decimal>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// What a PUT sets: every limit, those left out cleared.
#[derive(Debug, Clone)]
pub struct RoutePut<'a> {
    pub project_id: &'a str,
    pub label_key: &'a str,
    pub label_value: &'a str,
    pub monthly_budget: Option<Decimal>,
    pub max_attempts_per_task: Option<i32>,
    pub max_failed_spend_per_hour: Option<Decimal>,
    pub at: DateTime<Utc>,
}

/// Creates or replaces a route's limits. The time is the caller's, so the statement stays
/// free of volatile functions in its `ON CONFLICT` clause.
pub async fn put(conn: &mut PgConnection, route: &RoutePut<'_>) -> sqlx::Result<RouteRow> {
    sqlx::query_as!(
        RouteRow,
        "INSERT INTO routes (project_id, label_key, label_value, monthly_budget, \
                             max_attempts_per_task, max_failed_spend_per_hour, created_at, \
                             updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7) \
         ON CONFLICT (project_id, label_key, label_value) DO UPDATE \
             SET monthly_budget = EXCLUDED.monthly_budget, \
                 max_attempts_per_task = EXCLUDED.max_attempts_per_task, \
                 max_failed_spend_per_hour = EXCLUDED.max_failed_spend_per_hour, \
                 updated_at = EXCLUDED.updated_at \
         RETURNING project_id, label_key, label_value, monthly_budget, max_attempts_per_task, \
                   max_failed_spend_per_hour, created_at, updated_at",
        route.project_id,
        route.label_key,
        route.label_value,
        route.monthly_budget,
        route.max_attempts_per_task,
        route.max_failed_spend_per_hour,
        route.at,
    )
    .fetch_one(conn)
    .await
}

pub async fn get(
    conn: &mut PgConnection,
    project: &str,
    key: &str,
    value: &str,
) -> sqlx::Result<Option<RouteRow>> {
    sqlx::query_as!(
        RouteRow,
        "SELECT project_id, label_key, label_value, monthly_budget, max_attempts_per_task, \
                max_failed_spend_per_hour, created_at, updated_at \
         FROM routes WHERE project_id = $1 AND label_key = $2 AND label_value = $3",
        project,
        key,
        value,
    )
    .fetch_optional(conn)
    .await
}

/// A project's routes in key, then value order.
pub async fn of_project(pool: &PgPool, project: &str) -> sqlx::Result<Vec<RouteRow>> {
    sqlx::query_as!(
        RouteRow,
        "SELECT project_id, label_key, label_value, monthly_budget, max_attempts_per_task, \
                max_failed_spend_per_hour, created_at, updated_at \
         FROM routes WHERE project_id = $1 ORDER BY label_key, label_value",
        project,
    )
    .fetch_all(pool)
    .await
}

/// Deletes a route; the route deleted, `None` when there was none. Its alerts stay, as
/// history.
pub async fn delete(
    conn: &mut PgConnection,
    project: &str,
    key: &str,
    value: &str,
) -> sqlx::Result<Option<RouteRow>> {
    sqlx::query_as!(
        RouteRow,
        "DELETE FROM routes WHERE project_id = $1 AND label_key = $2 AND label_value = $3 \
         RETURNING project_id, label_key, label_value, monthly_budget, max_attempts_per_task, \
                   max_failed_spend_per_hour, created_at, updated_at",
        project,
        key,
        value,
    )
    .fetch_optional(conn)
    .await
}

/// The first attempt (lowest number) above `cap` of each of a route's tasks among its records
/// that ended in `[from, to)`.
#[derive(Debug, Clone)]
pub struct AttemptBeyondCap {
    pub task_id: String,
    pub attempt: i32,
}

pub async fn attempts_beyond_cap(
    conn: &mut PgConnection,
    route: &RouteRow,
    cap: i32,
    (from, to): (DateTime<Utc>, DateTime<Utc>),
) -> sqlx::Result<Vec<AttemptBeyondCap>> {
    sqlx::query_as!(
        AttemptBeyondCap,
        r#"SELECT DISTINCT ON (task_id) task_id AS "task_id!", attempt AS "attempt!"
           FROM job_records
           WHERE project_id = $1 AND labels ->> $2 = $3 AND attempt > $4
             AND ended_at >= $5 AND ended_at < $6
           ORDER BY task_id, attempt"#,
        route.project_id,
        route.label_key,
        route.label_value,
        cap,
        from,
        to,
    )
    .fetch_all(conn)
    .await
}
