//! Slurm's nodes as capacity: what `scontrol show nodes --json` or `sinfo --json` says of each
//! node now (its partitions, its GPUs from GRES, its state), and how snapshots taken run after
//! run become capacity intervals.
//!
//! A snapshot says how a node is at one moment. A node is counted from the snapshot that first
//! saw it so until the snapshot that first saw it otherwise: its interval is extended run by
//! run while it stays the same, and ends when it changes or disappears. Between two snapshots
//! further apart than the longest gap, nothing is known and nothing is counted: the interval
//! ends at the last snapshot that saw it.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::hostlist;
use super::tres::{GpuTres, split_gpu_type};
use super::{Mapping, gpu_model};
use crate::domain::gpu::COMPUTE_SLICES;
use crate::domain::rating::BillingMode;
use crate::domain::record::format_time;

/// The most node names one `sinfo` entry's host list may name.
const MAX_LISTED_NODES: usize = 100_000;

/// Whether a node could run jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// IDLE, MIXED, ALLOCATED, COMPLETING (with no flag below).
    Up,
    /// DOWN, DRAIN (DRAINING, DRAINED), FAIL (FAILING), MAINTENANCE, NOT_RESPONDING,
    /// REBOOT_ISSUED, POWERING_UP, INVALID_REG, UNKNOWN, or a state taskledger does not
    /// know: paid and unable to run a job.
    Down,
    /// POWERED_DOWN or FUTURE: a cloud node not running, or one not built yet; not paid.
    Absent,
}

/// One node as a snapshot saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSnapshot {
    pub name: String,
    /// Its partitions, as listed.
    pub partitions: Vec<String>,
    /// Its GPU GRES: `(type, count)`, the type empty when untyped.
    pub gpus: Vec<(String, u64)>,
    /// Its state names, upper case (`MIXED`, `DRAIN`).
    pub states: Vec<String>,
}

impl NodeSnapshot {
    pub fn condition(&self) -> Condition {
        let has = |names: &[&str]| self.states.iter().any(|s| names.contains(&s.as_str()));
        if has(&["POWERED_DOWN", "FUTURE"]) {
            Condition::Absent
        } else if has(&[
            "DOWN",
            "DRAIN",
            "DRAINING",
            "DRAINED",
            "FAIL",
            "FAILING",
            "MAINTENANCE",
            "MAINT",
            "NOT_RESPONDING",
            "REBOOT_ISSUED",
            "POWERING_UP",
            "INVALID_REG",
            "UNKNOWN",
        ]) {
            Condition::Down
        } else if has(&["IDLE", "MIXED", "ALLOCATED", "COMPLETING"]) {
            Condition::Up
        } else {
            Condition::Down
        }
    }
}

/// A snapshot: its nodes, and when Slurm says it was taken (`last_update`, where given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    pub nodes: Vec<NodeSnapshot>,
    pub taken_at: Option<DateTime<Utc>>,
}

