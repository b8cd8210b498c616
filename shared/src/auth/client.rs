//! An HTTP client for authd, and a cache of a daemon's own service token.
//!
//! Plain HTTP only (authd listens on loopback or a private network); every call has a
//! timeout, and the client ignores `HTTP(S)_PROXY` so that a proxy setting meant for agents
//! can never see a daemon's tokens.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::jws::Jwks;
use super::now_secs;
use super::wire::{
    AuditList, MintRequest, MintResponse, RevokeResponse, RevokedList, RotateResponse,
    ServiceTokenRequest, ServiceTokenResponse,
};

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

/// A client for authd's HTTP API. Cheap to clone.
#[derive(Clone, Debug)]
pub struct AuthdClient {
    http: reqwest::Client,
    base: Arc<str>,
}

impl AuthdClient {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8181`) with [`DEFAULT_TIMEOUT`].
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::with_timeout(base_url, DEFAULT_TIMEOUT)
    }

    /// A client whose every call is limited to `timeout`.
    pub fn with_timeout(base_url: &str, timeout: Duration) -> Result<Self, ClientError> {
        let base = base_url.trim().trim_end_matches('/');
        let rest = base
            .strip_prefix("http://")
            .ok_or_else(|| ClientError::BadUrl(base_url.to_owned()))?;
        if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
            return Err(ClientError::BadUrl(base_url.to_owned()));
        }
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

    /// The base URL.
    pub fn base_url(&self) -> &str {
        &self.base
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

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn post<B: Serialize>(&self, path: &str, bearer: &str, body: &B) -> reqwest::RequestBuilder {
        self.http
            .post(self.url(path))
            .bearer_auth(bearer)
            .json(body)
    }

    /// `GET /ready`: whether authd answers and is ready (its envelope when it is not).
    pub async fn ready(&self) -> Result<(), ClientError> {
        self.send::<serde_json::Value>(self.http.get(self.url("/ready")))
            .await
            .map(drop)
    }

    /// `GET /v1/keys`: the JWKS.
    pub async fn jwks(&self) -> Result<Jwks, ClientError> {
        self.send(self.http.get(self.url("/v1/keys"))).await
    }

    /// `GET /v1/revoked`: revoked jtis not yet expired.
    pub async fn revoked(&self) -> Result<RevokedList, ClientError> {
        self.send(self.http.get(self.url("/v1/revoked"))).await
    }

    /// `POST /v1/service-token`: exchanges `daemon`'s service key for a service token.
    pub async fn service_token(
        &self,
        daemon: &str,
        key: &str,
    ) -> Result<ServiceTokenResponse, ClientError> {
        let body = ServiceTokenRequest {
            daemon: daemon.to_owned(),
        };
        self.send(self.post("/v1/service-token", key, &body)).await
    }

    /// `POST /v1/tokens`: a child of `parent`, downscoped as `req` asks.
    pub async fn mint(&self, parent: &str, req: &MintRequest) -> Result<MintResponse, ClientError> {
        self.send(self.post("/v1/tokens", parent, req)).await
    }

    /// `DELETE /v1/tokens/{jti}`: revokes `jti` (and its descendants) with `token`'s authority.
    pub async fn revoke(&self, token: &str, jti: &str) -> Result<RevokeResponse, ClientError> {
        if jti.is_empty()
            || jti.len() > 128
            || !jti
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ClientError::BadRequest(
                "jti has unexpected characters".into(),
            ));
        }
        let req = self
            .http
            .delete(self.url(&format!("/v1/tokens/{jti}")))
            .bearer_auth(token);
        self.send(req).await
    }

    /// `POST /v1/keys/rotate` (scope `keys:rotate`).
    pub async fn rotate(&self, token: &str) -> Result<RotateResponse, ClientError> {
        self.send(
            self.http
                .post(self.url("/v1/keys/rotate"))
                .bearer_auth(token),
        )
        .await
    }

    /// `GET /v1/audit` (scope `audit:read`): newest rows first.
    pub async fn audit(
        &self,
        token: &str,
        limit: Option<u32>,
        before: Option<i64>,
    ) -> Result<AuditList, ClientError> {
        let mut q: Vec<(&str, String)> = Vec::new();
        if let Some(l) = limit {
            q.push(("limit", l.to_string()));
        }
        if let Some(b) = before {
            q.push(("before", b.to_string()));
        }
        let req = self
            .http
            .get(self.url("/v1/audit"))
            .query(&q)
            .bearer_auth(token);
        self.send(req).await
    }
}

struct Cached {
    token: Arc<str>,
    expires_at: i64,
}

struct SourceInner {
    client: AuthdClient,
    daemon: String,
    key: String,
    cached: tokio::sync::Mutex<Option<Cached>>,
}

/// A daemon's own service token, exchanged once and refreshed when too little life is left.
/// Cheap to clone; concurrent callers share one exchange.
#[derive(Clone)]
pub struct ServiceTokenSource {
    inner: Arc<SourceInner>,
}

impl std::fmt::Debug for ServiceTokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceTokenSource")
            .field("daemon", &self.inner.daemon)
            .field("authd", &self.inner.client.base_url())
            .finish_non_exhaustive()
    }
}

/// The life a token from [`ServiceTokenSource::token`] has left at least.
pub const DEFAULT_MIN_LIFE: Duration = Duration::from_secs(60);

impl ServiceTokenSource {
    /// A source for `daemon`, authenticating with its service key `key`.
    pub fn new(client: AuthdClient, daemon: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            inner: Arc::new(SourceInner {
                client,
                daemon: daemon.into(),
                key: key.into(),
                cached: tokio::sync::Mutex::new(None),
            }),
        }
    }

    /// The client this source uses.
    pub fn client(&self) -> &AuthdClient {
        &self.inner.client
    }

    /// A service token with at least [`DEFAULT_MIN_LIFE`] left.
    pub async fn token(&self) -> Result<Arc<str>, ClientError> {
        self.token_with_life(DEFAULT_MIN_LIFE).await
    }

    /// A service token with at least `min` left: the cached one, or a fresh exchange.
    /// Fails with [`ClientError::LifeTooShort`] when even a fresh token lives less.
    pub async fn token_with_life(&self, min: Duration) -> Result<Arc<str>, ClientError> {
        let min_secs = i64::try_from(min.as_secs()).unwrap_or(i64::MAX);
        let mut cached = self.inner.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && c.expires_at - now_secs() >= min_secs
        {
            return Ok(c.token.clone());
        }
        let fresh = self
            .inner
            .client
            .service_token(&self.inner.daemon, &self.inner.key)
            .await?;
        let token: Arc<str> = fresh.token.into();
        let left = fresh.expires_at - now_secs();
        *cached = Some(Cached {
            token: token.clone(),
            expires_at: fresh.expires_at,
        });
        if left < min_secs {
            return Err(ClientError::LifeTooShort {
                wanted: min.as_secs(),
                got: left,
            });
        }
        Ok(token)
    }

    /// Forgets the cached token (e.g. after authd answered 401 to it).
    pub async fn invalidate(&self) {
        *self.inner.cached.lock().await = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked() {
        assert!(AuthdClient::new("http://127.0.0.1:8181").is_ok());
        assert_eq!(
            AuthdClient::new("http://127.0.0.1:8181/")
                .unwrap()
                .base_url(),
            "http://127.0.0.1:8181"
        );
        for bad in [
            "https://x",
            "127.0.0.1:1",
            "http://",
            "http://a/b",
            "http://u@h",
        ] {
            assert!(AuthdClient::new(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn unreachable_authd_is_a_transport_error() {
        // Port 1 on loopback: nothing listens there.
        let c = AuthdClient::with_timeout("http://127.0.0.1:1", Duration::from_secs(2)).unwrap();
        assert!(matches!(c.jwks().await, Err(ClientError::Transport(_))));
        assert!(matches!(
            c.revoke("t", "a/b").await,
            Err(ClientError::BadRequest(_))
        ));
        let src = ServiceTokenSource::new(c, "runed", "k".repeat(20));
        assert!(!format!("{src:?}").contains("kkkk"));
    }
}
