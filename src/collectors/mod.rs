//! Collectors: each reads a scheduler's finished jobs for a time window and hands the job
//! records on, to a taskledger server over HTTP or into the local database. What every
//! collector shares lives here: the window (`--since`/`--until`, else where the `--state`
//! file says the last run stopped), the state file, and delivery with its summary.
//!
//! Windows may overlap: storing is idempotent, so a job seen twice counts as a duplicate.
//! The state only moves forward after a run that delivered everything.

pub mod prometheus;
pub mod slurm;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::PgPool;

use crate::config::Settings;
use crate::domain::access::Actor;
use crate::domain::capacity::parse_intervals;
use crate::domain::record::RecordRules;
use crate::domain::validation::FieldError;
use crate::ledger::capacity::{self, CapacityReceipt};
use crate::ledger::import::{BATCH_SIZE, Rejection};
use crate::ledger::sources::{self, SourceSummary};
use crate::ledger::{LedgerError, zombies};
use crate::sources::batch::SourceBatch;
use crate::sources::slurm::nodes::Open;

/// How far back a first run without `--since` or a state looks.
pub const FIRST_LOOKBACK: TimeDelta = TimeDelta::hours(24);

/// The part of the scheduler's history one run reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub since: DateTime<Utc>,
    pub until: DateTime<Utc>,
}

/// What a run was asked for: explicit bounds win over the state file.
#[derive(Debug, Clone)]
pub struct WindowRequest {
    pub since: Option<DateTime<Utc>>,
    pub until: Option<DateTime<Utc>>,
    /// How far before where the last run stopped the next one starts, for jobs the
    /// scheduler's accounting recorded late.
    pub overlap: TimeDelta,
}

/// Where a collector keeps where it stopped.
#[derive(Debug, Clone)]
pub struct StateFile {
    pub path: PathBuf,
    /// The collector it belongs to (`slurm`), so two collectors never share one file.
    pub collector: &'static str,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Stored {
    collector: String,
    /// Where the last run that delivered everything stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    until: Option<DateTime<Utc>>,
    /// The capacity intervals still open, by node, for collectors that read nodes as
    /// snapshots.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    nodes: BTreeMap<String, Open>,
}

impl StateFile {
    /// What the file holds; a new state when there is no file yet.
    fn load(&self) -> anyhow::Result<Stored> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Stored {
                    collector: self.collector.to_owned(),
                    ..Stored::default()
                });
            }
            Err(error) => {
                return Err(error).with_context(|| format!("cannot read {}", self.path.display()));
            }
        };
        let stored: Stored = serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not a collector state file; remove it or give --since",
                self.path.display()
            )
        })?;
        anyhow::ensure!(
            stored.collector == self.collector,
            "{} belongs to the {} collector, not to {}",
            self.path.display(),
            stored.collector,
            self.collector
        );
        Ok(stored)
    }

    /// Written to a temporary file and renamed, so a crash leaves the old state or the new.
    fn save(&self, stored: &Stored) -> anyhow::Result<()> {
        let temporary = temporary_path(&self.path);
        std::fs::write(&temporary, serde_json::to_vec_pretty(stored)?)
            .with_context(|| format!("cannot write {}", temporary.display()))?;
        std::fs::rename(&temporary, &self.path)
            .with_context(|| format!("cannot replace {}", self.path.display()))
    }

    /// Where the last successful run stopped, if it ever ran.
    pub fn read(&self) -> anyhow::Result<Option<DateTime<Utc>>> {
        Ok(self.load()?.until)
    }

    /// Records that everything up to `until` was delivered; never moves backwards (a backfill
    /// of an older window leaves it as it was).
    pub fn advance(&self, until: DateTime<Utc>) -> anyhow::Result<()> {
        let mut stored = self.load()?;
        if stored.until.is_some_and(|stored| stored >= until) {
            return Ok(());
        }
        stored.until = Some(until);
        self.save(&stored)
    }

    /// The capacity intervals the last run left open.
    pub fn open_nodes(&self) -> anyhow::Result<BTreeMap<String, Open>> {
        Ok(self.load()?.nodes)
    }

    /// Keeps the capacity intervals open after a run that stored them.
    pub fn keep_nodes(&self, nodes: BTreeMap<String, Open>) -> anyhow::Result<()> {
        let mut stored = self.load()?;
        stored.nodes = nodes;
        self.save(&stored)
    }
}

fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// The window of this run: `--since`, else where the state says the last run stopped less the
/// overlap, else [`FIRST_LOOKBACK`] ago; up to `--until`, else now.
pub fn window(
    request: &WindowRequest,
    state: Option<&StateFile>,
    now: DateTime<Utc>,
) -> anyhow::Result<Window> {
    let until = request.until.unwrap_or(now);
    let since = match (
        request.since,
        state.map(StateFile::read).transpose()?.flatten(),
    ) {
        (Some(since), _) => since,
        (None, Some(stopped)) => stopped - request.overlap,
        (None, None) => until - FIRST_LOOKBACK,
    };
    anyhow::ensure!(
        since < until,
        "the window from {since} to {until} is empty: --since must be before --until"
    );
    Ok(Window { since, until })
}

/// Where collected records go.
#[derive(Debug, Clone)]
pub enum Destination {
    /// `POST /v1/job-records` of a taskledger server, with an ingest token.
    Server {
        url: url::Url,
        token: String,
        client: reqwest::Client,
    },
    /// The local database, as `taskledger import` stores.
    Local { pool: PgPool, settings: Settings },
}

/// Hands a batch on: nothing of it when any part is unreadable or invalid; else in requests of
/// [`BATCH_SIZE`] records, each stored whole or not at all.
pub async fn deliver(
    destination: &Destination,
    batch: SourceBatch,
) -> anyhow::Result<SourceSummary> {
    match destination {
        Destination::Local { pool, settings } => sources::store(pool, batch, settings).await,
        Destination::Server { url, token, client } => post(url, token, client, batch).await,
    }
}

async fn post(
    url: &url::Url,
    token: &str,
    client: &reqwest::Client,
    batch: SourceBatch,
) -> anyhow::Result<SourceSummary> {
    let mut summary = SourceSummary::of(&batch);
    // The server checks again, against its own limits; checking here first keeps a batch
    // with an unreadable or invalid job from being half posted.
    let rules = RecordRules {
        now: Utc::now(),
        max_duration: TimeDelta::days(3660),
    };
    if let Err(problems) = sources::validate(&batch, rules) {
        summary.problems = problems;
        return Ok(summary);
    }
    let endpoint = url
        .join("v1/job-records")
        .context("the --server URL cannot take a path")?;
    for chunk in batch.records.chunks(BATCH_SIZE) {
        let body: Vec<&Value> = chunk.iter().map(|r| &r.value).collect();
        let (status, answer) = send(client.post(endpoint.clone()), &endpoint, token, &body).await?;
        if status.is_success() {
            summary.accepted += answer["accepted"].as_u64().unwrap_or(0) as usize;
            summary.duplicates += answer["duplicates"].as_u64().unwrap_or(0) as usize;
            continue;
        }
        anyhow::ensure!(
            status.as_u16() == 409 || status.as_u16() == 422,
            "{endpoint} answered {status}: {}",
            answer["detail"].as_str().unwrap_or("no detail")
        );
        let errors = answer["errors"].as_array().cloned().unwrap_or_default();
        let refused = errors.iter().map(|error| {
            let pointer = error["pointer"].as_str().unwrap_or("");
            let position = pointer
                .trim_start_matches('/')
                .split('/')
                .next()
                .and_then(|p| p.parse::<usize>().ok());
            let location = position
                .and_then(|p| chunk.get(p))
                .map_or_else(|| endpoint.to_string(), |r| r.location.clone());
            Rejection {
                location,
                reason: format!(
                    "{}; nothing of its {} records was stored",
                    error["message"].as_str().unwrap_or("refused"),
                    chunk.len()
                ),
            }
        });
        let before = summary.problems.len();
        summary.problems.extend(refused);
        if summary.problems.len() == before {
            summary.problems.push(Rejection {
                location: endpoint.to_string(),
                reason: answer["detail"].as_str().unwrap_or("refused").to_owned(),
            });
        }
    }
    Ok(summary)
}

