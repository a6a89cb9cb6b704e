//! `sacct --json`, data_parser v0.0.37 (Slurm 21.08) to v0.0.43 (Slurm 24.11 and 25.05). The
//! shapes that changed are read both ways: `state.current` a string, later a list; numbers
//! plain, later `{set, infinite, number}`; TRES names `null`, later `""`; array task and
//! heterogeneous offsets `null` or unset when the job is neither.

use chrono::{DateTime, TimeZone, Utc};
use serde_json::Value;

use super::job::{SlurmJob, State};
use super::tres::{self, Energy, GpuTres, GpuUsage};
use crate::domain::validation::repeated_key;
use crate::sources::batch::Problem;

/// Reads a whole `sacct --json` document named `name`; the jobs it could read, and a problem
/// for each it could not (or one for the document when it is not JSON).
pub fn read(name: &str, text: &str) -> (Vec<SlurmJob>, Vec<Problem>) {
    let document: Value = match serde_json::from_str(text) {
        Ok(document) => document,
        Err(error) => {
            return (
                Vec::new(),
                vec![Problem::new(
                    format!("{name}:{}:{}", error.line(), error.column()),
                    format!("not valid sacct JSON: {error}"),
                )],
            );
        }
    };
    // The API refuses a key given twice, whose first value serde_json would drop; so does
    // an import.
    if let Some(pointer) = repeated_key(text.as_bytes()) {
        return (
            Vec::new(),
            vec![Problem::new(
                format!("{name}: {pointer}"),
                "this key appears more than once",
            )],
        );
    }
    let Some(jobs) = document.get("jobs").and_then(Value::as_array) else {
        return (
            Vec::new(),
            vec![Problem::new(
                name,
                "no `jobs` array: is this the output of sacct --json?",
            )],
        );
    };
    let mut problems: Vec<Problem> = document
        .get("errors")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|error| {
            let text = ["description", "error"]
                .iter()
                .find_map(|key| error.get(key).and_then(Value::as_str))
                .filter(|text| !text.is_empty())
                .map_or_else(|| error.to_string(), str::to_owned);
            Problem::new(name, format!("sacct reported an error: {text}"))
        })
        .collect();
    let mut read = Vec::with_capacity(jobs.len());
    for (index, job) in jobs.iter().enumerate() {
        let job_id = job_id(job);
        let location = match &job_id {
            Ok(id) => format!("{name}: job {id}"),
            Err(_) => format!("{name}: jobs[{index}]"),
        };
        match job_id.and_then(|id| job_of(job, id, location.clone())) {
            Ok(job) => read.push(job),
            Err(reason) => problems.push(Problem::new(location, reason)),
        }
    }
    (read, problems)
}

fn job_of(job: &Value, job_id: String, location: String) -> Result<SlurmJob, String> {
    let time = |key: &str| instant(&job["time"][key]);
    let state = match &job["state"]["current"] {
        Value::String(name) => State::parse(name)?,
        Value::Array(names) => State::parse_list(
            &names
                .iter()
                .map(|n| n.as_str().unwrap_or_default().to_owned())
                .collect::<Vec<_>>(),
        )?,
        _ => return Err("no state.current".to_owned()),
    };
    let mut usage = GpuUsage::default();
    for step in job["steps"].as_array().into_iter().flatten() {
        let step_usage = usage_of(&step["tres"]["requested"]["max"]).map_err(|reason| {
            format!(
                "step {}: {reason}",
                step["step"]["id"].as_str().unwrap_or("?")
            )
        })?;
        usage.merge(&step_usage);
    }
    Ok(SlurmJob {
        location,
        job_id,
        account: text(&job["account"]),
        user: text(&job["user"]).or_else(|| text(&job["association"]["user"])),
        partition: text(&job["partition"]),
        qos: text(&job["qos"]),
        cluster: text(&job["cluster"]),
        name: text(&job["name"]),
        state,
        submit: time("submission")?,
        eligible: time("eligible")?,
        start: time("start")?,
        end: time("end")?,
        suspended_seconds: number(&job["time"]["suspended"])?.filter(|s| *s >= 0),
        restarts: number(&job["restart_cnt"])?.and_then(|n| u32::try_from(n).ok()),
        gpus: gpus_of(&job["tres"]["allocated"])?,
        usage,
        energy: energy_of(&job["tres"]["allocated"])?,
        nodes: text(&job["nodes"]),
    })
}

