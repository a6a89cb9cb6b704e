//! The PromQL the Prometheus collector asks, and how Prometheus' answers are read.
//!
//! Every question is an instant query answering one sample per pod (or one per figure of a
//! pod), so an answer grows with the number of pods, never with the number of samples. Times
//! come from sample timestamps (`timestamp()` inside a subquery), never from when a query was
//! evaluated: an instant selector finds a sample up to five minutes old (Prometheus' lookback),
//! so a pod's series seem to live on after it is gone, and, read at the start of a pod's life,
//! reach back before it (see [`dcgm`]).

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, TimeDelta, Utc};
use rust_decimal::Decimal;
use serde_json::Value;

/// kube-state-metrics spells extended resources with underscores (`nvidia_com_gpu`,
/// `nvidia_com_mig_1g_10gb`); other exporters keep Kubernetes' spelling.
pub const GPU_RESOURCES: &str = "nvidia[._]com[/_].+";

/// The node resources that are GPUs or MIG slices of them (not HAMi's cores and memory).
pub const NODE_GPU_RESOURCES: &str = "nvidia[._]com[/_](gpu|mig.+)";

/// The pod identity every pod query groups by.
const POD: &str = "namespace, pod, uid";

/// One series of an answer: its labels and its value as Prometheus wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: String,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }

    /// The value as a decimal; `None` for NaN and infinities, which Prometheus may answer.
    pub fn decimal(&self) -> Option<Decimal> {
        let raw = self.value.as_str();
        Decimal::from_str(raw)
            .or_else(|_| Decimal::from_scientific(raw))
            .ok()
    }

    /// The value read as Unix seconds.
    pub fn time(&self) -> Option<DateTime<Utc>> {
        let seconds = self.decimal()?;
        let nanos = (seconds.fract() * Decimal::from(1_000_000_000)).round();
        DateTime::from_timestamp(
            i64::try_from(seconds.trunc()).ok()?,
            u32::try_from(nanos).ok()?,
        )
    }
}

/// An instant query's answer as Prometheus writes it when it succeeds: read straight into
/// its samples, with no tree of the whole answer.
#[derive(serde::Deserialize)]
struct Answer {
    status: String,
    data: Data,
}

#[derive(serde::Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<Series>,
}

#[derive(serde::Deserialize)]
struct Series {
    metric: BTreeMap<String, String>,
    value: (serde::de::IgnoredAny, String),
}

/// The most values of an answer that is no vector read again to say what is wrong with it.
const MAX_VALUES_READ_AGAIN: usize = 100_000;

/// The samples of an instant query's answer (`resultType` `vector`), or what is wrong with it.
pub fn vector(body: &[u8]) -> Result<Vec<Sample>, String> {
    match serde_json::from_slice::<Answer>(body) {
        Ok(Answer { status, data }) if status == "success" && data.result_type == "vector" => {
            return Ok(data
                .result
                .into_iter()
                .map(|series| Sample {
                    labels: series.metric,
                    value: series.value.1,
                })
                .collect());
        }
        // Anything else is read again, generically, to say what is wrong with it, unless it
        // is too large to hold as a tree.
        Err(error) if crate::domain::validation::json_values(body) > MAX_VALUES_READ_AGAIN => {
            return Err(format!(
                "the answer is not an instant vector of series ({error})"
            ));
        }
        _ => {}
    }
    let answer: Value = serde_json::from_slice(body).map_err(|error| {
        let start = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
        format!("the answer is not JSON ({error}): `{start}`")
    })?;
    match answer["status"].as_str() {
        Some("success") => {}
        Some("error") => {
            return Err(format!(
                "Prometheus answered {}: {}",
                answer["errorType"].as_str().unwrap_or("an error"),
                answer["error"].as_str().unwrap_or("no detail")
            ));
        }
        _ => return Err("the answer has no `status` of success or error".to_owned()),
    }
    let data = &answer["data"];
    if data["resultType"] != "vector" {
        return Err(format!(
            "the answer is a `{}`, not an instant vector",
            data["resultType"].as_str().unwrap_or("?")
        ));
    }
    let results = data["result"]
        .as_array()
        .ok_or("the answer has no `data.result` list")?;
    results.iter().map(sample).collect()
}

