//! Per-spawn tokens. runed never signs: it asks authd, with its own service token (refreshed
//! before it runs short), for a child token downscoped to one run's folder, turn and run,
//! carrying the agent's scopes, the group's egress hosts and its brokered secrets (names,
//! hosts and the run's placeholders, never values), and revokes it when the run ends.
//! Without authd (open local-dev mode) every run gets the same static token, and runed says
//! so loudly.

use std::time::Duration;

use hako_client::authd::{AuthdClient, ServiceTokenSource};
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{AGENT_SCOPES, ClientError, now_secs};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::secrets::SecretClaim;

/// The static token of open mode (never valid anywhere authd is running).
pub const OPEN_TOKEN: &str = "hako-open-dev-mode-token";

/// A minted spawn token.
#[derive(Clone)]
pub struct SpawnToken {
    /// The signed token (goes to the container's stdin only).
    pub token: String,
    /// Its id (recorded in `mcp_tokens`).
    pub jti: String,
    /// Unix seconds.
    pub expires_at: i64,
}

impl std::fmt::Debug for SpawnToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnToken")
            .field("jti", &self.jti)
            .field("expires_at", &self.expires_at)
            .finish_non_exhaustive()
    }
}

/// Why a spawn token could not be had.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// authd did not answer (the run stays queued and is retried).
    #[error("authd unavailable: {0}")]
    Unavailable(String),
    /// authd refused (a configuration problem; the run fails).
    #[error("authd refused the spawn token: {0}")]
    Refused(String),
}

/// The token broker.
#[derive(Clone, Debug)]
pub enum Broker {
    /// Open local-dev mode: a static token.
    Open,
    /// authd.
    Authd(ServiceTokenSource),
}

fn classify(e: ClientError) -> BrokerError {
    match e {
        ClientError::Transport(_) => BrokerError::Unavailable(e.to_string()),
        ClientError::Api { status, .. } if status >= 500 => BrokerError::Unavailable(e.to_string()),
        other => BrokerError::Refused(other.to_string()),
    }
}

impl Broker {
    /// A broker for authd at `url` with runed's service key, or open mode.
    pub fn new(url: Option<&str>, key: Option<&str>) -> Result<Broker, ClientError> {
        match (url, key) {
            (Some(url), Some(key)) => Ok(Broker::Authd(ServiceTokenSource::new(
                AuthdClient::new(url)?,
                "runed",
                key,
            ))),
            _ => {
                tracing::warn!(
                    "OPEN MODE (HAKO_OPEN_DEV=1, no AUTHD_URL): every run gets the same static token and runed's API accepts any caller on loopback. Local development only."
                );
                Ok(Broker::Open)
            }
        }
    }

    /// A token for one run, living `ttl`.
    pub async fn mint(
        &self,
        folder: &str,
        turn_id: &TurnId,
        run_id: &RunId,
        egress: &[String],
        secrets: &[SecretClaim],
        ttl: Duration,
    ) -> Result<SpawnToken, BrokerError> {
        let src = match self {
            Broker::Open => {
                return Ok(SpawnToken {
                    token: OPEN_TOKEN.into(),
                    jti: format!("open-{run_id}"),
                    expires_at: now_secs() + ttl.as_secs() as i64,
                });
            }
            Broker::Authd(src) => src,
        };
        let req = MintRequest {
            scope: AGENT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
            folder: Some(folder.to_owned()),
            ttl_seconds: Some(ttl.as_secs()),
            typ: None,
            run_id: Some(run_id.to_string()),
            turn_id: Some(turn_id.to_string()),
            egress: egress.to_vec(),
            secrets: secrets.to_vec(),
        };
        // The parent must outlive the child: ask for a service token with the run's life left.
        let mut retried = false;
        loop {
            let parent = src
                .token_with_life(ttl + Duration::from_secs(5))
                .await
                .map_err(classify)?;
            match src.client().mint(&parent, &req).await {
                Ok(r) => {
                    return Ok(SpawnToken {
                        token: r.token,
                        jti: r.jti,
                        expires_at: r.expires_at,
                    });
                }
                // A revoked or rotated-away service token: exchange once more.
                Err(ClientError::Api { status: 401, .. }) if !retried => {
                    retried = true;
                    src.invalidate().await;
                }
                Err(e) => return Err(classify(e)),
            }
        }
    }

    /// Revokes a spawn token. Open mode has nothing to revoke.
    pub async fn revoke(&self, jti: &str) -> Result<(), BrokerError> {
        let Broker::Authd(src) = self else {
            return Ok(());
        };
        let parent = src.token().await.map_err(classify)?;
        match src.client().revoke(&parent, jti).await {
            Ok(_) => Ok(()),
            // Already gone (expired and pruned): nothing left to revoke.
            Err(ClientError::Api { status: 404, .. }) => Ok(()),
            Err(e) => Err(classify(e)),
        }
    }

    /// Whether authd answers (for `/ready`); open mode always does.
    pub async fn check(&self) -> Result<(), String> {
        match self {
            Broker::Open => Ok(()),
            Broker::Authd(src) => src.token().await.map(drop).map_err(|e| e.to_string()),
        }
    }
}
