//! Capacity priced by a cloud bill (COST_MODEL.md §9, reconciliation): the rows of a bill
//! whose resource names nodes give those nodes' time its price, and win over contracts.
//!
//! A row names a node when its resource's keys meet the node's (its name, its cloud
//! provider id; see [`super::bill`]). The rows of one statement naming the same
//! resource over the same charge period in the same currency are one charge (an instance's
//! compute row and, say, a credit on it). A bill is stored as **runs**: the charges of one
//! resource that follow each other, each over as long a period and at the same cost (a month
//! of hourly rows at the on-demand rate is one run of 720 periods), so that a read fetches a
//! run, not its rows.
//!
//! A run's cost is spread over its nodes' paid GPU-seconds period by period, so a GPU-second
//! of a period costs `cost ÷ paid`. The periods of a run with the same paid time have the
//! same rate and are priced as one; so are the runs of one statement and set of nodes that
//! follow each other at the same rate.
//!
//! A period is left unmatched (and its rows reconciled by service and SKU) when its nodes
//! have no paid time in it, or when it overlaps a charge already taken of one of its nodes
//! (another resource naming the same node, or a charge in another currency): a node's time
//! has one price, and no billed unit is counted twice or dropped.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::bill::{BillRow, resource_keys};
use super::capacity::{BilledSpan, CapacityInterval};
use super::ledger_time::{SECONDS_PER_HOUR, seconds_between};

/// A run by its statement and number.
pub type RunId = (Uuid, i32);

/// Periods `first..=last` of a run.
pub type RunPart = (RunId, i32, i32);

/// A run as stored: `periods` charges of `cost_per_period` each, following each other from
/// `from`, each `period` long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    pub run: i32,
    /// The resource's keys: whole, and its last segment.
    pub keys: (String, Option<String>),
    pub currency: String,
    pub from: DateTime<Utc>,
    pub period: TimeDelta,
    pub periods: i32,
    pub cost_per_period: Decimal,
}

impl Run {
    pub fn until(&self) -> DateTime<Utc> {
        self.from + self.period * self.periods
    }
}

/// The runs of one statement's rows, and each row's `(run, period)` (`None` for a row with
/// no resource, or a period of no length).
pub fn runs_of(rows: &[&BillRow]) -> (Vec<Run>, Vec<Option<(i32, i32)>>) {
    type Group = (String, Option<String>, String);
    let mut charges: BTreeMap<Group, BTreeMap<Span, Decimal>> = BTreeMap::new();
    for row in rows {
        let Some(resource) = &row.resource_id else {
            continue;
        };
        if row.charge_until <= row.charge_from {
            continue;
        }
        let (full, tail) = resource_keys(resource);
        *charges
            .entry((full, tail, row.currency.clone()))
            .or_default()
            .entry((row.charge_from, row.charge_until))
            .or_default() += row.billed_cost;
    }
    let mut runs: Vec<Run> = Vec::new();
    let mut place: HashMap<(Group, Span), (i32, i32)> = HashMap::new();
    for (group, periods) in charges {
        let mut open: Option<usize> = None;
        // Periods of one resource that overlap others (a daily row beside hourly ones) start
        // runs of their own.
        for ((from, until), cost) in periods {
            let extends = open.map(|at| &runs[at]).is_some_and(|run| {
                run.until() == from && run.period == until - from && run.cost_per_period == cost
            });
            if extends {
                let at = open.expect("an open run");
                runs[at].periods += 1;
            } else {
                runs.push(Run {
                    run: runs.len() as i32,
                    keys: (group.0.clone(), group.1.clone()),
                    currency: group.2.clone(),
                    from,
                    period: until - from,
                    periods: 1,
                    cost_per_period: cost,
                });
                open = Some(runs.len() - 1);
            }
            let run = &runs[open.expect("an open run")];
            place.insert((group.clone(), (from, until)), (run.run, run.periods - 1));
        }
    }
    let placed = rows
        .iter()
        .map(|row| {
            let resource = row.resource_id.as_ref()?;
            let (full, tail) = resource_keys(resource);
            place
                .get(&(
                    (full, tail, row.currency.clone()),
                    (row.charge_from, row.charge_until),
                ))
                .copied()
        })
        .collect();
    (runs, placed)
}

