//! Slurm as a source: `import --format slurm-json|sacct` over the real sacct outputs in
//! `tests/fixtures/slurm`, and `collect slurm` against a fake `sacct` on `PATH`, storing
//! locally and posting to a served app.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use taskledger::ledger::sources::{self, SourceSummary};
use taskledger::sources::slurm::text::{COLLECTED_FIELDS, TextOptions};
use taskledger::sources::slurm::{self, Format, Mapping};

use crate::common::{TestApp, assert_money, cost};
use crate::fixtures::{NOVEMBER, contract};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/slurm")
        .join(name)
}

/// The projects the fixtures' GPU jobs are accounted to, as slugs of their accounts.
const PROJECTS: [&str; 5] = [
    "rrg-bengioy-ad-gpu",
    "rrg-bonhomme-ad-cpu",
    "rrg-bonhomme-ad-gpu",
    "def-bonhomme-cpu",
    "def-bonhomme-gpu",
];

async fn app_with_projects() -> TestApp {
    let app = TestApp::spawn().await;
    for project in PROJECTS {
        app.create_project(project, "USD").await;
    }
    app
}

async fn import_json(app: &TestApp, name: &str, mapping: &Mapping) -> SourceSummary {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let batch = slurm::batch(&Format::Json, name, &text, mapping);
    sources::store(&app.pool, batch, &Default::default())
        .await
        .unwrap()
}

async fn stored(app: &TestApp, project: &str, task: &str, attempt: u32) -> Value {
    let response = app
        .get(
            &format!("/v1/projects/{project}/job-records/{task}/{attempt}"),
            &app.admin,
        )
        .await;
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()["record"].clone()
}