fn sample(series: &Value) -> Result<Sample, String> {
    let labels = series["metric"]
        .as_object()
        .ok_or("a series of the answer has no `metric` object")?
        .iter()
        .map(|(name, value)| {
            value
                .as_str()
                .map(|value| (name.clone(), value.to_owned()))
                .ok_or_else(|| format!("the label `{name}` of a series is not a string"))
        })
        .collect::<Result<_, _>>()?;
    let value = series["value"][1]
        .as_str()
        .ok_or("a series of the answer has no `value` [time, \"number\"]")?
        .to_owned();
    Ok(Sample { labels, value })
}

/// One series of a range query's answer: its labels and its values by Unix second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeSeries {
    pub labels: BTreeMap<String, String>,
    pub points: Vec<(i64, String)>,
}

impl RangeSeries {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .get(name)
            .map(String::as_str)
            .filter(|value| !value.is_empty())
    }
}

#[derive(serde::Deserialize)]
struct RangeAnswer {
    status: String,
    data: RangeData,
}

#[derive(serde::Deserialize)]
struct RangeData {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<RangeResult>,
}

#[derive(serde::Deserialize)]
struct RangeResult {
    metric: BTreeMap<String, String>,
    values: Vec<(serde_json::Number, String)>,
}

/// The series of a range query's answer (`resultType` `matrix`), or what is wrong with it.
/// Times are read to the second, as the collector asks for whole-second steps.
pub fn matrix(body: &[u8]) -> Result<Vec<RangeSeries>, String> {
    match serde_json::from_slice::<RangeAnswer>(body) {
        Ok(RangeAnswer { status, data }) if status == "success" && data.result_type == "matrix" => {
            data.result
                .into_iter()
                .map(|series| {
                    let points = series
                        .values
                        .into_iter()
                        .map(|(time, value)| {
                            let seconds = time.as_i64().or_else(|| {
                                Decimal::from_str(&time.to_string())
                                    .ok()
                                    .and_then(|t| i64::try_from(t.floor()).ok())
                            });
                            seconds
                                .map(|seconds| (seconds, value))
                                .ok_or_else(|| format!("`{time}` is not a time"))
                        })
                        .collect::<Result<_, String>>()?;
                    Ok(RangeSeries {
                        labels: series.metric,
                        points,
                    })
                })
                .collect()
        }
        Ok(RangeAnswer { data, .. }) if data.result_type != "matrix" => Err(format!(
            "the answer is a `{}`, not a range of series",
            data.result_type
        )),
        // Errors and unreadable answers are told as for instant queries.
        _ => vector(body).and_then(|_| Err("the answer is not a range of series".to_owned())),
    }
}

/// The range queries of node capacity, and the instant ones of node labels.
#[derive(Debug, Clone)]
pub struct NodeQueries<'a> {
    /// Extra matchers for every series (`cluster="gpu-a"`), or empty.
    pub selector: &'a str,
}

impl NodeQueries<'_> {
    /// Each node's GPUs and MIG slices, by resource.
    pub fn gpus(&self) -> String {
        format!(
            "max by (node, resource) ({})",
            select(
                "kube_node_status_capacity",
                self.selector,
                &[&format!("resource=~{}", string(NODE_GPU_RESOURCES))]
            )
        )
    }

    /// The nodes that cannot take pods: cordoned, or not `Ready`.
    pub fn down(&self) -> String {
        format!(
            "max by (node) (({} == 1) or ({} == 1))",
            select("kube_node_spec_unschedulable", self.selector, &[]),
            select(
                "kube_node_status_condition",
                self.selector,
                &["condition=\"Ready\"", "status!=\"true\""]
            )
        )
    }

    /// Each node's labels, as last seen in `range`.
    pub fn labels(&self, range: TimeDelta) -> String {
        format!(
            "last_over_time({}[{}])",
            select("kube_node_labels", self.selector, &[]),
            seconds(range)
        )
    }

    /// Each node's provider ID, as last seen in `range`.
    pub fn info(&self, range: TimeDelta) -> String {
        format!(
            "max by (node, provider_id) (last_over_time({}[{}]))",
            select("kube_node_info", self.selector, &[]),
            seconds(range)
        )
    }
}

