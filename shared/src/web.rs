//! routd's web sessions as its API serves them (`/v1/web-sessions`): the operator lists and
//! ends them (`hako web --list`, `hako token revoke`).

use serde::{Deserialize, Serialize};

/// A browser session (never its cookie or its CSRF token).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebSessionView {
    /// The id of the sign-in link's token: what ends the session.
    pub link_jti: String,
    /// Who it acts for.
    pub subject: String,
    /// The folder it is bound to; none: every folder.
    pub folder: Option<String>,
    /// Its scopes.
    pub scopes: Vec<String>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub expires_at: i64,
}

/// `GET /v1/web-sessions` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebSessionList {
    /// Live sessions, newest first.
    pub sessions: Vec<WebSessionView>,
}
