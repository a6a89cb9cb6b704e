//! Efficiency (COST_MODEL §11): model FLOPs utilisation per record, group and task, on whole
//! GPUs and on a MIG slice, cost per effective GPU-hour, and the records refused because
//! their FLOPs could not have happened. Figures are worked out by hand in the comments.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, cost};
use crate::fixtures::{contract, record};

const NOVEMBER: &str = "/v1/projects/vision/cost?month=2026-11&as_of=2027-01-01T00:00:00Z";

/// H100 at 2 an hour and A100 at 1, on demand.
pub(crate) async fn priced_app_at(settings: taskledger::config::Settings) -> TestApp {
    let app = TestApp::spawn_with(settings).await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2").create(&app).await;
    contract("A100", "on_demand", "1").create(&app).await;
    app
}

async fn priced_app() -> TestApp {
    priced_app_at(taskledger::config::Settings::default()).await
}

/// The dense bf16 peaks of the catalogue: H100 (SXM) 989.5 TFLOPS, A100 312 TFLOPS.
///
/// - `train`: 2 H100 for an hour, 7,200 GPU-s; at the peak 7.1244e18 FLOPs, it did half:
///   3.5622e18, MFU 0.5. Cost 4.
/// - `infer`: 1 A100 for an hour; at the peak 1.1232e18, it did a quarter: 2.808e17. Cost 1.
/// - `slice`: one 3g.40gb slice of an H100 (3/7 of the card) for 70 minutes: 4,200
///   slice-seconds × 989.5e12 × 3/7 = 1.7811e18 at the peak; it did half, 8.9055e17. Cost
///   2 × 3/7 × 7/6 = 1.
/// - `plain`: 1 H100 for an hour, no FLOPs reported. Cost 2.
pub(crate) fn records() -> Vec<crate::fixtures::Record> {
    vec![
        record("train", "2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z")
            .gpu_count(2)
            .with("model_flops", "3562200000000000000")
            .with("precision", "bf16"),
        record("infer", "2026-11-02T12:00:00Z", "2026-11-02T13:00:00Z")
            .gpu_model("A100")
            .with("model_flops", "2.808e17")
            .with("precision", "bf16"),
        record("slice", "2026-11-02T14:00:00Z", "2026-11-02T15:10:00Z")
            .with("mig_profile", "3g.40gb")
            .with("model_flops", "890550000000000000")
            .with("precision", "bf16"),
        record("plain", "2026-11-02T16:00:00Z", "2026-11-02T17:00:00Z"),
    ]
}

fn unprocessable(response: &crate::common::TestResponse) -> Vec<String> {
    assert_eq!(
        response.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        response.text()
    );
    response.pointers()
}

