//! Projects and their monthly budgets.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use rust_decimal::Decimal;
use sqlx::{PgConnection, PgExecutor, PgPool};

use crate::domain::project::{NewProject, ProjectChanges};

#[derive(Debug, Clone)]
pub struct ProjectRow {
    pub id: String,
    pub name: String,
    pub team: Option<String>,
    pub currency: String,
    pub default_monthly_budget: Option<Decimal>,
    pub alert_thresholds: Vec<i32>,
    pub webhook_url: Option<String>,
    /// Activity under this share is idle; null turns idle-GPU alerts off.
    pub idle_gpu_threshold: Option<Decimal>,
    pub idle_gpu_min_gpu_hours: Decimal,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// Inserts a project; `None` when the id is taken.
pub async fn insert(
    conn: &mut PgConnection,
    project: &NewProject,
) -> sqlx::Result<Option<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "INSERT INTO projects (id, name, team, currency, default_monthly_budget, \
                               alert_thresholds, webhook_url, idle_gpu_threshold, \
                               idle_gpu_min_gpu_hours) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
         ON CONFLICT (id) DO NOTHING \
         RETURNING id, name, team, currency, default_monthly_budget, alert_thresholds, \
                   webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                   updated_at",
        project.id,
        project.name,
        project.team,
        project.currency,
        project.default_monthly_budget,
        &project.alert_thresholds,
        project.webhook_url,
        project.idle_gpu_threshold,
        project.idle_gpu_min_gpu_hours,
    )
    .fetch_optional(conn)
    .await
}

pub async fn get(pool: &PgPool, id: &str) -> sqlx::Result<Option<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "SELECT id, name, team, currency, default_monthly_budget, alert_thresholds, \
                webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                updated_at \
         FROM projects WHERE id = $1",
        id,
    )
    .fetch_optional(pool)
    .await
}

/// A project, its row locked against other changes (not against the records and rows that
/// refer to it) until the transaction ends.
pub async fn get_for_change(conn: &mut PgConnection, id: &str) -> sqlx::Result<Option<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "SELECT id, name, team, currency, default_monthly_budget, alert_thresholds, \
                webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                updated_at \
         FROM projects WHERE id = $1 FOR NO KEY UPDATE",
        id,
    )
    .fetch_optional(conn)
    .await
}

/// Which of `ids` exist.
pub async fn existing_ids(pool: &PgPool, ids: &[String]) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!("SELECT id FROM projects WHERE id = ANY($1)", ids)
        .fetch_all(pool)
        .await
}

/// Projects in id order after `after`, limited to `scope` when given.
pub async fn list(
    pool: &PgPool,
    scope: Option<&[String]>,
    after: Option<&str>,
    limit: i64,
) -> sqlx::Result<Vec<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "SELECT id, name, team, currency, default_monthly_budget, alert_thresholds, \
                webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                updated_at \
         FROM projects \
         WHERE ($1::text[] IS NULL OR id = ANY($1)) AND ($2::text IS NULL OR id > $2) \
         ORDER BY id LIMIT $3",
        scope as Option<&[String]>,
        after,
        limit,
    )
    .fetch_all(pool)
    .await
}

pub async fn update(
    conn: &mut PgConnection,
    id: &str,
    changes: &ProjectChanges,
) -> sqlx::Result<Option<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "UPDATE projects SET \
           name = COALESCE($2, name), \
           team = CASE WHEN $3 THEN $4 ELSE team END, \
           default_monthly_budget = CASE WHEN $5 THEN $6 ELSE default_monthly_budget END, \
           alert_thresholds = COALESCE($7, alert_thresholds), \
           webhook_url = CASE WHEN $8 THEN $9 ELSE webhook_url END, \
           idle_gpu_threshold = CASE WHEN $10 THEN $11 ELSE idle_gpu_threshold END, \
           idle_gpu_min_gpu_hours = COALESCE($12, idle_gpu_min_gpu_hours), \
           updated_at = now() \
         WHERE id = $1 \
         RETURNING id, name, team, currency, default_monthly_budget, alert_thresholds, \
                   webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                   updated_at",
        id,
        changes.name,
        changes.team.is_some(),
        changes.team.clone().flatten(),
        changes.default_monthly_budget.is_some(),
        changes.default_monthly_budget.flatten(),
        changes.alert_thresholds.as_deref(),
        changes.webhook_url.is_some(),
        changes.webhook_url.clone().flatten(),
        changes.idle_gpu_threshold.is_some(),
        changes.idle_gpu_threshold.flatten(),
        changes.idle_gpu_min_gpu_hours,
    )
    .fetch_optional(conn)
    .await
}

#[derive(Debug, Clone)]
pub struct BudgetRow {
    pub project_id: String,
    pub month: NaiveDate,
    pub amount: Decimal,
    pub updated_at: DateTime<Utc>,
}

