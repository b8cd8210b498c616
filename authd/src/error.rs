//! authd's refusals that are not a downscoping rule ([`crate::mint::MintError`]) or a store
//! failure ([`crate::store::StoreError`]): one enum, mapped to the HTTP error envelope here.

use axum::http::StatusCode;
use hako_shared::http::{ApiError, Code};

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

hako_shared::error_codes! {
    /// Unknown daemon or wrong service key (one answer for both, on purpose).
    pub const INVALID_SERVICE_KEY = (401, "invalid_service_key");
    /// Not a token id (the id grammar).
    pub const INVALID_JTI = (400, "invalid_jti");
    /// Only the token's issuer, or a holder of `tokens:revoke`, may revoke it.
    pub const NOT_TOKEN_ISSUER = (403, "not_token_issuer");
}

impl Refusal {
    /// The code it answers with.
    pub fn answer(&self) -> &'static Code {
        match self {
            Refusal::InvalidServiceKey => &INVALID_SERVICE_KEY,
            Refusal::InvalidJti(_) => &INVALID_JTI,
            Refusal::NoSuchToken => &hako_shared::http::NOT_FOUND,
            Refusal::NotTokenIssuer => &NOT_TOKEN_ISSUER,
            Refusal::InvalidQuery(_) => &hako_shared::http::INVALID_QUERY,
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.answer().status()
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        self.answer().code
    }
}

impl From<Refusal> for ApiError {
    fn from(r: Refusal) -> Self {
        ApiError::new(r.status(), r.code(), r.to_string())
    }
}
