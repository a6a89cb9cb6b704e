//! Kubernetes GPU nodes as capacity intervals, from what kube-state-metrics put in Prometheus:
//! each node's GPUs (`kube_node_status_capacity`), whether it could take pods
//! (`kube_node_spec_unschedulable`, the `Ready` condition), its pool, GPU model, billing mode,
//! provider and region from its labels.
//!
//! Capacity is read hour by hour, on the UTC hour: an hour is read once it has ended and
//! settled, and its intervals never reach past it, so every run that reads an hour again makes
//! exactly the same intervals (stored once, the rest duplicates), however windows overlap.
//! Within the hour an interval runs while the node's GPUs and state stay the same, to the
//! resolution of the samples.

use std::collections::BTreeMap;

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde_json::{Value, json};

use super::promql::RangeSeries;
use super::{Mapping, UNKNOWN_MODEL, ksm_label, node_product};
use crate::domain::gpu::COMPUTE_SLICES;
use crate::domain::rating::BillingMode;
use crate::domain::record::format_time;

/// The node labels a pool is read from when none is given, in order: GKE, EKS, Karpenter
/// and AKS name their node pools so.
pub const POOL_LABELS: [&str; 4] = [
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "karpenter.sh/nodepool",
    "kubernetes.azure.com/agentpool",
];

/// How nodes become capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeMapping {
    /// The node labels naming the pool, the first one a node has wins.
    pub pool_labels: Vec<String>,
    /// The pool of nodes with none of them.
    pub default_pool: String,
    /// The billing mode of nodes whose labels do not say they are spot.
    pub billing_mode: BillingMode,
}

impl Default for NodeMapping {
    fn default() -> Self {
        Self {
            pool_labels: POOL_LABELS
                .iter()
                .map(|label| (*label).to_owned())
                .collect(),
            default_pool: "default".to_owned(),
            billing_mode: BillingMode::OnDemand,
        }
    }
}

/// What a node's labels say of it: kube-state-metrics' `kube_node_labels` and
/// `kube_node_info` labels, by node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl NodeFacts {
    /// Folds in the labels of an answer's series, by their `node` label.
    pub fn add(&mut self, series: impl IntoIterator<Item = BTreeMap<String, String>>) {
        for mut labels in series {
            let Some(node) = labels.remove("node").filter(|node| !node.is_empty()) else {
                continue;
            };
            self.labels.entry(node).or_default().extend(labels);
        }
    }

    fn label(&self, node: &str, key: &str) -> Option<&str> {
        self.labels
            .get(node)?
            .get(key)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }
}

/// One hour of capacity, as read.
#[derive(Debug, Clone)]
pub struct Hour<'a> {
    pub start: DateTime<Utc>,
    /// The step of the samples: the resolution.
    pub step: TimeDelta,
    /// `max by (node, resource) (kube_node_status_capacity{resource=~GPU resources})` over
    /// the hour.
    pub gpus: &'a [RangeSeries],
    /// The nodes that could not take pods (cordoned, or not Ready), when they could not.
    pub down: &'a [RangeSeries],
}

