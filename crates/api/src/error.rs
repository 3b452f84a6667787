//! [`ApiFailure`]: an error as every control API answers it, a status and
//! `{"error": ..., "field": ..., "kind": ...}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use switch::control::{ControlError, ErrorKind};

/// An error as the API answers it: a status and `{"error": ..., "field": ...}`.
#[derive(Debug)]
pub struct ApiFailure {
    status: StatusCode,
    body: Value,
}

impl ApiFailure {
    pub fn new(status: StatusCode, error: impl Into<String>) -> ApiFailure {
        ApiFailure {
            status,
            body: json!({ "error": error.into() }),
        }
    }

    /// A refusal whose body says more than its `error` (what a partial update did).
    pub fn with_body(status: StatusCode, body: Value) -> ApiFailure {
        ApiFailure { status, body }
    }
}

/// The refusal as one line: its status and its `error`.
impl std::fmt::Display for ApiFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let error = self.body["error"].as_str().unwrap_or("refused");
        write!(f, "{}: {error}", self.status)
    }
}

impl From<ControlError> for ApiFailure {
    fn from(e: ControlError) -> ApiFailure {
        let status = match e.kind {
            ErrorKind::Invalid => StatusCode::BAD_REQUEST,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict | ErrorKind::Full => StatusCode::CONFLICT,
        };
        ApiFailure {
            status,
            body: json!({ "error": e.to_string(), "field": e.field, "kind": e.kind }),
        }
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// Parses a JSON body; an error names the field that is wrong.
pub fn body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiFailure> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        invalid(if field == "." { "" } else { &field }, e.inner())
    })?;
    // Nothing but whitespace may follow the document.
    de.end().map_err(|e| invalid("", &e))?;
    Ok(value)
}

/// A 400 naming `field` (empty: the body as a whole).
fn invalid(field: &str, error: &dyn std::fmt::Display) -> ApiFailure {
    let error = match field {
        "" => error.to_string(),
        f => format!("{f}: {error}"),
    };
    ApiFailure {
        status: StatusCode::BAD_REQUEST,
        body: json!({ "error": error, "field": field, "kind": ErrorKind::Invalid }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_is_one_json_document_and_nothing_after_it() {
        assert!(body::<Value>(b"{\"a\": 1}  \n").is_ok());
        for bad in [&b"{} x"[..], b"{}{}", b"", b"{"] {
            let e = body::<Value>(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad:?}");
            assert_eq!(e.body["kind"], "invalid", "{bad:?}");
        }
    }

    #[test]
    fn a_refusal_names_the_field_that_is_wrong() {
        #[derive(serde::Deserialize, Debug)]
        #[allow(dead_code)]
        struct T {
            n: u8,
        }
        let e = body::<T>(b"{\"n\": 300}").unwrap_err();
        assert_eq!(e.body["field"], "n");
        assert!(
            e.body["error"].as_str().unwrap().starts_with("n: "),
            "{}",
            e.body
        );
    }
}
