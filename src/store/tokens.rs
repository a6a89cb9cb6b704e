//! API tokens: stored as a SHA-256 of the secret, looked up on every request so that a
//! revocation takes effect on the next one.

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
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
    conn: &mut PgConnection,
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
    .fetch_one(conn)
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

/// Revokes a token; the token as revoked, `None` when there is no such active token.
pub async fn revoke(conn: &mut PgConnection, id: Uuid) -> sqlx::Result<Option<TokenRow>> {
    select_tokens!(
        "UPDATE api_tokens SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL \
         RETURNING ",
        "",
        id,
    )
    .fetch_optional(conn)
    .await
}

/// What installing the bootstrap secret changed: the token it created, and the previous
/// bootstrap token it revoked.
#[derive(Debug, Clone)]
pub struct BootstrapInstall {
    pub outcome: BootstrapToken,
    pub created: Option<TokenRow>,
    pub revoked: Option<TokenRow>,
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
/// Serialised by an advisory lock (held until the caller's transaction ends) so that
/// replicas starting together agree.
pub async fn install_bootstrap(
    conn: &mut PgConnection,
    secret_sha256: &[u8],
) -> sqlx::Result<BootstrapInstall> {
    sqlx::query!("SELECT pg_advisory_xact_lock(hashtext('taskledger.bootstrap_token'))")
        .execute(&mut *conn)
        .await?;
    let existing = sqlx::query!(
        "SELECT id, revoked_at FROM api_tokens WHERE secret_sha256 = $1",
        secret_sha256,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let unchanged = |outcome| BootstrapInstall {
        outcome,
        created: None,
        revoked: None,
    };
    let (id, install) = match existing {
        Some(token) if token.revoked_at.is_some() => {
            return Ok(unchanged(BootstrapToken::Revoked));
        }
        Some(token) => (token.id, unchanged(BootstrapToken::Active)),
        None => {
            let created = select_tokens!(
                "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
                 VALUES ($1, 'bootstrap', 'admin', '{}', $2) RETURNING ",
                "",
                Uuid::new_v4(),
                secret_sha256,
            )
            .fetch_one(&mut *conn)
            .await?;
            let revoked = select_tokens!(
                "UPDATE api_tokens SET revoked_at = now() \
                 WHERE revoked_at IS NULL AND id = (SELECT value::uuid FROM settings \
                                                    WHERE key = 'bootstrap_token_id') \
                 RETURNING ",
                "",
            )
            .fetch_optional(&mut *conn)
            .await?;
            let install = BootstrapInstall {
                outcome: BootstrapToken::Active,
                created: Some(created.clone()),
                revoked,
            };
            (created.id, install)
        }
    };
    sqlx::query!(
        "INSERT INTO settings (key, value) VALUES ('bootstrap_token_id', $1) \
         ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        id.to_string(),
    )
    .execute(&mut *conn)
    .await?;
    Ok(install)
}

/// Creates an admin token only when the database has no token at all. Serialised by an
/// advisory lock (held until the caller's transaction ends) so that replicas starting
/// together create one, not several.
pub async fn create_first_admin(
    conn: &mut PgConnection,
    secret_sha256: &[u8],
) -> sqlx::Result<Option<TokenRow>> {
    sqlx::query!("SELECT pg_advisory_xact_lock(hashtext('taskledger.first_admin_token'))")
        .execute(&mut *conn)
        .await?;
    // Two statements under the lock: Citus cannot plan an INSERT into a reference table
    // whose SELECT reads that table.
    let any = sqlx::query_scalar!(r#"SELECT EXISTS (SELECT 1 FROM api_tokens) AS "any!""#)
        .fetch_one(&mut *conn)
        .await?;
    if any {
        return Ok(None);
    }
    select_tokens!(
        "INSERT INTO api_tokens (id, name, role, projects, secret_sha256) \
         VALUES ($1, 'first-start admin', 'admin', '{}', $2) RETURNING ",
        "",
        Uuid::new_v4(),
        secret_sha256,
    )
    .fetch_one(conn)
    .await
    .map(Some)
}