async fn record_count(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM job_records")
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn every_slurm_file_imports_with_the_gpu_jobs_it_holds() {
    let app = app_with_projects().await;
    // file, jobs, GPU jobs that finished (the records), not finished, finished without GPUs
    let files: [(&str, usize, usize, usize, usize); 7] = [
        ("slurm_21_8_8.json", 1, 1, 0, 0),
        ("slurm_22_5_9.json", 1, 1, 0, 0),
        ("slurm_23_2_6.json", 1, 0, 1, 0),
        ("slurm_23_11_5.json", 1, 0, 1, 0),
        ("v0.0.43/fromage_1716595200.json", 13, 8, 3, 2),
        ("v0.0.43/mila_1708819200.json", 7, 3, 2, 2),
        ("v0.0.43/raisin_base_job.json", 1, 0, 0, 1),
    ];
    let mapping = Mapping {
        gpu_models: [("gpubase_bynode_b4".to_owned(), "A100".to_owned())].into(),
        ..Mapping::default()
    };
    for (file, jobs, gpu_jobs, not_finished, no_gpu) in files {
        let summary = import_json(&app, file, &mapping).await;
        assert!(
            summary.problems.is_empty(),
            "{file}: {:?}",
            summary.problems
        );
        assert_eq!(summary.jobs_read, jobs, "{file}");
        assert_eq!(summary.records, gpu_jobs, "{file}");
        assert_eq!(summary.accepted, gpu_jobs, "{file}");
        assert_eq!(
            summary.skipped.get("not finished").copied().unwrap_or(0),
            not_finished,
            "{file}"
        );
        assert_eq!(
            summary.skipped.get("no GPU").copied().unwrap_or(0),
            no_gpu,
            "{file}"
        );
        assert!(
            summary.left_out.is_empty(),
            "{file}: no GPU telemetry in these files"
        );
    }
    assert_eq!(record_count(&app).await, 13);

    // Slurm 21.08: one GPU of no recorded type, requeued at its end.
    let requeued = stored(&app, "rrg-bengioy-ad-gpu", "55978384", 1).await;
    assert_eq!(requeued["gpu_count"], "1");
    assert_eq!(requeued["gpu_model"], "unknown");
    assert_eq!(requeued["outcome"], "preempted");
    assert_eq!(requeued["queued_at"], "2023-01-09T14:37:03Z");
    assert_eq!(requeued["started_at"], "2023-01-09T14:37:03Z");
    assert_eq!(requeued["ended_at"], "2023-01-10T16:49:46Z");
    assert_eq!(
        requeued["gpu_seconds_held"], "94363",
        "End − Start, nothing suspended"
    );
    assert_eq!(
        requeued["labels"],
        json!({"user": "purah", "partition": "gpubackfill", "qos": "normal",
               "cluster": "cedar", "job_name": "submitit"})
    );

    // Slurm 22.05: task 100 of array 20247445 failed on 4 nodes of 4 GPUs, accounted
    // untyped; its partition's model comes from --gpu-model.
    let array_task = stored(&app, "rrg-bengioy-ad-gpu", "20247445_100", 1).await;
    assert_eq!(array_task["gpu_count"], "16");
    assert_eq!(array_task["gpu_model"], "A100");
    assert_eq!(array_task["outcome"], "failed");
    assert_eq!(
        array_task["queued_at"], "2023-08-16T04:40:14Z",
        "Eligible, not Submit"
    );
    assert_eq!(array_task["started_at"], "2023-09-03T11:30:41Z");
    assert_eq!(array_task["ended_at"], "2023-09-04T22:04:04Z");

    // v0.0.43: job 6 ran out of memory on one V100; job 37 completed on two.
    let out_of_memory = stored(&app, "rrg-bonhomme-ad-cpu", "6", 1).await;
    assert_eq!(
        (
            &out_of_memory["gpu_count"],
            &out_of_memory["gpu_model"],
            &out_of_memory["outcome"]
        ),
        (&json!("1"), &json!("v100"), &json!("failed"))
    );
    assert_eq!(out_of_memory["started_at"], "2024-01-25T03:13:42Z");
    assert_eq!(out_of_memory["ended_at"], "2024-01-25T03:52:45Z");
    let two_gpus = stored(&app, "def-bonhomme-cpu", "37", 1).await;
    assert_eq!(
        (
            &two_gpus["gpu_count"],
            &two_gpus["gpu_model"],
            &two_gpus["outcome"]
        ),
        (&json!("2"), &json!("v100"), &json!("completed"))
    );
    assert_eq!(two_gpus["queued_at"], "2024-05-24T20:45:39Z");
    assert_eq!(two_gpus["started_at"], "2024-05-24T21:25:24Z");
    assert_eq!(two_gpus["ended_at"], "2024-05-24T23:43:46Z");
    let rtx = stored(&app, "def-bonhomme-cpu", "13", 1).await;
    assert_eq!(
        (&rtx["gpu_count"], &rtx["gpu_model"]),
        (&json!("2"), &json!("rtx8000"))
    );
    assert_eq!(rtx["labels"]["cluster"], "mila");

    // A second import is all duplicates.
    let again = import_json(&app, "v0.0.43/fromage_1716595200.json", &mapping).await;
    assert_eq!((again.accepted, again.duplicates), (0, 8));
}

/// The text fixture is the fromage JSON's jobs and steps as `sacct --parsable` would print
/// them with `--delimiter=#`, fields in another order plus NNodes, times in Montreal time.
#[tokio::test]
async fn parsable_text_of_the_same_jobs_gives_the_same_records_as_the_json() {
    let json_text = std::fs::read_to_string(fixture("v0.0.43/fromage_1716595200.json")).unwrap();
    let from_json = slurm::batch(&Format::Json, "json", &json_text, &Mapping::default());
    let sacct_text = std::fs::read_to_string(fixture("fromage_1716595200.parsable.txt")).unwrap();
    assert!(
        sacct_text.lines().next().unwrap().ends_with('#'),
        "a trailing delimiter"
    );
    let text_format = Format::Text(TextOptions {
        delimiter: None,
        timezone: "America/Montreal".parse().unwrap(),
    });
    let from_text = slurm::batch(&text_format, "text", &sacct_text, &Mapping::default());
    assert!(
        from_text.unparsable.is_empty(),
        "{:?}",
        from_text.unparsable
    );
    let values = |batch: &taskledger::sources::batch::SourceBatch| -> Vec<Value> {
        batch.records.iter().map(|r| r.value.clone()).collect()
    };
    assert_eq!(from_json.records.len(), 8);
    assert_eq!(values(&from_text), values(&from_json));
    assert_eq!(from_text.skipped, from_json.skipped);
    assert_eq!(
        from_text.jobs_read, from_json.jobs_read,
        "steps are not jobs"
    );

    // The command reads the same text from standard input and stores the same 8 records.
    let app = app_with_projects().await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
        .args([
            "--database-url",
            &app.database_url,
            "import",
            "--format",
            "sacct",
        ])
        .args(["--source-timezone", "America/Montreal", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use tokio::io::AsyncWriteExt;
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(sacct_text.as_bytes()).await.unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("jobs read 13, records 8: accepted 8, duplicates 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("skipped: no GPU 2, not finished 3"),
        "{stdout}"
    );
    assert_eq!(record_count(&app).await, 8);
}

fn run_import(app: &TestApp, format: &str, file: &Path) -> std::process::Output {
    run_import_with(app, format, file, &[])
}

fn run_import_with(
    app: &TestApp,
    format: &str,
    file: &Path,
    args: &[&str],
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
        .args([
            "--database-url",
            &app.database_url,
            "import",
            "--format",
            format,
        ])
        .args(["--source-timezone", "UTC"])
        .args(args)
        .arg(file)
        .output()
        .unwrap()
}

/// Four finished jobs of 10 November 2026, an hour each, with what their steps measured and
/// the energy Slurm accounted them (ConsumedEnergyRaw, joules):
///
/// | job | AllocTRES | step's TRESUsageInMax | energy | stored |
/// | --- | --- | --- | --- | --- |
/// | 700 | 2 × h100 (80 GiB) | gpuutil 150, gpumem 120 GiB | 5040000 | sums over 2 GPUs: 0.75, 60 GiB of 80; 5040000 J |
/// | 701 | 2 × a100_3g.20gb | gpuutil 87, gpumem 4096M | 1800000 | `3g.20gb`, 0.87, 4 GiB of 20; priced at 3/7; no energy (a slice) |
/// | 702 | 1 × a100 (40 GiB) | gpuutil 250, gpumem 50G | 0 | neither: cannot be on one GPU; no energy (0 J is nothing measured) |
/// | 703 | 1 × a100_1c.3g.20gb | gpuutil 40 | | 0.4; the compute instance is no known profile |
const TELEMETRY_JOBS: &str = "\
JobID|State|Start|End|AllocTRES|TRESUsageInMax|ConsumedEnergyRaw
700|COMPLETED|2026-11-10T00:00:00|2026-11-10T01:00:00|cpu=8,gres/gpu=2,gres/gpu:h100=2||5040000
700.0|COMPLETED|2026-11-10T00:00:00|2026-11-10T01:00:00|cpu=8,gres/gpu=2,gres/gpu:h100=2|cpu=00:10:00,gres/gpumem=128849018880,gres/gpuutil=150|5039000
701|COMPLETED|2026-11-10T02:00:00|2026-11-10T03:00:00|cpu=4,gres/gpu=2,gres/gpu:a100_3g.20gb=2||1800000
701.0|COMPLETED|2026-11-10T02:00:00|2026-11-10T03:00:00|cpu=4,gres/gpu=2,gres/gpu:a100_3g.20gb=2|gres/gpumem=4096M,gres/gpuutil=87|1799000
702|COMPLETED|2026-11-10T04:00:00|2026-11-10T05:00:00|gres/gpu=1,gres/gpu:a100=1||0
702.0|COMPLETED|2026-11-10T04:00:00|2026-11-10T05:00:00|gres/gpu=1,gres/gpu:a100=1|gres/gpumem=50G,gres/gpuutil=250|0
703|COMPLETED|2026-11-10T06:00:00|2026-11-10T07:00:00|gres/gpu=1,gres/gpu:a100_1c.3g.20gb=1||
703.0|COMPLETED|2026-11-10T06:00:00|2026-11-10T07:00:00|gres/gpu=1,gres/gpu:a100_1c.3g.20gb=1|gres/gpuutil=40|
";

#[tokio::test]
async fn slurm_telemetry_is_stored_and_implausible_figures_are_left_out_and_counted() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("a100", "on_demand", "7.00").create(&app).await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("telemetry.txt");
    std::fs::write(&path, TELEMETRY_JOBS).unwrap();
    let output = run_import_with(&app, "sacct", &path, &["--project", "vision"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "left-out figures do not fail the batch: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("jobs read 4, records 4: accepted 4, duplicates 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "telemetry read but left out (the jobs are stored without it): \
             energy_joules on 1 job (a MIG slice: Slurm measures the whole card or node); \
             gpu_util on 1 job (above 100 % per GPU); \
             memory_peak_gib on 1 job (above the memory of the GPU or slice); \
             mig_profile on 1 job (not a MIG profile the catalogue knows for the model)"
        ),
        "{stdout}"
    );
    assert_eq!(record_count(&app).await, 4);

    let summed = stored(&app, "vision", "700", 1).await;
    assert_eq!(summed["gpu_model"], "h100");
    assert_eq!(summed["gpu_util"], "0.75", "150 % over 2 GPUs");
    assert_eq!(summed["memory_peak_gib"], "60", "120 GiB over 2 GPUs");
    assert_eq!(summed["memory_total_gib"], "80", "an H100's memory");
    assert_eq!(summed["mig_profile"], Value::Null);
    assert_eq!(
        summed["energy_joules"], "5040000",
        "the job's ConsumedEnergyRaw, not its step's"
    );

    let sliced = stored(&app, "vision", "701", 1).await;
    assert_eq!(
        (&sliced["gpu_model"], &sliced["gpu_count"]),
        (&json!("a100"), &json!("2"))
    );
    assert_eq!(sliced["mig_profile"], "3g.20gb");
    assert_eq!(sliced["gpu_util"], "0.87");
    assert_eq!(sliced["memory_peak_gib"], "4");
    assert_eq!(sliced["memory_total_gib"], "20", "the slice's memory");
    assert_eq!(sliced["energy_joules"], Value::Null);

    let implausible = stored(&app, "vision", "702", 1).await;
    assert_eq!(implausible["gpu_util"], Value::Null);
    assert_eq!(implausible["memory_peak_gib"], Value::Null);
    assert_eq!(implausible["memory_total_gib"], Value::Null);
    assert_eq!(implausible["energy_joules"], Value::Null);

    let compute_instance = stored(&app, "vision", "703", 1).await;
    assert_eq!(compute_instance["gpu_model"], "a100");
    assert_eq!(compute_instance["mig_profile"], Value::Null);
    assert_eq!(compute_instance["gpu_util"], "0.4");

    // Two 3g slices for an hour cost 2 × 7.00 × 3/7; a whole A100 for an hour 7.00, and so
    // does the compute instance, whose profile is unknown (a whole card, as it was read).
    let task = |id: &str| {
        let app = &app;
        let path = format!("/v1/projects/vision/tasks/{id}");
        async move { cost(app, &path).await }
    };
    let slice_task = task("701").await;
    assert_eq!(slice_task["attempts"][0]["mig_profile"], "3g.20gb");
    assert_money(&slice_task["final_cost"], "6");
    assert_money(&task("702").await["final_cost"], "7");
    assert_money(&task("703").await["final_cost"], "7");
    // The month: 6 + 7 + 7; the H100s have no contract and are unrated.
    let month = cost(&app, NOVEMBER).await;
    assert_money(&month["total"], "20");
    assert_money(&month["unrated_gpu_seconds"], "7200");
    // The month's measured energy is 700's alone: 5,040,000 J ÷ 3,600,000 J/kWh = 1.4 kWh
    // (two H100s at 700 W for an hour).
    assert_money(&month["energy"]["kwh"], "1.4");
}

#[tokio::test]
async fn bad_slurm_input_is_located_and_nothing_of_its_batch_is_stored() {
    let app = app_with_projects().await;
    let dir = tempfile::tempdir().unwrap();
    let whole = std::fs::read_to_string(fixture("v0.0.43/mila_1708819200.json")).unwrap();
    let truncated = dir.path().join("truncated.json");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).unwrap();
    let good = "2|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|def-bonhomme_cpu";
    let header = "JobID|State|Start|End|AllocTRES|Account";
    let text_cases = [
        (
            "fields.txt",
            "3|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1",
            "fields.txt:3",
            "5 fields where the header names 6",
        ),
        (
            "state.txt",
            "3|EXPLODED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1|def-bonhomme_cpu",
            "state.txt:3",
            "job 3: unknown job state `EXPLODED`",
        ),
        (
            "tres.txt",
            "3|COMPLETED|2024-05-01T10:00:00|2024-05-01T11:00:00|gres/gpu=1,gres/gpu:a100|def-bonhomme_cpu",
            "tres.txt:3",
            "job 3: `gres/gpu:a100` in TRES",
        ),
    ];
    let mut cases = vec![(
        "slurm-json",
        truncated,
        "truncated.json:".to_owned(),
        "not valid sacct JSON".to_owned(),
    )];
    for (name, bad_line, location, reason) in text_cases {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("{header}\n{good}\n{bad_line}\n")).unwrap();
        cases.push(("sacct", path, location.to_owned(), reason.to_owned()));
    }
    for (format, path, location, reason) in cases {
        let output = run_import(&app, format, &path);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!output.status.success(), "{stdout}");
        assert!(
            stdout
                .lines()
                .any(|line| line.contains(&location) && line.contains(&reason)),
            "{location} {reason}:\n{stdout}"
        );
        assert!(stdout.contains("accepted 0"), "{stdout}");
        assert_eq!(
            record_count(&app).await,
            0,
            "nothing of {location} was stored"
        );
    }
    // The good line alone is stored.
    let path = dir.path().join("good.txt");
    std::fs::write(&path, format!("{header}\n{good}\n")).unwrap();
    assert!(run_import(&app, "sacct", &path).status.success());
    assert_eq!(record_count(&app).await, 1);
}

