//! The FOCUS export of a month: COST_MODEL.md's worked example as FOCUS rows (written to
//! `target/focus-export-2026-11.csv` for `.ci/focus-validate`), who may read it, and text a
//! spreadsheet would run as a formula.

use std::collections::HashMap;
use std::str::FromStr;

use axum::http::{StatusCode, header};
use rust_decimal::Decimal;
use serde_json::json;

use taskledger::config::{Clock, Settings};

use crate::common::TestApp;
use crate::fixtures::{contract, record, worked_example};

/// After November 2026, so that its commitment has accrued in full.
async fn app() -> TestApp {
    TestApp::spawn_with(Settings {
        clock: Clock::Fixed("2027-01-01T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    })
    .await
}

type Row = HashMap<String, String>;

/// The export's header and rows.
fn parse(body: &[u8]) -> (Vec<String>, Vec<Row>) {
    let mut reader = csv::Reader::from_reader(body);
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_owned)
        .collect();
    let rows = reader
        .records()
        .map(|record| {
            header
                .iter()
                .cloned()
                .zip(record.unwrap().iter().map(str::to_owned))
                .collect()
        })
        .collect();
    (header, rows)
}

fn dec(text: &str) -> Decimal {
    Decimal::from_str(text).unwrap_or_else(|_| panic!("not a decimal: {text:?}"))
}

fn money(row: &Row, column: &str) -> Decimal {
    dec(&row[column])
}

async fn export(app: &TestApp, month: &str) -> Vec<u8> {
    let finance = app.token("finance", &[]).await;
    let response = app
        .get(&format!("/v1/exports/focus/{month}"), &finance)
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    assert_eq!(response.content_type(), "text/csv; charset=utf-8");
    assert_eq!(
        response.headers[header::CONTENT_DISPOSITION],
        format!("attachment; filename=\"focus-{month}.csv\"")
    );
    response.body
}

/// The row of `sub_account` whose `x_ContractName` is `contract` and whose
/// `CommitmentDiscountStatus` is `status` (empty for none).
fn row<'a>(rows: &'a [Row], sub_account: &str, contract: &str, status: &str) -> &'a Row {
    let matching: Vec<&Row> = rows
        .iter()
        .filter(|r| {
            r["SubAccountId"] == sub_account
                && r["x_ContractName"] == contract
                && r["CommitmentDiscountStatus"] == status
        })
        .collect();
    assert_eq!(
        matching.len(),
        1,
        "{sub_account} {contract} {status}: {rows:#?}"
    );
    matching[0]
}

