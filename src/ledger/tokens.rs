//! Issuing API tokens: the secret is generated here, shown once and stored only as a hash;
//! and the admin token that lets the first person in.

use serde::Serialize;
use serde_json::{Value, json};
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::access::{Actor, Role, generate_secret, hash_secret, normalize_scope};
use crate::domain::audit::Change;
use crate::domain::validation::Violations;
use crate::domain::values::{self, ProjectId};
use crate::ledger::{LedgerResult, audit};
use crate::store;
use crate::store::tokens::BootstrapToken;
pub use crate::store::tokens::TokenRow;

#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    pub id: Uuid,
    /// The secret, shown this once; only its hash is stored.
    pub token: String,
    pub role: Role,
    pub projects: Vec<String>,
    pub name: String,
}

/// A validated token request: the role and the scope that goes with it.
pub struct TokenRequest {
    pub role: Role,
    pub projects: Vec<String>,
    pub name: String,
}

impl TokenRequest {
    /// Checks shape only; that the projects exist is checked against the database.
    pub fn parse(role: Role, projects: &[String], name: &str) -> Result<Self, Violations> {
        let mut violations = Violations::default();
        let name = violations.check("/name", values::bounded_text(name, 200));
        let mut ids = Vec::new();
        for (index, raw) in projects.iter().enumerate() {
            if let Some(id) = violations.check(&format!("/projects/{index}"), ProjectId::parse(raw))
            {
                ids.push(id);
            }
        }
        if role.is_scoped() && projects.is_empty() {
            violations.push(
                "/projects",
                format!("a {} token needs at least one project", role.as_str()),
            );
        }
        if !role.is_scoped() && !projects.is_empty() {
            violations.push(
                "/projects",
                format!(
                    "a {} token acts on every project; leave projects out",
                    role.as_str()
                ),
            );
        }
        match (violations.is_empty(), name) {
            (true, Some(name)) => Ok(Self {
                role,
                projects: normalize_scope(&ids),
                name,
            }),
            _ => Err(violations),
        }
    }
}

/// Stores a new token and returns it with its secret.
/// A token as the audit log keeps it: as `GET /v1/tokens` lists it, never its secret or hash.
fn snapshot(row: &TokenRow) -> Value {
    json!({
        "id": row.id,
        "name": row.name,
        "role": row.role.as_str(),
        "projects": row.projects,
        "created_at": row.created_at,
        "revoked_at": row.revoked_at,
    })
}

fn created(row: &TokenRow) -> Change {
    Change::new(
        "token",
        row.id.to_string(),
        "create",
        None,
        Some(snapshot(row)),
    )
}

fn revoked(row: &TokenRow) -> Change {
    let before = TokenRow {
        revoked_at: None,
        ..row.clone()
    };
    Change::new(
        "token",
        row.id.to_string(),
        "revoke",
        Some(snapshot(&before)),
        Some(snapshot(row)),
    )
}

pub async fn issue(
    pool: &PgPool,
    request: TokenRequest,
    actor: &Actor,
) -> LedgerResult<CreatedToken> {
    let existing = store::projects::existing_ids(pool, &request.projects).await?;
    let mut violations = Violations::default();
    for (index, project) in request.projects.iter().enumerate() {
        if !existing.contains(project) {
            violations.push(
                format!("/projects/{index}"),
                format!("project `{project}` does not exist"),
            );
        }
    }
    violations.into_result()?;
    let secret = generate_secret();
    let mut tx = pool.begin().await?;
    let row = store::tokens::insert(
        &mut tx,
        &request.name,
        request.role,
        &request.projects,
        &hash_secret(&secret),
    )
    .await?;
    audit::record_one(&mut tx, actor, created(&row)).await?;
    tx.commit().await?;
    Ok(CreatedToken {
        id: row.id,
        token: secret,
        role: request.role,
        projects: row.projects,
        name: row.name,
    })
}

/// How the service makes sure someone can log in.
pub enum Bootstrap {
    /// The admin token with the configured secret is active.
    Configured,
    /// The configured secret's token was revoked; it stays revoked until the secret changes.
    ConfiguredButRevoked,
    /// The database had no token: this admin token was created, its secret shown only now.
    FirstAdmin { id: Uuid, secret: String },
    /// Tokens exist and no secret is configured: nothing to do.
    Existing,
}

/// The admin token of `TASKLEDGER_BOOTSTRAP_TOKEN` (`configured`), or else a first admin
/// token when the database has no token at all. A revoked bootstrap token stays revoked; a
/// new secret replaces the previous one. What it creates or revokes is recorded as the
/// service's own change.
pub async fn bootstrap_admin(pool: &PgPool, configured: Option<&str>) -> LedgerResult<Bootstrap> {
    let actor = Actor::system("bootstrap");
    let mut tx = pool.begin().await?;
    let outcome = match configured {
        Some(secret) => {
            let install = store::tokens::install_bootstrap(&mut tx, &hash_secret(secret)).await?;
            let changes = install
                .revoked
                .iter()
                .map(revoked)
                .chain(install.created.iter().map(created))
                .collect();
            audit::record(&mut tx, &actor, changes).await?;
            match install.outcome {
                BootstrapToken::Active => Bootstrap::Configured,
                BootstrapToken::Revoked => Bootstrap::ConfiguredButRevoked,
            }
        }
        None => {
            let secret = generate_secret();
            match store::tokens::create_first_admin(&mut tx, &hash_secret(&secret)).await? {
                Some(token) => {
                    audit::record_one(&mut tx, &actor, created(&token)).await?;
                    Bootstrap::FirstAdmin {
                        id: token.id,
                        secret,
                    }
                }
                None => Bootstrap::Existing,
            }
        }
    };
    tx.commit().await?;
    Ok(outcome)
}

/// Tokens in id order after `after`.
pub async fn list(pool: &PgPool, after: Option<Uuid>, limit: i64) -> LedgerResult<Vec<TokenRow>> {
    Ok(store::tokens::list(pool, after, limit).await?)
}

/// Revokes an active token; `false` when there is none with that id.
pub async fn revoke(pool: &PgPool, id: Uuid, actor: &Actor) -> LedgerResult<bool> {
    let mut tx = pool.begin().await?;
    let Some(row) = store::tokens::revoke(&mut tx, id).await? else {
        return Ok(false);
    };
    audit::record_one(&mut tx, actor, revoked(&row)).await?;
    tx.commit().await?;
    Ok(true)
}

/// The active token whose secret hashes to `secret_sha256`.
pub async fn find_active(pool: &PgPool, secret_sha256: &[u8]) -> LedgerResult<Option<TokenRow>> {
    Ok(store::tokens::find_active(pool, secret_sha256).await?)
}
