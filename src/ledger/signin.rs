//! Signing people in through the organisation's OpenID Connect provider: the authorization
//! code flow with PKCE (S256), `state` and `nonce`; the provider's discovery document and
//! signing keys (JWKS) fetched from the issuer and kept for a while, fetched again when an ID
//! token is signed with a key they do not hold (the provider rotated its keys); the ID token's
//! signature, `iss`, `aud`, `exp` and `nonce` checked; and a server-side session whose secret
//! is the cookie. Bearer tokens are untouched by all of this.
//!
//! Nothing here is kept in the process but the provider's metadata: sign-ins under way and
//! sessions are rows, so any replica serves any step of a sign-in.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use base64::Engine;
use chrono::{DateTime, TimeDelta, Utc};
use openidconnect::core::{
    CoreAuthenticationFlow, CoreClient, CoreGenderClaim, CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm, CoreProviderMetadata,
};
use openidconnect::{
    AdditionalClaims, AuthorizationCode, ClaimsVerificationError, ClientId, ClientSecret,
    CsrfToken, EndpointMaybeSet, EndpointNotSet, EndpointSet, IdToken, IssuerUrl, Nonce,
    PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope, SignatureVerificationError,
    TokenResponse,
};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::sync::RwLock;
use url::Url;

use crate::domain::access::{Actor, Principal, Role, hash_secret};
use crate::domain::signin::{RoleMap, SessionPolicy, claim_values, return_to};
use crate::ledger::LedgerResult;
use crate::ledger::error::LedgerError;
use crate::ledger::instruments;
use crate::store;
use crate::store::signin::{Attempt, SessionRow};

/// How long the provider's discovery document and keys are used before they are fetched
/// again.
const METADATA_TTL: Duration = Duration::from_secs(15 * 60);
/// The soonest the keys are fetched again for a token signed with an unknown key, so a flood
/// of forged tokens cannot make the service hammer the provider.
const MIN_REFETCH: Duration = Duration::from_secs(10);
/// How long a person may take at the provider's sign-in page.
const ATTEMPT_TTL: TimeDelta = TimeDelta::minutes(10);

/// How the service signs people in, from `TASKLEDGER_OIDC_*` and `TASKLEDGER_PUBLIC_URL`.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    pub issuer: IssuerUrl,
    pub client_id: String,
    pub client_secret: String,
    /// Where people reach this service; the provider sends them back to `/auth/callback` here.
    pub public_url: Url,
    pub scopes: Vec<String>,
    /// The ID-token claim whose values `roles` maps (`groups` by default).
    pub role_claim: String,
    pub roles: RoleMap,
    pub sessions: SessionPolicy,
}

impl OidcConfig {
    /// Sign-in as the environment configures it; `None` when `TASKLEDGER_OIDC_ISSUER` is
    /// unset. `var` reads one variable (empty counts as unset).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Option<Self>> {
        let Some(issuer) = var("TASKLEDGER_OIDC_ISSUER") else {
            return Ok(None);
        };
        let required = |name: &str| {
            var(name)
                .ok_or_else(|| anyhow::anyhow!("TASKLEDGER_OIDC_ISSUER is set but {name} is not"))
        };
        let issuer = IssuerUrl::new(issuer.trim_end_matches('/').to_owned())
            .map_err(|error| anyhow::anyhow!("TASKLEDGER_OIDC_ISSUER: {error}"))?;
        let public_url = Url::parse(&required("TASKLEDGER_PUBLIC_URL")?)
            .map_err(|error| anyhow::anyhow!("TASKLEDGER_PUBLIC_URL: {error}"))?;
        if !(public_url.scheme() == "https" || is_loopback_http(&public_url)) {
            anyhow::bail!(
                "TASKLEDGER_PUBLIC_URL must be https for sign-in (the session cookie is Secure); \
                 plain http is accepted only on a loopback address"
            );
        }
        let roles = RoleMap::parse(&required("TASKLEDGER_OIDC_ROLES")?)
            .map_err(|why| anyhow::anyhow!("TASKLEDGER_OIDC_ROLES {why}"))?;
        let minutes = |name: &str, default: TimeDelta| -> anyhow::Result<TimeDelta> {
            match var(name) {
                None => Ok(default),
                Some(raw) => raw
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|minutes| *minutes > 0)
                    .map(|minutes| TimeDelta::minutes(i64::from(minutes)))
                    .ok_or_else(|| anyhow::anyhow!("{name} must be a whole number of minutes")),
            }
        };
        let sessions = SessionPolicy::new(
            minutes(
                "TASKLEDGER_SESSION_IDLE_MINUTES",
                SessionPolicy::DEFAULT_IDLE,
            )?,
            minutes(
                "TASKLEDGER_SESSION_LIFETIME_MINUTES",
                SessionPolicy::DEFAULT_LIFETIME,
            )?,
        )
        .map_err(|why| anyhow::anyhow!("TASKLEDGER_SESSION_*: {why}"))?;
        let mut scopes: Vec<String> = var("TASKLEDGER_OIDC_SCOPES")
            .unwrap_or_else(|| "openid profile email".to_owned())
            .split([' ', ','])
            .filter(|scope| !scope.is_empty())
            .map(str::to_owned)
            .collect();
        if !scopes.iter().any(|scope| scope == "openid") {
            scopes.insert(0, "openid".to_owned());
        }
        Ok(Some(Self {
            issuer,
            client_id: required("TASKLEDGER_OIDC_CLIENT_ID")?,
            client_secret: required("TASKLEDGER_OIDC_CLIENT_SECRET")?,
            public_url,
            scopes,
            role_claim: var("TASKLEDGER_OIDC_ROLE_CLAIM").unwrap_or_else(|| "groups".to_owned()),
            roles,
            sessions,
        }))
    }

    fn redirect_url(&self) -> RedirectUrl {
        let callback = self
            .public_url
            .join("auth/callback")
            .expect("a base URL joins a relative path");
        RedirectUrl::from_url(callback)
    }
}

