//! The two files of Alibaba's `cluster-trace-gpu-v2023` the demo replays, as shipped in
//! `data/demo/alibaba-gpu-v2023/`: the pods submitted to a production GPU cluster and the
//! cluster's GPU nodes.

use std::collections::BTreeMap;

/// The pod list, as published.
pub const POD_LIST: &str =
    include_str!("../../../data/demo/alibaba-gpu-v2023/openb_pod_list_default.csv");
/// The GPU node list, as published.
pub const NODE_LIST: &str =
    include_str!("../../../data/demo/alibaba-gpu-v2023/openb_node_list_gpu_node.csv");

/// A pod's Kubernetes quality of service class, as the trace names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Qos {
    /// Latency sensitive: online services.
    Ls,
    /// Best effort: batch work the cluster may evict.
    Be,
    Burstable,
    Guaranteed,
}

impl Qos {
    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "LS" => Some(Qos::Ls),
            "BE" => Some(Qos::Be),
            "Burstable" => Some(Qos::Burstable),
            "Guaranteed" => Some(Qos::Guaranteed),
            _ => None,
        }
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Qos::Ls => "LS",
            Qos::Be => "BE",
            Qos::Burstable => "Burstable",
            Qos::Guaranteed => "Guaranteed",
        }
    }
}

/// The last phase the trace saw a pod in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Running,
    Succeeded,
    Failed,
    Pending,
}

impl Phase {
    fn parse(raw: &str) -> Option<Self> {
        match raw {
            "Running" => Some(Phase::Running),
            "Succeeded" => Some(Phase::Succeeded),
            "Failed" => Some(Phase::Failed),
            "Pending" => Some(Phase::Pending),
            _ => None,
        }
    }
}

/// One pod; times are seconds from the start of the trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pod {
    /// `openb-pod-0042`.
    pub name: String,
    pub cpu_milli: u32,
    pub memory_mib: u32,
    pub num_gpu: u32,
    /// Thousandths of one GPU, for a pod sharing one GPU (`num_gpu` 1); 1000 otherwise.
    pub gpu_milli: u32,
    pub qos: Qos,
    pub phase: Phase,
    pub creation: i64,
    pub deletion: i64,
    /// When it was placed on a node; never for a pod that stayed pending.
    pub scheduled: Option<i64>,
}

impl Pod {
    /// The number in its name (`42` of `openb-pod-0042`).
    pub fn number(&self) -> &str {
        self.name.rsplit('-').next().unwrap_or(&self.name)
    }
}

/// The GPUs of one model in the cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelCapacity {
    pub gpus: u32,
    /// The most GPUs one node of the model has.
    pub largest_node: u32,
}

/// Reads the pod list; an error names the line.
pub fn pods(text: &str) -> Result<Vec<Pod>, String> {
    rows(
        text,
        &[
            "name",
            "cpu_milli",
            "memory_mib",
            "num_gpu",
            "gpu_milli",
            "gpu_spec",
            "qos",
            "pod_phase",
            "creation_time",
            "deletion_time",
            "scheduled_time",
        ],
    )?
    .into_iter()
    .map(|(line, cells)| {
        let number = |index: usize| -> Result<i64, String> {
            cells[index]
                .parse()
                .map_err(|_| format!("line {line}: `{}` is not a number", cells[index]))
        };
        let small = |index: usize| -> Result<u32, String> {
            u32::try_from(number(index)?).map_err(|_| format!("line {line}: out of range"))
        };
        Ok(Pod {
            name: cells[0].to_owned(),
            cpu_milli: small(1)?,
            memory_mib: small(2)?,
            num_gpu: small(3)?,
            gpu_milli: small(4)?,
            qos: Qos::parse(cells[6])
                .ok_or_else(|| format!("line {line}: unknown qos `{}`", cells[6]))?,
            phase: Phase::parse(cells[7])
                .ok_or_else(|| format!("line {line}: unknown phase `{}`", cells[7]))?,
            creation: number(8)?,
            deletion: number(9)?,
            scheduled: if cells[10].is_empty() {
                None
            } else {
                Some(number(10)?)
            },
        })
    })
    .collect()
}

/// One GPU node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// `openb-node-0042`.
    pub name: String,
    pub gpus: u32,
    /// The trace's model code.
    pub model: String,
}

/// Reads the node list, node by node.
pub fn nodes(text: &str) -> Result<Vec<Node>, String> {
    rows(text, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])?
        .into_iter()
        .map(|(line, cells)| {
            Ok(Node {
                name: cells[0].to_owned(),
                gpus: cells[3]
                    .parse()
                    .map_err(|_| format!("line {line}: `{}` is not a GPU count", cells[3]))?,
                model: cells[4].to_owned(),
            })
        })
        .collect()
}

/// Reads the node list into the GPUs of each model (the trace's model codes).
pub fn capacity(text: &str) -> Result<BTreeMap<String, ModelCapacity>, String> {
    let mut models: BTreeMap<String, ModelCapacity> = BTreeMap::new();
    for (line, cells) in rows(text, &["sn", "cpu_milli", "memory_mib", "gpu", "model"])? {
        let gpus: u32 = cells[3]
            .parse()
            .map_err(|_| format!("line {line}: `{}` is not a GPU count", cells[3]))?;
        let model = models.entry(cells[4].to_owned()).or_default();
        model.gpus += gpus;
        model.largest_node = model.largest_node.max(gpus);
    }
    Ok(models)
}

/// The data rows of a plain CSV file (no quoting: the trace has none) with the expected
/// header, each with its line number.
fn rows<'a>(text: &'a str, header: &[&str]) -> Result<Vec<(usize, Vec<&'a str>)>, String> {
    let mut lines = text.lines().enumerate();
    let found: Vec<&str> = lines
        .next()
        .map(|(_, line)| line.trim_end().split(',').collect())
        .unwrap_or_default();
    if found != header {
        return Err(format!("unexpected header {found:?}, expected {header:?}"));
    }
    lines
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(index, line)| {
            let cells: Vec<&str> = line.trim_end().split(',').collect();
            if cells.len() == header.len() {
                Ok((index + 1, cells))
            } else {
                Err(format!(
                    "line {}: {} cells, expected {}",
                    index + 1,
                    cells.len(),
                    header.len()
                ))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_trace_reads_whole() {
        let pods = pods(POD_LIST).unwrap();
        assert_eq!(pods.len(), 8152);
        assert_eq!(pods[1].name, "openb-pod-0001");
        assert_eq!(pods[1].gpu_milli, 460);
        assert_eq!(pods[1].number(), "0001");
        assert!(pods.iter().any(|p| p.scheduled.is_none()));
        let capacity = capacity(NODE_LIST).unwrap();
        assert_eq!(capacity["G2"].gpus, 549 * 8);
        assert_eq!(capacity["T4"].largest_node, 4);
        assert_eq!(capacity.len(), 7);
    }

    #[test]
    fn a_bad_row_is_named_by_its_line() {
        let header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,\
                      creation_time,deletion_time,scheduled_time";
        let text = format!("{header}\np,1,1,1,1000,,XX,Running,0,1,0\n");
        assert_eq!(pods(&text).unwrap_err(), "line 2: unknown qos `XX`");
        assert!(pods("a,b\n").unwrap_err().starts_with("unexpected header"));
    }
}
