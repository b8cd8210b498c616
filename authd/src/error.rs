//! authd's refusals that are not a downscoping rule ([`crate::mint::MintError`]) or a store
//! failure ([`crate::store::StoreError`]): one enum, mapped to the HTTP error envelope here.

use axum::http::StatusCode;
use hako_shared::http::ApiError;

/// Why authd refused a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// Unknown daemon or wrong service key (one answer for both, on purpose).
    #[error("unknown daemon or wrong service key")]
    InvalidServiceKey,
    /// A jti that cannot be one.
    #[error("{0}")]
    InvalidJti(&'static str),
    /// No such token (or it expired and was pruned).
    #[error("no such token, or it has expired")]
    NoSuchToken,
    /// The caller may not revoke that token.
    #[error("only the token's issuer or a holder of tokens:revoke may revoke it")]
    NotTokenIssuer,
    /// A query parameter out of range.
    #[error("{0}")]
    InvalidQuery(&'static str),
}

impl Refusal {
    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::InvalidServiceKey => StatusCode::UNAUTHORIZED,
            Refusal::InvalidJti(_) | Refusal::InvalidQuery(_) => StatusCode::BAD_REQUEST,
            Refusal::NoSuchToken => StatusCode::NOT_FOUND,
            Refusal::NotTokenIssuer => StatusCode::FORBIDDEN,
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::InvalidServiceKey => "invalid_service_key",
            Refusal::InvalidJti(_) => "invalid_jti",
            Refusal::NoSuchToken => "not_found",
            Refusal::NotTokenIssuer => "not_token_issuer",
            Refusal::InvalidQuery(_) => "invalid_query",
        }
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        ApiError::new(r.status(), r.code(), r.to_string())
    }
}
