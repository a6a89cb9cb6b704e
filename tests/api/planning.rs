//! Commitment planning: how many GPUs to reserve, from the ledger's hourly use, checked
//! against figures worked out by hand.

use axum::http::StatusCode;
use rust_decimal::Decimal;
use serde_json::{Value, json};

use crate::common::{TestApp, assert_money, dec};
use crate::fixtures::{contract, record};

const WINDOW: &str = "from=2026-11-02T00:00:00Z&to=2026-11-02T10:00:00Z";

fn a100(task: &str, from: &str, until: &str, gpus: u32, mode: &str) -> crate::fixtures::Record {
    record(
        task,
        &format!("2026-11-02T{from}:00Z"),
        &format!("2026-11-02T{until}:00Z"),
    )
    .gpu_model("A100")
    .gpu_count(gpus)
    .billing_mode(mode)
}

/// Ten hours of A100 use on 2 November: 4 GPUs in use for 2 hours, 2 for 3, 1 for 3 and
/// none for 2 (on-demand and reserved records), beside spot attempts, one preempted.
/// Reserved at 1.00 a GPU-hour committing 3 GPUs, on-demand at 2.50, spot at 0.80 (USD).
pub(crate) async fn ten_hours() -> TestApp {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let month = |c: crate::fixtures::Contract| {
        c.valid_from("2026-11-01T00:00:00Z")
            .valid_until("2026-12-01T00:00:00Z")
    };
    month(contract("A100", "reserved", "1.00").named("A100 reserved"))
        .committed_gpus(3)
        .create(&app)
        .await;
    month(contract("A100", "on_demand", "2.50").named("A100 on demand"))
        .create(&app)
        .await;
    month(contract("A100", "spot", "0.80").named("A100 spot"))
        .create(&app)
        .await;
    app.ingest(vec![
        a100("a", "00:00", "05:00", 2, "on_demand").with("nodes", json!(["n1"])),
        a100("b", "00:00", "02:00", 2, "reserved"),
        a100("c", "05:00", "08:00", 1, "on_demand").provider("aws"),
        a100("s1", "08:00", "09:00", 1, "spot"),
        a100("s2", "08:00", "08:30", 2, "spot").outcome("preempted"),
        a100("s2", "08:30", "09:00", 2, "spot").attempt(2),
    ])
    .await;
    app
}

async fn plan(app: &TestApp, query: &str) -> Value {
    let response = app
        .get(&format!("/v1/planning/reservations?{query}"), &app.admin)
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    response.json()
}

fn curve(plan: &Value) -> Vec<(u64, Decimal)> {
    plan["curve"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["gpus"].as_u64().unwrap(), dec(&p["cost"])))
        .collect()
}

fn hourly(plan: &Value) -> Vec<Decimal> {
    plan["hourly"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| dec(&h["gpu_hours"]))
        .collect()
}

fn decimals(values: &[i64]) -> Vec<Decimal> {
    values.iter().map(|v| Decimal::from(*v)).collect()
}