const DELIMITER: &str = "\u{1f}";

/// A line of the collector's sacct output, fields as [`COLLECTED_FIELDS`] names them.
fn line(fields: &[(&str, &str)]) -> String {
    COLLECTED_FIELDS
        .iter()
        .map(|name| {
            fields
                .iter()
                .find(|(field, _)| field == name)
                .map_or("", |(_, value)| value)
        })
        .collect::<Vec<_>>()
        .join(DELIMITER)
}

fn job(id: &str, state: &str, restarts: &str, tres: &str, start: &str, end: &str) -> String {
    line(&[
        ("JobID", id),
        ("JobName", "train"),
        ("Account", "ml-research"),
        ("User", "ada"),
        ("Partition", "gpu"),
        ("QOS", "normal"),
        ("Cluster", "c1"),
        ("State", state),
        ("Submit", "2024-05-24T08:00:00"),
        ("Eligible", "2024-05-24T08:00:00"),
        ("Start", start),
        ("End", end),
        ("Suspended", "00:00:00"),
        ("Restarts", restarts),
        ("AllocTRES", tres),
    ])
}

/// The first window: 600 completed, 601 still running, 602's first run requeued (with a
/// step that measured its GPUs), 603 without GPUs. The second window overlaps it: 600 and
/// 602's first run again, 601 completed, 602's second run completed.
fn sacct_outputs() -> [String; 2] {
    let header = COLLECTED_FIELDS.join(DELIMITER);
    let a100 = "cpu=16,mem=65536,node=1,gres/gpu=4,gres/gpu:a100=4";
    let mig = "cpu=4,mem=16384,node=1,gres/gpu=2,gres/gpu:a100_3g.20gb=2";
    let done_600 = job(
        "600",
        "COMPLETED",
        "0",
        a100,
        "2024-05-24T09:00:00",
        "2024-05-24T10:00:00",
    );
    let first_602 = job(
        "602",
        "REQUEUED",
        "0",
        mig,
        "2024-05-24T09:00:00",
        "2024-05-24T09:30:00",
    );
    let step_602 = line(&[
        ("JobID", "602.0"),
        ("State", "CANCELLED"),
        ("AllocTRES", mig),
        (
            "TRESUsageInMax",
            "cpu=00:10:00,gres/gpumem=4294967296,gres/gpuutil=87",
        ),
    ]);
    let first = [
        header.clone(),
        done_600.clone(),
        job(
            "601",
            "RUNNING",
            "0",
            a100,
            "2024-05-24T09:00:00",
            "Unknown",
        ),
        first_602.clone(),
        step_602.clone(),
        job(
            "603",
            "COMPLETED",
            "0",
            "cpu=2,mem=4096,node=1",
            "2024-05-24T09:00:00",
            "2024-05-24T09:05:00",
        ),
    ];
    let second = [
        header,
        done_600,
        job(
            "601",
            "COMPLETED",
            "0",
            a100,
            "2024-05-24T09:00:00",
            "2024-05-24T23:00:00",
        ),
        first_602,
        step_602,
        job(
            "602",
            "COMPLETED",
            "1",
            mig,
            "2024-05-24T23:00:00",
            "2024-05-25T01:00:00",
        ),
    ];
    [first.join("\n") + "\n", second.join("\n") + "\n"]
}

