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

const COLUMNS: &str = "id, name, role, projects, created_at, revoked_at";

pub async fn insert(
    pool: &PgPool,
    name: &str,
    role: Role,
    projects: &[String],
    secret_sha256: &[u8],
) -> sqlx::Result<TokenRow> {
    sqlx::query_as::<_, TokenRow>(&format!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         VALUES ($1, $2, $3, $4, $5) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(name)
    .bind(role.as_str())
    .bind(projects)
    .bind(secret_sha256)
    .fetch_one(pool)
    .await
}

/// The active token with this secret hash.
pub async fn find_active(pool: &PgPool, secret_sha256: &[u8]) -> sqlx::Result<Option<TokenRow>> {
    sqlx::query_as::<_, TokenRow>(&format!(
        "SELECT {COLUMNS} FROM api_tokens WHERE secret_sha256 = $1 AND revoked_at IS NULL"
    ))
    .bind(secret_sha256)
    .fetch_optional(pool)
    .await
}

pub async fn list(pool: &PgPool, after: Option<Uuid>, limit: i64) -> sqlx::Result<Vec<TokenRow>> {
    sqlx::query_as::<_, TokenRow>(&format!(
        "SELECT {COLUMNS} FROM api_tokens WHERE ($1::uuid IS NULL OR id > $1) \
         ORDER BY id LIMIT $2"
    ))
    .bind(after)
    .bind(limit)
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

/// Makes sure an active admin token with this secret exists (the bootstrap token).
pub async fn ensure_admin(pool: &PgPool, name: &str, secret_sha256: &[u8]) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         VALUES ($1, $2, 'admin', '{}', $3) \
         ON CONFLICT (secret_sha256) DO UPDATE SET role = 'admin', projects = '{}', revoked_at = NULL",
        Uuid::new_v4(),
        name,
        secret_sha256,
    )
    .execute(pool)
    .await?;
    Ok(())
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
    let row = sqlx::query_as::<_, TokenRow>(&format!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         SELECT $1, 'first-start admin', 'admin', '{{}}', $2 \
         WHERE NOT EXISTS (SELECT 1 FROM api_tokens) RETURNING {COLUMNS}"
    ))
    .bind(Uuid::new_v4())
    .bind(secret_sha256)
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(row)
}
