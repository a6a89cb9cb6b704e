//! Who may do what: roles, project scopes and token secrets.

use rand::RngCore;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use utoipa::ToSchema;

use super::values::ProjectId;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, including tokens, projects, contracts and FX rates.
    Admin,
    /// Reads every project; budgets, reports, month close, contracts and FX rates.
    Finance,
    /// Reads the projects it is scoped to.
    Reader,
    /// Posts job records to the projects it is scoped to, nothing else.
    Ingest,
}

impl Role {
    pub fn as_str(&self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Finance => "finance",
            Role::Reader => "reader",
            Role::Ingest => "ingest",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "admin" => Some(Role::Admin),
            "finance" => Some(Role::Finance),
            "reader" => Some(Role::Reader),
            "ingest" => Some(Role::Ingest),
            _ => None,
        }
    }

    /// Scoped roles act only on the projects listed on their token.
    pub fn is_scoped(&self) -> bool {
        matches!(self, Role::Reader | Role::Ingest)
    }
}

impl TryFrom<String> for Role {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        Role::parse(&raw).ok_or_else(|| format!("`{raw}` is not a role"))
    }
}

/// Who made a change: an API token, a person signed in through the identity provider, or the
/// service itself (the bootstrap admin token, scheduled work).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ActorKind {
    Token,
    User,
    System,
}

impl ActorKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            ActorKind::Token => "token",
            ActorKind::User => "user",
            ActorKind::System => "system",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "token" => Some(ActorKind::Token),
            "user" => Some(ActorKind::User),
            "system" => Some(ActorKind::System),
            _ => None,
        }
    }
}

impl TryFrom<String> for ActorKind {
    type Error = String;

    fn try_from(raw: String) -> Result<Self, String> {
        ActorKind::parse(&raw).ok_or_else(|| format!("`{raw}` is not an actor kind"))
    }
}

/// The actor of a change: a token's id and name, a user's subject and display name, or
/// `system` and what part of the service acted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Actor {
    pub kind: ActorKind,
    pub id: String,
    pub name: String,
}

impl Actor {
    pub fn token(id: uuid::Uuid, name: &str) -> Self {
        Self {
            kind: ActorKind::Token,
            id: id.to_string(),
            name: name.to_owned(),
        }
    }

    pub fn user(subject: &str, name: &str) -> Self {
        Self {
            kind: ActorKind::User,
            id: subject.to_owned(),
            name: name.to_owned(),
        }
    }

    pub fn system(what: &str) -> Self {
        Self {
            kind: ActorKind::System,
            id: what.to_owned(),
            name: what.to_owned(),
        }
    }

    /// The token behind this actor, when it is one.
    pub fn token_id(&self) -> Option<uuid::Uuid> {
        match self.kind {
            ActorKind::Token => self.id.parse().ok(),
            ActorKind::User | ActorKind::System => None,
        }
    }
}

/// The caller of one request: who it is, and the role and projects its token or sign-in gives.
#[derive(Debug, Clone)]
pub struct Principal {
    pub actor: Actor,
    pub role: Role,
    pub projects: Vec<String>,
}

impl Principal {
    fn in_scope(&self, project: &str) -> bool {
        self.projects.iter().any(|p| p == project)
    }

    /// Whether the caller may see this project at all; others get 404, never its data.
    pub fn can_read(&self, project: &str) -> bool {
        match self.role {
            Role::Admin | Role::Finance => true,
            Role::Reader => self.in_scope(project),
            Role::Ingest => false,
        }
    }

    pub fn can_ingest(&self, project: &str) -> bool {
        match self.role {
            Role::Admin => true,
            Role::Ingest => self.in_scope(project),
            Role::Finance | Role::Reader => false,
        }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    pub fn is_finance_or_admin(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Finance)
    }
}

/// Every token starts with this prefix, so a leaked one is easy to spot and scan for.
pub const TOKEN_PREFIX: &str = "tl_";

/// A new random secret: 32 bytes from the OS generator, base64url.
pub fn generate_secret() -> String {
    use base64::Engine;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    format!(
        "{TOKEN_PREFIX}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    )
}

/// Secrets are stored only as this hash. They carry 256 random bits, so a fast hash is enough:
/// there is nothing to brute-force.
pub fn hash_secret(secret: &str) -> Vec<u8> {
    Sha256::digest(secret.as_bytes()).to_vec()
}

/// A scope list as stored: sorted, without repeats.
pub fn normalize_scope(projects: &[ProjectId]) -> Vec<String> {
    let mut scope: Vec<String> = projects.iter().map(|p| p.as_str().to_owned()).collect();
    scope.sort();
    scope.dedup();
    scope
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(role: Role, projects: &[&str]) -> Principal {
        Principal {
            actor: Actor::token(uuid::Uuid::nil(), "test"),
            role,
            projects: projects.iter().map(|p| p.to_string()).collect(),
        }
    }

    #[test]
    fn readers_see_only_their_projects() {
        let reader = principal(Role::Reader, &["a"]);
        assert!(reader.can_read("a"));
        assert!(!reader.can_read("b"));
        assert!(!reader.can_ingest("a"));
    }

    #[test]
    fn ingest_tokens_only_post_to_their_projects() {
        let ingest = principal(Role::Ingest, &["a"]);
        assert!(ingest.can_ingest("a"));
        assert!(!ingest.can_ingest("b"));
        assert!(!ingest.can_read("a"));
    }

    #[test]
    fn finance_reads_everything_but_does_not_ingest() {
        let finance = principal(Role::Finance, &[]);
        assert!(finance.can_read("anything"));
        assert!(!finance.can_ingest("anything"));
    }

    #[test]
    fn secrets_are_random_and_hashed() {
        let a = generate_secret();
        let b = generate_secret();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX));
        assert_eq!(hash_secret(&a).len(), 32);
        assert_eq!(hash_secret(&a), hash_secret(&a));
    }
}