#[tokio::test]
async fn focus_the_worked_example_as_focus_rows() {
    let app = app().await;
    let [_, _, _, c4] = worked_example(&app).await;
    let body = export(&app, "2026-11").await;
    let target = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("focus-export-2026-11.csv"), &body).unwrap();

    let (header, rows) = parse(&body);
    for mandatory in [
        "BilledCost",
        "BillingAccountId",
        "BillingAccountName",
        "BillingCurrency",
        "BillingPeriodEnd",
        "BillingPeriodStart",
        "ChargeCategory",
        "ChargeClass",
        "ChargeDescription",
        "ChargePeriodEnd",
        "ChargePeriodStart",
        "ContractedCost",
        "EffectiveCost",
        "InvoiceIssuerName",
        "ListCost",
        "PricingQuantity",
        "PricingUnit",
        "ProviderName",
        "PublisherName",
        "ServiceCategory",
        "ServiceName",
    ] {
        assert!(header.iter().any(|h| h == mandatory), "{mandatory} missing");
    }
    let first_custom = header.iter().position(|h| h.starts_with("x_")).unwrap();
    assert!(
        header[first_custom..].iter().all(|h| h.starts_with("x_")),
        "custom columns come last: {header:?}"
    );

    // C1, C2, C3 and C4's usage, B200's unrated hour, and C4's unused commitment.
    assert_eq!(rows.len(), 6, "{rows:#?}");
    for r in &rows {
        assert_eq!(r["ChargeCategory"], "Usage");
        assert_eq!(r["BillingCurrency"], "USD");
        assert_eq!(r["PricingCurrency"], "USD");
        assert_eq!(r["PricingCurrencyEffectiveCost"], r["BilledCost"]);
        assert_eq!(r["BillingPeriodStart"], "2026-11-01T00:00:00Z");
        assert_eq!(r["BillingPeriodEnd"], "2026-12-01T00:00:00Z");
        assert_eq!(r["ChargePeriodStart"], "2026-11-01T00:00:00Z");
        assert_eq!(r["ChargePeriodEnd"], "2026-12-01T00:00:00Z");
        assert_eq!(r["ProviderName"], "taskledger");
        assert_eq!(r["ServiceCategory"], "AI and Machine Learning");
        assert_eq!(r["ChargeClass"], "");
        for cost in ["EffectiveCost", "ContractedCost", "ListCost"] {
            assert_eq!(r[cost], r["BilledCost"], "{cost} of {r:?}");
        }
        assert_eq!(
            money(r, "ContractedUnitPrice") * money(r, "PricingQuantity"),
            money(r, "ContractedCost"),
            "{r:?}"
        );
    }

    let vision: Vec<&Row> = rows
        .iter()
        .filter(|r| r["SubAccountId"] == "projects/vision")
        .collect();
    assert_eq!(vision.len(), 5);
    assert!(vision.iter().all(|r| r["SubAccountName"] == "vision"
        && r["SubAccountType"] == "Project"
        && r["InvoiceId"] == "2026-11/projects/vision/USD"));
    let total: Decimal = vision.iter().map(|r| money(r, "BilledCost")).sum();
    assert_eq!(total, dec("84.60"));

    // R1's 8 GPU-hours before the 15th and R6's 2 November GPU-hours at 2.50.
    let c1 = row(&rows, "projects/vision", "C1", "");
    assert_eq!(c1["BilledCost"], "25.00");
    assert_eq!(c1["ContractedUnitPrice"], "2.50");
    assert_eq!(c1["PricingQuantity"], "10.0");
    assert_eq!(c1["ConsumedQuantity"], "10.0");
    assert_eq!(c1["PricingUnit"], "GPU-Hours");
    assert_eq!(c1["PricingCategory"], "Standard");
    assert_eq!(c1["ChargeFrequency"], "Usage-Based");
    assert_eq!(c1["x_TaskCount"], "2", "t1 and t5");
    assert_eq!(c1["x_GpuSeconds"], "36000");
    assert_eq!(c1["x_GpuSecondsBusy"], "21600", "half of R1's busy time");
    assert_eq!(c1["x_UnratedGpuSeconds"], "0");
    assert_eq!(c1["CommitmentDiscountId"], "");

    let c2 = row(&rows, "projects/vision", "C2", "");
    assert_eq!(c2["BilledCost"], "16.00");
    assert_eq!(c2["x_TaskCount"], "1");

    // R2 and R3, two attempts of one task.
    let c3 = row(&rows, "projects/vision", "C3", "");
    assert_eq!(c3["BilledCost"], "33.60");
    assert_eq!(c3["PricingCategory"], "Dynamic");
    assert_eq!(c3["x_BillingMode"], "spot");
    assert_eq!(c3["x_TaskCount"], "1");
    assert_eq!(c3["x_GpuSeconds"], "100800");
    assert_eq!(c3["x_GpuSecondsBusy"], "0");

    let c4_used = row(&rows, "projects/vision", "C4", "Used");
    assert_eq!(c4_used["BilledCost"], "10.00");
    assert_eq!(c4_used["CommitmentDiscountId"], c4);
    assert_eq!(c4_used["CommitmentDiscountName"], "C4");
    assert_eq!(c4_used["CommitmentDiscountQuantity"], "10.0");
    assert_eq!(c4_used["PricingCategory"], "Committed");
    assert_eq!(c4_used["x_GpuSecondsBusy"], "36000");

    let unrated = row(&rows, "projects/vision", "", "");
    assert_eq!(unrated["BilledCost"], "0.00");
    assert_eq!(unrated["x_GpuModel"], "B200");
    assert_eq!(unrated["x_UnratedReason"], "no_contract");
    assert_eq!(unrated["x_UnratedGpuSeconds"], "3600");
    assert_eq!(unrated["ConsumedQuantity"], "1.0");
    assert_eq!(unrated["x_TaskCount"], "1");

    // C4 is not project-scoped: 10 h × 1 + 710 h × 2 unused GPU-hours at 1.00.
    let unused = row(&rows, "shared", "C4", "Unused");
    assert_eq!(unused["BilledCost"], "1430.00");
    assert_eq!(unused["SubAccountName"], "shared");
    assert_eq!(unused["SubAccountType"], "Shared");
    assert_eq!(unused["InvoiceId"], "2026-11/shared/USD");
    assert_eq!(unused["CommitmentDiscountId"], c4);
    assert_eq!(unused["CommitmentDiscountQuantity"], "1430.0");
    assert_eq!(unused["PricingQuantity"], "1430.0");
    assert_eq!(unused["ContractedUnitPrice"], "1.00");
    assert_eq!(unused["ConsumedQuantity"], "", "FOCUS: null when unused");
    assert_eq!(unused["ChargeFrequency"], "Recurring");
    assert_eq!(unused["x_TaskCount"], "0");
}

