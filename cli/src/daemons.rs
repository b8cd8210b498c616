//! The CLI's side of the daemons' HTTP APIs: where they are, the operator's token, and calls
//! whose failures say which daemon did not answer, at which URL, and what to set.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use hako_shared::auth::AuthdClient;
use hako_shared::chat::{Direction, MessageView, Posted};
use hako_shared::runs::RunStreamEvent;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// One call's limit (streams excepted).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest server-sent event accepted.
const MAX_EVENT: usize = 1 << 20;

/// Where the daemons answer, and the operator's key.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// authd's base URL (`HAKO_AUTHD_URL`).
    pub authd: String,
    /// runed's base URL (`HAKO_RUNED_URL`).
    pub runed: String,
    /// routd's base URL (`HAKO_ROUTD_URL`).
    pub routd: String,
    /// The operator's service key file (`HAKO_OPERATOR_KEY_FILE`).
    pub operator_key: PathBuf,
}

/// The daemons the CLI calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// The token authority.
    Authd,
    /// The runner daemon.
    Runed,
    /// The routing daemon.
    Routd,
}

impl Daemon {
    /// Every daemon, in the order `hako status` lists them.
    pub const ALL: [Daemon; 3] = [Daemon::Authd, Daemon::Runed, Daemon::Routd];

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Daemon::Authd => "authd",
            Daemon::Runed => "runed",
            Daemon::Routd => "routd",
        }
    }
}

impl std::fmt::Display for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Clients of the three daemons.
#[derive(Clone)]
pub struct Daemons {
    /// Where they are.
    pub ep: Endpoints,
    http: reqwest::Client,
}

/// An answer that is not 2xx: the envelope's code and message.
#[derive(Debug, thiserror::Error)]
#[error("{daemon} answered {status} {code}: {message}")]
pub struct Refused {
    /// Which daemon.
    pub daemon: Daemon,
    /// The status.
    pub status: u16,
    /// The envelope's code.
    pub code: String,
    /// The envelope's message.
    pub message: String,
}