/// `4711`, `4711_3` for an array task, `4711+1` for a heterogeneous component.
fn job_id(job: &Value) -> Result<String, String> {
    let id = number(&job["job_id"])?.ok_or("no job_id")?;
    if let Some(task) = number(&job["array"]["task_id"])? {
        let array = number(&job["array"]["job_id"])?
            .filter(|a| *a != 0)
            .unwrap_or(id);
        return Ok(format!("{array}_{task}"));
    }
    let leader = number(&job["het"]["job_id"])?.unwrap_or(0);
    if leader != 0
        && let Some(offset) = number(&job["het"]["job_offset"])?
    {
        return Ok(format!("{leader}+{offset}"));
    }
    Ok(id.to_string())
}

/// A number, plain or as `{set, infinite, number}`; unset, infinite and `null` are none.
fn number(value: &Value) -> Result<Option<i64>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| format!("`{n}` is not a whole number")),
        Value::Object(object) if object.contains_key("number") => {
            let set = object.get("set").and_then(Value::as_bool).unwrap_or(true);
            let infinite = object
                .get("infinite")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if set && !infinite {
                number(&object["number"])
            } else {
                Ok(None)
            }
        }
        other => Err(format!("`{other}` is not a number")),
    }
}

/// Seconds since the epoch; 0 is Slurm's "not yet".
fn instant(value: &Value) -> Result<Option<DateTime<Utc>>, String> {
    Ok(number(value)?
        .filter(|seconds| *seconds > 0)
        .and_then(|seconds| Utc.timestamp_opt(seconds, 0).single()))
}

fn text(value: &Value) -> Option<String> {
    value
        .as_str()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

/// The name and count of a TRES entry of type `gres`.
fn gres_entries(list: &Value) -> Result<Vec<(&str, &Value)>, String> {
    let Some(entries) = list.as_array() else {
        return Ok(Vec::new());
    };
    let mut gres = Vec::new();
    for entry in entries {
        if !entry.is_object() {
            return Err(format!("TRES entry `{entry}` is not an object"));
        }
        if entry["type"].as_str() == Some("gres")
            && let Some(name) = entry["name"].as_str()
        {
            gres.push((name, &entry["count"]));
        }
    }
    Ok(gres)
}

fn gpus_of(allocated: &Value) -> Result<GpuTres, String> {
    let mut gpus = GpuTres::default();
    for (name, count) in gres_entries(allocated)? {
        if tres::is_gpu(name) {
            let count = number(count)?
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| format!("gres/{name} count `{count}` is not a number of GPUs"))?;
            gpus.add(name, count);
        }
    }
    Ok(gpus)
}

/// The allocation's `energy` TRES entry: the joules slurmctld added up from its steps when
/// they ended, what sacct prints as ConsumedEnergyRaw. Slurm's "unset" (`NO_VAL64`) and
/// "infinite" (`INFINITE64`) come out of its unsigned count as -2 and -1: nothing accounted,
/// as is a running job's -2 in the 23.02 and 23.11 fixtures.
fn energy_of(allocated: &Value) -> Result<Energy, String> {
    let Some(entries) = allocated.as_array() else {
        return Ok(Energy::Unmeasured);
    };
    let Some(entry) = entries
        .iter()
        .find(|entry| entry["type"].as_str() == Some("energy"))
    else {
        return Ok(Energy::Unmeasured);
    };
    match number(&entry["count"])? {
        None | Some(-2 | -1) => Ok(Energy::Unmeasured),
        Some(joules) => u64::try_from(joules)
            .map(Energy::of_joules)
            .map_err(|_| format!("energy `{joules}` is not an amount of joules")),
    }
}

