//! How the capacity of a window is read: paid and down time cut from the intervals per pool,
//! ledger day and contract (and per node and month when node lines are asked for), and used
//! and overbooked time taken from the rollup, so that a read costs a row per pool and day,
//! not a row per job hour.
//!
//! A pool whose time in the window is all priced by one contract takes its used time summed
//! by the database per day (and per node). A pool priced by several takes it per node-day,
//! each from the contract pricing the node-day, except where that contract changes within
//! the day: such node-days, and the days the window cuts, are settled hour by hour from the
//! hourly usage, as [`crate::domain::capacity::capacity_figures`] settles every hour. The figures are the
//! same either way.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, NaiveDate, Utc};
use chrono_tz::Tz;
use rust_decimal::Decimal;
use uuid::Uuid;

use crate::domain::capacity::{
    CapacityInterval, CapacitySeconds, DayKey, HourUses, NodeDay, NodeDayUse, NodeState, NodeUse,
    PriceBook, UnmatchedDay, by_node, day_bounds, priced_spans, settle_node,
};
use crate::domain::ledger_time::first_of_month;
use crate::domain::rating::BillingMode;

/// How finely a window's figures are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Per pool, day and contract.
    Pools,
    /// Per node and month as well.
    Nodes,
}

/// The capacity of one pool on one ledger day under one contract, in GPU-seconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolDay {
    pub pool: String,
    pub day: NaiveDate,
    /// First day of the ledger month.
    pub month: NaiveDate,
    /// The contract pricing this time; `None` when none does.
    pub contract_id: Option<Uuid>,
    pub gpu_model: String,
    pub billing_mode: BillingMode,
    pub seconds: CapacitySeconds,
}

/// The capacity of one node of a pool over a ledger month under one contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMonth {
    pub pool: String,
    pub node: String,
    pub month: NaiveDate,
    pub contract_id: Option<Uuid>,
    /// The model and GPUs of the node's latest interval in the month.
    pub gpu_model: String,
    pub gpus: i32,
    pub seconds: CapacitySeconds,
}

/// The capacity figures of a window.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WindowFigures {
    /// By pool, day, contract, model and billing mode.
    pub days: Vec<PoolDay>,
    /// By pool, node, month and contract; empty unless [`Detail::Nodes`] was asked for.
    pub nodes: Vec<NodeMonth>,
    /// GPU-seconds records put on a pool's node in hours no interval of it covers: pool →
    /// node → seconds.
    pub unmatched: BTreeMap<String, BTreeMap<String, Decimal>>,
    /// `by_usage` weights: (pool, month) → project → GPU-seconds.
    pub usage: BTreeMap<(String, NaiveDate), BTreeMap<String, Decimal>>,
}

/// The rollup's used and overbooked time of the pools priced by one contract, summed by
/// the database over the days wholly inside the window.
#[derive(Debug, Default, Clone)]
pub struct RollupSums {
    /// (pool, day, used, overbooked).
    pub by_day: Vec<(String, NaiveDate, Decimal, Decimal)>,
    /// (pool, node, month, used, overbooked); only with [`Detail::Nodes`].
    pub by_node: Vec<(String, String, NaiveDate, Decimal, Decimal)>,
}

/// GPU-nanoseconds, exact.
#[derive(Debug, Default, Clone, Copy)]
struct Cell {
    paid: i128,
    down: i128,
    used: Decimal,
    overbooked: Decimal,
}

impl Cell {
    fn add_time(&mut self, gpu_nanos: i128, state: NodeState) {
        self.paid += gpu_nanos;
        if state == NodeState::Down {
            self.down += gpu_nanos;
        }
    }

    fn add_use(&mut self, used: Decimal, overbooked: Decimal) {
        self.used += used;
        self.overbooked += overbooked;
    }

    fn seconds(&self) -> CapacitySeconds {
        let paid = Decimal::from_i128_with_scale(self.paid, 9).normalize();
        let down = Decimal::from_i128_with_scale(self.down, 9).normalize();
        CapacitySeconds {
            paid,
            used: self.used,
            idle: paid - self.used - down,
            down,
            overbooked: self.overbooked,
        }
    }
}