/// A PromQL string literal.
pub fn string(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        if c == '\\' || c == '"' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// A regular expression matching exactly these values, as a PromQL string literal.
pub fn any_of<'a>(values: impl IntoIterator<Item = &'a str>) -> String {
    let alternatives: Vec<String> = values.into_iter().map(literal).collect();
    string(&alternatives.join("|"))
}

/// `value` as a regular expression matching it alone.
fn literal(value: &str) -> String {
    value
        .chars()
        .flat_map(|c| {
            let escape = "\\.+*?()|[]{}^$".contains(c);
            escape.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// How many characters of a pod's UID name the slice of pods it is counted in.
pub const UID_PREFIX_CHARS: usize = 2;

/// The pods whose UID starts with one of `prefixes`, as [`PodQueries::uid_prefixes`] answers
/// them (`uid=~"0a.*|0b.*"`), or, with `within` false, every other pod: a prefix shorter than
/// [`UID_PREFIX_CHARS`] is a whole UID (the empty one of pods exported without a UID).
fn uid_matcher<'a>(prefixes: impl IntoIterator<Item = &'a str>, within: bool) -> String {
    let alternatives: Vec<String> = prefixes
        .into_iter()
        .map(|prefix| {
            let exact = literal(prefix);
            if prefix.chars().count() < UID_PREFIX_CHARS {
                exact
            } else {
                format!("{exact}.*")
            }
        })
        .collect();
    let operator = if within { "=~" } else { "!~" };
    format!("uid{operator}{}", string(&alternatives.join("|")))
}

/// Cuts the pods of a window into pages of about `page_pods`, from how many pods each UID
/// prefix holds (the answer of [`PodQueries::uid_prefixes`]): each page is the matcher that
/// selects its pods, and together they select every pod exactly once, the last page taking
/// whatever the others do not (pods that appeared since the count included). A prefix holding
/// more than `page_pods` makes a page of its own. One page is the empty matcher: the window
/// whole, as without paging.
pub fn uid_pages(counts: &[(String, u64)], page_pods: u64) -> Vec<String> {
    let mut prefixes: Vec<(&str, u64)> = counts.iter().map(|(p, n)| (p.as_str(), *n)).collect();
    prefixes.sort_unstable();
    let mut pages: Vec<Vec<&str>> = vec![Vec::new()];
    let mut filled = 0;
    for (prefix, count) in prefixes {
        if filled + count > page_pods && filled > 0 {
            pages.push(Vec::new());
            filled = 0;
        }
        filled += count;
        pages.last_mut().expect("one page at least").push(prefix);
    }
    if pages.len() == 1 {
        return vec![String::new()];
    }
    let (last, earlier) = pages.split_last().expect("two pages at least");
    let mut matchers: Vec<String> = earlier
        .iter()
        .map(|page| uid_matcher(page.iter().copied(), true))
        .collect();
    debug_assert!(!last.is_empty());
    matchers.push(uid_matcher(earlier.iter().flatten().copied(), false));
    matchers
}

/// A range or resolution in whole seconds, at least one.
pub fn seconds(span: TimeDelta) -> String {
    let whole = span.num_seconds() + i64::from(span.subsec_nanos() > 0);
    format!("{}s", whole.max(1))
}

/// A time as a PromQL number: Unix seconds, to the millisecond, as Prometheus keeps them.
fn unix(at: DateTime<Utc>) -> String {
    format!("{}.{:03}", at.timestamp(), at.timestamp_subsec_millis())
}

/// `name{matchers}`, with the operator's selector (`cluster="a"`) first.
fn select(name: &str, selector: &str, matchers: &[&str]) -> String {
    let all: Vec<&str> = std::iter::once(selector)
        .chain(matchers.iter().copied())
        .filter(|m| !m.is_empty())
        .collect();
    format!("{name}{{{}}}", all.join(", "))
}

/// What a pod query finds out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PodFact {
    Created,
    Started,
    Completed,
    /// The phase of the pod's last sample.
    Phase,
    /// When the pod was last seen at all.
    LastSeen,
    /// When the pod was last seen in phase Running.
    LastRunning,
    Owner,
    Labels,
    Requests,
    Limits,
    Restarts,
    StatusReason,
    TerminatedReason,
    LastTerminatedReason,
    Node,
}

/// The pod queries of a window, evaluated at its end.
#[derive(Debug, Clone)]
pub struct PodQueries<'a> {
    /// Extra matchers for every series (`cluster="gpu-a"`), or empty.
    pub selector: &'a str,
    /// The window's length: each query reads `[range]` back from the window's end.
    pub range: TimeDelta,
    /// The subquery step of the timestamp queries: the scrape interval of kube-state-metrics.
    pub resolution: TimeDelta,
}