/// `line` with its ConsumedEnergyRaw set to `joules`.
fn with_energy(line: &str, joules: &str) -> String {
    let at = COLLECTED_FIELDS
        .iter()
        .position(|field| *field == "ConsumedEnergyRaw")
        .unwrap();
    let mut fields: Vec<&str> = line.split(DELIMITER).collect();
    fields[at] = joules;
    fields.join(DELIMITER)
}

/// A fake sacct printing [`sacct_outputs`].
fn fake_sacct(dir: &Path) -> PathBuf {
    fake_sacct_printing(dir, sacct_outputs())
}

/// A fake sacct: logs TZ and its arguments, then prints the next of the outputs.
fn fake_sacct_printing(dir: &Path, [first, second]: [String; 2]) -> PathBuf {
    std::fs::write(dir.join("first.txt"), first).unwrap();
    std::fs::write(dir.join("second.txt"), second).unwrap();
    let script = dir.join("sacct");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             dir='{}'\n\
             echo \"TZ=$TZ $*\" >> \"$dir/calls\"\n\
             if [ -e \"$dir/ran\" ]; then cat \"$dir/second.txt\"; else touch \"$dir/ran\"; cat \"$dir/first.txt\"; fi\n",
            dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.to_owned()
}

async fn collect(
    app: &TestApp,
    bin: &Path,
    state: &Path,
    until: &str,
    server: Option<(&str, &str)>,
) -> (bool, String) {
    collect_with(app, bin, state, until, server, &["--no-capacity"]).await
}

