//! Right-sizing recommendations (COST_MODEL.md §8) on a hand-built November: which workloads
//! on whole H100s fit a MIG slice or a cheaper card, and what that would have saved.

use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, dec};
use crate::fixtures::{Record, contract, record};

const RECOMMENDATIONS: &str = "/v1/projects/vision/recommendations?month=2026-11";

fn workload(task: &str, name: &str, from: &str, to: &str) -> Record {
    record(task, from, to).label("workload", name)
}

/// November 2026, H100 on demand at 2.50 per GPU-hour:
///
/// | workload | records (GPUs × hours) | memory peaks GiB | SM active | cost |
/// | --- | --- | --- | --- | --- |
/// | chat-7b (inference) | 2 × 1, 1 × 1, 1 × 2 | 18, 20, 19 | 0.30, 0.25, 0.28 | 5 + 2.50 + 5 = 12.50 |
/// | pretrain (training) | 8 × 1 three times | 70, 68, 66 | 0.90 each | 3 × 20 = 60 |
/// | eval | 1 × 1 twice | 10, 12 | 0.2 each | 5 |
/// | embed | 1 × 1 three times | 28, 30, 25 | 0.65, 0.60, 0.50 | 7.50 |
/// | legacy (task id) | 1 × 1, no telemetry | — | — | 2.50 |
///
/// and chat-7b once on a 3g.40gb slice, which is not a whole GPU and is left out.
fn records() -> Vec<Record> {
    vec![
        workload(
            "c1",
            "chat-7b",
            "2026-11-02T10:00:00Z",
            "2026-11-02T11:00:00Z",
        )
        .gpu_count(2)
        .with("memory_peak_gib", 18)
        .with("sm_active", "0.30"),
        workload(
            "c2",
            "chat-7b",
            "2026-11-03T10:00:00Z",
            "2026-11-03T11:00:00Z",
        )
        .with("memory_peak_gib", 20)
        .with("sm_active", "0.25"),
        workload(
            "c3",
            "chat-7b",
            "2026-11-04T10:00:00Z",
            "2026-11-04T12:00:00Z",
        )
        .with("memory_peak_gib", 19)
        .with("sm_active", "0.28"),
        workload(
            "c4",
            "chat-7b",
            "2026-11-05T10:00:00Z",
            "2026-11-05T11:00:00Z",
        )
        .with("mig_profile", "3g.40gb")
        .with("memory_peak_gib", 39)
        .with("sm_active", "0.99"),
        workload(
            "p1",
            "pretrain",
            "2026-11-06T00:00:00Z",
            "2026-11-06T01:00:00Z",
        )
        .gpu_count(8)
        .with("memory_peak_gib", 70)
        .with("sm_active", "0.9"),
        workload(
            "p2",
            "pretrain",
            "2026-11-07T00:00:00Z",
            "2026-11-07T01:00:00Z",
        )
        .gpu_count(8)
        .with("memory_peak_gib", 68)
        .with("sm_active", "0.9"),
        workload(
            "p3",
            "pretrain",
            "2026-11-08T00:00:00Z",
            "2026-11-08T01:00:00Z",
        )
        .gpu_count(8)
        .with("memory_peak_gib", 66)
        .with("sm_active", "0.9"),
        workload("e1", "eval", "2026-11-09T00:00:00Z", "2026-11-09T01:00:00Z")
            .with("memory_peak_gib", 10)
            .with("sm_active", "0.2"),
        workload("e2", "eval", "2026-11-10T00:00:00Z", "2026-11-10T01:00:00Z")
            .with("memory_peak_gib", 12)
            .with("sm_active", "0.2"),
        workload(
            "m1",
            "embed",
            "2026-11-11T00:00:00Z",
            "2026-11-11T01:00:00Z",
        )
        .with("memory_peak_gib", 28)
        .with("sm_active", "0.65"),
        workload(
            "m2",
            "embed",
            "2026-11-12T00:00:00Z",
            "2026-11-12T01:00:00Z",
        )
        .with("memory_peak_gib", 30)
        .with("sm_active", "0.60"),
        workload(
            "m3",
            "embed",
            "2026-11-13T00:00:00Z",
            "2026-11-13T01:00:00Z",
        )
        .with("memory_peak_gib", 25)
        .with("sm_active", "0.50"),
        record("legacy", "2026-11-14T00:00:00Z", "2026-11-14T01:00:00Z"),
    ]
}