impl PodQueries<'_> {
    pub fn all(&self) -> Vec<(PodFact, String)> {
        use PodFact::*;
        [
            Created,
            Started,
            Completed,
            Phase,
            LastSeen,
            LastRunning,
            Owner,
            Labels,
            Requests,
            Limits,
            Restarts,
            StatusReason,
            TerminatedReason,
            LastTerminatedReason,
            Node,
        ]
        .into_iter()
        .map(|fact| (fact, self.query(fact)))
        .collect()
    }

    pub fn query(&self, fact: PodFact) -> String {
        let range = seconds(self.range);
        let step = seconds(self.resolution);
        let s = |name: &str, matchers: &[&str]| select(name, self.selector, matchers);
        let resource = format!("resource=~{}", string(GPU_RESOURCES));
        match fact {
            PodFact::Created => {
                format!(
                    "max by ({POD}) (max_over_time({}[{range}]))",
                    s("kube_pod_created", &[])
                )
            }
            PodFact::Started => format!(
                "max by ({POD}) (max_over_time({}[{range}]))",
                s("kube_pod_start_time", &[])
            ),
            PodFact::Completed => format!(
                "max by ({POD}) (max_over_time({}[{range}]))",
                s("kube_pod_completion_time", &[])
            ),
            PodFact::Phase => format!(
                "max by ({POD}, phase) (last_over_time({}[{range}])) == 1",
                s("kube_pod_status_phase", &[])
            ),
            // One series per pod, where the phase has five.
            PodFact::LastSeen => format!(
                "max by ({POD}) (max_over_time(timestamp({})[{range}:{step}]))",
                s("kube_pod_created", &[])
            ),
            // `timestamp()` answers a sample's own time only when applied to a selector
            // itself, so the filter comes after it.
            PodFact::LastRunning => {
                let running = s("kube_pod_status_phase", &["phase=\"Running\""]);
                format!(
                    "max by ({POD}) (max_over_time((timestamp({running}) and {running} == 1)\
                     [{range}:{step}]))"
                )
            }
            PodFact::Owner => format!(
                "max by ({POD}, owner_kind, owner_name) (last_over_time({}[{range}]))",
                s("kube_pod_owner", &[])
            ),
            PodFact::Labels => format!("last_over_time({}[{range}])", s("kube_pod_labels", &[])),
            PodFact::Requests | PodFact::Limits => {
                let name = match fact {
                    PodFact::Requests => "kube_pod_container_resource_requests",
                    _ => "kube_pod_container_resource_limits",
                };
                format!(
                    "sum by ({POD}, resource) (max by ({POD}, container, resource) \
                     (last_over_time({}[{range}])))",
                    s(name, &[&resource])
                )
            }
            PodFact::Restarts => format!(
                "sum by ({POD}) (max by ({POD}, container) (max_over_time({}[{range}])))",
                s("kube_pod_container_status_restarts_total", &[])
            ),
            PodFact::StatusReason => format!(
                "max by ({POD}, reason) (max_over_time({}[{range}])) == 1",
                s("kube_pod_status_reason", &[])
            ),
            PodFact::TerminatedReason => format!(
                "max by ({POD}, reason) (max_over_time({}[{range}])) == 1",
                s("kube_pod_container_status_terminated_reason", &[])
            ),
            PodFact::LastTerminatedReason => format!(
                "max by ({POD}, reason) (max_over_time({}[{range}])) == 1",
                s("kube_pod_container_status_last_terminated_reason", &[])
            ),
            PodFact::Node => format!(
                "max by ({POD}, node) (last_over_time({}[{range}]))",
                s("kube_pod_info", &[])
            ),
        }
    }

    /// How many pods the window holds, by the first [`UID_PREFIX_CHARS`] characters of their
    /// UID (label `prefix`): a cheap answer of at most a few hundred series from which the
    /// pods are cut into pages.
    pub fn uid_prefixes(&self) -> String {
        format!(
            "count by (prefix) (label_replace({}, \"prefix\", \"$1\", \"uid\", \"(.{{0,{UID_PREFIX_CHARS}}}).*\"))",
            self.query(PodFact::Created)
        )
    }

    /// When any pod of the window was last reported: the latest of [`PodFact::LastSeen`].
    pub fn reported_until(&self) -> String {
        format!(
            "max(max_over_time(timestamp({})[{}:{}]))",
            select("kube_pod_created", self.selector, &[]),
            seconds(self.range),
            seconds(self.resolution)
        )
    }

    /// The GPU product label of each node, as NVIDIA's GPU feature discovery sets it.
    pub fn node_products(&self) -> String {
        format!(
            "max by (node, label_nvidia_com_gpu_product) (last_over_time({}[{}]))",
            select(
                "kube_node_labels",
                self.selector,
                &["label_nvidia_com_gpu_product!=\"\""]
            ),
            seconds(self.range)
        )
    }
}

