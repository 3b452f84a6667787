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
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let field = e.path().to_string();
        let field = if field == "." { String::new() } else { field };
        ApiFailure {
            status: StatusCode::BAD_REQUEST,
            body: json!({
                "error": format!("{}{}", if field.is_empty() { String::new() } else { format!("{field}: ") }, e.inner()),
                "field": field,
                "kind": ErrorKind::Invalid,
            }),
        }
    })
}
