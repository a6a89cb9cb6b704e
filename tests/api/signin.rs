//! Sign-in through an OpenID Connect provider, over real HTTP against the stand-in provider of
//! `common::issuer`: the code flow with PKCE, every check of the ID token, role mapping,
//! CSRF on writes, session expiry and sign-out. The whole sign-in in a browser against the
//! certified `oidc-provider` is in `signin_browser`.

use std::collections::HashMap;
use std::sync::Arc;

use axum::http::StatusCode;
use serde_json::{Value, json};

use taskledger::ledger::signin::{OidcConfig, SignIn};

use crate::common::issuer::{CLIENT_ID, CLIENT_SECRET, Flaw, Issuer};
use crate::common::{Served, TestApp};

pub const ROLES: &str =
    "platform=admin; finance-team=finance; vision-team=reader:vision; nlp-team=reader:nlp";

/// A free port of 127.0.0.1, for a server that must know its own URL before it listens.
pub fn free_address() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The sign-in configuration of a service at `public_url` signing in through `issuer`.
pub fn config(issuer: &str, public_url: &str, extra: &[(&str, &str)]) -> OidcConfig {
    let mut vars: HashMap<String, String> = [
        ("TASKLEDGER_OIDC_ISSUER", issuer),
        ("TASKLEDGER_OIDC_CLIENT_ID", CLIENT_ID),
        ("TASKLEDGER_OIDC_CLIENT_SECRET", CLIENT_SECRET),
        ("TASKLEDGER_PUBLIC_URL", public_url),
        ("TASKLEDGER_OIDC_ROLES", ROLES),
        ("TASKLEDGER_OIDC_SCOPES", "openid profile email groups"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    for (name, value) in extra {
        vars.insert((*name).to_owned(), (*value).to_owned());
    }
    OidcConfig::from_env(|name| vars.get(name).cloned())
        .unwrap()
        .unwrap()
}

struct SignInApp {
    app: TestApp,
    served: Served,
    issuer: Issuer,
    http: reqwest::Client,
}

impl SignInApp {
    async fn start() -> SignInApp {
        let issuer = Issuer::start().await;
        let app = TestApp::spawn().await;
        let address = free_address();
        let signin = SignIn::new(config(&issuer.url, &format!("http://{address}"), &[])).unwrap();
        let state = app
            .state(Default::default())
            .with_signin(Some(Arc::new(signin)));
        let served = app.serve_state(state, address).await;
        SignInApp {
            app,
            served,
            issuer,
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .unwrap(),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.served.url())
    }

    /// The callback URL the provider sends the browser to, and the sign-in cookie the browser
    /// holds meanwhile.
    async fn to_provider_and_back(&self, return_to: &str) -> (String, String) {
        let return_to: String = form_urlencoded::byte_serialize(return_to.as_bytes()).collect();
        let login = self
            .http
            .get(self.url(&format!("/auth/login?return_to={return_to}")))
            .send()
            .await
            .unwrap();
        assert_eq!(login.status(), StatusCode::FOUND);
        let at_provider = location(&login);
        assert!(at_provider.starts_with(&self.issuer.url), "{at_provider}");
        let attempt = set_cookie(&login, "taskledger_sign_in").expect("a sign-in cookie");
        assert!(attempt.contains("HttpOnly") && attempt.contains("SameSite=Lax"));
        let back = self.http.get(&at_provider).send().await.unwrap();
        (location(&back), cookie_pair(&attempt))
    }

    /// Signs in through the provider; the session cookie (`name=value`), or why not.
    async fn sign_in(&self) -> Result<String, String> {
        let (callback, attempt) = self.to_provider_and_back("/#page=finance").await;
        self.callback(&callback, Some(&attempt)).await
    }

    async fn callback(&self, callback: &str, cookie: Option<&str>) -> Result<String, String> {
        let mut request = self.http.get(callback);
        if let Some(cookie) = cookie {
            request = request.header("Cookie", cookie);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::SEE_OTHER);
        let to = location(&response);
        match to.strip_prefix("/#signin_error=") {
            Some(reason) => Err(form_urlencoded::parse(format!("r={reason}").as_bytes())
                .next()
                .unwrap()
                .1
                .into_owned()),
            None => {
                assert_eq!(to, "/#page=finance");
                let session = set_cookie(&response, "taskledger_session").expect("a session");
                assert!(session.contains("HttpOnly"), "{session}");
                assert!(session.contains("SameSite=Lax"), "{session}");
                assert!(session.contains("Path=/;"), "{session}");
                assert!(
                    !session.contains("Secure"),
                    "http on loopback: no Secure flag"
                );
                Ok(cookie_pair(&session))
            }
        }
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        cookie: &str,
        csrf: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut request = self
            .http
            .request(method, self.url(path))
            .header("Cookie", cookie);
        if let Some(csrf) = csrf {
            request = request.header("X-CSRF-Token", csrf);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, cookie: &str) -> (StatusCode, Value) {
        self.request(reqwest::Method::GET, path, cookie, None, None)
            .await
    }

    async fn session(&self, cookie: &str) -> Value {
        let (status, body) = self.get("/auth/session", cookie).await;
        assert_eq!(status, StatusCode::OK);
        body
    }

    async fn sessions_stored(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM sign_in_sessions")
            .fetch_one(&self.app.pool)
            .await
            .unwrap()
    }
}

fn location(response: &reqwest::Response) -> String {
    response.headers()["location"].to_str().unwrap().to_owned()
}

fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with(&format!("{name}=")))
}

fn cookie_pair(set_cookie: &str) -> String {
    set_cookie.split(';').next().unwrap().to_owned()
}

#[tokio::test]
async fn a_person_signs_in_with_pkce_and_acts_with_the_role_their_group_maps_to() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("alice", "Alice Example", &["staff", "finance-team"]);
    let cookie = signin.sign_in().await.unwrap();

    let session = signin.session(&cookie).await;
    assert_eq!(session["sign_in_available"], true);
    assert_eq!(
        session["session"]["actor"],
        json!({"kind": "user", "id": "alice", "name": "Alice Example"})
    );
    assert_eq!(session["session"]["role"], "finance");
    assert_eq!(session["session"]["projects"], json!([]));
    assert!(session["session"]["csrf_token"].as_str().unwrap().len() >= 43);

    let (status, current) = signin.get("/v1/tokens/current", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(current["role"], "finance");
    assert_eq!(current["actor"]["kind"], "user");
    assert!(current.get("id").is_none(), "a person has no token id");
    let (status, _) = signin.get("/v1/reports/monthly/2026-11", &cookie).await;
    assert_eq!(status, StatusCode::OK, "finance reads reports");
    let (status, _) = signin.get("/v1/tokens", &cookie).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "finance is not admin");

    // Only the hash of the cookie's secret is stored.
    let secret = cookie.split_once('=').unwrap().1.to_owned();
    let stored: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sign_in_sessions WHERE secret_sha256 = sha256($1::text::bytea)",
    )
    .bind(&secret)
    .fetch_one(&signin.app.pool)
    .await
    .unwrap();
    assert_eq!(stored, 1);
    let plain: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sign_in_sessions WHERE position($1 IN encode(secret_sha256, 'escape')) > 0",
    )
    .bind(&secret)
    .fetch_one(&signin.app.pool)
    .await
    .unwrap();
    assert_eq!(plain, 0);
}

