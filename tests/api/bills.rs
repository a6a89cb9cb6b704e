//! Cloud bills (FOCUS): a real export stored and reconciled to the last billed digit, billed
//! cost winning over contracts in capacity figures, GPU instances nobody reported becoming
//! capacity (and zombies), corrections, and bills racing capacity and records.

use std::collections::BTreeMap;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use rust_decimal::Decimal;
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};

use crate::common::{TestApp, TestResponse, assert_money};
use crate::fixtures::{contract, record};

const SAMPLE: &str = include_str!("../fixtures/focus/focus_sample.csv");

fn settings(now: &str) -> Settings {
    Settings {
        clock: Clock::Fixed(now.parse().unwrap()),
        ..Settings::default()
    }
}

pub(crate) async fn post_bill(
    app: &TestApp,
    path: &str,
    body: Vec<u8>,
    content_type: &str,
) -> TestResponse {
    let request = Request::post(path)
        .header(header::AUTHORIZATION, format!("Bearer {}", app.admin))
        .header(header::CONTENT_TYPE, content_type)
        .body(Body::from(body))
        .unwrap();
    app.send(request).await
}

/// Sums the `BilledCost` of a FOCUS CSV's rows of billing period `period` (`YYYY-MM`) by
/// (ProviderName, BillingCurrency), and that of those whose `ChargeDescription` names one of
/// `gpu_types`, read with nothing but the csv crate.
fn independent_sums(
    text: &str,
    period: &str,
    gpu_types: &[&str],
) -> (BTreeMap<(String, String), Decimal>, Decimal) {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader.headers().unwrap().clone();
    let at = |name: &str| headers.iter().position(|h| h == name).unwrap();
    let (cost, provider, currency, description, billing_period) = (
        at("BilledCost"),
        at("ProviderName"),
        at("BillingCurrency"),
        at("ChargeDescription"),
        at("BillingPeriodStart"),
    );
    let mut sums = BTreeMap::new();
    let mut gpu = Decimal::ZERO;
    for row in reader.records() {
        let row = row.unwrap();
        if !row[billing_period].starts_with(period) {
            continue;
        }
        let amount: Decimal = row[cost].parse().unwrap();
        *sums
            .entry((row[provider].to_owned(), row[currency].to_owned()))
            .or_default() += amount;
        if gpu_types.iter().any(|t| row[description].contains(t)) {
            gpu += amount;
        }
    }
    (sums, gpu)
}

fn provider<'a>(reconciliation: &'a Value, name: &str, currency: &str) -> &'a Value {
    reconciliation["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["provider"] == name && p["currency"] == currency)
        .unwrap_or_else(|| panic!("no {name} {currency} in {reconciliation}"))
}

fn money(value: &Value) -> Decimal {
    value.as_str().unwrap().parse().unwrap()
}

/// Every provider's billed total is capacity billed + unmatched, and capacity billed is
/// used + idle + down, exactly.
fn assert_reconciles(reconciliation: &Value) {
    for p in reconciliation["providers"].as_array().unwrap() {
        let unmatched: Decimal = p["unmatched"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| money(&u["cost"]))
            .sum();
        assert_eq!(
            money(&p["billed_total"]),
            money(&p["capacity_billed"]) + unmatched,
            "{p}"
        );
        assert_eq!(
            money(&p["capacity_billed"]),
            money(&p["used"]) + money(&p["idle"]) + money(&p["down"]),
            "{p}"
        );
    }
}