impl Daemons {
    /// Clients for `ep`.
    pub fn new(ep: &Endpoints) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(hako_shared::http::CLIENT_POOL_IDLE)
            .build()
            .context("cannot build an HTTP client")?;
        Ok(Self {
            ep: ep.clone(),
            http,
        })
    }

    fn base(&self, daemon: Daemon) -> &str {
        match daemon {
            Daemon::Authd => &self.ep.authd,
            Daemon::Runed => &self.ep.runed,
            Daemon::Routd => &self.ep.routd,
        }
    }

    /// Each daemon's `/ready`: `Ok` or what it (or the connection) said.
    pub async fn ready_all(&self) -> Vec<(Daemon, Result<(), String>)> {
        let mut out = Vec::new();
        for d in Daemon::ALL {
            let url = format!("{}/ready", self.base(d));
            let r = match self.http.get(&url).timeout(CALL_TIMEOUT).send().await {
                Err(e) => Err(format!("no answer at {url} ({})", root_cause(&e))),
                Ok(r) if r.status().is_success() => Ok(()),
                Ok(r) => {
                    let status = r.status().as_u16();
                    let v: Value = r.json().await.unwrap_or(Value::Null);
                    Err(format!(
                        "{status}: {}",
                        v["message"].as_str().unwrap_or("not ready")
                    ))
                }
            };
            out.push((d, r));
        }
        out
    }

    /// The operator's service token, from the key file (or `HAKO_OPERATOR_KEY`), exchanged at
    /// authd; `HAKO_TOKEN` instead, when set, is used as it is.
    pub async fn operator_token(&self) -> anyhow::Result<String> {
        if let Ok(t) = std::env::var("HAKO_TOKEN")
            && !t.trim().is_empty()
        {
            return Ok(t.trim().to_owned());
        }
        let key = match std::env::var("HAKO_OPERATOR_KEY") {
            Ok(k) if !k.trim().is_empty() => k.trim().to_owned(),
            _ => std::fs::read_to_string(&self.ep.operator_key)
                .with_context(|| {
                    format!(
                        "cannot read the operator key {} (made by `hako up`): set \
                         HAKO_OPERATOR_KEY_FILE, HAKO_OPERATOR_KEY or HAKO_TOKEN",
                        self.ep.operator_key.display()
                    )
                })?
                .trim()
                .to_owned(),
        };
        let client = AuthdClient::with_timeout(&self.ep.authd, CALL_TIMEOUT)
            .map_err(|e| anyhow!("authd at {}: {e}", self.ep.authd))?;
        let t = client
            .service_token("operator", &key)
            .await
            .map_err(|e| match e {
                hako_shared::auth::ClientError::Api { .. } => {
                    anyhow!("authd at {} refused the operator key: {e}", self.ep.authd)
                }
                e => anyhow!(
                    "authd does not answer at {} ({e}): is the stack up (`hako status`)?",
                    self.ep.authd
                ),
            })?;
        Ok(t.token)
    }

    /// A JSON call to `daemon`, its answer read as `T` (the API's own wire type, or `Value`):
    /// a non-2xx answer is a [`Refused`] error, and an answer of another shape (another
    /// hako's version) an error naming the call.
    pub async fn call<T: DeserializeOwned>(
        &self,
        daemon: Daemon,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.base(daemon));
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(token)
            .timeout(CALL_TIMEOUT);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            anyhow!(
                "{daemon} does not answer at {url} ({}): is the stack up (`hako status`)?",
                root_cause(&e)
            )
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .text()
            .await
            .with_context(|| format!("{daemon} at {url}: the answer broke off"))?;
        let v: Value = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text)
                .with_context(|| format!("{daemon} at {url} answered something that is not JSON"))?
        };
        if !(200..300).contains(&status) {
            return Err(Refused {
                daemon,
                status,
                code: v["error"].as_str().unwrap_or("?").to_owned(),
                message: v["message"].as_str().unwrap_or(&text).to_owned(),
            }
            .into());
        }
        serde_json::from_value(v).with_context(|| {
            format!(
                "{daemon} answered {path} in a shape this hako does not read (another version?)"
            )
        })
    }

    /// A `GET` of `path` at `daemon`, read as `T` (as [`Daemons::call`]).
    pub async fn get<T: DeserializeOwned>(
        &self,
        daemon: Daemon,
        path: &str,
        token: &str,
    ) -> anyhow::Result<T> {
        self.call(daemon, reqwest::Method::GET, path, token, None)
            .await
    }

    /// `body` sent to `path` at `daemon` with `method` (`POST`, `PUT`), the answer read as
    /// `T` (as [`Daemons::call`]).
    pub async fn send<T: DeserializeOwned>(
        &self,
        daemon: Daemon,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: &impl serde::Serialize,
    ) -> anyhow::Result<T> {
        let body = serde_json::to_value(body).context("a request body that is not JSON")?;
        self.call(daemon, method, path, token, Some(body)).await
    }

    /// Posts a chat message to routd (`POST /v1/messages`: `chat_jid`, `sender`, `content`,
    /// and an `id` to make it idempotent).
    pub async fn post_message(
        &self,
        token: &str,
        message: &serde_json::Value,
    ) -> anyhow::Result<Posted> {
        self.send(
            Daemon::Routd,
            reqwest::Method::POST,
            "/v1/messages",
            token,
            message,
        )
        .await
    }

    /// The chat's messages after `after` as they come (server-sent events), until `done`
    /// says so or `wait` passes; answers the message `done` accepted.
    pub async fn follow(
        &self,
        chat: &str,
        after: i64,
        token: &str,
        wait: Duration,
        mut done: impl FnMut(&MessageView) -> bool,
    ) -> anyhow::Result<MessageView> {
        let url = format!(
            "{}/v1/chats/{}/events?after={after}",
            self.ep.routd,
            encode(chat)
        );
        let deadline = Instant::now() + wait;
        let mut resp = self.event_stream(Daemon::Routd, &url, token).await?;
        let mut events = SseData::default();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, resp.chunk())
                .await
                .map_err(|_| anyhow!("no answer in {chat} within {}s", wait.as_secs()))?
                .with_context(|| format!("routd's event stream of {chat} broke off"))?
                .ok_or_else(|| anyhow!("routd closed the event stream of {chat}"))?;
            for v in events.feed(&chunk, chat)? {
                let m: MessageView = serde_json::from_value(v).with_context(|| {
                    format!("routd sent a message of {chat} this hako does not read")
                })?;
                if done(&m) {
                    return Ok(m);
                }
            }
        }
    }

    /// A daemon's event stream at `url`, its refusal an error naming the daemon.
    async fn event_stream(
        &self,
        daemon: Daemon,
        url: &str,
        token: &str,
    ) -> anyhow::Result<reqwest::Response> {
        let resp = self
            .http
            .get(url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| anyhow!("{daemon} does not answer at {url} ({})", root_cause(&e)))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let v: Value = resp.json().await.unwrap_or(Value::Null);
            bail!(
                "{daemon} answered {status} for {url}: {}",
                v["message"].as_str().unwrap_or("?")
            );
        }
        Ok(resp)
    }

    /// A run's events from runed (its stored blocks, then each state and block as it comes)
    /// until the stream ends with the run; whether it ended `exited`. (runed's stream carries
    /// every block whole: one too large for its broadcast it reads from its store.)
    pub async fn run_events(
        &self,
        run: &str,
        token: &str,
        mut each: impl FnMut(&RunStreamEvent),
    ) -> anyhow::Result<bool> {
        let url = format!("{}/v1/runs/{}/events", self.ep.runed, encode(run));
        let mut resp = self.event_stream(Daemon::Runed, &url, token).await?;
        let mut events = SseData::default();
        let mut last_state = None;
        while let Some(chunk) = resp
            .chunk()
            .await
            .with_context(|| format!("runed's event stream of {run} broke off"))?
        {
            for v in events.feed(&chunk, run)? {
                let ev: RunStreamEvent = serde_json::from_value(v).with_context(|| {
                    format!("runed sent an event of {run} this hako does not read")
                })?;
                if let RunStreamEvent::State { state, .. } = &ev {
                    last_state = Some(*state);
                }
                each(&ev);
            }
        }
        Ok(last_state == Some(hako_shared::runs::RunState::Exited))
    }

    /// The first outbound message of `chat` after `after` (a reply or a notice).
    pub async fn first_reply(
        &self,
        chat: &str,
        after: i64,
        token: &str,
        wait: Duration,
    ) -> anyhow::Result<MessageView> {
        self.follow(chat, after, token, wait, |m| m.direction == Direction::Out)
            .await
    }
}

