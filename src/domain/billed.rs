//! Capacity priced by a cloud bill (COST_MODEL.md §9, reconciliation): the rows of a bill
//! whose resource names nodes give those nodes' time its price, and win over contracts.
//!
//! A row names a node when its resource's keys meet the node's (its name, its cloud
//! provider id; see [`super::focus_bill`]). The rows naming the same nodes over the same
//! charge period in the same currency are one charge (an instance's compute row and, say,
//! a credit on it) of one statement; its billed cost is spread over the nodes' paid
//! GPU-seconds in that period, so a GPU-second of it costs `billed ÷ paid`. Charges of one
//! statement and set of nodes that follow each other at the same rate are priced as one, so
//! that a month of hourly rows at the on-demand rate cuts no figure into hours.
//!
//! A row is left unmatched (and reconciled by its service and SKU) when its nodes have no
//! paid time in its period, or when its period overlaps another charge of one of its nodes
//! with other bounds or in another currency: a node's time has one price, and no row's
//! money is counted twice or dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::capacity::{BilledSpan, CapacityInterval};
use super::ledger_time::{SECONDS_PER_HOUR, seconds_between};

/// A bill row by its statement and line.
pub type RowId = (Uuid, i64);

/// A stored bill row whose resource may name nodes.
#[derive(Debug, Clone)]
pub struct ChargedRow {
    pub id: RowId,
    pub provider: String,
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub billed_cost: Decimal,
    pub currency: String,
    /// The resource's keys: whole, and its last segment.
    pub keys: (String, Option<String>),
}

/// One price a bill gives some nodes' time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BilledPrice {
    pub id: Uuid,
    pub provider: String,
    pub currency: String,
    pub from: DateTime<Utc>,
    pub until: DateTime<Utc>,
    pub nodes: Vec<String>,
    /// What the rows came to, exactly.
    pub billed: Decimal,
    /// The nodes' paid GPU-seconds over the charge periods.
    pub paid_seconds: Decimal,
    pub rows: Vec<RowId>,
}

impl BilledPrice {
    /// The price of a GPU-hour of the nodes' time, in `currency`.
    pub fn per_gpu_hour(&self) -> Decimal {
        self.billed * SECONDS_PER_HOUR / self.paid_seconds
    }
}

/// The nodes' time a bill prices.
#[derive(Debug, Default, Clone)]
pub struct BilledCapacity {
    /// By node, sorted, never overlapping.
    pub spans: HashMap<String, Vec<BilledSpan>>,
    pub prices: BTreeMap<Uuid, BilledPrice>,
    /// Rows that name no node with paid time, or whose charge conflicts with another.
    pub unmatched: Vec<RowId>,
}

/// A charge's key: the nodes its rows name, its period, currency and statement.
type ChargeKey = (Vec<String>, DateTime<Utc>, DateTime<Utc>, String, Uuid);

/// A stretch of time, `[from, until)`.
type Span = (DateTime<Utc>, DateTime<Utc>);

/// Rows grouped into one charge.
struct Charge {
    statement: Uuid,
    nodes: Vec<String>,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    currency: String,
    provider: String,
    billed: Decimal,
    paid: Decimal,
    rows: Vec<RowId>,
}