#[tokio::test]
async fn the_hourly_use_gives_the_hand_computed_curve_optimum_and_over_reserved_contract() {
    let app = ten_hours().await;
    let plan = plan(&app, &format!("gpu_model=A100&{WINDOW}")).await;
    assert_eq!(plan["hours"], 10);
    assert_eq!(plan["currency"], "USD");
    assert_eq!(hourly(&plan), decimals(&[4, 4, 2, 2, 2, 1, 1, 1, 0, 0]));
    assert_eq!(plan["hourly"][0]["hour"], "2026-11-02T00:00:00Z");
    assert_money(&plan["prices"]["reserved"]["price_per_gpu_hour"], "1");
    assert_eq!(plan["prices"]["reserved"]["contract_name"], "A100 reserved");
    assert_money(&plan["prices"]["on_demand"]["price_per_gpu_hour"], "2.5");
    assert_money(&plan["break_even_utilisation"], "0.4");
    assert_money(&plan["used_gpu_hours"], "17");
    assert_money(&plan["peak_gpus"], "4");
    // N × 1 × 10 + 2.5 × Σ max(0, u − N).
    let expected: Vec<(u64, Decimal)> = [(0, "42.5"), (1, "32.5"), (2, "30"), (3, "35"), (4, "40")]
        .iter()
        .map(|(n, c)| (*n, c.parse().unwrap()))
        .collect();
    assert_eq!(curve(&plan), expected);
    assert_eq!(plan["recommended_gpus"], 2);
    assert_money(&plan["cost_at_recommended"], "30");
    assert_eq!(plan["hours_above_recommended"], 2);
    assert_money(&plan["utilisation_at_recommended"], "0.65");
    // Today the reservation commits 3: 30 + 2.5 × 2 = 35.
    assert_money(&plan["committed_gpus_today"], "3");
    assert_money(&plan["cost_today"], "35");
    assert_money(&plan["saving"], "5");
    // The reservation rated only `b`: 4 of its 30 GPU-hours, below break-even 0.4.
    let held = &plan["contracts"].as_array().unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0]["name"], "A100 reserved");
    assert_money(&held[0]["committed_gpu_hours"], "30");
    assert_money(&held[0]["used_gpu_hours"], "4");
    assert_eq!(
        dec(&held[0]["utilisation"]),
        Decimal::from(4) / Decimal::from(30)
    );
    assert_money(&held[0]["break_even_utilisation"], "0.4");
    assert_eq!(held[0]["over_reserved"], true);
    assert_money(&held[0]["wasted"], "26");
    // The 13 on-demand GPU-hours at spot: 32.5 against 10.4, beside what spot saw.
    let spot = &plan["spot"];
    assert_money(&spot["on_demand_gpu_hours"], "13");
    assert_money(&spot["cost_on_demand"], "32.5");
    assert_money(&spot["cost_at_spot"], "10.4");
    assert_money(&spot["saving"], "22.1");
    assert_eq!(spot["observed"]["attempts"], 3);
    assert_eq!(spot["observed"]["preempted_attempts"], 1);
    assert_eq!(
        dec(&spot["observed"]["preemption_rate"]),
        Decimal::ONE / Decimal::from(3)
    );
    assert_money(&spot["observed"]["spot_gpu_hours"], "3");
    assert_money(&spot["observed"]["preempted_gpu_hours"], "1");
}

#[tokio::test]
async fn given_prices_and_another_currency_replace_the_contracts_and_ties_go_to_fewer_gpus() {
    let app = ten_hours().await;
    // r × H = 20 = 2.5 × 8 busier hours at N = 0: no commitment and one GPU cost the same.
    let given = plan(
        &app,
        &format!("gpu_model=A100&{WINDOW}&reserved_price=2&on_demand_price=2.5"),
    )
    .await;
    assert_eq!(given["prices"]["reserved"]["contract"], Value::Null);
    assert_money(&given["break_even_utilisation"], "0.8");
    assert_money(&given["curve"][0]["cost"], "42.5");
    assert_money(&given["curve"][1]["cost"], "42.5");
    assert_eq!(given["recommended_gpus"], 0);
    assert_money(&given["cost_at_recommended"], "42.5");
    assert_money(&given["contracts"][0]["break_even_utilisation"], "0.4");

    // In EUR at 0.9 a dollar: every contract price and cost converted.
    let refused = app
        .get(
            &format!("/v1/planning/reservations?gpu_model=A100&{WINDOW}&currency=EUR"),
            &app.admin,
        )
        .await;
    assert_eq!(refused.pointers(), ["query:currency"]);
    let response = app
        .put(
            "/v1/fx-rates/2026-11/USD/EUR",
            &app.admin,
            json!({"rate": "0.9"}),
        )
        .await;
    assert!(response.status.is_success(), "{}", response.text());
    let euros = plan(&app, &format!("gpu_model=A100&{WINDOW}&currency=EUR")).await;
    assert_eq!(euros["currency"], "EUR");
    assert_money(&euros["prices"]["on_demand"]["price_per_gpu_hour"], "2.25");
    assert_money(&euros["prices"]["on_demand"]["contract_price"], "2.5");
    assert_eq!(euros["prices"]["on_demand"]["contract_currency"], "USD");
    assert_eq!(euros["recommended_gpus"], 2);
    assert_money(&euros["cost_at_recommended"], "27");
    assert_money(&euros["contracts"][0]["wasted"], "23.4");
    assert_money(&euros["spot"]["cost_at_spot"], "9.36");
}

