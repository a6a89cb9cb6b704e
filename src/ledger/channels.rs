//! Notification channels: creating, listing and deleting them, and queueing what each one
//! receives (alerts as they fire, a closed month's report) in their outbox, in the
//! transaction that fires the alert or closes the month.
//!
//! A message is queued once per channel (the outbox's key is the message and the channel),
//! with the notice it will say; the delivery worker renders it in the channel's format when
//! it sends, so a retry says the same. A channel deleted stops at once: its pending
//! messages are cancelled in the transaction that deletes it, and the worker only claims
//! messages of channels not deleted, so one queued by a transaction that raced the delete is
//! never sent either (and is cancelled when the worker next finds nothing due).

use base64::Engine;
use chrono::{DateTime, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::domain::access::Actor;
use crate::domain::audit::Change;
use crate::domain::channel::{ChannelFields, masked_target, subscribes};
use crate::domain::values::{Month, round_money};
use crate::exports::notify::{Notice, Severity};
use crate::ledger::alert_event::{AlertEvent, AlertEventKind, RetryStormTrigger};
use crate::ledger::{LedgerError, LedgerResult, audit};
use crate::store;
pub use crate::store::channels::{ChannelAttemptRow, ChannelDeliveryRow, ChannelRow, DueMessage};

/// A file sent with a message (a closed month's report).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub filename: String,
    pub content_type: String,
    /// The file's bytes, base64-encoded in the outbox.
    pub base64: String,
}

impl Attachment {
    pub fn new(filename: &str, content_type: &str, bytes: &[u8]) -> Self {
        Self {
            filename: filename.to_owned(),
            content_type: content_type.to_owned(),
            base64: base64::engine::general_purpose::STANDARD.encode(bytes),
        }
    }

    pub fn bytes(&self) -> anyhow::Result<Vec<u8>> {
        Ok(base64::engine::general_purpose::STANDARD.decode(&self.base64)?)
    }
}

/// What the outbox keeps of a message: the notice every format renders, the alert as the
/// signed webhook posts it (null for a closed month), and its attachment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Message {
    pub notice: Notice,
    pub event: Option<Value>,
    pub attachment: Option<Attachment>,
}

/// A channel as the audit log keeps it: as finance sees it, its target and routing key
/// masked, since they are secrets.
fn snapshot(row: &ChannelRow) -> Value {
    let key_tail = |key: &String| {
        let tail: String = key
            .chars()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    };
    serde_json::json!({
        "id": row.id,
        "name": row.name,
        "kind": row.kind.as_str(),
        "target": masked_target(row.kind, &row.target),
        "routing_key": row.routing_key.as_ref().map(key_tail),
        "projects": row.projects,
        "alert_kinds": row.alert_kinds,
        "created_at": row.created_at,
    })
}

/// Creates a channel; every project it names must exist.
pub async fn create(
    pool: &PgPool,
    fields: ChannelFields<'_>,
    actor: &Actor,
) -> LedgerResult<ChannelRow> {
    let channel = fields.parse()?;
    if let Some(projects) = &channel.projects {
        let existing = store::projects::existing_ids(pool, projects).await?;
        let missing: Vec<_> = fields
            .projects
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, id)| !existing.contains(id))
            .map(|(i, id)| {
                crate::domain::validation::FieldError::new(
                    format!("/projects/{i}"),
                    format!("there is no project `{id}`"),
                )
            })
            .collect();
        if !missing.is_empty() {
            return Err(LedgerError::Invalid(missing));
        }
    }
    let mut tx = pool.begin().await?;
    let row = store::channels::insert(&mut tx, &channel).await?;
    let change = Change::new(
        "channel",
        row.id.to_string(),
        "create",
        None,
        Some(snapshot(&row)),
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(row)
}

/// Every channel not deleted, oldest first.
pub async fn list(pool: &PgPool) -> LedgerResult<Vec<ChannelRow>> {
    let mut conn = pool.acquire().await?;
    Ok(store::channels::active(&mut conn).await?)
}

