//! Every way a routd request fails, and its answer: one enum, mapped to the HTTP error
//! envelope in one place. The failures every daemon shares (the database, internal errors,
//! envelopes of the shared layers, too many streams, a refused group setting) are one
//! variant, mapped in `hako_shared::http`.

use axum::http::StatusCode;
use hako_mcp::ToolCode;
use hako_shared::http::{Code, Common};

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

hako_shared::error_codes! {
    /// The message id exists with another body: a new message needs a new id.
    pub const ID_CONFLICT = (409, "id_conflict");
    /// A webhook for the prefix exists: delete it first.
    pub const WEBHOOK_EXISTS = (409, "webhook_exists");
    /// The approval request was decided first: someone was first, or it timed out, or its
    /// turn ended.
    pub const ALREADY_DECIDED = (409, "already_decided");
    /// The tenant has made as many groups as it may (`ROUTD_MAX_TENANT_GROUPS`).
    pub const TOO_MANY_GROUPS = (429, "too_many_groups");
    /// runed did not do what the request needs of it; try again later (nothing was removed).
    pub const RUNED_UNAVAILABLE = (503, "runed_unavailable");
}

/// The turn tools' refusals over HTTP, as `Code`s whose status and wire name are the tool
/// code's (`hako_mcp::ToolCode`), with their meaning.
macro_rules! tool_codes {
    ($( #[doc = $doc:literal] $name:ident = $code:ident; )*) => {$(
        #[doc = $doc]
        pub const $name: Code = Code {
            status: ToolCode::$code.http_status(),
            code: ToolCode::$code.as_str(),
            doc: $doc,
        };
    )*};
}

tool_codes! {
    /// The tool's arguments are not acceptable; the message names what to fix.
    INVALID_ARGUMENTS = InvalidArguments;
    /// The group's grants do not allow the call.
    NOT_GRANTED = NotGranted;
    /// The turn is over: its tools answer no more.
    TURN_ENDED = TurnEnded;
    /// The call conflicts with what exists (the message says what).
    CONFLICT = Conflict;
}

/// How a failure answers: with one of routd's codes, with a code it passes on (runed's
/// answer, a tool's refusal), or as the shared failures do.
enum Answer<'a> {
    Own(&'static Code),
    Passed { status: u16, code: &'a str },
    Common(&'a Common),
}

impl ApiFailure {
    fn answer(&self) -> Answer<'_> {
        use hako_shared::http as h;
        Answer::Own(match self {
            ApiFailure::Invalid(_) => &h::INVALID_REQUEST,
            ApiFailure::IdConflict(_) => &ID_CONFLICT,
            ApiFailure::WebhookExists(_) => &WEBHOOK_EXISTS,
            ApiFailure::AlreadyDecided(_) => &ALREADY_DECIDED,
            ApiFailure::NotFound(_) => &h::NOT_FOUND,
            ApiFailure::FolderForbidden(_) => &h::FOLDER_FORBIDDEN,
            ApiFailure::TooManyGroups(_) => &TOO_MANY_GROUPS,
            ApiFailure::RunedUnavailable(_) => &RUNED_UNAVAILABLE,
            ApiFailure::RunedRefused { status, code, .. } => {
                return Answer::Passed {
                    status: *status,
                    code,
                };
            }
            ApiFailure::Tool(t) => {
                return Answer::Passed {
                    status: t.code.http_status(),
                    code: t.code.as_str(),
                };
            }
            ApiFailure::Common(c) => return Answer::Common(c),
        })
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self.answer() {
            Answer::Own(c) => c.status(),
            Answer::Passed { status, .. } => {
                StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY)
            }
            Answer::Common(c) => c.status(),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self.answer() {
            Answer::Own(c) => c.code,
            Answer::Passed { code, .. } => code,
            Answer::Common(c) => c.code(),
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