#[tokio::test]
async fn the_public_focus_sample_is_stored_once_and_reconciles_to_the_last_digit() {
    let app = TestApp::spawn().await;
    let response = post_bill(&app, "/v1/bills", SAMPLE.as_bytes().to_vec(), "text/csv").await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    let receipt = response.json();
    assert_eq!(receipt["rows"], 1000);
    assert_eq!(receipt["provider"], "AWS, Microsoft, Oracle");
    // One Oracle adjustment charged in September is billed in October's period.
    assert_eq!(receipt["months"], json!(["2024-09", "2024-10"]));
    assert_money(&receipt["billed_total"]["USD"], "20.52022672899");
    assert_eq!(receipt["capacity"]["pool"], "billed-aws");
    let gpu_rows = SAMPLE
        .lines()
        .filter(|l| l.contains("g5.4xlarge") || l.contains("g3.4xlarge"))
        .count();
    assert!(gpu_rows > 0);
    assert_eq!(receipt["matched_rows"], gpu_rows, "{receipt}");
    assert_eq!(
        receipt["unmatched_rows"].as_u64().unwrap() as usize,
        1000 - gpu_rows
    );

    let again = post_bill(&app, "/v1/bills", SAMPLE.as_bytes().to_vec(), "text/csv").await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(again.json()["duplicate"], true);
    assert_eq!(again.json()["bill_id"], receipt["bill_id"]);

    let reconciliation = app
        .get("/v1/reports/monthly/2024-09/reconciliation", &app.admin)
        .await;
    assert_eq!(
        reconciliation.status,
        StatusCode::OK,
        "{}",
        reconciliation.text()
    );
    let reconciliation = reconciliation.json();
    assert_reconciles(&reconciliation);
    let (sums, gpu) = independent_sums(SAMPLE, "2024-09", &["g5.4xlarge", "g3.4xlarge"]);
    for ((name, currency), total) in &sums {
        assert_eq!(
            money(&provider(&reconciliation, name, currency)["billed_total"]),
            *total,
            "{name}"
        );
    }
    let aws = provider(&reconciliation, "AWS", "USD");
    assert_eq!(money(&aws["capacity_billed"]), gpu);
    assert_eq!(
        money(&aws["idle"]),
        gpu,
        "no job ran on the billed instances"
    );
    assert_eq!(money(&aws["used"]), Decimal::ZERO);

    let pools = app
        .get("/v1/pools/billed-aws/utilisation?month=2024-09", &app.admin)
        .await;
    assert_eq!(pools.status, StatusCode::OK, "{}", pools.text());
    let pools = pools.json();
    assert_eq!(
        money(&pools["paid"]["cost"]).round_dp(10),
        gpu.round_dp(10),
        "{pools}"
    );
}

