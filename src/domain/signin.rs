//! What a person signed in through the organisation's OpenID Connect provider may do, and for
//! how long: the mapping from the values of one ID-token claim (`groups` by default) to a role
//! and projects, where the browser may be sent back to, and when a session ends.
//!
//! A person gets the highest role any of their claim values maps to (admin, then finance,
//! then reader); a reader reads the union of the projects of every reader value they hold. A
//! value the mapping does not name gives nothing, and a person with no mapped value is not let
//! in. People never get the `ingest` role: posting job records is for machines, with tokens.

use chrono::{DateTime, TimeDelta, Utc};

use super::access::{Role, normalize_scope};
use super::values::ProjectId;

/// What a session acts as: a role, and the projects a reader reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    pub role: Role,
    /// Sorted, without repeats; empty for admin and finance, which act on every project.
    pub projects: Vec<String>,
}

/// `claim value → role (and projects)`, as `TASKLEDGER_OIDC_ROLES` writes it:
/// `value=role` or `value=reader:project,project`, entries separated by `;` or new lines,
/// e.g. `platform-admins=admin; finance=finance; vision-team=reader:vision,vision-eval`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoleMap {
    entries: Vec<(String, Access)>,
}

impl RoleMap {
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for entry in raw
            .split([';', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            let (value, grant) = entry
                .rsplit_once('=')
                .ok_or_else(|| format!("`{entry}` is not `claim value=role`"))?;
            let value = value.trim();
            if value.is_empty() {
                return Err(format!("`{entry}` names no claim value before `=`"));
            }
            let (role, projects) = match grant.split_once(':') {
                Some((role, projects)) => (role.trim(), Some(projects)),
                None => (grant.trim(), None),
            };
            let role = match Role::parse(role) {
                Some(Role::Ingest) => {
                    return Err(format!(
                        "`{entry}`: people cannot have the ingest role; give CI an ingest token"
                    ));
                }
                Some(role) => role,
                None => {
                    return Err(format!(
                        "`{entry}`: `{role}` is not admin, finance or reader"
                    ));
                }
            };
            let mut scope = Vec::new();
            for project in projects
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
            {
                scope.push(ProjectId::parse(project).map_err(|why| format!("`{entry}`: {why}"))?);
            }
            match (role, scope.is_empty()) {
                (Role::Reader, true) => {
                    return Err(format!(
                        "`{entry}`: a reader needs projects, as `{value}=reader:project,project`"
                    ));
                }
                (Role::Admin | Role::Finance, false) => {
                    return Err(format!(
                        "`{entry}`: {} acts on every project; leave the projects out",
                        role.as_str()
                    ));
                }
                _ => {}
            }
            if entries.iter().any(|(known, _)| known == value) {
                return Err(format!("`{value}` is mapped twice"));
            }
            entries.push((
                value.to_owned(),
                Access {
                    role,
                    projects: normalize_scope(&scope),
                },
            ));
        }
        if entries.is_empty() {
            return Err("maps no claim value to a role".to_owned());
        }
        Ok(Self { entries })
    }

    /// What a person holding `values` may do; `None` when no value is mapped.
    pub fn resolve(&self, values: &[String]) -> Option<Access> {
        let held: Vec<&Access> = self
            .entries
            .iter()
            .filter(|(value, _)| values.iter().any(|held| held == value))
            .map(|(_, access)| access)
            .collect();
        let rank = |role: Role| match role {
            Role::Admin => 3,
            Role::Finance => 2,
            Role::Reader => 1,
            Role::Ingest => 0,
        };
        let best = held
            .iter()
            .map(|access| access.role)
            .max_by_key(|r| rank(*r))?;
        let mut projects: Vec<String> = held
            .iter()
            .filter(|access| access.role == best)
            .flat_map(|access| access.projects.iter().cloned())
            .collect();
        projects.sort();
        projects.dedup();
        Some(Access {
            role: best,
            projects,
        })
    }
}

/// The values of a claim: a string is one value, an array of strings is many; anything else
/// holds none.
pub fn claim_values(claim: Option<&serde_json::Value>) -> Vec<String> {
    match claim {
        Some(serde_json::Value::String(value)) => vec![value.clone()],
        Some(serde_json::Value::Array(values)) => values
            .iter()
            .filter_map(|value| value.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    }
}

/// Where the browser goes after signing in: a path of this service, never another site
/// (`//evil.example`, `/\evil.example` and absolute URLs are refused for `/`).
pub fn return_to(raw: Option<&str>) -> String {
    match raw {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && !path.starts_with("/\\")
                && path.len() <= 2000
                && !path.chars().any(char::is_control) =>
        {
            path.to_owned()
        }
        _ => "/".to_owned(),
    }
}

/// How long a session lives: it ends after `idle` without a request, and at the latest
/// `lifetime` after sign-in, whichever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionPolicy {
    pub idle: TimeDelta,
    pub lifetime: TimeDelta,
}

impl SessionPolicy {
    pub const DEFAULT_IDLE: TimeDelta = TimeDelta::hours(1);
    pub const DEFAULT_LIFETIME: TimeDelta = TimeDelta::hours(12);
    /// A session's last use is written at most this often, so reading pages does not turn
    /// every request into a write.
    const TOUCH_EVERY: TimeDelta = TimeDelta::minutes(1);