/// One channel not deleted.
pub async fn get(pool: &PgPool, id: Uuid) -> LedgerResult<ChannelRow> {
    store::channels::get(pool, id)
        .await?
        .ok_or_else(|| not_found(id))
}

fn not_found(id: Uuid) -> LedgerError {
    LedgerError::NotFound(format!("there is no channel {id}"))
}

/// Deletes a channel: nothing more is sent to it from the moment this commits.
pub async fn delete(pool: &PgPool, id: Uuid, actor: &Actor) -> LedgerResult<()> {
    let mut tx = pool.begin().await?;
    let Some(before) = store::channels::delete(&mut tx, id).await? else {
        return Err(not_found(id));
    };
    let change = Change::new(
        "channel",
        id.to_string(),
        "delete",
        Some(snapshot(&before)),
        None,
    );
    audit::record_one(&mut tx, actor, change).await?;
    tx.commit().await?;
    Ok(())
}

/// A channel's latest deliveries with their attempts, newest first.
pub async fn recent(
    pool: &PgPool,
    id: Uuid,
    limit: i64,
) -> LedgerResult<(Vec<ChannelDeliveryRow>, Vec<ChannelAttemptRow>)> {
    Ok(store::channels::recent_of_channel(pool, id, limit).await?)
}

/// The channel deliveries of alerts `(project, id)`, with their attempts.
pub async fn deliveries_of(
    pool: &PgPool,
    alerts: &[(String, Uuid)],
) -> LedgerResult<(Vec<ChannelDeliveryRow>, Vec<ChannelAttemptRow>)> {
    Ok(store::channels::deliveries_of(pool, alerts).await?)
}

/// The message for each channel of `channels` that subscribes to messages of `kind` about
/// `project` (`None`: every project), all with the same body.
fn addressed(
    channels: &[ChannelRow],
    project: Option<&str>,
    kind: &str,
    message_id: Uuid,
    message: impl FnOnce() -> anyhow::Result<Message>,
) -> anyhow::Result<Vec<store::channels::Outgoing>> {
    let wanting: Vec<&ChannelRow> = channels
        .iter()
        .filter(|c| {
            subscribes(
                c.projects.as_deref(),
                c.alert_kinds.as_deref(),
                project,
                kind,
            )
        })
        .collect();
    if wanting.is_empty() {
        return Ok(Vec::new());
    }
    let body = serde_json::to_value(message()?)?;
    Ok(wanting
        .into_iter()
        .map(|channel| store::channels::Outgoing {
            project_id: project.unwrap_or_default().to_owned(),
            message_id,
            channel_id: channel.id,
            body: body.clone(),
        })
        .collect())
}

/// Queues fired alerts for every channel that subscribes to them, in the caller's
/// transaction (the one that fired them).
pub async fn queue_alerts(conn: &mut PgConnection, events: &[AlertEvent]) -> anyhow::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let channels = store::channels::active(conn).await?;
    let mut outgoing = Vec::new();
    for event in events {
        let kind = serde_json::to_value(event.kind)?;
        outgoing.extend(addressed(
            &channels,
            Some(&event.project),
            kind.as_str().unwrap_or_default(),
            event.id,
            || {
                Ok(Message {
                    notice: notice_of(event),
                    event: Some(serde_json::to_value(event)?),
                    attachment: None,
                })
            },
        )?);
    }
    store::channels::enqueue(conn, &outgoing).await?;
    Ok(())
}