#[tokio::test]
async fn id_tokens_that_fail_a_check_are_refused_and_make_no_session() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("mallory", "Mallory", &["platform"]);
    for (flaw, reason) in [
        (Flaw::Expired, "Expired"),
        (Flaw::WrongAudience, "audiences"),
        (Flaw::WrongNonce, "nonce"),
        (Flaw::WrongIssuer, "issuer"),
        (Flaw::Tampered, "Signature verification failed"),
        (Flaw::UnknownKey, "Signature verification failed"),
    ] {
        signin.issuer.flaw(flaw);
        let refused = signin.sign_in().await.expect_err(&format!("{flaw:?}"));
        assert!(
            refused.contains("the ID token was refused") && refused.contains(reason),
            "{flaw:?}: {refused}"
        );
    }
    assert_eq!(signin.sessions_stored().await, 0);
    let metrics = signin
        .http
        .get(signin.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let refused: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("taskledger_sign_ins_total{outcome=\"refused\"} "))
        .expect("refused sign-ins are counted")
        .parse()
        .unwrap();
    assert!(refused >= 6.0, "{refused}");
    signin.issuer.flaw(Flaw::None);
    assert!(
        signin.sign_in().await.is_ok(),
        "the same provider, a sound token"
    );
}

#[tokio::test]
async fn a_state_is_good_once_and_only_in_the_browser_that_started_it() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("alice", "Alice", &["finance-team"]);

    let (callback, _) = signin.to_provider_and_back("/#page=finance").await;
    let refused = signin.callback(&callback, None).await.unwrap_err();
    assert!(refused.contains("not started in this browser"), "{refused}");
    let (callback, _) = signin.to_provider_and_back("/#page=finance").await;
    let refused = signin
        .callback(&callback, Some("taskledger_sign_in=another-state"))
        .await
        .unwrap_err();
    assert!(refused.contains("not started in this browser"), "{refused}");

    let (callback, attempt) = signin.to_provider_and_back("/#page=finance").await;
    signin.callback(&callback, Some(&attempt)).await.unwrap();
    let replayed = signin
        .callback(&callback, Some(&attempt))
        .await
        .unwrap_err();
    assert!(
        replayed.contains("expired or was already used"),
        "{replayed}"
    );

    let denied = signin
        .callback(
            &signin.url("/auth/callback?error=access_denied&error_description=User+cancelled"),
            None,
        )
        .await
        .unwrap_err();
    assert_eq!(
        denied,
        "the identity provider did not sign you in (access_denied: User cancelled)"
    );
    assert_eq!(signin.sessions_stored().await, 1);
}

