//! Projects: creating, reading and changing them and their budgets (a change moves what
//! its burn has reached).

use chrono::NaiveDate;
use rust_decimal::Decimal;
use serde_json::{Value, json};
use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::project::{NewProject, ProjectChanges};
use crate::domain::values::{self, Month};
use crate::ledger::{LedgerResult, alerting, audit};
use crate::store;
pub use crate::store::projects::{BudgetRow, ProjectRow};

/// A project as the audit log keeps it: as finance sees it, its webhook URL masked.
fn snapshot(row: &ProjectRow) -> Value {
    json!({
        "id": row.id,
        "name": row.name,
        "team": row.team,
        "currency": row.currency,
        "default_monthly_budget": row.default_monthly_budget,
        "alert_thresholds": row.alert_thresholds,
        "webhook_url": row.webhook_url.as_deref().map(values::masked_url),
        "idle_gpu_threshold": row.idle_gpu_threshold,
        "idle_gpu_min_gpu_hours": row.idle_gpu_min_gpu_hours,
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    })
}

fn budget_snapshot(row: &BudgetRow, currency: &str) -> Value {
    json!({
        "project": row.project_id,
        "month": Month::from_first_day(row.month).to_string(),
        "amount": row.amount.normalize(),
        "currency": currency,
        "updated_at": row.updated_at,
    })
}

/// Changes a project and re-evaluates its current month (thresholds or budget may have
/// changed); `None` when there is no such project.
pub async fn update(
    pool: &PgPool,
    id: &str,
    changes: &ProjectChanges,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<Option<ProjectRow>> {
    let mut tx = pool.begin().await?;
    let Some(before) = store::projects::get_for_change(&mut tx, id).await? else {
        return Ok(None);
    };
    let row = store::projects::update(&mut tx, id, changes)
        .await?
        .expect("a project locked in this transaction is still there");
    let change = Change::new(
        "project",
        id,
        "update",
        Some(snapshot(&before)),
        Some(snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    let month = crate::domain::values::month_holding(settings.clock.now(), settings.timezone);
    alerting::evaluate_all(pool, [(id.to_owned(), month)], settings).await;
    Ok(Some(row))
}

/// Sets one month's budget of a project and re-evaluates that month; `None` when there is no
/// such project.
pub async fn put_budget(
    pool: &PgPool,
    id: &str,
    month: Month,
    amount: Decimal,
    actor: &Actor,
    settings: &Settings,
) -> LedgerResult<Option<BudgetRow>> {
    let first_day: NaiveDate = month.first_day();
    let mut tx = pool.begin().await?;
    // The project's row lock orders changes of its budgets, so `before` is the budget this
    // change replaces.
    let Some(project) = store::projects::get_for_change(&mut tx, id).await? else {
        return Ok(None);
    };
    let before = store::projects::budget_of(&mut tx, id, first_day).await?;
    let row = store::projects::put_budget(&mut tx, id, first_day, amount).await?;
    let change = Change::new(
        "budget",
        format!("{id}/{month}"),
        if before.is_some() { "update" } else { "create" },
        before
            .as_ref()
            .map(|b| budget_snapshot(b, &project.currency)),
        Some(budget_snapshot(&row, &project.currency)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    alerting::evaluate_all(pool, [(id.to_owned(), month)], settings).await;
    Ok(Some(row))
}

/// Creates a project; `None` when its id is taken.
pub async fn create(
    pool: &PgPool,
    project: &NewProject,
    actor: &Actor,
) -> LedgerResult<Option<ProjectRow>> {
    let mut tx = pool.begin().await?;
    let Some(row) = store::projects::insert(&mut tx, project).await? else {
        return Ok(None);
    };
    let change = Change::new("project", &row.id, "create", None, Some(snapshot(&row)));
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(Some(row))
}

pub async fn get(pool: &PgPool, id: &str) -> LedgerResult<Option<ProjectRow>> {
    Ok(store::projects::get(pool, id).await?)
}

/// Projects in id order after `after`, limited to `scope` when given.
pub async fn list(
    pool: &PgPool,
    scope: Option<&[String]>,
    after: Option<&str>,
    limit: i64,
) -> LedgerResult<Vec<ProjectRow>> {
    Ok(store::projects::list(pool, scope, after, limit).await?)
}

/// A project's monthly budgets.
pub async fn budgets(pool: &PgPool, project: &str) -> LedgerResult<Vec<BudgetRow>> {
    Ok(store::projects::list_budgets(pool, project).await?)
}