#[tokio::test]
async fn mfu_is_flops_over_peak_times_held_for_records_groups_and_tasks() {
    let app = priced_app().await;
    app.ingest(records()).await;

    // Whole month: FLOPs 4.73355e18 of 1.00287e19 at the peak, MFU 0.472000 (to 6 places),
    // over 15,000 of 18,600 GPU-seconds. Cost 8 over 18,600 s: 1.548387… an hour, and over
    // MFU 0.472 that is 3.280481… a GPU-hour at the peak.
    let month = cost(&app, NOVEMBER).await;
    assert_money(&month["total"], "8");
    assert_money(&month["mfu"]["value"], "0.472");
    assert_money(&month["mfu"]["coverage"], "0.806452");
    assert_money(&month["cost_per_gpu_hour"], "1.54838709677419354839");
    assert_money(
        &month["cost_per_effective_gpu_hour"],
        "3.28048113723346090761",
    );

    // By model: the H100s did half their peak (whole cards and the slice alike) over
    // 11,400 of 15,000 GPU-seconds; cost 7 over 15,000 s is 1.68 an hour, 3.36 at MFU 0.5.
    // The A100 a quarter, fully covered: 1 an hour, 4 at the peak.
    let by_model = cost(&app, &format!("{NOVEMBER}&group_by=gpu_model")).await;
    let group = |key: &str| -> Value {
        by_model["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["key"] == key)
            .unwrap_or_else(|| panic!("no group {key}: {by_model}"))
            .clone()
    };
    let h100 = group("H100");
    assert_money(&h100["mfu"]["value"], "0.5");
    assert_money(&h100["mfu"]["coverage"], "0.76");
    assert_money(&h100["cost_per_gpu_hour"], "1.68");
    assert_money(&h100["cost_per_effective_gpu_hour"], "3.36");
    let a100 = group("A100");
    assert_money(&a100["mfu"]["value"], "0.25");
    assert_money(&a100["mfu"]["coverage"], "1");
    assert_money(&a100["cost_per_effective_gpu_hour"], "4");

    // Tasks: each its own MFU, and none for the one that did not report FLOPs.
    let list = app
        .get(
            "/v1/projects/vision/tasks?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z",
            &app.admin,
        )
        .await;
    assert_eq!(list.status, StatusCode::OK, "{}", list.text());
    let list = list.json();
    let task = |id: &str| -> Value {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["task_id"] == id)
            .unwrap()
            .clone()
    };
    assert_money(&task("train")["mfu"]["value"], "0.5");
    assert_money(&task("infer")["mfu"]["value"], "0.25");
    assert_money(&task("slice")["mfu"]["value"], "0.5");
    assert_money(&task("slice")["mfu"]["coverage"], "1");
    assert_eq!(task("plain")["mfu"], Value::Null);

    // The attempt and the stored record say what they were measured against: a third of…
    // three sevenths of the H100's 989.5 TFLOPS for the slice.
    let detail = app
        .get("/v1/projects/vision/tasks/slice", &app.admin)
        .await
        .json();
    assert_money(&detail["mfu"]["value"], "0.5");
    let attempt = &detail["attempts"][0];
    assert_money(&attempt["mfu"], "0.5");
    assert_eq!(attempt["precision"], "bf16");
    assert_money(&attempt["model_flops"], "890550000000000000");
    assert_money(&attempt["peak_flops"], "424071428571428.57142857142857");
    let stored = app
        .get("/v1/projects/vision/job-records/infer/1", &app.admin)
        .await
        .json()["record"]
        .clone();
    assert_money(&stored["peak_flops"], "312000000000000");
    assert_money(&stored["mfu"], "0.25");

    // The task CSV carries MFU and its coverage.
    let csv = app
        .get(
            "/v1/projects/vision/tasks?from=2026-11-01T00:00:00Z&to=2026-12-01T00:00:00Z&format=csv",
            &app.admin,
        )
        .await;
    assert_eq!(csv.status, StatusCode::OK, "{}", csv.text());
    let mut reader = csv::Reader::from_reader(csv.body.as_slice());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let mfu_column = header.iter().position(|h| h == "mfu").unwrap();
    let rows: Vec<Vec<String>> = reader
        .records()
        .map(|row| row.unwrap().iter().map(str::to_owned).collect())
        .collect();
    let infer = rows.iter().find(|row| row[0] == "infer").unwrap();
    assert_eq!(infer[mfu_column], "0.25");
    assert_eq!(infer[mfu_column + 1], "1");

    // A correction that adds FLOPs to `plain` (a quarter of its peak) brings it in: the
    // month's MFU is now (4.73355e18 + 8.9055e17) ÷ (1.00287e19 + 3.5622e18) = 0.413814,
    // fully covered.
    let corrected = app
        .put(
            "/v1/projects/vision/job-records/plain/1",
            &app.admin,
            record("plain", "2026-11-02T16:00:00Z", "2026-11-02T17:00:00Z")
                .with("model_flops", "890550000000000000")
                .with("precision", "bf16")
                .correction(),
        )
        .await;
    assert_eq!(corrected.status, StatusCode::OK, "{}", corrected.text());
    let month = cost(&app, NOVEMBER).await;
    assert_money(&month["mfu"]["value"], "0.413814");
    assert_money(&month["mfu"]["coverage"], "1");
}