/// A stored run whose resource may name nodes.
#[derive(Debug, Clone)]
pub struct ChargedRun {
    pub id: RunId,
    pub provider: String,
    pub run: Run,
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
    /// What the periods priced came to, exactly.
    pub billed: Decimal,
    /// The nodes' paid GPU-seconds over those periods.
    pub paid_seconds: Decimal,
    /// The runs' periods it prices.
    pub parts: Vec<RunPart>,
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
    /// Periods that price nothing: their nodes had no paid time, or their time was taken.
    pub unmatched: Vec<RunPart>,
}

/// Periods of one run over one set of nodes with the same paid time: one charge.
struct Charge {
    statement: Uuid,
    nodes: Vec<String>,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    currency: String,
    provider: String,
    billed: Decimal,
    paid: Decimal,
    parts: Vec<RunPart>,
}

/// A stretch of time, `[from, until)`.
type Span = (DateTime<Utc>, DateTime<Utc>);

/// The prices `runs` give the nodes of `intervals` (every interval of every node a run may
/// name, over the runs' periods).
pub fn bill_capacity(runs: &[ChargedRun], intervals: &[CapacityInterval]) -> BilledCapacity {
    let mut nodes_of_key: HashMap<String, BTreeSet<&str>> = HashMap::new();
    let mut intervals_of: HashMap<&str, Vec<&CapacityInterval>> = HashMap::new();
    for interval in intervals {
        for key in interval.resource_keys() {
            nodes_of_key.entry(key).or_default().insert(&interval.node);
        }
        intervals_of
            .entry(&interval.node)
            .or_default()
            .push(interval);
    }
    let mut billed = BilledCapacity::default();
    let mut charges = Vec::new();
    for charged in runs {
        let run = &charged.run;
        let named: BTreeSet<&str> = std::iter::once(&run.keys.0)
            .chain(run.keys.1.as_ref())
            .filter_map(|key| nodes_of_key.get(key))
            .flatten()
            .copied()
            .collect();
        let nodes: Vec<String> = named.into_iter().map(str::to_owned).collect();
        let node_intervals: Vec<&CapacityInterval> = nodes
            .iter()
            .flat_map(|node| intervals_of.get(node.as_str()).into_iter().flatten())
            .copied()
            .collect();
        let paid_in = |from: DateTime<Utc>, until: DateTime<Utc>| -> Decimal {
            node_intervals
                .iter()
                .filter(|i| i.from < until && i.until > from)
                .map(|i| {
                    Decimal::from(i.gpus) * seconds_between(i.from.max(from), i.until.min(until))
                })
                .sum()
        };
        // Consecutive periods with the same paid time are one charge.
        let mut open: Option<(Charge, Decimal)> = None;
        for k in 0..run.periods {
            let from = run.from + run.period * k;
            let until = from + run.period;
            let paid = paid_in(from, until);
            match &mut open {
                Some((charge, paid_each)) if *paid_each == paid => {
                    charge.until = until;
                    charge.billed += run.cost_per_period;
                    charge.paid += paid;
                    charge.parts[0].2 = k;
                }
                _ => {
                    charges.extend(open.take().map(|(charge, _)| charge));
                    open = Some((
                        Charge {
                            statement: charged.id.0,
                            nodes: nodes.clone(),
                            from,
                            until,
                            currency: run.currency.clone(),
                            provider: charged.provider.clone(),
                            billed: run.cost_per_period,
                            paid,
                            parts: vec![(charged.id, k, k)],
                        },
                        paid,
                    ));
                }
            }
        }
        charges.extend(open.map(|(charge, _)| charge));
    }
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
        if charge.nodes.is_empty() || charge.paid.is_zero() || overlaps {
            billed.unmatched.extend(charge.parts);
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
                prior.parts.extend(charge.parts);
            }
            None => accepted.push(charge),
        }
    }
    for charge in accepted {
        let id = price_id(charge.parts[0]);
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
                parts: charge.parts,
            },
        );
    }
    for spans in billed.spans.values_mut() {
        spans.sort_by_key(|span| span.from);
    }
    billed
}