/// `http://127.0.0.1…`, `http://[::1]…` or `http://localhost…`: a browser sends a cookie
/// without `Secure` there, and nobody else can listen in.
fn is_loopback_http(url: &Url) -> bool {
    url.scheme() == "http"
        && match url.host() {
            Some(url::Host::Ipv4(address)) => address.is_loopback(),
            Some(url::Host::Ipv6(address)) => address.is_loopback(),
            Some(url::Host::Domain(name)) => name == "localhost",
            None => false,
        }
}

/// A client made from the provider's discovery document: its authorization endpoint is
/// known, its token and user-info endpoints are whatever the document names.
type DiscoveredClient = CoreClient<
    EndpointSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointNotSet,
    EndpointMaybeSet,
    EndpointMaybeSet,
>;

/// The claims of an ID token beyond the standard ones, so the role claim can be any name.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct OtherClaims(HashMap<String, serde_json::Value>);

impl AdditionalClaims for OtherClaims {}

type RoleIdToken = IdToken<
    OtherClaims,
    CoreGenderClaim,
    CoreJweContentEncryptionAlgorithm,
    CoreJwsSigningAlgorithm,
>;

/// Why a sign-in did not end in a session, in words for the person trying.
#[derive(Debug, thiserror::Error)]
pub enum SignInFailure {
    /// The identity provider could not be asked (down, or its discovery document is wrong).
    #[error("the identity provider cannot be reached: {0}")]
    ProviderUnreachable(String),
    /// The callback or the ID token did not pass a check.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<sqlx::Error> for SignInFailure {
    fn from(error: sqlx::Error) -> Self {
        Self::Ledger(error.into())
    }
}

/// The redirect that starts a sign-in, and the `state` the browser must bring back.
pub struct Started {
    pub authorize_url: Url,
    pub state: String,
}

/// A session just made: its secret goes in the cookie, and the browser goes to `return_to`.
pub struct SignedIn {
    pub secret: String,
    pub return_to: String,
    pub expires_at: DateTime<Utc>,
}

/// A live session, as a request made with its cookie sees it.
#[derive(Debug, Clone)]
pub struct Session {
    pub principal: Principal,
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
}

struct Discovered {
    metadata: CoreProviderMetadata,
    fetched: Instant,
}

pub struct SignIn {
    config: OidcConfig,
    http: reqwest::Client,
    provider: RwLock<Option<Discovered>>,
    /// When the keys were last fetched again for an unknown key.
    last_refetch: std::sync::Mutex<Option<Instant>>,
}

impl SignIn {
    pub fn new(config: OidcConfig) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            // A redirect from the provider's endpoints is not followed: it could point the
            // server at an internal address.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(Self {
            config,
            http,
            provider: RwLock::new(None),
            last_refetch: std::sync::Mutex::new(None),
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// Whether the session cookie must be `Secure`: always, except on a loopback http URL.
    pub fn secure_cookies(&self) -> bool {
        !is_loopback_http(&self.config.public_url)
    }