/// How the pods of one task are found, to number them as attempts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaskSource {
    /// The pods a Job owns.
    Job,
    /// The pods with this kube-state-metrics label (`label_job_name`).
    Label(String),
    /// Pods of this name (a bare or StatefulSet pod recreated under its name).
    PodName,
}

/// Every pod of the named tasks Prometheus saw in `[range]`, each with its creation time and
/// its task in the label `task`.
pub fn task_pods<'a>(
    selector: &str,
    source: &TaskSource,
    tasks: impl IntoIterator<Item = &'a str>,
    range: TimeDelta,
) -> String {
    let range = seconds(range);
    let names = any_of(tasks);
    let created = format!(
        "max by ({POD}) (max_over_time({}[{range}]))",
        select("kube_pod_created", selector, &[])
    );
    let (members, label) = match source {
        TaskSource::Job => (
            select(
                "kube_pod_owner",
                selector,
                &["owner_kind=\"Job\"", &format!("owner_name=~{names}")],
            ),
            "owner_name".to_owned(),
        ),
        TaskSource::Label(label) => (
            select("kube_pod_labels", selector, &[&format!("{label}=~{names}")]),
            label.clone(),
        ),
        TaskSource::PodName => (
            select("kube_pod_created", selector, &[&format!("pod=~{names}")]),
            "pod".to_owned(),
        ),
    };
    format!(
        "{created} * on ({POD}) group_left (task) \
         label_replace(group by ({POD}, {label}) (last_over_time({members}[{range}])), \
         \"task\", \"$1\", {}, \"(.*)\")",
        string(&label)
    )
}

