//! The caller extractor: every `/v1` handler takes a `Principal`, so no route can forget
//! authentication. A bearer token wins; without one, a signed-in person's session cookie is
//! read, and a write made with it must carry the session's CSRF token.

use axum::extract::FromRequestParts;
use axum::http::header;
use axum::http::request::Parts;

use crate::domain::access::{Actor, Principal, hash_secret};
use crate::http::error::ApiError;
use crate::http::signin::{SESSION_COOKIE, cookie_value, require_csrf};
use crate::http::state::AppState;

impl FromRequestParts<AppState> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| {
                value
                    .strip_prefix("Bearer ")
                    .or_else(|| value.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|secret| !secret.is_empty());
        let Some(secret) = bearer else {
            return signed_in(parts, state).await;
        };
        let token = crate::ledger::tokens::find_active(&state.pool, &hash_secret(secret))
            .await?
            .ok_or(ApiError::Unauthorized)?;
        Ok(Principal {
            actor: Actor::token(token.id, &token.name),
            role: token.role,
            projects: token.projects,
        })
    }
}

/// The person whose session cookie came with the request.
async fn signed_in(parts: &Parts, state: &AppState) -> Result<Principal, ApiError> {
    let (Some(signin), Some(secret)) = (
        state.signin.as_deref(),
        cookie_value(&parts.headers, SESSION_COOKIE),
    ) else {
        return Err(ApiError::Unauthorized);
    };
    let session = signin
        .session(&state.pool, &secret)
        .await?
        .ok_or(ApiError::Unauthorized)?;
    if !parts.method.is_safe() {
        require_csrf(&parts.headers, &session.csrf_token)?;
    }
    Ok(session.principal)
}

/// The 404 a caller gets for a project it may not see, identical to one that does not exist.
pub fn project_not_found(project: &str) -> ApiError {
    ApiError::NotFound(format!("project `{project}` does not exist"))
}

pub fn require_admin(principal: &Principal) -> Result<(), ApiError> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden("this needs an admin token".to_owned()))
    }
}

pub fn require_finance(principal: &Principal) -> Result<(), ApiError> {
    if principal.is_finance_or_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "this needs a finance or admin token".to_owned(),
        ))
    }
}
