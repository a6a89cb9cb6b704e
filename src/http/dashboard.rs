//! The dashboard: one self-contained page that reads the same API as every other client.

use axum::http::header;
use axum::response::{Html, IntoResponse};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::state::AppState;

const PAGE: &str = include_str!("../../web/index.html");

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_dashboard))
}

/// The dashboard (HTML). It asks for a token and keeps it in the browser.
#[utoipa::path(get, path = "/", tag = "operations",
    responses((status = 200, description = "The dashboard page", body = String, content_type = "text/html")))]
pub async fn get_dashboard() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-cache")], Html(PAGE))
}