#[derive(Debug)]
struct NodeCell {
    cell: Cell,
    gpu_model: String,
    gpus: i32,
    latest: DateTime<Utc>,
}

/// Whether all of a pool's time has one contract, model and billing mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pricing {
    Unset,
    One(Option<Uuid>, usize),
    Several,
}

type DayCellKey = (usize, usize, Option<Uuid>, usize);
type NodeCellKey = (usize, usize, NaiveDate, Option<Uuid>);

/// A window's paid and down time, and where its used time is to come from.
#[derive(Debug)]
pub struct Plan {
    window: (DateTime<Utc>, DateTime<Utc>),
    tz: Tz,
    detail: Detail,
    /// The ledger days the window touches: day, start, end.
    days: Vec<(NaiveDate, DateTime<Utc>, DateTime<Utc>)>,
    pools: Vec<String>,
    pool_index: HashMap<String, usize>,
    nodes: Vec<String>,
    node_index: HashMap<String, usize>,
    /// Model and billing mode.
    kinds: Vec<(String, BillingMode)>,
    day_cells: HashMap<DayCellKey, Cell>,
    node_cells: HashMap<NodeCellKey, NodeCell>,
    pricing: Vec<Pricing>,
    /// Of the pools priced by several contracts: each node-day's contract and kind, by
    /// (node, day, pool).
    node_day_pricing: HashMap<(usize, usize, usize), (Option<Uuid>, usize)>,
    /// (node, day, pool) settled hour by hour: a contract changes within the day.
    split: HashSet<(usize, usize, usize)>,
    /// Each node's pool at the end of the window: where its unmatched time is shown.
    last_pool: Vec<usize>,
}

fn nanos(at: DateTime<Utc>) -> i128 {
    i128::from(at.timestamp()) * 1_000_000_000 + i128::from(at.timestamp_subsec_nanos())
}

impl Plan {
    /// Cuts `intervals` (of the pools read) by ledger day and by the contracts among
    /// `contracts` that price them (each matched with its pool owner's project, `owners`).
    pub fn new(
        intervals: &[CapacityInterval],
        book: &PriceBook<'_>,
        window: (DateTime<Utc>, DateTime<Utc>),
        tz: Tz,
        detail: Detail,
    ) -> Self {
        let mut plan = Self {
            window,
            tz,
            detail,
            days: Vec::new(),
            pools: Vec::new(),
            pool_index: HashMap::new(),
            nodes: Vec::new(),
            node_index: HashMap::new(),
            kinds: Vec::new(),
            day_cells: HashMap::new(),
            node_cells: HashMap::new(),
            pricing: Vec::new(),
            node_day_pricing: HashMap::new(),
            split: HashSet::new(),
            last_pool: Vec::new(),
        };
        if window.1 <= window.0 {
            return plan;
        }
        let mut day = window.0.with_timezone(&tz).date_naive();
        loop {
            let (start, end) = day_bounds(day, tz);
            if start >= window.1 {
                break;
            }
            plan.days.push((day, start, end));
            day = day.succ_opt().expect("a day before the end of time");
        }
        // Every interval's priced spans first, to learn which pools have one price.
        let mut spans = Vec::new();
        for (node, node_intervals) in by_node(intervals, window) {
            let n = plan.nodes.len();
            plan.nodes.push(node.to_owned());
            plan.node_index.insert(node.to_owned(), n);
            for interval in &node_intervals {
                let p = plan.pool(&interval.pool);
                let k = plan.kind(&interval.gpu_model, interval.billing_mode);
                for (start, end, contract) in priced_spans(interval, book, window) {
                    plan.pricing[p] = match plan.pricing[p] {
                        Pricing::Unset => Pricing::One(contract, k),
                        Pricing::One(c, kind) if (c, kind) != (contract, k) => Pricing::Several,
                        pricing => pricing,
                    };
                    spans.push((n, *interval, p, k, start, end, contract));
                }
            }
            let last = node_intervals.last().expect("a node has intervals");
            let p = plan.pool(&last.pool);
            plan.last_pool.push(p);
        }
        for (n, interval, p, k, start, end, contract) in spans {
            plan.add_span(n, interval, p, k, (start, end), contract);
        }
        plan
    }

