//! Every way a runed request fails, and its answer: one enum, mapped to the HTTP error
//! envelope in one place ([`ApiFailure::status`], [`ApiFailure::code`]). The failures every
//! daemon shares (the database, internal errors, envelopes of the shared layers, too many
//! streams, a refused group setting) are one variant, mapped in `hako_shared::http`.

use axum::http::StatusCode;
use hako_shared::http::Common;

use hako_runner::media::MediaError;

use crate::state::{MAX_SECRETS_BYTES, QueueFull};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiFailure {
    /// The run does not exist, or the caller may not see it (the same answer, on purpose).
    #[error("no run {0}")]
    NoRun(String),
    /// The folder does not exist for the caller.
    #[error("no folder {0}")]
    NoFolder(String),
    /// `?wait=` that is not a duration.
    #[error("wait: {0}")]
    InvalidWait(String),
    /// Group settings beyond a folder-bound caller's authority.
    #[error(
        "a folder-bound caller can only tighten the install's limits and cannot set {}; only an unbound service token can",
        .0.join(", ")
    )]
    ForbiddenGroupSetting(Vec<&'static str>),
    /// Secrets too large to wait in memory.
    #[error(
        "secrets hold {0} bytes; at most {MAX_SECRETS_BYTES} (they wait in memory, never on disk)"
    )]
    SecretsTooLarge(usize),
    /// The queue is full.
    #[error(transparent)]
    QueueFull(#[from] QueueFull),
    /// A steer for a run that is not running.
    #[error("run {0} is not running")]
    NotLive(String),
    /// A steer without messages.
    #[error("messages is empty")]
    EmptyMessages,
    /// A steer id outside the id grammar.
    #[error("steer_id must be 1-128 of [A-Za-z0-9._:-]")]
    InvalidSteerId,
    /// Docker's socket is not there (yet): what needs the runner cannot be done.
    #[error("Docker is unavailable: {0}")]
    DockerUnavailable(String),
    /// The audit log is for unbound callers.
    #[error("the audit log spans every folder; a folder-bound token cannot read it")]
    AuditNeedsUnbound,
    /// Brokered secrets are the install's, for unbound callers (the operator) only.
    #[error("brokered secrets are the install's; a folder-bound token cannot see or set them")]
    SecretsNeedUnbound,
    /// Not a secret's name.
    #[error("{0}")]
    InvalidSecretName(String),
    /// A body that is not `{"value": "…"}` (never echoed: it may hold the value).
    #[error("the body must be a JSON object {{\"value\": \"…\"}} and nothing else")]
    InvalidSecretBody,
    /// Not a usable value (never echoed).
    #[error("{0}")]
    InvalidSecretValue(#[from] hako_shared::secrets::ValueError),
    /// No such secret.
    #[error("no secret {0}")]
    NoSecret(String),
    /// Not a folder's name.
    #[error("folder: {0}")]
    InvalidFolder(String),
    /// A media file larger than `RUNED_MEDIA_MAX`.
    #[error("the file is larger than {0} bytes (RUNED_MEDIA_MAX)")]
    MediaTooLarge(usize),
    /// A media file not saved.
    #[error(transparent)]
    Media(#[from] hako_runner::media::MediaError),
    /// What every daemon's request shares.
    #[error(transparent)]
    Common(Common),
}

hako_shared::daemon_failure!(ApiFailure);

impl ApiFailure {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiFailure::NoRun(_) | ApiFailure::NoFolder(_) | ApiFailure::NoSecret(_) => {
                StatusCode::NOT_FOUND
            }
            ApiFailure::InvalidSecretName(_)
            | ApiFailure::InvalidSecretBody
            | ApiFailure::InvalidSecretValue(_)
            | ApiFailure::InvalidWait(_)
            | ApiFailure::SecretsTooLarge(_)
            | ApiFailure::EmptyMessages
            | ApiFailure::InvalidSteerId
            | ApiFailure::InvalidFolder(_)
            | ApiFailure::Media(MediaError::Name(_)) => StatusCode::BAD_REQUEST,
            ApiFailure::MediaTooLarge(_)
            | ApiFailure::Media(MediaError::Full { .. } | MediaError::TooManyEntries) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            ApiFailure::Media(MediaError::Io(_)) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiFailure::ForbiddenGroupSetting(_)
            | ApiFailure::AuditNeedsUnbound
            | ApiFailure::SecretsNeedUnbound => StatusCode::FORBIDDEN,
            ApiFailure::QueueFull(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiFailure::NotLive(_) => StatusCode::CONFLICT,
            ApiFailure::DockerUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiFailure::Common(c) => c.status(),
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self {
            ApiFailure::NoRun(_) | ApiFailure::NoFolder(_) | ApiFailure::NoSecret(_) => "not_found",
            ApiFailure::InvalidSecretName(_) => "invalid_secret_name",
            ApiFailure::InvalidSecretBody => "invalid_json",
            ApiFailure::InvalidSecretValue(_) => "invalid_secret_value",
            ApiFailure::InvalidWait(_) => "invalid_wait",
            ApiFailure::ForbiddenGroupSetting(_) => "forbidden_group_setting",
            ApiFailure::SecretsTooLarge(_) => "secrets_too_large",
            ApiFailure::DockerUnavailable(_) => "docker_unavailable",
            ApiFailure::QueueFull(_) => "queue_full",
            ApiFailure::NotLive(_) => "not_live",
            ApiFailure::EmptyMessages
            | ApiFailure::InvalidSteerId
            | ApiFailure::InvalidFolder(_) => "invalid_request",
            ApiFailure::Media(MediaError::Name(_)) => "invalid_media_name",
            ApiFailure::MediaTooLarge(_) => "body_too_large",
            ApiFailure::Media(MediaError::Full { .. } | MediaError::TooManyEntries) => "media_full",
            ApiFailure::Media(MediaError::Io(_)) => "internal",
            ApiFailure::AuditNeedsUnbound | ApiFailure::SecretsNeedUnbound => "folder_forbidden",
            ApiFailure::Common(c) => c.code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::db::DbError;
    use hako_shared::http::ApiError;

    #[test]
    fn one_mapping_for_every_failure() {
        let cases: Vec<(ApiFailure, u16, &str)> = vec![
            (ApiFailure::NoRun("r".into()), 404, "not_found"),
            (ApiFailure::InvalidWait("soon".into()), 400, "invalid_wait"),
            (
                ApiFailure::ForbiddenGroupSetting(vec!["memory", "image"]),
                403,
                "forbidden_group_setting",
            ),
            (
                ApiFailure::QueueFull(QueueFull::Folder(50)),
                429,
                "queue_full",
            ),
            (ApiFailure::NotLive("r".into()), 409, "not_live"),
            (ApiFailure::NoSecret("GH_TOKEN".into()), 404, "not_found"),
            (ApiFailure::InvalidSecretBody, 400, "invalid_json"),
            (
                hako_shared::secrets::ValueError::NotPrintable(2).into(),
                400,
                "invalid_secret_value",
            ),
            (ApiFailure::SecretsNeedUnbound, 403, "folder_forbidden"),
            (DbError::Closed.into(), 503, "unavailable"),
            (ApiFailure::internal("boom"), 500, "internal"),
        ];
        for (f, status, code) in cases {
            let text = f.to_string();
            let e = ApiError::from(f);
            assert_eq!(
                (e.status.as_u16(), e.body.error.as_ref()),
                (status, code),
                "{text}"
            );
        }
        let e = ApiError::from(ApiFailure::ForbiddenGroupSetting(vec!["memory", "image"]));
        assert!(
            e.body.message.contains("memory, image"),
            "{}",
            e.body.message
        );
        let e = ApiError::from(ApiFailure::internal("secret detail"));
        assert!(
            !e.body.message.contains("secret detail"),
            "internals stay in the log"
        );
    }
}