fn usage_of(max: &Value) -> Result<GpuUsage, String> {
    let mut usage = GpuUsage::default();
    for (name, count) in gres_entries(max)? {
        let figure = || {
            number(count)?
                .filter(|n| *n >= 0)
                .map(rust_decimal::Decimal::from)
                .ok_or_else(|| format!("gres/{name} `{count}` is not a measurement"))
        };
        match name {
            "gpuutil" => usage.gpu_util = Some(figure()?),
            "gpumem" => usage.memory_bytes = Some(figure()?),
            _ => {}
        }
    }
    Ok(usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_is_refused_as_the_api_refuses_it() {
        let real = include_str!("../../../tests/fixtures/slurm/slurm_23_11_5.json");
        let (jobs, problems) = read("real.json", real);
        assert!(!jobs.is_empty() && problems.is_empty(), "{problems:?}");
        // The first job's array id given twice: serde_json would keep the second silently.
        let twice = real.replacen("\"job_id\":", "\"job_id\": 999999, \"job_id\":", 1);
        assert_ne!(twice, real);
        let (jobs, problems) = read("twice.json", &twice);
        assert!(jobs.is_empty());
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].location, "twice.json: /jobs/0/array/job_id");
        assert_eq!(problems[0].reason, "this key appears more than once");
    }

    #[test]
    fn energy_is_the_allocations_energy_tres_and_slurms_unset_is_none() {
        // The 23.02 and 23.11 fixtures' running job carries energy -2: NO_VAL64, unset.
        for real in [
            include_str!("../../../tests/fixtures/slurm/slurm_23_2_6.json"),
            include_str!("../../../tests/fixtures/slurm/slurm_23_11_5.json"),
        ] {
            let (jobs, problems) = read("real.json", real);
            assert!(problems.is_empty(), "{problems:?}");
            assert_eq!(jobs[0].energy, Energy::Unmeasured);
        }
        // The 25.05 fixture accounts no energy TRES, its steps' `energy.consumed` unset.
        let real = include_str!("../../../tests/fixtures/slurm/v0.0.43/fromage_1716595200.json");
        let (jobs, _) = read("fromage.json", real);
        assert!(jobs.iter().all(|job| job.energy == Energy::Unmeasured));
        // Job 6 (one V100 for 2,343 s) as a node measured by IPMI would account it.
        let mut document: Value = serde_json::from_str(real).unwrap();
        let allocated = document["jobs"][0]["tres"]["allocated"]
            .as_array_mut()
            .unwrap();
        allocated.insert(
            2,
            serde_json::json!({"type": "energy", "name": "", "id": 3, "count": 1_874_400, "task": null, "node": null}),
        );
        let (jobs, problems) = read("fromage.json", &document.to_string());
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(jobs[0].job_id, "6");
        assert_eq!(jobs[0].energy, Energy::Joules(1_874_400.into()));
        let energy =
            |count: Value| energy_of(&serde_json::json!([{"type": "energy", "count": count}]));
        assert_eq!(energy(serde_json::json!(-1)), Ok(Energy::Unmeasured));
        assert_eq!(energy(serde_json::json!(0)), Ok(Energy::Unmeasured));
        assert_eq!(
            energy(serde_json::json!({"set": true, "infinite": false, "number": 42})),
            Ok(Energy::Joules(42.into()))
        );
        assert!(energy(serde_json::json!(-7)).unwrap_err().contains("`-7`"));
    }

    #[test]
    fn a_truncated_document_is_one_problem_with_its_line() {
        let (jobs, problems) = read("cut.json", "{\n  \"jobs\": [\n    {\"job_id\": 1");
        assert!(jobs.is_empty());
        assert_eq!(problems.len(), 1);
        assert!(
            problems[0].location.starts_with("cut.json:3:"),
            "{problems:?}"
        );
    }

    #[test]
    fn array_tasks_and_het_components_are_named_as_sacct_names_them() {
        let array = serde_json::json!({"job_id": 12, "array": {"job_id": 10, "task_id": {"set": true, "infinite": false, "number": 2}}});
        assert_eq!(job_id(&array).unwrap(), "10_2");
        let het = serde_json::json!({"job_id": 21, "het": {"job_id": 20, "job_offset": 1}});
        assert_eq!(job_id(&het).unwrap(), "20+1");
        let plain = serde_json::json!({"job_id": 6, "array": {"job_id": 6, "task_id": {"set": false, "infinite": false, "number": 0}}, "het": {"job_id": 0, "job_offset": null}});
        assert_eq!(job_id(&plain).unwrap(), "6");
    }

    #[test]
    fn step_usage_is_the_highest_of_the_steps() {
        let job = serde_json::json!({
            "job_id": 3, "state": {"current": ["COMPLETED"]},
            "time": {"start": 100, "end": 200, "submission": 50, "eligible": 50, "elapsed": 100},
            "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 4}]},
            "steps": [
                {"step": {"id": "3.0"}, "tres": {"requested": {"max": [
                    {"type": "gres", "name": "gpuutil", "count": 340},
                    {"type": "gres", "name": "gpumem", "count": 1024}]}}},
                {"step": {"id": "3.1"}, "tres": {"requested": {"max": [
                    {"type": "gres", "name": "gpuutil", "count": 90},
                    {"type": "gres", "name": "gpumem", "count": 4096}]}}}
            ]
        });
        let read = job_of(&job, "3".to_owned(), "x".to_owned()).unwrap();
        assert_eq!(read.usage.gpu_util, Some(340.into()));
        assert_eq!(read.usage.memory_bytes, Some(4096.into()));
        assert_eq!(read.gpus.count(), 4);
    }
}
