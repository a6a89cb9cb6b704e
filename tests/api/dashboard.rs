//! The dashboard as a user sees it: the page served at `/`, run by headless Chromium against
//! a real listening server.

use std::path::Path;
use std::process::Command;

use crate::common::TestApp;
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
    let served = app.serve().await;
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
            "2M tokens",
            "36.00 USD",
            "9.00 USD",
            "36.00 USD",
            "18.00 USD per 1M tokens",
        ],
        [
            "t2",
            "completed",
            "11-20 10:00",
            "2 (1 failed)",
            "28.0",
            "—",
            "—",
            "1M tokens",
            "33.60 USD",
            "14.40 USD",
            "33.60 USD",
            "33.60 USD per 1M tokens",
        ],
        [
            "t3",
            "completed",
            "11-10 00:00",
            "1",
            "10.0",
            "100%",
            "—",
            "500 samples",
            "10.00 USD",
            "0.00 USD",
            "10.00 USD",
            "20.00 USD per 1k samples",
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
            "5.00 USD",
            "0.00 USD",
            "10.00 USD",
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
            "0.00 USD + 1.0 GPU-h unrated",
            "0.00 USD",
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
    assert_eq!(listed[0][7], "3 <b>unit</b>");
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
    worked_example_with_queues(&app).await;
    lab_with_telemetry(&app).await;
    let reader = app.token("reader", &["vision", "lab"]).await;
    let served = app.serve().await;
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/screenshots");
    let shots = [
        (
            "project=vision&month=2026-11",
            "tasks-panel.png",
            "1280,1600",
        ),
        (
            "project=vision&month=2026-11&task=t2",
            "task-page.png",
            "1280,1100",
        ),
        (
            "project=lab&month=2026-11",
            "utilisation-panel.png",
            "1280,1000",
        ),
    ]
    .map(|(hash, file, size)| {
        (
            format!("{}/#token={reader}&{hash}", served.url()),
            folder.join(file),
            format!("--window-size={size}"),
        )
    });
    tokio::task::spawn_blocking(move || {
        for (url, path, size) in shots {
            let screenshot = format!("--screenshot={}", path.display());
            chromium(&url, &[&screenshot, &size, "--hide-scrollbars"]);
        }
    })
    .await
    .unwrap();
    served.stop().await;
}
