//! The Bot API client: frankenstein's types over the tree's reqwest. Every call is `POST
//! <base>/bot<token>/<method>` with a JSON body; the answer is frankenstein's
//! `MethodResponse` or `ErrorResponse`. The token is in the URL only: every error this module
//! makes has it replaced by `<token>` (reqwest's errors carry the URL).

use std::time::Duration;

use frankenstein::response::{ErrorResponse, MethodResponse};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Secret;

/// Why a call did not give a result.
#[derive(Debug, thiserror::Error)]
pub enum BotError {
    /// 429: Telegram asks to wait this long before the next call.
    #[error("rate limited: retry after {0:?}")]
    RetryAfter(Duration),
    /// 5xx: Telegram did not process the call; it may be made again.
    #[error("server error {status}: {description}")]
    Server { status: u16, description: String },
    /// Any other refusal (400 chat not found, 403 bot blocked, …): making the same call again
    /// gets the same answer.
    #[error("refused {status}: {description}")]
    Refused { status: u16, description: String },
    /// No connection was made: nothing reached Telegram, the call may be made again.
    #[error("not connected: {0}")]
    Connect(String),
    /// The request may have reached Telegram but its answer was lost (a timeout, a reset, an
    /// answer that did not parse): whether it took effect is unknown.
    #[error("answer lost: {0}")]
    Lost(String),
}

/// A client of one bot.
#[derive(Clone)]
pub struct Bot {
    http: reqwest::Client,
    base: String,
    token: Secret,
}

impl Bot {
    /// A client of the bot `token` at `api_url` (`https://api.telegram.org`).
    pub fn new(api_url: &str, token: Secret, timeout: Duration) -> Result<Bot, BotError> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| BotError::Connect(e.to_string()))?;
        Ok(Bot {
            http,
            base: api_url.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// `text` with the token replaced: anything that may hold a URL passes through here.
    pub fn redact(&self, text: &str) -> String {
        redact(text, &self.token.0)
    }

    /// A transport failure: nothing sent (`Connect`), or an answer lost; the token redacted.
    fn transport(&self, e: reqwest::Error) -> BotError {
        let connect = e.is_connect();
        let text = self.redact(&e.without_url().to_string());
        if connect {
            BotError::Connect(text)
        } else {
            BotError::Lost(text)
        }
    }

    /// Calls `method` with `params`, waiting at most `timeout` beyond the client's.
    pub async fn call<P: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        timeout: Option<Duration>,
    ) -> Result<T, BotError> {
        let url = format!("{}/bot{}/{method}", self.base, self.token.0);
        let mut req = self.http.post(url).json(params);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        let resp = req.send().await.map_err(|e| self.transport(e))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .await
            .map_err(|e| BotError::Lost(self.redact(&e.without_url().to_string())))?;
        if (200..300).contains(&status) {
            return serde_json::from_slice::<MethodResponse<T>>(&body)
                .map(|r| r.result)
                .map_err(|e| {
                    BotError::Lost(format!("{method}: an answer that does not parse: {e}"))
                });
        }
        let err = serde_json::from_slice::<ErrorResponse>(&body).ok();
        let description = self.redact(
            &err.as_ref()
                .map_or_else(|| format!("HTTP {status}"), |e| e.description.clone()),
        );
        if status == 429 {
            let after = err
                .and_then(|e| e.parameters)
                .and_then(|p| p.retry_after)
                .unwrap_or(1);
            return Err(BotError::RetryAfter(Duration::from_secs(u64::from(after))));
        }
        if status >= 500 {
            return Err(BotError::Server {
                status,
                description,
            });
        }
        Err(BotError::Refused {
            status,
            description,
        })
    }

    /// Downloads the file at `file_path` (from `getFile`), at most `max` bytes (more is
    /// [`BotError::Refused`] with status 413: fetching it again gets the same answer).
    pub async fn download(&self, file_path: &str, max: u64) -> Result<Vec<u8>, BotError> {
        let url = format!("{}/file/bot{}/{file_path}", self.base, self.token.0);
        let lost = |e| self.transport(e);
        let mut resp = self.http.get(url).send().await.map_err(lost)?;
        let status = resp.status().as_u16();
        if !(200..300).contains(&status) {
            let description = format!("downloading a file: HTTP {status}");
            return Err(match status {
                429 => BotError::RetryAfter(Duration::from_secs(1)),
                s if s >= 500 => BotError::Server {
                    status,
                    description,
                },
                _ => BotError::Refused {
                    status,
                    description,
                },
            });
        }
        let too_large = || BotError::Refused {
            status: 413,
            description: format!("the file is larger than {max} bytes (TELEGRAM_MEDIA_MAX)"),
        };
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(too_large());
        }
        let mut out = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(lost)? {
            if (out.len() + chunk.len()) as u64 > max {
                return Err(too_large());
            }
            out.extend_from_slice(&chunk);
        }
        Ok(out)
    }
}

/// `text` with every occurrence of `token` (and of its URL-encoded form) replaced.
pub fn redact(text: &str, token: &str) -> String {
    if token.is_empty() {
        return text.to_owned();
    }
    let encoded = token.replace(':', "%3A");
    text.replace(token, "<token>").replace(&encoded, "<token>")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_redacted() {
        let t = "123456:ABC-def";
        assert_eq!(
            redact(
                "error sending request for url (https://x/bot123456:ABC-def/getMe)",
                t
            ),
            "error sending request for url (https://x/bot<token>/getMe)"
        );
        assert_eq!(redact("x 123456%3AABC-def y", t), "x <token> y");
    }
}
