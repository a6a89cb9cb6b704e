//! Sign-in for people through the organisation's OpenID Connect provider (`/auth/…`): the
//! redirect to the provider, the callback that makes a session, the session as the dashboard
//! reads it, and sign-out. The session is an HttpOnly, SameSite=Lax cookie; a write made with
//! it must carry the session's CSRF token in `X-CSRF-Token` (checked by the `Principal`
//! extractor in `auth`).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::domain::access::{Actor, Role};
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::ApiQuery;
use crate::http::problems::QueryProblems;
use crate::http::state::AppState;
use crate::ledger::signin::{SignIn, SignInFailure};

/// The cookie holding a session's secret.
pub const SESSION_COOKIE: &str = "taskledger_session";
/// The cookie tying a sign-in under way to the browser that started it (its `state`).
const ATTEMPT_COOKIE: &str = "taskledger_sign_in";
/// The header a session's writes carry its CSRF token in.
pub const CSRF_HEADER: &str = "x-csrf-token";

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(sign_in))
        .routes(routes!(sign_in_callback))
        .routes(routes!(sign_out))
        .routes(routes!(get_session))
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SignInParams {
    /// A path of this service to return to once signed in (default `/`).
    pub return_to: Option<String>,
}

/// Sign in through the identity provider: redirects to its authorization endpoint.
#[utoipa::path(get, path = "/auth/login", tag = "sign-in", params(SignInParams),
    responses(
        QueryProblems,
        (status = 302, description = "To the identity provider's authorization endpoint (code flow, PKCE S256, `state`, `nonce`)",
            headers(("Location" = String, description = "The provider's authorization URL"))),
        (status = 404, description = "Sign-in through an identity provider is not configured", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The identity provider cannot be reached", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn sign_in(
    State(state): State<AppState>,
    ApiQuery(params): ApiQuery<SignInParams>,
) -> ApiResult<Response> {
    let signin = configured(&state)?;
    let started = signin
        .start(&state.pool, params.return_to.as_deref())
        .await
        .map_err(|failure| match failure {
            SignInFailure::Ledger(error) => error.into(),
            other => ApiError::BadGateway(other.to_string()),
        })?;
    let cookie = cookie(
        ATTEMPT_COOKIE,
        &started.state,
        "/auth",
        Some(600),
        signin.secure_cookies(),
    );
    Ok((
        StatusCode::FOUND,
        [
            (
                header::LOCATION,
                header_value(started.authorize_url.as_str())?,
            ),
            (header::SET_COOKIE, cookie),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
    )
        .into_response())
}

#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct CallbackParams {
    /// The authorization code.
    pub code: Option<String>,
    /// The `state` of the sign-in.
    pub state: Option<String>,
    /// The provider's error code, when it did not sign the person in.
    pub error: Option<String>,
    pub error_description: Option<String>,
    /// The issuer (RFC 9207), when the provider says it.
    pub iss: Option<String>,
    pub session_state: Option<String>,
}

/// Where the identity provider sends the browser back. A good sign-in sets the session cookie
/// and redirects to where it began; a refused one redirects to the dashboard with the reason
/// in `#signin_error=`.
#[utoipa::path(get, path = "/auth/callback", tag = "sign-in", params(CallbackParams),
    responses(
        QueryProblems,
        (status = 303, description = "Signed in (with `Set-Cookie`), or refused (to `/#signin_error=<reason>`)",
            headers(("Location" = String, description = "Where the browser goes next"))),
        (status = 404, description = "Sign-in through an identity provider is not configured", body = Problem, content_type = "application/problem+json"),
        (status = 502, description = "The identity provider cannot be reached", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn sign_in_callback(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiQuery(params): ApiQuery<CallbackParams>,
) -> ApiResult<Response> {
    let signin = configured(&state)?;
    let secure = signin.secure_cookies();
    let clear_attempt = cookie(ATTEMPT_COOKIE, "", "/auth", Some(0), secure);
    let outcome = match (&params.error, &params.code, &params.state) {
        (Some(error), _, _) => Err(signin.refused_by_provider(format!(
            "the identity provider did not sign you in ({error}{})",
            params
                .error_description
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ))),
        (None, Some(code), Some(sign_in_state)) => {
            signin
                .finish(
                    &state.pool,
                    code,
                    sign_in_state,
                    cookie_value(&headers, ATTEMPT_COOKIE).as_deref(),
                )
                .await
        }
        _ => Err(signin.refused_by_provider(
            "the identity provider sent the browser back without a code and state".to_owned(),
        )),
    };
    match outcome {
        Ok(signed_in) => {
            let max_age = (signed_in.expires_at - Utc::now()).num_seconds().max(0);
            let session = cookie(
                SESSION_COOKIE,
                &signed_in.secret,
                "/",
                Some(max_age),
                secure,
            );
            let mut response = (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, header_value(&signed_in.return_to)?)],
            )
                .into_response();
            let cookies = response.headers_mut();
            cookies.append(header::SET_COOKIE, session);
            cookies.append(header::SET_COOKIE, clear_attempt);
            Ok(response)
        }
        Err(SignInFailure::Refused(reason)) => {
            tracing::warn!(%reason, "a sign-in was refused");
            let fragment: String =
                form_urlencoded::byte_serialize(reason.as_bytes()).collect::<String>();
            let mut response = (
                StatusCode::SEE_OTHER,
                [(
                    header::LOCATION,
                    header_value(&format!("/#signin_error={fragment}"))?,
                )],
            )
                .into_response();
            response
                .headers_mut()
                .append(header::SET_COOKIE, clear_attempt);
            Ok(response)
        }
        Err(SignInFailure::ProviderUnreachable(why)) => Err(ApiError::BadGateway(format!(
            "the identity provider cannot be reached: {why}"
        ))),
        Err(SignInFailure::Ledger(error)) => Err(error.into()),
    }
}

/// Sign out: ends the session of the cookie. Needs the session's `X-CSRF-Token`.
#[utoipa::path(post, path = "/auth/logout", tag = "sign-in",
    responses(
        (status = 204, description = "Signed out; the cookie is cleared"),
        (status = 403, description = "The session's CSRF token is missing or wrong", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn sign_out(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let secure = state
        .signin
        .as_deref()
        .is_none_or(|signin| signin.secure_cookies());
    if let (Some(signin), Some(secret)) = (
        state.signin.as_deref(),
        cookie_value(&headers, SESSION_COOKIE),
    ) && let Some(session) = signin.session(&state.pool, &secret).await?
    {
        require_csrf(&headers, &session.csrf_token)?;
        signin.sign_out(&state.pool, &secret).await?;
    }
    Ok((
        StatusCode::NO_CONTENT,
        [(
            header::SET_COOKIE,
            cookie(SESSION_COOKIE, "", "/", Some(0), secure),
        )],
    )
        .into_response())
}

/// How the dashboard signs in, and who is signed in with this browser's cookie.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    /// Whether people can sign in through the identity provider (`GET /auth/login`).
    pub sign_in_available: bool,
    /// The session of this browser's cookie; absent when there is none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<SignedInView>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SignedInView {
    pub actor: Actor,
    pub role: Role,
    /// The projects a reader reads; empty for admin and finance.
    pub projects: Vec<String>,
    /// Send it as `X-CSRF-Token` with every write made with this session.
    pub csrf_token: String,
    pub expires_at: DateTime<Utc>,
}

/// Whether sign-in is available, and the current session.
#[utoipa::path(get, path = "/auth/session", tag = "sign-in",
    responses(
        (status = 200, description = "Sign-in availability and the current session", body = SessionView),
        (status = 503, description = "The database cannot be reached", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_session(State(state): State<AppState>, headers: HeaderMap) -> ApiResult<Response> {
    let session = match (
        state.signin.as_deref(),
        cookie_value(&headers, SESSION_COOKIE),
    ) {
        (Some(signin), Some(secret)) => signin.session(&state.pool, &secret).await?,
        _ => None,
    };
    let view = SessionView {
        sign_in_available: state.signin.is_some(),
        session: session.map(|session| SignedInView {
            actor: session.principal.actor,
            role: session.principal.role,
            projects: session.principal.projects,
            csrf_token: session.csrf_token,
            expires_at: session.expires_at,
        }),
    };
    Ok((
        [(header::CACHE_CONTROL, HeaderValue::from_static("no-store"))],
        axum::Json(view),
    )
        .into_response())
}

fn configured(state: &AppState) -> ApiResult<&SignIn> {
    state.signin.as_deref().ok_or_else(|| {
        ApiError::NotFound(
            "sign-in through an identity provider is not configured (TASKLEDGER_OIDC_ISSUER)"
                .to_owned(),
        )
    })
}

/// A write made with a session must name the session's CSRF token: another site can make a
/// browser send the cookie, but cannot read the token.
pub fn require_csrf(headers: &HeaderMap, expected: &str) -> ApiResult<()> {
    let sent = headers
        .get(CSRF_HEADER)
        .and_then(|value| value.to_str().ok());
    if sent.is_some_and(|sent| constant_time_eq(sent.as_bytes(), expected.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "a write made with a sign-in session needs its CSRF token in the X-CSRF-Token \
             header (see GET /auth/session)"
                .to_owned(),
        ))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie_value(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

fn cookie(name: &str, value: &str, path: &str, max_age: Option<i64>, secure: bool) -> HeaderValue {
    let mut text = format!("{name}={value}; Path={path}; HttpOnly; SameSite=Lax");
    if let Some(seconds) = max_age {
        text.push_str(&format!("; Max-Age={seconds}"));
    }
    if secure {
        text.push_str("; Secure");
    }
    HeaderValue::from_str(&text).expect("cookie values are base64url")
}

fn header_value(text: &str) -> ApiResult<HeaderValue> {
    HeaderValue::from_str(text)
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("a header value: {error}")))
}
