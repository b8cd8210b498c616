//! What the offline verifier reads from authd: its two public documents (the JWKS and the
//! revocation list), and the error type of every call to authd. The calls made with a
//! caller's authority (the service-token exchange, mints, revocations) are `hako-client`'s
//! `AuthdClient`, which writes every other path of authd's API.
//!
//! Plain HTTP only (authd listens on loopback or a private network); every call has a
//! timeout, and the client ignores `HTTP(S)_PROXY` so that a proxy setting meant for agents
//! can never see a daemon's tokens.

use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::jws::Jwks;
use super::wire::{KEYS_PATH, REVOKED_PATH, RevokedList};

/// Default time limit of one call to authd.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Answers larger than this are refused.
const MAX_ANSWER: usize = 4 << 20;

/// A failed call to authd.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not `http://host:port`.
    #[error("authd URL {0:?} is invalid: expected http://host:port")]
    BadUrl(String),
    /// A value that cannot go into a request (e.g. a jti with a `/`).
    #[error("invalid request: {0}")]
    BadRequest(String),
    /// Connecting, sending or reading failed, or the call timed out.
    #[error("authd request failed: {0}")]
    Transport(String),
    /// authd answered with an error envelope.
    #[error("authd answered {status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// The envelope's code, e.g. `scope_exceeds_parent`.
        code: String,
        /// The envelope's message.
        message: String,
    },
    /// The answer is not the JSON expected.
    #[error("authd answer is not the JSON expected: {0}")]
    Decode(String),
    /// A fresh service token still lives shorter than asked for.
    #[error(
        "authd's service tokens live {got}s, less than the {wanted}s asked for; raise AUTHD_SERVICE_TOKEN_TTL"
    )]
    LifeTooShort {
        /// Seconds asked for.
        wanted: u64,
        /// Seconds a fresh token has.
        got: i64,
    },
}

impl ClientError {
    /// The envelope code when authd answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ClientError::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// The HTTP status when authd answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Checks an authd URL, `http://host:port` (a trailing `/` is dropped): answers the base.
pub fn check_authd_url(base_url: &str) -> Result<&str, ClientError> {
    let base = base_url.trim().trim_end_matches('/');
    let rest = base
        .strip_prefix("http://")
        .ok_or_else(|| ClientError::BadUrl(base_url.to_owned()))?;
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
        return Err(ClientError::BadUrl(base_url.to_owned()));
    }
    Ok(base)
}

/// The verifier's reader of authd's public documents. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct KeysClient {
    http: reqwest::Client,
    base: Arc<str>,
}

impl KeysClient {
    /// A reader of the authd at `base_url` whose every call is limited to `timeout`.
    pub(crate) fn with_timeout(base_url: &str, timeout: Duration) -> Result<Self, ClientError> {
        let base = check_authd_url(base_url)?;
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .pool_idle_timeout(crate::http::CLIENT_POOL_IDLE)
            .build()
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self {
            http,
            base: base.into(),
        })
    }

    async fn send<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<T, ClientError> {
        // The request (or run) this call serves keeps its id across daemons.
        let req = match crate::http::current_request_id() {
            Some(id) => req.header(crate::http::REQUEST_ID_HEADER, &*id),
            None => req,
        };
        let resp = req
            .send()
            .await
            .map_err(|e| ClientError::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(ClientError::Decode("answer too large".into()));
        }
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Transport(e.without_url().to_string()))?;
        if bytes.len() > MAX_ANSWER {
            return Err(ClientError::Decode("answer too large".into()));
        }
        if !status.is_success() {
            #[derive(serde::Deserialize)]
            struct Envelope {
                error: String,
                #[serde(default)]
                message: String,
            }
            return Err(match serde_json::from_slice::<Envelope>(&bytes) {
                Ok(e) => ClientError::Api {
                    status: status.as_u16(),
                    code: e.error,
                    message: e.message,
                },
                Err(_) => ClientError::Api {
                    status: status.as_u16(),
                    code: "http_error".into(),
                    message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into(),
                },
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// `GET /v1/keys`: the JWKS.
    pub(crate) async fn jwks(&self) -> Result<Jwks, ClientError> {
        self.send(self.http.get(format!("{}{KEYS_PATH}", self.base)))
            .await
    }

    /// `GET /v1/revoked`: revoked jtis not yet expired.
    pub(crate) async fn revoked(&self) -> Result<RevokedList, ClientError> {
        self.send(self.http.get(format!("{}{REVOKED_PATH}", self.base)))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert_eq!(
            check_authd_url("http://127.0.0.1:8181/"),
            Ok("http://127.0.0.1:8181")
        );
        for bad in [
            "https://x",
            "127.0.0.1:1",
            "http://",
            "http://a/b",
            "http://u@h",
        ] {
            assert!(check_authd_url(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn unreachable_authd_is_a_transport_error() {
        // Port 1 on loopback: nothing listens there.
        let c = KeysClient::with_timeout("http://127.0.0.1:1", Duration::from_secs(2)).unwrap();
        assert!(matches!(c.jwks().await, Err(ClientError::Transport(_))));
    }
}
