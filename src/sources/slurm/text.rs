//! `sacct --parsable` / `--parsable2` text: a header line naming the fields (any order, any
//! case, fields we do not need ignored), then one line per allocation or step, split by
//! `--delimiter` (`|` unless changed); `--parsable` also ends every line with it.

use std::collections::BTreeMap;

use chrono_tz::Tz;

use super::job::{SlurmJob, State, parse_elapsed, parse_time};
use super::tres::{self, GpuUsage};
use crate::sources::batch::Problem;

/// The fields an allocation line must have.
pub const REQUIRED_FIELDS: [&str; 5] = ["JobID", "State", "Start", "End", "AllocTRES"];

/// The fields read, which `taskledger collect slurm` asks sacct for.
pub const COLLECTED_FIELDS: [&str; 18] = [
    "JobID",
    "JobName",
    "Account",
    "User",
    "Partition",
    "QOS",
    "Cluster",
    "State",
    "Submit",
    "Eligible",
    "Start",
    "End",
    "Suspended",
    "Restarts",
    "AllocTRES",
    "TRESUsageInMax",
    "NodeList",
    "ConsumedEnergyRaw",
];

/// Fields also read when the header has them, which the collector does not ask for: the
/// rounded form of one it asks for, read only in its absence.
pub const ALSO_READ_FIELDS: [&str; 1] = ["ConsumedEnergy"];

#[derive(Debug, Clone)]
pub struct TextOptions {
    /// The `--delimiter` sacct was given; `None` reads it off the header.
    pub delimiter: Option<String>,
    /// Where times without an offset were printed.
    pub timezone: Tz,
}

#[derive(Debug, Default)]
pub struct TextRead {
    pub jobs: Vec<SlurmJob>,
    pub problems: Vec<Problem>,
    /// Whether the header names an Account field.
    pub has_account: bool,
}

/// Reads sacct's text output named `name`.
pub fn read(name: &str, text: &str, options: &TextOptions) -> TextRead {
    read_lines(
        name,
        text.lines()
            .enumerate()
            .map(|(index, line)| (index + 1, line)),
        options,
    )
}

/// Reads sacct's text output named `name` given as its lines, each with its number: the
/// header first, then any run of lines that holds every step of its allocations.
pub fn read_lines<'a>(
    name: &str,
    lines: impl Iterator<Item = (usize, &'a str)>,
    options: &TextOptions,
) -> TextRead {
    let mut read = TextRead::default();
    let mut lines = lines
        .map(|(number, line)| (number, line.trim_end_matches('\r')))
        .filter(|(_, line)| !line.trim().is_empty());
    let Some((header_line, header)) = lines.next() else {
        read.problems.push(Problem::new(
            name,
            "empty: no header line naming the fields",
        ));
        return read;
    };
    let Some(delimiter) = options.delimiter.clone().or_else(|| delimiter_of(header)) else {
        read.problems.push(Problem::new(
            format!("{name}:{header_line}"),
            "no delimiter between the header's field names",
        ));
        return read;
    };
    let trailing = header.ends_with(delimiter.as_str());
    let fields: Vec<String> = split(header, &delimiter, trailing)
        .map(|f| f.trim().to_ascii_lowercase())
        .collect();
    let column = |field: &str| fields.iter().position(|f| f == &field.to_ascii_lowercase());
    let missing: Vec<&str> = REQUIRED_FIELDS
        .iter()
        .copied()
        .filter(|field| column(field).is_none())
        .collect();
    if !missing.is_empty() {
        read.problems.push(Problem::new(
            format!("{name}:{header_line}"),
            format!(
                "the header has no {} field; sacct needs --format with {}",
                missing.join(", "),
                REQUIRED_FIELDS.join(",")
            ),
        ));
        return read;
    }
    read.has_account = column("Account").is_some();
    let columns: BTreeMap<&str, usize> = COLLECTED_FIELDS
        .into_iter()
        .chain(ALSO_READ_FIELDS)
        .filter_map(|field| column(field).map(|at| (field, at)))
        .collect();
    let mut latest_run: BTreeMap<String, usize> = BTreeMap::new();
    for (number, line) in lines {
        let location = format!("{name}:{number}");
        let values: Vec<&str> = split(line, &delimiter, trailing).collect();
        if values.len() != fields.len() {
            read.problems.push(Problem::new(
                location,
                format!(
                    "{} fields where the header names {}",
                    values.len(),
                    fields.len()
                ),
            ));
            continue;
        }
        let row = Row {
            values: &values,
            columns: &columns,
        };
        let job_id = row.get("JobID").unwrap_or_default();
        if let Some((allocation, step)) = job_id.split_once('.') {
            let usage = row
                .get("TRESUsageInMax")
                .map(tres::usage_of_text)
                .transpose();
            match usage {
                Ok(Some(usage)) => {
                    if let Some(&index) = latest_run.get(allocation) {
                        read.jobs[index].usage.merge(&usage);
                    }
                }
                Ok(None) => {}
                Err(reason) => read.problems.push(Problem::new(
                    location,
                    format!("step {allocation}.{step}: {reason}"),
                )),
            }
            continue;
        }
        match row.job(job_id, location.clone(), options.timezone) {
            Ok(job) => {
                latest_run.insert(job.job_id.clone(), read.jobs.len());
                read.jobs.push(job);
            }
            Err(reason) => read
                .problems
                .push(Problem::new(location, format!("job {job_id}: {reason}"))),
        }
    }
    read
}

