//! `taskledger import --format sacct`: sacct's text output read in runs of lines, twice —
//! once to check every job and number each job's runs across its whole file, once to store
//! — so that memory holds one run of lines and a few words per job, not the file. Nothing
//! is stored when a line of any file cannot be read, a job makes an invalid record, or a
//! record names a project that does not exist.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Seek};
use std::path::PathBuf;

use anyhow::Context;
use sqlx::PgPool;

use crate::config::Settings;
use crate::ledger::import::Rejection;
use crate::ledger::ingest::Submitted;
use crate::ledger::sources::{SourceSummary, store_checked, validate};
use crate::sources::batch::{Problem, SourceBatch};
use crate::sources::slurm::text::{self, TextOptions, is_step, job_id_column};
use crate::sources::slurm::{Mapping, Run, SlurmJob, attempts_of, convert, convert_as};
use crate::store;

/// Allocations read at once.
pub const JOBS_PER_RUN: usize = 10_000;

/// One sacct output: a file, or standard input spooled to a temporary file.
pub struct Input {
    pub name: String,
    source: Source,
}

enum Source {
    Path(PathBuf),
    Spooled(File),
}

impl Input {
    pub fn file(path: PathBuf) -> Self {
        Self {
            name: path.display().to_string(),
            source: Source::Path(path),
        }
    }

    /// Standard input, copied to a temporary file so that it can be read twice.
    pub fn stdin() -> anyhow::Result<Self> {
        let mut spool = tempfile::tempfile().context("cannot spool standard input")?;
        std::io::copy(&mut std::io::stdin().lock(), &mut spool)
            .context("cannot read standard input")?;
        Ok(Self {
            name: "stdin".to_owned(),
            source: Source::Spooled(spool),
        })
    }

    fn open(&self) -> anyhow::Result<Box<dyn BufRead + Send>> {
        let file = match &self.source {
            Source::Path(path) => {
                File::open(path).with_context(|| format!("cannot read {}", path.display()))?
            }
            Source::Spooled(file) => {
                let mut file = file.try_clone().context("cannot reopen standard input")?;
                file.rewind().context("cannot reopen standard input")?;
                file
            }
        };
        Ok(Box::new(BufReader::with_capacity(1 << 20, file)))
    }
}

/// The lines of one output in runs: its header, then at most `jobs` allocations each with
/// the steps that follow it.
struct Runs {
    reader: Box<dyn BufRead + Send>,
    name: String,
    number: usize,
    header: Option<(usize, String)>,
    column: Option<(usize, String, bool)>,
    carried: Option<(usize, String)>,
    started: bool,
    header_location: Option<String>,
}

impl Runs {
    fn new(input: &Input) -> anyhow::Result<Self> {
        Ok(Self {
            reader: input.open()?,
            name: input.name.clone(),
            number: 0,
            header: None,
            column: None,
            carried: None,
            started: false,
            header_location: None,
        })
    }

    /// Where the header is, as a problem's location names it.
    fn header_at(&self) -> Option<&String> {
        self.header_location.as_ref()
    }

    fn line(&mut self) -> anyhow::Result<Option<(usize, String)>> {
        if let Some(carried) = self.carried.take() {
            return Ok(Some(carried));
        }
        let mut line = String::new();
        let read = self
            .reader
            .read_line(&mut line)
            .with_context(|| format!("cannot read {}", self.name))?;
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        if line.ends_with('\n') {
            line.pop();
        }
        Ok(Some((self.number, line)))
    }

    /// The next run read as sacct's text; the first is returned even when empty, so that a
    /// missing or bad header is reported.
    fn next(&mut self, options: &TextOptions) -> anyhow::Result<Option<text::TextRead>> {
        while self.header.is_none() {
            match self.line()? {
                Some((_, line)) if line.trim().is_empty() => {}
                Some(header) => {
                    self.column = job_id_column(&header.1, options);
                    self.header_location = Some(format!("{}:{}", self.name, header.0));
                    self.header = Some(header);
                }
                None => break,
            }
        }
        let mut lines = Vec::new();
        let mut allocations = 0;
        while let Some((number, line)) = self.line()? {
            if line.trim().is_empty() {
                continue;
            }
            let step = self.column.as_ref().is_some_and(|c| is_step(&line, c));
            if !step {
                if allocations == JOBS_PER_RUN {
                    self.carried = Some((number, line));
                    break;
                }
                allocations += 1;
            }
            lines.push((number, line));
        }
        if lines.is_empty() && self.started {
            return Ok(None);
        }
        self.started = true;
        let header = self.header.iter().map(|(n, l)| (*n, l.as_str()));
        let body = lines.iter().map(|(n, l)| (*n, l.as_str()));
        Ok(Some(text::read_lines(
            &self.name,
            header.chain(body),
            options,
        )))
    }
}

/// The runs of one job seen so far.
enum JobRuns {
    One(Run),
    Several(Vec<Run>),
}

/// Each job's attempt, by its position in its output, where the job ran more than once.
type Attempts = HashMap<usize, u32>;

