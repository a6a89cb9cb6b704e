//! Extractors whose rejections are the API's own problem documents, so even a malformed body
//! or query answers in the same format as every other error.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{HeaderMap, header};
use serde::de::DeserializeOwned;

use crate::domain::validation::escape_pointer_token;
use crate::domain::what_if::WhatIf;
use crate::http::error::{ApiError, FieldError};

/// The largest JSON body any endpoint accepts (the job-record limit).
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// A JSON body, parsed with the path of the first error turned into a JSON Pointer.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json_content_type(req.headers())?;
        let body = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        parse_json(&body).map(ApiJson)
    }
}

/// The media type of a request's `Content-Type`, lower-cased and without parameters
/// (`text/csv; charset=utf-8` → `text/csv`); empty when there is none.
pub fn content_type_essence(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

pub fn require_json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or("");
    let essence = content_type_essence(headers);
    if essence == "application/json" || essence.ends_with("+json") {
        Ok(())
    } else if content_type.is_empty() {
        Err(ApiError::UnsupportedMediaType(
            "send the body with Content-Type: application/json".to_owned(),
        ))
    } else {
        Err(ApiError::UnsupportedMediaType(format!(
            "Content-Type `{content_type}` is not accepted here; send application/json"
        )))
    }
}

pub fn body_rejection(rejection: BytesRejection) -> ApiError {
    if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::PayloadTooLarge(format!(
            "the body is larger than the limit of {} bytes ({} MiB)",
            MAX_BODY_BYTES,
            MAX_BODY_BYTES / 1024 / 1024
        ))
    } else {
        ApiError::BadRequest(format!("the body could not be read: {rejection}"))
    }
}

/// Parses JSON, mapping syntax errors to 400 and shape errors to 422 with a pointer.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, T>(deserializer) {
        Ok(value) => Ok(value),
        Err(error) => {
            let pointer = json_pointer(error.path());
            let inner = error.into_inner();
            Err(classify_json_error(pointer, &inner))
        }
    }
}

/// Turns a serde_json error at `pointer` into the API error it stands for.
pub fn classify_json_error(pointer: String, error: &serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match error.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::BadRequest(format!(
            "the body is not valid JSON: {}",
            strip_position(&error.to_string())
        )),
        Category::Data => {
            let message = strip_position(&error.to_string());
            ApiError::Validation(vec![FieldError::new(pointer, message)])
        }
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
}

pub fn json_pointer(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            Segment::Map { key } => {
                pointer.push('/');
                pointer.push_str(&escape_pointer_token(key));
            }
            Segment::Enum { variant } => {
                pointer.push('/');
                pointer.push_str(&escape_pointer_token(variant));
            }
            Segment::Unknown => {}
        }
    }
    pointer
}

/// Whether an answer is asked for as CSV: `?format=csv` or `json` decides, else an `Accept`
/// naming `text/csv`. A bad `format` gives the message for `query:format`.
pub fn wants_csv(format: Option<&str>, headers: &HeaderMap) -> Result<bool, String> {
    match format {
        Some("csv") => Ok(true),
        Some("json") => Ok(false),
        Some(other) => Err(format!("`{other}` is not a format: use json or csv")),
        None => Ok(headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|accept| accept.contains("text/csv"))),
    }
}

/// Query parameters; a bad one is a 422 naming it.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        parse_query(parts.uri.query().unwrap_or("")).map(ApiQuery)
    }
}

/// Parses a query string into `T`, naming a bad parameter as `query:<name>`.
fn parse_query<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    // PostgreSQL cannot store a NUL character, so no stored value can match one.
    if let Some((name, _)) = form_urlencoded::parse(query.as_bytes())
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
    {
        return Err(ApiError::invalid(
            format!("query:{}", name.replace('\0', "")),
            "must not contain a NUL character",
        ));
    }
    let deserializer =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
    serde_path_to_error::deserialize(deserializer).map_err(|error| {
        let name = error.path().to_string();
        ApiError::invalid(format!("query:{name}"), error.into_inner().to_string())
    })
}