/// Queues the close of `month` for the channels that subscribe to `month_closed`, with the
/// monthly report attached as CSV; `message_id` keeps it once per close.
pub async fn queue_month_close(
    conn: &mut PgConnection,
    message_id: Uuid,
    month: Month,
    closed_at: DateTime<Utc>,
    report_csv: &str,
) -> anyhow::Result<()> {
    let channels = store::channels::active(conn).await?;
    let filename = format!("taskledger-report-{month}.csv");
    let outgoing = addressed(&channels, None, "month_closed", message_id, || {
        Ok(Message {
            notice: Notice {
                id: message_id,
                kind: "month_closed".to_owned(),
                project: None,
                title: format!("{} is closed", month_name(month)),
                summary: format!(
                    "Finance closed {}: its figures are final. The monthly report is attached \
                     as {filename}.",
                    month_name(month)
                ),
                facts: vec![("Month".to_owned(), month.to_string())],
                link: Some(format!("/#page=finance&month={month}")),
                severity: Severity::Info,
                at: closed_at,
            },
            event: None,
            attachment: Some(Attachment::new(
                &filename,
                "text/csv",
                report_csv.as_bytes(),
            )),
        })
    })?;
    store::channels::enqueue(conn, &outgoing).await?;
    Ok(())
}

/// The notice a test message says.
pub fn test_notice(channel: &ChannelRow, at: DateTime<Utc>) -> Notice {
    Notice {
        id: Uuid::new_v4(),
        kind: "test".to_owned(),
        project: None,
        title: format!("Test message to {}", channel.name),
        summary: "taskledger can reach this channel: alerts for the projects and kinds it \
                  subscribes to will arrive here."
            .to_owned(),
        facts: vec![
            ("Channel".to_owned(), channel.name.clone()),
            ("Kind".to_owned(), channel.kind.as_str().to_owned()),
        ],
        link: Some("/".to_owned()),
        severity: Severity::Info,
        at,
    }
}

/// "November 2026".
fn month_name(month: Month) -> String {
    month.first_day().format("%B %Y").to_string()
}

fn money(amount: Decimal, currency: &str) -> String {
    format!("{} {currency}", round_money(amount, currency))
}