#[tokio::test]
async fn a_gzip_bill_reads_as_the_csv_and_a_bad_cell_is_named() {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let app = TestApp::spawn().await;
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(SAMPLE.as_bytes()).unwrap();
    let gz = encoder.finish().unwrap();
    let response = post_bill(&app, "/v1/bills", gz, "application/gzip").await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    assert_money(&response.json()["billed_total"]["USD"], "20.52022672899");

    let broken = SAMPLE.replacen("0.00000080000", "0.0000008O000", 1);
    let response = post_bill(&app, "/v1/bills", broken.into_bytes(), "text/csv").await;
    assert_eq!(response.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        response.text().contains("/rows/2/BilledCost"),
        "{}",
        response.text()
    );
    let response = post_bill(&app, "/v1/bills", b"a,b\n1,2".to_vec(), "application/json").await;
    assert_eq!(response.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

const HEADER: &str = "BilledCost,BillingAccountId,BillingCurrency,BillingPeriodStart,\
ChargeCategory,ChargeDescription,ChargePeriodEnd,ChargePeriodStart,ConsumedQuantity,\
ConsumedUnit,PricingCategory,ProviderName,RegionId,ResourceId,ServiceName,SkuId,Tags";

/// A bill in several providers and currencies, built in the shape of the FinOps sample's
/// rows (no public multi-currency export exists): node `a`'s instance `i-0aaa` billed 98.32
/// an hour 00:00–04:00 on 2 November 2026, a p4d.24xlarge `i-0zzz` nobody reported
/// 00:00–03:00 at 32.77, a storage row, and two Azure rows in EUR.
pub(crate) fn constructed_bill(first_hour: &str) -> String {
    let aws =
        |cost: &str, description: &str, resource: &str, from: &str, until: &str, sku: &str| {
            format!(
                "{cost},\"111\",\"USD\",\"2026-11-01 00:00:00\",\"Usage\",\"{description}\",\
             \"2026-11-02 {until}:00:00\",\"2026-11-02 {from}:00:00\",1.0,\"Hours\",\"Standard\",\
             \"AWS\",\"us-east-1\",\"{resource}\",\"Amazon Elastic Compute Cloud\",\"{sku}\",NULL"
            )
        };
    let p5 = "$98.32 per On Demand Linux p5.48xlarge Instance Hour";
    let p4d = "$32.77 per On Demand Linux p4d.24xlarge Instance Hour";
    let mut rows = vec![
        HEADER.to_owned(),
        aws(first_hour, p5, "i-0aaa", "00", "01", "P5"),
        aws("98.32", p5, "i-0aaa", "01", "02", "P5"),
        aws("98.32", p5, "i-0aaa", "02", "03", "P5"),
        aws("98.32", p5, "i-0aaa", "03", "04", "P5"),
        aws("32.77", p4d, "i-0zzz", "00", "01", "P4D"),
        aws("32.77", p4d, "i-0zzz", "01", "02", "P4D"),
        aws("32.77", p4d, "i-0zzz", "02", "03", "P4D"),
    ];
    rows.push(
        "0.023,\"111\",\"USD\",\"2026-11-01 00:00:00\",\"Usage\",\"$0.023 per GB-Mo\",\
         \"2026-11-03 00:00:00\",\"2026-11-02 00:00:00\",1.0,\"GB-Mo\",\"Standard\",\"AWS\",\
         \"us-east-1\",\"my-bucket\",\"Amazon Simple Storage Service\",\"S3\",NULL"
            .to_owned(),
    );
    rows.push(
        "1.5,\"/providers/Microsoft.Billing/billingAccounts/9\",EUR,2026-11-01T00:00:00Z,Usage,\
         Tables - LRS Data Stored,2026-11-03T00:00:00Z,2026-11-02T00:00:00Z,,,,Microsoft,\
         westeurope,/subscriptions/s/resourcegroups/rg/providers/microsoft.storage/storageaccounts/x,\
         Storage Accounts,1017069,\"{\"\"env\"\": \"\"prod\"\"}\""
            .to_owned(),
    );
    rows.push(
        "-0.25,\"/providers/Microsoft.Billing/billingAccounts/9\",EUR,2026-11-01T00:00:00Z,Credit,\
         Credit,2026-11-03T00:00:00Z,2026-11-02T00:00:00Z,,,,Microsoft,westeurope,NULL,\
         Storage Accounts,1017069,NULL"
            .to_owned(),
    );
    rows.join("\n")
}

/// Project `vision` (USD), H100 on demand at 2.00 under contract; pool `train` owned by
/// `vision` with node `a` (8 H100, provider id `aws:///us-east-1a/i-0aaa`) up 00:00–04:00 on
/// 2 November 2026, on which `vision` ran 2 GPUs for 2 hours; pool `billed` owned by
/// `vision` for the instances the bill shows, the only one with zombie alerts.
pub(crate) async fn billed_fleet() -> TestApp {
    let app = TestApp::spawn_with(settings("2026-11-02T08:00:00Z")).await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.00").create(&app).await;
    // Zombie alerts are judged only for the instances the bill shows.
    for (pool, name, zombie_after) in [
        ("train", "Training", Value::Null),
        ("billed", "From the bill", json!(120)),
    ] {
        let response = app
            .put(
                &format!("/v1/pools/{pool}"),
                &app.admin,
                json!({"name": name, "owner_project": "vision",
                       "zombie_after_minutes": zombie_after}),
            )
            .await;
        assert!(response.status.is_success(), "{}", response.text());
    }
    let response = app
        .post(
            "/v1/capacity",
            &app.admin,
            json!([{"node": "a", "pool": "train", "gpu_model": "H100", "gpus": 8,
                    "billing_mode": "on_demand", "labels": {"provider_id": "aws:///us-east-1a/i-0aaa"},
                    "from": "2026-11-02T00:00:00Z", "until": "2026-11-02T04:00:00Z", "state": "up"}]),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    app.ingest(json!([record(
        "r1",
        "2026-11-02T00:00:00Z",
        "2026-11-02T02:00:00Z"
    )
    .with("gpu_count", json!(2))
    .with("nodes", json!(["a"]))]))
        .await;
    app
}

#[tokio::test]
async fn billed_cost_wins_over_contracts_and_an_unreported_gpu_instance_is_a_zombie() {
    let app = billed_fleet().await;
    let before = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&before["paid"]["cost"], "64");

    let bill = constructed_bill("98.32");
    let response = post_bill(
        &app,
        "/v1/bills?pool=billed",
        bill.clone().into_bytes(),
        "text/csv",
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    let receipt = response.json();
    assert_eq!(receipt["provider"], "AWS, Microsoft");
    assert_eq!(receipt["matched_rows"], 7, "{receipt}");
    assert_eq!(
        receipt["capacity"],
        json!({"pool": "billed", "nodes": 1, "intervals": 1})
    );
    assert_money(&receipt["billed_total"]["USD"], "491.613");
    assert_money(&receipt["billed_total"]["EUR"], "1.25");

    // 4 × 98.32 over 32 paid GPU-hours: 12.29 a GPU-hour, not the contract's 2.00.
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&train["paid"]["cost"], "393.28");
    assert_money(&train["used"]["cost"], "49.16");
    assert_money(&train["idle"]["cost"], "344.12");
    let billed = app
        .get("/v1/pools/billed/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&billed["paid"]["gpu_hours"], "24");
    assert_money(&billed["paid"]["cost"], "98.31");

    let alerts: Vec<(String, String, Decimal)> = sqlx::query_as(
        "SELECT node, gpu_model, cost_per_hour FROM alert_events WHERE kind = 'zombie_capacity'",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        alerts,
        [(
            "i-0zzz".to_owned(),
            "A100".to_owned(),
            Decimal::new(3277, 2)
        )],
        "priced by the bill: no contract prices A100s"
    );

    let reconciliation = app
        .get("/v1/reports/monthly/2026-11/reconciliation", &app.admin)
        .await
        .json();
    assert_reconciles(&reconciliation);
    let aws = provider(&reconciliation, "AWS", "USD");
    assert_money(&aws["billed_total"], "491.613");
    assert_money(&aws["capacity_billed"], "491.59");
    assert_money(&aws["used"], "49.16");
    assert_money(&aws["down"], "0");
    assert_money(&aws["idle"], "442.43");
    assert_eq!(
        aws["unmatched"],
        json!([{"service": "Amazon Simple Storage Service", "sku": "S3", "rows": 1, "cost": "0.023"}])
    );
    assert_money(&aws["jobs_contract_cost"], "8");
    assert_money(&aws["price_variance"], "-41.16");
    let azure = provider(&reconciliation, "Microsoft", "EUR");
    assert_money(&azure["billed_total"], "1.25");
    assert_money(&azure["capacity_billed"], "0");

    // A corrected bill: the first hour of `a` billed 90.00 instead.
    let corrected = constructed_bill("90.00");
    let response = post_bill(
        &app,
        "/v1/bills?pool=billed",
        corrected.into_bytes(),
        "text/csv",
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    let receipt = response.json();
    assert_eq!(
        receipt["replaced"][0]["moved"],
        json!([{"service": "Amazon Elastic Compute Cloud", "sku": "P5", "currency": "USD",
                "before": "393.28", "after": "384.96"}]),
        "{receipt}"
    );
    assert_eq!(
        receipt["replaced"].as_array().unwrap().len(),
        1,
        "Azure's statement is unchanged"
    );
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&train["paid"]["cost"], "384.96");
    let billed = app
        .get("/v1/pools/billed/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&billed["paid"]["gpu_hours"], "24");
    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM capacity_intervals WHERE node = 'i-0zzz'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(
        count, 1,
        "the corrected bill replaced the capacity it created"
    );
}

/// Bills, corrections, capacity and records posted at the same time leave the figures a
/// sequential run leaves: the bill prices nodes when figures are read.
#[tokio::test]
async fn bills_racing_capacity_and_records_leave_the_figures_of_a_sequential_run() {
    async fn figures(app: &TestApp) -> (Value, Value) {
        let train = app
            .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
            .await
            .json();
        let reconciliation = app
            .get("/v1/reports/monthly/2026-11/reconciliation", &app.admin)
            .await
            .json();
        (train, reconciliation)
    }
    let more_capacity = json!([{"node": "a", "pool": "train", "gpu_model": "H100", "gpus": 8,
        "billing_mode": "on_demand", "labels": {"provider_id": "aws:///us-east-1a/i-0aaa"},
        "from": "2026-11-02T04:00:00Z", "until": "2026-11-02T06:00:00Z", "state": "down"}]);
    let more_records = json!(
        [record("r2", "2026-11-02T02:00:00Z", "2026-11-02T03:30:00Z")
            .with("gpu_count", json!(4))
            .with("nodes", json!(["a"]))]
    );

    let sequential = billed_fleet().await;
    post_bill(
        &sequential,
        "/v1/bills?pool=billed",
        constructed_bill("98.32").into_bytes(),
        "text/csv",
    )
    .await;
    sequential
        .post("/v1/capacity", &sequential.admin, more_capacity.clone())
        .await;
    sequential.ingest(more_records.clone()).await;
    post_bill(
        &sequential,
        "/v1/bills?pool=billed",
        constructed_bill("90.00").into_bytes(),
        "text/csv",
    )
    .await;
    let expected = figures(&sequential).await;
    // The bill prices 00:00–04:00 (384.96); the contract the down time 04:00–06:00 (16 × 2).
    assert_money(&expected.0["paid"]["cost"], "416.96");

    for _ in 0..3 {
        let app = billed_fleet().await;
        let (first, capacity, records) = tokio::join!(
            post_bill(
                &app,
                "/v1/bills?pool=billed",
                constructed_bill("98.32").into_bytes(),
                "text/csv"
            ),
            app.post("/v1/capacity", &app.admin, more_capacity.clone()),
            app.post("/v1/job-records", &app.admin, more_records.clone()),
        );
        assert!(first.status.is_success(), "{}", first.text());
        assert_eq!(capacity.status, StatusCode::OK, "{}", capacity.text());
        assert_eq!(records.status, StatusCode::OK, "{}", records.text());
        let (corrected, again) = tokio::join!(
            post_bill(
                &app,
                "/v1/bills?pool=billed",
                constructed_bill("90.00").into_bytes(),
                "text/csv"
            ),
            post_bill(
                &app,
                "/v1/bills?pool=billed",
                constructed_bill("90.00").into_bytes(),
                "text/csv"
            ),
        );
        let statuses = [corrected.status, again.status];
        assert!(statuses.contains(&StatusCode::CREATED), "{statuses:?}");
        assert!(
            statuses.contains(&StatusCode::OK),
            "one of the two is a duplicate: {statuses:?}"
        );
        assert_eq!(figures(&app).await, expected);
    }
}

/// `taskledger import --format focus` stores a bill (gzip too) as `POST /v1/bills` does;
/// importing it again is a duplicate, and a bad file names its row and column.
#[tokio::test]
async fn the_command_line_imports_a_bill_as_the_endpoint_stores_it() {
    use flate2::{Compression, write::GzEncoder};
    use std::io::Write;
    let app = billed_fleet().await;
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("bill.csv.gz");
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder
        .write_all(constructed_bill("98.32").as_bytes())
        .unwrap();
    std::fs::write(&file, encoder.finish().unwrap()).unwrap();
    let import = |file: &std::path::Path| {
        std::process::Command::new(env!("CARGO_BIN_EXE_taskledger"))
            .args([
                "--database-url",
                &app.database_url,
                "import",
                "--format",
                "focus",
            ])
            .args(["--pool", "billed"])
            .arg(file)
            .output()
            .unwrap()
    };
    let output = import(&file);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains(r#""duplicate":false"#), "{stdout}");
    assert!(stdout.contains(r#""matched_rows":7"#), "{stdout}");
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&train["paid"]["cost"], "393.28");
    let billed = app
        .get("/v1/pools/billed/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    assert_money(&billed["paid"]["gpu_hours"], "24");

    let again = import(&file);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains(r#""duplicate":true"#));

    let broken = folder.path().join("broken.csv");
    std::fs::write(&broken, constructed_bill("9x.32")).unwrap();
    let output = import(&broken);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("/rows/2/BilledCost"), "{stderr}");
}
