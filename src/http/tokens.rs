//! API tokens (admin only). The secret is shown once, in the creation response.

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use crate::app::AppState;
use crate::domain::access::{Principal, Role, generate_secret, hash_secret, normalize_scope};
use crate::domain::values::{self, ProjectId};
use crate::error::{ApiError, ApiResult, Problem, Violations};
use crate::http::auth::require_admin;
use crate::http::extract::{ApiJson, ApiPath, ApiQuery};
use crate::http::pagination::{Page, PageParams};
use crate::store;
use crate::store::tokens::TokenRow;

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(delete_token))
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
pub struct CreatedToken {
    pub id: Uuid,
    /// The secret, shown this once; only its hash is stored.
    pub token: String,
    pub role: Role,
    pub projects: Vec<String>,
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

impl TryFrom<TokenRow> for TokenView {
    type Error = ApiError;
    fn try_from(row: TokenRow) -> Result<Self, ApiError> {
        Ok(Self {
            id: row.id,
            role: Role::parse(&row.role)
                .ok_or_else(|| anyhow::anyhow!("token {} has unknown role {}", row.id, row.role))?,
            name: row.name,
            projects: row.projects,
            created_at: row.created_at,
        })
    }
}

/// A validated token request: the role and the scope that goes with it.
pub struct TokenRequest {
    pub role: Role,
    pub projects: Vec<String>,
    pub name: String,
}

impl TokenRequest {
    /// Checks shape only; that the projects exist is checked against the database.
    pub fn parse(role: Role, projects: &[String], name: &str) -> Result<Self, Violations> {
        let mut violations = Violations::default();
        let name = violations.check("/name", values::bounded_text(name, 200));
        let mut ids = Vec::new();
        for (index, raw) in projects.iter().enumerate() {
            if let Some(id) = violations.check(&format!("/projects/{index}"), ProjectId::parse(raw))
            {
                ids.push(id);
            }
        }
        if role.is_scoped() && projects.is_empty() {
            violations.push(
                "/projects",
                format!("a {} token needs at least one project", role.as_str()),
            );
        }
        if !role.is_scoped() && !projects.is_empty() {
            violations.push(
                "/projects",
                format!(
                    "a {} token acts on every project; leave projects out",
                    role.as_str()
                ),
            );
        }
        match (violations.is_empty(), name) {
            (true, Some(name)) => Ok(Self {
                role,
                projects: normalize_scope(&ids),
                name,
            }),
            _ => Err(violations),
        }
    }
}

/// Stores a new token and returns it with its secret.
pub async fn issue(pool: &store::Pool, request: TokenRequest) -> ApiResult<CreatedToken> {
    let existing = store::projects::existing_ids(pool, &request.projects).await?;
    let mut violations = Violations::default();
    for (index, project) in request.projects.iter().enumerate() {
        if !existing.contains(project) {
            violations.push(
                format!("/projects/{index}"),
                format!("project `{project}` does not exist"),
            );
        }
    }
    violations.into_result()?;
    let secret = generate_secret();
    let row = store::tokens::insert(
        pool,
        &request.name,
        request.role.as_str(),
        &request.projects,
        &hash_secret(&secret),
    )
    .await?;
    Ok(CreatedToken {
        id: row.id,
        token: secret,
        role: request.role,
        projects: row.projects,
        name: row.name,
    })
}

/// Create a token (admin).
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", request_body = CreateToken,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Created; the secret is in `token` and never shown again", body = CreatedToken),
        (status = 403, description = "Not an admin", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Invalid fields", body = Problem, content_type = "application/problem+json"),
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
    )
    .map_err(|v| ApiError::Validation(v.into_vec()))?;
    let created = issue(&state.pool, request).await?;
    Ok((StatusCode::CREATED, axum::Json(created)))
}

/// List active tokens (admin); secrets are never shown.
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", params(PageParams),
    security(("bearer" = [])),
    responses(
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
    let rows = store::tokens::list(&state.pool, after, limit + 1).await?;
    let page = Page::from_rows(rows, limit, |row| row.id, TokenView::try_from);
    Ok(axum::Json(Page {
        items: page.items.into_iter().collect::<Result<_, _>>()?,
        next_cursor: page.next_cursor,
    }))
}

/// Revoke a token (admin); it stops working on the next request.
#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens",
    params(("id" = Uuid, Path, description = "Token id")),
    security(("bearer" = [])),
    responses(
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
    if store::tokens::revoke(&state.pool, id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::NotFound(format!("no active token with id {id}")))
    }
}