    pub fn new(idle: TimeDelta, lifetime: TimeDelta) -> Result<Self, String> {
        if idle <= TimeDelta::zero() || lifetime <= TimeDelta::zero() {
            return Err("session times must be positive".to_owned());
        }
        if idle > lifetime {
            return Err(format!(
                "the idle timeout ({} min) is longer than the session lifetime ({} min)",
                idle.num_minutes(),
                lifetime.num_minutes()
            ));
        }
        Ok(Self { idle, lifetime })
    }

    pub fn expires_at(&self, signed_in_at: DateTime<Utc>) -> DateTime<Utc> {
        signed_in_at + self.lifetime
    }

    pub fn is_live(
        &self,
        last_seen_at: DateTime<Utc>,
        expires_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> bool {
        now < expires_at && now < last_seen_at + self.idle
    }

    pub fn needs_touch(&self, last_seen_at: DateTime<Utc>, now: DateTime<Utc>) -> bool {
        now - last_seen_at >= Self::TOUCH_EVERY
    }
}

impl Default for SessionPolicy {
    fn default() -> Self {
        Self {
            idle: Self::DEFAULT_IDLE,
            lifetime: Self::DEFAULT_LIFETIME,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(raw: &[&str]) -> Vec<String> {
        raw.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn the_highest_mapped_role_wins_and_readers_read_every_project_they_are_given() {
        let map = RoleMap::parse(
            "platform=admin; money=finance\nvision-team=reader:vision,vision-eval;nlp=reader:nlp",
        )
        .unwrap();
        assert_eq!(
            map.resolve(&values(&["nlp", "vision-team", "staff"])),
            Some(Access {
                role: Role::Reader,
                projects: values(&["nlp", "vision", "vision-eval"]),
            })
        );
        assert_eq!(
            map.resolve(&values(&["nlp", "money"])),
            Some(Access {
                role: Role::Finance,
                projects: vec![],
            })
        );
        assert_eq!(
            map.resolve(&values(&["money", "platform"])).unwrap().role,
            Role::Admin
        );
        assert_eq!(map.resolve(&values(&["staff"])), None);
        assert_eq!(map.resolve(&[]), None);
    }

    #[test]
    fn a_mapping_that_cannot_be_meant_is_refused_with_its_entry() {
        for (raw, says) in [
            ("", "maps no claim value"),
            ("ops", "is not `claim value=role`"),
            ("=admin", "names no claim value"),
            ("ops=root", "`root` is not admin"),
            ("ci=ingest:vision", "cannot have the ingest role"),
            ("team=reader", "a reader needs projects"),
            ("money=finance:vision", "leave the projects out"),
            ("team=reader:Vision", "is not a project id"),
            ("a=admin;a=finance", "mapped twice"),
        ] {
            let error = RoleMap::parse(raw).unwrap_err();
            assert!(error.contains(says), "{raw}: {error}");
        }
    }

    #[test]
    fn a_claim_is_a_string_or_a_list_of_strings() {
        use serde_json::json;
        assert_eq!(claim_values(Some(&json!("ops"))), values(&["ops"]));
        assert_eq!(
            claim_values(Some(&json!(["ops", 3, "money"]))),
            values(&["ops", "money"])
        );
        assert!(claim_values(Some(&json!({"ops": true}))).is_empty());
        assert!(claim_values(None).is_empty());
    }

    #[test]
    fn the_browser_returns_only_to_a_path_of_this_service() {
        assert_eq!(return_to(Some("/#page=finance")), "/#page=finance");
        for hostile in [
            "//evil.example/",
            "/\\evil.example",
            "https://evil.example/",
            "javascript:alert(1)",
            "/\nSet-Cookie: x",
            "",
        ] {
            assert_eq!(return_to(Some(hostile)), "/", "{hostile:?}");
        }
        assert_eq!(return_to(None), "/");
    }

    #[test]
    fn a_session_ends_when_idle_or_at_its_lifetime_whichever_is_first() {
        let policy = SessionPolicy::new(TimeDelta::minutes(30), TimeDelta::hours(8)).unwrap();
        let signed_in: DateTime<Utc> = "2026-12-01T09:00:00Z".parse().unwrap();
        let expires = policy.expires_at(signed_in);
        let at = |minutes| signed_in + TimeDelta::minutes(minutes);
        assert!(policy.is_live(signed_in, expires, at(29)));
        assert!(!policy.is_live(signed_in, expires, at(30)));
        assert!(policy.is_live(at(470), expires, at(479)));
        assert!(!policy.is_live(at(479), expires, at(480)));
        assert!(!policy.needs_touch(at(10), at(10) + TimeDelta::seconds(59)));
        assert!(policy.needs_touch(at(10), at(11)));
        assert!(SessionPolicy::new(TimeDelta::hours(9), TimeDelta::hours(8)).is_err());
        assert!(SessionPolicy::new(TimeDelta::zero(), TimeDelta::hours(8)).is_err());
    }
}
