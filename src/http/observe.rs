//! Counts and times every HTTP request by route template (the path as routed, such as
//! `/v1/projects/{id}/cost`, never the raw path), method and status.

use std::time::Instant;

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;

use crate::ledger::instruments::{HTTP_REQUEST_DURATION, HTTP_REQUESTS};

/// The route label of a request no route matched.
const UNMATCHED: &str = "unmatched";

pub async fn record(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or(UNMATCHED, MatchedPath::as_str)
        .to_owned();
    let method = method_label(request.method());
    let started = Instant::now();
    let response = next.run(request).await;
    let labels = [
        ("route", route),
        ("method", method.to_owned()),
        ("status", response.status().as_str().to_owned()),
    ];
    metrics::counter!(HTTP_REQUESTS, &labels).increment(1);
    metrics::histogram!(HTTP_REQUEST_DURATION, &labels).record(started.elapsed());
    response
}

/// The method, or `other` for one outside HTTP's standard set, so that made-up methods
/// cannot add label values without bound.
fn method_label(method: &Method) -> &'static str {
    const STANDARD: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
        Method::CONNECT,
        Method::TRACE,
    ];
    STANDARD
        .iter()
        .find(|standard| *standard == method)
        .map_or("other", Method::as_str)
}
