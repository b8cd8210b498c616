//! The error envelope every daemon answers with.

use std::borrow::Cow;

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// The error body every daemon returns: `{"error":"<code>","message":"<text>"}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `scope_exceeds_parent`.
    pub error: Cow<'static, str>,
    /// Human-readable explanation.
    pub message: String,
}

/// The answer every bearer-token route documents once, by naming this type in its
/// `responses(...)`: 401 with the envelope, for a token missing, forged, expired or revoked.
#[cfg(feature = "openapi")]
#[derive(utoipa::IntoResponses)]
#[response(status = 401, description = "No valid token")]
pub struct NoToken(#[allow(dead_code)] ErrorBody);

/// An error on its way to becoming an HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The status code.
    pub status: StatusCode,
    /// The envelope.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: code.into(),
                message: message.into(),
            },
        }
    }

    /// 400 `bad_request`-style error with a specific code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        super::NOT_FOUND.error(message)
    }

    /// 500 `internal`: the message is logged, the client gets a generic text.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "internal error");
        super::INTERNAL.error("internal error; see the daemon's log")
    }

    /// 503 `unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        super::UNAVAILABLE.error(message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.body.error,
            self.body.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}