/// What an alert says to people: a title naming the project and what crossed, the figures,
/// and the dashboard page to act on it (a path; the sender prefixes the public URL).
pub fn notice_of(event: &AlertEvent) -> Notice {
    let project = &event.project;
    let month = event.month;
    let cur = &event.currency;
    let project_page = format!("/#project={project}&month={month}");
    let task_page = |task: &str| {
        format!(
            "/#project={project}&month={month}&task={}",
            url_component(task)
        )
    };
    let mut facts: Vec<(String, String)> = vec![("Project".to_owned(), project.clone())];
    let fact = |label: &str, value: String| (label.to_owned(), value);
    let (title, summary, severity, link) = match event.kind {
        AlertEventKind::Actual | AlertEventKind::Forecast => {
            let threshold = event.threshold.unwrap_or_default();
            let spend = event.spend.unwrap_or_default();
            let budget = event.budget.unwrap_or_default();
            let whose = match &event.route {
                Some(route) => format!("route {}={} of {project}", route.key, route.value),
                None => project.clone(),
            };
            facts.push(fact("Spend", money(spend, cur)));
            facts.push(fact("Budget", money(budget, cur)));
            if let Some(pct) = event.burn_pct {
                facts.push(fact("Burn", format!("{}%", pct.round_dp(1).normalize())));
            }
            if let Some(forecast) = event.forecast {
                facts.push(fact("Forecast", money(forecast, cur)));
            }
            let (title, summary) = if event.kind == AlertEventKind::Actual {
                (
                    format!(
                        "{whose} spent {threshold}% of its {} budget",
                        month_name(month)
                    ),
                    format!(
                        "Spend reached {} of a {} budget.",
                        money(spend, cur),
                        money(budget, cur)
                    ),
                )
            } else {
                (
                    format!(
                        "{whose} is on course to spend {threshold}% of its {} budget",
                        month_name(month)
                    ),
                    format!(
                        "At this rate the month ends at {} against a {} budget.",
                        money(event.forecast.unwrap_or_default(), cur),
                        money(budget, cur)
                    ),
                )
            };
            let severity = match (event.kind, threshold) {
                (AlertEventKind::Actual, t) if t >= 100 => Severity::Critical,
                (AlertEventKind::Actual, t) if t >= 80 => Severity::Error,
                _ => Severity::Warning,
            };
            (title, summary, severity, project_page.clone())
        }
        AlertEventKind::IdleGpu => {
            let idle = event.idle_gpu.as_ref();
            let task = idle.map(|i| i.task_id.clone()).unwrap_or_default();
            if let Some(i) = idle {
                facts.push(fact(
                    "Task",
                    format!("{} (attempt {})", i.task_id, i.attempt),
                ));
                facts.push(fact(
                    "GPUs",
                    format!("{} × {}", i.gpu_count.normalize(), i.gpu_model),
                ));
                facts.push(fact(
                    "Activity",
                    format!(
                        "{} {} (idle under {})",
                        i.measure.as_str(),
                        i.activity.round_dp(3).normalize(),
                        i.threshold.normalize()
                    ),
                ));
                facts.push(fact(
                    "GPU-hours held",
                    (i.gpu_seconds_held / Decimal::from(3600))
                        .round_dp(2)
                        .normalize()
                        .to_string(),
                ));
                facts.push(fact("Cost", money(i.cost, cur)));
            }
            (
                format!("{project}: task {task} held its GPUs idle"),
                match idle {
                    Some(i) => format!(
                        "Task {} held {} × {} that did next to nothing, for {}.",
                        i.task_id,
                        i.gpu_count.normalize(),
                        i.gpu_model,
                        money(i.cost, cur)
                    ),
                    None => "A finished record held GPUs that did next to nothing.".to_owned(),
                },
                Severity::Warning,
                task_page(&task),
            )
        }
        AlertEventKind::ZombieCapacity => {
            let zombie = event.zombie_capacity.as_ref();
            if let Some(z) = zombie {
                facts.push(fact("Node", z.node.clone()));
                facts.push(fact("Pool", z.pool.clone()));
                facts.push(fact("GPUs", format!("{} × {}", z.gpus, z.gpu_model)));
                facts.push(fact("Idle since", z.since.to_rfc3339()));
                if let Some(rate) = z.cost_per_hour {
                    facts.push(fact("Cost per hour", money(rate, cur)));
                }
                if let Some(cost) = z.cost_so_far {
                    facts.push(fact("Cost so far", money(cost, cur)));
                }
            }
            let node = zombie.map(|z| z.node.clone()).unwrap_or_default();
            (
                format!("Node {node} is paid for and idle"),
                match zombie {
                    Some(z) => format!(
                        "{} × {} on node {} of pool {} have run no job since {}.",
                        z.gpus,
                        z.gpu_model,
                        z.node,
                        z.pool,
                        z.since.format("%Y-%m-%d %H:%M UTC")
                    ),
                    None => {
                        "A paid node has run no job for longer than its pool allows.".to_owned()
                    }
                },
                Severity::Error,
                format!("/#page=fleet&month={month}"),
            )
        }
        AlertEventKind::RetryStorm => {
            let storm = event.retry_storm.as_ref();
            let route = event
                .route
                .as_ref()
                .map(|r| format!("{}={}", r.key, r.value))
                .unwrap_or_default();
            facts.push(fact("Route", route.clone()));
            let mut link = project_page.clone();
            if let Some(s) = storm {
                match s.trigger {
                    RetryStormTrigger::MaxAttemptsPerTask => {
                        let task = s.task_id.clone().unwrap_or_default();
                        facts.push(fact("Task", task.clone()));
                        facts.push(fact("Attempt", s.observed.normalize().to_string()));
                        facts.push(fact("Attempts allowed", s.cap.normalize().to_string()));
                        link = task_page(&task);
                    }
                    RetryStormTrigger::MaxFailedSpendPerHour => {
                        if let Some(hour) = s.hour {
                            facts.push(fact("Hour", hour.to_rfc3339()));
                        }
                        facts.push(fact("Failed spend", money(s.observed, cur)));
                        facts.push(fact("Allowed per hour", money(s.cap, cur)));
                    }
                }
            }
            (
                format!("{project}: retry storm on route {route}"),
                match storm.map(|s| s.trigger) {
                    Some(RetryStormTrigger::MaxAttemptsPerTask) => {
                        "A task went beyond the attempts its route allows.".to_owned()
                    }
                    _ => {
                        "Failed attempts cost more within an hour than the route allows.".to_owned()
                    }
                },
                Severity::Error,
                link,
            )
        }
        AlertEventKind::EfficiencyRegression => {
            let regression = event.efficiency_regression.as_ref();
            if let Some(r) = regression {
                facts.push(fact("Workload", r.workload.clone()));
                facts.push(fact(
                    "Cost per unit",
                    format!(
                        "{} → {} {cur} per {}",
                        r.baseline_cost_per_unit.normalize(),
                        r.window_cost_per_unit.normalize(),
                        r.unit
                    ),
                ));
                facts.push(fact("Extra cost per day", money(r.extra_cost_per_day, cur)));
                if let Some(largest) = &r.largest {
                    facts.push(fact("Moved most", largest.clone()));
                }
            }
            let (workload, change, unit) = regression
                .map(|r| {
                    (
                        r.workload.clone(),
                        r.change
                            .map(|c| format!("{}%", (c * Decimal::ONE_HUNDRED).round_dp(0)))
                            .unwrap_or_else(|| "more".to_owned()),
                        r.unit.clone(),
                    )
                })
                .unwrap_or_default();
            (
                format!("{project}: {workload} costs {change} more per {unit}"),
                format!(
                    "The daily cost per {unit} of {workload} rose from {} to {} {cur} since {}.",
                    regression
                        .map(|r| r.baseline_cost_per_unit.normalize().to_string())
                        .unwrap_or_default(),
                    regression
                        .map(|r| r.window_cost_per_unit.normalize().to_string())
                        .unwrap_or_default(),
                    regression
                        .map(|r| r.window_from.to_string())
                        .unwrap_or_default(),
                ),
                Severity::Warning,
                project_page.clone(),
            )
        }
    };
    Notice {
        id: event.id,
        kind: serde_json::to_value(event.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        project: Some(project.clone()),
        title,
        summary,
        facts,
        link: Some(link),
        severity,
        at: event.fired_at,
    }
}

/// `text` percent-encoded for a URL fragment's query value.
fn url_component(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

/// Makes one attempt at the channel message due first, in a transaction that holds it (so
/// no other replica sends it meanwhile), and records what came of it; `None` when nothing
/// is due, after cancelling what deleted channels still had pending (messages queued by a
/// transaction that raced the delete, which the claim skips). `attempt` sends it and says
/// what comes next.
pub async fn deliver_next(
    pool: &PgPool,
    attempt: impl AsyncFnOnce(
        &DueMessage,
        &Message,
    ) -> (store::alerts::Attempt, store::alerts::NextStep),
) -> anyhow::Result<Option<(DueMessage, store::alerts::NextStep)>> {
    let mut tx = pool.begin().await?;
    let Some(due) = store::channels::claim_due(&mut tx).await? else {
        tx.rollback().await?;
        store::channels::cancel_for_deleted(&mut *pool.acquire().await?).await?;
        return Ok(None);
    };
    let (made, next) = match serde_json::from_value::<Message>(due.body.clone()) {
        Ok(message) => attempt(&due, &message).await,
        Err(error) => (
            store::alerts::Attempt {
                attempted_at: Utc::now(),
                status_code: None,
                error: Some(format!("the queued message cannot be read: {error}")),
                duration_ms: 0,
            },
            store::alerts::NextStep::GiveUp,
        ),
    };
    store::channels::record_attempt(&mut tx, &due, &made, next).await?;
    tx.commit().await?;
    Ok(Some((due, next)))
}
