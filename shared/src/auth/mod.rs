//! Tokens: the claims, the one scope grammar, the one table of service grants, EdDSA-only
//! compact JWS (`jsonwebtoken` inside hako's envelope), the offline [`Verifier`] every daemon uses, the axum [`Principal`] extractor,
//! and the [`AuthdClient`] that talks to authd.
//!
//! authd is the only signer. Every other daemon verifies offline against authd's JWKS, polls
//! its revocation list, and checks scopes and folders on each request. With no `AUTHD_URL` a
//! daemon runs in open dev mode: everything passes and it says so loudly, at start and on a
//! timer.

pub mod claims;
pub mod client;
pub mod extract;
pub mod grants;
pub mod jws;
pub mod scope;
pub mod verifier;
pub mod wire;

pub use claims::{Claims, TokenType};
pub use client::{ClientError, check_authd_url};
pub use extract::{Authenticated, Principal, bearer};
pub use grants::{AGENT_SCOPES, SERVICE_GRANTS, scopes, service_grants};
pub use jws::{Jwk, Jwks, JwsError, Signer, VerifyingKey};
pub use verifier::{DEFAULT_ISSUER, Verifier, VerifierConfig};

use axum::http::StatusCode;

use crate::http::ApiError;

/// Why a request's token was not accepted. Mapped to the HTTP envelope in one place
/// ([`From<AuthError> for ApiError`](ApiError)); messages never contain the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization` header.
    #[error("missing bearer token (Authorization: Bearer <token>)")]
    Missing,
    /// An `Authorization` header that is not one `Bearer <token>`.
    #[error("malformed Authorization header: {0}")]
    BadHeader(&'static str),
    /// The token is not a well-formed EdDSA JWS.
    #[error("{0}")]
    Malformed(JwsError),
    /// Signed by a key this verifier does not know (after a JWKS refresh, or while refreshes
    /// are rate-limited).
    #[error("token is signed by an unknown key")]
    UnknownKey,
    /// The signature does not verify.
    #[error("token signature does not verify")]
    BadSignature,
    /// Not issued by the configured issuer.
    #[error("token issuer is not trusted")]
    WrongIssuer,
    /// Signed, but the claims are not what hako issues.
    #[error("token claims are invalid: {0}")]
    BadClaims(String),
    /// Past `exp` (plus leeway).
    #[error("token has expired")]
    Expired,
    /// Before `nbf` or `iat` (minus leeway).
    #[error("token is not valid yet")]
    NotYetValid,
    /// On authd's revocation list.
    #[error("token has been revoked")]
    Revoked,
    /// authd could not be reached and the key is not known.
    #[error("authd is unreachable: {0}")]
    Unavailable(String),
    /// The token lacks a scope the route needs.
    #[error("token lacks scope {0}")]
    InsufficientScope(String),
    /// The token's folder does not reach the folder asked for.
    #[error("token does not reach folder {0:?}")]
    FolderForbidden(String),
}

crate::error_codes! {
    /// No `Authorization: Bearer` token.
    pub const MISSING_TOKEN = (401, "missing_token");
    /// The token is not one of authd's: malformed, signed by no key authd has, for another
    /// issuer, or with claims that cannot be.
    pub const INVALID_TOKEN = (401, "invalid_token");
    /// The token has expired.
    pub const TOKEN_EXPIRED = (401, "token_expired");
    /// The token is not valid yet (its `nbf` is ahead of this host's clock).
    pub const TOKEN_NOT_YET_VALID = (401, "token_not_yet_valid");
    /// The token (or one it was minted from) was revoked.
    pub const TOKEN_REVOKED = (401, "token_revoked");
    /// authd does not answer, and the token's key or revocations cannot be checked.
    pub const AUTHD_UNAVAILABLE = (503, "authd_unavailable");
}

impl AuthError {
    /// The code it answers with.
    pub fn answer(&self) -> &'static crate::http::Code {
        match self {
            AuthError::Missing => &MISSING_TOKEN,
            AuthError::Expired => &TOKEN_EXPIRED,
            AuthError::NotYetValid => &TOKEN_NOT_YET_VALID,
            AuthError::Revoked => &TOKEN_REVOKED,
            AuthError::Unavailable(_) => &AUTHD_UNAVAILABLE,
            AuthError::InsufficientScope(_) => &crate::http::INSUFFICIENT_SCOPE,
            AuthError::FolderForbidden(_) => &crate::http::FOLDER_FORBIDDEN,
            AuthError::BadHeader(_)
            | AuthError::Malformed(_)
            | AuthError::UnknownKey
            | AuthError::BadSignature
            | AuthError::WrongIssuer
            | AuthError::BadClaims(_) => &INVALID_TOKEN,
        }
    }

    /// The envelope's error code.
    pub fn code(&self) -> &'static str {
        self.answer().code
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.answer().status()
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        ApiError::new(e.status(), e.code(), e.to_string())
    }
}

impl From<JwsError> for AuthError {
    fn from(e: JwsError) -> Self {
        match e {
            JwsError::Signature => AuthError::BadSignature,
            JwsError::Expired => AuthError::Expired,
            JwsError::NotYetValid => AuthError::NotYetValid,
            JwsError::Issuer => AuthError::WrongIssuer,
            JwsError::Claims(why) => AuthError::BadClaims(why),
            other => AuthError::Malformed(other),
        }
    }
}

/// Unix seconds now.
pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_once() {
        let e: ApiError = AuthError::Revoked.into();
        assert_eq!(e.status, StatusCode::UNAUTHORIZED);
        assert_eq!(e.body.error, "token_revoked");
        let e: ApiError = AuthError::InsufficientScope("runs:run".into()).into();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(e.body.error, "insufficient_scope");
        let e: ApiError = AuthError::Unavailable("x".into()).into();
        assert_eq!(e.status, StatusCode::SERVICE_UNAVAILABLE);
        let e: ApiError = AuthError::from(JwsError::Alg("none".into())).into();
        assert_eq!(e.body.error, "invalid_token");
    }
}
