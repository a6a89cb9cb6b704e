//! The month's FOCUS export (see [`crate::domain::focus`]), from data read in one snapshot.

use std::collections::BTreeMap;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::focus::{
    self, BillingPeriod, CommittedContract, ContractTerms, MonthData, ProjectAccount, UsageLine,
};
use crate::domain::values::{Currency, Month};
use crate::ledger::LedgerResult;
use crate::store;
use crate::store::contracts::ContractRow;
use crate::store::exports::{Commitment, ContractUsage};
use crate::store::fx_rates::RateTable;

/// The month's charges as a FinOps FOCUS 1.2 cost-and-usage CSV; in a month in progress,
/// unused commitment accrues up to now.
pub async fn export(pool: &PgPool, month: Month, settings: &Settings) -> LedgerResult<Vec<u8>> {
    let period = BillingPeriod::new(month, settings.clock.now(), settings.timezone);
    let mut snapshot = store::snapshot(pool).await?;
    let (data, fx) = month_data(&mut snapshot, &period).await?;
    snapshot.commit().await?;
    Ok(focus::month_csv(&period, &data, &fx).map_err(anyhow::Error::from)?)
}

async fn month_data(
    conn: &mut PgConnection,
    period: &BillingPeriod,
) -> LedgerResult<(MonthData, RateTable)> {
    let usage = store::exports::usage_by_contract(conn, (period.start, period.end), period.tz)
        .await?
        .into_iter()
        .map(usage_line)
        .collect::<LedgerResult<Vec<_>>>()?;
    let mut contract_ids: Vec<Uuid> = usage.iter().filter_map(|u| u.contract_id).collect();
    contract_ids.sort_unstable();
    contract_ids.dedup();
    let contracts = store::contracts::by_ids(conn, &contract_ids)
        .await?
        .into_iter()
        .map(|row| Ok((row.id, contract_terms(row)?)))
        .collect::<LedgerResult<_>>()?;
    let (commitments, commitment_usage) = match period.accrual() {
        Some(window) => {
            let commitments = store::exports::commitments(conn, window).await?;
            let ids: Vec<Uuid> = commitments.iter().map(|c| c.contract.id).collect();
            let used = store::cost::contract_usage(conn, window, &ids, period.tz, &[], &[])
                .await?
                .into_iter()
                .map(|(id, usage)| (id, usage.hours))
                .collect();
            let commitments = commitments
                .into_iter()
                .map(committed_contract)
                .collect::<LedgerResult<_>>()?;
            (commitments, used)
        }
        None => (Vec::new(), BTreeMap::new()),
    };
    let mut currencies: Vec<String> = usage
        .iter()
        .map(|u| &u.project)
        .chain(commitments.iter().filter_map(|c| c.project.as_ref()))
        .map(|project| project.currency.code().to_owned())
        .collect();
    currencies.sort_unstable();
    currencies.dedup();
    let month = period.month.first_day();
    let fx = store::fx_rates::table(conn, month, month, &currencies).await?;
    let data = MonthData {
        usage,
        contracts,
        commitments,
        commitment_usage,
    };
    Ok((data, fx))
}

fn stored_currency(code: &str) -> LedgerResult<Currency> {
    Currency::parse(code)
        .map_err(|e| anyhow::anyhow!("stored currency is invalid: {e}"))
        .map_err(Into::into)
}

fn usage_line(row: ContractUsage) -> LedgerResult<UsageLine> {
    Ok(UsageLine {
        project: ProjectAccount {
            currency: stored_currency(&row.project_currency)?,
            id: row.project_id,
            name: row.project_name,
        },
        gpu_model: row.gpu_model,
        billing_mode: row.billing_mode,
        contract_id: row.contract_id,
        unrated_reason: row.unrated_reason,
        gpu_seconds_held: row.gpu_seconds_held,
        gpu_seconds_busy: row.gpu_seconds_busy,
        cost: row.cost,
        tasks: row.tasks,
    })
}

fn contract_terms(row: ContractRow) -> LedgerResult<ContractTerms> {
    Ok(ContractTerms {
        id: row.id,
        name: row.name,
        gpu_model: row.gpu_model,
        billing_mode: row.billing_mode,
        price_per_gpu_hour: row.price_per_gpu_hour,
        currency: stored_currency(&row.currency)?,
        valid_from: row.valid_from,
        valid_until: row.valid_until,
        project: row.project_id,
        provider: row.provider,
        region: row.region,
        committed_gpus: row.committed_gpus,
    })
}

fn committed_contract(row: Commitment) -> LedgerResult<CommittedContract> {
    let project = match (&row.contract.project_id, row.project_name) {
        (Some(id), Some(name)) => Some(ProjectAccount {
            id: id.clone(),
            name,
            currency: stored_currency(row.project_currency.as_deref().unwrap_or_default())?,
        }),
        _ => None,
    };
    Ok(CommittedContract {
        contract: contract_terms(row.contract)?,
        project,
    })
}