async fn collect_with(
    app: &TestApp,
    bin: &Path,
    state: &Path,
    until: &str,
    server: Option<(&str, &str)>,
    extra: &[&str],
) -> (bool, String) {
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_taskledger"));
    command
        .env("PATH", path)
        .env_remove("TASKLEDGER_SERVER")
        .args(["--database-url", &app.database_url, "collect", "slurm"])
        .arg("--state")
        .arg(state)
        .args(["--until", until, "--project-map", "ml-research=vision"])
        .args(extra);
    if let Some((url, token)) = server {
        command
            .args(["--server", url])
            .env("TASKLEDGER_TOKEN", token);
    }
    let output = command.output().await.unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    (output.status.success(), format!("{stdout}{stderr}"))
}

/// Runs the collector twice over overlapping windows and checks that each job was stored
/// once, with a requeued job's runs as its attempts.
async fn collect_twice(app: &TestApp, server: Option<(&str, &str)>) {
    let dir = tempfile::tempdir().unwrap();
    let bin = fake_sacct(dir.path());
    let state = dir.path().join("slurm.state");

    let (ok, out) = collect(app, &bin, &state, "2024-05-25T00:00:00Z", server).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("jobs read 4, records 2: accepted 2, duplicates 0"),
        "{out}"
    );
    assert!(out.contains("skipped: no GPU 1, not finished 1"), "{out}");
    assert!(
        !out.contains("left out"),
        "602's step measured plausible figures: {out}"
    );
    let (ok, out) = collect(app, &bin, &state, "2024-05-26T00:00:00Z", server).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("jobs read 4, records 4: accepted 2, duplicates 2"),
        "{out}"
    );

    let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len(), 2);
    for call in &calls {
        for expected in [
            "TZ=UTC ",
            "--noconvert",
            "--duplicates",
            "--array",
            "--parsable2",
        ] {
            assert!(call.contains(expected), "{call}");
        }
    }
    assert!(calls[0].contains("--starttime=2024-05-24T00:00:00 --endtime=2024-05-25T00:00:00"));
    assert!(
        calls[1].contains("--starttime=2024-05-24T23:50:00 --endtime=2024-05-26T00:00:00"),
        "the second window starts where the first stopped, less the overlap: {}",
        calls[1]
    );

    assert_eq!(record_count(app).await, 4, "600, 601, 602 twice: each once");
    let requeued = stored(app, "vision", "602", 1).await;
    assert_eq!(requeued["outcome"], "preempted");
    assert_eq!(requeued["gpu_model"], "a100", "the MIG slice's parent");
    assert_eq!(requeued["gpu_count"], "2");
    // Its step's figures: 87 % and 4 GiB (4294967296 bytes) of a 20 GiB slice.
    assert_eq!(requeued["mig_profile"], "3g.20gb");
    assert_eq!(requeued["gpu_util"], "0.87");
    assert_eq!(requeued["memory_peak_gib"], "4");
    assert_eq!(requeued["memory_total_gib"], "20");
    let rerun = stored(app, "vision", "602", 2).await;
    assert_eq!(rerun["outcome"], "completed");
    assert_eq!(rerun["started_at"], "2024-05-24T23:00:00Z");
    assert_eq!(rerun["queued_at"], "2024-05-24T08:00:00Z");
    let finished_later = stored(app, "vision", "601", 1).await;
    assert_eq!(finished_later["ended_at"], "2024-05-24T23:00:00Z");
}