/// The prices `rows` give the nodes of `intervals` (every interval of every node a row may
/// name, over the rows' charge periods).
pub fn bill_capacity(rows: &[ChargedRow], intervals: &[CapacityInterval]) -> BilledCapacity {
    let mut keys_of: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    let mut intervals_of: HashMap<&str, Vec<&CapacityInterval>> = HashMap::new();
    for interval in intervals {
        keys_of
            .entry(&interval.node)
            .or_default()
            .extend(interval.resource_keys());
        intervals_of
            .entry(&interval.node)
            .or_default()
            .push(interval);
    }
    // Each key with the nodes it names, in name order.
    let mut nodes_of_key: HashMap<String, BTreeSet<&str>> = HashMap::new();
    for (node, keys) in keys_of {
        for key in keys {
            nodes_of_key.entry(key).or_default().insert(node);
        }
    }
    let mut billed = BilledCapacity::default();
    let mut charges: BTreeMap<ChargeKey, Charge> = BTreeMap::new();
    for row in rows {
        let named: BTreeSet<&str> = std::iter::once(&row.keys.0)
            .chain(row.keys.1.as_ref())
            .filter_map(|key| nodes_of_key.get(key))
            .flatten()
            .copied()
            .collect();
        let nodes: Vec<String> = named.into_iter().map(str::to_owned).collect();
        if nodes.is_empty() || row.until <= row.from {
            billed.unmatched.push(row.id);
            continue;
        }
        let charge = charges
            .entry((
                nodes.clone(),
                row.from,
                row.until,
                row.currency.clone(),
                row.id.0,
            ))
            .or_insert_with(|| Charge {
                statement: row.id.0,
                paid: nodes
                    .iter()
                    .flat_map(|node| intervals_of.get(node.as_str()).into_iter().flatten())
                    .map(|interval| {
                        let (from, until) =
                            (interval.from.max(row.from), interval.until.min(row.until));
                        if from < until {
                            Decimal::from(interval.gpus) * seconds_between(from, until)
                        } else {
                            Decimal::ZERO
                        }
                    })
                    .sum(),
                nodes,
                from: row.from,
                until: row.until,
                currency: row.currency.clone(),
                provider: row.provider.clone(),
                billed: Decimal::ZERO,
                rows: Vec::new(),
            });
        charge.billed += row.billed_cost;
        charge.rows.push(row.id);
    }
    let mut charges: Vec<Charge> = charges.into_values().collect();
    charges.sort_by(|a, b| (a.from, &a.nodes, a.until).cmp(&(b.from, &b.nodes, b.until)));
    let mut taken: HashMap<String, Vec<Span>> = HashMap::new();
    let mut accepted: Vec<Charge> = Vec::new();
    for charge in charges {
        let overlaps = charge.nodes.iter().any(|node| {
            taken.get(node).is_some_and(|spans| {
                spans
                    .iter()
                    .any(|(from, until)| *from < charge.until && *until > charge.from)
            })
        });
        if charge.paid.is_zero() || overlaps {
            billed.unmatched.extend(charge.rows);
            continue;
        }
        for node in &charge.nodes {
            taken
                .entry(node.clone())
                .or_default()
                .push((charge.from, charge.until));
        }
        let follows = accepted.iter_mut().rev().find(|prior| {
            prior.nodes == charge.nodes
                && prior.statement == charge.statement
                && prior.currency == charge.currency
                && prior.until == charge.from
                && prior.billed * charge.paid == charge.billed * prior.paid
        });
        match follows {
            Some(prior) => {
                prior.until = charge.until;
                prior.billed += charge.billed;
                prior.paid += charge.paid;
                prior.rows.extend(charge.rows);
            }
            None => accepted.push(charge),
        }
    }
    for charge in accepted {
        let id = price_id(charge.rows[0]);
        for node in &charge.nodes {
            billed
                .spans
                .entry(node.clone())
                .or_default()
                .push(BilledSpan {
                    from: charge.from,
                    until: charge.until,
                    price_id: id,
                });
        }
        billed.prices.insert(
            id,
            BilledPrice {
                id,
                provider: charge.provider,
                currency: charge.currency,
                from: charge.from,
                until: charge.until,
                nodes: charge.nodes,
                billed: charge.billed,
                paid_seconds: charge.paid,
                rows: charge.rows,
            },
        );
    }
    for spans in billed.spans.values_mut() {
        spans.sort_by_key(|span| span.from);
    }
    billed
}