/// Reads `scontrol show nodes --json` or `sinfo --json` (Slurm 21.08 to 25.05: `nodes[]` with
/// `state` a string and `state_flags`, or `state` a list; `sinfo[]` entries grouped by
/// partition and state).
pub fn read_snapshot(text: &str) -> Result<Snapshot, String> {
    let value: Value = serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
    if let Some(errors) = value["errors"].as_array().filter(|e| !e.is_empty()) {
        let said: Vec<String> = errors
            .iter()
            .map(|e| {
                e["description"]
                    .as_str()
                    .or(e["error"].as_str())
                    .unwrap_or("an error")
                    .to_owned()
            })
            .collect();
        return Err(format!("Slurm answered errors: {}", said.join("; ")));
    }
    let taken_at = value["last_update"]["number"]
        .as_i64()
        .or(value["last_update"].as_i64())
        .filter(|t| *t > 0)
        .and_then(|t| DateTime::from_timestamp(t, 0));
    let mut nodes: BTreeMap<String, NodeSnapshot> = BTreeMap::new();
    if let Some(listed) = value["nodes"].as_array() {
        for (index, node) in listed.iter().enumerate() {
            let at = |field: &str| format!("nodes[{index}].{field}");
            let name = node["name"]
                .as_str()
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("{} is missing", at("name")))?;
            let mut states =
                names(&node["state"]).ok_or_else(|| format!("{} is not a state", at("state")))?;
            states.extend(names(&node["state_flags"]).unwrap_or_default());
            let partitions = strings(&node["partitions"]);
            let gpus = gpu_gres(node["gres"].as_str().unwrap_or(""))
                .map_err(|error| format!("{}: {error}", at("gres")))?;
            nodes.insert(
                name.to_owned(),
                NodeSnapshot {
                    name: name.to_owned(),
                    partitions,
                    gpus,
                    states,
                },
            );
        }
    } else if let Some(entries) = value["sinfo"].as_array() {
        for (index, entry) in entries.iter().enumerate() {
            let at = |field: &str| format!("sinfo[{index}].{field}");
            let states = names(&entry["node"]["state"])
                .ok_or_else(|| format!("{} is not a state", at("node.state")))?;
            let gpus = gpu_gres(entry["gres"]["total"].as_str().unwrap_or(""))
                .map_err(|error| format!("{}: {error}", at("gres.total")))?;
            let partition = entry["partition"]["name"]
                .as_str()
                .filter(|p| !p.is_empty());
            for listed in strings(&entry["nodes"]["nodes"]) {
                for name in hostlist::expand(&listed, MAX_LISTED_NODES)
                    .map_err(|error| format!("{}: {error}", at("nodes.nodes")))?
                {
                    let node = nodes.entry(name.clone()).or_insert_with(|| NodeSnapshot {
                        name,
                        partitions: Vec::new(),
                        gpus: gpus.clone(),
                        states: states.clone(),
                    });
                    if let Some(partition) = partition
                        && !node.partitions.iter().any(|p| p == partition)
                    {
                        node.partitions.push(partition.to_owned());
                    }
                }
            }
        }
    } else {
        return Err(
            "neither `nodes` nor `sinfo`: not the output of `scontrol show nodes \
                    --json` or `sinfo --json`"
                .to_owned(),
        );
    }
    Ok(Snapshot {
        nodes: nodes.into_values().collect(),
        taken_at,
    })
}

/// State names, upper case: a string (`mixed`, `idle+drain`) or a list of them.
fn names(value: &Value) -> Option<Vec<String>> {
    let split = |raw: &str| -> Vec<String> {
        raw.split('+')
            .map(|s| s.trim().to_ascii_uppercase())
            .filter(|s| !s.is_empty())
            .collect()
    };
    match value {
        Value::String(raw) => Some(split(raw)),
        Value::Array(items) => Some(
            items
                .iter()
                .filter_map(Value::as_str)
                .flat_map(split)
                .collect(),
        ),
        _ => None,
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

/// The GPU entries of a node's GRES (`gpu:a100:8(S:0-1),mps:20`, `gpu:4`, `gpu:tesla:4(S:0)`):
/// `(type, count)`; a `gpu` without a count is one.
pub fn gpu_gres(raw: &str) -> Result<Vec<(String, u64)>, String> {
    let raw = raw.trim();
    if raw.is_empty() || raw == "(null)" || raw == "N/A" {
        return Ok(Vec::new());
    }
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (index, c) in raw.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&raw[start..index]);
                start = index + 1;
            }
            _ => {}
        }
    }
    items.push(&raw[start..]);
    let mut gpus = Vec::new();
    for item in items {
        let item = item.split('(').next().unwrap_or("").trim();
        let parts: Vec<&str> = item.split(':').collect();
        if parts.first() != Some(&"gpu") {
            continue;
        }
        let count = |text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("`{item}` has a count that is not a whole number"))
        };
        let (kind, number) = match parts.as_slice() {
            ["gpu"] => ("", 1),
            ["gpu", n] if n.bytes().all(|b| b.is_ascii_digit()) => ("", count(n)?),
            ["gpu", kind] => (*kind, 1),
            ["gpu", kind, n] => (*kind, count(n)?),
            _ => return Err(format!("`{item}` is not a GRES entry (gpu[:type][:count])")),
        };
        gpus.push((kind.to_owned(), number));
    }
    Ok(gpus)
}

/// How nodes become capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMapping {
    /// The billing mode of every node.
    pub billing_mode: BillingMode,
    /// Snapshots further apart than this do not extend an interval across the gap.
    pub max_gap: TimeDelta,
}

/// What a node is for capacity: the same descriptor in two snapshots extends its interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Described {
    pub pool: String,
    pub gpu_model: String,
    pub gpus: u64,
    pub state: Condition,
}

