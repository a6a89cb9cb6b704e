//! `taskledger collect prometheus`: asks Prometheus what kube-state-metrics and dcgm-exporter
//! recorded of the pods that finished in the window, and maps them as
//! [`crate::sources::kubernetes`] says.
//!
//! A window is read in pages of pods, cut by the first characters of their UIDs, and each page
//! is handed on whole before the next is read: memory grows with the page, not the cluster.
//! Prometheus down, a query timing out or an answer that cannot be read ends the run with an
//! error, the pages before it delivered and the state where it was, so the next run reads the
//! window again and counts them as duplicates.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use futures::{StreamExt, TryStreamExt};
use serde_json::Value;

use super::Window;
use crate::domain::values::redacted_url;
use crate::sources::batch::SourceBatch;
use crate::sources::kubernetes::nodes::{self, NodeFacts, NodeMapping};
use crate::sources::kubernetes::promql::{
    self, NodeQueries, PodQueries, RangeSeries, Sample, TaskSource,
};
use crate::sources::kubernetes::telemetry::Dcgm;
use crate::sources::kubernetes::{self, Horizon, Mapping, Measured, Plan, PodTable};

/// How many per-pod DCGM queries are in flight at once.
const PARALLEL_QUERIES: usize = 8;
/// The largest answer read; a larger one is refused with what to narrow, never held.
pub const MAX_ANSWER_BYTES: usize = 64 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct PrometheusCollector {
    /// Prometheus' base URL, under which `api/v1/query` answers.
    pub url: url::Url,
    /// A bearer token for a Prometheus behind authentication.
    pub token: Option<String>,
    /// Extra matchers for every series (`cluster="gpu-a"`), or empty.
    pub selector: String,
    /// The scrape interval of kube-state-metrics: the step of the timestamp subqueries.
    pub resolution: TimeDelta,
    /// How long after a pod ended its data counts as complete.
    pub settle: TimeDelta,
    /// How far before the earliest pod of the window the pods of its tasks are looked for.
    pub attempt_lookback: TimeDelta,
    /// The longest one query may take.
    pub query_timeout: Duration,
    /// About how many pods one page holds: a window of more is read and handed on a page at
    /// a time.
    pub page_pods: usize,
    pub mapping: Mapping,
    /// How nodes become capacity; `None`: nodes are not read.
    pub capacity: Option<NodeMapping>,
}