#[tokio::test]
async fn a_pool_or_a_provider_narrows_the_use_read() {
    let app = ten_hours().await;
    let response = app
        .put("/v1/pools/train", &app.admin, json!({"name": "Training"}))
        .await;
    assert!(response.status.is_success(), "{}", response.text());
    let response = app
        .post(
            "/v1/capacity",
            &app.admin,
            json!([{"node": "n1", "pool": "train", "gpu_model": "A100", "gpus": 8,
                    "billing_mode": "on_demand", "from": "2026-11-02T00:00:00Z",
                    "until": "2026-11-02T10:00:00Z", "state": "up"}]),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let pool = plan(&app, &format!("gpu_model=A100&{WINDOW}&pool=train")).await;
    assert_eq!(hourly(&pool), decimals(&[2, 2, 2, 2, 2, 0, 0, 0, 0, 0]));
    let aws = plan(&app, &format!("gpu_model=A100&{WINDOW}&provider=aws")).await;
    assert_eq!(hourly(&aws), decimals(&[0, 0, 0, 0, 0, 1, 1, 1, 0, 0]));
    assert_eq!(aws["spot"]["observed"]["attempts"], 0);
    assert_eq!(aws["spot"]["observed"]["preemption_rate"], Value::Null);
}

#[tokio::test]
async fn bad_or_unpriced_questions_are_refused_with_their_field() {
    let app = ten_hours().await;
    let get = |query: &'static str| {
        let app = &app;
        async move {
            app.get(&format!("/v1/planning/reservations?{query}"), &app.admin)
                .await
        }
    };
    let response = get("from=2026-11-02&to=2026-11-01").await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(response.pointers(), ["query:gpu_model", "query:to"]);
    let response = get("gpu_model=A100&reserved_price=-1&currency=ABC&pool=No%20Such").await;
    assert_eq!(
        response.pointers(),
        ["query:pool", "query:reserved_price", "query:currency"]
    );
    let response = get("gpu_model=H100&from=2026-11-02&to=2026-11-03").await;
    assert_eq!(response.pointers(), ["query:reserved_price"]);
    let response = get("gpu_model=A100&from=2026-11-02&to=2026-11-03&pool=nowhere").await;
    assert_eq!(response.pointers(), ["query:pool"]);
    let response = get("gpu_model=A100&month=2026-11&bogus=1").await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    // A project's reader does not plan the company's reservations.
    let team = app.token("reader", &["vision"]).await;
    let response = app
        .get("/v1/planning/reservations?gpu_model=A100", &team)
        .await;
    assert_eq!(response.status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn the_command_line_prints_the_same_plan_as_a_table() {
    let app = ten_hours().await;
    let plan_cli = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .args(["--database-url", &app.database_url, "plan", "reservations"])
            .args(args)
            .output()
            .unwrap()
    };
    let window = [
        "--from",
        "2026-11-02T00:00:00Z",
        "--to",
        "2026-11-02T10:00:00Z",
    ];
    let output = plan_cli(&[&["--gpu-model", "A100"][..], &window].concat());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("recommended  2 GPUs"), "{stdout}");
    assert!(stdout.contains("30.00"), "{stdout}");
    assert!(stdout.contains("A100 reserved"), "{stdout}");
    assert!(stdout.contains("over-reserved"), "{stdout}");
    let json = plan_cli(&[&["--gpu-model", "A100", "--format", "json"][..], &window].concat());
    let printed: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(
        printed,
        plan(&app, &format!("gpu_model=A100&{WINDOW}")).await
    );
    let refused = plan_cli(&["--gpu-model", "V100", "--month", "2026-11"]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--reserved-price"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
