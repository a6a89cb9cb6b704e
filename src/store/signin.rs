//! Sign-ins under way and the sessions of signed-in people. Secrets (the `state` of a
//! sign-in, a session's cookie) are stored only as SHA-256 hashes.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::domain::access::Role;

/// What the server keeps of a sign-in while the browser is at the identity provider.
#[derive(Debug, Clone)]
pub struct Attempt {
    pub nonce: String,
    pub pkce_verifier: String,
    pub return_to: String,
}

pub async fn insert_attempt(
    pool: &PgPool,
    state_sha256: &[u8],
    attempt: &Attempt,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO sign_in_attempts \
             (state_sha256, nonce, pkce_verifier, return_to, created_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6)",
        state_sha256,
        attempt.nonce,
        attempt.pkce_verifier,
        attempt.return_to,
        created_at,
        expires_at,
    )
    .execute(pool)
    .await?;
    Ok(())
}

/// Removes and returns the sign-in with this state if it has not expired: a state is good
/// for one callback only.
pub async fn take_attempt(
    pool: &PgPool,
    state_sha256: &[u8],
    now: DateTime<Utc>,
) -> sqlx::Result<Option<Attempt>> {
    let row = sqlx::query!(
        "DELETE FROM sign_in_attempts WHERE state_sha256 = $1 \
         RETURNING nonce, pkce_verifier, return_to, expires_at",
        state_sha256,
    )
    .fetch_optional(pool)
    .await?;
    Ok(row.filter(|row| row.expires_at > now).map(|row| Attempt {
        nonce: row.nonce,
        pkce_verifier: row.pkce_verifier,
        return_to: row.return_to,
    }))
}

#[derive(Debug, Clone)]
pub struct SessionRow {
    pub subject: String,
    pub name: String,
    pub role: Role,
    pub projects: Vec<String>,
    pub csrf_token: String,
    pub created_at: DateTime<Utc>,
    pub last_seen_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

pub async fn insert_session(
    pool: &PgPool,
    secret_sha256: &[u8],
    session: &SessionRow,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO sign_in_sessions (secret_sha256, subject, name, role, projects, \
             csrf_token, created_at, last_seen_at, expires_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        secret_sha256,
        session.subject,
        session.name,
        session.role.as_str(),
        &session.projects,
        session.csrf_token,
        session.created_at,
        session.last_seen_at,
        session.expires_at,
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn find_session(pool: &PgPool, secret_sha256: &[u8]) -> sqlx::Result<Option<SessionRow>> {
    sqlx::query!(
        "SELECT subject, name, role, projects, csrf_token, created_at, last_seen_at, expires_at \
         FROM sign_in_sessions WHERE secret_sha256 = $1",
        secret_sha256,
    )
    .try_map(|row| {
        Ok(SessionRow {
            subject: row.subject,
            name: row.name,
            role: super::decoded("role", row.role)?,
            projects: row.projects,
            csrf_token: row.csrf_token,
            created_at: row.created_at,
            last_seen_at: row.last_seen_at,
            expires_at: row.expires_at,
        })
    })
    .fetch_optional(pool)
    .await
}

pub async fn touch_session(
    pool: &PgPool,
    secret_sha256: &[u8],
    now: DateTime<Utc>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE sign_in_sessions SET last_seen_at = $2 \
         WHERE secret_sha256 = $1 AND last_seen_at < $2",
        secret_sha256,
        now,
    )
    .execute(pool)
    .await?;
    Ok(())
}

pub async fn delete_session(pool: &PgPool, secret_sha256: &[u8]) -> sqlx::Result<bool> {
    let result = sqlx::query!(
        "DELETE FROM sign_in_sessions WHERE secret_sha256 = $1",
        secret_sha256,
    )
    .execute(pool)
    .await?;
    Ok(result.rows_affected() > 0)
}

/// Forgets sign-ins that never came back and sessions past their lifetime or idle timeout.
pub async fn purge_expired(
    pool: &PgPool,
    now: DateTime<Utc>,
    idle_since: DateTime<Utc>,
) -> sqlx::Result<u64> {
    let attempts = sqlx::query!("DELETE FROM sign_in_attempts WHERE expires_at <= $1", now)
        .execute(pool)
        .await?;
    let sessions = sqlx::query!(
        "DELETE FROM sign_in_sessions WHERE expires_at <= $1 OR last_seen_at <= $2",
        now,
        idle_since,
    )
    .execute(pool)
    .await?;
    Ok(attempts.rows_affected() + sessions.rows_affected())
}