async fn app_with_records() -> TestApp {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    app.create_project("other", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    app.ingest(records()).await;
    app
}

fn exact(raw: &str) -> Decimal {
    raw.parse().unwrap()
}

fn find<'a>(list: &'a Value, workload: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|w| w["workload"] == workload)
        .unwrap_or_else(|| panic!("no workload {workload} in {list}"))
}

async fn recommendations(app: &TestApp) -> Value {
    let response = app.get(RECOMMENDATIONS, &app.admin).await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

#[tokio::test]
async fn an_inference_workload_on_whole_h100s_gets_a_3g_40gb_slice_and_a_training_one_none() {
    let app = app_with_records().await;
    let view = recommendations(&app).await;
    assert_eq!(view["project"], "vision");
    assert_eq!(view["month"], "2026-11");
    assert_eq!(view["currency"], "USD");

    // Only H100 contracts: embed fits no slice (below) and there is no other card.
    let items = view["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{view}");
    let chat = &items[0];
    assert_eq!(chat["workload"], "chat-7b");
    assert_eq!(chat["gpu_model"], "H100");
    // c1–c3; c4 ran on a slice already.
    assert_eq!(chat["records"], 3);
    assert_money(&chat["gpus"], "2");
    // p95 by nearest rank of 3 values is the ⌈0.95 × 3⌉ = 3rd smallest: 20 GiB and 0.30.
    assert_money(&chat["memory_peak_p95_gib"], "20");
    assert_money(&chat["sm_active_p95"], "0.3");
    // With 20 % headroom: 20 × 1.2 = 24 GiB and 0.3 × 1.2 = 0.36 of the card. Of the H100's
    // profiles, smallest first: 1g.10gb (10 < 24), 1g.20gb (20 < 24) and 2g.20gb (20 < 24,
    // and 2/7 = 0.2857 < 0.36) fail; 3g.40gb has 40 ≥ 24 and 3/7 = 0.4286 ≥ 0.36.
    assert_eq!(
        chat["recommendation"],
        json!({"kind": "mig", "profile": "3g.40gb", "memory_gib": 40, "share": "0.428571"})
    );
    // Cost: c1 2 GPU-h + c2 1 GPU-h + c3 2 GPU-h = 5 GPU-h × 2.50 = 12.50; a slice costs 3/7
    // of it, so the saving is 12.50 × 4/7 = 7.142857…
    assert_money(&chat["period_cost"], "12.50");
    let saving = dec(&chat["estimated_saving"]);
    assert_eq!(saving.round_dp(2), exact("7.14"));
    assert_eq!(
        saving.round_dp(18),
        (exact("12.50") * Decimal::from(4) / Decimal::from(7)).round_dp(18)
    );
    assert_eq!(chat["currency"], "USD");
    assert!(
        chat["assumption"]
            .as_str()
            .unwrap()
            .starts_with("Assumes the same run time on one 3g.40gb slice per GPU")
    );

    let skipped = &view["skipped"];
    // 70 × 1.2 = 84 GiB > the H100's 80: no slice, not even the whole card, and no other model.
    let pretrain = find(skipped, "pretrain");
    assert_eq!(pretrain["records"], 3);
    assert_money(&pretrain["period_cost"], "60");
    let reason = pretrain["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("needs 84 GiB of memory (p95 peak 70 GiB + 20 %)"),
        "{reason}"
    );
    // Two records reporting memory are too few to judge.
    let eval = find(skipped, "eval");
    assert_eq!(eval["records"], 2);
    assert_eq!(
        eval["reason"],
        "2 of its records reported memory_peak_gib; at least 3 are needed to judge its size"
    );
    // embed needs 30 × 1.2 = 36 GiB and 0.65 × 1.2 = 0.78 of the card: more than 4/7.
    assert!(
        find(skipped, "embed")["reason"]
            .as_str()
            .unwrap()
            .contains("0.78 of the card's compute")
    );
    assert_eq!(skipped.as_array().unwrap().len(), 3);
    // legacy reported nothing: counted, not listed.
    assert_eq!(view["workloads_without_telemetry"], 1);
}

#[tokio::test]
async fn a_workload_that_fits_no_slice_moves_to_the_cheapest_card_its_contracts_allow() {
    let app = app_with_records().await;
    // L40S (48 GiB) for everyone at 1.00, for vision at 1.25: rating prefers the project's
    // contract, dearer as it is. Another project's 0.10 never applies to vision.
    contract("L40S", "on_demand", "1.00").create(&app).await;
    contract("L40S", "on_demand", "1.25")
        .project("vision")
        .create(&app)
        .await;
    contract("L40S", "on_demand", "0.10")
        .project("other")
        .create(&app)
        .await;
    // An A100 (40 GiB ≥ 36) at 2.00 is cheaper than the H100 but dearer than the L40S; a spot
    // L4 at 0.10 prices no on-demand time (and its 24 GiB are too few anyway).
    contract("A100", "on_demand", "2.00").create(&app).await;
    contract("L4", "spot", "0.10").create(&app).await;
    let view = recommendations(&app).await;

    let embed = find(&view["items"], "embed");
    // 36 GiB fit 48 GiB; 3 GPU-hours cost 7.50 on H100s and would cost 3 × 1.25 = 3.75 on the
    // project's L40S contract: a share of 0.5, saving 3.75.
    assert_eq!(
        embed["recommendation"],
        json!({"kind": "gpu_model", "gpu_model": "L40S", "memory_gib": 48, "share": "0.5"})
    );
    assert_money(&embed["period_cost"], "7.50");
    assert_money(&embed["estimated_saving"], "3.75");
    assert!(
        embed["assumption"]
            .as_str()
            .unwrap()
            .contains("Only memory was compared")
    );
    // chat-7b keeps its slice (a slice comes first), and the largest saving leads.
    let order: Vec<&str> = view["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["workload"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["chat-7b", "embed"]);
    // 84 GiB fit neither an L40S nor an A100.
    assert!(find(&view["skipped"], "pretrain")["reason"].is_string());
}

#[tokio::test]
async fn recommendations_are_for_the_projects_readers_and_need_a_month() {
    let app = app_with_records().await;
    let reader = app.token("reader", &["vision"]).await;
    let outsider = app.token("reader", &["other"]).await;
    assert_eq!(
        app.get(RECOMMENDATIONS, &reader).await.status,
        StatusCode::OK
    );
    app.get(RECOMMENDATIONS, &outsider)
        .await
        .problem(StatusCode::NOT_FOUND);
    for (query, pointer) in [
        ("", "query:month"),
        ("?month=2026-13", "query:month"),
        ("?month=2026-11&group_by=day", "query:group_by"),
    ] {
        let response = app
            .get(
                &format!("/v1/projects/vision/recommendations{query}"),
                &reader,
            )
            .await;
        response.problem(StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(response.pointers(), [pointer], "{query}");
    }
    // A month without records has nothing to say.
    let empty = app
        .get("/v1/projects/vision/recommendations?month=2026-10", &reader)
        .await
        .json();
    assert_eq!(empty["items"], json!([]));
    assert_eq!(empty["skipped"], json!([]));
    assert_eq!(empty["workloads_without_telemetry"], 0);
}
