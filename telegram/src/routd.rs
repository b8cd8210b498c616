//! routd, as the adapter uses it: `POST /v1/messages` with the `channel` identity's token
//! (the adapter's only credential besides the bot token; minted from its service key).

use hako_shared::auth::{AuthdClient, ServiceTokenSource};
use hako_shared::chat::{PostMessage, Posted};

use crate::config::Config;

/// Why a message did not reach routd.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PostError {
    /// routd (or authd) did not answer, or answered 5xx / 429: post it again later.
    #[error("routd unavailable: {0}")]
    Unavailable(String),
    /// routd refused it for good (400, 403, 409): posting it again gets the same answer.
    #[error("routd refused it ({status}): {body}")]
    Refused { status: u16, body: String },
}

pub(crate) struct Routd {
    http: reqwest::Client,
    base: String,
    tokens: ServiceTokenSource,
}

impl Routd {
    pub fn new(cfg: &Config) -> Result<Routd, String> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(std::time::Duration::from_secs(15))
            .pool_idle_timeout(hako_shared::http::CLIENT_POOL_IDLE)
            .build()
            .map_err(|e| e.to_string())?;
        let authd = AuthdClient::new(&cfg.authd_url).map_err(|e| e.to_string())?;
        Ok(Routd {
            http,
            base: cfg.routd_url.clone(),
            tokens: ServiceTokenSource::new(authd, "channel", cfg.service_key.0.clone()),
        })
    }

    /// Posts `m`; a 401 (a token revoked or rotated) is tried once more with a fresh one.
    pub async fn post(&self, m: &PostMessage) -> Result<Posted, PostError> {
        for fresh in [false, true] {
            if fresh {
                self.tokens.invalidate().await;
            }
            let token = self
                .tokens
                .token()
                .await
                .map_err(|e| PostError::Unavailable(format!("authd: {e}")))?;
            let resp = self
                .http
                .post(format!("{}/v1/messages", self.base))
                .bearer_auth(&*token)
                .json(m)
                .send()
                .await
                .map_err(|e| PostError::Unavailable(e.to_string()))?;
            let status = resp.status().as_u16();
            if status == 401 && !fresh {
                continue;
            }
            if (200..300).contains(&status) {
                return resp
                    .json::<Posted>()
                    .await
                    .map_err(|e| PostError::Unavailable(e.to_string()));
            }
            let body = resp.text().await.unwrap_or_default();
            if status == 429 || status >= 500 || status == 401 {
                return Err(PostError::Unavailable(format!("{status}: {body}")));
            }
            return Err(PostError::Refused { status, body });
        }
        Err(PostError::Unavailable("unreachable".into()))
    }
}