/// A node's interval still open: from when, last seen when, as what.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    pub from: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
    pub node: Described,
}

/// A node's descriptor: its first partition as the pool, its GPUs (MIG slices as sevenths of
/// a card, rounded up), its model from the GRES types (else the partition's `--gpu-model`);
/// `None` without GPUs or when absent.
pub fn describe(node: &NodeSnapshot, mapping: &Mapping) -> Option<Described> {
    let condition = node.condition();
    if condition == Condition::Absent {
        return None;
    }
    let (mut whole, mut sevenths) = (0u64, 0u64);
    let mut tres = GpuTres::default();
    for (kind, count) in &node.gpus {
        let size = split_gpu_type(kind).mig_profile.and_then(|profile| {
            let units = profile.split('g').next()?;
            let units = units.rsplit('.').next()?;
            units.parse::<u64>().ok()
        });
        match size {
            Some(units) => sevenths += count * units,
            None => whole += count,
        }
        if kind.is_empty() {
            tres.untyped = Some(tres.untyped.unwrap_or(0) + count);
        } else {
            *tres.typed.entry(kind.clone()).or_default() += count;
        }
    }
    let gpus = whole + sevenths.div_ceil(u64::from(COMPUTE_SLICES));
    if gpus == 0 {
        return None;
    }
    let pool = node.partitions.first()?.clone();
    let model = gpu_model(&tres, Some(&pool), mapping).model;
    Some(Described {
        pool,
        gpu_model: model,
        gpus,
        state: condition,
    })
}

/// What a snapshot at `at` does to the open intervals: the intervals to store (each node's
/// open interval extended to `at`, or closed), and the intervals open after it.
pub fn advance(
    open: &BTreeMap<String, Open>,
    snapshot: &[NodeSnapshot],
    at: DateTime<Utc>,
    slurm: &Mapping,
    nodes: &NodeMapping,
) -> (Vec<Value>, BTreeMap<String, Open>) {
    let now: BTreeMap<&str, Described> = snapshot
        .iter()
        .filter_map(|node| Some((node.name.as_str(), describe(node, slurm)?)))
        .collect();
    let mut store = Vec::new();
    let mut after = BTreeMap::new();
    let names: std::collections::BTreeSet<&str> = open
        .keys()
        .map(String::as_str)
        .chain(now.keys().copied())
        .collect();
    for name in names {
        let previous = open.get(name).filter(|o| at > o.last_seen);
        let current = now.get(name);
        let within_gap = previous.is_some_and(|o| at - o.last_seen <= nodes.max_gap);
        match (previous, current) {
            (Some(o), Some(d)) if within_gap && o.node == *d => {
                store.push(interval(name, &o.node, o.from, at, nodes));
                after.insert(
                    name.to_owned(),
                    Open {
                        from: o.from,
                        last_seen: at,
                        node: d.clone(),
                    },
                );
                continue;
            }
            (Some(o), _) => {
                // Changed or gone: it was as it was until this snapshot, if that came in time.
                let until = if within_gap { at } else { o.last_seen };
                if until > o.from {
                    store.push(interval(name, &o.node, o.from, until, nodes));
                }
            }
            (None, _) => {}
        }
        if let Some(d) = current {
            after.insert(
                name.to_owned(),
                Open {
                    from: at,
                    last_seen: at,
                    node: d.clone(),
                },
            );
        }
    }
    // Snapshots older than what is open change nothing.
    for (name, o) in open {
        if o.last_seen >= at {
            after.insert(name.clone(), o.clone());
        }
    }
    (store, after)
}

/// The intervals a series of snapshots makes, taken in order of time: each node's interval
/// as far as the snapshots extend it (one value per node and start).
pub fn intervals_of(
    mut snapshots: Vec<(DateTime<Utc>, Vec<NodeSnapshot>)>,
    slurm: &Mapping,
    nodes: &NodeMapping,
) -> Vec<Value> {
    snapshots.sort_by_key(|(at, _)| *at);
    let mut open = BTreeMap::new();
    let mut latest: BTreeMap<(String, String), Value> = BTreeMap::new();
    for (at, listed) in &snapshots {
        let (store, after) = advance(&open, listed, *at, slurm, nodes);
        for interval in store {
            let key = (
                interval["node"].as_str().unwrap_or_default().to_owned(),
                interval["from"].as_str().unwrap_or_default().to_owned(),
            );
            latest.insert(key, interval);
        }
        open = after;
    }
    latest.into_values().collect()
}