    fn pool(&mut self, pool: &str) -> usize {
        if let Some(&p) = self.pool_index.get(pool) {
            return p;
        }
        self.pools.push(pool.to_owned());
        self.pricing.push(Pricing::Unset);
        self.pool_index
            .insert(pool.to_owned(), self.pools.len() - 1);
        self.pools.len() - 1
    }

    fn kind(&mut self, gpu_model: &str, billing_mode: BillingMode) -> usize {
        match self
            .kinds
            .iter()
            .position(|(m, b)| m == gpu_model && *b == billing_mode)
        {
            Some(k) => k,
            None => {
                self.kinds.push((gpu_model.to_owned(), billing_mode));
                self.kinds.len() - 1
            }
        }
    }

    /// Adds one priced span of an interval, day by day.
    fn add_span(
        &mut self,
        n: usize,
        interval: &CapacityInterval,
        p: usize,
        k: usize,
        (start, end): (DateTime<Utc>, DateTime<Utc>),
        contract: Option<Uuid>,
    ) {
        let gpus = i128::from(interval.gpus);
        let several = self.pricing[p] == Pricing::Several;
        let mut d = self.days.partition_point(|day| day.2 <= start);
        while d < self.days.len() && self.days[d].1 < end {
            let (day, day_start, day_end) = self.days[d];
            let (from, until) = (start.max(day_start), end.min(day_end));
            let gpu_nanos = gpus * (nanos(until) - nanos(from));
            self.day_cells
                .entry((p, d, contract, k))
                .or_default()
                .add_time(gpu_nanos, interval.state);
            if self.detail == Detail::Nodes {
                let cell = self
                    .node_cells
                    .entry((p, n, first_of_month(day), contract))
                    .or_insert_with(|| NodeCell {
                        cell: Cell::default(),
                        gpu_model: interval.gpu_model.clone(),
                        gpus: interval.gpus,
                        latest: from,
                    });
                cell.cell.add_time(gpu_nanos, interval.state);
                if from >= cell.latest {
                    cell.latest = from;
                    cell.gpu_model.clone_from(&interval.gpu_model);
                    cell.gpus = interval.gpus;
                }
            }
            if several {
                // A contract that starts or stops within the day cuts the interval there.
                let whole =
                    from == interval.from.max(day_start) && until == interval.until.min(day_end);
                let pricing = *self
                    .node_day_pricing
                    .entry((n, d, p))
                    .or_insert((contract, k));
                if !whole || pricing != (contract, k) {
                    self.split.insert((n, d, p));
                }
            }
            d += 1;
        }
    }

    /// Whether ledger day `d` is cut by the window.
    fn is_edge(&self, d: usize) -> bool {
        let (_, start, end) = self.days[d];
        start < self.window.0 || end > self.window.1
    }

    fn day_index(&self, day: NaiveDate) -> Option<usize> {
        let first = self.days.first()?.0;
        let d = usize::try_from((day - first).num_days()).ok()?;
        (d < self.days.len()).then_some(d)
    }

    /// The nodes read.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The ledger days wholly inside the window: the first and the day after the last.
    pub fn inside_days(&self) -> Option<(NaiveDate, NaiveDate)> {
        let inside: Vec<NaiveDate> = (0..self.days.len())
            .filter(|&d| !self.is_edge(d))
            .map(|d| self.days[d].0)
            .collect();
        Some((*inside.first()?, inside.last()?.succ_opt()?))
    }

    /// The pools whose time has one price, and those with several.
    pub fn pools_by_pricing(&self) -> (Vec<String>, Vec<String>) {
        let (one, several): (Vec<usize>, Vec<usize>) =
            (0..self.pools.len()).partition(|&p| matches!(self.pricing[p], Pricing::One(..)));
        let names = |pools: Vec<usize>| pools.into_iter().map(|p| self.pools[p].clone()).collect();
        (names(one), names(several))
    }