/// Where the JobID field is in lines under `header`, and the delimiter and trailing
/// delimiter its lines have; `None` when the header names no JobID.
pub fn job_id_column(header: &str, options: &TextOptions) -> Option<(usize, String, bool)> {
    let header = header.trim_end_matches('\r');
    let delimiter = options.delimiter.clone().or_else(|| delimiter_of(header))?;
    let trailing = header.ends_with(delimiter.as_str());
    let column = split(header, &delimiter, trailing)
        .position(|field| field.trim().eq_ignore_ascii_case("JobID"))?;
    Some((column, delimiter, trailing))
}

/// Whether `line` is a step's (its JobID has a `.`), given [`job_id_column`]'s answer.
pub fn is_step(line: &str, (column, delimiter, trailing): &(usize, String, bool)) -> bool {
    split(line.trim_end_matches('\r'), delimiter, *trailing)
        .nth(*column)
        .is_some_and(|id| id.contains('.'))
}

/// The first run of characters between the header's field names.
fn delimiter_of(header: &str) -> Option<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let start = header.find(|c: char| !is_name(c))?;
    let rest = &header[start..];
    let length = rest.find(is_name).unwrap_or(rest.len());
    Some(rest[..length].to_owned())
}

fn split<'a>(line: &'a str, delimiter: &'a str, trailing: bool) -> impl Iterator<Item = &'a str> {
    let line = if trailing {
        line.strip_suffix(delimiter).unwrap_or(line)
    } else {
        line
    };
    line.split(delimiter)
}

struct Row<'a> {
    values: &'a [&'a str],
    columns: &'a BTreeMap<&'static str, usize>,
}

