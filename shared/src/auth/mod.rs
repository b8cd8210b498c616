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
pub use client::{AuthdClient, ClientError, ServiceTokenSource};
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

impl AuthError {
    /// The envelope's error code.
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Missing => "missing_token",
            AuthError::Expired => "token_expired",
            AuthError::NotYetValid => "token_not_yet_valid",
            AuthError::Revoked => "token_revoked",
            AuthError::Unavailable(_) => "authd_unavailable",
            AuthError::InsufficientScope(_) => "insufficient_scope",
            AuthError::FolderForbidden(_) => "folder_forbidden",
            AuthError::BadHeader(_)
            | AuthError::Malformed(_)
            | AuthError::UnknownKey
            | AuthError::BadSignature
            | AuthError::WrongIssuer
            | AuthError::BadClaims(_) => "invalid_token",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            AuthError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            AuthError::InsufficientScope(_) | AuthError::FolderForbidden(_) => {
                StatusCode::FORBIDDEN
            }
            _ => StatusCode::UNAUTHORIZED,
        }
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