    /// Begins a sign-in: keeps the PKCE verifier and nonce, and gives the provider's
    /// authorization URL.
    pub async fn start(
        &self,
        pool: &PgPool,
        requested_return: Option<&str>,
    ) -> Result<Started, SignInFailure> {
        let client = self.client(self.metadata(false).await?);
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let mut request = client.authorize_url(
            CoreAuthenticationFlow::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        );
        for scope in self.config.scopes.iter().filter(|scope| *scope != "openid") {
            request = request.add_scope(Scope::new(scope.clone()));
        }
        let (authorize_url, state, nonce) = request.set_pkce_challenge(challenge).url();
        let now = Utc::now();
        store::signin::insert_attempt(
            pool,
            &hash_secret(state.secret()),
            &Attempt {
                nonce: nonce.secret().clone(),
                pkce_verifier: verifier.secret().clone(),
                return_to: return_to(requested_return),
            },
            now,
            now + ATTEMPT_TTL,
        )
        .await?;
        Ok(Started {
            authorize_url,
            state: state.secret().clone(),
        })
    }

    /// Ends a sign-in: `state` must be the one this browser was given (`browser_state`, from
    /// its cookie) and still pending; the code is exchanged with the PKCE verifier; the ID
    /// token must verify; the role claim must map to a role.
    pub async fn finish(
        &self,
        pool: &PgPool,
        code: &str,
        state: &str,
        browser_state: Option<&str>,
    ) -> Result<SignedIn, SignInFailure> {
        let outcome = self.exchange(pool, code, state, browser_state).await;
        let label = match &outcome {
            Ok(_) => "signed_in",
            Err(SignInFailure::Refused(_)) => "refused",
            Err(SignInFailure::ProviderUnreachable(_)) => "provider_unreachable",
            Err(SignInFailure::Ledger(_)) => return outcome,
        };
        metrics::counter!(instruments::SIGN_INS, "outcome" => label).increment(1);
        outcome
    }

    /// A refusal the provider reported itself (`error=` on the callback), counted as one.
    pub fn refused_by_provider(&self, reason: String) -> SignInFailure {
        metrics::counter!(instruments::SIGN_INS, "outcome" => "refused").increment(1);
        SignInFailure::Refused(reason)
    }

    async fn exchange(
        &self,
        pool: &PgPool,
        code: &str,
        state: &str,
        browser_state: Option<&str>,
    ) -> Result<SignedIn, SignInFailure> {
        if browser_state != Some(state) {
            return Err(SignInFailure::Refused(
                "this sign-in was not started in this browser; start again".to_owned(),
            ));
        }
        let now = Utc::now();
        let attempt = store::signin::take_attempt(pool, &hash_secret(state), now)
            .await?
            .ok_or_else(|| {
                SignInFailure::Refused(
                    "this sign-in expired or was already used; start again".to_owned(),
                )
            })?;
        let metadata = self.metadata(false).await?;
        let client = self.client(metadata);
        let response = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .map_err(|error| SignInFailure::ProviderUnreachable(error.to_string()))?
            .set_pkce_verifier(PkceCodeVerifier::new(attempt.pkce_verifier.clone()))
            .request_async(&self.http)
            .await
            .map_err(|error| {
                SignInFailure::Refused(format!(
                    "the identity provider did not accept the sign-in: {}",
                    describe(&error)
                ))
            })?;
        let raw = response
            .id_token()
            .ok_or_else(|| {
                SignInFailure::Refused("the identity provider sent no ID token".to_owned())
            })?
            .to_string();
        let (subject, name, values) = self.verify(&raw, &attempt.nonce).await?;
        let access = self.config.roles.resolve(&values).ok_or_else(|| {
            SignInFailure::Refused(format!(
                "{name} is signed in at the identity provider, but no value of their `{}` \
                 claim is given a role here; ask an administrator to map one",
                self.config.role_claim
            ))
        })?;
        let secret = random_secret();
        let session = SessionRow {
            subject,
            name,
            role: access.role,
            projects: access.projects,
            csrf_token: random_secret(),
            created_at: now,
            last_seen_at: now,
            expires_at: self.config.sessions.expires_at(now),
        };
        store::signin::insert_session(pool, &hash_secret(&secret), &session).await?;
        store::signin::purge_expired(pool, now, now - self.config.sessions.idle).await?;
        Ok(SignedIn {
            secret,
            return_to: attempt.return_to,
            expires_at: session.expires_at,
        })
    }

