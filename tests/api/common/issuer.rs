//! A stand-in OpenID Connect provider whose ID tokens the test chooses, flaws included
//! (expired, for another audience, with another nonce, re-signed, tampered with, from a key
//! the provider rotated to). Its authorization endpoint signs in at once and sends the browser
//! back with a code; its token endpoint checks the client's secret and the PKCE verifier
//! against the challenge, as a real provider does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine;
use chrono::{Duration, Utc};
use openidconnect::core::{
    CoreGenderClaim, CoreJsonWebKeySet, CoreJweContentEncryptionAlgorithm, CoreJwsSigningAlgorithm,
    CoreRsaPrivateSigningKey,
};
use openidconnect::{
    AdditionalClaims, Audience, EndUserName, IdToken, IdTokenClaims, IssuerUrl, JsonWebKeyId,
    LocalizedClaim, Nonce, PrivateSigningKey, StandardClaims, SubjectIdentifier,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const CLIENT_ID: &str = "taskledger";
pub const CLIENT_SECRET: &str = "taskledger-test-secret";

/// What is wrong with the next ID token, if anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flaw {
    None,
    Expired,
    WrongAudience,
    WrongNonce,
    WrongIssuer,
    /// Signed, then a claim changed.
    Tampered,
    /// Signed with a key the provider never published.
    UnknownKey,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Groups {
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<String>>,
}

impl AdditionalClaims for Groups {}

struct Pending {
    nonce: String,
    challenge: String,
}

struct Inner {
    issuer: String,
    user: String,
    name: String,
    groups: Vec<String>,
    flaw: Flaw,
    /// The key tokens are signed with; `rotated` publishes and signs with key b.
    rotated: bool,
    pending: HashMap<String, Pending>,
    /// How many times the keys were fetched.
    jwks_fetches: usize,
}

#[derive(Clone)]
pub struct Issuer {
    pub url: String,
    inner: Arc<Mutex<Inner>>,
}

fn key(which: &str) -> CoreRsaPrivateSigningKey {
    let pem = std::fs::read_to_string(format!(
        "{}/tests/fixtures/oidc/signing-key-{which}.pem",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    CoreRsaPrivateSigningKey::from_pem(&pem, Some(JsonWebKeyId::new(format!("key-{which}"))))
        .unwrap()
}

impl Issuer {
    pub async fn start() -> Issuer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let inner = Arc::new(Mutex::new(Inner {
            issuer: url.clone(),
            user: "alice".to_owned(),
            name: "Alice Example".to_owned(),
            groups: Vec::new(),
            flaw: Flaw::None,
            rotated: false,
            pending: HashMap::new(),
            jwks_fetches: 0,
        }));
        let app = Router::new()
            .route("/.well-known/openid-configuration", get(discovery))
            .route("/jwks", get(jwks))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .with_state(inner.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Issuer { url, inner }
    }

    /// Who signs in next, and the groups their ID token names.
    pub fn sign_in_as(&self, user: &str, name: &str, groups: &[&str]) {
        let mut inner = self.inner.lock().unwrap();
        inner.user = user.to_owned();
        inner.name = name.to_owned();
        inner.groups = groups.iter().map(|g| g.to_string()).collect();
    }

    pub fn flaw(&self, flaw: Flaw) {
        self.inner.lock().unwrap().flaw = flaw;
    }

    /// Publishes key b instead of key a, and signs with it from now on.
    pub fn rotate_keys(&self) {
        self.inner.lock().unwrap().rotated = true;
    }

    pub fn jwks_fetches(&self) -> usize {
        self.inner.lock().unwrap().jwks_fetches
    }
}

async fn discovery(State(inner): State<Arc<Mutex<Inner>>>) -> Json<Value> {
    let issuer = inner.lock().unwrap().issuer.clone();
    Json(json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/authorize"),
        "token_endpoint": format!("{issuer}/token"),
        "jwks_uri": format!("{issuer}/jwks"),
        "response_types_supported": ["code"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "code_challenge_methods_supported": ["S256"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic"],
    }))
}

async fn jwks(State(inner): State<Arc<Mutex<Inner>>>) -> Json<CoreJsonWebKeySet> {
    let mut inner = inner.lock().unwrap();
    inner.jwks_fetches += 1;
    let published = if inner.rotated { "b" } else { "a" };
    Json(CoreJsonWebKeySet::new(vec![
        key(published).as_verification_key(),
    ]))
}

async fn authorize(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    assert_eq!(params["client_id"], CLIENT_ID);
    assert_eq!(params["response_type"], "code");
    assert_eq!(params["code_challenge_method"], "S256", "PKCE with S256");
    assert!(params["scope"].split(' ').any(|s| s == "openid"));
    let code = uuid::Uuid::new_v4().simple().to_string();
    inner.lock().unwrap().pending.insert(
        code.clone(),
        Pending {
            nonce: params["nonce"].clone(),
            challenge: params["code_challenge"].clone(),
        },
    );
    let state: String = form_urlencoded::byte_serialize(params["state"].as_bytes()).collect();
    Redirect::to(&format!(
        "{}?code={code}&state={state}",
        params["redirect_uri"]
    ))
    .into_response()
}

async fn token(
    State(inner): State<Arc<Mutex<Inner>>>,
    headers: HeaderMap,
    Form(form): Form<HashMap<String, String>>,
) -> Response {
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{CLIENT_ID}:{CLIENT_SECRET}"))
    );
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(&expected)
    {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": "invalid_client"})),
        )
            .into_response();
    }
    let mut inner = inner.lock().unwrap();
    let Some(pending) = inner.pending.remove(&form["code"]) else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "invalid_grant"})),
        )
            .into_response();
    };
    let verifier = form.get("code_verifier").cloned().unwrap_or_default();
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(Sha256::digest(verifier.as_bytes()));
    if challenge != pending.challenge {
        return (
            StatusCode::BAD_REQUEST,
            Json(
                json!({"error": "invalid_grant", "error_description": "PKCE verification failed"}),
            ),
        )
            .into_response();
    }
    let now = Utc::now();
    let flaw = inner.flaw;
    let issuer = if flaw == Flaw::WrongIssuer {
        "https://issuer.example".to_owned()
    } else {
        inner.issuer.clone()
    };
    let audience = if flaw == Flaw::WrongAudience {
        "someone-else"
    } else {
        CLIENT_ID
    };
    let (issued, expires) = if flaw == Flaw::Expired {
        (now - Duration::hours(2), now - Duration::hours(1))
    } else {
        (now, now + Duration::minutes(5))
    };
    let nonce = if flaw == Flaw::WrongNonce {
        "a-nonce-of-another-sign-in".to_owned()
    } else {
        pending.nonce
    };
    let mut name = LocalizedClaim::new();
    name.insert(None, EndUserName::new(inner.name.clone()));
    let claims = IdTokenClaims::new(
        IssuerUrl::new(issuer).unwrap(),
        vec![Audience::new(audience.to_owned())],
        expires,
        issued,
        StandardClaims::new(SubjectIdentifier::new(inner.user.clone())).set_name(Some(name)),
        Groups {
            groups: Some(inner.groups.clone()),
        },
    )
    .set_nonce(Some(Nonce::new(nonce)));
    let signer = match (flaw, inner.rotated) {
        (Flaw::UnknownKey, true) => key("a"),
        (Flaw::UnknownKey, false) | (_, true) => key("b"),
        _ => key("a"),
    };
    let id_token = IdToken::<
        Groups,
        CoreGenderClaim,
        CoreJweContentEncryptionAlgorithm,
        CoreJwsSigningAlgorithm,
    >::new(
        claims,
        &signer,
        CoreJwsSigningAlgorithm::RsaSsaPkcs1V15Sha256,
        None,
        None,
    )
    .unwrap()
    .to_string();
    let id_token = if flaw == Flaw::Tampered {
        tamper(&id_token)
    } else {
        id_token
    };
    Json(json!({
        "access_token": "an-access-token",
        "token_type": "Bearer",
        "expires_in": 300,
        "id_token": id_token,
    }))
    .into_response()
}

/// The same token with the groups in its payload changed to `platform` (an admin group in
/// the tests) and the signature kept.
fn tamper(token: &str) -> String {
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    let mut payload: Value = serde_json::from_slice(&engine.decode(parts[1]).unwrap()).unwrap();
    payload["groups"] = json!(["platform"]);
    let payload = engine.encode(serde_json::to_vec(&payload).unwrap());
    format!("{}.{payload}.{}", parts[0], parts[2])
}