impl<'a> Row<'a> {
    fn get(&self, field: &str) -> Option<&'a str> {
        self.columns
            .get(field)
            .map(|&at| self.values[at].trim())
            .filter(|value| !value.is_empty())
    }

    fn text(&self, field: &str) -> Option<String> {
        self.get(field).map(str::to_owned)
    }

    fn job(&self, job_id: &str, location: String, tz: Tz) -> Result<SlurmJob, String> {
        if job_id.is_empty() {
            return Err("no JobID".to_owned());
        }
        let time = |field: &str| {
            self.get(field)
                .map_or(Ok(None), |raw| parse_time(raw, tz))
                .map_err(|reason| format!("{field}: {reason}"))
        };
        let state = State::parse(self.get("State").unwrap_or_default())?;
        let suspended_seconds = self
            .get("Suspended")
            .map(|raw| parse_elapsed(raw).map_err(|reason| format!("Suspended: {reason}")))
            .transpose()?;
        let restarts = self
            .get("Restarts")
            .map(|raw| {
                raw.parse::<u32>()
                    .map_err(|_| format!("Restarts `{raw}` is not a count"))
            })
            .transpose()?;
        let usage = self
            .get("TRESUsageInMax")
            .map(tres::usage_of_text)
            .transpose()?
            .unwrap_or_else(GpuUsage::default);
        let energy =
            tres::energy_of_text(self.get("ConsumedEnergyRaw"), self.get("ConsumedEnergy"))?;
        Ok(SlurmJob {
            location,
            job_id: job_id.to_owned(),
            account: self.text("Account"),
            user: self.text("User"),
            partition: self.text("Partition"),
            qos: self.text("QOS"),
            cluster: self.text("Cluster"),
            name: self.text("JobName"),
            state,
            submit: time("Submit")?,
            eligible: time("Eligible")?,
            start: time("Start")?,
            end: time("End")?,
            suspended_seconds,
            restarts,
            gpus: tres::gpus_of_text(self.get("AllocTRES").unwrap_or_default())?,
            usage,
            energy,
            nodes: self.text("NodeList"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::slurm::tres::Energy;

    fn options() -> TextOptions {
        TextOptions {
            delimiter: None,
            timezone: chrono_tz::UTC,
        }
    }

    #[test]
    fn any_delimiter_and_a_trailing_one_are_read_off_the_header() {
        let text = "\
State;;JobID;;AllocTRES;;Start;;End;;Account;;
COMPLETED;;7;;cpu=2,gres/gpu=1;;2024-05-01T10:00:00;;2024-05-01T11:00:00;;ml;;
COMPLETED;;7.batch;;cpu=2,gres/gpu=1;;2024-05-01T10:00:00;;2024-05-01T11:00:00;;ml;;
";
        let read = read("t.txt", text, &options());
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert!(read.has_account);
        assert_eq!(read.jobs.len(), 1, "the step is not an allocation");
        assert_eq!(read.jobs[0].gpus.count(), 1);
    }

    #[test]
    fn steps_lend_their_usage_to_the_run_before_them() {
        let text = "\
JobID|State|Start|End|AllocTRES|TRESUsageInMax
8|REQUEUED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|
8.0|CANCELLED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|gres/gpuutil=40
8|COMPLETED|2024-05-01T12:00:00|2024-05-01T13:00:00|gres/gpu=1|
8.0|COMPLETED|2024-05-01T12:00:00|2024-05-01T13:00:00|gres/gpu=1|gres/gpuutil=90,gres/gpumem=2G
";
        let read = read("t.txt", text, &options());
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        assert_eq!(read.jobs[0].usage.gpu_util, Some(40.into()));
        assert_eq!(read.jobs[1].usage.gpu_util, Some(90.into()));
        assert_eq!(read.jobs[1].usage.memory_bytes, Some((2u64 << 30).into()));
    }

    #[test]
    fn the_allocation_line_gives_the_energy_raw_before_rounded() {
        let text = "\
JobID|State|Start|End|AllocTRES|ConsumedEnergy|ConsumedEnergyRaw
41|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=4|5.40M|5400123
41.batch|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=4|5.40M|5400123
42|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|0|0
43|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1||
";
        let read = read("t.txt", text, &options());
        assert!(read.problems.is_empty(), "{:?}", read.problems);
        let energy: Vec<Energy> = read.jobs.iter().map(|job| job.energy).collect();
        assert_eq!(
            energy,
            vec![
                Energy::Joules(5_400_123.into()),
                Energy::Unmeasured,
                Energy::Unmeasured
            ]
        );
        // Without the raw field the rounded one is read, and said to be rounded.
        let rounded = "\
JobID|State|Start|End|AllocTRES|ConsumedEnergy
44|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|1.20K
45|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|950
46|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|lots
";
        let read = super::read("t.txt", rounded, &options());
        assert_eq!(read.jobs[0].energy, Energy::Rounded);
        assert_eq!(read.jobs[1].energy, Energy::Joules(950.into()));
        assert_eq!(read.problems.len(), 1);
        assert!(read.problems[0].reason.contains("ConsumedEnergy `lots`"));
        assert!(COLLECTED_FIELDS.contains(&"ConsumedEnergyRaw"));
    }

    #[test]
    fn bad_lines_are_reported_by_line() {
        let text = "\
JobID|State|Start|End|AllocTRES

1|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00
2|EXPLODED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1
3|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=x
4|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1
";
        let read = read("t.txt", text, &options());
        assert_eq!(read.jobs.len(), 1);
        let at: Vec<&str> = read.problems.iter().map(|p| p.location.as_str()).collect();
        assert_eq!(at, vec!["t.txt:3", "t.txt:4", "t.txt:5"]);
        assert!(
            read.problems[0]
                .reason
                .contains("4 fields where the header names 5")
        );
        assert!(read.problems[1].reason.contains("unknown job state"));
        assert!(read.problems[2].reason.contains("gres/gpu=x"));
        assert!(!read.has_account);
    }

    #[test]
    fn a_header_without_the_needed_fields_is_refused() {
        let read = read("t.txt", "JobID|State\n1|COMPLETED\n", &options());
        assert!(read.jobs.is_empty());
        assert!(read.problems[0].reason.contains("Start, End, AllocTRES"));
    }
}