    /// The node-days settled hour by hour, each as the part of it inside the window: every
    /// node's days the window cuts, and the node-days a contract change splits.
    pub fn hourly(&self) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
        let edges: Vec<usize> = (0..self.days.len()).filter(|&d| self.is_edge(d)).collect();
        let mut node_days: Vec<(usize, usize)> = self
            .split
            .iter()
            .map(|&(n, d, _)| (n, d))
            .chain((0..self.nodes.len()).flat_map(|n| edges.iter().map(move |&d| (n, d))))
            .collect();
        node_days.sort_unstable();
        node_days.dedup();
        node_days
            .into_iter()
            .map(|(n, d)| {
                let (_, start, end) = self.days[d];
                (
                    self.nodes[n].clone(),
                    start.max(self.window.0),
                    end.min(self.window.1),
                )
            })
            .collect()
    }

    /// The figures: `sums` for the pools with one price; the rollup's `rows` for the pools
    /// with several; `unmatched` rows of the days inside the window; and `usage` (hourly)
    /// set against `intervals` (every interval of the nodes, of any pool) for the node-days
    /// of [`Plan::hourly`]. The `by_usage` weights are left to the caller.
    #[allow(clippy::too_many_arguments)]
    pub fn finish(
        mut self,
        sums: &RollupSums,
        rows: &[NodeDayUse],
        unmatched: &[UnmatchedDay],
        intervals: &[CapacityInterval],
        usage: &[NodeUse],
        book: &PriceBook<'_>,
    ) -> WindowFigures {
        let mut figures = WindowFigures::default();
        for (pool, day, used, overbooked) in &sums.by_day {
            let (Some(&p), Some(d)) = (self.pool_index.get(pool), self.day_index(*day)) else {
                continue;
            };
            if let (Pricing::One(contract, k), false) = (self.pricing[p], self.is_edge(d))
                && let Some(cell) = self.day_cells.get_mut(&(p, d, contract, k))
            {
                cell.add_use(*used, *overbooked);
            }
        }
        for (pool, node, month, used, overbooked) in &sums.by_node {
            let (Some(&p), Some(&n)) = (self.pool_index.get(pool), self.node_index.get(node))
            else {
                continue;
            };
            if let Pricing::One(contract, _) = self.pricing[p]
                && let Some(cell) = self.node_cells.get_mut(&(p, n, *month, contract))
            {
                cell.cell.add_use(*used, *overbooked);
            }
        }
        for row in rows {
            let (Some(&p), Some(&n), Some(d)) = (
                self.pool_index.get(&row.pool),
                self.node_index.get(&row.node),
                self.day_index(row.day),
            ) else {
                continue;
            };
            if self.is_edge(d) || self.split.contains(&(n, d, p)) {
                continue;
            }
            if let Some(&(contract, k)) = self.node_day_pricing.get(&(n, d, p)) {
                self.add_use(p, n, d, contract, k, row.used, row.overbooked);
            }
        }
        for day in unmatched {
            let (Some(&n), Some(d)) = (self.node_index.get(&day.node), self.day_index(day.day))
            else {
                continue;
            };
            if !self.is_edge(d) {
                self.add_unmatched(&mut figures, n, day.gpu_seconds);
            }
        }
        self.settle_hours(&mut figures, intervals, usage, book);
        self.into_figures(figures)
    }

    #[allow(clippy::too_many_arguments)]
    fn add_use(
        &mut self,
        p: usize,
        n: usize,
        d: usize,
        contract: Option<Uuid>,
        k: usize,
        used: Decimal,
        overbooked: Decimal,
    ) {
        if let Some(cell) = self.day_cells.get_mut(&(p, d, contract, k)) {
            cell.add_use(used, overbooked);
        }
        let month = first_of_month(self.days[d].0);
        if let Some(cell) = self.node_cells.get_mut(&(p, n, month, contract)) {
            cell.cell.add_use(used, overbooked);
        }
    }

    fn add_unmatched(&self, figures: &mut WindowFigures, n: usize, seconds: Decimal) {
        *figures
            .unmatched
            .entry(self.pools[self.last_pool[n]].clone())
            .or_default()
            .entry(self.nodes[n].clone())
            .or_default() += seconds;
    }

    /// Settles the hours of the node-days of [`Plan::hourly`]: on the days the window cuts,
    /// every pool's used time and the unmatched time; on the node-days a contract change
    /// splits, the used time of the pools split.
    fn settle_hours(
        &mut self,
        figures: &mut WindowFigures,
        intervals: &[CapacityInterval],
        usage: &[NodeUse],
        book: &PriceBook<'_>,
    ) {
        let mut edge_hours: HashMap<&str, HourUses<'_>> = HashMap::new();
        let mut split_hours: HashMap<&str, HourUses<'_>> = HashMap::new();
        for used in usage {
            if used.hour < self.window.0 || used.hour >= self.window.1 {
                continue;
            }
            let day = used.hour.with_timezone(&self.tz).date_naive();
            let Some(d) = self.day_index(day) else {
                continue;
            };
            let hours = if self.is_edge(d) {
                &mut edge_hours
            } else {
                &mut split_hours
            };
            hours
                .entry(used.node.as_str())
                .or_default()
                .entry(used.hour)
                .or_default()
                .push(used);
        }
        let all = by_node(intervals, self.window);
        let mut weights = BTreeMap::new();
        for (hours, edge) in [(&edge_hours, true), (&split_hours, false)] {
            for (node, uses) in hours {
                let Some(&n) = self.node_index.get(*node) else {
                    continue;
                };
                let node_intervals = all.get(node).cloned().unwrap_or_default();
                let mut settled: BTreeMap<DayKey, NodeDay> = BTreeMap::new();
                let outside = settle_node(
                    &node_intervals,
                    uses,
                    book,
                    self.tz,
                    &mut settled,
                    &mut weights,
                );
                if edge && !outside.is_zero() {
                    self.add_unmatched(figures, n, outside);
                }
                for day in settled.into_values() {
                    let (Some(&p), Some(d)) =
                        (self.pool_index.get(&day.pool), self.day_index(day.day))
                    else {
                        continue;
                    };
                    if edge || self.split.contains(&(n, d, p)) {
                        let k = self.kind(&day.gpu_model, day.billing_mode);
                        self.add_use(
                            p,
                            n,
                            d,
                            day.contract_id,
                            k,
                            day.seconds.used,
                            day.seconds.overbooked,
                        );
                    }
                }
            }
        }
    }

    fn into_figures(self, mut figures: WindowFigures) -> WindowFigures {
        let mut days: Vec<PoolDay> = self
            .day_cells
            .into_iter()
            .map(|((p, d, contract_id, k), cell)| PoolDay {
                pool: self.pools[p].clone(),
                day: self.days[d].0,
                month: first_of_month(self.days[d].0),
                contract_id,
                gpu_model: self.kinds[k].0.clone(),
                billing_mode: self.kinds[k].1,
                seconds: cell.seconds(),
            })
            .collect();
        days.sort_by(|a, b| {
            (
                &a.pool,
                a.day,
                a.contract_id,
                &a.gpu_model,
                a.billing_mode.as_str(),
            )
                .cmp(&(
                    &b.pool,
                    b.day,
                    b.contract_id,
                    &b.gpu_model,
                    b.billing_mode.as_str(),
                ))
        });
        let mut nodes: Vec<NodeMonth> = self
            .node_cells
            .into_iter()
            .map(|((p, n, month, contract_id), cell)| NodeMonth {
                pool: self.pools[p].clone(),
                node: self.nodes[n].clone(),
                month,
                contract_id,
                gpu_model: cell.gpu_model,
                gpus: cell.gpus,
                seconds: cell.cell.seconds(),
            })
            .collect();
        nodes.sort_by(|a, b| {
            (&a.pool, &a.node, a.month, a.contract_id).cmp(&(
                &b.pool,
                &b.node,
                b.month,
                b.contract_id,
            ))
        });
        figures.days = days;
        figures.nodes = nodes;
        figures
    }
}
