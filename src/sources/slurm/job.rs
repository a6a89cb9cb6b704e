//! One allocation as sacct reported it, and how its states and times read.

use chrono::{DateTime, NaiveDateTime, TimeZone, Utc};

use super::tres::{Energy, GpuTres, GpuUsage};
use crate::domain::rating::Outcome;

/// One job allocation as sacct reported it: an array task or a heterogeneous component is an
/// allocation of its own; the usage of its steps is folded into it.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmJob {
    /// Where it was read: `file:12` or `file: job 4711`.
    pub location: String,
    /// `4711`, `4711_3` (array task) or `4711+1` (heterogeneous component).
    pub job_id: String,
    pub account: Option<String>,
    pub user: Option<String>,
    pub partition: Option<String>,
    pub qos: Option<String>,
    pub cluster: Option<String>,
    pub name: Option<String>,
    pub state: State,
    pub submit: Option<DateTime<Utc>>,
    pub eligible: Option<DateTime<Utc>>,
    pub start: Option<DateTime<Utc>>,
    pub end: Option<DateTime<Utc>>,
    /// Seconds it was suspended between Start and End.
    pub suspended_seconds: Option<i64>,
    /// How often it had been requeued when this run started.
    pub restarts: Option<u32>,
    pub gpus: GpuTres,
    /// The highest usage any of its steps measured.
    pub usage: GpuUsage,
    /// The energy Slurm accounted to the allocation: the sum its energy plugin measured over
    /// the steps, on all of the allocation's nodes.
    pub energy: Energy,
    /// The nodes it ran on, as Slurm's host list (`NodeList`, `gpu[01-04]`).
    pub nodes: Option<String>,
}

/// A job state, reduced to what the ledger needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Finished(Outcome),
    /// Pending, running, suspended or on its way to one of them.
    NotFinished,
}

impl State {
    /// A state as sacct names it (`CANCELLED by 1234` is `CANCELLED`); an unknown name is
    /// an error.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let name = raw
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('+');
        let state = match name {
            "COMPLETED" | "CD" => State::Finished(Outcome::Completed),
            "FAILED" | "F" | "NODE_FAIL" | "NF" | "OUT_OF_MEMORY" | "OOM" | "TIMEOUT" | "TO"
            | "BOOT_FAIL" | "BF" | "DEADLINE" | "DL" => State::Finished(Outcome::Failed),
            "CANCELLED" | "CA" => State::Finished(Outcome::Cancelled),
            "PREEMPTED" | "PR" | "REQUEUED" | "RQ" => State::Finished(Outcome::Preempted),
            "PENDING" | "PD" | "RUNNING" | "R" | "SUSPENDED" | "S" | "COMPLETING" | "CG"
            | "CONFIGURING" | "CF" | "RESIZING" | "RS" | "REQUEUE_HOLD" | "REQUEUE_FED"
            | "SIGNALING" | "STAGE_OUT" | "SO" | "STOPPED" | "ST" | "RESV_DEL_HOLD"
            | "POWER_UP_NODE" => State::NotFinished,
            _ => return Err(format!("unknown job state `{raw}`")),
        };
        Ok(state)
    }

    /// A state list of data_parser v0.0.40 and later: a base state and flags. A requeued run
    /// carries REQUEUED beside its base state and counts as preempted, as it did for the
    /// scheduler; flags that are no state of their own are ignored.
    pub fn parse_list(names: &[String]) -> Result<Self, String> {
        if names.iter().any(|name| name == "REQUEUED") {
            return Ok(State::Finished(Outcome::Preempted));
        }
        let mut unknown = None;
        for name in names {
            match State::parse(name) {
                Ok(State::Finished(outcome)) => return Ok(State::Finished(outcome)),
                Ok(State::NotFinished) => return Ok(State::NotFinished),
                Err(error) => unknown = unknown.or(Some(error)),
            }
        }
        Err(unknown.unwrap_or_else(|| "no job state".to_owned()))
    }
}

