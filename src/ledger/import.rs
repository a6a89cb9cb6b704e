//! `taskledger import FILE...`: job records from JSON (an array), NDJSON or CSV files,
//! streamed in batches through the same validation and storage as the HTTP endpoint. Invalid
//! or conflicting records are reported with where they came from; the rest are stored.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde_json::{Map, Value};
use sqlx::PgPool;
use tokio::sync::mpsc;

use crate::config::Settings;
use crate::domain::record::JobRecord;
use crate::ledger::ingest::{self, IngestError, Submitted};
use crate::store;

/// Records stored per transaction.
pub const BATCH_SIZE: usize = 1_000;

/// A record as read from a file, with where it came from.
#[derive(Debug)]
struct SourceRecord {
    location: String,
    /// The record, or why it could not even be read as one.
    value: Result<Value, String>,
}

/// Why one record was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub location: String,
    pub reason: String,
}

#[derive(Debug, Default)]
pub struct Summary {
    pub accepted: usize,
    pub duplicates: usize,
    pub rejected: Vec<Rejection>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    JsonArray,
    Ndjson,
    Csv,
}

impl Format {
    fn of(path: &Path) -> anyhow::Result<Self> {
        let extension = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match extension.as_deref() {
            Some("json") => Ok(Format::JsonArray),
            Some("ndjson" | "jsonl") => Ok(Format::Ndjson),
            Some("csv") => Ok(Format::Csv),
            _ => anyhow::bail!(
                "{}: unknown format; name files *.json (an array), *.ndjson/*.jsonl or *.csv",
                path.display()
            ),
        }
    }
}

/// Imports every file in turn and returns what happened to each record.
pub async fn import_files(
    pool: &PgPool,
    files: &[PathBuf],
    settings: &Settings,
) -> anyhow::Result<Summary> {
    for file in files {
        Format::of(file)?;
        anyhow::ensure!(file.is_file(), "{}: no such file", file.display());
    }
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} {msg} {pos} records ({per_sec})")
            .expect("a valid progress template"),
    );
    let mut summary = Summary::default();
    for file in files {
        progress.set_message(file.display().to_string());
        let (sender, mut receiver) = mpsc::channel::<Vec<SourceRecord>>(4);
        let path = file.clone();
        let reader = tokio::task::spawn_blocking(move || read_file(&path, &sender));
        while let Some(batch) = receiver.recv().await {
            let size = batch.len() as u64;
            store_batch(pool, batch, settings, &mut summary).await?;
            progress.inc(size);
        }
        reader.await.context("the file reader stopped")??;
    }
    progress.finish_and_clear();
    // Fold the rollup rows the import appended, in case no `serve` is running to do it.
    store::rollups::compact(pool).await?;
    Ok(summary)
}

async fn store_batch(
    pool: &PgPool,
    batch: Vec<SourceRecord>,
    settings: &Settings,
    summary: &mut Summary,
) -> anyhow::Result<()> {
    let rules = settings.record_rules();
    let mut valid = Vec::with_capacity(batch.len());
    let mut locations = Vec::with_capacity(batch.len());
    for source in batch {
        let value = match source.value {
            Ok(value) => value,
            Err(reason) => {
                summary.rejected.push(Rejection {
                    location: source.location,
                    reason,
                });
                continue;
            }
        };
        match JobRecord::parse(&value, "", rules) {
            Ok(record) => {
                valid.push(Submitted {
                    position: locations.len(),
                    record,
                });
                locations.push(source.location);
            }
            Err(violations) => summary
                .rejected
                .extend(violations.into_vec().into_iter().map(|error| Rejection {
                    location: source.location.clone(),
                    reason: format!("{}: {}", pointer_or_record(&error.pointer), error.message),
                })),
        }
    }
    let unknown = ingest::unknown_projects(pool, &valid).await?;
    valid.retain(|s| {
        let known = !unknown.contains(&s.position);
        if !known {
            summary.rejected.push(Rejection {
                location: locations[s.position].clone(),
                reason: format!("project: project `{}` does not exist", s.record.key.project),
            });
        }
        known
    });
    // Conflicting records are reported and left out, and the rest of the batch is stored.
    loop {
        match ingest::store_batch(pool, valid.clone(), settings).await {
            Ok(stored) => {
                summary.accepted += stored.accepted;
                summary.duplicates += stored.duplicates;
                return Ok(());
            }
            Err(IngestError::Conflicts(conflicts)) => {
                let positions: BTreeSet<usize> = conflicts.iter().map(|c| c.position).collect();
                for conflict in &conflicts {
                    summary.rejected.push(Rejection {
                        location: locations[conflict.position].clone(),
                        reason: conflict.message(),
                    });
                }
                valid.retain(|s| !positions.contains(&s.position));
            }
            Err(IngestError::Database(error)) => return Err(error.into()),
            Err(IngestError::Rating(error) | IngestError::IdleGpuAlerts(error)) => {
                return Err(error);
            }
        }
    }
}