fn interval(
    name: &str,
    node: &Described,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    nodes: &NodeMapping,
) -> Value {
    json!({
        "node": name,
        "pool": node.pool,
        "gpu_model": node.gpu_model,
        "gpus": node.gpus,
        "billing_mode": nodes.billing_mode.as_str(),
        "from": format_time(from),
        "until": format_time(until),
        "state": match node.state {
            Condition::Down => "down",
            _ => "up",
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(format!(
            "{}/tests/fixtures/slurm-nodes/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    }

    #[test]
    fn every_shape_of_node_listing_reads_into_the_same_snapshot() {
        let old = read_snapshot(&fixture("sinfo_21_08_5.json")).unwrap();
        type Read<'a> = (&'a str, Vec<(String, u64)>, Condition);
        let summary: Vec<Read> = old
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.gpus.clone(), n.condition()))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    "cs2.example.company.com",
                    vec![("a100".to_owned(), 8)],
                    Condition::Up
                ),
                (
                    "cs3.example.company.com",
                    vec![("a100".to_owned(), 4), ("h100".to_owned(), 2)],
                    Condition::Up
                ),
                ("cs4.example.company.com", vec![], Condition::Up),
                ("cs5.example.company.com", vec![], Condition::Down),
            ]
        );
        assert_eq!(old.nodes[0].partitions, ["hw"]);
        let mapping = Mapping::default();
        assert_eq!(
            describe(&old.nodes[1], &mapping),
            Some(Described {
                pool: "hw".to_owned(),
                gpu_model: "a100+h100".to_owned(),
                gpus: 6,
                state: Condition::Up
            })
        );
        assert_eq!(describe(&old.nodes[2], &mapping), None, "no GPUs");

        let grouped = read_snapshot(&fixture("sinfo_23_02_5.json")).unwrap();
        assert_eq!(grouped.nodes.len(), 1);
        assert_eq!(grouped.nodes[0].name, "localhost");
        assert_eq!(grouped.nodes[0].partitions, ["debug"]);
        assert_eq!(grouped.nodes[0].condition(), Condition::Up);
        assert!(grouped.nodes[0].gpus.is_empty());

        let listed = read_snapshot(&fixture("node_23_02_3.json")).unwrap();
        assert_eq!(listed.nodes[0].gpus, [("tesla".to_owned(), 4)]);
        assert_eq!(listed.nodes[0].states, ["IDLE"]);
        assert_eq!(listed.taken_at, None);

        let newest = read_snapshot(&fixture("node_24_11_0.json")).unwrap();
        assert_eq!(
            newest.nodes[0].gpus,
            [("fake1".to_owned(), 1), ("fake2".to_owned(), 1)]
        );
        assert_eq!(newest.taken_at, DateTime::from_timestamp(1_722_010_273, 0));
        assert!(read_snapshot("{\"jobs\": []}").is_err());
    }

    #[test]
    fn states_and_gres_read_as_slurm_writes_them() {
        let node = |states: &[&str]| NodeSnapshot {
            name: "n".to_owned(),
            partitions: vec!["gpu".to_owned()],
            gpus: vec![("a100_3g.40gb".to_owned(), 2), ("a100".to_owned(), 1)],
            states: states.iter().map(|s| (*s).to_owned()).collect(),
        };
        assert_eq!(node(&["MIXED"]).condition(), Condition::Up);
        assert_eq!(node(&["IDLE", "DRAIN"]).condition(), Condition::Down);
        assert_eq!(
            node(&["ALLOCATED", "MAINTENANCE"]).condition(),
            Condition::Down
        );
        assert_eq!(
            node(&["IDLE", "POWERED_DOWN"]).condition(),
            Condition::Absent
        );
        assert_eq!(node(&["FUTURE"]).condition(), Condition::Absent);
        // A card in two 3g slices and a whole one: two cards.
        assert_eq!(
            describe(&node(&["IDLE"]), &Mapping::default())
                .unwrap()
                .gpus,
            2
        );
        assert_eq!(
            gpu_gres("gpu:a100:8(S:0-1),mps:20").unwrap(),
            [("a100".to_owned(), 8)]
        );
        assert_eq!(gpu_gres("gpu:4(S:0,1)").unwrap(), [(String::new(), 4)]);
        assert_eq!(gpu_gres("gpu").unwrap(), [(String::new(), 1)]);
        assert!(gpu_gres("gpu:a100:x").is_err());
    }

    #[test]
    fn snapshots_extend_an_interval_until_the_node_changes() {
        let at = |minute: i64| {
            "2026-03-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::minutes(minute)
        };
        let node = |states: &[&str]| NodeSnapshot {
            name: "gpu01".to_owned(),
            partitions: vec!["gpu".to_owned()],
            gpus: vec![("a100".to_owned(), 8)],
            states: states.iter().map(|s| (*s).to_owned()).collect(),
        };
        let nodes = NodeMapping {
            billing_mode: BillingMode::OnDemand,
            max_gap: TimeDelta::minutes(30),
        };
        let mapping = Mapping::default();
        let span = |store: &[Value]| -> Vec<(String, String, String)> {
            store
                .iter()
                .map(|i| {
                    (
                        i["from"].as_str().unwrap().to_owned(),
                        i["until"].as_str().unwrap().to_owned(),
                        i["state"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        let (store, open) = advance(
            &BTreeMap::new(),
            &[node(&["IDLE"])],
            at(0),
            &mapping,
            &nodes,
        );
        assert!(store.is_empty());
        let (store, open) = advance(&open, &[node(&["MIXED"])], at(5), &mapping, &nodes);
        let t = |m: i64| format_time(at(m));
        assert_eq!(span(&store), [(t(0), t(5), "up".to_owned())]);
        // Drained: the up interval ends, a down one opens.
        let (store, open) = advance(&open, &[node(&["IDLE", "DRAIN"])], at(10), &mapping, &nodes);
        assert_eq!(span(&store), [(t(0), t(10), "up".to_owned())]);
        let (store, open) = advance(&open, &[node(&["IDLE", "DRAIN"])], at(15), &mapping, &nodes);
        assert_eq!(span(&store), [(t(10), t(15), "down".to_owned())]);
        // An hour without snapshots: the interval ends where it was last seen.
        let (store, open) = advance(&open, &[node(&["IDLE"])], at(75), &mapping, &nodes);
        assert_eq!(span(&store), [(t(10), t(15), "down".to_owned())]);
        assert_eq!(open["gpu01"].from, at(75));
        // Gone from the listing: closed at this snapshot.
        let (store, open) = advance(&open, &[], at(80), &mapping, &nodes);
        assert_eq!(span(&store), [(t(75), t(80), "up".to_owned())]);
        assert!(open.is_empty());
    }

    #[test]
    fn a_series_of_snapshots_makes_each_interval_once_at_its_longest() {
        let at = |minute: i64| {
            "2026-03-01T10:00:00Z".parse::<DateTime<Utc>>().unwrap() + TimeDelta::minutes(minute)
        };
        let node = |states: &[&str]| NodeSnapshot {
            name: "gpu01".to_owned(),
            partitions: vec!["gpu".to_owned()],
            gpus: vec![(String::new(), 4)],
            states: states.iter().map(|s| (*s).to_owned()).collect(),
        };
        let nodes = NodeMapping {
            billing_mode: BillingMode::Reserved,
            max_gap: TimeDelta::hours(1),
        };
        let mapping = Mapping {
            gpu_models: [("gpu".to_owned(), "A100".to_owned())].into(),
            ..Mapping::default()
        };
        // Out of order, as files may be given.
        let made = intervals_of(
            vec![
                (at(10), vec![node(&["MIXED"])]),
                (at(0), vec![node(&["IDLE"])]),
                (at(20), vec![node(&["DOWN"])]),
                (at(30), vec![node(&["DOWN"])]),
            ],
            &mapping,
            &nodes,
        );
        let brief: Vec<(&str, &str, &str, &str, &str)> = made
            .iter()
            .map(|i| {
                (
                    i["from"].as_str().unwrap(),
                    i["until"].as_str().unwrap(),
                    i["state"].as_str().unwrap(),
                    i["gpu_model"].as_str().unwrap(),
                    i["billing_mode"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            brief,
            [
                (
                    "2026-03-01T10:00:00Z",
                    "2026-03-01T10:20:00Z",
                    "up",
                    "A100",
                    "reserved"
                ),
                (
                    "2026-03-01T10:20:00Z",
                    "2026-03-01T10:30:00Z",
                    "down",
                    "A100",
                    "reserved"
                ),
            ]
        );
    }
}