/// A time as sacct prints it: `Unknown`, `None` and empty are no time; a time without an
/// offset is local time of `tz` (an ambiguous or skipped local time is an error).
pub fn parse_time(raw: &str, tz: chrono_tz::Tz) -> Result<Option<DateTime<Utc>>, String> {
    let raw = raw.trim();
    if raw.is_empty() || matches!(raw, "Unknown" | "None" | "N/A") {
        return Ok(None);
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(raw) {
        return Ok(Some(at.with_timezone(&Utc)));
    }
    let local = NaiveDateTime::parse_from_str(raw, "%Y-%m-%dT%H:%M:%S")
        .map_err(|_| format!("`{raw}` is not a time of the form YYYY-MM-DDTHH:MM:SS"))?;
    match tz.from_local_datetime(&local) {
        chrono::LocalResult::Single(at) => Ok(Some(at.with_timezone(&Utc))),
        _ => Err(format!(
            "`{raw}` is ambiguous or does not exist in {}: run sacct with TZ=UTC",
            tz.name()
        )),
    }
}

/// `[DD-[HH:]]MM:SS` as sacct prints Elapsed, in seconds.
pub fn parse_elapsed(raw: &str) -> Result<i64, String> {
    let error = || format!("`{raw}` is not an elapsed time [DD-[HH:]]MM:SS");
    let (days, clock) = match raw.split_once('-') {
        Some((days, clock)) => (days.parse::<i64>().map_err(|_| error())?, clock),
        None => (0, raw),
    };
    let clock = clock.split('.').next().unwrap_or(clock);
    let parts: Vec<i64> = clock
        .split(':')
        .map(|p| p.parse::<i64>().map_err(|_| error()))
        .collect::<Result<_, _>>()?;
    let (hours, minutes, seconds) = match parts.as_slice() {
        [m, s] => (0, *m, *s),
        [h, m, s] => (*h, *m, *s),
        _ => return Err(error()),
    };
    Ok(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(raw: &str) -> DateTime<Utc> {
        raw.parse().unwrap()
    }

    #[test]
    fn states_map_as_documented() {
        let outcome = |raw: &str| match State::parse(raw).unwrap() {
            State::Finished(outcome) => Some(outcome.as_str()),
            State::NotFinished => None,
        };
        assert_eq!(outcome("COMPLETED"), Some("completed"));
        for failed in [
            "FAILED",
            "NODE_FAIL",
            "OUT_OF_MEMORY",
            "TIMEOUT",
            "BOOT_FAIL",
            "DEADLINE",
        ] {
            assert_eq!(outcome(failed), Some("failed"), "{failed}");
        }
        assert_eq!(outcome("CANCELLED by 1234"), Some("cancelled"));
        assert_eq!(outcome("PREEMPTED"), Some("preempted"));
        assert_eq!(outcome("REQUEUED"), Some("preempted"));
        for open in ["PENDING", "RUNNING", "SUSPENDED"] {
            assert_eq!(outcome(open), None, "{open}");
        }
        assert!(State::parse("EXPLODED").unwrap_err().contains("EXPLODED"));
        let list = |names: &[&str]| {
            State::parse_list(&names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(
            list(&["FAILED", "REQUEUED"]).unwrap(),
            State::Finished(Outcome::Preempted)
        );
        assert_eq!(list(&["RUNNING"]).unwrap(), State::NotFinished);
    }

    #[test]
    fn times_and_elapsed_read_as_sacct_prints_them() {
        let berlin: chrono_tz::Tz = "Europe/Berlin".parse().unwrap();
        assert_eq!(
            parse_time("2024-05-01T12:00:00", berlin).unwrap(),
            Some(utc("2024-05-01T10:00:00Z"))
        );
        assert_eq!(parse_time("Unknown", berlin).unwrap(), None);
        assert!(
            parse_time("2024-10-27T02:30:00", berlin)
                .unwrap_err()
                .contains("ambiguous")
        );
        assert_eq!(parse_elapsed("1-02:03:04").unwrap(), 93_784);
        assert_eq!(parse_elapsed("02:03:04").unwrap(), 7_384);
        assert_eq!(parse_elapsed("03:04").unwrap(), 184);
        assert!(parse_elapsed("soon").is_err());
    }
}