/// Query parameters with repeatable `what_if` prices (`what_if=<contract id>:<price>` or
/// `what_if=<gpu_model>/<billing_mode>:<price>`): those are parsed into a [`WhatIf`], every
/// other parameter into `T` as [`ApiQuery`] parses it. `T` lists `what_if` for the API
/// reference only.
pub struct ApiQueryWhatIf<T>(pub T, pub WhatIf);

impl<S, T> FromRequestParts<S> for ApiQueryWhatIf<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
        let (what_if, rest) = split_what_if(parts.uri.query().unwrap_or(""))?;
        Ok(ApiQueryWhatIf(parse_query(&rest)?, what_if))
    }
}

/// The `what_if` prices of a query string, and the rest of it.
fn split_what_if(query: &str) -> Result<(WhatIf, String), ApiError> {
    let mut what_if = WhatIf::default();
    let mut errors = Vec::new();
    let mut others = form_urlencoded::Serializer::new(String::new());
    for (name, value) in form_urlencoded::parse(query.as_bytes()) {
        if name == "what_if" {
            if let Err(message) = what_if.add(&value) {
                errors.push(FieldError::new("query:what_if", message));
            }
        } else {
            others.append_pair(&name, &value);
        }
    }
    if !errors.is_empty() {
        return Err(ApiError::Validation(errors));
    }
    Ok((what_if, others.finish()))
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        ApiError::invalid("query", rejection.body_text())
    }
}

/// Path parameters; a malformed one is a 404 (no such resource), never a 500.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        // A NUL character names nothing PostgreSQL could have stored.
        if parts.uri.path().contains("%00") {
            return Err(ApiError::NotFound("no such resource".to_owned()));
        }
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| ApiPath(value))
            .map_err(path_rejection)
    }
}

fn path_rejection(rejection: PathRejection) -> ApiError {
    ApiError::NotFound(format!("no such resource: {}", rejection.body_text()))
}

/// A JSON body as a document, for bodies whose fields are validated one by one (every bad
/// field reported at once): syntax errors are 400, and a key an object repeats is refused
/// (422), since serde_json would keep only its last value.
pub struct ApiJsonValue(pub serde_json::Value);

impl<S> FromRequest<S> for ApiJsonValue
where
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        require_json_content_type(req.headers())?;
        let body = Bytes::from_request(req, state)
            .await
            .map_err(body_rejection)?;
        let value: serde_json::Value = parse_json(&body)?;
        if let Some(pointer) = crate::domain::validation::repeated_key(&body) {
            return Err(ApiError::invalid(
                pointer,
                "this key appears more than once",
            ));
        }
        Ok(ApiJsonValue(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        name: String,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        items: Vec<Inner>,
    }

    fn pointer_of(body: &str) -> (u16, Vec<String>) {
        match parse_json::<Outer>(body.as_bytes()) {
            Ok(_) => (200, vec![]),
            Err(error) => {
                let problem = error.to_problem();
                (
                    problem.status,
                    problem.errors.into_iter().map(|e| e.pointer).collect(),
                )
            }
        }
    }

    #[test]
    fn unknown_fields_are_named_by_pointer() {
        let (status, pointers) = pointer_of(r#"{"items":[{"name":"a"},{"name":"b","nmae":1}]}"#);
        assert_eq!(status, 422);
        assert_eq!(pointers, vec!["/items/1/nmae"]);
    }

    #[test]
    fn wrong_types_are_named_by_pointer() {
        let (status, pointers) = pointer_of(r#"{"items":[{"name":5}]}"#);
        assert_eq!(status, 422);
        assert_eq!(pointers, vec!["/items/0/name"]);
    }

    #[test]
    fn syntax_errors_are_400() {
        assert_eq!(pointer_of(r#"{"items":[{"name":"a"}"#).0, 400);
    }
}
