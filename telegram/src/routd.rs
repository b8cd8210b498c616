//! routd, as the adapter uses it: `POST /v1/messages` and `PUT /v1/chats/{jid}/media/{name}`
//! with the `channel` identity's token
//! (the adapter's only credential besides the bot token; minted from its service key).

use std::time::Duration;

use hako_client::authd::{AuthdClient, ServiceTokenSource};
use hako_client::{CallError, Client, Daemon, Op, routd};
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
    client: Client,
    tokens: ServiceTokenSource,
}

impl Routd {
    pub fn new(cfg: &Config) -> Result<Routd, String> {
        let client = Client::new(Daemon::Routd, &cfg.routd_url, Duration::from_secs(15))
            .map_err(|e| e.to_string())?;
        let authd = AuthdClient::new(&cfg.authd_url).map_err(|e| e.to_string())?;
        Ok(Routd {
            client,
            tokens: ServiceTokenSource::new(authd, "channel", cfg.service_key.0.clone()),
        })
    }

    /// Posts `m`.
    pub async fn post(&self, m: &PostMessage) -> Result<Posted, PostError> {
        self.send(routd::post_message(m)).await
    }

    /// Saves a file the chat sent into the media directory of the folder `chat` routes to.
    pub async fn put_media(
        &self,
        chat: &str,
        name: &str,
        data: Vec<u8>,
    ) -> Result<MediaSaved, PostError> {
        let op = routd::put_chat_media(chat, name, data.into()).limit(Duration::from_secs(120));
        self.send(op).await
    }

    /// Sends `op` and reads its JSON answer; a 401 (a token revoked or rotated) is tried once
    /// more with a fresh token.
    async fn send<T: serde::de::DeserializeOwned>(&self, op: Op<T>) -> Result<T, PostError> {
        for fresh in [false, true] {
            if fresh {
                self.tokens.invalidate().await;
            }
            let token = self
                .tokens
                .token()
                .await
                .map_err(|e| PostError::Unavailable(format!("authd: {e}")))?;
            match self.client.call(op.clone(), Some(&token)).await {
                Ok(v) => return Ok(v),
                Err(e) if e.status() == Some(401) && !fresh => continue,
                Err(CallError::Refused {
                    status,
                    code,
                    message,
                    ..
                }) if status != 429 && status < 500 && status != 401 => {
                    return Err(PostError::Refused {
                        status,
                        body: format!("{code}: {message}"),
                    });
                }
                Err(e) => return Err(PostError::Unavailable(e.to_string())),
            }
        }
        Err(PostError::Unavailable("unreachable".into()))
    }
}