/// The capacity intervals of an hour, as `POST /v1/capacity` takes them, by node and start.
pub fn intervals(
    hour: &Hour,
    facts: &NodeFacts,
    nodes: &NodeMapping,
    mapping: &Mapping,
) -> Vec<Value> {
    let step = hour.step.num_seconds().max(1);
    let steps = (3600 / step).max(1) as usize;
    let index = |time: i64| {
        let offset = time - hour.start.timestamp();
        (offset >= 0 && offset % step == 0)
            .then(|| (offset / step) as usize)
            .filter(|k| *k < steps)
    };
    // Per node and step: whole cards and MIG sevenths.
    let mut cards: BTreeMap<&str, Vec<(Decimal, i64)>> = BTreeMap::new();
    for series in hour.gpus {
        let (Some(node), Some(resource)) = (series.label("node"), series.label("resource")) else {
            continue;
        };
        let product = facts.label(node, &ksm_label("nvidia.com/gpu.product"));
        let sevenths = slice_size(resource).or_else(|| {
            // MIG's single strategy advertises each slice as a `nvidia.com/gpu`, and the
            // product label names the slice.
            product.and_then(|product| {
                let (_, profile) = product.split_once("-MIG-")?;
                slice_size(profile)
            })
        });
        let row = cards
            .entry(node)
            .or_insert_with(|| vec![(Decimal::ZERO, 0); steps]);
        for (time, value) in &series.points {
            let (Some(k), Some(value)) = (index(*time), value.parse::<Decimal>().ok()) else {
                continue;
            };
            match sevenths {
                Some(size) => row[k].1 += value.trunc().try_into().unwrap_or(0i64) * size,
                None => row[k].0 += value,
            }
        }
    }
    let mut down: BTreeMap<&str, Vec<bool>> = BTreeMap::new();
    for series in hour.down {
        let Some(node) = series.label("node") else {
            continue;
        };
        let row = down.entry(node).or_insert_with(|| vec![false; steps]);
        for (time, value) in &series.points {
            if let Some(k) = index(*time)
                && value.parse::<Decimal>().is_ok_and(|v| !v.is_zero())
            {
                row[k] = true;
            }
        }
    }
    let end = hour.start + TimeDelta::hours(1);
    let mut out = Vec::new();
    for (node, row) in cards {
        // NVIDIA's feature discovery counts the cards themselves where the resources count
        // shares of them (time-slicing, HAMi), except under MIG's single strategy, where it
        // counts the slices as the resource does.
        let single_mig = facts
            .label(node, &ksm_label("nvidia.com/gpu.product"))
            .is_some_and(|product| product.contains("-MIG-"));
        let counted = facts
            .label(node, &ksm_label("nvidia.com/gpu.count"))
            .filter(|_| !single_mig)
            .and_then(|count| count.parse::<i64>().ok())
            .filter(|count| *count > 0);
        let state = |k: usize| {
            let (whole, sevenths) = row[k];
            let advertised = whole.trunc().try_into().unwrap_or(0i64)
                + (sevenths + i64::from(COMPUTE_SLICES) - 1) / i64::from(COMPUTE_SLICES);
            let gpus = match counted {
                Some(count) if advertised > 0 => count,
                _ => advertised,
            };
            let down = down.get(node).is_some_and(|d| d[k]);
            (gpus > 0).then_some((gpus, down))
        };
        let mut k = 0;
        while k < steps {
            let Some(current) = state(k) else {
                k += 1;
                continue;
            };
            let first = k;
            while k < steps && state(k) == Some(current) {
                k += 1;
            }
            let from = hour.start + TimeDelta::seconds(first as i64 * step);
            let until = (hour.start + TimeDelta::seconds(k as i64 * step)).min(end);
            out.push(interval(node, current, from, until, facts, nodes, mapping));
        }
    }
    out
}

/// The sevenths of a card a MIG resource or profile names (`nvidia_com_mig_3g_40gb`,
/// `3g.40gb`): its compute units.
fn slice_size(resource: &str) -> Option<i64> {
    let profile = resource
        .strip_prefix("nvidia_com_mig_")
        .or_else(|| resource.strip_prefix("nvidia.com/mig-"))
        .unwrap_or(resource);
    let (units, rest) = profile.split_once('g')?;
    let units: i64 = units.parse().ok()?;
    (rest.starts_with('_') || rest.starts_with('.')).then_some(units)
}

