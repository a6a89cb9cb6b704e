//! Changing a project or its budget, which moves what its burn has reached.

use chrono::NaiveDate;
use rust_decimal::Decimal;
use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::values::Month;
use crate::ledger::{LedgerResult, alerting};
use crate::store;
use crate::store::projects::{BudgetRow, ProjectChanges, ProjectRow};

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
    let month = alerting::month_holding(settings.clock.now(), settings.timezone);
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