/// The figures dcgm-exporter measured of one pod's GPUs over its life, from `started` to
/// `ended` (the query is evaluated at `ended`), each tagged with the label `figure`: averages
/// over the GPUs of the per-GPU averages over time, the highest framebuffer use, the GPU
/// models and MIG profiles of the pod's devices, and each GPU's energy counter: its lowest
/// and highest reading and how often it went down, read every `resolution` over the life
/// from the GPU's series merged (`max by` the GPU), so that a series dcgm-exporter starts
/// anew (after its own restart) continues the same counter.
///
/// The figures over time read range selectors, which hold only the samples of the range.
/// The counter's readings come from instant selectors at each step instead, which reach back
/// up to Prometheus' lookback (five minutes): at the first steps of a life they would find a
/// reading from before it, of an earlier pod of the same namespace and name on the same GPU
/// where dcgm-exporter exports no `pod_uid`. So each step keeps only readings taken after
/// `started` (`timestamp()` of the selector is the sample's own time): the counter is read
/// from samples in `(started, ended]` alone.
pub fn dcgm(
    selector: &str,
    namespace: &str,
    pod: &str,
    uid: Option<&str>,
    (started, ended): (DateTime<Utc>, DateTime<Utc>),
    resolution: TimeDelta,
) -> String {
    let uid_matcher = uid.map(|uid| format!("pod_uid=~{}", any_of([uid, ""])));
    let namespace = format!("namespace={}", string(namespace));
    let pod = format!("pod={}", string(pod));
    let mut matchers: Vec<&str> = vec![&namespace, &pod];
    if let Some(uid) = &uid_matcher {
        matchers.push(uid);
    }
    let range = seconds(ended - started);
    let s = |name: &str| select(name, selector, &matchers);
    let tag = |figure: &str, expression: String| {
        format!("label_replace({expression}, \"figure\", \"{figure}\", \"\", \"\")")
    };
    let average = |name: &str| format!("avg(avg_over_time({}[{range}]))", s(name));
    let readings = s("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION");
    let counter = format!(
        "max by (UUID, GPU_I_ID, GPU_I_PROFILE, vgpu) ({readings} and (timestamp({readings}) > {}))",
        unix(started)
    );
    let step = seconds(resolution);
    let over_life = |function: &str| format!("{function}(({counter})[{range}:{step}])");
    let devices = |name: &str| {
        format!(
            "count by (modelName, GPU_I_PROFILE) (last_over_time({}[{range}]))",
            s(name)
        )
    };
    [
        tag("gpu_util", average("DCGM_FI_DEV_GPU_UTIL")),
        tag("gr_engine_active", average("DCGM_FI_PROF_GR_ENGINE_ACTIVE")),
        tag("sm_active", average("DCGM_FI_PROF_SM_ACTIVE")),
        tag("tensor_active", average("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")),
        tag("dram_active", average("DCGM_FI_PROF_DRAM_ACTIVE")),
        tag(
            "fb_used",
            format!("max(max_over_time({}[{range}]))", s("DCGM_FI_DEV_FB_USED")),
        ),
        tag(
            "device",
            format!(
                "{} or {} or {}",
                devices("DCGM_FI_DEV_FB_USED"),
                devices("DCGM_FI_DEV_GPU_UTIL"),
                devices("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            ),
        ),
        tag("energy_least", over_life("min_over_time")),
        tag("energy_most", over_life("max_over_time")),
        tag("energy_resets", over_life("resets")),
    ]
    .join("\nor ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_or_refused_with_what_is_wrong() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"namespace":"ml","pod":"a"},"value":[1717200000,"1717199000.5"]},
            {"metric":{},"value":[1717200000,"NaN"]}]}}"#;
        let samples = vector(body).unwrap();
        assert_eq!(samples[0].label("pod"), Some("a"));
        assert_eq!(
            samples[0].time(),
            Some("2024-05-31T23:43:20.5Z".parse().unwrap())
        );
        assert_eq!(samples[1].decimal(), None);
        let error = br#"{"status":"error","errorType":"timeout","error":"query timed out"}"#;
        assert_eq!(
            vector(error).unwrap_err(),
            "Prometheus answered timeout: query timed out"
        );
        assert!(
            vector(b"<html>bad gateway</html>")
                .unwrap_err()
                .contains("not JSON")
        );
        let matrix = br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#;
        assert!(vector(matrix).unwrap_err().contains("`matrix`"));
        let broken =
            br#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{}}]}}"#;
        assert!(vector(broken).unwrap_err().contains("no `value`"));
        let small = Sample {
            labels: BTreeMap::new(),
            value: "1.5e-7".to_owned(),
        };
        assert_eq!(small.decimal(), Some("0.00000015".parse().unwrap()));
    }

    #[test]
    fn names_are_matched_exactly() {
        assert_eq!(any_of(["train.v1", "b"]), r#""train\\.v1|b""#);
        assert_eq!(string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(seconds(TimeDelta::milliseconds(1500)), "2s");
        assert_eq!(seconds(TimeDelta::zero()), "1s");
    }

    #[test]
    fn queries_carry_the_selector_and_the_range() {
        let queries = PodQueries {
            selector: "cluster=\"a\"",
            range: TimeDelta::hours(1),
            resolution: TimeDelta::seconds(30),
        };
        assert_eq!(
            queries.query(PodFact::LastRunning),
            "max by (namespace, pod, uid) (max_over_time((timestamp(\
             kube_pod_status_phase{cluster=\"a\", phase=\"Running\"}) and \
             kube_pod_status_phase{cluster=\"a\", phase=\"Running\"} == 1)[3600s:30s]))"
        );
        assert_eq!(
            queries.query(PodFact::Requests),
            "sum by (namespace, pod, uid, resource) (max by (namespace, pod, uid, container, \
             resource) (last_over_time(kube_pod_container_resource_requests{cluster=\"a\", \
             resource=~\"nvidia[._]com[/_].+\"}[3600s])))"
        );
        let plain = PodQueries {
            selector: "",
            ..queries
        };
        assert_eq!(
            plain.query(PodFact::Created),
            "max by (namespace, pod, uid) (max_over_time(kube_pod_created{}[3600s]))"
        );
        assert_eq!(
            plain.uid_prefixes(),
            "count by (prefix) (label_replace(max by (namespace, pod, uid) (max_over_time(\
             kube_pod_created{}[3600s])), \"prefix\", \"$1\", \"uid\", \"(.{0,2}).*\"))"
        );
        assert_eq!(
            queries.reported_until(),
            "max(max_over_time(timestamp(kube_pod_created{cluster=\"a\"})[3600s:30s]))"
        );
        assert_eq!(
            uid_matcher(["0a", "0b", "x", ""], true),
            r#"uid=~"0a.*|0b.*|x|""#
        );
        assert_eq!(uid_matcher(["a."], false), r#"uid!~"a\\..*""#);
        let started: DateTime<Utc> = "2024-06-01T00:00:00.25Z".parse().unwrap();
        let dcgm = dcgm(
            "",
            "ml",
            "p-1",
            Some("u1"),
            (started, started + TimeDelta::minutes(10)),
            TimeDelta::seconds(30),
        );
        assert!(dcgm.contains(
            "avg(avg_over_time(DCGM_FI_PROF_SM_ACTIVE{namespace=\"ml\", pod=\"p-1\", \
             pod_uid=~\"u1|\"}[600s]))"
        ));
        assert!(dcgm.contains(
            "label_replace(resets((max by (UUID, GPU_I_ID, GPU_I_PROFILE, vgpu) (\
             DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{namespace=\"ml\", pod=\"p-1\", \
             pod_uid=~\"u1|\"} and (timestamp(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{\
             namespace=\"ml\", pod=\"p-1\", pod_uid=~\"u1|\"}) > 1717200000.250)))\
             [600s:30s]), \"figure\", \"energy_resets\", \"\", \"\")"
        ));
    }

    #[test]
    fn pages_select_every_pod_once() {
        let counts = |raw: &[(&str, u64)]| -> Vec<(String, u64)> {
            raw.iter().map(|(p, n)| ((*p).to_owned(), *n)).collect()
        };
        assert_eq!(uid_pages(&counts(&[("0a", 3), ("0b", 4)]), 10), [""]);
        assert_eq!(uid_pages(&[], 10), [""]);
        assert_eq!(
            uid_pages(
                &counts(&[("0b", 4), ("0a", 3), ("ff", 12), ("", 1), ("c1", 2)]),
                8
            ),
            [
                r#"uid=~"|0a.*|0b.*""#,
                r#"uid=~"c1.*""#,
                r#"uid!~"|0a.*|0b.*|c1.*""#,
            ]
        );
    }
}
