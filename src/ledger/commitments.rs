//! Unused commitment of reserved contracts over a window (COST_MODEL.md §3): the contracts
//! and their usage are read once, and each contract's hours are netted once, however many
//! figures need them. The monthly report puts one window's commitments on the project lines,
//! the shared lines and the commitment lines alike.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;

use crate::domain::commitment::{LedgerWindow, UnusedCommitment, unused_commitment_by_day};
use crate::domain::rating::Contract;
use crate::domain::what_if::{Override, WhatIf};
use crate::ledger::{LedgerResult, capacity};
use crate::store;
use crate::store::contracts::ContractRow;

/// One contract's commitment over the window.
pub struct Accrued {
    pub row: ContractRow,
    pub contract: Contract,
    /// The ledger days with some commitment left unused, in time order, each summed over its
    /// hours in the window.
    pub unused_days: Vec<UnusedCommitment>,
    /// Sums over every hour of the window the contract was valid in.
    pub committed_gpu_hours: Decimal,
    pub unused_gpu_hours: Decimal,
    /// In the contract's currency.
    pub cost: Decimal,
}

/// The reserved contracts committing GPUs over `[from, to)`, each with its unused
/// commitment. `to` is where commitment stops accruing (`as_of` in a month in progress).
pub struct Commitments {
    pub window: (DateTime<Utc>, DateTime<Utc>),
    pub accrued: Vec<Accrued>,
}

impl Commitments {
    /// Those scoped to `project`.
    pub async fn of_project(
        conn: &mut sqlx::PgConnection,
        project: &str,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        Self::load(conn, Some(project), window, tz, what_if).await
    }

    /// Every one, scoped to a project or not, ordered by project (unscoped first), name and id.
    pub async fn all(
        conn: &mut sqlx::PgConnection,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        Self::load(conn, None, window, tz, what_if).await
    }

    /// With `what_if`, each contract is read at its overriding price: unused commitment
    /// belongs to the contract, so a model-and-mode price is taken in the contract's currency.
    async fn load(
        conn: &mut sqlx::PgConnection,
        project: Option<&str>,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        let mut commitments = Self {
            window: (from, to),
            accrued: Vec::new(),
        };
        if to <= from {
            return Ok(commitments);
        }
        let rows = match project {
            Some(project) => {
                store::contracts::project_commitments(conn, Some(project), from, to).await?
            }
            None => store::contracts::commitments(conn, from, to).await?,
        };
        if rows.is_empty() {
            return Ok(commitments);
        }
        // A reservation that prices capacity has the idle time of its nodes as its waste.
        let contracts: Vec<Contract> = rows.iter().map(ContractRow::to_domain).collect();
        let on_capacity =
            capacity::reservations_pricing_capacity(conn, &contracts, (from, to), tz).await?;
        let (rows, contracts): (Vec<ContractRow>, Vec<Contract>) = rows
            .into_iter()
            .zip(contracts)
            .filter(|(row, _)| !on_capacity.contains(&row.id))
            .unzip();
        if rows.is_empty() {
            return Ok(commitments);
        }
        let ids: Vec<_> = rows.iter().map(|c| c.id).collect();
        let window = LedgerWindow::new(from, to, tz);
        // Over every reservation, the days a contract commits whole are netted in the
        // database, a number per day; a project's few are read hour by hour, which costs
        // less than planning that statement anew (see `store::cost::contract_usage`).
        let (whole, regular_days): (Vec<_>, _) = match project {
            Some(_) => (Vec::new(), Vec::new()),
            None => (
                contracts
                    .iter()
                    .filter_map(|contract| Some((contract.id, window.whole_days(contract)?)))
                    .collect(),
                window.regular_days(),
            ),
        };
        // An hour cut by the window's end has its usage read whole: usage has no finer grain.
        let mut usage =
            store::cost::contract_usage(conn, (from, to), &ids, tz, &whole, &regular_days).await?;
        commitments.accrued = rows
            .into_iter()
            .zip(contracts)
            .map(|(row, mut contract)| {
                if let Some(price) =
                    what_if.contract_price(contract.id, &contract.gpu_model, contract.billing_mode)
                {
                    contract.price_per_gpu_hour = match price {
                        Override::InContractCurrency(price)
                        | Override::InProjectCurrency(price) => price,
                    };
                }
                let used = usage.remove(&row.id).unwrap_or_default();
                let charges =
                    unused_commitment_by_day(&contract, &used.hours, &used.capped_days, &window);
                let mut accrued = Accrued {
                    row,
                    contract,
                    unused_days: Vec::new(),
                    committed_gpu_hours: Decimal::ZERO,
                    unused_gpu_hours: Decimal::ZERO,
                    cost: Decimal::ZERO,
                };
                for charge in charges {
                    accrued.committed_gpu_hours += charge.committed_gpu_hours;
                    accrued.unused_gpu_hours += charge.unused_gpu_hours;
                    accrued.cost += charge.cost;
                    if !charge.unused_gpu_hours.is_zero() {
                        accrued.unused_days.push(charge);
                    }
                }
                accrued
            })
            .collect();
        Ok(commitments)
    }
}
