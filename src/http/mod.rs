//! The HTTP layer: one module per resource, each returning an `OpenApiRouter`, merged here so
//! that no route exists without its OpenAPI description. A handler parses the request,
//! authorises it, calls one use case of `ledger` and shapes the response; errors become
//! problem documents in `error`.

pub mod alerts;
pub mod audit;
pub mod auth;
pub mod bills;
pub mod capacity;
pub mod channels;
pub mod contracts;
pub mod cost;
pub mod dashboard;
pub mod efficiency;
pub mod error;
pub mod exports;
pub mod extract;
pub mod fx_rates;
pub mod gpu_models;
pub mod grid_intensity;
pub mod health;
pub mod observe;
pub mod pagination;
pub mod planning;
pub mod prices;
pub mod problems;
pub mod projects;
pub mod records;
pub mod reports;
pub mod rightsizing;
pub mod routes;
pub mod signin;
pub mod state;
pub mod tasks;
pub mod tokens;

use std::time::Duration;

use axum::Router;
use axum::error_handling::HandleErrorLayer;
use axum::extract::DefaultBodyLimit;
use tower::ServiceBuilder;
use tower_http::trace::TraceLayer;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::http::error::ApiError;
use crate::http::state::AppState;

/// How long one request may take before it is answered with 408.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(OpenApi)]
#[openapi(
    info(
        title = "taskledger",
        description = "What each finished GPU task really cost: job records joined with the pricing contracts they ran under.",
        license(name = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "projects", description = "Projects and monthly budgets"),
        (name = "contracts", description = "Pricing contracts and FX rates; every change re-rates what it touches"),
        (name = "cost", description = "What a project's GPU time cost"),
        (name = "capacity", description = "Pools of nodes, the intervals they are paid for, idle and down time, zombie nodes"),
        (name = "tasks", description = "The per-task ledger: what each task cost, attempt by attempt"),
        (name = "efficiency", description = "Model FLOPs utilisation, why cost per unit moved, efficiency-regression alerts"),
        (name = "tokens", description = "API tokens and roles"),
        (name = "job-records", description = "What CI posts: one record per attempt of a GPU task"),
        (name = "alerts", description = "Budget burn and the alerts it fires"),
        (name = "channels", description = "Where alerts and month closes are sent: Slack, Microsoft Teams, email, PagerDuty, signed webhooks"),
        (name = "routes", description = "Budgets and retry caps on a label value of a project's records (a route), and their burn"),
        (name = "reports", description = "Monthly reports and month close, for finance"),
        (name = "audit", description = "Every change made through the service, who made it, before and after, in a hash chain an auditor can check"),
        (name = "sign-in", description = "People sign in through the organisation's OpenID Connect provider; the session cookie then stands for a bearer token, and its writes carry `X-CSRF-Token`"),
        (name = "operations", description = "Health, readiness and metrics"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(health::router())
        .merge(dashboard::router())
        .merge(projects::router())
        .merge(contracts::router())
        .merge(capacity::router())
        .merge(bills::router())
        .merge(fx_rates::router())
        .merge(grid_intensity::router())
        .merge(cost::router())
        .merge(tasks::router())
        .merge(rightsizing::router())
        .merge(tokens::router())
        .merge(records::router())
        .merge(alerts::router())
        .merge(channels::router())
        .merge(routes::router())
        .merge(reports::router())
        .merge(planning::router())
        .merge(prices::router())
        .merge(gpu_models::router())
        .merge(efficiency::router())
        .merge(exports::router())
        .merge(audit::router())
        .merge(signin::router())
}

/// The OpenAPI document, as served at `/openapi.json` and committed in `api/openapi.json`.
pub fn openapi() -> utoipa::openapi::OpenApi {
    api().split_for_parts().1
}

/// The whole application router.
pub fn app(state: AppState) -> Router {
    let (router, spec) = api().split_for_parts();
    router
        .merge(SwaggerUi::new("/docs").url("/openapi.json", spec))
        .fallback(|| async { ApiError::NotFound("no such endpoint".to_owned()) })
        .method_not_allowed_fallback(|| async {
            ApiError::MethodNotAllowed("this endpoint does not take that method".to_owned())
        })
        .layer(
            ServiceBuilder::new()
                .layer(axum::middleware::from_fn(observe::record))
                .layer(TraceLayer::new_for_http())
                .layer(axum::middleware::map_response(error::errors_as_problems))
                .layer(HandleErrorLayer::new(|_: tower::BoxError| async {
                    ApiError::Timeout
                }))
                .layer(tower::timeout::TimeoutLayer::new(REQUEST_TIMEOUT))
                .layer(DefaultBodyLimit::max(extract::MAX_BODY_BYTES)),
        )
        .with_state(state)
}
