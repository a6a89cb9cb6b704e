//! Validation errors: every bad field of a request, each named by a JSON Pointer, so that a
//! client learns of all of them at once.

use serde::Serialize;
use utoipa::ToSchema;

/// One invalid field: a JSON Pointer into the request body (or query) and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct FieldError {
    pub pointer: String,
    pub message: String,
}

impl FieldError {
    pub fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            pointer: pointer.into(),
            message: message.into(),
        }
    }
}

/// Collects field errors while a request is parsed, so every bad field is reported at once.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldError>);

impl Violations {
    pub fn push(&mut self, pointer: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError::new(pointer, message));
    }

    /// Keeps the value when it parsed, records the error otherwise.
    pub fn check<T>(&mut self, pointer: &str, parsed: Result<T, String>) -> Option<T> {
        match parsed {
            Ok(value) => Some(value),
            Err(message) => {
                self.push(pointer, message);
                None
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn extend(&mut self, other: Violations) {
        self.0.extend(other.0);
    }

    /// `Ok` when nothing was reported.
    pub fn into_result(self) -> Result<(), Violations> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }

    pub fn into_vec(self) -> Vec<FieldError> {
        self.0
    }
}

/// Escapes one reference token of a JSON Pointer (RFC 6901).
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
