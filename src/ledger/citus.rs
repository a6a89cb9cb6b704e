//! Placing the ledger on Citus: every table of the schema is either a reference table (small,
//! the company's: projects, contracts, prices, tokens, the fleet, bills, the audit log),
//! copied to every node, or distributed by `project_id` and co-located with `job_records`,
//! so that every statement about one project runs on the one node holding it and a project's
//! rows join on that node. `distribute` does it in one transaction, on an empty or a populated
//! database, and again after an upgrade added tables; a table the schema gains must be named
//! here, or `distribute` refuses to guess.

use sqlx::PgPool;

use crate::ledger::LedgerResult;
use crate::ledger::error::LedgerError;
use crate::store;

/// The table every distributed table is co-located with.
pub const ANCHOR: &str = "job_records";

/// Sharded by `project_id`, co-located with [`ANCHOR`].
pub const DISTRIBUTED: [&str; 24] = [
    "job_records",
    "job_record_versions",
    "rated_segments",
    "rated_records",
    "tasks",
    "task_monthly",
    "cost_daily",
    "cost_monthly",
    "cost_monthly_kinds",
    "records_daily",
    "records_monthly",
    "util_daily",
    "util_monthly",
    "contract_usage_hourly",
    "capacity_usage_hourly",
    "budgets",
    "routes",
    "alert_events",
    "alert_deliveries",
    "alert_delivery_attempts",
    "channel_deliveries",
    "channel_delivery_attempts",
    "efficiency_regression_rules",
    "efficiency_regression_states",
];

/// Copied to every node.
pub const REFERENCE: [&str; 25] = [
    "projects",
    "contracts",
    "fx_rates",
    "api_tokens",
    "settings",
    "month_closes",
    "rerating_jobs",
    "pools",
    "capacity_intervals",
    "zombie_stretches",
    "capacity_node_days",
    "capacity_unmatched_days",
    "capacity_pool_days",
    "capacity_pool_weights",
    "bills",
    "bill_statements",
    "bill_rows",
    "bill_runs",
    "channels",
    "grid_intensity",
    "sign_in_attempts",
    "sign_in_sessions",
    "audit_log",
    "audit_head",
    "contract_usage_daily",
];

/// Kept on the coordinator only: the migrator's own record.
pub const COORDINATOR_ONLY: [&str; 1] = ["_sqlx_migrations"];

/// Where a table goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    Distributed,
    Reference,
    CoordinatorOnly,
}

/// Where `table` goes, or `None` for a table this build does not know.
pub fn placement_of(table: &str) -> Option<Placement> {
    if DISTRIBUTED.contains(&table) {
        Some(Placement::Distributed)
    } else if REFERENCE.contains(&table) {
        Some(Placement::Reference)
    } else if COORDINATOR_ONLY.contains(&table) {
        Some(Placement::CoordinatorOnly)
    } else {
        None
    }
}

/// What `distribute` did.
#[derive(Debug, Default)]
pub struct Distribution {
    pub made_reference: Vec<String>,
    pub distributed: Vec<String>,
    /// Tables Citus already placed as they should be.
    pub already: usize,
}

/// Makes the reference and distributed tables of the schema that Citus does not place yet.
/// The foreign keys touching them are dropped and made again around it, in the same
/// transaction, since Citus accepts them only between tables it already places. With
/// `shard_count`, the tables distributed now get that many shards (Citus' own default
/// otherwise).
pub async fn distribute(pool: &PgPool, shard_count: Option<u32>) -> LedgerResult<Distribution> {
    let mut tx = pool.begin().await?;
    if !store::citus::installed(&mut tx).await? {
        return Err(LedgerError::conflict(
            "this database has no citus extension: run CREATE EXTENSION citus on the \
             coordinator and the workers, and register the workers, first",
        ));
    }
    let mut outcome = Distribution::default();
    let mut pending = Vec::new();
    for table in store::citus::tables(&mut tx).await? {
        let wanted = placement_of(&table).ok_or_else(|| {
            LedgerError::Internal(anyhow::anyhow!(
                "table `{table}` has no place on Citus in this build"
            ))
        })?;
        let method = match wanted {
            Placement::CoordinatorOnly => continue,
            Placement::Distributed => "h",
            Placement::Reference => "n",
        };
        match store::citus::placement(&mut tx, &table).await? {
            None => pending.push((table, wanted)),
            Some(found) if found == method => outcome.already += 1,
            Some(found) => {
                return Err(LedgerError::conflict(format!(
                    "table `{table}` is placed by Citus as `{found}`, not as taskledger \
                     places it (`{method}`); undistribute it first"
                )));
            }
        }
    }
    if pending.is_empty() {
        return Ok(outcome);
    }
    store::citus::prepare_transaction(&mut tx, shard_count).await?;
    let touched = |name: &str| pending.iter().any(|(table, _)| table == name);
    let keys: Vec<_> = store::citus::foreign_keys(&mut tx)
        .await?
        .into_iter()
        .filter(|key| touched(&key.table) || touched(&key.references))
        .collect();
    for key in &keys {
        store::citus::drop_foreign_key(&mut tx, key).await?;
    }
    for (table, _) in pending.iter().filter(|(_, p)| *p == Placement::Reference) {
        store::citus::create_reference_table(&mut tx, table).await?;
        outcome.made_reference.push(table.clone());
    }
    // The anchor first: the others are co-located with it.
    let mut distributed: Vec<&String> = pending
        .iter()
        .filter(|(_, p)| *p == Placement::Distributed)
        .map(|(table, _)| table)
        .collect();
    distributed.sort_by_key(|table| table.as_str() != ANCHOR);
    for table in distributed {
        let anchor = (table != ANCHOR).then_some(ANCHOR);
        store::citus::distribute_by_project(&mut tx, table, anchor).await?;
        outcome.distributed.push(table.clone());
    }
    for key in &keys {
        store::citus::add_foreign_key(&mut tx, key).await?;
    }
    tx.commit().await?;
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_table_has_two_places() {
        for table in DISTRIBUTED {
            assert!(!REFERENCE.contains(&table), "{table}");
        }
        assert!(DISTRIBUTED.contains(&ANCHOR));
    }
}