#[tokio::test]
async fn focus_a_project_scoped_commitment_is_charged_to_its_project_in_its_currency() {
    let app = app().await;
    app.create_project("search", "EUR").await;
    contract("A100", "reserved", "2.00")
        .named("Owned")
        .valid_from("2026-11-01T00:00:00Z")
        .valid_until("2026-11-02T00:00:00Z")
        .committed_gpus(1)
        .project("search")
        .provider("on-prem")
        .create(&app)
        .await;
    let rate = app
        .put(
            "/v1/fx-rates/2026-11/USD/EUR",
            &app.admin,
            json!({"rate": "0.9"}),
        )
        .await;
    assert_eq!(rate.status, StatusCode::OK, "{}", rate.text());
    app.ingest([record("a", "2026-11-01T00:00:00Z", "2026-11-01T04:00:00Z")
        .project("search")
        .gpu_model("A100")
        .billing_mode("reserved")
        .provider("on-prem")])
        .await;
    let (_, rows) = parse(&export(&app, "2026-11").await);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let used = row(&rows, "projects/search", "Owned", "Used");
    let unused = row(&rows, "projects/search", "Owned", "Unused");
    for r in [used, unused] {
        assert_eq!(r["BillingCurrency"], "EUR");
        assert_eq!(r["ContractedUnitPrice"], "1.80");
        assert_eq!(r["PricingCurrency"], "USD");
        assert_eq!(r["PricingCurrencyContractedUnitPrice"], "2.00");
        assert_eq!(r["ProviderName"], "on-prem");
        assert_eq!(r["InvoiceId"], "2026-11/projects/search/EUR");
    }
    assert_eq!(used["BilledCost"], "7.20");
    assert_eq!(used["PricingCurrencyEffectiveCost"], "8.00");
    // 20 of the day's 24 committed GPU-hours went unused.
    assert_eq!(unused["BilledCost"], "36.00");
    assert_eq!(unused["PricingCurrencyEffectiveCost"], "40.00");
    assert_eq!(unused["PricingQuantity"], "20.0");
}

#[tokio::test]
async fn focus_is_for_finance_and_takes_a_month() {
    let app = app().await;
    app.create_project("vision", "USD").await;
    let reader = app.token("reader", &["vision"]).await;
    app.get("/v1/exports/focus/2026-11", &reader)
        .await
        .problem(StatusCode::FORBIDDEN);

    let bad = app.get("/v1/exports/focus/2026-13", &app.admin).await;
    bad.problem(StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(bad.pointers(), ["path:month"]);

    let (header, rows) = parse(&export(&app, "2026-10").await);
    assert!(header.contains(&"BilledCost".to_owned()));
    assert!(rows.is_empty(), "a month without GPU time has no charges");
}

#[tokio::test]
async fn focus_names_cannot_become_formulas() {
    let app = app().await;
    let created = app
        .post(
            "/v1/projects",
            &app.admin,
            json!({"id": "evil", "name": "=HYPERLINK(\"http://x\")", "currency": "USD"}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    contract("H100", "on_demand", "2.00")
        .named("+SUM(1)")
        .valid_from("2026-11-01T00:00:00Z")
        .provider("@provider")
        .region("-1")
        .create(&app)
        .await;
    app.ingest([record("t", "2026-11-03T00:00:00Z", "2026-11-03T01:00:00Z")
        .project("evil")
        .provider("@provider")
        .region("-1")])
        .await;
    let body = export(&app, "2026-11").await;
    let (_, rows) = parse(&body);
    let r = row(&rows, "projects/evil", "'+SUM(1)", "");
    assert_eq!(r["SubAccountName"], "'=HYPERLINK(\"http://x\")");
    assert_eq!(r["ProviderName"], "'@provider");
    assert_eq!(r["RegionId"], "'-1");
    assert_eq!(r["BilledCost"], "2.00", "numbers are not altered");
    let text = String::from_utf8(body).unwrap();
    for line in text.lines() {
        for cell in line.split(',') {
            assert!(
                !cell.trim_start_matches('"').starts_with(['=', '+', '@']),
                "{cell} in {line}"
            );
        }
    }
}