/// The attempt of a job run only once.
fn single_attempt(job: &SlurmJob) -> u32 {
    attempts_of(vec![Run::of(job, 0)])[0].1
}

/// Imports sacct's text `inputs`: every job is checked first; then, when nothing is wrong,
/// the records are stored in batches (see [`store_checked`]).
pub async fn import(
    pool: &PgPool,
    inputs: &[Input],
    options: &TextOptions,
    mapping: &Mapping,
    settings: &Settings,
) -> anyhow::Result<SourceSummary> {
    let rules = settings.record_rules();
    let mut summary = SourceSummary::default();
    // Each project named, with the first record naming it.
    let mut projects: BTreeMap<String, (String, String)> = BTreeMap::new();
    let mut attempts: Vec<Attempts> = Vec::with_capacity(inputs.len());
    for input in inputs {
        let mut runs = Runs::new(input)?;
        let mut seen: HashMap<Box<str>, JobRuns> = HashMap::new();
        let mut position = 0;
        while let Some(read) = runs.next(options)? {
            let header_problem = read.jobs.is_empty()
                && read
                    .problems
                    .iter()
                    .any(|p| p.location == input.name || Some(&p.location) == runs.header_at());
            summary.problems.extend(read.problems.iter().map(rejection));
            if !read.has_account && mapping.project.is_none() && !read.jobs.is_empty() {
                summary.problems.push(rejection(&Problem::new(
                    input.name.as_str(),
                    "the output has no Account field: give --project",
                )));
                break;
            }
            for job in &read.jobs {
                let run = Run::of(job, position);
                position += 1;
                match seen.get_mut(job.job_id.as_str()) {
                    Some(JobRuns::One(first)) => {
                        let first = *first;
                        seen.insert(
                            job.job_id.as_str().into(),
                            JobRuns::Several(vec![first, run]),
                        );
                    }
                    Some(JobRuns::Several(all)) => all.push(run),
                    None => {
                        seen.insert(job.job_id.as_str().into(), JobRuns::One(run));
                    }
                }
            }
            let batch = convert(read.jobs, mapping);
            count(&mut summary, &batch);
            match validate(&batch, rules) {
                Ok(valid) => {
                    for (location, record) in valid {
                        projects
                            .entry(record.key.project)
                            .or_insert((location, record.key.task_id));
                    }
                }
                Err(problems) => summary.problems.extend(problems),
            }
            if header_problem {
                break;
            }
        }
        attempts.push(
            seen.into_values()
                .filter_map(|runs| match runs {
                    JobRuns::Several(all) => Some(attempts_of(all)),
                    JobRuns::One(_) => None,
                })
                .flatten()
                .collect(),
        );
    }
    if !summary.problems.is_empty() {
        return Ok(summary);
    }
    let ids: Vec<String> = projects.keys().cloned().collect();
    let known = store::projects::existing_ids(pool, &ids).await?;
    summary.problems = projects
        .into_iter()
        .filter(|(project, _)| !known.contains(project))
        .map(|(project, (location, task))| Rejection {
            location,
            reason: format!(
                "job {task}: project `{project}` does not exist; create it or map the account \
                 with --project-map"
            ),
        })
        .collect();
    if !summary.problems.is_empty() {
        return Ok(summary);
    }
    for (input, attempts) in inputs.iter().zip(&attempts) {
        let mut runs = Runs::new(input)?;
        let mut position = 0;
        while let Some(read) = runs.next(options)? {
            let numbers: Vec<u32> = read
                .jobs
                .iter()
                .map(|job| {
                    let attempt = attempts
                        .get(&position)
                        .copied()
                        .unwrap_or_else(|| single_attempt(job));
                    position += 1;
                    attempt
                })
                .collect();
            let batch = convert_as(read.jobs, &numbers, mapping);
            let valid = match validate(&batch, rules) {
                Ok(valid) => valid,
                Err(problems) => {
                    summary.problems.extend(problems);
                    continue;
                }
            };
            let submitted: Vec<Submitted> = valid
                .iter()
                .enumerate()
                .map(|(position, (_, record))| Submitted {
                    position,
                    record: record.clone(),
                })
                .collect();
            store_checked(pool, &valid, &submitted, settings, &mut summary).await?;
        }
    }
    // Fold the rollup rows the import appended, in case no `serve` is running to do it.
    store::rollups::compact(pool).await?;
    Ok(summary)
}

fn rejection(problem: &Problem) -> Rejection {
    Rejection {
        location: problem.location.clone(),
        reason: problem.reason.clone(),
    }
}

/// Adds a converted run's counts to the summary.
fn count(summary: &mut SourceSummary, batch: &SourceBatch) {
    let counted = SourceSummary::of(batch);
    summary.jobs_read += counted.jobs_read;
    summary.records += counted.records;
    for (reason, n) in counted.skipped {
        *summary.skipped.entry(reason).or_default() += n;
    }
    for (left_out, n) in counted.left_out {
        *summary.left_out.entry(left_out).or_default() += n;
    }
}