fn interval(
    node: &str,
    (gpus, down): (i64, bool),
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    facts: &NodeFacts,
    nodes: &NodeMapping,
    mapping: &Mapping,
) -> Value {
    let label = |key: &str| facts.label(node, &ksm_label(key));
    let pool = nodes
        .pool_labels
        .iter()
        .find_map(|key| label(key))
        .unwrap_or(&nodes.default_pool);
    let model = label("nvidia.com/gpu.product")
        .map(|product| mapping.model_name(&node_product(product)))
        .unwrap_or_else(|| UNKNOWN_MODEL.to_owned());
    let spot = [
        ("karpenter.sh/capacity-type", "spot"),
        ("eks.amazonaws.com/capacityType", "SPOT"),
        ("cloud.google.com/gke-spot", "true"),
        ("cloud.google.com/gke-preemptible", "true"),
        ("kubernetes.azure.com/scalesetpriority", "spot"),
    ]
    .iter()
    .any(|(key, value)| label(key) == Some(*value));
    let billing_mode = if spot {
        BillingMode::Spot
    } else {
        nodes.billing_mode
    };
    let provider_id = facts.label(node, "provider_id");
    let provider =
        provider_id
            .and_then(|id| id.split_once("://"))
            .map(|(scheme, _)| match scheme {
                "gce" => "gcp",
                other => other,
            });
    let mut labels = serde_json::Map::new();
    if let Some(kind) = label("node.kubernetes.io/instance-type") {
        labels.insert("instance_type".to_owned(), json!(kind));
    }
    if let Some(id) = provider_id {
        labels.insert("provider_id".to_owned(), json!(id));
    }
    let mut interval = json!({
        "node": node,
        "pool": pool,
        "gpu_model": model,
        "gpus": gpus,
        "billing_mode": billing_mode.as_str(),
        "from": format_time(from),
        "until": format_time(until),
        "state": if down { "down" } else { "up" },
    });
    if let Some(provider) = provider.filter(|p| !p.is_empty()) {
        interval["provider"] = json!(provider);
    }
    if let Some(region) = label("topology.kubernetes.io/region") {
        interval["region"] = json!(region);
    }
    if !labels.is_empty() {
        interval["labels"] = Value::Object(labels);
    }
    interval
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(labels: &[(&str, &str)], points: &[(i64, &str)]) -> RangeSeries {
        RangeSeries {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            points: points.iter().map(|(t, v)| (*t, (*v).to_owned())).collect(),
        }
    }

    #[test]
    fn an_hour_of_a_node_becomes_intervals_while_its_gpus_and_state_hold() {
        let start: DateTime<Utc> = "2026-03-01T10:00:00Z".parse().unwrap();
        let t = |minutes: i64| start.timestamp() + minutes * 60;
        let every =
            |from: i64, until: i64, value: &'static str| (from..until).map(move |m| (t(m), value));
        let a: Vec<(i64, &str)> = every(0, 60, "8").collect();
        // Cordoned from 10:20 to 10:35.
        let a_down: Vec<(i64, &str)> = every(20, 35, "1").collect();
        // Joins at 10:30 with seven 1g slices on one card and three 2g slices on another.
        let b: Vec<(i64, &str)> = every(30, 60, "7").collect();
        let b2: Vec<(i64, &str)> = every(30, 60, "3").collect();
        let gpus = [
            series(&[("node", "a"), ("resource", "nvidia_com_gpu")], &a),
            series(&[("node", "b"), ("resource", "nvidia_com_mig_1g_10gb")], &b),
            series(
                &[("node", "b"), ("resource", "nvidia_com_mig_2g_20gb")],
                &b2,
            ),
            series(
                &[("node", "cpu"), ("resource", "nvidia_com_gpu")],
                &[(t(0), "0")],
            ),
        ];
        let down = [series(&[("node", "a")], &a_down)];
        let mut facts = NodeFacts::default();
        facts.add([
            [
                ("node", "a"),
                ("label_cloud_google_com_gke_nodepool", "train"),
                ("label_cloud_google_com_gke_spot", "true"),
                ("label_nvidia_com_gpu_product", "NVIDIA-H100-80GB-HBM3"),
                ("label_topology_kubernetes_io_region", "us-central1"),
            ]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
            [("node", "a"), ("provider_id", "gce://proj/us-central1-a/a")]
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ]);
        let mapping = Mapping {
            gpu_models: [("NVIDIA-H100-80GB-HBM3".to_owned(), "H100".to_owned())].into(),
            ..Mapping::default()
        };
        let hour = Hour {
            start,
            step: TimeDelta::minutes(1),
            gpus: &gpus,
            down: &down,
        };
        let got = intervals(&hour, &facts, &NodeMapping::default(), &mapping);
        let brief: Vec<(&str, &str, &str, i64, &str)> = got
            .iter()
            .map(|i| {
                (
                    i["node"].as_str().unwrap(),
                    i["from"].as_str().unwrap(),
                    i["until"].as_str().unwrap(),
                    i["gpus"].as_i64().unwrap(),
                    i["state"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            brief,
            [
                ("a", "2026-03-01T10:00:00Z", "2026-03-01T10:20:00Z", 8, "up"),
                (
                    "a",
                    "2026-03-01T10:20:00Z",
                    "2026-03-01T10:35:00Z",
                    8,
                    "down"
                ),
                ("a", "2026-03-01T10:35:00Z", "2026-03-01T11:00:00Z", 8, "up"),
                ("b", "2026-03-01T10:30:00Z", "2026-03-01T11:00:00Z", 2, "up"),
            ]
        );
        assert_eq!(got[0]["pool"], "train");
        assert_eq!(got[0]["gpu_model"], "H100");
        assert_eq!(got[0]["billing_mode"], "spot");
        assert_eq!(got[0]["provider"], "gcp");
        assert_eq!(got[0]["region"], "us-central1");
        assert_eq!(
            got[0]["labels"]["provider_id"],
            "gce://proj/us-central1-a/a"
        );
        assert_eq!(got[3]["pool"], "default");
        assert_eq!(got[3]["gpu_model"], UNKNOWN_MODEL);
        assert_eq!(got[3]["billing_mode"], "on_demand");
        assert!(got[3].get("provider").is_none());
    }

    #[test]
    fn mig_sizes_come_from_resources_and_profiles() {
        assert_eq!(slice_size("nvidia_com_mig_3g_40gb"), Some(3));
        assert_eq!(slice_size("nvidia.com/mig-1g.10gb"), Some(1));
        assert_eq!(slice_size("1g.10gb"), Some(1));
        assert_eq!(slice_size("nvidia_com_gpu"), None);
    }
}
