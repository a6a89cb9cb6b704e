//! Firing budget alerts: each reached `(project, month, threshold, kind)` is stored once,
//! together with its outbox row, in one transaction; the webhook worker delivers it later.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use sqlx::PgPool;

use crate::app::Settings;

use crate::domain::burn::{self, AlertKind, Burn};
use crate::domain::values::Month;
use crate::http::alerts::AlertEvent;
use crate::store;
use crate::store::alerts::{AlertRow, NewAlert};
use crate::store::projects::ProjectRow;

/// Fires, at `now`, the reached alerts that have not fired yet and returns those it fired.
pub async fn fire_reached(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    burn: &Burn,
    reached: &[(i32, AlertKind)],
    now: DateTime<Utc>,
) -> anyhow::Result<Vec<AlertRow>> {
    let Some(budget) = burn.budget else {
        return Ok(Vec::new());
    };
    if reached.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = pool.begin().await?;
    let mut fired = Vec::new();
    for &(threshold, kind) in reached {
        let alert = NewAlert {
            project_id: project.id.clone(),
            month: month.first_day(),
            threshold,
            kind: kind.as_str(),
            currency: project.currency.clone(),
            spend: burn.spend,
            budget,
            burn_pct: burn.burn_pct.unwrap_or_default(),
            forecast: burn.forecast,
            fired_at: now,
        };
        let Some(row) = store::alerts::fire(&mut tx, &alert).await? else {
            continue;
        };
        if let Some(url) = &project.webhook_url {
            let event = AlertEvent::from_row(&row).map_err(|e| anyhow::anyhow!("{e}"))?;
            let body = serde_json::to_string(&event)?;
            store::alerts::enqueue_delivery(&mut tx, &row, url, &body).await?;
        }
        tracing::info!(project = %row.project_id, month = %month, threshold, kind = kind.as_str(), "budget alert fired");
        metrics::counter!("taskledger_alerts_fired_total", "kind" => kind.as_str()).increment(1);
        fired.push(row);
    }
    tx.commit().await?;
    Ok(fired)
}

/// A project's burn of a month as of an instant.
/// `budget` is the month's (see `store::projects::budget_for`).
pub async fn burn_of(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    budget: Option<rust_decimal::Decimal>,
    as_of: DateTime<Utc>,
    tz: Tz,
) -> anyhow::Result<Burn> {
    let mut conn = pool.acquire().await?;
    let spend = crate::http::cost::month_spend(
        &mut conn,
        &project.id,
        &project.currency,
        month.first_day(),
        as_of,
        tz,
    )
    .await
    .map_err(|error| anyhow::anyhow!("computing the spend of {} failed: {error}", project.id))?;
    Ok(burn::burn(spend, budget, month.first_day(), as_of, tz))
}

/// Re-evaluates a project's burn of a month now and fires what it reached. Every path that
/// changes spend calls this; firing is once-only, so calling it often is harmless.
pub async fn evaluate(
    pool: &PgPool,
    project_id: &str,
    month: Month,
    settings: &Settings,
) -> anyhow::Result<Vec<AlertRow>> {
    let Some(project) = store::projects::get(pool, project_id).await? else {
        return Ok(Vec::new());
    };
    // Without a budget there is no burn, so nothing can fire: skip computing the spend.
    let Some(budget) = store::projects::budget_for(pool, &project, month.first_day()).await? else {
        return Ok(Vec::new());
    };
    let now = settings.clock.now();
    let burn = burn_of(pool, &project, month, Some(budget), now, settings.timezone).await?;
    let reached = burn::alerts_reached(&burn, &project.alert_thresholds);
    fire_reached(pool, &project, month, &burn, &reached, now).await
}

/// Evaluates each `(project, month)`, logging failures: the change that asked for it has
/// already been stored, and the periodic check will evaluate again.
pub async fn evaluate_all(
    pool: &PgPool,
    targets: impl IntoIterator<Item = (String, Month)>,
    settings: &Settings,
) {
    for (project, month) in targets {
        if let Err(error) = evaluate(pool, &project, month, settings).await {
            tracing::error!(project = %project, month = %month, error = ?error, "evaluating budget burn failed");
        }
    }
}

/// The months of the ledger that a period overlaps.
pub fn months_between(from: DateTime<Utc>, to: DateTime<Utc>, tz: Tz) -> Vec<Month> {
    let first = Month::from_first_day(from.with_timezone(&tz).date_naive());
    let last = Month::from_first_day(to.with_timezone(&tz).date_naive());
    let mut months = vec![first];
    while *months.last().expect("starts non-empty") < last {
        let next = months.last().expect("starts non-empty").next();
        months.push(next);
    }
    months
}

/// The ledger month holding `at`.
pub fn month_holding(at: DateTime<Utc>, tz: Tz) -> Month {
    Month::from_first_day(at.with_timezone(&tz).date_naive())
}

/// Evaluates the current month of every project with a budget: after a change that can move
/// any project's spend (a contract or FX rate), and periodically, since unused commitment
/// accrues even when no record arrives.
pub async fn evaluate_current_month(pool: &PgPool, settings: &Settings) {
    let month = month_holding(settings.clock.now(), settings.timezone);
    match store::projects::budgeted_in(pool, month.first_day()).await {
        Ok(projects) => {
            let targets = projects.into_iter().map(|project| (project, month));
            evaluate_all(pool, targets, settings).await
        }
        Err(error) => tracing::error!(error = ?error, "listing budgeted projects failed"),
    }
}
