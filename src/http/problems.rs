//! The problem answers that come from the extractors, declared once each for the OpenAPI
//! document: an operation lists the sets of the extractors it takes (a `Principal`,
//! `ApiJson`, `ApiQuery`, `ApiPath`) and, as tuples after them, the answers of its own
//! (403, 409, a 404 or 422 with a more precise description). A later entry for the same
//! status replaces an earlier one.

use utoipa::IntoResponses;

use crate::http::error::Problem;

/// What the bearer-token extractor (`Principal`) can answer: it reads the token's row.
#[derive(IntoResponses)]
pub enum AuthProblems {
    #[response(
        status = 401,
        description = "No bearer token, or one that is unknown or revoked",
        content_type = "application/problem+json",
        headers(("WWW-Authenticate" = String, description = "`Bearer`"))
    )]
    Unauthorized(Problem),
    #[response(
        status = 503,
        description = "The database cannot be reached; try again after `Retry-After` seconds",
        content_type = "application/problem+json",
        headers(("Retry-After" = u32, description = "Seconds to wait"))
    )]
    Unavailable(Problem),
}

/// What a JSON request body (`ApiJson`) can answer.
#[derive(IntoResponses)]
pub enum JsonBodyProblems {
    #[response(
        status = 400,
        description = "The body is not valid JSON",
        content_type = "application/problem+json"
    )]
    Malformed(Problem),
    #[response(
        status = 413,
        description = "The body is larger than 16 MiB",
        content_type = "application/problem+json"
    )]
    TooLarge(Problem),
    #[response(
        status = 415,
        description = "The body is not sent as `application/json`",
        content_type = "application/problem+json"
    )]
    UnsupportedMediaType(Problem),
    #[response(
        status = 422,
        description = "Fields of the body are invalid, each named by a JSON Pointer in `errors`",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
}

/// What query parameters (`ApiQuery`) can answer.
#[derive(IntoResponses)]
pub enum QueryProblems {
    #[response(
        status = 422,
        description = "Invalid query parameters, named as `query:<name>`",
        content_type = "application/problem+json"
    )]
    Invalid(Problem),
}

/// What path parameters (`ApiPath`) can answer: one that cannot name anything (not of the
/// parameter's type, or holding a NUL character) is a resource that does not exist.
#[derive(IntoResponses)]
pub enum PathProblems {
    #[response(
        status = 404,
        description = "No such resource",
        content_type = "application/problem+json"
    )]
    NotFound(Problem),
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    /// Each operation of the document with the statuses it lists.
    fn operations() -> Vec<(String, Value, Vec<String>)> {
        let document = serde_json::to_value(crate::http::openapi()).unwrap();
        let mut operations = Vec::new();
        for (path, item) in document["paths"].as_object().unwrap() {
            for (method, operation) in item.as_object().unwrap() {
                let statuses = operation["responses"]
                    .as_object()
                    .unwrap()
                    .keys()
                    .cloned()
                    .collect();
                operations.push((format!("{method} {path}"), operation.clone(), statuses));
            }
        }
        operations
    }

    fn takes(operation: &Value, location: &str) -> bool {
        operation["parameters"]
            .as_array()
            .is_some_and(|parameters| parameters.iter().any(|p| p["in"] == location))
    }

    #[test]
    fn every_operation_lists_the_problems_of_what_it_takes() {
        for (name, operation, statuses) in operations() {
            let mut expected = Vec::new();
            if operation.get("security").is_some() {
                expected.extend(["401", "503"]);
            }
            if operation.get("requestBody").is_some() {
                expected.extend(["400", "413", "415", "422"]);
            }
            if takes(&operation, "path") {
                expected.push("404");
            }
            if takes(&operation, "query") {
                expected.push("422");
            }
            for status in expected {
                assert!(
                    statuses.iter().any(|s| s == status),
                    "{name} does not list {status}: {statuses:?}"
                );
            }
        }
    }

    #[test]
    fn every_error_answer_is_a_problem_document() {
        for (name, operation, statuses) in operations() {
            for status in statuses.iter().filter(|s| s.as_str() >= "400") {
                let schema = &operation["responses"][status]["content"]["application/problem+json"]
                    ["schema"]["$ref"];
                assert_eq!(
                    schema, "#/components/schemas/Problem",
                    "{name} answers {status} without the problem schema"
                );
            }
        }
    }
}
