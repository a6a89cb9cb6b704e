//! The lines of a month as the rated data says: one per project, and one per currency for the
//! unused commitment of reserved contracts scoped to no project.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sqlx::PgConnection;

use super::model::{Amounts, CommitmentLine, ProjectLine, SharedContract, SharedLine};
use crate::config::Settings;
use crate::domain::burn::burn;
use crate::domain::capacity_plan::Detail;
use crate::domain::figures::Figures;
use crate::domain::figures::Grouping;
use crate::domain::ledger_time::month_bounds;
use crate::domain::values::Month;
use crate::domain::what_if::WhatIf;
use crate::ledger::LedgerResult;
use crate::ledger::capacity::{CapacityWindow, PoolUtilisation};
use crate::ledger::commitments::{Accrued, Commitments};
use crate::ledger::cost::{
    CostOf, GroupView, figures_of_projects, month_commitments, month_commitments_to_net,
    month_cost, month_sums_of_projects,
};
use crate::store;

/// Who owns a line: a project, or the shared commitment (`None`), in a currency.
pub(super) type LineKey = (Option<String>, String);

/// The lines of a month as the rated data says, with unused commitment accrued up to `as_of`.
pub(super) struct MonthLines {
    pub projects: Vec<ProjectLine>,
    pub shared: Vec<SharedLine>,
    pub commitments: Vec<CommitmentLine>,
    /// Every pool with capacity in the month, without its nodes.
    pub pools: Vec<PoolUtilisation>,
}

/// The project lines, shared lines and commitment lines of a month. Every reserved
/// contract's usage is read and netted once, for all three. With `aside`, a second
/// connection on the same snapshot, the reserved contracts' whole days are read and netted
/// there while the projects' sums are read on `conn`.
pub(super) async fn month_lines(
    conn: &mut PgConnection,
    aside: Option<&mut PgConnection>,
    month: Month,
    grouping: Grouping,
    as_of: DateTime<Utc>,
    what_if: &WhatIf,
    settings: &Settings,
) -> LedgerResult<MonthLines> {
    let tz = settings.timezone;
    let rows = store::projects::all(conn).await?;
    let of: Vec<CostOf> = rows
        .iter()
        .map(|project| CostOf {
            project: &project.id,
            currency: &project.currency,
        })
        .collect();
    let ids: Vec<String> = rows.iter().map(|project| project.id.clone()).collect();
    let first_day = month.first_day();
    let capacity = month_capacity(conn, month, as_of, tz, what_if).await?;
    let (commitments, costs): (_, Vec<(Figures, Vec<GroupView>)>) = match grouping {
        // Without groups, every project's figures are read at once.
        Grouping::Whole => {
            let (commitments, sums) = match aside {
                // The priced sums take longest: the reserved contracts and their usage not yet
                // folded into days are read first, then their days are read and netted
                // beside the sums. On Citus the days are a reference table, which the
                // coordinator reads on the snapshot it exported to `aside`.
                Some(aside) => {
                    let to_net =
                        month_commitments_to_net(conn, first_day, as_of, tz, what_if).await?;
                    let (commitments, sums) = tokio::join!(
                        to_net.net(aside),
                        month_sums_of_projects(conn, &ids, first_day, tz, what_if),
                    );
                    (commitments?, sums?)
                }
                None => (
                    month_commitments(conn, first_day, as_of, tz, what_if).await?,
                    month_sums_of_projects(conn, &ids, first_day, tz, what_if).await?,
                ),
            };
            let figures = figures_of_projects(conn, &of, sums, &commitments, &capacity, tz).await?;
            let costs = figures
                .into_iter()
                .map(|figures| (figures, Vec::new()))
                .collect();
            (commitments, costs)
        }
        _ => {
            let commitments = month_commitments(conn, first_day, as_of, tz, what_if).await?;
            let mut costs = Vec::with_capacity(of.len());
            for &project in &of {
                let cost = month_cost(
                    conn,
                    project,
                    first_day,
                    grouping.clone(),
                    as_of,
                    tz,
                    what_if,
                )
                .await?;
                costs.push((cost.figures, cost.groups));
            }
            (commitments, costs)
        }
    };
    let own_budgets = store::projects::own_budgets(conn, month.first_day()).await?;
    let mut projects = Vec::with_capacity(rows.len());
    for (project, (figures, groups)) in rows.iter().zip(costs) {
        let budget = own_budgets
            .get(&project.id)
            .copied()
            .or(project.default_monthly_budget);
        let burn = burn(figures.total, budget, month.first_day(), as_of, tz);
        projects.push(ProjectLine {
            project: project.id.clone(),
            name: project.name.clone(),
            team: project.team.clone(),
            currency: project.currency.clone(),
            figures,
            budget: budget.map(|b| b.normalize()),
            burn_pct: burn.burn_pct.map(|p| p.normalize()),
            forecast: burn.forecast.map(|f| f.normalize()),
            forecast_pct: burn.forecast_pct.map(|p| p.normalize()),
            groups,
        });
    }
    let pools = capacity
        .pools
        .keys()
        .map(|pool| capacity.utilisation(pool, month, false))
        .collect();
    Ok(MonthLines {
        projects,
        shared: shared_lines(&commitments),
        commitments: commitment_lines(&commitments),
        pools,
    })
}

