//! authd's operations (`specs/authd.md`), and [`AuthdClient`], the one client the daemons,
//! the CLI and the tests call authd with: a daemon's service-token exchange
//! ([`ServiceTokenSource`]), mints, revocations, rotation and the audit log. The offline
//! verifier in `hako-shared` reads only the two public documents, at the paths named in
//! `hako_shared::auth::wire`, which these operations use too.

use std::sync::Arc;
use std::time::Duration;

use hako_shared::auth::jws::Jwks;
use hako_shared::auth::wire::{
    AuditList, KEYS_PATH, MintRequest, MintResponse, REVOKED_PATH, RevokeResponse, RevokedList,
    RotateResponse, ServiceTokenRequest, ServiceTokenResponse,
};
use hako_shared::auth::{ClientError, now_secs};
use reqwest::Method;

use crate::call::{CallError, Client};
use crate::op::{Daemon, Op, seg};

const D: Daemon = Daemon::Authd;

/// `POST /v1/tokens`: a token downscoped from the caller's.
pub fn mint(req: &MintRequest) -> Op<MintResponse> {
    Op::new(D, Method::POST, "/v1/tokens".into()).json(req)
}

/// `DELETE /v1/tokens/{jti}`: revokes a token and those minted from it.
pub fn revoke(jti: &str) -> Op<RevokeResponse> {
    Op::new(D, Method::DELETE, format!("/v1/tokens/{}", seg(jti)))
}

/// `POST /v1/service-token`: a daemon's service key exchanged for a service token.
pub fn service_token(req: &ServiceTokenRequest) -> Op<ServiceTokenResponse> {
    Op::new(D, Method::POST, "/v1/service-token".into()).json(req)
}

/// `GET /v1/keys`: the JWKS.
pub fn keys() -> Op<Jwks> {
    Op::get(D, KEYS_PATH.into())
}

/// `GET /v1/revoked`: revoked jtis not yet expired.
pub fn revoked() -> Op<RevokedList> {
    Op::get(D, REVOKED_PATH.into())
}

/// `POST /v1/keys/rotate` (scope `keys:rotate`).
pub fn rotate() -> Op<RotateResponse> {
    Op::new(D, Method::POST, "/v1/keys/rotate".into())
}

/// `GET /v1/audit` (scope `audit:read`): newest rows first.
pub fn audit() -> Op<AuditList> {
    Op::get(D, "/v1/audit".into())
}

/// `GET /ready`.
pub fn ready() -> Op<serde_json::Value> {
    Op::get(D, "/ready".into())
}

/// Default time limit of one call to authd.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client of authd's API: the operations above, sent with a caller's token, their failures
/// as [`ClientError`]. Plain HTTP only (authd listens on loopback or a private network), and
/// no proxy, so that a proxy setting meant for agents never sees a daemon's tokens. Cheap to
/// clone.
#[derive(Clone, Debug)]
pub struct AuthdClient {
    client: Client,
}

impl AuthdClient {
    /// A client for `base_url` (e.g. `http://127.0.0.1:8181`) with [`DEFAULT_TIMEOUT`].
    pub fn new(base_url: &str) -> Result<Self, ClientError> {
        Self::with_timeout(base_url, DEFAULT_TIMEOUT)
    }

    /// A client whose every call is limited to `timeout`.
    pub fn with_timeout(base_url: &str, timeout: Duration) -> Result<Self, ClientError> {
        let base = hako_shared::auth::check_authd_url(base_url)?;
        let client =
            Client::new(D, base, timeout).map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self { client })
    }

    /// The base URL.
    pub fn base_url(&self) -> &str {
        self.client.base()
    }

    async fn send<R: serde::de::DeserializeOwned>(
        &self,
        op: Op<R>,
        token: Option<&str>,
    ) -> Result<R, ClientError> {
        self.client.call(op, token).await.map_err(|e| match e {
            CallError::Unavailable { message, .. } => ClientError::Transport(message),
            CallError::Refused {
                status,
                code,
                message,
                ..
            } => ClientError::Api {
                status,
                code,
                message,
            },
            CallError::Shape { message, .. } => ClientError::Decode(message),
        })
    }

    /// `GET /ready`: whether authd answers and is ready (its envelope when it is not).
    pub async fn ready(&self) -> Result<(), ClientError> {
        self.send(ready(), None).await.map(drop)
    }

    /// `GET /v1/keys`: the JWKS.
    pub async fn jwks(&self) -> Result<Jwks, ClientError> {
        self.send(keys(), None).await
    }

    /// `GET /v1/revoked`: revoked jtis not yet expired.
    pub async fn revoked(&self) -> Result<RevokedList, ClientError> {
        self.send(revoked(), None).await
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
        self.send(service_token(&body), Some(key)).await
    }

    /// `POST /v1/tokens`: a child of `parent`, downscoped as `req` asks.
    pub async fn mint(&self, parent: &str, req: &MintRequest) -> Result<MintResponse, ClientError> {
        self.send(mint(req), Some(parent)).await
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
        self.send(revoke(jti), Some(token)).await
    }

    /// `POST /v1/keys/rotate` (scope `keys:rotate`).
    pub async fn rotate(&self, token: &str) -> Result<RotateResponse, ClientError> {
        self.send(rotate(), Some(token)).await
    }

    /// `GET /v1/audit` (scope `audit:read`): newest rows first.
    pub async fn audit(
        &self,
        token: &str,
        limit: Option<u32>,
        before: Option<i64>,
    ) -> Result<AuditList, ClientError> {
        let op = audit()
            .query_opt("limit", limit)
            .query_opt("before", before);
        self.send(op, Some(token)).await
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

    /// The URL is checked as the verifier checks it (`hako_shared::auth::check_authd_url`).
    #[test]
    fn the_url_is_checked_and_kept_without_its_slash() {
        let c = AuthdClient::new("http://127.0.0.1:8181/").unwrap();
        assert_eq!(c.base_url(), "http://127.0.0.1:8181");
        assert!(matches!(
            AuthdClient::new("https://x"),
            Err(ClientError::BadUrl(_))
        ));
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
