//! The month's FOCUS export (see [`crate::exports::focus`]), from data read in one snapshot.

use std::collections::BTreeMap;

use rust_decimal::Decimal;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::config::Settings;
use crate::domain::capacity_plan::Detail;
use crate::domain::values::{Currency, Month};
use crate::domain::what_if::WhatIf;
use crate::exports::focus::{
    self, BillingPeriod, CapacityLine, CommittedContract, ContractTerms, MonthData, ProjectAccount,
    UsageLine,
};
use crate::ledger::LedgerResult;
use crate::ledger::capacity::{self, CapacityWindow};
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
    let window = period.accrual().unwrap_or((period.start, period.start));
    let capacity = CapacityWindow::load(
        conn,
        None,
        window,
        period.tz,
        &WhatIf::default(),
        Detail::Pools,
    )
    .await?;
    let capacity_lines = capacity_lines(conn, &capacity).await?;
    let mut contract_ids: Vec<Uuid> = usage
        .iter()
        .filter_map(|u| u.contract_id)
        .chain(capacity_lines.iter().filter_map(|c| c.contract_id))
        .collect();
    contract_ids.sort_unstable();
    contract_ids.dedup();
    let contracts = store::contracts::by_ids(conn, &contract_ids)
        .await?
        .into_iter()
        .map(|row| Ok((row.id, contract_terms(row)?)))
        .collect::<LedgerResult<_>>()?;
    let (commitments, commitment_usage) = match period.accrual() {
        Some(window) => {
            let mut commitments = store::exports::commitments(conn, window).await?;
            // A reservation that prices capacity has the idle time of its nodes as its waste.
            let terms: Vec<_> = commitments.iter().map(|c| c.contract.to_domain()).collect();
            let on_capacity =
                capacity::reservations_pricing_capacity(conn, &terms, window, period.tz).await?;
            commitments.retain(|c| !on_capacity.contains(&c.contract.id));
            let ids: Vec<Uuid> = commitments.iter().map(|c| c.contract.id).collect();
            let used = store::cost::contract_usage(conn, window, &ids, period.tz, &[], &[], None)
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
        capacity: capacity_lines,
    };
    Ok((data, fx))
}

/// The idle and down time of every pool as charged, summed per project (or pool line),
/// pool, contract, model and mode.
async fn capacity_lines(
    conn: &mut PgConnection,
    capacity: &CapacityWindow,
) -> LedgerResult<Vec<CapacityLine>> {
    let charges = capacity.charges();
    if charges.is_empty() {
        return Ok(Vec::new());
    }
    let projects: Vec<String> = {
        let mut ids: Vec<String> = charges.iter().filter_map(|c| c.project.clone()).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    let accounts: BTreeMap<String, ProjectAccount> = store::projects::accounts(conn, &projects)
        .await?
        .into_iter()
        .map(|(id, name, currency)| {
            Ok((
                id.clone(),
                ProjectAccount {
                    id,
                    name,
                    currency: stored_currency(&currency)?,
                },
            ))
        })
        .collect::<LedgerResult<_>>()?;
    type Key = (
        Option<String>,
        String,
        bool,
        String,
        String,
        Option<Uuid>,
        Option<String>,
        String,
    );
    let mut lines: BTreeMap<Key, (Decimal, Decimal)> = BTreeMap::new();
    for charge in charges {
        let account = charge.project.as_ref().and_then(|p| accounts.get(p));
        if charge.project.is_some() && account.is_none() {
            continue;
        }
        let currency = match (account, &charge.price) {
            (Some(account), _) => account.currency.code().to_owned(),
            (None, Some((_, currency))) => currency.clone(),
            (None, None) => continue,
        };
        let costs = capacity.cost_of(charge, &currency);
        for (down, seconds, cost) in [
            (false, charge.idle_seconds, costs.map(|c| c.0)),
            (true, charge.down_seconds, costs.map(|c| c.1)),
        ] {
            if seconds.is_zero() {
                continue;
            }
            let reason = match (&charge.price, cost) {
                (None, _) => Some("no_contract".to_owned()),
                (Some(_), None) => Some("no_fx_rate".to_owned()),
                _ => None,
            };
            let key = (
                charge.project.clone(),
                charge.pool.clone(),
                down,
                charge.gpu_model.clone(),
                charge.billing_mode.as_str().to_owned(),
                charge.contract_id,
                reason,
                currency.clone(),
            );
            let entry = lines.entry(key).or_default();
            entry.0 += seconds;
            entry.1 += cost.unwrap_or_default();
        }
    }
    lines
        .into_iter()
        .map(
            |(
                (project, pool, down, gpu_model, billing_mode, contract_id, reason, currency),
                (seconds, cost),
            )| {
                Ok(CapacityLine {
                    project: project.and_then(|p| accounts.get(&p).cloned()),
                    pool,
                    down,
                    gpu_model,
                    billing_mode,
                    contract_id,
                    unrated_reason: reason,
                    gpu_seconds: seconds,
                    cost,
                    currency: stored_currency(&currency)?,
                })
            },
        )
        .collect()
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
