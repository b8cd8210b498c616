//! Every way a routd request fails, and its answer: one enum, mapped to the HTTP error
//! envelope in one place. The failures every daemon shares (the database, internal errors,
//! envelopes of the shared layers, too many streams, a refused group setting) are one
//! variant, mapped in `hako_shared::http`.

use axum::http::StatusCode;
use hako_shared::http::Common;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// A field that is not acceptable; the message names it.
    #[error("{0}")]
    Invalid(String),
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
    /// A tenant has made as many groups as it may.
    #[error("{0}")]
    TooManyGroups(String),
    /// runed did not do what the request needs of it (retiring a deleted group's folder).
    #[error("{0}")]
    RunedUnavailable(String),
    /// runed refused what the request asked of it (a media file): its answer, passed on.
    #[error("{message}")]
    RunedRefused {
        /// runed's status (4xx).
        status: u16,
        /// runed's code.
        code: String,
        /// runed's message.
        message: String,
    },
    /// What every daemon's request shares.
    #[error(transparent)]
    Common(Common),
    /// A turn's tool refused or failed (over HTTP); its code is the tool error's.
    #[error("{}", .0.message)]
    Tool(#[from] hako_mcp::ToolError),
}

hako_shared::daemon_failure!(ApiFailure);

impl ApiFailure {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiFailure::Invalid(_) => StatusCode::BAD_REQUEST,
            ApiFailure::IdConflict(_)
            | ApiFailure::WebhookExists(_)
            | ApiFailure::AlreadyDecided(_) => StatusCode::CONFLICT,
            ApiFailure::NotFound(_) => StatusCode::NOT_FOUND,
            ApiFailure::FolderForbidden(_) => StatusCode::FORBIDDEN,
            ApiFailure::TooManyGroups(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiFailure::RunedUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiFailure::RunedRefused { status, .. } => {
                StatusCode::from_u16(*status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            ApiFailure::Common(c) => c.status(),
            ApiFailure::Tool(t) => StatusCode::from_u16(t.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            ApiFailure::Invalid(_) => "invalid_request",
            ApiFailure::IdConflict(_) => "id_conflict",
            ApiFailure::WebhookExists(_) => "webhook_exists",
            ApiFailure::AlreadyDecided(_) => "already_decided",
            ApiFailure::NotFound(_) => "not_found",
            ApiFailure::FolderForbidden(_) => "folder_forbidden",
            ApiFailure::TooManyGroups(_) => "too_many_groups",
            ApiFailure::RunedUnavailable(_) => "runed_unavailable",
            ApiFailure::RunedRefused { code, .. } => code,
            ApiFailure::Common(c) => c.code(),
            ApiFailure::Tool(t) => t.code.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::db::DbError;
    use hako_shared::http::ApiError;
    use hako_shared::watchers::Full;

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
            (Full::Caller(2).into(), 429, "too_many_streams"),
            (DbError::Closed.into(), 503, "unavailable"),
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
