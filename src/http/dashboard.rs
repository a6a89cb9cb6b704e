//! The dashboard: a page, its script and style, and the charting library it draws with, all
//! compiled into the binary so that it works offline and loads nothing from elsewhere. It
//! reads the same API as every other client.

use std::sync::LazyLock;

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::ApiPath;
use crate::http::problems::PathProblems;
use crate::http::state::AppState;

const PAGE: &str = include_str!("../../web/index.html");

/// What the page may load and talk to: this server only. Styles may be inline because bars
/// and meters are sized with `style` attributes; scripts may not.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; \
     base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A file served under `/assets/`.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// Its name carries a version, so a browser may keep it for good.
    immutable: bool,
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../web/app.js"),
        immutable: false,
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../web/app.css"),
        immutable: false,
    },
    Asset {
        name: "uPlot-1.6.32.iife.min.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../../web/vendor/uplot/uPlot.iife.min.js"),
        immutable: true,
    },
    Asset {
        name: "uPlot-1.6.32.min.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../../web/vendor/uplot/uPlot.min.css"),
        immutable: true,
    },
    Asset {
        name: "uPlot-1.6.32.LICENSE.txt",
        content_type: "text/plain; charset=utf-8",
        body: include_bytes!("../../web/vendor/uplot/LICENSE"),
        immutable: true,
    },
];

/// Strong validators of the assets that change with the binary, so that a browser revalidates
/// them cheaply and never runs a stale script against a newer API.
static ETAGS: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let digest = Sha256::digest(asset.body);
            HeaderValue::from_str(&format!("\"{}\"", hex::encode(&digest[..12])))
                .expect("hex is a valid header value")
        })
        .collect()
});

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_dashboard))
        .routes(routes!(get_asset))
}

/// The dashboard (HTML). It asks for a token and keeps it in the browser.
#[utoipa::path(get, path = "/", tag = "operations",
    responses((status = 200, description = "The dashboard page", body = String, content_type = "text/html")))]
pub async fn get_dashboard() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
}

/// A file of the dashboard: its script (`app.js`), style (`app.css`) and the vendored
/// charting library uPlot with its licence (`uPlot-<version>.iife.min.js`, `.min.css`,
/// `.LICENSE.txt`).
#[utoipa::path(get, path = "/assets/{file}", tag = "operations",
    params(("file" = String, Path, description = "The file's name")),
    responses(
        PathProblems,
        (status = 200, description = "The file", content(
            (String = "text/javascript"),
            (String = "text/css"),
            (String = "text/plain"),
        )),
        (status = 304, description = "The copy the browser holds (`If-None-Match`) is current"),
        (status = 404, description = "No such file", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn get_asset(ApiPath(file): ApiPath<String>, headers: HeaderMap) -> ApiResult<Response> {
    let (index, asset) = ASSETS
        .iter()
        .enumerate()
        .find(|(_, asset)| asset.name == file)
        .ok_or_else(|| ApiError::NotFound(format!("the dashboard has no file `{file}`")))?;
    let etag = ETAGS[index].clone();
    let cache = if asset.immutable {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let current = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|held| held.as_bytes() == etag.as_bytes());
    let common = [
        (header::ETAG, etag),
        (header::CACHE_CONTROL, HeaderValue::from_static(cache)),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
    ];
    if current {
        return Ok((StatusCode::NOT_MODIFIED, common).into_response());
    }
    Ok((
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        )],
        asset.body,
    )
        .into_response())
}