fn pointer_or_record(pointer: &str) -> &str {
    match pointer.strip_prefix('/') {
        Some("") | None => "record",
        Some(field) => field,
    }
}

/// Reads a file and hands its records on in batches; runs on a blocking thread.
fn read_file(path: &Path, sender: &mpsc::Sender<Vec<SourceRecord>>) -> anyhow::Result<()> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let reader = BufReader::with_capacity(1 << 20, file);
    let name = path.display().to_string();
    let mut batcher = Batcher {
        sender,
        batch: Vec::with_capacity(BATCH_SIZE),
    };
    match Format::of(path)? {
        Format::Ndjson => read_ndjson(reader, &name, &mut batcher)?,
        Format::Csv => read_csv(reader, &name, &mut batcher)?,
        Format::JsonArray => {
            let mut deserializer = serde_json::Deserializer::from_reader(reader);
            ArrayReader {
                name: &name,
                batcher: &mut batcher,
            }
            .deserialize(&mut deserializer)
            .with_context(|| format!("{name}: not a JSON array of records"))?;
            deserializer
                .end()
                .with_context(|| format!("{name}: trailing data after the array"))?;
        }
    }
    batcher.flush()
}

struct Batcher<'a> {
    sender: &'a mpsc::Sender<Vec<SourceRecord>>,
    batch: Vec<SourceRecord>,
}

impl Batcher<'_> {
    fn push(&mut self, location: String, value: Result<Value, String>) -> anyhow::Result<()> {
        self.batch.push(SourceRecord { location, value });
        if self.batch.len() >= BATCH_SIZE {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH_SIZE));
        self.sender
            .blocking_send(batch)
            .map_err(|_| anyhow::anyhow!("the importer stopped reading"))
    }
}

fn read_ndjson(reader: impl BufRead, name: &str, batcher: &mut Batcher) -> anyhow::Result<()> {
    for (index, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("{name}: cannot read line {}", index + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let location = format!("{name}:{}", index + 1);
        let value = serde_json::from_str::<Value>(&line)
            .map_err(|error| format!("not valid JSON: {error}"));
        batcher.push(location, value)?;
    }
    Ok(())
}

/// A CSV row becomes a record object: columns named as the record's fields, `label.<key>`
/// for labels and `output.quantity` / `output.unit` for the output; empty cells are absent.
fn read_csv(reader: impl std::io::Read, name: &str, batcher: &mut Batcher) -> anyhow::Result<()> {
    let mut csv = csv::ReaderBuilder::new()
        .flexible(false)
        .from_reader(reader);
    let headers = csv
        .headers()
        .with_context(|| format!("{name}: cannot read the CSV header"))?
        .clone();
    for row in csv.records() {
        match row {
            Ok(row) => {
                let line = row.position().map(|p| p.line()).unwrap_or(0);
                batcher.push(
                    format!("{name}:{line}"),
                    Ok(csv_row_to_json(&headers, &row)),
                )?;
            }
            Err(error) => {
                let line = error.position().map(|p| p.line()).unwrap_or(0);
                if !matches!(error.kind(), csv::ErrorKind::UnequalLengths { .. }) {
                    return Err(error).with_context(|| format!("{name}:{line}: unreadable CSV"));
                }
                batcher.push(
                    format!("{name}:{line}"),
                    Err(format!("malformed CSV row: {error}")),
                )?;
            }
        }
    }
    Ok(())
}

fn csv_row_to_json(headers: &csv::StringRecord, row: &csv::StringRecord) -> Value {
    let mut object = Map::new();
    let mut labels = Map::new();
    let mut output = Map::new();
    for (header, cell) in headers.iter().zip(row.iter()) {
        if cell.is_empty() {
            continue;
        }
        let cell = Value::String(cell.to_owned());
        if let Some(key) = header.strip_prefix("label.") {
            labels.insert(key.to_owned(), cell);
        } else if let Some(field) = header.strip_prefix("output.") {
            output.insert(field.to_owned(), cell);
        } else {
            object.insert(header.to_owned(), cell);
        }
    }
    if !labels.is_empty() {
        object.insert("labels".to_owned(), Value::Object(labels));
    }
    if !output.is_empty() {
        object.insert("output".to_owned(), Value::Object(output));
    }
    Value::Object(object)
}

/// Walks a JSON array element by element, so a large file never sits in memory whole.
struct ArrayReader<'a, 'b> {
    name: &'a str,
    batcher: &'a mut Batcher<'b>,
}

impl<'de> DeserializeSeed<'de> for ArrayReader<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ArrayReader<'_, '_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON array of job records")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        while let Some(value) = seq.next_element::<Value>()? {
            self.batcher
                .push(format!("{}[{index}]", self.name), Ok(value))
                .map_err(serde::de::Error::custom)?;
            index += 1;
        }
        Ok(())
    }
}
