//! Messages people read where they work: an alert or a closed month as a Slack message, a
//! Microsoft Teams Adaptive Card, a PagerDuty Events API v2 event, or an email.
//!
//! The ledger says what happened as a [`Notice`]; this module only renders it in each
//! platform's own format.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// How urgent a notice is, in PagerDuty's four severities (which Slack and Teams show as a
/// colour or style, and email in its subject).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Error,
    Warning,
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// What happened, said once for every platform.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notice {
    /// The alert's id (PagerDuty's `dedup_key`, so repeats collapse), or the id of the
    /// month-close message.
    pub id: Uuid,
    /// `actual`, `forecast`, `idle_gpu`, `zombie_capacity`, `retry_storm`,
    /// `efficiency_regression`, `month_closed`, or `test`.
    pub kind: String,
    /// The project it is about; `None` for a closed month, which covers every project.
    pub project: Option<String>,
    /// One line: what crossed, e.g. "vision spent 80% of its November budget".
    pub title: String,
    /// A sentence or two with the figures that matter.
    pub summary: String,
    /// Label and value pairs, in order: spend, budget, forecast, task, node, cost…
    pub facts: Vec<(String, String)>,
    /// The dashboard page to act on it, when the service knows its public URL.
    pub link: Option<String>,
    pub severity: Severity,
    pub at: DateTime<Utc>,
}