#[tokio::test]
async fn flops_a_card_could_not_have_done_are_refused_and_unknown_peaks_are_not_guessed() {
    let app = priced_app().await;
    let post = |records: Value| {
        let app = &app;
        async move { app.post("/v1/job-records", &app.admin, records).await }
    };
    let hour = |task: &str| record(task, "2026-11-02T10:00:00Z", "2026-11-02T11:00:00Z");

    // One H100-hour at bf16 can do 3.5622e18 FLOPs; more is an MFU above 1.
    let above = post(json!([hour("over")
        .with("model_flops", "3.6e18")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(unprocessable(&above), vec!["/0/model_flops"]);
    assert!(above.text().contains("MFU above 1"), "{}", above.text());
    // Exactly the peak is MFU 1, which is allowed.
    let at_peak = post(json!([hour("peak")
        .with("model_flops", "3562200000000000000")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(at_peak.status, StatusCode::OK, "{}", at_peak.text());
    // The same FLOPs on a 1g slice (1/7 of the card) are far above its peak.
    let slice = post(json!([hour("small")
        .with("mig_profile", "1g.10gb")
        .with("model_flops", "1e18")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(unprocessable(&slice), vec!["/0/model_flops"]);

    let missing = post(json!([hour("a").with("model_flops", "1e15")])).await;
    assert_eq!(unprocessable(&missing), vec!["/0/precision"]);
    let unknown = post(json!([hour("b")
        .with("model_flops", "1e15")
        .with("precision", "int8")]))
    .await;
    assert_eq!(unprocessable(&unknown), vec!["/0/precision"]);
    let zero = post(json!([hour("c")
        .with("model_flops", "0")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(unprocessable(&zero), vec!["/0/model_flops"]);
    let text = post(json!([hour("d")
        .with("model_flops", "lots")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(unprocessable(&text), vec!["/0/model_flops"]);

    // An H20 has no published peak in the catalogue: its FLOPs are kept, its MFU unknown,
    // and the month's MFU covers only the record with a peak.
    let h20 = post(json!([hour("h20")
        .gpu_model("H20")
        .with("model_flops", "1e18")
        .with("precision", "bf16")]))
    .await;
    assert_eq!(h20.status, StatusCode::OK, "{}", h20.text());
    let stored = app
        .get("/v1/projects/vision/job-records/h20/1", &app.admin)
        .await
        .json()["record"]
        .clone();
    assert_money(&stored["model_flops"], "1000000000000000000");
    assert_eq!(stored["peak_flops"], Value::Null);
    assert_eq!(stored["mfu"], Value::Null);
    let month = cost(&app, NOVEMBER).await;
    assert_money(&month["mfu"]["value"], "1");
    assert_money(&month["mfu"]["coverage"], "0.5");

    // The catalogue lists each model's peaks with their source.
    let catalogue = app.get("/v1/gpu-models", &app.admin).await;
    assert_eq!(catalogue.status, StatusCode::OK, "{}", catalogue.text());
    let catalogue = catalogue.json();
    let h100 = catalogue["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "H100 80GB")
        .unwrap()
        .clone();
    assert_money(&h100["peak_tflops"]["bf16"], "989.5");
    assert_money(&h100["peak_tflops"]["fp8"], "1979");
    assert!(h100["peak_source"].as_str().unwrap().contains("H100"));
    assert_eq!(h100["mig_profiles"][3]["name"], "3g.40gb");
    assert_money(&h100["mig_profiles"][3]["compute_share"], "0.428571");
}

/// Workload `chat`, in tokens, October against November.
///
/// - October: c1 on an A100 (1 an hour) for 10 hours makes 1,000 tokens. Cost 10 over 10
///   GPU-hours, all completed: 0.01 a token = 1 an hour × 0.01 GPU-hours a token × 1.
/// - November, moved to H100s (2 an hour): c2 runs 6 hours for 1,000 tokens; c3 fails after
///   2 hours and its retry runs 4 hours for 500. Cost 24 over 12 GPU-hours, 10 of them
///   completed, for 1,500 tokens: 0.016 a token = 2 × (10 ÷ 1,500) × 1.2.
/// - The ratio 1.6 = price 2 × throughput ⅔ × overhead 1.2; the price moved most.
///
/// A record of another workload and one of task `solo` (no label: its own workload) are
/// left out of `chat`.
pub(crate) fn workload_records() -> Vec<crate::fixtures::Record> {
    vec![
        record("c1", "2026-10-05T00:00:00Z", "2026-10-05T10:00:00Z")
            .gpu_model("A100")
            .label("workload", "chat")
            .output(1000, "tokens"),
        record("c2", "2026-11-05T00:00:00Z", "2026-11-05T06:00:00Z")
            .label("workload", "chat")
            .output(1000, "tokens"),
        record("c3", "2026-11-06T00:00:00Z", "2026-11-06T02:00:00Z")
            .label("workload", "chat")
            .outcome("failed"),
        record("c3", "2026-11-06T03:00:00Z", "2026-11-06T07:00:00Z")
            .attempt(2)
            .retries(1)
            .label("workload", "chat")
            .output(500, "tokens"),
        record("o1", "2026-11-07T00:00:00Z", "2026-11-07T05:00:00Z")
            .label("workload", "other")
            .output(10, "tokens"),
        record("solo", "2026-11-08T00:00:00Z", "2026-11-08T01:00:00Z").output(100, "tokens"),
    ]
}

#[tokio::test]
async fn a_change_in_cost_per_unit_splits_into_price_throughput_and_overhead() {
    let app = priced_app().await;
    app.ingest(workload_records()).await;
    let reader = app.token("reader", &["vision"]).await;
    let response = app
        .get(
            "/v1/projects/vision/efficiency?workload=chat&unit=tokens&month=2026-11&baseline_month=2026-10",
            &reader,
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let moved = response.json();
    assert_money(&moved["cost_per_unit"]["baseline"], "0.01");
    assert_money(&moved["cost_per_unit"]["period"], "0.016");
    assert_money(&moved["ratio"], "1.6");
    assert_money(&moved["factors"]["price"], "2");
    assert_money(&moved["factors"]["throughput"], "0.66666666666666666667");
    assert_money(&moved["factors"]["overhead"], "1.2");
    assert_eq!(moved["largest"], "price");

    let period = &moved["period"];
    assert_money(&period["cost"], "24");
    assert_money(&period["gpu_hours"], "12");
    assert_money(&period["completed_gpu_hours"], "10");
    assert_money(&period["quantity"], "1500");
    assert_money(&period["price_per_gpu_hour"], "2");
    assert_money(&period["overhead"], "1.2");
    assert_eq!(period["attempts"], 3);
    assert_eq!(period["failed_attempts"], 1);
    assert_eq!(period["retries"], 1);
    assert_eq!(period["gpu_models"].as_array().unwrap().len(), 1);
    assert_eq!(period["gpu_models"][0]["gpu_model"], "H100");
    assert_money(&period["gpu_models"][0]["gpu_hours"], "12");
    let baseline = &moved["baseline"];
    assert_eq!(baseline["gpu_models"][0]["gpu_model"], "A100");
    assert_money(&baseline["gpu_models"][0]["price_per_gpu_hour"], "1");
    assert_money(&baseline["gpu_hours_per_unit"], "0.01");
    assert_eq!(baseline["failed_attempts"], 0);

    // A record without a workload label is its task's own workload; with nothing in the
    // baseline there is no ratio.
    let solo = app
        .get(
            "/v1/projects/vision/efficiency?workload=solo&unit=tokens&month=2026-11",
            &reader,
        )
        .await
        .json();
    assert_money(&solo["cost_per_unit"]["period"], "0.02");
    assert_eq!(solo["cost_per_unit"]["baseline"], Value::Null);
    assert_eq!(solo["ratio"], Value::Null);
    assert_eq!(solo["largest"], Value::Null);
    // By default the baseline is as long as the period and ends where it starts.
    assert_eq!(solo["baseline"]["from"], "2026-10-02T00:00:00Z");
    assert_eq!(solo["baseline"]["to"], "2026-11-01T00:00:00Z");

    let overlapping = app
        .get(
            "/v1/projects/vision/efficiency?workload=chat&unit=tokens&month=2026-11&baseline_from=2026-10-15&baseline_to=2026-11-15",
            &reader,
        )
        .await;
    assert_eq!(unprocessable(&overlapping), vec!["query:baseline_from"]);
    let missing = app
        .get(
            "/v1/projects/vision/efficiency?workload=chat&month=2026-11",
            &reader,
        )
        .await;
    assert_eq!(unprocessable(&missing), vec!["query:unit"]);
    app.create_project("other", "USD").await;
    let other = app.token("reader", &["other"]).await;
    let hidden = app
        .get(
            "/v1/projects/vision/efficiency?workload=chat&unit=tokens&month=2026-11",
            &other,
        )
        .await;
    assert_eq!(hidden.status, StatusCode::NOT_FOUND);
}