#[tokio::test]
async fn a_reader_group_sees_its_project_and_no_other() {
    let signin = SignInApp::start().await;
    signin.app.create_project("vision", "USD").await;
    signin.app.create_project("nlp", "USD").await;
    signin.issuer.sign_in_as("bob", "Bob", &["vision-team"]);
    let cookie = signin.sign_in().await.unwrap();

    let session = signin.session(&cookie).await;
    assert_eq!(session["session"]["role"], "reader");
    assert_eq!(session["session"]["projects"], json!(["vision"]));
    let (status, projects) = signin.get("/v1/projects", &cookie).await;
    assert_eq!(status, StatusCode::OK);
    let ids: Vec<&str> = projects["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["vision"]);
    let (status, _) = signin
        .get("/v1/projects/vision/cost?month=2026-11", &cookie)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = signin
        .get("/v1/projects/nlp/cost?month=2026-11", &cookie)
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another project does not exist for bob"
    );
    let (status, _) = signin.get("/v1/reports/monthly/2026-11", &cookie).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_person_whose_groups_map_to_nothing_is_not_let_in() {
    let signin = SignInApp::start().await;
    signin.issuer.sign_in_as("eve", "Eve", &["staff", "ci"]);
    let refused = signin.sign_in().await.unwrap_err();
    assert!(
        refused.contains("Eve is signed in at the identity provider")
            && refused.contains("`groups`"),
        "{refused}"
    );
    assert_eq!(signin.sessions_stored().await, 0);
}

#[tokio::test]
async fn writes_made_with_a_session_need_its_csrf_token() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("root", "Platform Admin", &["platform"]);
    let cookie = signin.sign_in().await.unwrap();
    let csrf = signin.session(&cookie).await["session"]["csrf_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let project = json!({"id": "vision", "name": "Vision", "currency": "USD"});
    let post = |csrf: Option<String>| {
        let cookie = cookie.clone();
        let project = project.clone();
        let signin = &signin;
        async move {
            signin
                .request(
                    reqwest::Method::POST,
                    "/v1/projects",
                    &cookie,
                    csrf.as_deref(),
                    Some(project),
                )
                .await
        }
    };

    let (status, problem) = post(None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(problem["detail"].as_str().unwrap().contains("X-CSRF-Token"));
    let (status, _) = post(Some("not-the-token".to_owned())).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = signin.get("/v1/projects/vision", &cookie).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was created");
    let (status, created) = post(Some(csrf.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // The audit log names the person who made the change, not a token.
    let audit = signin
        .app
        .get(
            "/v1/audit?entity=project&entity_id=vision",
            &signin.app.admin,
        )
        .await
        .json();
    assert_eq!(
        audit["items"][0]["actor"],
        json!({"kind": "user", "id": "root", "name": "Platform Admin"})
    );
    assert_eq!(audit["items"][0]["action"], "create");

    // A bearer token needs no CSRF token: no browser sends it on its own.
    let response = signin
        .http
        .post(signin.url("/v1/projects"))
        .bearer_auth(&signin.app.admin)
        .json(&json!({"id": "nlp", "name": "NLP", "currency": "USD"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn sessions_end_when_idle_at_their_lifetime_and_at_sign_out() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("alice", "Alice", &["finance-team"]);
    let shift = |column: &'static str, cookie: String| {
        let pool = signin.app.pool.clone();
        async move {
            let secret = cookie.split_once('=').unwrap().1.to_owned();
            sqlx::query(&format!(
                "UPDATE sign_in_sessions SET {column} = now() - interval '61 minutes' \
                 WHERE secret_sha256 = sha256($1::text::bytea)"
            ))
            .bind(secret)
            .execute(&pool)
            .await
            .unwrap();
        }
    };

    let idle = signin.sign_in().await.unwrap();
    assert_eq!(signin.get("/v1/projects", &idle).await.0, StatusCode::OK);
    shift("last_seen_at", idle.clone()).await;
    assert_eq!(
        signin.get("/v1/projects", &idle).await.0,
        StatusCode::UNAUTHORIZED,
        "an hour without a request ends a session"
    );
    assert!(signin.session(&idle).await.get("session").is_none());

    let old = signin.sign_in().await.unwrap();
    shift("expires_at", old.clone()).await;
    assert_eq!(
        signin.get("/v1/projects", &old).await.0,
        StatusCode::UNAUTHORIZED,
        "a session in use still ends at its lifetime"
    );

    let cookie = signin.sign_in().await.unwrap();
    let csrf = signin.session(&cookie).await["session"]["csrf_token"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _) = signin
        .request(reqwest::Method::POST, "/auth/logout", &cookie, None, None)
        .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "sign-out needs the CSRF token"
    );
    let response = signin
        .http
        .post(signin.url("/auth/logout"))
        .header("Cookie", &cookie)
        .header("X-CSRF-Token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let cleared = set_cookie(&response, "taskledger_session").unwrap();
    assert!(cleared.contains("Max-Age=0"), "{cleared}");
    assert_eq!(
        signin.get("/v1/projects", &cookie).await.0,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        signin.sessions_stored().await,
        0,
        "ended sessions are removed"
    );
}

#[tokio::test]
async fn keys_the_provider_rotates_to_are_fetched_again() {
    let signin = SignInApp::start().await;
    signin
        .issuer
        .sign_in_as("alice", "Alice", &["finance-team"]);
    signin.sign_in().await.unwrap();
    signin.sign_in().await.unwrap();
    assert_eq!(
        signin.issuer.jwks_fetches(),
        1,
        "the keys are kept between sign-ins"
    );
    signin.issuer.rotate_keys();
    signin.sign_in().await.unwrap();
    assert_eq!(signin.issuer.jwks_fetches(), 2);
}

#[tokio::test]
async fn without_a_provider_only_tokens_sign_in() {
    let app = TestApp::spawn().await;
    let session = app.get("/auth/session", "ignored").await;
    assert_eq!(session.status, StatusCode::OK);
    assert_eq!(session.json(), json!({"sign_in_available": false}));
    let login = app.get("/auth/login", "ignored").await;
    login.problem(StatusCode::NOT_FOUND);
    let with_cookie = app
        .send(
            axum::http::Request::get("/v1/projects")
                .header("Cookie", "taskledger_session=anything")
                .body(axum::body::Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(with_cookie.status, StatusCode::UNAUTHORIZED);
}

#[test]
fn a_configuration_that_cannot_work_is_refused_at_start() {
    let vars = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        OidcConfig::from_env(move |name| map.get(name).cloned())
    };
    assert!(vars(&[]).unwrap().is_none(), "no issuer: no sign-in");
    let base = [
        ("TASKLEDGER_OIDC_ISSUER", "https://id.example.com"),
        ("TASKLEDGER_OIDC_CLIENT_ID", "taskledger"),
        ("TASKLEDGER_OIDC_CLIENT_SECRET", "s"),
        ("TASKLEDGER_PUBLIC_URL", "https://ledger.example.com"),
        ("TASKLEDGER_OIDC_ROLES", "ops=admin"),
    ];
    let config = vars(&base).unwrap().unwrap();
    assert_eq!(config.role_claim, "groups");
    assert_eq!(config.scopes, ["openid", "profile", "email"]);
    for (change, says) in [
        (
            ("TASKLEDGER_OIDC_CLIENT_SECRET", ""),
            "TASKLEDGER_OIDC_CLIENT_SECRET is not",
        ),
        (
            ("TASKLEDGER_PUBLIC_URL", "http://ledger.example.com"),
            "must be https",
        ),
        (("TASKLEDGER_OIDC_ROLES", "ops=ingest"), "ingest"),
        (
            ("TASKLEDGER_SESSION_IDLE_MINUTES", "ten"),
            "whole number of minutes",
        ),
        (
            ("TASKLEDGER_SESSION_IDLE_MINUTES", "900"),
            "longer than the session lifetime",
        ),
    ] {
        let mut pairs: Vec<(&str, &str)> = base
            .iter()
            .copied()
            .filter(|(k, _)| *k != change.0)
            .collect();
        if !change.1.is_empty() {
            pairs.push(change);
        }
        let error = vars(&pairs).unwrap_err().to_string();
        assert!(error.contains(says), "{change:?}: {error}");
    }
    let local = [("TASKLEDGER_PUBLIC_URL", "http://127.0.0.1:8080")];
    let pairs: Vec<(&str, &str)> = base
        .iter()
        .copied()
        .filter(|(k, _)| *k != "TASKLEDGER_PUBLIC_URL")
        .chain(local)
        .collect();
    assert!(vars(&pairs).is_ok(), "http is fine on loopback");
}