/// Every pool's capacity over a ledger month, accrued up to `as_of`.
async fn month_capacity(
    conn: &mut PgConnection,
    month: Month,
    as_of: DateTime<Utc>,
    tz: chrono_tz::Tz,
    what_if: &WhatIf,
) -> LedgerResult<CapacityWindow> {
    let (from, to) = month_bounds(month.first_day(), tz);
    CapacityWindow::load(
        conn,
        None,
        (from, to.min(as_of)),
        tz,
        what_if,
        Detail::Pools,
    )
    .await
}

/// Unused commitment of unscoped reserved contracts, in each contract's currency: it belongs
/// to no project, so no project's currency applies.
fn shared_lines(commitments: &Commitments) -> Vec<SharedLine> {
    let mut shared: Vec<&Accrued> = commitments
        .accrued
        .iter()
        .filter(|accrued| accrued.row.project_id.is_none())
        .collect();
    shared.sort_by_key(|accrued| accrued.row.id);
    let mut by_currency: BTreeMap<String, SharedLine> = BTreeMap::new();
    for accrued in shared {
        let contract = &accrued.contract;
        let line = by_currency
            .entry(contract.currency.clone())
            .or_insert_with(|| SharedLine {
                currency: contract.currency.clone(),
                unused_commitment: Decimal::ZERO,
                unused_gpu_hours: Decimal::ZERO,
                contracts: Vec::new(),
            });
        line.unused_commitment += accrued.cost;
        line.unused_gpu_hours += accrued.unused_gpu_hours;
        line.contracts.push(SharedContract {
            id: accrued.row.id,
            name: accrued.row.name.clone(),
            gpu_model: contract.gpu_model.clone(),
            unused_gpu_hours: accrued.unused_gpu_hours.normalize(),
            unused_commitment: accrued.cost.normalize(),
        });
    }
    by_currency
        .into_values()
        .map(|mut line| {
            line.unused_commitment = line.unused_commitment.normalize();
            line.unused_gpu_hours = line.unused_gpu_hours.normalize();
            line
        })
        .collect()
}

/// Every reserved contract committing GPUs in the month: committed, used and unused GPU-hours,
/// from the same hourly netting as the unused commitment.
fn commitment_lines(commitments: &Commitments) -> Vec<CommitmentLine> {
    commitments
        .accrued
        .iter()
        .map(|accrued| {
            let row = &accrued.row;
            let committed = accrued.committed_gpu_hours;
            let unused = accrued.unused_gpu_hours;
            CommitmentLine {
                id: row.id,
                name: row.name.clone(),
                project: row.project_id.clone(),
                gpu_model: row.gpu_model.clone(),
                currency: row.currency.clone(),
                committed_gpus: accrued
                    .contract
                    .committed_gpus
                    .unwrap_or_default()
                    .normalize(),
                committed_gpu_hours: committed.normalize(),
                used_gpu_hours: (committed - unused).normalize(),
                unused_gpu_hours: unused.normalize(),
                unused_commitment: accrued.cost.normalize(),
            }
        })
        .collect()
}

/// The amounts of every line of a month as the rated data says now.
pub(super) async fn current_amounts(
    conn: &mut PgConnection,
    aside: Option<&mut PgConnection>,
    month: Month,
    what_if: &WhatIf,
    settings: &Settings,
) -> LedgerResult<BTreeMap<LineKey, Amounts>> {
    let (_, end) = month_bounds(month.first_day(), settings.timezone);
    let lines = month_lines(conn, aside, month, Grouping::Whole, end, what_if, settings).await?;
    Ok(amounts_by_line(
        &lines.projects,
        &lines.shared,
        &lines.pools,
    ))
}

/// The amounts of each line, by who owns it: a project line's total and breakdown, and the
/// shared line of each currency: unused commitment no project owns, and the idle and down
/// cost kept on pools' own lines.
pub(super) fn amounts_by_line(
    projects: &[ProjectLine],
    shared: &[SharedLine],
    pools: &[PoolUtilisation],
) -> BTreeMap<LineKey, Amounts> {
    let mut amounts = BTreeMap::new();
    for line in projects {
        let b = &line.figures.breakdown;
        amounts.insert(
            (Some(line.project.clone()), line.currency.clone()),
            Amounts {
                total: line.figures.total,
                productive: b.productive,
                idle: b.idle,
                unmeasured: b.unmeasured,
                failed: b.failed,
                unused_commitment: b.unused_commitment,
                capacity_idle: b.capacity_idle,
                capacity_down: b.capacity_down,
            },
        );
    }
    for line in shared {
        amounts.insert(
            (None, line.currency.clone()),
            Amounts {
                total: line.unused_commitment,
                unused_commitment: line.unused_commitment,
                ..Amounts::default()
            },
        );
    }
    for line in pools {
        let Some(currency) = &line.currency else {
            continue;
        };
        let kept = &line.kept_on_pool;
        if kept.capacity_idle.is_zero() && kept.capacity_down.is_zero() {
            continue;
        }
        let sum: &mut Amounts = amounts.entry((None, currency.clone())).or_default();
        sum.total += kept.capacity_idle + kept.capacity_down;
        sum.capacity_idle += kept.capacity_idle;
        sum.capacity_down += kept.capacity_down;
    }
    amounts
}
