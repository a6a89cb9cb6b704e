//! Notification channels (admin and finance): Slack, Microsoft Teams, email, PagerDuty and
//! signed webhooks that alerts and month closes go to. Targets are secrets: only admins see
//! them whole.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::Principal;
use crate::domain::channel::{ChannelFields, masked_target};
use crate::domain::values::masked_urls_in;
use crate::http::auth::require_finance;
use crate::http::error::{ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems};
use crate::http::state::AppState;
use crate::ledger::channels::{self, ChannelAttemptRow, ChannelDeliveryRow, ChannelRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_channel, list_channels))
        .routes(routes!(delete_channel))
        .routes(routes!(list_channel_deliveries))
        .routes(routes!(test_channel))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateChannel {
    /// What people call it, e.g. `ML on-call`.
    pub name: String,
    /// `slack`, `teams`, `email`, `pagerduty` or `webhook`.
    #[schema(example = "slack")]
    pub kind: String,
    /// The incoming-webhook URL (Slack, Teams' Workflows webhook, a signed webhook), the
    /// email addresses separated by commas, or for PagerDuty the Events API v2 URL (default
    /// `https://events.pagerduty.com/v2/enqueue`).
    pub target: Option<String>,
    /// PagerDuty's integration key of an Events API v2 service; only for `pagerduty`.
    pub routing_key: Option<String>,
    /// The projects whose alerts it receives; left out, every project's.
    pub projects: Option<Vec<String>>,
    /// The kinds it receives (`actual`, `forecast`, `idle_gpu`, `zombie_capacity`,
    /// `retry_storm`, `efficiency_regression`, `month_closed`); left out, every kind.
    pub alert_kinds: Option<Vec<String>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelView {
    pub id: Uuid,
    pub name: String,
    #[schema(example = "slack")]
    pub kind: String,
    /// Whole for admins; for others a URL's scheme and host, an address's domain.
    pub target: String,
    /// Whole for admins; for others its last four characters.
    pub routing_key: Option<String>,
    /// Null: every project.
    pub projects: Option<Vec<String>>,
    /// Null: every kind.
    pub alert_kinds: Option<Vec<String>>,
    pub created_at: DateTime<Utc>,
}

impl ChannelView {
    fn seen_by(row: ChannelRow, principal: &Principal) -> Self {
        let admin = principal.is_admin();
        Self {
            id: row.id,
            name: row.name,
            kind: row.kind.as_str().to_owned(),
            target: match admin {
                true => row.target,
                false => masked_target(row.kind, &row.target),
            },
            routing_key: row.routing_key.map(|key| match admin {
                true => key,
                false => format!("…{}", &key[key.len().saturating_sub(4)..]),
            }),
            projects: row.projects,
            alert_kinds: row.alert_kinds,
            created_at: row.created_at,
        }
    }
}

/// Create a channel (admin or finance).
#[utoipa::path(post, path = "/v1/channels", tag = "channels", request_body = CreateChannel,
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 201, description = "Created", body = ChannelView),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_channel(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateChannel>,
) -> ApiResult<(StatusCode, axum::Json<ChannelView>)> {
    require_finance(&principal)?;
    let row = channels::create(
        &state.pool,
        ChannelFields {
            name: &body.name,
            kind: &body.kind,
            target: body.target.as_deref(),
            routing_key: body.routing_key.as_deref(),
            projects: body.projects.as_deref(),
            alert_kinds: body.alert_kinds.as_deref(),
        },
        &principal.actor,
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(ChannelView::seen_by(row, &principal)),
    ))
}