/// What became of the capacity a run read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CapacitySummary {
    /// The whole hours read, where capacity is read by the hour.
    pub hours: Option<usize>,
    /// The nodes with GPUs in them.
    pub nodes: BTreeSet<String>,
    pub intervals: usize,
    pub inserted: usize,
    /// Intervals that replaced what was stored under their node and start (an interval
    /// extended run by run).
    pub replaced: usize,
    pub duplicates: usize,
    /// Intervals refused, each with its node and start, or the request refused.
    pub problems: Vec<Rejection>,
}

impl CapacitySummary {
    /// The line the run's summary ends with.
    pub fn render(&self) -> String {
        let hours = self
            .hours
            .map(|hours| format!("hours {hours}, "))
            .unwrap_or_default();
        let replaced = if self.replaced > 0 {
            format!("replaced {}, ", self.replaced)
        } else {
            String::new()
        };
        format!(
            "capacity: {hours}nodes {}, intervals {}: inserted {}, {replaced}duplicates {}\n",
            self.nodes.len(),
            self.intervals,
            self.inserted,
            self.duplicates
        )
    }
}

/// The most intervals one capacity request carries.
const CAPACITY_BATCH: usize = 5_000;

/// Hands on capacity intervals (as `POST /v1/capacity` takes them) in requests of at most
/// [`CAPACITY_BATCH`], each stored whole or not at all; an interval stored before with the
/// same content is a duplicate; with other content it is refused, unless `replace` (`PUT`).
pub async fn deliver_capacity(
    destination: &Destination,
    intervals: Vec<Value>,
    replace: bool,
    summary: &mut CapacitySummary,
) -> anyhow::Result<()> {
    summary.intervals += intervals.len();
    summary.nodes.extend(
        intervals
            .iter()
            .filter_map(|interval| interval["node"].as_str().map(str::to_owned)),
    );
    for chunk in intervals.chunks(CAPACITY_BATCH) {
        let body = Value::Array(chunk.to_vec());
        let outcome = match destination {
            Destination::Local { pool, settings } => {
                store_capacity(pool, settings, &body, replace).await?
            }
            Destination::Server { url, token, client } => {
                post_capacity(url, token, client, &body, replace).await?
            }
        };
        match outcome {
            Ok(receipt) => {
                summary.inserted += receipt.inserted;
                summary.replaced += receipt.replaced;
                summary.duplicates += receipt.duplicates;
            }
            Err(Refused::Fields(errors)) => {
                summary
                    .problems
                    .extend(errors.into_iter().map(|error| Rejection {
                        location: interval_at(chunk, &error.pointer),
                        reason: format!(
                            "{}; nothing of its {} intervals was stored",
                            error.message,
                            chunk.len()
                        ),
                    }));
            }
            Err(Refused::Whole(rejection)) => summary.problems.push(rejection),
        }
    }
    Ok(())
}

/// Why a request of capacity intervals stored nothing.
enum Refused {
    /// Its intervals, each at its pointer.
    Fields(Vec<FieldError>),
    /// The request as a whole.
    Whole(Rejection),
}

/// The node and start of the interval a pointer (`/3/pool`) names.
fn interval_at(chunk: &[Value], pointer: &str) -> String {
    let position = pointer
        .trim_start_matches('/')
        .split('/')
        .next()
        .and_then(|p| p.parse::<usize>().ok());
    position.and_then(|p| chunk.get(p)).map_or_else(
        || "capacity".to_owned(),
        |interval| {
            format!(
                "node {} from {}",
                interval["node"].as_str().unwrap_or("?"),
                interval["from"].as_str().unwrap_or("?")
            )
        },
    )
}

/// Stores one request's intervals in the local database, as `POST` (or `PUT`) /v1/capacity
/// does, and judges their nodes for zombie capacity.
async fn store_capacity(
    pool: &PgPool,
    settings: &Settings,
    body: &Value,
    replace: bool,
) -> anyhow::Result<Result<CapacityReceipt, Refused>> {
    let parsed = match parse_intervals(body, settings.clock.now()) {
        Ok(parsed) => parsed,
        Err(violations) => return Ok(Err(Refused::Fields(violations.into_vec()))),
    };
    let nodes: Vec<String> = parsed.iter().map(|i| i.node.clone()).collect();
    let actor = Actor::system("collector");
    match capacity::post_capacity(pool, parsed, replace, settings.timezone, &actor).await {
        Ok(receipt) => {
            zombies::judge(pool, Some(nodes), settings).await?;
            Ok(Ok(receipt))
        }
        Err(LedgerError::Invalid(errors) | LedgerError::Conflict(_, errors)) => {
            Ok(Err(Refused::Fields(errors)))
        }
        Err(error) => Err(error.into()),
    }
}

