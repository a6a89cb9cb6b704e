//! `taskledger collect slurm`: runs `sacct` for the window with the fields the mapping needs
//! and converts its jobs as `taskledger import --format sacct` does.
//!
//! sacct runs with `TZ=UTC`, so its times need no time zone to be read, and with
//! `--noconvert`, so sizes come in bytes rather than rounded to K/M/G. `--duplicates` lists a
//! requeued job's earlier runs (its earlier attempts), `--array` one line per array task, and
//! no `--allocations`: the step lines carry the GPU usage. The delimiter is ASCII's unit
//! separator, which job names do not contain.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;

use anyhow::Context;
use chrono::{DateTime, Utc};
use serde_json::Value;

use super::Window;
use crate::domain::record::format_time;
use crate::sources::batch::SourceBatch;
use crate::sources::slurm::nodes::{NodeMapping, Open};
use crate::sources::slurm::text::{COLLECTED_FIELDS, TextOptions};
use crate::sources::slurm::{self, Format, Mapping};

/// Between the fields of sacct's lines.
pub const DELIMITER: &str = "\u{1f}";

#[derive(Debug, Clone)]
pub struct SlurmCollector {
    /// The sacct to run; a bare name is looked up on `PATH`.
    pub sacct: PathBuf,
    /// More sacct arguments, e.g. `--clusters=a,b`.
    pub extra_arguments: Vec<String>,
    pub mapping: Mapping,
    /// How the nodes are read as capacity; `None`: they are not.
    pub nodes: Option<SlurmNodes>,
}

/// Where the nodes are listed, and how they become capacity.
#[derive(Debug, Clone)]
pub struct SlurmNodes {
    /// The command printing the nodes as JSON (`scontrol`, or `sinfo`).
    pub command: PathBuf,
    /// Its arguments: `show nodes --json` (or `--json` for sinfo).
    pub arguments: Vec<String>,
    pub mapping: NodeMapping,
}

/// What one snapshot of the nodes gives.
#[derive(Debug, Clone, Default)]
pub struct NodesRead {
    /// The intervals to store (replacing those stored under their node and start).
    pub store: Vec<Value>,
    /// The intervals open after it, for the next run.
    pub open: BTreeMap<String, Open>,
    /// The nodes with GPUs the snapshot listed.
    pub nodes: BTreeSet<String>,
}

impl SlurmCollector {
    /// sacct's arguments for a window (times in UTC, as sacct reads them with `TZ=UTC`).
    pub fn arguments(&self, window: Window) -> Vec<String> {
        let time = |at: chrono::DateTime<chrono::Utc>| at.format("%Y-%m-%dT%H:%M:%S").to_string();
        let mut arguments: Vec<String> = [
            "--allusers",
            "--duplicates",
            "--array",
            "--parsable2",
            "--noconvert",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        arguments.push(format!("--delimiter={DELIMITER}"));
        arguments.push(format!("--format={}", COLLECTED_FIELDS.join(",")));
        arguments.push(format!("--starttime={}", time(window.since)));
        arguments.push(format!("--endtime={}", time(window.until)));
        arguments.extend(self.extra_arguments.iter().cloned());
        arguments
    }

    /// Runs sacct for the window and converts what it printed; sacct failing is an error
    /// with what it said.
    pub async fn read(&self, window: Window) -> anyhow::Result<SourceBatch> {
        let output = tokio::process::Command::new(&self.sacct)
            .args(self.arguments(window))
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("cannot run {}", self.sacct.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "{} failed ({}): {}",
            self.sacct.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let text = String::from_utf8(output.stdout)
            .with_context(|| format!("{} printed text that is not UTF-8", self.sacct.display()))?;
        let format = Format::Text(TextOptions {
            delimiter: Some(DELIMITER.to_owned()),
            timezone: chrono_tz::UTC,
        });
        let name = format!(
            "sacct {}..{}",
            format_time(window.since),
            format_time(window.until)
        );
        Ok(slurm::batch(&format, &name, &text, &self.mapping))
    }

    /// Takes a snapshot of the nodes and carries the open intervals on to it: taken when
    /// Slurm says (`last_update`), else `now`.
    pub async fn read_nodes(
        &self,
        nodes: &SlurmNodes,
        open: &BTreeMap<String, Open>,
        now: DateTime<Utc>,
    ) -> anyhow::Result<NodesRead> {
        let shown = nodes.command.display();
        let output = tokio::process::Command::new(&nodes.command)
            .args(&nodes.arguments)
            .env("TZ", "UTC")
            .stdin(Stdio::null())
            .output()
            .await
            .with_context(|| format!("cannot run {shown}"))?;
        anyhow::ensure!(
            output.status.success(),
            "{shown} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
        let text = String::from_utf8(output.stdout)
            .with_context(|| format!("{shown} printed text that is not UTF-8"))?;
        let snapshot = slurm::nodes::read_snapshot(&text)
            .map_err(|error| anyhow::anyhow!("{shown} {}: {error}", nodes.arguments.join(" ")))?;
        let at = snapshot.taken_at.unwrap_or(now);
        let (store, open) =
            slurm::nodes::advance(open, &snapshot.nodes, at, &self.mapping, &nodes.mapping);
        let listed = snapshot
            .nodes
            .iter()
            .filter(|node| slurm::nodes::describe(node, &self.mapping).is_some())
            .map(|node| node.name.clone())
            .collect();
        Ok(NodesRead {
            store,
            open,
            nodes: listed,
        })
    }
}
