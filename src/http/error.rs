//! The one error type of the HTTP layer, rendered as `application/problem+json` (RFC 9457).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

pub use crate::domain::validation::{FieldError, Violations};
use crate::ledger::LedgerError;

/// A problem document as the API returns it.
#[derive(Debug, Serialize, ToSchema)]
pub struct Problem {
    #[serde(rename = "type")]
    pub problem_type: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<FieldError>,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("a valid bearer token is required")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    ForbiddenFields(String, Vec<FieldError>),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String, Vec<FieldError>),
    #[error("{0}")]
    MethodNotAllowed(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("the request is invalid")]
    Validation(Vec<FieldError>),
    /// The first of more invalid fields than a problem lists, and how many there were.
    #[error("the request is invalid")]
    ValidationOf(Vec<FieldError>, usize),
    #[error("the request took too long and was cancelled")]
    Timeout,
    #[error("the service is not ready: {0}")]
    Unavailable(String),
    /// A service this one depends on (the identity provider) could not be asked.
    #[error("{0}")]
    BadGateway(String),
    #[error(transparent)]
    Internal(anyhow::Error),
}

impl ApiError {
    pub fn invalid(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Validation(vec![FieldError::new(pointer, message)])
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) | Self::ForbiddenFields(..) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(..) => StatusCode::CONFLICT,
            Self::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::Validation(_) | Self::ValidationOf(..) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Timeout => StatusCode::REQUEST_TIMEOUT,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn slug(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "malformed-request",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) | Self::ForbiddenFields(..) => "forbidden",
            Self::NotFound(_) => "not-found",
            Self::Conflict(..) => "conflict",
            Self::MethodNotAllowed(_) => "method-not-allowed",
            Self::PayloadTooLarge(_) => "payload-too-large",
            Self::UnsupportedMediaType(_) => "unsupported-media-type",
            Self::Validation(_) | Self::ValidationOf(..) => "validation-error",
            Self::Timeout => "timeout",
            Self::Unavailable(_) => "unavailable",
            Self::BadGateway(_) => "bad-gateway",
            Self::Internal(_) => "internal-error",
        }
    }

    pub fn to_problem(&self) -> Problem {
        let status = self.status_code();
        let detail = match self {
            // A 500 is logged with its cause and never shown to the client.
            Self::Internal(_) => "an internal error occurred; it has been logged".to_owned(),
            Self::Validation(errors) if errors.len() == 1 => {
                format!("{}: {}", errors[0].pointer, errors[0].message)
            }
            Self::Validation(errors) => format!("{} fields are invalid", errors.len()),
            Self::ValidationOf(errors, total) => format!(
                "{total} fields are invalid; the first {} are listed",
                errors.len()
            ),
            other => other.to_string(),
        };
        let errors = match self {
            Self::Validation(errors)
            | Self::ValidationOf(errors, _)
            | Self::Conflict(_, errors)
            | Self::ForbiddenFields(_, errors) => errors.clone(),
            _ => Vec::new(),
        };
        Problem {
            problem_type: format!("/problems/{}", self.slug()),
            title: status.canonical_reason().unwrap_or("Error").to_owned(),
            status: status.as_u16(),
            detail,
            errors,
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(error: anyhow::Error) -> Self {
        LedgerError::from(error).into()
    }
}

impl From<sqlx::Error> for ApiError {
    fn from(error: sqlx::Error) -> Self {
        LedgerError::from(error).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(cause) = &self {
            tracing::error!(error = ?cause, "request failed");
        }
        let status = self.status_code();
        let mut response = problem_response(status, self.to_problem());
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        if status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// A problem document as an `application/problem+json` response.
fn problem_response(status: StatusCode, problem: Problem) -> Response {
    let mut response = (status, axum::Json(problem)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

/// What a 503 asks a client to wait before it tries again.
const RETRY_AFTER_SECONDS: u32 = 5;

/// Makes every error answer a problem document, including those that code outside the API
/// produces (a missing page of the API reference, say) with a body of its own.
pub async fn errors_as_problems(response: Response) -> Response {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/problem+json"));
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let title = status.canonical_reason().unwrap_or("Error").to_owned();
    let problem = Problem {
        problem_type: format!("/problems/http-{}", status.as_u16()),
        detail: title.to_lowercase(),
        title,
        status: status.as_u16(),
        errors: Vec::new(),
    };
    problem_response(status, problem)
}

impl From<Violations> for ApiError {
    fn from(violations: Violations) -> Self {
        Self::Validation(violations.into_vec())
    }
}

impl From<LedgerError> for ApiError {
    fn from(error: LedgerError) -> Self {
        match error {
            LedgerError::Invalid(errors) => Self::Validation(errors),
            LedgerError::NotFound(detail) => Self::NotFound(detail),
            LedgerError::Conflict(detail, errors) => Self::Conflict(detail, errors),
            LedgerError::Unavailable(cause) => Self::Unavailable(cause),
            LedgerError::Internal(cause) => Self::Internal(cause),
        }
    }
}