#[tokio::test]
async fn collect_slurm_stores_each_job_once_over_overlapping_windows() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    collect_twice(&app, None).await;
}

#[tokio::test]
async fn collect_slurm_posts_each_job_once_to_a_server() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let token = app.token("ingest", &["vision"]).await;
    let served = app.serve().await;
    let url = served.url();
    collect_twice(&app, Some((&url, &token))).await;

    // A failed post leaves the state where it was.
    let dir = tempfile::tempdir().unwrap();
    let bin = fake_sacct(dir.path());
    let state = dir.path().join("slurm.state");
    let (ok, out) = collect(
        &app,
        &bin,
        &state,
        "2024-05-25T00:00:00Z",
        Some((&url, "not-a-token")),
    )
    .await;
    assert!(!ok, "{out}");
    assert!(!state.exists());
    served.stop().await;
}

/// Three finished GPU jobs of 24 May 2024 with the energy Slurm accounted them: 600 on four
/// whole A100s for an hour, 5,400,123 J (375 W a GPU), its step's own figure below it; 602
/// on two 3g.20gb slices, 900,000 J of the whole card or node; 604 on one A100, 0 J (nothing
/// measured).
fn energy_output() -> String {
    let a100 = "cpu=16,mem=65536,node=1,gres/gpu=4,gres/gpu:a100=4";
    let mig = "cpu=4,mem=16384,node=1,gres/gpu=2,gres/gpu:a100_3g.20gb=2";
    let one = "cpu=4,mem=16384,node=1,gres/gpu=1,gres/gpu:a100=1";
    let (nine, ten, eleven) = (
        "2024-05-24T09:00:00",
        "2024-05-24T10:00:00",
        "2024-05-24T11:00:00",
    );
    let step_600 = line(&[
        ("JobID", "600.0"),
        ("State", "COMPLETED"),
        ("AllocTRES", a100),
        ("Start", nine),
        ("End", ten),
    ]);
    [
        COLLECTED_FIELDS.join(DELIMITER),
        with_energy(&job("600", "COMPLETED", "0", a100, nine, ten), "5400123"),
        with_energy(&step_600, "5400000"),
        with_energy(
            &job("602", "COMPLETED", "0", mig, nine, "2024-05-24T09:30:00"),
            "900000",
        ),
        with_energy(&job("604", "COMPLETED", "0", one, ten, eleven), "0"),
    ]
    .join("\n")
        + "\n"
}

#[tokio::test]
async fn collect_slurm_posts_the_energy_slurm_accounted_except_a_slices() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let token = app.token("ingest", &["vision"]).await;
    let served = app.serve().await;
    let dir = tempfile::tempdir().unwrap();
    let output = energy_output();
    let bin = fake_sacct_printing(dir.path(), [output.clone(), output]);
    let state = dir.path().join("slurm.state");
    let (ok, out) = collect(
        &app,
        &bin,
        &state,
        "2024-05-25T00:00:00Z",
        Some((&served.url(), &token)),
    )
    .await;
    served.stop().await;
    assert!(ok, "{out}");
    assert!(
        out.contains("jobs read 3, records 3: accepted 3, duplicates 0"),
        "{out}"
    );
    // Only the slice's energy is left out; a 0 is nothing measured, not counted.
    let left_out: Vec<&str> = out
        .lines()
        .filter(|line| line.contains("left out"))
        .collect();
    assert_eq!(
        left_out,
        [
            "telemetry read but left out (the jobs are stored without it): \
          energy_joules on 1 job (a MIG slice: Slurm measures the whole card or node)"
        ],
        "{out}"
    );

    // The allocation line's ConsumedEnergyRaw, exactly, not its step's 5,400,000.
    let whole = stored(&app, "vision", "600", 1).await;
    assert_eq!(whole["gpu_count"], "4");
    assert_eq!(whole["energy_joules"], "5400123");
    let slice = stored(&app, "vision", "602", 1).await;
    assert_eq!(slice["mig_profile"], "3g.20gb");
    assert_eq!(slice["energy_joules"], Value::Null);
    let unmeasured = stored(&app, "vision", "604", 1).await;
    assert_eq!(unmeasured["gpu_count"], "1");
    assert_eq!(unmeasured["energy_joules"], Value::Null);
}

