//! Issuing API tokens: the secret is generated here, shown once and stored only as a hash;
//! and the admin token that lets the first person in.

use serde::Serialize;
use sqlx::PgPool;
use utoipa::ToSchema;
use uuid::Uuid;

use crate::domain::access::{Role, generate_secret, hash_secret, normalize_scope};
use crate::domain::validation::Violations;
use crate::domain::values::{self, ProjectId};
use crate::ledger::LedgerResult;
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
pub async fn issue(pool: &PgPool, request: TokenRequest) -> LedgerResult<CreatedToken> {
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
    let row = store::tokens::insert(
        pool,
        &request.name,
        request.role,
        &request.projects,
        &hash_secret(&secret),
    )
    .await?;
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
/// new secret replaces the previous one.
pub async fn bootstrap_admin(pool: &PgPool, configured: Option<&str>) -> LedgerResult<Bootstrap> {
    match configured {
        Some(secret) => Ok(
            match store::tokens::install_bootstrap(pool, &hash_secret(secret)).await? {
                BootstrapToken::Active => Bootstrap::Configured,
                BootstrapToken::Revoked => Bootstrap::ConfiguredButRevoked,
            },
        ),
        None => {
            let secret = generate_secret();
            Ok(
                match store::tokens::create_first_admin(pool, &hash_secret(&secret)).await? {
                    Some(token) => Bootstrap::FirstAdmin {
                        id: token.id,
                        secret,
                    },
                    None => Bootstrap::Existing,
                },
            )
        }
    }
}

/// Tokens in id order after `after`.
pub async fn list(pool: &PgPool, after: Option<Uuid>, limit: i64) -> LedgerResult<Vec<TokenRow>> {
    Ok(store::tokens::list(pool, after, limit).await?)
}

/// Revokes an active token; `false` when there is none with that id.
pub async fn revoke(pool: &PgPool, id: Uuid) -> LedgerResult<bool> {
    Ok(store::tokens::revoke(pool, id).await?)
}

/// The active token whose secret hashes to `secret_sha256`.
pub async fn find_active(pool: &PgPool, secret_sha256: &[u8]) -> LedgerResult<Option<TokenRow>> {
    Ok(store::tokens::find_active(pool, secret_sha256).await?)
}
