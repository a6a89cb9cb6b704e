//! Liveness, readiness and metrics.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, ApiResult};
use crate::http::state::AppState;
use crate::ledger::instruments;
use crate::ledger::setup::{self, ClusterState};

/// How long readiness waits for the database before it answers 503.
const READINESS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_healthz))
        .routes(routes!(get_readyz))
        .routes(routes!(get_metrics))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// `ok` when healthy.
    pub status: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Liveness {
    /// `ok` when the process is up.
    pub status: String,
    /// The embedded PostgreSQL cluster that this process runs and restarts whenever it exits;
    /// absent when the service uses `DATABASE_URL`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedded_database: Option<EmbeddedDatabase>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EmbeddedDatabase {
    pub state: EmbeddedDatabaseState,
    /// When its server was found exited; absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub down_since: Option<DateTime<Utc>>,
    /// Restart attempts that failed since it went down.
    pub failed_restarts: u32,
    /// How often it was restarted since the process started.
    pub restarts: u64,
}

/// `running`, or `restarting` from the moment its server is found exited until it accepts
/// connections again.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EmbeddedDatabaseState {
    Running,
    Restarting,
}

impl From<ClusterState> for EmbeddedDatabase {
    fn from(cluster: ClusterState) -> Self {
        Self {
            state: if cluster.is_running() {
                EmbeddedDatabaseState::Running
            } else {
                EmbeddedDatabaseState::Restarting
            },
            down_since: cluster.down_since,
            failed_restarts: cluster.failed_restarts,
            restarts: cluster.restarts,
        }
    }
}

/// The process is up, and can recover by itself: a crashed embedded database is being
/// restarted. Fails once its restarts keep failing, so that whatever supervises the process
/// can step in.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses(
        (status = 200, description = "The process is up", body = Liveness),
        (status = 503, description = "The embedded database is down and restarting it failed several times in a row", body = crate::http::error::Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_healthz(State(state): State<AppState>) -> ApiResult<axum::Json<Liveness>> {
    let cluster = state
        .embedded_database
        .as_ref()
        .map(|status| status.current());
    if let Some(cluster) = cluster.as_ref().filter(|cluster| cluster.is_failing()) {
        return Err(ApiError::Unavailable(format!(
            "the embedded database is down{} and {} restarts in a row failed; the service log says why",
            down_since(cluster),
            cluster.failed_restarts
        )));
    }
    Ok(axum::Json(Liveness {
        status: "ok".to_owned(),
        embedded_database: cluster.map(EmbeddedDatabase::from),
    }))
}

fn down_since(cluster: &ClusterState) -> String {
    cluster
        .down_since
        .map(|since| format!(" since {}", since.to_rfc3339()))
        .unwrap_or_default()
}

/// The database is reachable and carries every migration this build knows.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready to serve", body = Health),
        (status = 503, description = "Database unreachable or not migrated", body = crate::http::error::Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_readyz(State(state): State<AppState>) -> ApiResult<axum::Json<Health>> {
    let cluster = state
        .embedded_database
        .as_ref()
        .map(|status| status.current());
    if let Some(cluster) = cluster.filter(|cluster| !cluster.is_running()) {
        return Err(ApiError::Unavailable(format!(
            "the embedded database is being restarted; it is down{}",
            down_since(&cluster)
        )));
    }
    // A probe wants an answer now, not after the pool's acquire timeout.
    let applied = tokio::time::timeout(READINESS_TIMEOUT, setup::applied_migration(&state.pool))
        .await
        .map_err(|_| {
            ApiError::Unavailable(format!(
                "database unreachable: no connection within {} ms",
                READINESS_TIMEOUT.as_millis()
            ))
        })?
        .map_err(|error| ApiError::Unavailable(format!("database unreachable: {error}")))?;
    let expected = setup::latest_migration();
    if applied < Some(expected) {
        return Err(ApiError::Unavailable(format!(
            "database is at migration {}, this build needs {expected}",
            applied.unwrap_or(0)
        )));
    }
    Ok(axum::Json(Health {
        status: "ok".to_owned(),
    }))
}

/// Prometheus metrics in the text exposition format.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
pub async fn get_metrics(State(state): State<AppState>) -> impl IntoResponse {
    // The gauges about the database are sampled at each scrape.
    instruments::sample(&state.pool).await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
