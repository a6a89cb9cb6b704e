//! The dashboard as a user sees it: the page served at `/`, run by headless Chromium against
//! a real listening server.

use std::process::Command;

use crate::common::TestApp;
use crate::fixtures::worked_example;

/// Renders `url` in headless Chromium and returns the DOM once its scripts have run.
fn rendered_dom(url: &str) -> String {
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
        .arg("--dump-dom")
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
