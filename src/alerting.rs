//! Firing budget alerts: each reached `(project, month, threshold, kind)` is stored once,
//! together with its outbox row, in one transaction; the webhook worker delivers it later.

use sqlx::PgPool;

use crate::domain::burn::{AlertKind, Burn};
use crate::domain::values::Month;
use crate::http::alerts::AlertEvent;
use crate::store;
use crate::store::alerts::{AlertRow, NewAlert};
use crate::store::projects::ProjectRow;

/// Fires the reached alerts that have not fired yet and returns those it fired.
pub async fn fire_reached(
    pool: &PgPool,
    project: &ProjectRow,
    month: Month,
    burn: &Burn,
    reached: &[(i32, AlertKind)],
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