/// Every channel (admin or finance), oldest first.
#[utoipa::path(get, path = "/v1/channels", tag = "channels",
    security(("bearer" = [])),
    responses(
        AuthProblems,
        (status = 200, description = "The channels", body = Vec<ChannelView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_channels(
    State(state): State<AppState>,
    principal: Principal,
) -> ApiResult<axum::Json<Vec<ChannelView>>> {
    require_finance(&principal)?;
    let rows = channels::list(&state.pool).await?;
    Ok(axum::Json(
        rows.into_iter()
            .map(|row| ChannelView::seen_by(row, &principal))
            .collect(),
    ))
}

/// Delete a channel (admin or finance): nothing more is sent to it, and what it still had
/// to deliver is cancelled.
#[utoipa::path(delete, path = "/v1/channels/{id}", tag = "channels",
    params(("id" = Uuid, Path, description = "Channel id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Deleted"),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_channel(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    require_finance(&principal)?;
    channels::delete(&state.pool, id, &principal.actor).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One attempt at a delivery, to a project's webhook or to a channel.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryAttempt {
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    /// The receiver's HTTP status, or the mail server's reply code, when it answered.
    pub status_code: Option<i32>,
    /// Why the attempt failed; null when it succeeded.
    pub error: Option<String>,
    pub duration_ms: i32,
}

/// A message's delivery to one channel.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelDeliveryView {
    pub channel_id: Uuid,
    pub channel_name: String,
    #[schema(example = "slack")]
    pub channel_kind: String,
    /// The project of the alert; null for a closed month.
    pub project: Option<String>,
    /// The alert's id, or the month close's message id.
    pub message_id: Uuid,
    /// `pending`, `delivered`, `gave_up`, or `cancelled` (the channel was deleted).
    pub state: String,
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    /// Every attempt, oldest first.
    pub attempts: Vec<DeliveryAttempt>,
}

/// The views of deliveries with their attempts; errors are shown with URLs masked to
/// non-admins.
pub fn delivery_views(
    deliveries: Vec<ChannelDeliveryRow>,
    attempts: &[ChannelAttemptRow],
    admin: bool,
) -> Vec<ChannelDeliveryView> {
    deliveries
        .into_iter()
        .map(|d| ChannelDeliveryView {
            attempts: attempts
                .iter()
                .filter(|a| {
                    a.project_id == d.project_id
                        && a.message_id == d.message_id
                        && a.channel_id == d.channel_id
                })
                .map(|a| DeliveryAttempt {
                    attempt: a.attempt,
                    attempted_at: a.attempted_at,
                    status_code: a.status_code,
                    error: match admin {
                        true => a.error.clone(),
                        false => a.error.as_deref().map(masked_urls_in),
                    },
                    duration_ms: a.duration_ms,
                })
                .collect(),
            channel_id: d.channel_id,
            channel_name: d.channel_name,
            channel_kind: d.channel_kind,
            project: Some(d.project_id).filter(|p| !p.is_empty()),
            message_id: d.message_id,
            next_attempt_at: (d.state == "pending").then_some(d.next_attempt_at),
            state: d.state,
            created_at: d.created_at,
        })
        .collect()
}

/// A channel's latest 50 deliveries (admin or finance), newest first.
#[utoipa::path(get, path = "/v1/channels/{id}/deliveries", tag = "channels",
    params(("id" = Uuid, Path, description = "Channel id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "Its latest deliveries with their attempts", body = Vec<ChannelDeliveryView>),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_channel_deliveries(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<axum::Json<Vec<ChannelDeliveryView>>> {
    require_finance(&principal)?;
    channels::get(&state.pool, id).await?;
    let (deliveries, attempts) = channels::recent(&state.pool, id, 50).await?;
    Ok(axum::Json(delivery_views(
        deliveries,
        &attempts,
        principal.is_admin(),
    )))
}

/// What a channel's receiver answered to a test message.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChannelTestResult {
    /// Whether the receiver took it.
    pub delivered: bool,
    /// Its HTTP status, or the mail server's reply code, when it answered.
    pub status_code: Option<i32>,
    /// The start of what it answered when it took the message.
    pub answer: Option<String>,
    /// Why it was not delivered.
    pub error: Option<String>,
    pub duration_ms: i64,
}

/// Send a test message to a channel now (admin or finance) and see what its receiver
/// answered.
#[utoipa::path(post, path = "/v1/channels/{id}/test", tag = "channels",
    params(("id" = Uuid, Path, description = "Channel id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 200, description = "Sent; whether the receiver took it and what it answered", body = ChannelTestResult),
        (status = 403, description = "Not finance or admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such channel", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn test_channel(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<axum::Json<ChannelTestResult>> {
    require_finance(&principal)?;
    let now = state.settings.clock.now();
    let outcome = state.notifier.test(&state.pool, id, now).await?;
    let shown = |text: String| match principal.is_admin() {
        true => text,
        false => masked_urls_in(&text),
    };
    let duration_ms = i64::try_from(outcome.duration.as_millis()).unwrap_or(i64::MAX);
    Ok(axum::Json(match outcome.result {
        Ok(sent) => ChannelTestResult {
            delivered: true,
            status_code: sent.status_code,
            answer: Some(shown(sent.answer)),
            error: None,
            duration_ms,
        },
        Err(failed) => ChannelTestResult {
            delivered: false,
            status_code: failed.status_code,
            answer: None,
            error: Some(shown(failed.error)),
            duration_ms,
        },
    }))
}