/// The id a price goes by: derived from its first period, so the same bill prices the same
/// time under the same id on every read.
fn price_id(((statement, run), first, _): RunPart) -> Uuid {
    let mut hasher = Sha256::new();
    hasher.update(statement.as_bytes());
    hasher.update(run.to_be_bytes());
    hasher.update(first.to_be_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capacity::NodeState;
    use crate::domain::rating::BillingMode;
    use chrono::TimeZone;

    fn at(hour: u32, minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 3, hour, minute, 0).unwrap()
    }

    fn interval(
        node: &str,
        provider_id: &str,
        gpus: i32,
        from: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> CapacityInterval {
        CapacityInterval {
            node: node.to_owned(),
            pool: "p".to_owned(),
            gpu_model: "H100".to_owned(),
            gpus,
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
        line: u64,
        resource: &str,
        (from, until): (DateTime<Utc>, DateTime<Utc>),
        cost: &str,
        currency: &str,
    ) -> BillRow {
        BillRow {
            line,
            provider: "AWS".to_owned(),
            billing_account: "1".to_owned(),
            billing_period_start: at(0, 0),
            charge_category: "Usage".to_owned(),
            charge_from: from,
            charge_until: until,
            billed_cost: cost.parse().unwrap(),
            currency: currency.to_owned(),
            resource_id: Some(resource.to_owned()),
            service: "EC2".to_owned(),
            sku: "X".to_owned(),
            region: None,
            billing_mode: BillingMode::OnDemand,
            consumed_hours: None,
            instance: None,
        }
    }

    /// The runs of `rows` as one statement stores them, and what they price.
    fn priced(
        rows: &[BillRow],
        intervals: &[CapacityInterval],
    ) -> (BilledCapacity, Vec<Option<(i32, i32)>>) {
        let refs: Vec<&BillRow> = rows.iter().collect();
        let (runs, placed) = runs_of(&refs);
        let charged: Vec<ChargedRun> = runs
            .into_iter()
            .map(|run| ChargedRun {
                id: (Uuid::nil(), run.run),
                provider: "AWS".to_owned(),
                run,
            })
            .collect();
        (bill_capacity(&charged, intervals), placed)
    }

    /// The lines of `rows` a set of run parts covers.
    fn lines(parts: &[RunPart], placed: &[Option<(i32, i32)>], rows: &[BillRow]) -> Vec<u64> {
        let mut lines: Vec<u64> = rows
            .iter()
            .zip(placed)
            .filter(|(_, place)| {
                place.is_some_and(|(run, period)| {
                    parts
                        .iter()
                        .any(|((_, r), a, b)| *r == run && *a <= period && period <= *b)
                })
            })
            .map(|(row, _)| row.line)
            .collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn hourly_rows_at_one_rate_price_as_one_and_others_apart() {
        let intervals = [interval(
            "a",
            "aws:///us-east-1a/i-1",
            8,
            at(0, 0),
            at(6, 0),
        )];
        let rows = [
            row(2, "i-1", (at(0, 0), at(1, 0)), "98.32", "USD"),
            row(3, "i-1", (at(1, 0), at(2, 0)), "98.32", "USD"),
            row(4, "i-1", (at(2, 0), at(3, 0)), "40", "USD"),
            row(5, "i-1", (at(2, 0), at(3, 0)), "-1.5", "USD"),
            row(6, "i-1", (at(2, 30), at(3, 30)), "7", "EUR"),
            row(7, "i-2", (at(0, 0), at(1, 0)), "3", "USD"),
            row(8, "i-1", (at(7, 0), at(8, 0)), "3", "USD"),
        ];
        let (billed, placed) = priced(&rows, &intervals);
        assert_eq!(billed.prices.len(), 2);
        let spans = &billed.spans["a"];
        assert_eq!(
            spans.iter().map(|s| (s.from, s.until)).collect::<Vec<_>>(),
            [(at(0, 0), at(2, 0)), (at(2, 0), at(3, 0))]
        );
        let first = &billed.prices[&spans[0].price_id];
        assert_eq!(first.billed, "196.64".parse::<Decimal>().unwrap());
        assert_eq!(first.per_gpu_hour(), "12.29".parse::<Decimal>().unwrap());
        assert_eq!(lines(&first.parts, &placed, &rows), [2, 3]);
        let second = &billed.prices[&spans[1].price_id];
        assert_eq!(second.billed, "38.5".parse::<Decimal>().unwrap());
        assert_eq!(lines(&second.parts, &placed, &rows), [4, 5]);
        assert_eq!(
            lines(&billed.unmatched, &placed, &rows),
            [6, 7, 8],
            "other currency overlapping, unknown, no paid time"
        );
        let total: Decimal = rows
            .iter()
            .filter(|r| r.currency == "USD")
            .map(|r| r.billed_cost)
            .sum();
        let priced_total: Decimal = billed.prices.values().map(|p| p.billed).sum();
        let left: Decimal = rows
            .iter()
            .filter(|r| r.currency == "USD" && [7, 8].contains(&r.line))
            .map(|r| r.billed_cost)
            .sum();
        assert_eq!(priced_total + left, total, "every billed unit once");
    }

    #[test]
    fn a_run_splits_where_its_nodes_paid_time_changes() {
        // Four hours at 24 an hour; the node has 8 GPUs for two hours, then 4, then none.
        let intervals = [
            interval("a", "aws:///z/i-1", 8, at(0, 0), at(2, 0)),
            interval("a", "aws:///z/i-1", 4, at(2, 0), at(3, 0)),
        ];
        let rows: Vec<BillRow> = (0..4)
            .map(|h| row(2 + h as u64, "i-1", (at(h, 0), at(h + 1, 0)), "24", "USD"))
            .collect();
        let (billed, placed) = priced(&rows, &intervals);
        let rates: Vec<(DateTime<Utc>, Decimal)> = billed.spans["a"]
            .iter()
            .map(|s| (s.from, billed.prices[&s.price_id].per_gpu_hour()))
            .collect();
        assert_eq!(
            rates,
            [(at(0, 0), Decimal::from(3)), (at(2, 0), Decimal::from(6))]
        );
        assert_eq!(lines(&billed.unmatched, &placed, &rows), [5]);
    }

    #[test]
    fn a_scale_set_row_spreads_over_its_instances_by_paid_time() {
        let set = "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/gpu";
        let intervals = [
            interval(
                "n0",
                &format!("{set}/virtualMachines/0"),
                8,
                at(0, 0),
                at(1, 0),
            ),
            interval(
                "n1",
                &format!("{set}/virtualMachines/1"),
                8,
                at(0, 0),
                at(0, 30),
            ),
        ];
        let rows = [row(
            2,
            "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachinescalesets/gpu",
            (at(0, 0), at(1, 0)),
            "36",
            "USD",
        )];
        let (billed, _) = priced(&rows, &intervals);
        let price = billed.prices.values().next().unwrap();
        assert_eq!(price.nodes, ["n0", "n1"]);
        assert_eq!(price.paid_seconds, Decimal::from(8 * 3600 + 8 * 1800));
        assert_eq!(price.per_gpu_hour(), Decimal::from(3));
    }

    #[test]
    fn runs_follow_a_resource_while_its_periods_and_costs_repeat() {
        let rows = [
            row(2, "i-1", (at(0, 0), at(1, 0)), "2", "USD"),
            row(3, "i-1", (at(1, 0), at(2, 0)), "2", "USD"),
            row(4, "i-1", (at(2, 0), at(3, 0)), "2.5", "USD"),
            row(5, "i-1", (at(3, 0), at(4, 0)), "2.5", "USD"),
            row(6, "i-1", (at(5, 0), at(6, 0)), "2.5", "USD"),
        ];
        let refs: Vec<&BillRow> = rows.iter().collect();
        let (runs, placed) = runs_of(&refs);
        assert_eq!(
            runs.iter().map(|r| (r.from, r.periods)).collect::<Vec<_>>(),
            [(at(0, 0), 2), (at(2, 0), 2), (at(5, 0), 1)]
        );
        assert_eq!(
            placed,
            [
                Some((0, 0)),
                Some((0, 1)),
                Some((1, 0)),
                Some((1, 1)),
                Some((2, 0))
            ]
        );
    }
}