/// `import --format sacct` reads its file in runs of lines: a requeued job whose two runs lie
/// in different runs is numbered over the whole file, a step that follows its job in the
/// next run's first lines is still its job's, and nothing is stored when a line far into
/// the file cannot be read.
#[tokio::test]
async fn sacct_text_is_read_in_runs_and_attempts_are_numbered_over_the_whole_file() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let jobs = taskledger::ledger::sacct_import::JOBS_PER_RUN + 5;
    let mut text = String::from("JobID|State|Submit|Start|End|AllocTRES|TRESUsageInMax\n");
    // Job 9 runs twice: first near the start, submitted later than its run near the end.
    text.push_str(
        "9|COMPLETED|2026-11-10T02:00:00|2026-11-10T02:00:00|2026-11-10T03:00:00|gres/gpu:h100=1|\n",
    );
    for n in 1..jobs - 1 {
        let id = 100_000 + n;
        let hour = n % 20;
        text.push_str(&format!(
            "{id}|COMPLETED|2026-11-11T{hour:02}:00:00|2026-11-11T{hour:02}:00:00|\
             2026-11-11T{hour:02}:30:00|gres/gpu:h100=1|\n"
        ));
    }
    text.push_str(
        "9|FAILED|2026-11-10T00:00:00|2026-11-10T00:00:00|2026-11-10T01:00:00|gres/gpu:h100=1|\n",
    );
    text.push_str(
        "9.0|FAILED|2026-11-10T00:00:00|2026-11-10T00:00:00|2026-11-10T01:00:00|gres/gpu:h100=1|gres/gpuutil=40\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sacct.txt");
    std::fs::write(&path, &text).unwrap();

    // A bad line after the first run: nothing stored.
    let broken = dir.path().join("broken.txt");
    std::fs::write(&broken, format!("{text}1|COMPLETED|not a time\n")).unwrap();
    let output = run_import_with(&app, "sacct", &broken, &["--project", "vision"]);
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains(&format!("broken.txt:{}", jobs + 3)),
        "the bad line is named: {stdout}"
    );
    assert_eq!(record_count(&app).await, 0);

    let output = run_import_with(&app, "sacct", &path, &["--project", "vision"]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "jobs read {jobs}, records {jobs}: accepted {jobs}"
        )),
        "{stdout}"
    );
    assert_eq!(record_count(&app).await, jobs as i64);
    // By submission: the failed run (submitted at 00:00) is attempt 1, the completed one 2;
    // the failed run's step, in the next run of lines, gave it its utilisation.
    let first = stored(&app, "vision", "9", 1).await;
    assert_eq!(first["outcome"], "failed");
    assert_eq!(first["gpu_util"], "0.4");
    let second = stored(&app, "vision", "9", 2).await;
    assert_eq!(second["outcome"], "completed");
}

