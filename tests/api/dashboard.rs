//! The dashboard as a user sees it: the page served at `/`, run by headless Chromium against
//! a real listening server.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use axum::http::StatusCode;
use rust_decimal::{Decimal, RoundingStrategy};
use serde_json::{Value, json};

use taskledger::config::{Clock, Settings};
use taskledger::ledger::demo::{self, Loaded};
use taskledger::ledger::notify::Notifier;
use taskledger::workers::channels::ChannelDeliveries;

use crate::browser::Browser;
use crate::common::TestApp;
use crate::common::receivers::{Platform, Receiver};
use crate::fixtures::{
    contract, record, worked_example, worked_example_contracts, worked_example_records,
};

/// Runs headless Chromium on `url` with a fresh profile and `mode` (`--dump-dom`, or
/// `--screenshot=…` with a window size), once the page's scripts have run; returns what it
/// printed.
fn chromium(url: &str, mode: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=15000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(mode)
        .arg(url)
        .output()
        .expect("chromium runs (apt-get install chromium)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Renders `url` in headless Chromium and returns the DOM once its scripts have run.
fn rendered_dom(url: &str) -> String {
    chromium(url, &["--dump-dom"])
}

/// Serves the app and renders the dashboard at each hash (`project=…&month=…`), signed in
/// with `token`; returns each page's DOM after checking that it finished loading.
async fn pages(app: &TestApp, token: &str, hashes: &[&str]) -> Vec<String> {
    pages_at(app, Settings::default(), token, hashes).await
}

/// [`pages`] with the server run with `settings` (a fixed clock, say).
async fn pages_at(app: &TestApp, settings: Settings, token: &str, hashes: &[&str]) -> Vec<String> {
    let served = app.serve_with(settings).await;
    let urls: Vec<String> = hashes
        .iter()
        .map(|hash| format!("{}/#token={token}&{hash}", served.url()))
        .collect();
    let doms: Vec<String> =
        tokio::task::spawn_blocking(move || urls.iter().map(|url| rendered_dom(url)).collect())
            .await
            .unwrap();
    served.stop().await;
    for (hash, dom) in hashes.iter().zip(&doms) {
        assert!(
            dom.contains(r#"<body data-loaded="true">"#),
            "#{hash} did not finish loading: {dom}"
        );
    }
    doms
}

/// The text of an HTML fragment as a reader sees it: tags dropped, entities decoded, white
/// space collapsed.
fn text(html: &str) -> String {
    let mut shown = String::new();
    let mut in_tag = false;
    for c in html.chars() {
        match c {
            '<' => {
                in_tag = true;
                shown.push(' ');
            }
            '>' if in_tag => in_tag = false,
            _ if !in_tag => shown.push(c),
            _ => {}
        }
    }
    let decoded = shown
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&nbsp;", " ")
        .replace("&amp;", "&");
    decoded.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rows of the table body with this id, each as the text of its cells.
fn table_rows(dom: &str, tbody_id: &str) -> Vec<Vec<String>> {
    let start = dom
        .find(&format!(r#"<tbody id="{tbody_id}""#))
        .unwrap_or_else(|| panic!("no table body {tbody_id}: {dom}"));
    let body = &dom[start..];
    let body = &body[..body.find("</tbody>").unwrap()];
    body.split("<tr").skip(1).map(cells).collect()
}

fn cells(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut rest = row;
    while let Some(at) = [rest.find("<td"), rest.find("<th")]
        .into_iter()
        .flatten()
        .min()
    {
        let cell = &rest[at..];
        let end = [cell.find("</td>"), cell.find("</th>")]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
        cells.push(text(&cell[..end]));
        rest = &cell[end + "</td>".len()..];
    }
    cells
}

/// The `x` and `width` of the first `<rect>` of `class` in the DOM.
fn rect(dom: &str, class: &str) -> (f64, f64) {
    let at = dom
        .find(&format!(r#"<rect class="{class}""#))
        .unwrap_or_else(|| panic!("no {class} bar"));
    let tag = &dom[at..at + dom[at..].find('>').unwrap()];
    let number = |name: &str| -> f64 {
        let from = tag.find(&format!(r#" {name}=""#)).unwrap() + name.len() + 3;
        tag[from..from + tag[from..].find('"').unwrap()]
            .parse()
            .unwrap()
    };
    (number("x"), number("width"))
}

/// The worked example with t2's attempts queued 25 and 20 minutes before they started.
async fn worked_example_with_queues(app: &TestApp) {
    app.create_project("vision", "USD").await;
    for contract in worked_example_contracts() {
        contract.create(app).await;
    }
    let [r1, r2, r3, r4, r5, r6] = worked_example_records();
    let r2 = r2.queued_at("2026-11-20T09:35:00Z");
    let r3 = r3.queued_at("2026-11-20T11:40:00Z");
    app.ingest([r1, r2, r3, r4, r5, r6]).await;
}

#[tokio::test]
async fn the_dashboard_shows_the_worked_example() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let reader = app.token("reader", &["vision"]).await;
    let served = app.serve().await;
    let url = format!(
        "{}/#token={reader}&project=vision&month=2026-11",
        served.url()
    );
    let dom = tokio::task::spawn_blocking(move || rendered_dom(&url))
        .await
        .unwrap();
    served.stop().await;

    assert!(
        dom.contains(r#"data-loaded="true""#),
        "the page did not finish loading: {dom}"
    );
    for shown in [
        "84.60 USD",
        "21.15 USD",
        "23.40 USD",
        "37.00 USD",
        "14.40 USD",
        "B200",
        "18.40",
        "22.17",
    ] {
        assert!(dom.contains(shown), "{shown} is not on the page");
    }
    assert!(
        !dom.contains(r#"<main id="main"><div class="error">"#),
        "the page shows an error"
    );
}

#[tokio::test]
async fn the_dashboard_asks_for_a_token_and_rejects_a_bad_one() {
    let app = TestApp::spawn().await;
    let served = app.serve().await;
    let fresh = format!("{}/", served.url());
    let bad = format!("{}/#token=tl_wrong", served.url());
    let (fresh, bad) =
        tokio::task::spawn_blocking(move || (rendered_dom(&fresh), rendered_dom(&bad)))
            .await
            .unwrap();
    served.stop().await;
    assert!(fresh.contains("Paste an API token"));
    assert!(bad.contains("That token is not valid"));
}

#[tokio::test]
async fn the_tasks_panel_lists_the_months_costliest_tasks_with_their_figures() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    let reader = app.token("reader", &["vision"]).await;
    let doms = pages(
        &app,
        &reader,
        &[
            "project=vision&month=2026-11",
            "project=vision&month=2026-11&sort=gpu_hours&order=asc",
            "project=vision&month=2026-11&status=failed",
        ],
    )
    .await;

    let rows = table_rows(&doms[0], "task-rows");
    let expected = [
        [
            "t1",
            "completed",
            "11-14 22:00",
            "1",
            "16.0",
            "75%",
            "—",
            "—",
            "2M tokens",
            "36.00 USD",
            "9.00 USD",
            "36.00 USD",
            "18.00 USD per 1M tokens",
            "—",
        ],
        [
            "t2",
            "completed",
            "11-20 10:00",
            "2 (1 failed)",
            "28.0",
            "—",
            "—",
            "—",
            "1M tokens",
            "33.60 USD",
            "14.40 USD",
            "33.60 USD",
            "33.60 USD per 1M tokens",
            "—",
        ],
        [
            "t3",
            "completed",
            "11-10 00:00",
            "1",
            "10.0",
            "100%",
            "—",
            "—",
            "500 samples",
            "10.00 USD",
            "0.00 USD",
            "10.00 USD",
            "20.00 USD per 1k samples",
            "—",
        ],
        // t5 began in October: November holds half of it, its final cost all of it.
        [
            "t5",
            "completed",
            "10-31 23:00",
            "1",
            "2.0",
            "—",
            "—",
            "—",
            "—",
            "5.00 USD",
            "0.00 USD",
            "10.00 USD",
            "—",
            "—",
        ],
        [
            "t4",
            "failed",
            "11-21 00:00",
            "1 (1 failed)",
            "1.0",
            "—",
            "—",
            "—",
            "—",
            "0.00 USD + 1.0 GPU-h unrated",
            "0.00 USD",
            "—",
            "—",
            "—",
        ],
    ];
    assert_eq!(rows, expected);
    assert!(
        doms[0].contains(r##"<a href="#project=vision&amp;month=2026-11&amp;task=t2">t2</a>"##),
        "a task opens its page"
    );
    assert!(
        doms[0].contains(
            r#"aria-sort="descending"><button type="button" class="sort" data-sort="cost""#
        )
    );

    let by_hours: Vec<String> = table_rows(&doms[1], "task-rows")
        .into_iter()
        .map(|row| row[0].clone())
        .collect();
    assert_eq!(by_hours, ["t4", "t5", "t3", "t1", "t2"]);
    assert!(doms[1].contains(
        r#"aria-sort="ascending"><button type="button" class="sort" data-sort="gpu_hours""#
    ));

    let failed = table_rows(&doms[2], "task-rows");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0][0], "t4");
    assert!(doms[2].contains(r#"<option value="failed" selected="">"#));
}

#[tokio::test]
async fn a_task_page_shows_its_attempts_on_a_timeline_and_in_a_table() {
    let app = TestApp::spawn().await;
    worked_example_with_queues(&app).await;
    let reader = app.token("reader", &["vision"]).await;
    let doms = pages(
        &app,
        &reader,
        &[
            "project=vision&month=2026-11&task=t2",
            "project=vision&month=2026-11&task=t4",
        ],
    )
    .await;
    let (t2, t4) = (&doms[0], &doms[1]);

    let shown = text(t2);
    for card in [
        "Final cost 33.60 USD Lifetime total, failed attempts included",
        "Cost per unit 33.60 USD per 1M tokens · 1,000,000 tokens in all",
        "GPU time 28.0 GPU-h No busy time reported",
        "Attempts 2 1 failed · 1 retry · 1 failure · 45 min queued",
    ] {
        assert!(shown.contains(card), "{card} is not on the page");
    }
    assert!(
        t2.contains(r##"<a href="#project=vision&amp;month=2026-11">"##),
        "no way back to the task list"
    );
    assert_eq!(
        table_rows(t2, "attempt-rows"),
        [
            [
                "#1 team=perception",
                "preempted 1 failure",
                "2026-11-20 10:00 → 11:30 1 h 30 min",
                "25 min queued 09:35",
                "8 × H100 spot",
                "12.0 busy —",
                "14.40 USD",
                "Failed runs 14.40 USD",
                "C3: 14.40 USD 12.0 GPU-h at 1.20 USD/GPU-h",
                "—",
                "—",
            ],
            [
                "#2 team=perception",
                "completed completed the task 1 retry",
                "2026-11-20 12:00 → 14:00 2 h",
                "20 min queued 11:40",
                "8 × H100 spot",
                "16.0 busy —",
                "19.20 USD",
                "Unmeasured 19.20 USD",
                "C3: 19.20 USD 16.0 GPU-h at 1.20 USD/GPU-h",
                "—",
                "1M tokens",
            ],
        ]
    );

    // On the time axis each attempt's queue wait ends where its bar starts, the retry comes
    // after the preempted attempt, and lengths keep their proportions (25 min : 90 min : 120 min).
    let (queue_1, wait_1) = rect(t2, "queue preempted");
    let (run_1, ran_1) = rect(t2, "run preempted");
    let (queue_2, wait_2) = rect(t2, "queue completed");
    let (run_2, ran_2) = rect(t2, "run completed");
    let close = |a: f64, b: f64| (a - b).abs() < 0.01;
    assert!(close(queue_1 + wait_1, run_1) && close(queue_2 + wait_2, run_2));
    assert!(run_1 + ran_1 < queue_2);
    assert!(close(ran_1 / wait_1, 90.0 / 25.0) && close(ran_2 / ran_1, 120.0 / 90.0));
    assert!(t2.contains(r#"role="img" aria-labelledby="timeline-title timeline-desc""#));

    let t4_text = text(t4);
    assert!(t4_text.contains("Final cost — Not completed; 0.00 USD so far"));
    let attempt = &table_rows(t4, "attempt-rows")[0];
    assert_eq!(attempt[1], "failed failed the task");
    assert_eq!(attempt[8], "none");
    assert_eq!(attempt[9], "3,600 GPU-s: no contract");
    assert!(t4.contains(r#"<rect class="run failed""#));
}

#[tokio::test]
async fn a_task_id_with_markup_in_it_is_shown_as_text() {
    const HOSTILE: &str = r##"<img src=x onerror="document.body.dataset.injected=1">&"'/#1"##;
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "2.50").create(&app).await;
    app.ingest([
        record(HOSTILE, "2026-11-20T10:00:00Z", "2026-11-20T11:00:00Z").output("3", "<b>unit</b>"),
    ])
    .await;
    let reader = app.token("reader", &["vision"]).await;
    let task: String = form_urlencoded::byte_serialize(HOSTILE.as_bytes()).collect();
    let task_page = format!("project=vision&month=2026-11&task={task}");
    let doms = pages(&app, &reader, &["project=vision&month=2026-11", &task_page]).await;

    for dom in &doms {
        assert!(!dom.contains("<img src=x") && !dom.contains("data-injected"));
        assert!(!dom.contains("<b>unit</b>"));
    }
    let listed = table_rows(&doms[0], "task-rows");
    assert_eq!(listed[0][0], HOSTILE);
    assert_eq!(listed[0][8], "3 <b>unit</b>");
    assert!(text(&doms[1]).contains(&format!("Task {HOSTILE} completed")));
    assert_eq!(table_rows(&doms[1], "attempt-rows").len(), 1);
}

/// Project `lab` next to the worked example, on H100s at C1's 2.50 per GPU-hour, in November:
///
/// | workload | records | GPU-Util | SM | tensor | memory of 80 GiB | cost |
/// | --- | --- | --- | --- | --- | --- | --- |
/// | chat-7b | 3 × 1 GPU × 1 h | 0.95 | 0.30 | 0.10 | 16 | 7.50 |
/// | pretrain | 3 × 8 GPUs × 1 h | 0.90 | 0.90 | 0.50 | 70 | 60 |
/// | legacy | 1 × 1 GPU × 1 h | — | — | — | — | 2.50 |
async fn lab_with_telemetry(app: &TestApp) {
    app.create_project("lab", "USD").await;
    let mut records = Vec::new();
    for day in 1..=3 {
        let at = |hour: u32| format!("2026-11-0{day}T{hour:02}:00:00Z");
        records.push(
            record(&format!("chat-{day}"), &at(0), &at(1))
                .project("lab")
                .label("workload", "chat-7b")
                .with("gpu_util", "0.95")
                .with("sm_active", "0.30")
                .with("tensor_active", "0.10")
                .with("memory_peak_gib", 16),
        );
        records.push(
            record(&format!("pretrain-{day}"), &at(2), &at(3))
                .project("lab")
                .label("workload", "pretrain")
                .gpu_count(8)
                .with("gpu_util", "0.90")
                .with("sm_active", "0.90")
                .with("tensor_active", "0.50")
                .with("memory_peak_gib", 70),
        );
    }
    records.push(record("legacy", "2026-11-04T00:00:00Z", "2026-11-04T01:00:00Z").project("lab"));
    app.ingest(records).await;
}

#[tokio::test]
async fn the_project_page_shows_real_utilisation_and_what_right_sizing_would_save() {
    let app = TestApp::spawn().await;
    worked_example(&app).await;
    lab_with_telemetry(&app).await;
    let reader = app.token("reader", &["vision", "lab"]).await;
    let doms = pages(
        &app,
        &reader,
        &["project=lab&month=2026-11", "project=vision&month=2026-11"],
    )
    .await;
    let (lab, vision) = (&doms[0], &doms[1]);

    let shown = text(lab);
    // Held: 3 × 3600 + 3 × 28800 + 3600 = 100800 GPU-s, 97200 of them with telemetry.
    // GPU-Util (10800 × 0.95 + 86400 × 0.90) / 97200 = 0.9056; SM (3240 + 77760) / 97200 =
    // 0.8333; tensor (1080 + 43200) / 97200 = 0.4556.
    assert!(
        shown.contains("GPU-Util 91% · SM active 83% · tensor 46%"),
        "{shown}"
    );
    assert!(
        shown.contains("reported for 96% of GPU time"),
        "coverage is shown"
    );
    // Memory used (10800 × 16/80 + 86400 × 70/80) / 97200 = 0.8, so 20 % unused, costing
    // 7.50 × 0.8 + 60 × 0.125 = 13.50 over 10800 × 0.8 + 86400 × 0.125 = 19440 GPU-s.
    assert!(
        shown.contains("Memory paid for, unused 20% 13.50 USD · 5.4 GPU-h"),
        "{shown}"
    );
    // chat-7b: GPU-Util 0.95 with SM 0.30 looks busy: its 7.50.
    assert!(shown.contains("Looks busy, isn't 7.50 USD"), "{shown}");

    // chat-7b needs 16 × 1.2 = 19.2 GiB and 0.36 of the card: 3g.40gb, saving 7.50 × 4/7.
    assert_eq!(
        table_rows(lab, "recommendation-rows"),
        [[
            "chat-7b",
            "3 × H100 up to 1 GPU",
            "16.0 GiB",
            "30%",
            "MIG 3g.40gb 3/7 of the card · 40 GiB",
            "7.50 USD",
            "4.29 USD",
        ]]
    );
    let skipped = table_rows(lab, "skipped-rows");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0][0], "pretrain");
    assert!(skipped[0][3].starts_with("needs 84 GiB of memory"));
    assert!(shown.contains("1 workload on whole GPUs reported no memory peak or SM activity"));

    // The worked example reported no telemetry: both panels say so.
    assert!(vision.contains(r#"id="utilisation-empty""#));
    assert!(text(vision).contains("No record this month reported GPU telemetry"));
    assert!(text(vision).contains(
        "No workload on whole GPUs reported its memory peak this month, so none can be right-sized."
    ));
}

/// Regenerates the dashboard's screenshots in `docs/screenshots/` from the worked example.
#[tokio::test]
#[ignore = "writes docs/screenshots/: run by hand after changing the dashboard"]
async fn dashboard_screenshots() {
    let app = TestApp::spawn().await;
    finance_month(&app).await;
    let finance = app.token("finance", &[]).await;
    let served = app.serve().await;
    let origin = served.url();
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&format!(
            "{origin}/#token={finance}&page=finance&month=2026-11"
        ));
        browser.screenshot(&folder.join("finance-page.png"));
        browser.open(&format!("{origin}/#project=vision&month=2026-11"));
        browser.screenshot_of("header, #compare", &folder.join("project-page.png"));
        browser.screenshot_of("#tasks", &folder.join("tasks-panel.png"));
        browser.open(&format!("{origin}/#project=vision&month=2026-11&task=t2"));
        browser.screenshot(&folder.join("task-page.png"));
        browser.open(&format!("{origin}/#project=lab&month=2026-11"));
        browser.screenshot_of(
            "#utilisation, #recommendations",
            &folder.join("utilisation-panel.png"),
        );
    })
    .await
    .unwrap();
    served.stop().await;
}

/// Where the browser tests leave their screenshots, to be looked at: `target/screenshots/`.
pub fn screenshot_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/screenshots")
        .join(name)
}

/// A decimal string of the API as the dashboard shows it: half-even to `digits` places, with
/// thousands grouped.
fn rounded(amount: &Value, digits: u32) -> String {
    let exact: Decimal = amount.as_str().unwrap().parse().unwrap();
    let mut value = exact.round_dp_with_strategy(digits, RoundingStrategy::MidpointNearestEven);
    value.rescale(digits);
    let text = value.abs().to_string();
    let (whole, fraction) = text.split_once('.').unwrap_or((&text, ""));
    let mut grouped = String::new();
    for (i, digit) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    let sign = if value.is_sign_negative() && !value.is_zero() {
        "-"
    } else {
        ""
    };
    match fraction {
        "" => format!("{sign}{grouped}"),
        _ => format!("{sign}{grouped}.{fraction}"),
    }
}

/// An amount of the API as the dashboard shows it (`84.60 USD`); "—" for null.
fn shown(amount: &Value, currency: &str) -> String {
    if amount.is_null() {
        return "—".to_owned();
    }
    format!("{} {currency}", rounded(amount, 2))
}

/// The worked example with a 100 USD budget for November (so 50 % and 80 % alerts fired) and
/// project `lab` next to it.
async fn finance_month(app: &TestApp) {
    worked_example_with_queues(app).await;
    lab_with_telemetry(app).await;
    let budget = app
        .put(
            "/v1/projects/vision/budgets/2026-11",
            &app.admin,
            json!({"amount": "100"}),
        )
        .await;
    assert_eq!(budget.status, StatusCode::OK, "{}", budget.text());
}

/// Checks that the finance page shows the monthly report's own figures: every project row,
/// the totals per currency and each commitment.
fn assert_finance_page(dom: &str, report: &Value) {
    let rows = table_rows(dom, "finance-rows");
    let lines = report["projects"].as_array().unwrap();
    assert_eq!(rows.len(), lines.len());
    for (row, line) in rows.iter().zip(lines) {
        let c = line["currency"].as_str().unwrap();
        assert!(
            row[0].starts_with(line["name"].as_str().unwrap()),
            "{row:?}"
        );
        assert!(row[1].starts_with(&shown(&line["total"], c)), "{row:?}");
        assert_eq!(row[2], shown(&line["budget"], c));
        if !line["burn_pct"].is_null() {
            assert!(
                row[3].starts_with(&format!("{}%", rounded(&line["burn_pct"], 1))),
                "{row:?}"
            );
        }
        if !line["forecast_pct"].is_null() {
            let forecast = format!("forecast {}%", rounded(&line["forecast_pct"], 0));
            assert!(row[3].ends_with(&forecast), "{row:?}");
        }
        assert!(row[4].starts_with(&shown(&line["waste"], c)), "{row:?}");
        assert!(
            row[5].starts_with(&shown(&line["cost_per_completed_task"], c)),
            "{row:?}"
        );
    }
    let totals = table_rows(dom, "total-rows");
    let expected: Vec<Vec<String>> = report["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let c = t["currency"].as_str().unwrap();
            vec![
                c.to_owned(),
                shown(&t["projects"], c),
                shown(&t["shared"], c),
                shown(&t["pools"], c),
                shown(&t["adjustments"], c),
                shown(&t["total"], c),
            ]
        })
        .collect();
    assert_eq!(totals, expected);
    let lines = report["commitments"].as_array().unwrap();
    if lines.is_empty() {
        assert!(!dom.contains("commitment-rows"));
        assert!(text(dom).contains("No reservation outside a capacity pool"));
        return;
    }
    let commitments = table_rows(dom, "commitment-rows");
    assert_eq!(commitments.len(), lines.len());
    for (row, line) in commitments.iter().zip(lines) {
        assert_eq!(row[0], line["name"].as_str().unwrap());
        assert_eq!(row[3], rounded(&line["committed_gpu_hours"], 1));
        assert_eq!(row[4], rounded(&line["used_gpu_hours"], 1));
        assert_eq!(
            row[6],
            shown(
                &line["unused_commitment"],
                line["currency"].as_str().unwrap()
            )
        );
    }
}

/// Checks that the project page shows the API's figures: the spend by day of the burn, the
/// comparison by GPU model and billing mode, and the cost by team.
fn assert_project_page(dom: &str, burn: &Value, by_model: &Value, by_team: &Value) {
    let c = burn["currency"].as_str().unwrap();
    let burn_rows = table_rows(dom, "burn-rows");
    let days = burn["days"].as_array().unwrap();
    assert_eq!(burn_rows.len(), days.len());
    for (row, day) in burn_rows.iter().zip(days) {
        assert_eq!(
            row,
            &[
                day["day"].as_str().unwrap().to_owned(),
                shown(&day["spend"], c)
            ]
        );
    }
    assert_eq!(burn_rows.last().unwrap()[1], shown(&burn["spend"], c));
    assert!(text(dom).contains(&format!("Spend {} as of", shown(&burn["spend"], c))));
    let compare = table_rows(dom, "compare-rows");
    let groups = by_model["groups"].as_array().unwrap();
    assert_eq!(compare.len(), groups.len());
    for (row, group) in compare.iter().zip(groups) {
        let (model, mode) = group["key"].as_str().unwrap().rsplit_once('/').unwrap();
        assert_eq!(row[0], model);
        assert_eq!(row[1], mode.replace('_', " "));
        assert_eq!(row[3], shown(&group["total"], c), "{row:?}");
        assert!(
            row[5].starts_with(&shown(&group["cost_per_completed_task"], c)),
            "{row:?}"
        );
    }
    let teams = table_rows(dom, "team-rows");
    let team_groups = by_team["groups"].as_array().unwrap();
    assert_eq!(teams.len(), team_groups.len());
    for (row, group) in teams.iter().zip(team_groups) {
        assert_eq!(row[1], shown(&group["total"], c));
    }
}

/// Checks that the task page shows the API's figures of the task: its final cost, each
/// attempt's cost and each month's.
fn assert_task_page(dom: &str, task: &Value) {
    let c = task["currency"].as_str().unwrap();
    if !task["final_cost"].is_null() {
        assert!(text(dom).contains(&format!("Final cost {}", shown(&task["final_cost"], c))));
    }
    let rows = table_rows(dom, "attempt-rows");
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(rows.len(), attempts.len());
    for (row, attempt) in rows.iter().zip(attempts) {
        assert_eq!(row[6], shown(&attempt["total"], c));
    }
    let months = table_rows(dom, "month-rows");
    let task_months = task["months"].as_array().unwrap();
    assert_eq!(months.len(), task_months.len());
    for (row, month) in months.iter().zip(task_months) {
        assert!(row[3].starts_with(&shown(&month["total"], c)), "{row:?}");
    }
}

/// What a browser saw: the DOM of each step, and what it requested.
struct Seen {
    doms: Vec<String>,
    requested: Vec<String>,
    errors: Vec<String>,
    overflow: Vec<(String, i64)>,
}

/// Checks that every request of a page went to the server itself (or stayed in the browser:
/// its own blank page, and the icons it draws as `data:` images).
fn assert_all_local(seen: &Seen, origin: &str) {
    assert!(!seen.requested.is_empty());
    for url in &seen.requested {
        assert!(
            url.starts_with(&format!("{origin}/"))
                || url == "about:blank"
                || url.starts_with("data:"),
            "the page loaded {url} from elsewhere"
        );
    }
    assert!(
        seen.errors.is_empty(),
        "the page logged errors: {:?}",
        seen.errors
    );
    for (page, overflow) in &seen.overflow {
        assert!(
            *overflow <= 0,
            "{page} is {overflow} px wider than the screen"
        );
    }
}

/// How far the page is wider than its viewport (positive: it scrolls sideways).
fn overflow(browser: &mut Browser) -> i64 {
    browser
        .eval("document.documentElement.scrollWidth - window.innerWidth")
        .as_i64()
        .unwrap()
}

#[tokio::test]
async fn the_finance_page_shows_every_project_as_the_report_does_and_closes_the_month() {
    // The 2nd of December: November has ended and can be closed, December cannot yet.
    let december = Settings {
        clock: Clock::Fixed("2026-12-02T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let app = TestApp::spawn_with(december).await;
    finance_month(&app).await;
    let finance = app.token("finance", &[]).await;
    let report = app
        .get("/v1/reports/monthly/2026-11", &finance)
        .await
        .json();
    let served = app.serve_with(december).await;
    let origin = served.url();
    let url = format!("{origin}/#token={finance}&page=finance&month=2026-11");
    let current_url = format!("{origin}/#page=finance&month=2026-12");
    let seen = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        let mut doms = Vec::new();
        let mut overflows = Vec::new();
        browser.open(&url);
        doms.push(browser.dom());
        overflows.push(("finance at 1280 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("finance-1280.png"));
        browser.resize(390, 844);
        browser.open(&url);
        overflows.push(("finance at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("finance-390.png"));
        browser.resize(1280, 900);
        browser.open(&url);
        browser.click("#download-csv");
        let csv = browser.downloaded("taskledger-2026-11.csv");
        browser.click("#download-focus");
        let focus_name = "focus-2026-11.csv";
        let focus = browser.downloaded(focus_name);
        browser.click("#close-month");
        browser.wait_for("document.querySelector('#close-dialog').open");
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("finance-close-dialog.png"));
        // Cancel closes nothing.
        browser.click("#close-cancel");
        browser.wait_for("!document.querySelector('#close-dialog').open");
        browser.click("#close-month");
        browser.wait_for("document.querySelector('#close-dialog').open");
        browser.click("#close-confirm");
        browser.wait_for("document.querySelector('#month-state') && document.querySelector('#month-state').textContent.startsWith('Closed')");
        browser.wait_loaded();
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("finance-closed.png"));
        browser.open(&current_url);
        doms.push(browser.dom());
        let seen = Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        };
        (seen, csv, focus)
    })
    .await
    .unwrap();
    served.stop().await;
    let (seen, csv, focus) = seen;
    assert_all_local(&seen, &origin);
    // The downloads are the API's files, byte for byte.
    let api_csv = app
        .get("/v1/reports/monthly/2026-11?format=csv", &finance)
        .await;
    assert_eq!(csv, api_csv.body);
    let api_focus = app.get("/v1/exports/focus/2026-11", &finance).await;
    assert_eq!(focus, api_focus.body);
    let (open, dialog, closed, current_month) =
        (&seen.doms[0], &seen.doms[1], &seen.doms[2], &seen.doms[3]);

    assert_finance_page(open, &report);
    let rows = table_rows(open, "finance-rows");
    let vision = rows
        .iter()
        .find(|row| row[0].starts_with("vision"))
        .unwrap();
    assert_eq!(
        vision[1..],
        [
            "84.60 USD + 1.0 GPU-h unrated",
            "100.00 USD",
            "84.6% · forecast 85%",
            "23.40 USD 27.7%",
            "21.15 USD 4 completed",
            "50% · 80%",
        ]
    );
    assert!(
        open.contains(r#"class="tick" style="left:"#),
        "threshold ticks"
    );
    assert!(
        open.contains(r#"class="forecast" style="left:"#),
        "forecast marker"
    );

    let commitments = table_rows(open, "commitment-rows");
    let c4 = &report["commitments"][0];
    assert_eq!(
        commitments[0],
        [
            "C4",
            "shared",
            "2 × A100",
            &rounded(&c4["committed_gpu_hours"], 1),
            &rounded(&c4["used_gpu_hours"], 1),
            "0.7%",
            &shown(&c4["unused_commitment"], "USD"),
        ]
    );
    assert_eq!(commitments[0][3..5], ["1,440.0", "10.0"]);
    assert!(text(open).contains(
        "Shared unused commitment (contracts scoped to no project): 1,430.00 USD (1,430.0 GPU-h)"
    ));
    for control in ["Download CSV", "Download FOCUS", "Close month…"] {
        assert!(text(open).contains(control), "{control}");
    }

    // The confirmation says what closing does before anything is closed.
    assert!(text(dialog).contains("Close November 2026? Its report is frozen as it stands"));
    assert!(text(closed).contains("November 2026 is closed: its report is frozen."));
    assert!(!closed.contains(r#"id="close-month""#));
    let after = app
        .get("/v1/reports/monthly/2026-11", &finance)
        .await
        .json();
    assert_eq!(after["closed"], true, "the click closed the month");
    assert_eq!(after["projects"], report["projects"]);

    // The month in progress cannot be closed yet.
    assert!(
        current_month.contains(r#"id="close-month" disabled="""#),
        "{current_month}"
    );
    assert!(text(current_month).contains("Can be closed once it has ended"));
}

#[tokio::test]
async fn a_reader_sees_no_finance_page_and_an_ingest_token_is_told_it_cannot_read() {
    let app = TestApp::spawn().await;
    finance_month(&app).await;
    let reader = app.token("reader", &["lab"]).await;
    let ingest = app.token("ingest", &["vision"]).await;
    let served = app.serve().await;
    let origin = served.url();
    let urls = [
        format!("{origin}/#token={reader}&page=finance&month=2026-11"),
        format!("{origin}/#token={reader}&project=vision&month=2026-11"),
        format!("{origin}/#token={ingest}&project=vision&month=2026-11"),
    ];
    let doms = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        let mut doms = Vec::new();
        browser.open(&urls[0]);
        doms.push(browser.dom());
        browser.open(&urls[1]);
        doms.push(browser.dom());
        browser.visit(&urls[2]);
        browser.wait_for("document.querySelector('#other-token')");
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("ingest-token.png"));
        doms
    })
    .await
    .unwrap();
    served.stop().await;
    let (finance, other_project, ingest) = (&doms[0], &doms[1], &doms[2]);
    assert!(text(finance).contains("Finance needs a finance or admin token"));
    assert!(!finance.contains("close-month") && !finance.contains("finance-rows"));
    assert!(
        !finance.contains(">Finance</a>"),
        "no finance link for a reader"
    );
    // A project it may not read is not offered: the page falls back to its own.
    assert!(other_project.contains(r#"<option value="lab">"#));
    assert!(!other_project.contains(r#"<option value="vision">"#));
    assert!(text(other_project).contains("lab · 2026-11"));
    assert!(text(ingest).contains("This token cannot read"));
    assert!(text(ingest).contains("it may only post job records for vision"));
}

#[tokio::test]
async fn the_project_page_charts_the_burn_and_compares_models_as_the_api_does() {
    let app = TestApp::spawn().await;
    finance_month(&app).await;
    let reader = app.token("reader", &["vision", "lab"]).await;
    let burn = app
        .get("/v1/projects/vision/burn?month=2026-11", &reader)
        .await
        .json();
    let by_model = app
        .get(
            "/v1/projects/vision/cost?month=2026-11&group_by=gpu_model,billing_mode",
            &reader,
        )
        .await
        .json();
    let by_team = app
        .get(
            "/v1/projects/vision/cost?month=2026-11&group_by=label:team",
            &reader,
        )
        .await
        .json();
    let served = app.serve().await;
    let origin = served.url();
    let url = format!("{origin}/#token={reader}&project=vision&month=2026-11");
    let seen = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&url);
        let mut doms = vec![browser.dom()];
        let mut overflows = vec![("project at 1280 px".to_owned(), overflow(&mut browser))];
        browser.screenshot(&screenshot_path("project-1280.png"));
        // Charts are drawn: a canvas in each, with the figures read out on hover.
        doms.push(
            browser
                .eval("document.querySelectorAll('#burn-chart canvas, #daily-chart canvas').length")
                .to_string(),
        );
        browser.resize(390, 844);
        browser.open(&url);
        overflows.push(("project at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("project-390.png"));
        // Keyboard: Tab from the start reaches the skip link first.
        browser.press("Tab");
        doms.push(
            browser
                .eval("document.activeElement.textContent")
                .to_string(),
        );
        Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        }
    })
    .await
    .unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    let dom = &seen.doms[0];
    assert_eq!(seen.doms[1], "2");
    assert_eq!(seen.doms[2], "\"Skip to content\"");

    assert_project_page(dom, &burn, &by_model, &by_team);
    let burn_rows = table_rows(dom, "burn-rows");
    assert_eq!(burn_rows.last().unwrap()[1], "84.60 USD");
    // Both thresholds crossed are listed with when their alerts fired.
    let crossings = text(dom);
    assert!(
        crossings.contains("50% of the budget spent:")
            && crossings.contains("80% of the budget spent:")
    );

    let compare = table_rows(dom, "compare-rows");
    let spot = compare
        .iter()
        .find(|row| row[0] == "H100" && row[1] == "spot")
        .unwrap();
    assert_eq!(spot[5..], ["33.60 USD", "19.20 USD per 1M tokens", "42.9%"]);
    let reserved = compare.iter().find(|row| row[1] == "reserved").unwrap();
    assert_eq!(reserved[5], "10.00 USD lowest");

    assert!(dom.contains(r#"id="burn-chart" role="img" aria-label="Spend 84.60 USD"#));
}

#[tokio::test]
async fn the_task_page_shows_what_the_api_says_of_the_task() {
    let app = TestApp::spawn().await;
    finance_month(&app).await;
    let reader = app.token("reader", &["vision"]).await;
    let task = app
        .get("/v1/projects/vision/tasks/t2", &reader)
        .await
        .json();
    let served = app.serve().await;
    let origin = served.url();
    let url = format!("{origin}/#token={reader}&project=vision&month=2026-11");
    let seen = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&url);
        // From the list to the task, by its link.
        browser.click(r#"a[href$="task=t2"]"#);
        browser.wait_for("document.querySelector('#attempt-rows')");
        browser.wait_loaded();
        let mut doms = vec![browser.dom()];
        let mut overflows = vec![("task at 1280 px".to_owned(), overflow(&mut browser))];
        browser.screenshot(&screenshot_path("task-1280.png"));
        browser.resize(390, 844);
        browser.open(&format!("{url}&task=t2"));
        overflows.push(("task at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("task-390.png"));
        doms.push(browser.eval("location.hash").to_string());
        Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        }
    })
    .await
    .unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    let dom = &seen.doms[0];
    assert_task_page(dom, &task);
    assert!(text(dom).contains("Final cost 33.60 USD"));
    assert_eq!(seen.doms[1], "\"#project=vision&month=2026-11&task=t2\"");
}

/// A GET without a token, as a browser asks for the page and its files.
async fn plain_get(app: &TestApp, path: &str) -> crate::common::TestResponse {
    app.call(axum::http::Method::GET, path, None, None).await
}

#[tokio::test]
async fn the_dashboard_serves_its_script_style_and_charting_library_itself() {
    let app = TestApp::spawn().await;
    let page = plain_get(&app, "/").await;
    let policy = page.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("default-src 'none'") && policy.contains("script-src 'self'"));
    let html = page.text();
    for (path, kind) in [
        ("/assets/app.js", "text/javascript; charset=utf-8"),
        ("/assets/app.css", "text/css; charset=utf-8"),
        (
            "/assets/uPlot-1.6.32.iife.min.js",
            "text/javascript; charset=utf-8",
        ),
        ("/assets/uPlot-1.6.32.min.css", "text/css; charset=utf-8"),
        (
            "/assets/uPlot-1.6.32.LICENSE.txt",
            "text/plain; charset=utf-8",
        ),
    ] {
        let asset = plain_get(&app, path).await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert_eq!(asset.content_type(), kind, "{path}");
        assert!(!asset.text().contains("//cdn."), "{path} names a CDN");
        if path.contains("uPlot") && !path.ends_with(".txt") {
            assert!(html.contains(path), "the page loads {path}");
        }
        let etag = asset.headers["etag"].to_str().unwrap().to_owned();
        let again = app
            .send(
                axum::http::Request::builder()
                    .uri(path)
                    .header("If-None-Match", &etag)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await;
        assert_eq!(again.status, StatusCode::NOT_MODIFIED, "{path}");
    }
    let library = plain_get(&app, "/assets/uPlot-1.6.32.iife.min.js").await;
    assert!(
        library.headers["cache-control"]
            .to_str()
            .unwrap()
            .contains("immutable")
    );
    assert!(
        library
            .text()
            .starts_with("/*! https://github.com/leeoniya/uPlot (v1.6.32) */")
    );
    let licence = plain_get(&app, "/assets/uPlot-1.6.32.LICENSE.txt").await;
    assert!(licence.text().starts_with("The MIT License (MIT)"));
    plain_get(&app, "/assets/nothing.js")
        .await
        .problem(StatusCode::NOT_FOUND);
}

/// The demo's "now": twenty days into November 2026, so October is complete.
const DEMO_UNTIL: &str = "2026-11-20T12:00:00Z";

/// The demo loaded into a fresh app whose clock stands at [`DEMO_UNTIL`].
async fn demo_app() -> (TestApp, Settings, Loaded) {
    let until = DEMO_UNTIL.parse().unwrap();
    let settings = Settings {
        clock: Clock::Fixed(until),
        ..Settings::default()
    };
    let app = TestApp::spawn_with(settings).await;
    let loaded = demo::load(&app.pool, until, &settings).await.unwrap();
    (app, settings, loaded)
}

#[tokio::test]
async fn on_the_demo_the_finance_page_shows_the_reports_and_closes_october() {
    let (app, settings, loaded) = demo_app().await;
    let finance = loaded.tokens.finance.token.clone();
    let october = app
        .get("/v1/reports/monthly/2026-10", &finance)
        .await
        .json();
    let november = app
        .get("/v1/reports/monthly/2026-11", &finance)
        .await
        .json();
    let served = app.serve_with(settings).await;
    let origin = served.url();
    let october_url = format!("{origin}/#token={finance}&page=finance&month=2026-10");
    let november_url = format!("{origin}/#page=finance&month=2026-11");
    let seen = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&october_url);
        let mut doms = vec![browser.dom()];
        let mut overflows = vec![("demo finance at 1280 px".to_owned(), overflow(&mut browser))];
        browser.screenshot(&screenshot_path("demo-finance-october-1280.png"));
        browser.open(&november_url);
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("demo-finance-november-1280.png"));
        browser.resize(390, 844);
        browser.open(&november_url);
        overflows.push(("demo finance at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("demo-finance-390.png"));
        browser.resize(1280, 900);
        browser.open(&october_url);
        browser.click("#close-month");
        browser.wait_for("document.querySelector('#close-dialog').open");
        browser.click("#close-confirm");
        browser.wait_for("document.querySelector('#month-state').textContent.startsWith('Closed')");
        browser.wait_loaded();
        doms.push(browser.dom());
        Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        }
    })
    .await
    .unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    let (open_october, open_november, closed_october) =
        (&seen.doms[0], &seen.doms[1], &seen.doms[2]);
    assert_finance_page(open_october, &october);
    assert_finance_page(open_november, &november);
    assert!(october["projects"].as_array().unwrap().len() >= 5);
    assert!(
        november["totals"].as_array().unwrap().len() > 1,
        "several currencies"
    );
    assert!(open_november.contains(r#"id="close-month" disabled="""#));
    assert!(text(open_november).contains("forecast"));
    assert!(!open_october.contains(r#"id="close-month" disabled"#));
    assert!(text(closed_october).contains("October 2026 is closed"));
    let closed = app
        .get("/v1/reports/monthly/2026-10", &finance)
        .await
        .json();
    assert_eq!(closed["closed"], true);
}

#[tokio::test]
async fn on_the_demo_a_reader_sees_its_projects_burn_comparison_and_tasks() {
    let (app, settings, loaded) = demo_app().await;
    let reader = loaded.tokens.reader.token.clone();
    let project = demo::READER_PROJECTS[0];
    let base = format!("/v1/projects/{project}");
    let burn = app
        .get(&format!("{base}/burn?month=2026-11"), &reader)
        .await
        .json();
    let by_model = app
        .get(
            &format!("{base}/cost?month=2026-11&group_by=gpu_model,billing_mode"),
            &reader,
        )
        .await
        .json();
    let by_team = app
        .get(
            &format!("{base}/cost?month=2026-11&group_by=label:team"),
            &reader,
        )
        .await
        .json();
    // The costliest task of October that needed more than one attempt.
    let tasks = app
        .get(
            &format!("{base}/tasks?month=2026-10&sort=cost&limit=1000"),
            &reader,
        )
        .await
        .json();
    let retried = tasks["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["attempts"].as_i64().unwrap() > 1)
        .expect("the demo retries tasks")["task_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let task = app
        .get(&format!("{base}/tasks/{retried}"), &reader)
        .await
        .json();
    let served = app.serve_with(settings).await;
    let origin = served.url();
    let project_url = format!("{origin}/#token={reader}&project={project}&month=2026-11");
    let hash: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("project", project)
        .append_pair("month", "2026-10")
        .append_pair("task", &retried)
        .finish();
    let task_url = format!("{origin}/#{hash}");
    let seen = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&project_url);
        let mut doms = vec![browser.dom()];
        let mut overflows = vec![("demo project at 1280 px".to_owned(), overflow(&mut browser))];
        browser.screenshot(&screenshot_path("demo-project-1280.png"));
        browser.open(&task_url);
        doms.push(browser.dom());
        overflows.push(("demo task at 1280 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("demo-task-1280.png"));
        browser.resize(390, 844);
        browser.open(&project_url);
        overflows.push(("demo project at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("demo-project-390.png"));
        browser.open(&task_url);
        overflows.push(("demo task at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("demo-task-390.png"));
        Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        }
    })
    .await
    .unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    assert_project_page(&seen.doms[0], &burn, &by_model, &by_team);
    assert!(!burn["budget"].is_null(), "the demo budgets every project");
    assert!(!seen.doms[0].contains(">Finance</a>"));
    assert_task_page(&seen.doms[1], &task);
}

/// The fleet page: each pool's month as the utilisation endpoint has it, with its days
/// stacked, the nodes idle longest, and the nodes idle right now with their cost per hour.
#[tokio::test]
async fn the_fleet_page_shows_each_pools_paid_used_idle_and_down_and_the_nodes_idle_now() {
    let app = crate::capacity::two_pools().await;
    // Node `c` of `train` has been up since noon with no job on it.
    let response = app
        .post(
            "/v1/capacity",
            &app.admin,
            json!([{"node": "c", "pool": "train", "gpu_model": "H100", "gpus": 4,
                    "billing_mode": "on_demand", "from": "2026-11-19T12:00:00Z",
                    "until": "2026-11-20T00:00:00Z", "state": "up"}]),
        )
        .await;
    assert_eq!(response.status, StatusCode::OK, "{}", response.text());
    let finance = app.token("finance", &[]).await;
    let train = app
        .get("/v1/pools/train/utilisation?month=2026-11", &app.admin)
        .await
        .json();
    let at_noon_plus_twelve = Settings {
        clock: Clock::Fixed("2026-11-20T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let doms = pages_at(
        &app,
        at_noon_plus_twelve,
        &finance,
        &[
            "page=fleet&month=2026-11",
            "page=finance&month=2026-11",
            "project=vision&month=2026-11",
        ],
    )
    .await;
    // The owner's project page has its pools' idle and down time in where the money went.
    let vision = app
        .get("/v1/projects/vision/cost?month=2026-11", &app.admin)
        .await
        .json();
    let project_text = text(&doms[2]);
    for (label, part) in [
        ("Idle capacity", "capacity_idle"),
        ("Down capacity", "capacity_down"),
    ] {
        let expected = format!("{label} {}", shown(&vision["breakdown"][part], "USD"));
        assert!(
            project_text.contains(&expected),
            "{expected} in {project_text}"
        );
    }
    let fleet = &doms[0];
    let zombies = table_rows(fleet, "zombie-rows");
    assert_eq!(zombies.len(), 1, "{zombies:?}");
    assert_eq!(zombies[0][0], "c");
    assert_eq!(zombies[0][1], "train");
    assert_eq!(zombies[0][2], "4 × H100");
    assert_eq!(zombies[0][5], "8.00 USD");
    assert_eq!(zombies[0][6], "96.00 USD");
    let shown_text = text(fleet);
    assert!(
        shown_text.contains(&format!("Paid {}", shown(&train["paid"]["cost"], "USD"))),
        "{shown_text}"
    );
    assert!(shown_text.contains(&format!("Idle {}", shown(&train["idle"]["cost"], "USD"))));
    assert!(shown_text.contains("Charged: vision"), "{shown_text}");
    assert!(fleet.contains(r#"class="day-column""#));
    assert_eq!(fleet.matches(r#"<section class="pool""#).count(), 2);

    let pools = table_rows(&doms[1], "pool-rows");
    assert_eq!(pools.len(), 2);
    assert_eq!(pools[1][0], "train");

    let served = app.serve_with(at_noon_plus_twelve).await;
    let origin = served.url();
    let path = screenshot_path("fleet-page.png");
    let project_path = screenshot_path("project-capacity.png");
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 1400);
        browser.open(&format!(
            "{origin}/#token={finance}&page=fleet&month=2026-11"
        ));
        browser.screenshot(&path);
        browser.open(&format!("{origin}/#project=vision&month=2026-11"));
        browser.screenshot_of("header, #daily", &project_path);
    })
    .await
    .unwrap();
    served.stop().await;
}

/// The finance page's cloud-bill panel: each provider's bill of the billing period set
/// against capacity as the reconciliation endpoint has it, and the rows on no node by
/// service.
#[tokio::test]
async fn the_finance_page_sets_each_providers_bill_against_capacity() {
    let app = crate::bills::billed_fleet().await;
    let response = crate::bills::post_bill(
        &app,
        "/v1/bills?pool=billed",
        crate::bills::constructed_bill("98.32").into_bytes(),
        "text/csv",
    )
    .await;
    assert_eq!(response.status, StatusCode::CREATED, "{}", response.text());
    let finance = app.token("finance", &[]).await;
    let reconciliation = app
        .get("/v1/reports/monthly/2026-11/reconciliation", &app.admin)
        .await
        .json();
    let at = Settings {
        clock: Clock::Fixed("2026-11-02T08:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let doms = pages_at(&app, at, &finance, &["page=finance&month=2026-11"]).await;
    let rows = table_rows(&doms[0], "reconciliation-rows");
    assert_eq!(rows.len(), 2, "{rows:?}");
    for (row, expected) in rows
        .iter()
        .zip(reconciliation["providers"].as_array().unwrap())
    {
        let c = expected["currency"].as_str().unwrap();
        assert!(
            row[0].starts_with(expected["provider"].as_str().unwrap()),
            "{row:?}"
        );
        assert_eq!(row[1], shown(&expected["billed_total"], c));
        assert!(
            row[2].starts_with(&shown(&expected["capacity_billed"], c)),
            "{row:?}"
        );
        assert_eq!(row[3], shown(&expected["used"], c));
        assert_eq!(row[4], shown(&expected["idle"], c));
        assert_eq!(row[5], shown(&expected["down"], c));
        assert!(
            row[6].starts_with(&shown(&expected["unmatched_total"], c)),
            "{row:?}"
        );
        assert!(
            row[7].starts_with(&shown(&expected["price_variance"], c)),
            "{row:?}"
        );
    }
    assert_eq!(rows[0][3], "49.16 USD");
    assert_eq!(rows[0][7], "-41.16 USD contracts below the bill");
    let page = text(&doms[0]);
    assert!(page.contains("AWS (USD): 1 service on no node"), "{page}");

    let served = app.serve_with(at).await;
    let origin = served.url();
    let path = screenshot_path("finance-bills.png");
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 1000);
        browser.open(&format!(
            "{origin}/#token={finance}&page=finance&month=2026-11"
        ));
        browser.screenshot_of("#reconciliation", &path);
    })
    .await
    .unwrap();
    served.stop().await;
}

/// The planning page: the plan of a model's month as the API has it (the recommendation, the
/// curve, the reservations against break-even, spot), and with prices given, the month's
/// report at those prices beside the report as priced.
#[tokio::test]
async fn the_planning_page_shows_the_plan_and_the_month_at_what_if_prices() {
    let app = crate::planning::ten_hours().await;
    let finance = app.token("finance", &[]).await;
    let at = Settings {
        clock: Clock::Fixed("2026-12-02T08:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let get = |path: String| {
        let app = &app;
        async move {
            let response = app.get(&path, &app.admin).await;
            assert_eq!(response.status, StatusCode::OK, "{}", response.text());
            response.json()
        }
    };
    let plan = get("/v1/planning/reservations?gpu_model=A100&month=2026-11".to_owned()).await;
    let cheap = get(
        "/v1/planning/reservations?gpu_model=A100&month=2026-11&reserved_price=0.01&on_demand_price=2.5"
            .to_owned(),
    )
    .await;
    // 720 hours: reserving costs 7.2 a GPU at 0.01, against 2.5 for each busier hour.
    assert_eq!(cheap["recommended_gpus"], 2);
    let actual = get("/v1/reports/monthly/2026-11".to_owned()).await;
    let hypothetical = get(
        "/v1/reports/monthly/2026-11?what_if=A100/reserved:0.01&what_if=A100/on_demand:2.5"
            .to_owned(),
    )
    .await;
    let doms = pages_at(
        &app,
        at,
        &finance,
        &[
            "page=planning&month=2026-11&model=A100",
            "page=planning&month=2026-11&model=A100&reserved=0.01&on_demand=2.5",
        ],
    )
    .await;
    for (dom, plan) in doms.iter().zip([&plan, &cheap]) {
        let page = text(dom);
        let reserve = format!("Reserve {} GPUs", plan["recommended_gpus"]);
        assert!(page.contains(&reserve), "{reserve}: {page}");
        assert!(
            page.contains(&shown(&plan["cost_at_recommended"], "USD")),
            "{page}"
        );
        let curve = table_rows(dom, "plan-curve-rows");
        assert_eq!(curve.len(), plan["curve"].as_array().unwrap().len());
        for (row, point) in curve.iter().zip(plan["curve"].as_array().unwrap()) {
            assert_eq!(row[0], point["gpus"].to_string());
            assert_eq!(row[1], shown(&point["cost"], "USD"));
        }
        let held = table_rows(dom, "plan-contract-rows");
        assert_eq!(held.len(), 1);
        assert!(held[0][0].starts_with("A100 reserved"), "{held:?}");
        assert_eq!(held[0][4], "Over-reserved");
        assert_eq!(held[0][5], shown(&plan["contracts"][0]["wasted"], "USD"));
        assert!(page.contains("1 of 3 attempts preempted"), "{page}");
    }
    assert!(!doms[0].contains("plan-what-if-rows"));
    let what_if = table_rows(&doms[1], "plan-what-if-rows");
    assert_eq!(what_if.len(), 1, "{what_if:?}");
    assert_eq!(what_if[0][1], shown(&actual["totals"][0]["total"], "USD"));
    assert_eq!(
        what_if[0][2],
        shown(&hypothetical["totals"][0]["total"], "USD")
    );

    let served = app.serve_with(at).await;
    let origin = served.url();
    let path = screenshot_path("planning.png");
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 2400);
        browser.open(&format!(
            "{origin}/#token={finance}&page=planning&month=2026-11&model=A100&reserved=0.01&on_demand=2.5"
        ));
        browser.screenshot_of("main", &path);
    })
    .await
    .unwrap();
    served.stop().await;
}

#[tokio::test]
async fn the_project_and_fleet_pages_show_energy_and_what_an_idle_minute_costs() {
    let app = TestApp::spawn().await;
    crate::owned_cards::metered_month(&app).await;
    let finance = app.token("finance", &[]).await;
    // After the cards' depreciation ended on the 20th: 0.25 an hour.
    let at = Settings {
        clock: Clock::Fixed("2026-11-25T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let cost = app
        .get("/v1/projects/vision/cost?month=2026-11", &app.admin)
        .await
        .json();
    let doms = pages_at(
        &app,
        at,
        &finance,
        &["project=vision&month=2026-11", "page=fleet&month=2026-11"],
    )
    .await;
    let project = text(&doms[0]);
    // 2.4 kWh over 6 of 8 GPU-hours; 0.768 kg over 4 of them.
    assert_eq!(cost["energy"]["kwh"], "2.4");
    assert!(
        project.contains("Energy 2.400 kWh measured for 75% of GPU time"),
        "{project}"
    );
    assert!(
        project.contains("Emissions 0.77 kg CO2e for 50% of GPU time"),
        "{project}"
    );
    assert!(project.contains("Per token 0.0008 kWh"), "{project}");
    for dom in &doms {
        let prices = table_rows(dom, "idle-minute-rows");
        assert_eq!(prices.len(), 1, "{prices:?}");
        // 0.25 ÷ 60 = 0.0041666… a GPU-minute.
        assert_eq!(
            prices[0][..5],
            ["A100", "reserved", "owned A100", "0.0042 USD", "0.25 USD"]
        );
        assert!(
            prices[0][5].starts_with("depreciation 0.0000 · other 0.1000 · power 0.1500 per hour"),
            "{prices:?}"
        );
        assert!(prices[0][5].contains("2026-11-20"), "{prices:?}");
    }
    let tasks = table_rows(&doms[0], "task-rows");
    let metered = tasks.iter().find(|row| row[0] == "metered").unwrap();
    assert_eq!(metered.last().unwrap(), "1.600 kWh 0.77 kg CO2e");
    let estimated = tasks.iter().find(|row| row[0] == "estimated").unwrap();
    assert_eq!(estimated.last().unwrap(), "—");

    let served = app.serve_with(at).await;
    let origin = served.url();
    let path = screenshot_path("energy.png");
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 1600);
        browser.open(&format!(
            "{origin}/#token={finance}&project=vision&month=2026-11"
        ));
        browser.screenshot_of("#utilisation, #energy, #idle-minute", &path);
    })
    .await
    .unwrap();
    served.stop().await;
}

#[tokio::test]
async fn the_project_page_shows_mfu_and_why_each_workloads_cost_per_unit_moved() {
    let at = Settings {
        clock: Clock::Fixed("2026-11-25T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let app = crate::efficiency::priced_app_at(at).await;
    app.ingest(crate::efficiency::records()).await;
    app.ingest(crate::efficiency::workload_records()).await;
    let doms = pages_at(&app, at, &app.admin, &["project=vision&month=2026-11"]).await;
    let project = text(&doms[0]);
    // The records that report FLOPs did 4.73355e18 of 1.00287e19 at the peak.
    assert!(project.contains("MFU 47%"), "{project}");
    assert!(project.contains("Per effective GPU-hour"), "{project}");
    let rows = table_rows(&doms[0], "efficiency-rows");
    let chat = rows.iter().find(|row| row[0].starts_with("chat")).unwrap();
    // 0.01 → 0.016 a token: +60% = price +100% × throughput −33% × overhead +20%.
    assert_eq!(
        chat[1..],
        [
            "0.01",
            "0.016",
            "+60%",
            "+100%",
            "−33%",
            "+20%",
            "price per GPU-hour A100 → H100 · 1 failed attempt"
        ]
    );
    assert!(rows.iter().any(|row| row[0].starts_with("other")));

    screenshot_vision_november(
        &app,
        at,
        1400,
        "#utilisation, #efficiency",
        "efficiency.png",
    )
    .await;
}

/// Screenshots `selector` of project `vision`'s November page, as the admin sees it at `at`.
async fn screenshot_vision_november(
    app: &TestApp,
    at: Settings,
    height: u32,
    selector: &'static str,
    name: &str,
) {
    let served = app.serve_with(at).await;
    let origin = served.url();
    let token = app.admin.clone();
    let path = screenshot_path(name);
    tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, height);
        browser.open(&format!(
            "{origin}/#token={token}&project=vision&month=2026-11"
        ));
        browser.screenshot_of(selector, &path);
    })
    .await
    .unwrap();
    served.stop().await;
}

#[tokio::test]
async fn the_project_page_shows_its_routes_with_burn_caps_and_retry_storms() {
    let now = Settings {
        clock: Clock::Fixed("2026-11-03T00:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let app = TestApp::spawn_with(now).await;
    app.create_project("vision", "USD").await;
    contract("H100", "on_demand", "10").create(&app).await;
    let route = app
        .put(
            "/v1/projects/vision/routes/route/summarise",
            &app.admin,
            json!({"monthly_budget": "100", "max_attempts_per_task": 3,
                   "max_failed_spend_per_hour": "10"}),
        )
        .await;
    assert_eq!(route.status, StatusCode::OK, "{}", route.text());
    // Task a fails four times, 30 minutes on one H100 each (5.00 an hour, within the hourly
    // cap); its 4th attempt is beyond the cap of 3. With the completed 4 hours (40.00) the
    // route spends 60.00 of its 100.00.
    let mut records: Vec<Value> = (0..4u32)
        .map(|n| {
            record(
                "a",
                &format!("2026-11-01T0{n}:00:00Z"),
                &format!("2026-11-01T0{n}:30:00Z"),
            )
            .attempt(n + 1)
            .outcome("failed")
            .label("route", "summarise")
            .into()
        })
        .collect();
    records.push(
        record("s", "2026-11-01T10:00:00Z", "2026-11-01T14:00:00Z")
            .label("route", "summarise")
            .into(),
    );
    app.ingest(records).await;
    let reader = app.token("reader", &["vision"]).await;

    let served = app.serve_with(now).await;
    let url = format!(
        "{}/#token={reader}&project=vision&month=2026-11",
        served.url()
    );
    let dom = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        browser.open(&url);
        browser.screenshot_of("#routes", &screenshot_path("routes-panel.png"));
        browser.dom()
    })
    .await
    .unwrap();
    served.stop().await;

    let rows = table_rows(&dom, "route-rows");
    assert_eq!(
        rows,
        [[
            "route=summarise",
            "100.00 USD",
            "60.00 USD",
            "60.0%",
            "3",
            "10.00 USD",
            "task a attempt 4 (cap 3)",
        ]]
    );
    assert!(
        text(&dom).contains("Retry storm on route=summarise: task a attempt 4 (cap 3)"),
        "the alerts panel names the storm"
    );
}

#[tokio::test]
async fn the_project_page_lists_the_workloads_regressed_now() {
    let app = crate::regressions::app().await;
    app.ingest(crate::regressions::scenario(1..=17, 15)).await;
    assert_eq!(
        crate::regressions::judge(&app, &crate::regressions::at(18, 1)).await,
        1
    );
    let at = Settings {
        clock: Clock::Fixed("2026-11-30T23:00:00Z".parse().unwrap()),
        ..Settings::default()
    };
    let doms = pages_at(&app, at, &app.admin, &["project=vision&month=2026-11"]).await;
    let project = text(&doms[0]);
    // summarise went from 0.08 to 0.16 USD a token on days 15–17: +100 %, 16 USD a day more,
    // twice the GPU-hours per token.
    assert!(project.contains("Regressed now"), "{project}");
    assert!(
        project.contains("summarise per token: 0.08 → 0.16 USD (+100%) since 2026-11-15"),
        "{project}"
    );
    assert!(project.contains("a day more"), "{project}");
    assert!(project.contains("largest: GPU-hours per unit"), "{project}");
    assert!(
        project.contains("Cost per unit regressed: summarise per token +100% since 2026-11-15"),
        "{project}"
    );
    for calm in ["translate", "spiky", "cheap", "rare"] {
        assert!(
            !project.contains(&format!("{calm} per token:")),
            "{calm} is not regressed: {project}"
        );
    }

    screenshot_vision_november(&app, at, 1000, "#efficiency", "regressions.png").await;
}

/// Sets the value of the form control `selector` picks as typing or choosing would, with the
/// events a person's input fires.
pub fn fill(browser: &mut Browser, selector: &str, value: &str) {
    let selector = serde_json::to_string(selector).unwrap();
    let value = serde_json::to_string(value).unwrap();
    browser.eval(&format!(
        "(() => {{ const e = document.querySelector({selector}); e.focus(); e.value = {value};
           e.dispatchEvent(new Event('input', {{bubbles: true}}));
           e.dispatchEvent(new Event('change', {{bubbles: true}})); }})()"
    ));
}

/// The text of the element with this id as the page shows it now.
pub fn shown_text(browser: &mut Browser, id: &str) -> String {
    browser
        .eval(&format!("document.getElementById('{id}').textContent"))
        .as_str()
        .unwrap_or_default()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn the_channels_page_lists_adds_tests_and_deletes_channels() {
    let app = TestApp::spawn().await;
    let vision = crate::channels::project(&app, "vision").await;
    let slack = Receiver::start(Platform::Slack).await;
    let created = app
        .post(
            "/v1/channels",
            &app.admin,
            json!({"name": "ML <b>on-call</b>", "kind": "slack", "target": slack.url(),
                   "projects": ["vision"]}),
        )
        .await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text());
    let slack_id = created.json()["id"].as_str().unwrap().to_owned();
    // Two budget alerts reach the channel, so that it has deliveries to show.
    crate::alerts::fire(&app, &vision, 850).await;
    let worker = ChannelDeliveries::new(
        app.pool.clone(),
        Arc::new(Notifier::unconfigured()),
        crate::alerts::quick_policy(),
    );
    assert_eq!(worker.deliver_due().await.unwrap(), 2);
    assert_eq!(slack.received().len(), 2);

    let finance = app.token("finance", &[]).await;
    let reader = app.token("reader", &["vision"]).await;
    let admin = app.admin.clone();
    let served = app.serve().await;
    let origin = served.url();
    let at = |token: &str| format!("{origin}/#token={token}&page=channels");
    let (admin_url, finance_url, reader_url) = (at(&admin), at(&finance), at(&reader));
    let id = slack_id.clone();
    let received_before_test = slack.received().len();

    // The browser runs on a blocking thread while the server and the receiver answer it here.
    let browser_run = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        let mut doms = Vec::new();
        let mut overflows = Vec::new();
        browser.open(&admin_url);
        doms.push(browser.dom());

        browser.click(&format!(r#"button[data-channel-test="{id}"]"#));
        browser.wait_for(&format!(
            "!['', 'Sending…'].includes(document.getElementById('test-result-{id}').textContent)"
        ));
        let test_result = shown_text(&mut browser, &format!("test-result-{id}"));

        browser.click(&format!(r#"button[data-channel-deliveries="{id}"]"#));
        browser.wait_for(&format!("document.getElementById('delivery-rows-{id}')"));
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("channels-1280.png"));
        browser.click(&format!(r#"button[data-channel-deliveries="{id}"]"#));
        browser.wait_for(&format!("!document.getElementById('deliveries-of-{id}')"));

        // A second channel through the form: email, to finance, for closed months only.
        fill(&mut browser, "#channel-kind", "email");
        let email_label = shown_text(&mut browser, "channel-target-label");
        fill(&mut browser, "#channel-name", "Finance mail");
        fill(&mut browser, "#channel-target", "finance@example.com");
        browser.click(r#"input[name="alert_kinds"][value="month_closed"]"#);
        browser.click("#channel-submit");
        browser.wait_for("document.querySelectorAll('#channel-rows tr').length === 2");
        doms.push(browser.dom());

        // A bad form: each error the API names is shown by its field, and nothing is added.
        fill(&mut browser, "#channel-name", "");
        fill(&mut browser, "#channel-kind", "email");
        fill(&mut browser, "#channel-target", "finance at example.com");
        browser.click("#channel-submit");
        browser.wait_for("!document.getElementById('channel-target-error').hidden");
        let target_error = shown_text(&mut browser, "channel-target-error");
        let name_error = shown_text(&mut browser, "channel-name-error");
        let target_invalid =
            browser.eval("document.getElementById('channel-target').getAttribute('aria-invalid')");
        doms.push(browser.dom());
        browser.screenshot_of("#channel-add", &screenshot_path("channels-form-errors.png"));

        browser.resize(390, 844);
        browser.open(&admin_url);
        browser.click(&format!(r#"button[data-channel-deliveries="{id}"]"#));
        browser.wait_for(&format!("document.getElementById('delivery-rows-{id}')"));
        overflows.push(("channels at 390 px".to_owned(), overflow(&mut browser)));
        browser.screenshot(&screenshot_path("channels-390.png"));
        browser.resize(1280, 900);

        // Finance sees the channels with their targets masked.
        browser.open(&finance_url);
        doms.push(browser.dom());
        browser.screenshot(&screenshot_path("channels-finance.png"));

        // A reader has no channels page and no link to one.
        browser.open(&reader_url);
        doms.push(browser.dom());

        // Deleting asks first, then the channel is gone from the table.
        browser.open(&admin_url);
        browser.eval("window.confirm = (message) => { window.asked = message; return true; }");
        browser.click(&format!(r#"button[data-channel-delete="{id}"]"#));
        browser.wait_for("document.querySelectorAll('#channel-rows tr').length === 1");
        let asked = browser.eval("window.asked");
        doms.push(browser.dom());
        browser.click("#channel-rows button[data-channel-delete]");
        browser.wait_for("document.getElementById('channels-empty')");
        doms.push(browser.dom());
        let seen = Seen {
            doms,
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: overflows,
        };
        (
            seen,
            test_result,
            email_label,
            target_error,
            name_error,
            target_invalid,
            asked,
        )
    });
    let (seen, test_result, email_label, target_error, name_error, target_invalid, asked) =
        browser_run.await.unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    let [
        listed,
        deliveries,
        added,
        bad_form,
        finance_view,
        reader_view,
        deleted,
        none,
    ] = &seen.doms[..]
    else {
        panic!("{} pages", seen.doms.len())
    };

    // The channel as the API has it; its name is shown as text, not markup.
    let rows = table_rows(listed, "channel-rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0][..5],
        [
            "ML <b>on-call</b>",
            "Slack",
            slack.url().as_str(),
            "vision",
            "all"
        ]
    );
    assert_eq!(
        rows[0][5],
        created.json()["created_at"].as_str().unwrap()[..16].replace('T', " ")
    );
    assert!(listed.contains("ML &lt;b&gt;on-call&lt;/b&gt;"));
    assert!(!listed.contains("<b>on-call</b>"));
    assert!(rows[0][6].contains("Send test") && rows[0][6].contains("Delete"));
    assert!(
        listed.contains(">Channels</a>"),
        "a channels link for an admin"
    );

    // The test message reached the receiver, once, and the page says what it answered.
    assert!(
        test_result.starts_with("Delivered (200 ok)"),
        "{test_result}"
    );
    assert_eq!(slack.received().len(), received_before_test + 1);
    assert!(
        slack.received().last().unwrap().json()["text"]
            .as_str()
            .unwrap()
            .contains("Test message")
    );

    // Its latest deliveries: the two budget alerts, delivered at the first attempt.
    let delivered = table_rows(deliveries, &format!("delivery-rows-{slack_id}"));
    assert_eq!(delivered.len(), 2, "{delivered:?}");
    for row in &delivered {
        assert_eq!(row[1..], ["vision", "delivered", "1", "200"]);
    }

    // The form's channel is in the table as the API answered it.
    assert_eq!(email_label, "Email addresses (comma-separated)");
    let rows = table_rows(added, "channel-rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(
        rows[1][..5],
        [
            "Finance mail",
            "Email",
            "finance@example.com",
            "all",
            "Month closed"
        ]
    );
    assert!(text(added).contains("Channel Finance mail added."));

    // The bad form's errors are the API's, next to their fields.
    assert!(
        target_error.contains("`finance at example.com` is not an email address"),
        "{target_error}"
    );
    assert!(!name_error.is_empty(), "the empty name is named too");
    assert_eq!(target_invalid, json!("true"));
    assert_eq!(table_rows(bad_form, "channel-rows").len(), 2);

    // Finance sees where a channel sends, not the secret in its URL or the addresses.
    let rows = table_rows(finance_view, "channel-rows");
    let host = slack
        .url()
        .split('/')
        .nth(2)
        .unwrap()
        .split(':')
        .next()
        .unwrap()
        .to_owned();
    assert_eq!(rows[0][2], format!("http://{host}/…"));
    assert_eq!(rows[1][2], "…@example.com");
    let secret_path = &slack.url()[slack.url().find("/services/").unwrap()..];
    assert!(
        !finance_view.contains(secret_path),
        "the webhook's path is secret"
    );
    assert!(!finance_view.contains("finance@example.com"));
    assert!(text(finance_view).contains("only an admin token sees them whole"));

    assert!(
        !reader_view.contains(">Channels</a>"),
        "no channels link for a reader"
    );
    assert!(text(reader_view).contains("Channels need a finance or admin token"));
    assert!(!reader_view.contains("channel-rows"));

    // The deleted channel is gone; the other stays.
    assert!(
        asked.as_str().unwrap().contains("ML <b>on-call</b>"),
        "{asked}"
    );
    let rows = table_rows(deleted, "channel-rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], "Finance mail");
    assert!(text(deleted).contains("Channel ML <b>on-call</b> deleted."));
    assert!(text(none).contains("No channels yet: alerts go only to each project's webhook."));
    let left = app.get("/v1/channels", &app.admin).await.json();
    assert_eq!(left, json!([]));
}

/// The rows of the History table as a person reads them: when, who, action, and each field
/// that changed with its old and new value.
fn history_rows(browser: &mut Browser) -> Vec<Value> {
    browser.eval(
        "[...document.querySelectorAll('#history-rows tr')].map((tr) => ({
           who: tr.cells[1].firstChild.textContent.trim(),
           action: tr.cells[2].textContent.trim(),
           fields: Object.fromEntries([...tr.querySelectorAll('li[data-field]')].map((li) =>
             [li.dataset.field, [li.querySelector('del') ? li.querySelector('del').textContent : null,
                                 li.querySelector('ins') ? li.querySelector('ins').textContent
                                   : li.lastChild.textContent.trim()]])),
         }))",
    )
    .as_array()
    .unwrap()
    .clone()
}

#[tokio::test]
async fn the_history_tabs_show_who_changed_a_contract_and_a_project_and_what_moved() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    let finance = app.token("finance", &[]).await;
    let reader = app.token("reader", &["vision"]).await;
    let id = contract("H100", "on_demand", "2.50")
        .named("H100 <i>list</i> price")
        .create(&app)
        .await;
    let changed = app
        .patch(
            &format!("/v1/contracts/{id}"),
            &finance,
            json!({"price_per_gpu_hour": "2.75"}),
        )
        .await;
    assert_eq!(changed.status, StatusCode::OK, "{}", changed.text());
    let renamed = app
        .patch(
            "/v1/projects/vision",
            &app.admin,
            json!({"name": "Vision models", "team": "perception"}),
        )
        .await;
    assert_eq!(renamed.status, StatusCode::OK, "{}", renamed.text());

    let served = app.serve().await;
    let origin = served.url();
    let contracts_url = format!("{origin}/#token={finance}&page=contracts");
    let project_url = format!("{origin}/#token={finance}&project=vision");
    let reader_url = format!("{origin}/#token={reader}&project=vision");
    let contract_id = id.clone();
    let browser_run = tokio::task::spawn_blocking(move || {
        let mut browser = Browser::launch(1280, 900);
        // From the contracts list to the contract, then its History tab, as a person clicks.
        browser.open(&contracts_url);
        let listed = browser.eval("document.querySelectorAll('#contract-rows tr').length");
        browser.click("#contract-rows a");
        browser.wait_for("document.getElementById('tab-history')");
        let terms = shown_text(&mut browser, "terms");
        browser.click("#tab-history");
        browser.wait_for("document.getElementById('history-rows')");
        browser.wait_loaded();
        let hash = browser.eval("location.hash");
        let contract_rows = history_rows(&mut browser);
        let title = shown_text(&mut browser, "page-title");
        browser.screenshot(&screenshot_path("contract-history-1280.png"));
        browser.resize(390, 844);
        browser.open(&format!(
            "{contracts_url}&contract={contract_id}&tab=history"
        ));
        let narrow_overflow = overflow(&mut browser);
        browser.screenshot(&screenshot_path("contract-history-390.png"));
        browser.resize(1280, 900);

        // The project's History tab, reached from its overview.
        browser.open(&project_url);
        browser.click("#tab-history");
        browser.wait_for("document.getElementById('history-rows')");
        browser.wait_loaded();
        let project_rows = history_rows(&mut browser);
        let month_hidden = browser.eval("document.getElementById('month').closest('label').hidden");
        browser.screenshot(&screenshot_path("project-history-1280.png"));

        // A reader has no History tab and no contracts page.
        browser.open(&reader_url);
        let reader_tab = browser.eval("document.getElementById('tab-history') !== null");
        let reader_nav = shown_text(&mut browser, "nav");
        let seen = Seen {
            doms: vec![browser.dom()],
            requested: browser.requested().to_vec(),
            errors: browser.errors().to_vec(),
            overflow: vec![("contract history at 390 px".to_owned(), narrow_overflow)],
        };
        (
            seen,
            listed,
            terms,
            hash,
            contract_rows,
            title,
            project_rows,
            month_hidden,
            (reader_tab, reader_nav),
        )
    });
    let (seen, listed, terms, hash, contract_rows, title, project_rows, month_hidden, reader) =
        browser_run.await.unwrap();
    served.stop().await;
    assert_all_local(&seen, &origin);
    for (page, overflow) in &seen.overflow {
        assert!(*overflow <= 0, "{page} is {overflow} px too wide");
    }

    assert_eq!(listed, 1);
    assert!(terms.contains("2.75 USD per GPU-hour"), "{terms}");
    assert_eq!(
        hash,
        format!("#page=contracts&contract={id}&tab=history").as_str()
    );
    // The name is shown as text, not markup.
    assert_eq!(title, "H100 <i>list</i> price");
    // Newest first: finance's price change, old and new, then the admin's creation.
    assert_eq!(contract_rows.len(), 2, "{contract_rows:#?}");
    assert_eq!(contract_rows[0]["who"], "finance token");
    assert_eq!(contract_rows[0]["action"], "Changed");
    assert_eq!(
        contract_rows[0]["fields"],
        json!({"price_per_gpu_hour": ["2.5", "2.75"]})
    );
    assert_eq!(contract_rows[1]["who"], "test admin");
    assert_eq!(contract_rows[1]["action"], "Created");
    assert_eq!(contract_rows[1]["fields"]["price_per_gpu_hour"][1], "2.5");

    assert_eq!(project_rows.len(), 2, "{project_rows:#?}");
    assert_eq!(project_rows[0]["action"], "Changed");
    assert_eq!(
        project_rows[0]["fields"],
        json!({"name": ["vision", "Vision models"], "team": ["none", "perception"]})
    );
    assert_eq!(project_rows[1]["action"], "Created");
    assert_eq!(month_hidden, true);

    let (reader_tab, reader_nav) = reader;
    assert_eq!(reader_tab, false);
    assert!(!reader_nav.contains("Contracts"), "{reader_nav}");
}