    /// Checks an ID token against the provider's keys, fetching them again once if it was
    /// signed with a key they do not hold. Gives its subject, a name to show and the values
    /// of the role claim.
    async fn verify(
        &self,
        raw: &str,
        nonce: &str,
    ) -> Result<(String, String, Vec<String>), SignInFailure> {
        let token = RoleIdToken::from_str(raw).map_err(|error| {
            SignInFailure::Refused(format!("the ID token cannot be read: {error}"))
        })?;
        let nonce = Nonce::new(nonce.to_owned());
        let mut refetched = false;
        loop {
            let client = self.client(self.metadata(refetched).await?);
            let verifier = client.id_token_verifier();
            match token.claims(&verifier, &nonce) {
                Ok(claims) => {
                    let subject = claims.subject().to_string();
                    let name = claims
                        .name()
                        .and_then(|name| name.get(None))
                        .map(|name| name.to_string())
                        .or_else(|| claims.preferred_username().map(|u| u.to_string()))
                        .or_else(|| claims.email().map(|e| e.to_string()))
                        .unwrap_or_else(|| subject.clone());
                    let values =
                        claim_values(claims.additional_claims().0.get(&self.config.role_claim));
                    return Ok((subject, name, values));
                }
                Err(ClaimsVerificationError::SignatureVerification(
                    SignatureVerificationError::NoMatchingKey,
                )) if !refetched => refetched = true,
                Err(error) => {
                    return Err(SignInFailure::Refused(format!(
                        "the ID token was refused: {error}"
                    )));
                }
            }
        }
    }

    /// The session a cookie's secret opens, if it is live; a session found idle or past its
    /// lifetime is removed. Its last use is recorded at most once a minute.
    pub async fn session(&self, pool: &PgPool, secret: &str) -> LedgerResult<Option<Session>> {
        let key = hash_secret(secret);
        let Some(row) = store::signin::find_session(pool, &key).await? else {
            return Ok(None);
        };
        let now = Utc::now();
        let policy = self.config.sessions;
        if !policy.is_live(row.last_seen_at, row.expires_at, now) {
            store::signin::delete_session(pool, &key).await?;
            return Ok(None);
        }
        if policy.needs_touch(row.last_seen_at, now) {
            store::signin::touch_session(pool, &key, now).await?;
        }
        Ok(Some(Session {
            principal: Principal {
                actor: Actor::user(&row.subject, &row.name),
                role: row.role,
                projects: if row.role == Role::Reader {
                    row.projects
                } else {
                    Vec::new()
                },
            },
            csrf_token: row.csrf_token,
            expires_at: row.expires_at,
        }))
    }

    /// Ends a session; `false` when there was none.
    pub async fn sign_out(&self, pool: &PgPool, secret: &str) -> LedgerResult<bool> {
        Ok(store::signin::delete_session(pool, &hash_secret(secret)).await?)
    }

    fn client(&self, metadata: CoreProviderMetadata) -> DiscoveredClient {
        CoreClient::from_provider_metadata(
            metadata,
            ClientId::new(self.config.client_id.clone()),
            Some(ClientSecret::new(self.config.client_secret.clone())),
        )
        .set_redirect_uri(self.config.redirect_url())
    }

    /// The provider's metadata and keys: the kept copy while it is fresh, else fetched. With
    /// `refetch`, fetched again unless that was done only seconds ago. When the provider
    /// cannot be reached, a kept copy is used however old it is.
    async fn metadata(&self, refetch: bool) -> Result<CoreProviderMetadata, SignInFailure> {
        let refetch = refetch && {
            let mut last = self.last_refetch.lock().expect("never poisoned");
            let allowed = last.is_none_or(|at| at.elapsed() >= MIN_REFETCH);
            if allowed {
                *last = Some(Instant::now());
            }
            allowed
        };
        if let Some(kept) = self.provider.read().await.as_ref()
            && !refetch
            && kept.fetched.elapsed() < METADATA_TTL
        {
            return Ok(kept.metadata.clone());
        }
        match CoreProviderMetadata::discover_async(self.config.issuer.clone(), &self.http).await {
            Ok(metadata) => {
                *self.provider.write().await = Some(Discovered {
                    metadata: metadata.clone(),
                    fetched: Instant::now(),
                });
                Ok(metadata)
            }
            Err(error) => {
                let why = describe(&error);
                match self.provider.read().await.as_ref() {
                    Some(kept) => {
                        tracing::warn!(error = %why, "the identity provider's metadata could not be fetched again; using the kept copy");
                        Ok(kept.metadata.clone())
                    }
                    None => Err(SignInFailure::ProviderUnreachable(why)),
                }
            }
        }
    }
}

/// An error and its causes on one line.
fn describe(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        cause = inner.source();
    }
    text
}

/// 32 random bytes from the OS generator, base64url.
fn random_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}