/// A fake `scontrol`: logs its arguments, then prints the next of the snapshots.
fn fake_scontrol(dir: &Path, snapshots: &[String]) {
    for (index, snapshot) in snapshots.iter().enumerate() {
        std::fs::write(dir.join(format!("snapshot{index}.json")), snapshot).unwrap();
    }
    let script = dir.join("scontrol");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n\
             dir='{}'\n\
             n=$(cat \"$dir/taken\" 2>/dev/null || echo 0)\n\
             echo $((n + 1)) > \"$dir/taken\"\n\
             echo \"TZ=$TZ $*\" >> \"$dir/scontrol-calls\"\n\
             cat \"$dir/snapshot$n.json\"\n",
            dir.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Node snapshots of Slurm 21.08.5 (`tests/fixtures/slurm-nodes/sinfo_21_08_5.json`): as
/// listed, then with one GPU node drained, twice.
fn snapshots() -> Vec<String> {
    let listed = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slurm-nodes/sinfo_21_08_5.json"),
    )
    .unwrap();
    let mut drained: Value = serde_json::from_str(&listed).unwrap();
    drained["nodes"][1]["state_flags"] = json!(["DRAIN"]);
    let drained = serde_json::to_string_pretty(&drained).unwrap();
    vec![listed, drained.clone(), drained]
}

#[tokio::test]
async fn collect_slurm_extends_node_capacity_run_by_run_until_a_node_changes() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let response = app
        .put(
            "/v1/pools/hw",
            &app.admin,
            json!({"name": "hw", "owner_project": "vision"}),
        )
        .await;
    assert!(response.status.is_success(), "{}", response.text());
    let dir = tempfile::tempdir().unwrap();
    let bin = fake_sacct(dir.path());
    fake_scontrol(dir.path(), &snapshots());
    let state = dir.path().join("slurm.state");
    let scontrol = dir.path().join("scontrol");
    let extra = ["--nodes-command", scontrol.to_str().unwrap()];
    let open = |name: &str| -> (String, String) {
        let stored: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
        let node = &stored["nodes"][name];
        (
            node["from"].as_str().unwrap().to_owned(),
            node["node"]["state"].as_str().unwrap().to_owned(),
        )
    };

    // The first snapshot opens an interval for each GPU node; nothing is stored yet.
    let (ok, out) = collect_with(&app, &bin, &state, "2024-05-25T00:00:00Z", None, &extra).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("capacity: nodes 2, intervals 0: inserted 0, duplicates 0"),
        "{out}"
    );
    let (first, _) = open("cs2.example.company.com");
    assert_eq!(open("cs3.example.company.com").0, first);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;

    // cs3 is drained: its up interval ends, a down one opens; cs2's runs on.
    let (ok, out) = collect_with(&app, &bin, &state, "2024-05-26T00:00:00Z", None, &extra).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("capacity: nodes 2, intervals 2: inserted 2, duplicates 0"),
        "{out}"
    );
    let (drained, condition) = open("cs3.example.company.com");
    assert_eq!(condition, "down");
    assert!(drained > first);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;

    // Through the server: cs2's interval is extended in place, cs3's down one stored.
    let token = app.token("ingest", &["vision"]).await;
    let served = app.serve().await;
    let url = served.url();
    let (ok, out) = collect_with(
        &app,
        &bin,
        &state,
        "2024-05-26T00:00:00Z",
        Some((&url, &token)),
        &extra,
    )
    .await;
    assert!(ok, "{out}");
    assert!(
        out.contains("capacity: nodes 2, intervals 2: inserted 1, replaced 1, duplicates 0"),
        "{out}"
    );
    served.stop().await;
    let last: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let third = last["nodes"]["cs2.example.company.com"]["last_seen"]
        .as_str()
        .unwrap()
        .to_owned();
    let rows: Vec<(String, String, String, String, String, i32, String)> = sqlx::query_as(
        "SELECT node, to_char(from_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                to_char(until_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), \
                state, pool_id, gpus, gpu_model \
         FROM capacity_intervals ORDER BY node, from_at",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let row = |node: &str, from: &str, until: &str, state: &str, gpus: i32, model: &str| {
        (
            node.to_owned(),
            from.to_owned(),
            until.to_owned(),
            state.to_owned(),
            "hw".to_owned(),
            gpus,
            model.to_owned(),
        )
    };
    assert_eq!(
        rows,
        [
            row("cs2.example.company.com", &first, &third, "up", 8, "a100"),
            row(
                "cs3.example.company.com",
                &first,
                &drained,
                "up",
                6,
                "a100+h100"
            ),
            row(
                "cs3.example.company.com",
                &drained,
                &third,
                "down",
                6,
                "a100+h100"
            ),
        ]
    );
    let calls = std::fs::read_to_string(dir.path().join("scontrol-calls")).unwrap();
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        ["TZ=UTC show nodes --json"; 3]
    );
}

#[tokio::test]
async fn node_listings_import_as_the_capacity_between_them() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let dir = tempfile::tempdir().unwrap();
    let listing = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slurm-nodes/node_24_11_0.json"),
    )
    .unwrap();
    // The same node listed ten minutes later, drained.
    let mut later: Value = serde_json::from_str(&listing).unwrap();
    later["last_update"]["number"] = json!(1_722_010_273 + 600);
    later["nodes"][0]["state"] = json!(["IDLE", "DRAIN"]);
    let (first, second) = (
        dir.path().join("first.json"),
        dir.path().join("second.json"),
    );
    std::fs::write(&first, &listing).unwrap();
    std::fs::write(&second, later.to_string()).unwrap();
    let second_arg = second.to_str().unwrap();

    // The pool does not exist yet: refused, nothing stored.
    let output = run_import_with(&app, "sinfo-json", &first, &[second_arg]);
    let out = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{out}");
    assert!(
        out.contains("no pool `debug`; create it with PUT /v1/pools/debug"),
        "{out}"
    );

    let response = app
        .put(
            "/v1/pools/debug",
            &app.admin,
            json!({"name": "debug", "owner_project": "vision"}),
        )
        .await;
    assert!(response.status.is_success(), "{}", response.text());
    for expected in [
        "capacity: nodes 1, intervals 1: inserted 1, duplicates 0",
        "capacity: nodes 1, intervals 1: inserted 0, duplicates 1",
    ] {
        let output = run_import_with(&app, "sinfo-json", &first, &[second_arg]);
        let out = String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{out}");
        assert!(out.contains(expected), "{out}");
    }
    let stored: (String, i64, i32, String, String) = sqlx::query_as(
        "SELECT node, extract(epoch FROM until_at - from_at)::bigint, gpus, gpu_model, state \
         FROM capacity_intervals",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        stored,
        (
            "host1".to_owned(),
            600,
            2,
            "fake1+fake2".to_owned(),
            "up".to_owned()
        )
    );

    // A listing that does not say when it was taken needs --taken-at, for one file at a time.
    let old =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/slurm-nodes/sinfo_21_08_5.json");
    let output = run_import_with(&app, "sinfo-json", &old, &[]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("give --taken-at with one file"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = run_import_with(
        &app,
        "sinfo-json",
        &old,
        &["--taken-at", "2026-11-02T00:00:00Z"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("intervals 0"));
}
