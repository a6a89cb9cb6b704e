//! API tokens (admin only, but for the caller's own): the secret is shown once, in the
//! creation response.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::domain::access::{Actor, Principal, Role};
use crate::http::auth::require_admin;
use crate::http::error::{ApiError, ApiResult, Problem};
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::http::problems::{AuthProblems, JsonBodyProblems, PathProblems, QueryProblems};
use crate::http::state::AppState;
use crate::ledger::tokens::{self, CreatedToken, TokenRequest, TokenRow};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
        .routes(routes!(get_current_token))
}

/// The token a request was made with, as a client needs it to know what it may do.
#[derive(Debug, Serialize, ToSchema)]
pub struct CurrentToken {
    /// The token's id; absent for a person signed in through the identity provider.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<Uuid>,
    /// Who is calling: the token, or the signed-in person.
    pub actor: Actor,
    pub role: Role,
    /// The projects a `reader` or `ingest` token acts on; empty for the others, which act on
    /// every project.
    pub projects: Vec<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub role: Role,
    /// Projects a `reader` or `ingest` token acts on (required for them, refused for others).
    pub projects: Option<Vec<String>>,
    /// What the token is for, e.g. `ci-vision-nightly`.
    pub name: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenView {
    pub id: Uuid,
    pub name: String,
    pub role: Role,
    pub projects: Vec<String>,
    pub created_at: DateTime<Utc>,
}

impl From<TokenRow> for TokenView {
    fn from(row: TokenRow) -> Self {
        Self {
            id: row.id,
            role: row.role,
            name: row.name,
            projects: row.projects,
            created_at: row.created_at,
        }
    }
}

/// Create a token (admin).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateToken,
    security(("bearer" = [])),
    responses(
        AuthProblems, JsonBodyProblems,
        (status = 201, description = "Created; the secret is in `token` and never shown again", body = CreatedToken),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn create_token(
    State(state): State<AppState>,
    principal: Principal,
    ApiJson(body): ApiJson<CreateToken>,
) -> ApiResult<(StatusCode, axum::Json<CreatedToken>)> {
    require_admin(&principal)?;
    let request = TokenRequest::parse(
        body.role,
        body.projects.as_deref().unwrap_or_default(),
        &body.name,
    )?;
    let created = tokens::issue(&state.pool, request, &principal.actor).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// List active tokens (admin); secrets are never shown.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", params(PageParams),
    security(("bearer" = [])),
    responses(
        AuthProblems, QueryProblems,
        (status = 200, description = "A page of tokens", body = Page<TokenView>),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn list_tokens(
    State(state): State<AppState>,
    principal: Principal,
    ApiQuery(page): ApiQuery<PageParams>,
) -> ApiResult<axum::Json<Page<TokenView>>> {
    require_admin(&principal)?;
    let limit = page.limit()?;
    let after: Option<Uuid> = page.cursor()?;
    let rows = tokens::list(&state.pool, after, limit + 1).await?;
    Ok(axum::Json(Page::from_rows(
        rows,
        limit,
        |row| row.id,
        TokenView::from,
    )))
}

/// The token making this request: its role and projects (any active token, ingest included),
/// so that a client such as the dashboard shows what the token may do and no more.
#[utoipa::path(get, path = "/v1/tokens/current", tag = "tokens",
    security(("bearer" = [])),
    responses(
        AuthProblems,
        (status = 200, description = "The calling token", body = CurrentToken),
    ))]
pub async fn get_current_token(principal: Principal) -> axum::Json<CurrentToken> {
    axum::Json(CurrentToken {
        id: principal.actor.token_id(),
        actor: principal.actor,
        role: principal.role,
        projects: principal.projects,
    })
}

/// Revoke a token (admin); it stops working on the next request.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = Uuid, Path, description = "Token id")),
    security(("bearer" = [])),
    responses(
        AuthProblems, PathProblems,
        (status = 204, description = "Revoked"),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 404, description = "No such active token", body = Problem, content_type = "application/problem+json"),
    ))]
pub async fn delete_token(
    State(state): State<AppState>,
    principal: Principal,
    ApiPath(id): ApiPath<Uuid>,
) -> ApiResult<StatusCode> {
    require_admin(&principal)?;
    if tokens::revoke(&state.pool, id, &principal.actor).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("no active token with id {id}")))
    }
}