/// The budget of one month, when it has one of its own.
pub async fn budget_of(
    conn: &mut PgConnection,
    project: &str,
    month: NaiveDate,
) -> sqlx::Result<Option<BudgetRow>> {
    sqlx::query_as!(
        BudgetRow,
        "SELECT project_id, month, amount, updated_at FROM budgets \
         WHERE project_id = $1 AND month = $2",
        project,
        month,
    )
    .fetch_optional(conn)
    .await
}

pub async fn put_budget(
    conn: &mut PgConnection,
    project: &str,
    month: NaiveDate,
    amount: Decimal,
) -> sqlx::Result<BudgetRow> {
    sqlx::query_as!(
        BudgetRow,
        "INSERT INTO budgets (project_id, month, amount, updated_at) VALUES ($1, $2, $3, now()) \
         ON CONFLICT (project_id, month) \
         DO UPDATE SET amount = EXCLUDED.amount, updated_at = EXCLUDED.updated_at \
         RETURNING project_id, month, amount, updated_at",
        project,
        month,
        amount,
    )
    .fetch_one(conn)
    .await
}

pub async fn list_budgets(pool: &PgPool, project: &str) -> sqlx::Result<Vec<BudgetRow>> {
    sqlx::query_as!(
        BudgetRow,
        "SELECT project_id, month, amount, updated_at FROM budgets \
         WHERE project_id = $1 ORDER BY month",
        project,
    )
    .fetch_all(pool)
    .await
}

/// The budget of a month: its own, else the project's default. Read on its own by alert
/// evaluation, and inside a snapshot by the monthly report.
pub async fn budget_for(
    executor: impl PgExecutor<'_>,
    project: &ProjectRow,
    month: NaiveDate,
) -> sqlx::Result<Option<Decimal>> {
    let own = sqlx::query_scalar!(
        "SELECT amount FROM budgets WHERE project_id = $1 AND month = $2",
        project.id,
        month,
    )
    .fetch_optional(executor)
    .await?;
    Ok(own.or(project.default_monthly_budget))
}

/// The budgets set for `month` itself, by project (a project without one has its default).
pub async fn own_budgets(
    conn: &mut PgConnection,
    month: NaiveDate,
) -> sqlx::Result<BTreeMap<String, Decimal>> {
    let rows = sqlx::query!(
        "SELECT project_id, amount FROM budgets WHERE month = $1",
        month,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.project_id, row.amount))
        .collect())
}

/// Projects with a budget for `month` (their own or a default) or with a route: those the
/// periodic burn check evaluates. A union of three reads rather than correlated subqueries,
/// which Citus cannot plan against a reference table.
pub async fn budgeted_in(pool: &PgPool, month: NaiveDate) -> sqlx::Result<Vec<String>> {
    sqlx::query_scalar!(
        r#"SELECT id AS "id!" FROM projects WHERE default_monthly_budget IS NOT NULL
           UNION SELECT project_id FROM budgets WHERE month = $1
           UNION SELECT project_id FROM routes
           ORDER BY 1"#,
        month,
    )
    .fetch_all(pool)
    .await
}

/// Every project, in id order (reports cover them all).
pub async fn all(conn: &mut PgConnection) -> sqlx::Result<Vec<ProjectRow>> {
    sqlx::query_as!(
        ProjectRow,
        "SELECT id, name, team, currency, default_monthly_budget, alert_thresholds, \
                webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours, created_at, \
                updated_at \
         FROM projects ORDER BY id",
    )
    .fetch_all(conn)
    .await
}

/// What judging a project's records for idle GPUs needs of it.
#[derive(Debug, Clone)]
pub struct IdleGpuSettingsRow {
    pub id: String,
    pub currency: String,
    pub webhook_url: Option<String>,
    pub idle_gpu_threshold: Option<Decimal>,
    pub idle_gpu_min_gpu_hours: Decimal,
}

/// The idle-GPU settings of those of `ids` that have them turned on.
pub async fn idle_gpu_settings(
    conn: &mut PgConnection,
    ids: &[String],
) -> sqlx::Result<Vec<IdleGpuSettingsRow>> {
    sqlx::query_as!(
        IdleGpuSettingsRow,
        "SELECT id, currency, webhook_url, idle_gpu_threshold, idle_gpu_min_gpu_hours \
         FROM projects WHERE id = ANY($1) AND idle_gpu_threshold IS NOT NULL",
        ids,
    )
    .fetch_all(conn)
    .await
}

/// The id, name and currency of each of `ids` that exists.
pub async fn accounts(
    conn: &mut PgConnection,
    ids: &[String],
) -> sqlx::Result<Vec<(String, String, String)>> {
    let rows = sqlx::query!(
        "SELECT id, name, currency::text AS \"currency!\" FROM projects \
         WHERE id = ANY($1) ORDER BY id",
        ids,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| (row.id, row.name, row.currency))
        .collect())
}