/// Percent-encodes a path segment (a chat JID, a folder).
pub fn encode(s: &str) -> String {
    hako_shared::path_segment(s)
}

/// The innermost cause of an error, which says what went wrong (refused, timed out).
/// The JSON `data:` payloads of a server-sent event stream, fed chunk by chunk (through the
/// one event-stream parser); an event longer than `MAX_EVENT` is an error, not a growing
/// buffer, and events whose data is not JSON are skipped.
struct SseData {
    parser: hako_shared::sse::Parser,
}

impl Default for SseData {
    fn default() -> Self {
        SseData {
            parser: hako_shared::sse::Parser::new(MAX_EVENT),
        }
    }
}

impl SseData {
    /// The payloads of the events `chunk` completes (`what` names the stream in errors).
    fn feed(&mut self, chunk: &[u8], what: &str) -> anyhow::Result<Vec<Value>> {
        let mut events = Vec::new();
        if self.parser.feed(chunk, &mut events).is_err() {
            bail!("an event of {what} longer than {MAX_EVENT} bytes");
        }
        Ok(events
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
            .collect())
    }
}

fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_across_chunks_and_bounded() {
        let mut e = SseData::default();
        assert!(e.feed(b"id: 1\ndata: {\"a\"", "c").unwrap().is_empty());
        let got = e
            .feed(b": 1}\n\nevent: x\ndata: not json\n\ndata: 2\n\n", "c")
            .unwrap();
        assert_eq!(got, vec![serde_json::json!({"a": 1}), serde_json::json!(2)]);
        // A character split between chunks, and `\r\n` line ends (a proxy's): read whole.
        // (Each chunk was decoded on its own, so "é" became two replacement characters,
        // and a `\r\n\r\n` event never ended.)
        assert!(e.feed(b"data: \"h\xc3", "c").unwrap().is_empty());
        let got = e.feed(b"\xa9\"\r\n\r\n", "c").unwrap();
        assert_eq!(got, vec![serde_json::json!("h\u{e9}")]);
        let big = vec![b'x'; MAX_EVENT + 1];
        assert!(
            e.feed(&big, "c")
                .unwrap_err()
                .to_string()
                .contains("longer than")
        );
    }

    #[test]
    fn encoding() {
        assert_eq!(super::encode("web:acme/support"), "web:acme%2Fsupport");
        assert_eq!(super::encode("a b%"), "a%20b%25");
    }
}
