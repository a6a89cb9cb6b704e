//! `taskledger import`: JSON, NDJSON and CSV files through the same validation and storage.

use std::path::PathBuf;

use serde_json::json;

use crate::common::TestApp;
use crate::fixtures;

fn write(dir: &tempfile::TempDir, name: &str, content: &str) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path
}

fn record(task: &str) -> serde_json::Value {
    fixtures::record(task, "2026-11-10T00:00:00Z", "2026-11-10T10:00:00Z")
        .gpu_model("A100")
        .gpu_seconds_busy(36000)
        .output(500, "samples")
        .into()
}

const CSV: &str = "\
project,task_id,attempt,gpu_model,gpu_count,billing_mode,started_at,ended_at,gpu_seconds_busy,outcome,output.quantity,output.unit,label.team,label.ci_run
vision,c1,1,H100,8,spot,2026-11-20T10:00:00Z,2026-11-20T11:30:00Z,,preempted,,,perception,4711
vision,c1,2,H100,8,spot,2026-11-20T12:00:00Z,2026-11-20T14:00:00Z,,completed,1000000,tokens,perception,4712
vision,c2,1,H100,0,spot,2026-11-20T12:00:00Z,2026-11-20T14:00:00Z,,completed,,,perception,4713
vision,c3,1,H100,1
";

#[tokio::test]
async fn files_of_every_format_are_imported_and_rejections_are_located() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let dir = tempfile::tempdir().unwrap();
    let array = write(
        &dir,
        "records.json",
        &serde_json::to_string(&json!([record("a1"), record("a2")])).unwrap(),
    );
    let mut conflicting = record("a1");
    conflicting["outcome"] = json!("failed");
    let ndjson = write(
        &dir,
        "records.ndjson",
        &format!(
            "{}\n\n{}\n{{broken\n{}\n",
            record("n1"),
            record("a2"),
            conflicting
        ),
    );
    let csv = write(&dir, "records.csv", CSV);

    let summary = taskledger::ledger::import::import_files(
        &app.pool,
        &[array, ndjson, csv],
        &Default::default(),
    )
    .await
    .unwrap();
    assert_eq!(summary.accepted, 5, "a1, a2, n1, c1/1, c1/2");
    assert_eq!(summary.duplicates, 1, "a2 again");
    // The rollup rows it appended are folded in before it returns.
    let pending =
        taskledger::store::rollups::pending_deltas(&mut app.pool.acquire().await.unwrap())
            .await
            .unwrap();
    assert_eq!(pending, 0);
    let rated: i64 = sqlx::query_scalar("SELECT count(*) FROM rated_records")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(rated, 5);
    let rejected: Vec<(String, String)> = summary
        .rejected
        .iter()
        .map(|r| {
            let file = std::path::Path::new(&r.location)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (file, r.reason.clone())
        })
        .collect();
    assert_eq!(rejected.len(), 4, "{rejected:?}");
    assert!(
        rejected
            .iter()
            .any(|(at, why)| at == "records.ndjson:4" && why.contains("not valid JSON"))
    );
    assert!(
        rejected
            .iter()
            .any(|(at, why)| at == "records.ndjson:5" && why.contains("different content"))
    );
    assert!(
        rejected
            .iter()
            .any(|(at, why)| at == "records.csv:4" && why.starts_with("gpu_count"))
    );
    assert!(
        rejected
            .iter()
            .any(|(at, why)| at == "records.csv:5" && why.contains("malformed CSV row"))
    );

    let stored = app
        .get("/v1/projects/vision/job-records/c1/2", &app.admin)
        .await
        .json();
    assert_eq!(
        stored["record"]["labels"],
        json!({"team": "perception", "ci_run": "4712"})
    );
    assert_eq!(
        stored["record"]["output"],
        json!({"quantity": "1000000", "unit": "tokens"})
    );
    assert_eq!(stored["record"]["billing_mode"], "spot");
}

#[tokio::test]
async fn the_command_exits_non_zero_when_anything_was_rejected() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        &dir,
        "good.ndjson",
        &format!("{}\n{}\n", record("g1"), record("g2")),
    );
    let run = |file: &PathBuf| {
        std::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .arg("--database-url")
            .arg(&app.database_url)
            .arg("import")
            .arg(file)
            .output()
            .unwrap()
    };
    let first = run(&good);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert!(
        String::from_utf8_lossy(&first.stdout).contains("accepted 2, duplicates 0, rejected 0")
    );
    let replay = run(&good);
    assert!(
        String::from_utf8_lossy(&replay.stdout).contains("accepted 0, duplicates 2, rejected 0")
    );

    let mut bad_record = record("b1");
    bad_record["ended_at"] = json!("2026-11-09T00:00:00Z");
    let bad = write(
        &dir,
        "bad.ndjson",
        &format!("{}\n{}\n", record("g3"), bad_record),
    );
    let outcome = run(&bad);
    assert!(!outcome.status.success());
    let stdout = String::from_utf8_lossy(&outcome.stdout);
    assert!(
        stdout.contains("accepted 1, duplicates 0, rejected 1"),
        "{stdout}"
    );
    assert!(stdout.contains("bad.ndjson:2: ended_at"), "{stdout}");
    let unknown = write(&dir, "records.txt", "");
    assert!(!run(&unknown).status.success());
}
