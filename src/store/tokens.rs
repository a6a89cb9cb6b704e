//! API tokens: stored as a SHA-256 of the secret, looked up on every request so that a
//! revocation takes effect on the next one.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::domain::access::Role;

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct TokenRow {
    pub id: Uuid,
    pub name: String,
    #[sqlx(try_from = "String")]
    pub role: Role,
    pub projects: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// `query!` of `$head`, the columns a [`TokenRow`] reads, then `$rest` (literals), each row
/// made a [`TokenRow`].
macro_rules! select_tokens {
    ($head:literal, $rest:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query!(
            $head + "id, name, role, projects, created_at, revoked_at" + $rest $(, $arg)*
        )
        .try_map(|row| {
            Ok(TokenRow {
                id: row.id,
                name: row.name,
                role: super::decoded("role", row.role)?,
                projects: row.projects,
                created_at: row.created_at,
                revoked_at: row.revoked_at,
            })
        })
    };
}

pub async fn insert(
    pool: &PgPool,
    name: &str,
    role: Role,
    projects: &[String],
    secret_sha256: &[u8],
) -> sqlx::Result<TokenRow> {
    select_tokens!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         VALUES ($1, $2, $3, $4, $5) RETURNING ",
        "",
        Uuid::new_v4(),
        name,
        role.as_str(),
        projects,
        secret_sha256,
    )
    .fetch_one(pool)
    .await
}

/// The active token with this secret hash.
pub async fn find_active(pool: &PgPool, secret_sha256: &[u8]) -> sqlx::Result<Option<TokenRow>> {
    select_tokens!(
        "SELECT ",
        " FROM api_tokens WHERE secret_sha256 = $1 AND revoked_at IS NULL",
        secret_sha256,
    )
    .fetch_optional(pool)
    .await
}

pub async fn list(pool: &PgPool, after: Option<Uuid>, limit: i64) -> sqlx::Result<Vec<TokenRow>> {
    select_tokens!(
        "SELECT ",
        " FROM api_tokens WHERE ($1::uuid IS NULL OR id > $1) ORDER BY id LIMIT $2",
        after,
        limit,
    )
    .fetch_all(pool)
    .await
}

/// Revokes a token; false when there is no such active token.
pub async fn revoke(pool: &PgPool, id: Uuid) -> sqlx::Result<bool> {
    let result = sqlx::query!(
        "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
        id,
    )
    .execute(pool)
    .await?;
    Ok(result.rows_affected() == 1)
}

/// What became of the configured bootstrap secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootstrapToken {
    /// Its admin token is active (created now, or already there).
    Active,
    /// Its token was revoked, and revocation sticks: a new secret is needed.
    Revoked,
}

/// Makes sure the admin token of the bootstrap secret exists, once. A token revoked through
/// the API stays revoked however often the service restarts with its secret; a new secret
/// creates a new token and revokes the previous bootstrap token (kept in `settings`).
/// Serialised by an advisory lock so that replicas starting together agree.
pub async fn install_bootstrap(
    pool: &PgPool,
    secret_sha256: &[u8],
) -> sqlx::Result<BootstrapToken> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SELECT pg_advisory_xact_lock(hashtext('taskledger.bootstrap_token'))")
        .execute(&mut *tx)
        .await?;
    let existing = sqlx::query!(
        "SELECT id, revoked_at FROM api_tokens WHERE secret_sha256 = $1",
        secret_sha256,
    )
    .fetch_optional(&mut *tx)
    .await?;
    let (id, outcome) = match existing {
        Some(token) if token.revoked_at.is_some() => return Ok(BootstrapToken::Revoked),
        Some(token) => (token.id, BootstrapToken::Active),
        None => {
            let id = Uuid::new_v4();
            sqlx::query!(
                "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
                 VALUES ($1, 'bootstrap', 'admin', '{}', $2)",
                id,
                secret_sha256,
            )
            .execute(&mut *tx)
            .await?;
            sqlx::query!(
                "UPDATE api_tokens SET revoked_at = now() \
                 WHERE revoked_at IS NULL AND id = (SELECT value::uuid FROM settings \
                                                    WHERE key = 'bootstrap_token_id')",
            )
            .execute(&mut *tx)
            .await?;
            (id, BootstrapToken::Active)
        }
    };
    sqlx::query!(
        "INSERT INTO settings (key, value) VALUES ('bootstrap_token_id', $1) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        id.to_string(),
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(outcome)
}

/// Creates an admin token only when the database has no token at all. Serialised by an
/// advisory lock so that replicas starting together create one, not several.
pub async fn create_first_admin(
    pool: &PgPool,
    secret_sha256: &[u8],
) -> sqlx::Result<Option<TokenRow>> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SELECT pg_advisory_xact_lock(hashtext('taskledger.first_admin_token'))")
        .execute(&mut *tx)
        .await?;
    let row = select_tokens!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         SELECT $1, 'first-start admin', 'admin', '{}', $2 \
         WHERE NOT EXISTS (SELECT 1 FROM api_tokens) RETURNING ",
        "",
        Uuid::new_v4(),
        secret_sha256,
    )
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(row)
}
