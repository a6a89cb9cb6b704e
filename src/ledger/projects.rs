//! Projects: creating, reading and changing them and their budgets (a change moves what
//! its burn has reached).

use chrono::NaiveDate;
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::project::{NewProject, ProjectChanges};
use crate::domain::values::Month;
use crate::ledger::{LedgerResult, alerting};
use crate::store;
pub use crate::store::projects::{BudgetRow, ProjectRow};

/// Changes a project and re-evaluates its current month (thresholds or budget may have
/// changed); `None` when there is no such project.
pub async fn update(
    pool: &PgPool,
    id: &str,
    changes: &ProjectChanges,
    settings: &Settings,
) -> LedgerResult<Option<ProjectRow>> {
    let Some(row) = store::projects::update(pool, id, changes).await? else {
        return Ok(None);
    };
    let month = crate::domain::values::month_holding(settings.clock.now(), settings.timezone);
    alerting::evaluate_all(pool, [(id.to_owned(), month)], settings).await;
    Ok(Some(row))
}

/// Sets a project's budget for one month and re-evaluates that month.
pub async fn put_budget(
    pool: &PgPool,
    id: &str,
    month: Month,
    amount: Decimal,
    settings: &Settings,
) -> LedgerResult<BudgetRow> {
    let first_day: NaiveDate = month.first_day();
    let row = store::projects::put_budget(pool, id, first_day, amount).await?;
    alerting::evaluate_all(pool, [(id.to_owned(), month)], settings).await;
    Ok(row)
}

/// Creates a project; `None` when one with its id exists.
pub async fn create(pool: &PgPool, project: &NewProject) -> LedgerResult<Option<ProjectRow>> {
    Ok(store::projects::insert(pool, project).await?)
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