/// Posts (or, to replace, puts) one request's intervals to a server's /v1/capacity.
async fn post_capacity(
    url: &url::Url,
    token: &str,
    client: &reqwest::Client,
    body: &Value,
    replace: bool,
) -> anyhow::Result<Result<CapacityReceipt, Refused>> {
    let endpoint = url
        .join("v1/capacity")
        .context("the --server URL cannot take a path")?;
    let request = if replace {
        client.put(endpoint.clone())
    } else {
        client.post(endpoint.clone())
    };
    let (status, answer) = send(request, &endpoint, token, body).await?;
    let count = |field: &str| answer[field].as_u64().unwrap_or(0) as usize;
    if status.is_success() {
        return Ok(Ok(CapacityReceipt {
            inserted: count("inserted"),
            duplicates: count("duplicates"),
            replaced: count("replaced"),
        }));
    }
    let detail = answer["detail"].as_str().unwrap_or("no detail");
    anyhow::ensure!(
        matches!(status.as_u16(), 403 | 409 | 422),
        "{endpoint} answered {status}: {detail}"
    );
    let errors: Vec<FieldError> = answer["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|error| {
            FieldError::new(
                error["pointer"].as_str().unwrap_or(""),
                error["message"].as_str().unwrap_or("refused"),
            )
        })
        .collect();
    Ok(Err(if errors.is_empty() {
        Refused::Whole(Rejection {
            location: endpoint.to_string(),
            reason: format!("{status}: {detail}"),
        })
    } else {
        Refused::Fields(errors)
    }))
}

/// Sends `body` as JSON with the ingest token; answers the status and the JSON answer (null
/// when there is none).
async fn send(
    request: reqwest::RequestBuilder,
    endpoint: &url::Url,
    token: &str,
    body: &impl Serialize,
) -> anyhow::Result<(reqwest::StatusCode, Value)> {
    let response = request
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .with_context(|| format!("cannot reach {endpoint}"))?;
    let status = response.status();
    Ok((status, response.json().await.unwrap_or(Value::Null)))
}

/// Moves the state on to the end of the window when everything of it was delivered.
pub fn remember(
    state: Option<&StateFile>,
    window: Window,
    summary: &SourceSummary,
) -> anyhow::Result<()> {
    if let Some(state) = state
        && !summary.failed()
    {
        state.advance(window.until)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    #[test]
    fn the_window_starts_where_the_state_stopped_less_the_overlap() {
        let dir = tempfile::tempdir().unwrap();
        let state = StateFile {
            path: dir.path().join("slurm.state"),
            collector: "slurm",
        };
        let request = WindowRequest {
            since: None,
            until: None,
            overlap: TimeDelta::minutes(10),
        };
        let now = at("2024-05-24T12:00:00Z");
        assert_eq!(
            window(&request, Some(&state), now).unwrap().since,
            at("2024-05-23T12:00:00Z")
        );
        state.advance(at("2024-05-24T11:00:00Z")).unwrap();
        assert_eq!(
            window(&request, Some(&state), now).unwrap(),
            Window {
                since: at("2024-05-24T10:50:00Z"),
                until: now
            }
        );
        state.advance(at("2024-05-01T00:00:00Z")).unwrap();
        assert_eq!(state.read().unwrap(), Some(at("2024-05-24T11:00:00Z")));
        let other = StateFile {
            path: state.path.clone(),
            collector: "prometheus",
        };
        assert!(other.read().is_err());
        let backwards = WindowRequest {
            since: Some(now),
            until: Some(at("2024-05-01T00:00:00Z")),
            overlap: TimeDelta::zero(),
        };
        assert!(window(&backwards, None, now).is_err());
    }
}
