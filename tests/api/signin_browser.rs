//! The whole sign-in as a person does it, in headless Chromium, against the certified
//! OpenID Connect provider `oidc-provider`: the dashboard's button, the provider's login form,
//! the way back, what the dashboard then shows and keeps, writes without the CSRF token, a
//! reader kept to their project, and sign-out.

use std::sync::Arc;

use serde_json::{Value, json};

use taskledger::ledger::signin::SignIn;

use crate::browser::Browser;
use crate::common::TestApp;
use crate::common::issuer::{CLIENT_ID, CLIENT_SECRET};
use crate::common::oidc_provider::OidcProvider;
use crate::dashboard::{fill, screenshot_path, shown_text};
use crate::signin::{config, free_address};

/// Signs in at the provider's login form as `login`, from the dashboard's login page, and
/// waits for the dashboard to show the signed-in person.
fn sign_in(browser: &mut Browser, origin: &str, login: &str, name: &str) {
    browser.wait_for("document.getElementById('sso')");
    browser.click("#sso");
    browser.wait_for("document.querySelector('input[name=login]')");
    fill(browser, "input[name=login]", login);
    fill(
        browser,
        "input[name=password]",
        "any password does for the test provider",
    );
    browser.click("button[type=submit]");
    browser.wait_for(&format!(
        "location.origin === '{origin}' && document.getElementById('who').textContent.includes('{name}')"
    ));
    browser.wait_loaded();
}

fn status_of(browser: &mut Browser, fetch: &str) -> Value {
    browser.eval(&format!("{fetch}.then((r) => r.status)"))
}

#[tokio::test]
async fn people_sign_in_through_a_certified_provider_in_the_browser() {
    let app = TestApp::spawn().await;
    app.create_project("vision", "USD").await;
    app.create_project("nlp", "USD").await;
    let address = free_address();
    let origin = format!("http://{address}");
    let provider = OidcProvider::start(
        CLIENT_ID,
        CLIENT_SECRET,
        &format!("{origin}/auth/callback"),
        &[
            ("alice", "Alice Finance", &["staff", "finance-team"]),
            ("bob", "Bob Vision", &["vision-team"]),
        ],
    );
    let signin = SignIn::new(config(&provider.issuer, &origin, &[])).unwrap();
    let state = app
        .state(Default::default())
        .with_signin(Some(Arc::new(signin)));
    let served = app.serve_state(state, address).await;

    let run = tokio::task::spawn_blocking(move || {
        let mut seen = serde_json::Map::new();
        let mut browser = Browser::launch(1280, 900);
        browser.visit(&format!("{origin}/#page=finance"));
        browser.wait_for("document.getElementById('sso')");
        seen.insert("login_page".into(), json!(shown_text(&mut browser, "main")));
        browser.screenshot(&screenshot_path("signin-1280.png"));
        // A token pasted earlier is forgotten once the person signs in.
        browser.eval("localStorage.setItem('taskledger.token', 'tl_pasted_earlier')");

        sign_in(&mut browser, &origin, "alice", "Alice Finance");
        seen.insert("who".into(), json!(shown_text(&mut browser, "who")));
        seen.insert("hash".into(), browser.eval("location.hash"));
        seen.insert(
            "stored_token".into(),
            browser.eval("localStorage.getItem('taskledger.token')"),
        );
        seen.insert("script_cookies".into(), browser.eval("document.cookie"));
        browser.screenshot(&screenshot_path("signed-in-finance-1280.png"));

        let budget = "fetch('/v1/projects/vision/budgets/2026-12', {method: 'PUT', \
             headers: {'Content-Type': 'application/json'%CSRF%}, \
             body: JSON.stringify({amount: '1000'})})";
        seen.insert(
            "write_without_csrf".into(),
            status_of(&mut browser, &budget.replace("%CSRF%", "")),
        );
        let csrf = browser
            .eval("fetch('/auth/session').then((r) => r.json()).then((s) => s.session.csrf_token)");
        let with_csrf = budget.replace(
            "%CSRF%",
            &format!(", 'X-CSRF-Token': '{}'", csrf.as_str().unwrap()),
        );
        seen.insert(
            "write_with_csrf".into(),
            status_of(&mut browser, &with_csrf),
        );

        browser.click("#logout");
        browser.wait_for("document.getElementById('sso')");
        seen.insert(
            "after_sign_out".into(),
            status_of(&mut browser, "fetch('/v1/projects')"),
        );
        assert!(browser.errors().is_empty(), "{:?}", browser.errors());
        drop(browser);

        // Bob, in another browser: a reader of vision only.
        let mut browser = Browser::launch(1280, 900);
        browser.visit(&format!("{origin}/"));
        sign_in(&mut browser, &origin, "bob", "Bob Vision");
        seen.insert(
            "bob_projects".into(),
            browser.eval("[...document.querySelectorAll('#project option')].map((o) => o.value)"),
        );
        seen.insert(
            "bob_nlp".into(),
            status_of(&mut browser, "fetch('/v1/projects/nlp')"),
        );
        seen.insert(
            "bob_vision".into(),
            status_of(&mut browser, "fetch('/v1/projects/vision')"),
        );
        browser.screenshot(&screenshot_path("signed-in-reader-1280.png"));
        assert!(browser.errors().is_empty(), "{:?}", browser.errors());
        Value::Object(seen)
    });
    let seen = run.await.unwrap();
    served.stop().await;
    drop(provider);

    assert!(
        seen["login_page"]
            .as_str()
            .unwrap()
            .contains("Sign in with your organisation"),
        "{seen}"
    );
    assert_eq!(seen["who"], "Alice Finance · Finance");
    assert!(
        seen["hash"].as_str().unwrap().starts_with("#page=finance&"),
        "back where the sign-in began: {}",
        seen["hash"]
    );
    assert_eq!(seen["stored_token"], Value::Null);
    assert_eq!(seen["script_cookies"], "", "the session cookie is HttpOnly");
    assert_eq!(seen["write_without_csrf"], 403);
    assert_eq!(seen["write_with_csrf"], 200);
    assert_eq!(seen["after_sign_out"], 401);
    assert_eq!(seen["bob_projects"], json!(["vision"]));
    assert_eq!(seen["bob_nlp"], 404);
    assert_eq!(seen["bob_vision"], 200);
}
