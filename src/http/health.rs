//! Liveness, readiness and metrics.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, ApiResult};
use crate::store;

/// How long readiness waits for the database before it answers 503.
const READINESS_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(1500);
use crate::http::state::AppState;

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

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "The process is up", body = Health)))]
pub async fn get_healthz() -> axum::Json<Health> {
    axum::Json(Health {
        status: "ok".to_owned(),
    })
}

/// The database is reachable and carries every migration this build knows.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready to serve", body = Health),
        (status = 503, description = "Database unreachable or not migrated", body = crate::http::error::Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_readyz(State(state): State<AppState>) -> ApiResult<axum::Json<Health>> {
    // A probe wants an answer now, not after the pool's acquire timeout.
    let applied = tokio::time::timeout(READINESS_TIMEOUT, store::applied_migration(&state.pool))
        .await
        .map_err(|_| {
            ApiError::Unavailable(format!(
                "database unreachable: no connection within {} ms",
                READINESS_TIMEOUT.as_millis()
            ))
        })?
        .map_err(|error| ApiError::Unavailable(format!("database unreachable: {error}")))?;
    let expected = crate::db::latest_migration_version();
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
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
}
