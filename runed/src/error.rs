//! Every way a runed request fails, and its answer: one enum, mapped to the HTTP error
//! envelope in one place ([`ApiFailure::status`], [`ApiFailure::code`]). The failures every
//! daemon shares (the database, internal errors, envelopes of the shared layers, too many
//! streams, a refused group setting) are one variant, mapped in `hako_shared::http`.

use axum::http::StatusCode;
use hako_shared::http::{Code, Common};

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

hako_shared::error_codes! {
    /// `?wait=` is not a duration (`30s`, `2m`; at most the long-poll bound).
    pub const INVALID_WAIT = (400, "invalid_wait");
    /// Secrets too large to wait in memory (they never touch the disk).
    pub const SECRETS_TOO_LARGE = (400, "secrets_too_large");
    /// Not a brokered secret's name (upper case, digits and `_`).
    pub const INVALID_SECRET_NAME = (400, "invalid_secret_name");
    /// Not a usable secret value (never echoed).
    pub const INVALID_SECRET_VALUE = (400, "invalid_secret_value");
    /// Too many runs and holds wait, overall or for the folder; the message names the bound
    /// (`RUNED_MAX_QUEUED` or `RUNED_MAX_QUEUED_PER_FOLDER`).
    pub const QUEUE_FULL = (429, "queue_full");
    /// The run is not running: nothing was placed.
    pub const NOT_LIVE = (409, "not_live");
    /// Docker does not answer (its socket is not there yet): what needs the runner cannot be
    /// done.
    pub const DOCKER_UNAVAILABLE = (503, "docker_unavailable");
}

impl ApiFailure {
    /// The code of one of runed's own failures, or the shared failure that maps itself.
    fn answer(&self) -> Result<&'static Code, &Common> {
        use hako_shared::http as h;
        Ok(match self {
            ApiFailure::NoRun(_) | ApiFailure::NoFolder(_) | ApiFailure::NoSecret(_) => {
                &h::NOT_FOUND
            }
            ApiFailure::InvalidSecretName(_) => &INVALID_SECRET_NAME,
            ApiFailure::InvalidSecretBody => &h::INVALID_JSON,
            ApiFailure::InvalidSecretValue(_) => &INVALID_SECRET_VALUE,
            ApiFailure::InvalidWait(_) => &INVALID_WAIT,
            ApiFailure::ForbiddenGroupSetting(_) => &h::FORBIDDEN_GROUP_SETTING,
            ApiFailure::SecretsTooLarge(_) => &SECRETS_TOO_LARGE,
            ApiFailure::DockerUnavailable(_) => &DOCKER_UNAVAILABLE,
            ApiFailure::QueueFull(_) => &QUEUE_FULL,
            ApiFailure::NotLive(_) => &NOT_LIVE,
            ApiFailure::EmptyMessages
            | ApiFailure::InvalidSteerId
            | ApiFailure::InvalidFolder(_) => &h::INVALID_REQUEST,
            ApiFailure::Media(MediaError::Name(_)) => &h::INVALID_MEDIA_NAME,
            ApiFailure::MediaTooLarge(_) => &h::BODY_TOO_LARGE,
            ApiFailure::Media(MediaError::Full { .. } | MediaError::TooManyEntries) => {
                &h::MEDIA_FULL
            }
            ApiFailure::Media(MediaError::Io(_)) => &h::INTERNAL,
            ApiFailure::AuditNeedsUnbound | ApiFailure::SecretsNeedUnbound => &h::FOLDER_FORBIDDEN,
            ApiFailure::Common(c) => return Err(c),
        })
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.answer().map_or_else(Common::status, Code::status)
    }

    /// The machine-readable code.
    pub fn code(&self) -> &str {
        match self.answer() {
            Ok(c) => c.code,
            Err(c) => c.code(),
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
