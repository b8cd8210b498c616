//! routd, as the adapter uses it: `POST /v1/messages` and `PUT /v1/chats/{jid}/media/{name}`
//! with the `channel` identity's token
//! (the adapter's only credential besides the bot token; minted from its service key).

use hako_shared::auth::{AuthdClient, ServiceTokenSource};
use hako_shared::chat::{PostMessage, Posted};
use hako_shared::media::MediaSaved;

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

    /// Posts `m`.
    pub async fn post(&self, m: &PostMessage) -> Result<Posted, PostError> {
        self.send(|http, base| http.post(format!("{base}/v1/messages")).json(m))
            .await
    }

    /// Saves a file the chat sent into the media directory of the folder `chat` routes to.
    pub async fn put_media(
        &self,
        chat: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<MediaSaved, PostError> {
        let data = axum::body::Bytes::from(data);
        let path = format!(
            "/v1/chats/{}/media/{}",
            hako_shared::path_segment(chat),
            hako_shared::path_segment(name)
        );
        self.send(|http, base| {
            http.put(format!("{base}{path}"))
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .timeout(std::time::Duration::from_secs(120))
                .body(data.clone())
        })
        .await
    }

    /// Sends the request `build` makes and reads its JSON answer; a 401 (a token revoked or
    /// rotated) is tried once more with a fresh token.
    async fn send<T: serde::de::DeserializeOwned>(
        &self,
        build: impl Fn(&reqwest::Client, &str) -> reqwest::RequestBuilder,
    ) -> Result<T, PostError> {
        for fresh in [false, true] {
            if fresh {
                self.tokens.invalidate().await;
            }
            let token = self
                .tokens
                .token()
                .await
                .map_err(|e| PostError::Unavailable(format!("authd: {e}")))?;
            let resp = build(&self.http, &self.base)
                .bearer_auth(&*token)
                .send()
                .await
                .map_err(|e| PostError::Unavailable(e.to_string()))?;
            let status = resp.status().as_u16();
            if status == 401 && !fresh {
                continue;
            }
            if (200..300).contains(&status) {
                return resp
                    .json::<T>()
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
