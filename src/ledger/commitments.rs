//! Unused commitment of reserved contracts over a window (COST_MODEL.md §3): the contracts
//! and their usage are read once, and each contract's hours are netted once, however many
//! figures need them. The monthly report puts one window's commitments on the project lines,
//! the shared lines and the commitment lines alike.

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;

use crate::domain::commitment::{
    LedgerWindow, UnusedCommitment, WholeDays, unused_commitment_by_day,
};
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
        ToNet::read(conn, Some(project), window, tz, what_if)
            .await?
            .net(conn)
            .await
    }

    /// Every one, scoped to a project or not, ordered by project (unscoped first), name and id.
    pub async fn all(
        conn: &mut sqlx::PgConnection,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        Self::to_net(conn, window, tz, what_if)
            .await?
            .net(conn)
            .await
    }

    /// [`Commitments::all`] up to netting their usage, which [`ToNet::net`] does, on
    /// another connection of the same snapshot if need be.
    pub async fn to_net(
        conn: &mut sqlx::PgConnection,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<ToNet> {
        ToNet::read(conn, None, window, tz, what_if).await
    }
}

/// Reserved contracts committing GPUs over a window, read with the usage that compaction
/// has not folded into whole days yet, before their days are read and netted.
pub struct ToNet {
    window: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    /// Each contract's row, and the contract at the price its commitment is charged at.
    contracts: Vec<(ContractRow, Contract)>,
    /// The days netted in the database, for every reservation (not one project's).
    whole: Vec<(uuid::Uuid, WholeDays)>,
    regular_days: Vec<(NaiveDate, DateTime<Utc>, DateTime<Utc>)>,
    pending: Option<store::cost::PendingUsage>,
}

impl ToNet {
    /// With `what_if`, each contract is read at its overriding price: unused commitment
    /// belongs to the contract, so a model-and-mode price is taken in the contract's currency.
    async fn read(
        conn: &mut sqlx::PgConnection,
        project: Option<&str>,
        (from, to): (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        what_if: &WhatIf,
    ) -> LedgerResult<Self> {
        let mut to_net = Self {
            window: (from, to),
            tz,
            contracts: Vec::new(),
            whole: Vec::new(),
            regular_days: Vec::new(),
            pending: None,
        };
        if to <= from {
            return Ok(to_net);
        }
        let rows = match project {
            Some(project) => {
                store::contracts::project_commitments(conn, Some(project), from, to).await?
            }
            None => store::contracts::commitments(conn, from, to).await?,
        };
        if rows.is_empty() {
            return Ok(to_net);
        }
        // A reservation that prices capacity has the idle time of its nodes as its waste.
        let contracts: Vec<Contract> = rows.iter().map(ContractRow::to_domain).collect();
        let on_capacity =
            capacity::reservations_pricing_capacity(conn, &contracts, (from, to), tz).await?;
        to_net.contracts = rows
            .into_iter()
            .zip(contracts)
            .filter(|(row, _)| !on_capacity.contains(&row.id))
            .map(|(row, mut contract)| {
                if let Some(price) =
                    what_if.contract_price(contract.id, &contract.gpu_model, contract.billing_mode)
                {
                    contract.price_per_gpu_hour = match price {
                        Override::InContractCurrency(price)
                        | Override::InProjectCurrency(price) => price,
                    };
                }
                (row, contract)
            })
            .collect();
        if to_net.contracts.is_empty() {
            return Ok(to_net);
        }
        // Over every reservation, the days a contract commits whole are netted in the
        // database, a number per day; a project's few are read hour by hour, which costs
        // less than planning that statement anew (see `store::cost::contract_usage`).
        if project.is_none() {
            let window = LedgerWindow::new(from, to, tz);
            to_net.whole = to_net
                .contracts
                .iter()
                .filter_map(|(_, contract)| Some((contract.id, window.whole_days(contract)?)))
                .collect();
            to_net.regular_days = window.regular_days();
            // Read here, so that the days alone are left for `net`.
            to_net.pending =
                store::cost::pending_usage(conn, (from, to), &to_net.contract_ids()).await?;
        }
        Ok(to_net)
    }

    fn contract_ids(&self) -> Vec<uuid::Uuid> {
        self.contracts.iter().map(|(row, _)| row.id).collect()
    }

    /// Reads the contracts' usage on `conn` (the snapshot they were read on, or another
    /// connection of it) and nets it. The statement reads only the whole days when the delta
    /// rows were read already, which on Citus is a reference table.
    pub async fn net(self, conn: &mut sqlx::PgConnection) -> LedgerResult<Commitments> {
        let (from, to) = self.window;
        let mut commitments = Commitments {
            window: self.window,
            accrued: Vec::new(),
        };
        if self.contracts.is_empty() {
            return Ok(commitments);
        }
        let window = LedgerWindow::new(from, to, self.tz);
        // An hour cut by the window's end has its usage read whole: usage has no finer grain.
        let mut usage = store::cost::contract_usage(
            conn,
            (from, to),
            &self.contract_ids(),
            self.tz,
            &self.whole,
            &self.regular_days,
            self.pending,
        )
        .await?;
        commitments.accrued = self
            .contracts
            .into_iter()
            .map(|(row, contract)| {
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