impl PrometheusCollector {
    /// Reads the window (its pods, the other pods of their tasks, and what DCGM measured) a
    /// page of about [`Self::page_pods`] pods at a time and hands each page on before the next
    /// is read, so that what is held grows with the page, not the cluster. Answers how many
    /// pages there were.
    pub async fn read_pages(
        &self,
        window: Window,
        now: DateTime<Utc>,
        mut hand_on: impl AsyncFnMut(SourceBatch) -> anyhow::Result<()>,
    ) -> anyhow::Result<usize> {
        let client = reqwest::Client::builder()
            .timeout(self.client_timeout())
            .build()?;
        let queries = PodQueries {
            selector: &self.selector,
            range: window.until - window.since,
            resolution: self.resolution,
        };
        let counted = self
            .query(&client, &queries.uid_prefixes(), window.until)
            .await?;
        let counts = counted
            .iter()
            .map(|sample| {
                let count = sample.decimal().and_then(|count| u64::try_from(count).ok());
                match count {
                    Some(count) => Ok((sample.label("prefix").unwrap_or("").to_owned(), count)),
                    None => {
                        Err(self.unreadable(format!("`{}` is not a count of pods", sample.value)))
                    }
                }
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let pages = promql::uid_pages(&counts, self.page_pods.max(1) as u64);
        // A pod that stopped being reported counts as gone by when any pod was last
        // reported, which a page alone does not know.
        let reported_until = if pages.len() > 1 {
            let answer = self
                .query(&client, &queries.reported_until(), window.until)
                .await?;
            answer.first().and_then(Sample::time)
        } else {
            None
        };
        let horizon = Horizon {
            since: window.since,
            until: window.until,
            now,
            settle: self.settle,
            reported_until,
        };
        let products = self
            .query(&client, &queries.node_products(), window.until)
            .await?;
        let node_products: BTreeMap<String, String> = products
            .iter()
            .filter_map(|s| {
                Some((
                    s.label("node")?.to_owned(),
                    s.label("label_nvidia_com_gpu_product")?.to_owned(),
                ))
            })
            .collect();
        for page in &pages {
            let selector = [self.selector.as_str(), page]
                .into_iter()
                .filter(|matcher| !matcher.is_empty())
                .collect::<Vec<_>>()
                .join(", ");
            let page_queries = PodQueries {
                selector: &selector,
                ..queries.clone()
            };
            // One answer at a time: each is folded into the table and dropped.
            let mut table = PodTable::default();
            for (fact, query) in page_queries.all() {
                let samples = self.query(&client, &query, window.until).await?;
                table
                    .add(fact, samples)
                    .map_err(|error| self.unreadable(error))?;
            }
            let plan = kubernetes::plan(table.finish(), &horizon, &self.mapping);
            let batch = self
                .read_page(&client, plan, window, node_products.clone())
                .await?;
            hand_on(batch).await?;
        }
        Ok(pages.len())
    }

    /// Reads the GPU nodes of every whole UTC hour from the one the window starts in to the last
    /// that ended `settle` before now (and by the window's end), an hour at a time, handing on
    /// each hour's capacity intervals. Answers how many hours were read.
    pub async fn read_capacity(
        &self,
        window: Window,
        now: DateTime<Utc>,
        mut hand_on: impl AsyncFnMut(Vec<Value>) -> anyhow::Result<()>,
    ) -> anyhow::Result<usize> {
        let Some(node_mapping) = &self.capacity else {
            return Ok(0);
        };
        let hour = TimeDelta::hours(1);
        let decided = window.until.min(now - self.settle);
        let first = window.since.duration_trunc(hour).map_err(|error| {
            anyhow::anyhow!("cannot find the hour of {}: {error}", window.since)
        })?;
        let hours: Vec<DateTime<Utc>> = std::iter::successors(Some(first), |h| Some(*h + hour))
            .take_while(|h| *h + hour <= decided)
            .collect();
        let (Some(earliest), Some(latest)) = (hours.first(), hours.last()) else {
            return Ok(0);
        };
        let client = reqwest::Client::builder()
            .timeout(self.client_timeout())
            .build()?;
        let queries = NodeQueries {
            selector: &self.selector,
        };
        let end = *latest + hour;
        let span = end - *earliest;
        let mut facts = NodeFacts::default();
        for query in [queries.labels(span), queries.info(span)] {
            let answer = self.query(&client, &query, end).await?;
            facts.add(answer.into_iter().map(|sample| sample.labels));
        }
        let step = self.resolution;
        for start in &hours {
            let range = (*start, *start + hour - step);
            let gpus = self
                .query_range(&client, &queries.gpus(), range, step)
                .await?;
            if gpus.is_empty() {
                continue;
            }
            let down = self
                .query_range(&client, &queries.down(), range, step)
                .await?;
            let hour = nodes::Hour {
                start: *start,
                step,
                gpus: &gpus,
                down: &down,
            };
            let intervals = nodes::intervals(&hour, &facts, node_mapping, &self.mapping);
            if !intervals.is_empty() {
                hand_on(intervals).await?;
            }
        }
        Ok(hours.len())
    }

    /// The records of a page's planned pods: their attempts among their tasks' pods, and
    /// what DCGM measured of them.
    async fn read_page(
        &self,
        client: &reqwest::Client,
        plan: Plan,
        window: Window,
        node_products: BTreeMap<String, String>,
    ) -> anyhow::Result<SourceBatch> {
        if plan.candidates.is_empty() {
            return Ok(kubernetes::records(
                plan,
                &[],
                &Measured::default(),
                &self.mapping,
            ));
        }
        let earliest = plan
            .candidates
            .iter()
            .map(|c| c.pod.created.unwrap_or(c.started))
            .min()
            .unwrap_or(window.since);
        let task_range = window.until - earliest + self.attempt_lookback;
        let mut tasks: BTreeMap<&TaskSource, BTreeSet<&str>> = BTreeMap::new();
        for candidate in &plan.candidates {
            tasks
                .entry(&candidate.task.source)
                .or_default()
                .insert(&candidate.task.name);
        }
        let mut members = BTreeMap::new();
        for (source, names) in tasks {
            let query = promql::task_pods(&self.selector, source, names, task_range);
            members.insert(
                source.clone(),
                self.query(client, &query, window.until).await?,
            );
        }
        let attempts = kubernetes::attempts(&plan.candidates, &members)
            .map_err(|error| self.unreadable(error))?;
        drop(members);
        let dcgm: BTreeMap<_, _> = futures::stream::iter(plan.candidates.iter())
            .map(|candidate| async move {
                let key = &candidate.pod.key;
                let query = promql::dcgm(
                    &self.selector,
                    &key.namespace,
                    &key.name,
                    Some(key.uid.as_str()).filter(|uid| !uid.is_empty()),
                    (candidate.started, candidate.ended),
                    self.resolution,
                );
                let samples = self.query(client, &query, candidate.ended).await?;
                let dcgm = Dcgm::read(&samples)
                    .map_err(|error| self.unreadable(format!("{}: {error}", key.location())))?;
                anyhow::Ok((key.clone(), dcgm))
            })
            .buffer_unordered(PARALLEL_QUERIES)
            .try_collect()
            .await?;
        let measured = Measured {
            dcgm,
            node_products,
        };
        Ok(kubernetes::records(
            plan,
            &attempts,
            &measured,
            &self.mapping,
        ))
    }

    /// Runs an instant query at `at`.
    async fn query(
        &self,
        client: &reqwest::Client,
        promql: &str,
        at: DateTime<Utc>,
    ) -> anyhow::Result<Vec<Sample>> {
        let time = seconds(at);
        self.ask(
            client,
            "api/v1/query",
            promql,
            &[("time", &time)],
            promql::vector,
        )
        .await
    }

    /// Runs a range query from `start` to `end` (both included) every `step`.
    async fn query_range(
        &self,
        client: &reqwest::Client,
        promql: &str,
        (start, end): (DateTime<Utc>, DateTime<Utc>),
        step: TimeDelta,
    ) -> anyhow::Result<Vec<RangeSeries>> {
        let (start, end) = (seconds(start), seconds(end));
        let step = step.num_seconds().max(1).to_string();
        let parameters = [("start", start.as_str()), ("end", &end), ("step", &step)];
        self.ask(
            client,
            "api/v1/query_range",
            promql,
            &parameters,
            promql::matrix,
        )
        .await
    }

    /// Asks `promql` of the endpoint at `path` and reads the answer with `read`.
    async fn ask<T>(
        &self,
        client: &reqwest::Client,
        path: &str,
        promql: &str,
        parameters: &[(&str, &str)],
        read: fn(&[u8]) -> Result<T, String>,
    ) -> anyhow::Result<T> {
        let endpoint = self
            .url
            .join(path)
            .context("the --prometheus URL cannot take a path")?;
        let timeout = format!("{}ms", self.query_timeout.as_millis());
        let mut form = vec![("query", promql), ("timeout", &timeout)];
        form.extend_from_slice(parameters);
        let mut request = client.post(endpoint.clone()).form(&form);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        // The URL may carry a password: messages name it without one, and the HTTP client's
        // errors, which would print it, are shown without it.
        let shown = redacted_url(endpoint.as_str());
        let failed = |what: String| anyhow::anyhow!("{shown}: {what}; the query was: {promql}");
        let response = request.send().await.map_err(|error| {
            if error.is_timeout() {
                failed(format!(
                    "no answer within {} s",
                    self.client_timeout().as_secs()
                ))
            } else {
                failed(format!("cannot reach Prometheus ({})", error.without_url()))
            }
        })?;
        let status = response.status();
        let too_large = || {
            failed(format!(
                "the answer is larger than {} MiB; narrow --selector or collect shorter windows \
                 (--since, --until)",
                MAX_ANSWER_BYTES / (1024 * 1024)
            ))
        };
        if response
            .content_length()
            .is_some_and(|length| length > MAX_ANSWER_BYTES as u64)
        {
            return Err(too_large());
        }
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|error| failed(format!("the answer broke off ({})", error.without_url())))?
        {
            if body.len() + chunk.len() > MAX_ANSWER_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        match read(&body) {
            Ok(samples) if status.is_success() => Ok(samples),
            Ok(_) => Err(failed(format!("answered {status}"))),
            Err(error) if status.is_success() => Err(failed(error)),
            Err(error) => Err(failed(format!("answered {status}: {error}"))),
        }
    }

    /// Prometheus gives up on its own at the query timeout; the client waits a little
    /// longer, for the transfer of its answer.
    fn client_timeout(&self) -> Duration {
        self.query_timeout + self.query_timeout.min(Duration::from_secs(10))
    }

    fn unreadable(&self, error: String) -> anyhow::Error {
        anyhow::anyhow!(
            "{}: an answer cannot be read: {error}",
            redacted_url(self.url.as_str())
        )
    }
}

/// A time as Prometheus' API takes it: Unix seconds, to the millisecond.
fn seconds(at: DateTime<Utc>) -> String {
    format!("{}.{:03}", at.timestamp(), at.timestamp_subsec_millis())
}
