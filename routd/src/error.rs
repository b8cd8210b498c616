//! Every way a routd request fails, and its answer: one enum, mapped to the HTTP error
//! envelope in one place. Errors of the shared layers (the token check, JSON and query
//! parsing) arrive as envelopes already and pass through unchanged.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use hako_shared::db::DbError;
use hako_shared::http::ApiError;
use hako_shared::runs::GroupSpecError;
use hako_shared::watchers::Full;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// A field that is not acceptable; the message names it.
    #[error("{0}")]
    Invalid(String),
    /// A group setting no caller may use.
    #[error("group.{0}")]
    InvalidGroup(#[from] GroupSpecError),
    /// A message id reused with another body.
    #[error("message {0} exists with another body; a new message needs a new id")]
    IdConflict(String),
    /// A webhook for the prefix exists.
    #[error("a webhook for {0:?} exists; delete it first")]
    WebhookExists(String),
    /// Not found (or not the caller's: the same answer, on purpose).
    #[error("{0}")]
    NotFound(String),
    /// The caller's folder does not cover what it asked for.
    #[error("{0}")]
    FolderForbidden(String),
    /// An approval request was decided before this verdict.
    #[error("{0}")]
    AlreadyDecided(String),
    /// Too many streams.
    #[error(transparent)]
    TooManyStreams(#[from] Full),
    /// A tenant has made as many groups as it may.
    #[error("{0}")]
    TooManyGroups(String),
    /// The database failed (503 when it does not answer, else 500).
    #[error(transparent)]
    Db(#[from] DbError),
    /// Anything else inside routd (logged; the client gets a generic text).
    #[error("{0}")]
    Internal(String),
    /// An envelope from a shared layer (token check, JSON body, query string).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A turn's tool refused or failed (over HTTP); its code is the tool error's.
    #[error("{}", .0.message)]
    Tool(#[from] hako_mcp::ToolError),
}

impl ApiFailure {
    /// An internal failure, from anything that displays.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        ApiFailure::Internal(e.to_string())
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiFailure::Invalid(_) | ApiFailure::InvalidGroup(_) => StatusCode::BAD_REQUEST,
            ApiFailure::IdConflict(_)
            | ApiFailure::WebhookExists(_)
            | ApiFailure::AlreadyDecided(_) => StatusCode::CONFLICT,
            ApiFailure::NotFound(_) => StatusCode::NOT_FOUND,
            ApiFailure::FolderForbidden(_) => StatusCode::FORBIDDEN,
            ApiFailure::TooManyStreams(_) | ApiFailure::TooManyGroups(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiFailure::Db(DbError::Closed | DbError::Timeout(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiFailure::Db(_) | ApiFailure::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiFailure::Api(e) => e.status,
            ApiFailure::Tool(t) => StatusCode::from_u16(t.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            ApiFailure::Invalid(_) => "invalid_request",
            ApiFailure::InvalidGroup(_) => "invalid_group",
            ApiFailure::IdConflict(_) => "id_conflict",
            ApiFailure::WebhookExists(_) => "webhook_exists",
            ApiFailure::AlreadyDecided(_) => "already_decided",
            ApiFailure::NotFound(_) => "not_found",
            ApiFailure::FolderForbidden(_) => "folder_forbidden",
            ApiFailure::TooManyStreams(_) => "too_many_streams",
            ApiFailure::TooManyGroups(_) => "too_many_groups",
            ApiFailure::Db(DbError::Closed | DbError::Timeout(_)) => "unavailable",
            ApiFailure::Db(_) | ApiFailure::Internal(_) => "internal",
            ApiFailure::Api(e) => &e.body.error,
            ApiFailure::Tool(t) => t.code.as_str(),
        }
    }
}

impl From<ApiFailure> for ApiError {
    fn from(f: ApiFailure) -> Self {
        match f {
            ApiFailure::Api(e) => e,
            ApiFailure::Db(e) => ApiError::from(e),
            ApiFailure::Internal(e) => ApiError::internal(e),
            f => ApiError::new(f.status(), f.code().to_owned(), f.to_string()),
        }
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mapping_for_every_failure() {
        for (f, status, code) in [
            (
                ApiFailure::Invalid("content: too long".into()),
                400,
                "invalid_request",
            ),
            (ApiFailure::IdConflict("m1".into()), 409, "id_conflict"),
            (ApiFailure::NotFound("no chat x".into()), 404, "not_found"),
            (
                ApiFailure::FolderForbidden("x".into()),
                403,
                "folder_forbidden",
            ),
            (
                ApiFailure::TooManyStreams(Full::Caller(2)),
                429,
                "too_many_streams",
            ),
            (ApiFailure::Db(DbError::Closed), 503, "unavailable"),
            (ApiFailure::internal("secret detail"), 500, "internal"),
            (
                ApiFailure::Tool(hako_mcp::ToolError::turn_ended("t-1")),
                409,
                "turn_ended",
            ),
            (
                ApiFailure::Tool(hako_mcp::ToolError::invalid("text is empty")),
                400,
                "invalid_arguments",
            ),
        ] {
            let e = ApiError::from(f);
            assert_eq!((e.status.as_u16(), e.body.error.as_ref()), (status, code));
            assert!(!e.body.message.contains("secret detail"));
        }
    }
}