/// The id a price goes by: derived from its first row, so the same bill prices the same
/// time under the same id on every read.
fn price_id((statement, line): RowId) -> Uuid {
    let mut hasher = Sha256::new();
    hasher.update(statement.as_bytes());
    hasher.update(line.to_be_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capacity::NodeState;
    use crate::domain::focus_bill::resource_keys;
    use crate::domain::rating::BillingMode;
    use chrono::TimeZone;

    fn at(hour: u32, minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 3, hour, minute, 0).unwrap()
    }

    fn interval(
        node: &str,
        provider_id: &str,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> CapacityInterval {
        CapacityInterval {
            node: node.to_owned(),
            pool: "p".to_owned(),
            gpu_model: "H100".to_owned(),
            gpus: 8,
            billing_mode: BillingMode::OnDemand,
            provider: None,
            region: None,
            labels: [("provider_id".to_owned(), provider_id.to_owned())].into(),
            from,
            until,
            state: NodeState::Up,
        }
    }

    fn row(
        line: i64,
        resource: &str,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
        cost: &str,
        currency: &str,
    ) -> ChargedRow {
        ChargedRow {
            id: (Uuid::nil(), line),
            provider: "AWS".to_owned(),
            from,
            until,
            billed_cost: cost.parse().unwrap(),
            currency: currency.to_owned(),
            keys: resource_keys(resource),
        }
    }

    #[test]
    fn hourly_rows_at_one_rate_price_as_one_and_others_apart() {
        let intervals = [interval("a", "aws:///us-east-1a/i-1", at(0, 0), at(6, 0))];
        let rows = [
            row(2, "i-1", at(0, 0), at(1, 0), "98.32", "USD"),
            row(3, "i-1", at(1, 0), at(2, 0), "98.32", "USD"),
            row(4, "i-1", at(2, 0), at(3, 0), "40", "USD"),
            row(5, "i-1", at(2, 0), at(3, 0), "-1.5", "USD"),
            row(6, "i-1", at(2, 30), at(3, 30), "7", "EUR"),
            row(7, "i-2", at(0, 0), at(1, 0), "3", "USD"),
            row(8, "i-1", at(7, 0), at(8, 0), "3", "USD"),
        ];
        let billed = bill_capacity(&rows, &intervals);
        assert_eq!(billed.prices.len(), 2);
        let spans = &billed.spans["a"];
        assert_eq!(
            spans.iter().map(|s| (s.from, s.until)).collect::<Vec<_>>(),
            [(at(0, 0), at(2, 0)), (at(2, 0), at(3, 0))]
        );
        let first = &billed.prices[&spans[0].price_id];
        assert_eq!(first.billed, "196.64".parse::<Decimal>().unwrap());
        assert_eq!(first.per_gpu_hour(), "12.29".parse::<Decimal>().unwrap());
        let second = &billed.prices[&spans[1].price_id];
        assert_eq!(second.billed, "38.5".parse::<Decimal>().unwrap());
        assert_eq!(second.rows.len(), 2);
        let mut unmatched: Vec<i64> = billed.unmatched.iter().map(|r| r.1).collect();
        unmatched.sort_unstable();
        assert_eq!(
            unmatched,
            [6, 7, 8],
            "other currency overlapping, unknown, no paid time"
        );
        let total: Decimal = rows
            .iter()
            .filter(|r| r.currency == "USD")
            .map(|r| r.billed_cost)
            .sum();
        let priced: Decimal = billed.prices.values().map(|p| p.billed).sum();
        let left: Decimal = rows
            .iter()
            .filter(|r| r.currency == "USD" && billed.unmatched.contains(&r.id))
            .map(|r| r.billed_cost)
            .sum();
        assert_eq!(priced + left, total, "every billed unit once");
    }

    #[test]
    fn a_scale_set_row_spreads_over_its_instances_by_paid_time() {
        let set = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu";
        let intervals = [
            interval(
                "n0",
                &format!("{set}/virtualMachines/0"),
                at(0, 0),
                at(1, 0),
            ),
            interval(
                "n1",
                &format!("{set}/virtualMachines/1"),
                at(0, 0),
                at(0, 30),
            ),
        ];
        let rows = [row(
            2,
            "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/gpu",
            at(0, 0),
            at(1, 0),
            "36",
            "USD",
        )];
        let billed = bill_capacity(&rows, &intervals);
        let price = billed.prices.values().next().unwrap();
        assert_eq!(price.nodes, ["n0", "n1"]);
        assert_eq!(price.paid_seconds, Decimal::from(8 * 3600 + 8 * 1800));
        assert_eq!(price.per_gpu_hour(), Decimal::from(3));
    }
}
