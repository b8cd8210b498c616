//! The CLI's side of the daemons' HTTP APIs: where they are, the operator's token, and calls
//! whose failures say which daemon did not answer, at which URL, and what to set.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use hako_client::authd::AuthdClient;
use hako_client::{Client, Op, routd};
use hako_shared::chat::{Direction, MessageView};
use hako_shared::runs::RunStreamEvent;
use serde::de::DeserializeOwned;

/// One call's limit (streams excepted).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

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

pub use hako_client::{CallError, Daemon};

/// Clients of the three daemons.
#[derive(Clone)]
pub struct Daemons {
    /// Where they are.
    pub ep: Endpoints,
    authd: Client,
    runed: Client,
    routd: Client,
}

impl Daemons {
    /// Clients for `ep`.
    pub fn new(ep: &Endpoints) -> anyhow::Result<Self> {
        let client = |d, base: &str| Client::new(d, base, CALL_TIMEOUT);
        Ok(Self {
            ep: ep.clone(),
            authd: client(Daemon::Authd, &ep.authd)?,
            runed: client(Daemon::Runed, &ep.runed)?,
            routd: client(Daemon::Routd, &ep.routd)?,
        })
    }

    fn client(&self, daemon: Daemon) -> anyhow::Result<&Client> {
        match daemon {
            Daemon::Authd => Ok(&self.authd),
            Daemon::Runed => Ok(&self.runed),
            Daemon::Routd => Ok(&self.routd),
            Daemon::Telegram => bail!("the Telegram adapter is called at its own URL"),
        }
    }

    /// Each daemon's `/ready`: `Ok` or what it (or the connection) said.
    pub async fn ready_all(&self) -> Vec<(Daemon, Result<(), String>)> {
        let mut out = Vec::new();
        for (d, op) in [
            (Daemon::Authd, hako_client::authd::ready()),
            (Daemon::Runed, hako_client::runed::ready()),
            (Daemon::Routd, hako_client::routd::ready()),
        ] {
            let r = match self.client(d) {
                Ok(c) => match c.call(op, None).await {
                    Ok(_) => Ok(()),
                    Err(CallError::Refused {
                        status, message, ..
                    }) => Err(format!("{status}: {message}")),
                    Err(CallError::Unavailable { url, message, .. }) => {
                        Err(format!("no answer at {url} ({message})"))
                    }
                    Err(e) => Err(e.to_string()),
                },
                Err(e) => Err(e.to_string()),
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

    /// `op` at its daemon, with the operator's `token`: a refusal is a [`CallError`] (which
    /// callers may downcast to), no answer an error that says to check the stack.
    pub async fn call<R: DeserializeOwned>(&self, op: Op<R>, token: &str) -> anyhow::Result<R> {
        call_at(self.client(op.daemon)?, op, token).await
    }

    /// `op`'s text at its daemon (no token: `/metrics`).
    pub async fn text(&self, op: Op<hako_client::Text>) -> anyhow::Result<String> {
        self.client(op.daemon)?.text(op, None).await.map_err(hint)
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
        let deadline = Instant::now() + wait;
        let op = routd::chat_events(chat).query("after", after);
        let mut events = self.routd.events(op, Some(token)).await.map_err(hint)?;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let m = tokio::time::timeout(left, events.next())
                .await
                .map_err(|_| anyhow!("no answer in {chat} within {}s", wait.as_secs()))??
                .ok_or_else(|| anyhow!("routd closed the event stream of {chat}"))?;
            if done(&m) {
                return Ok(m);
            }
        }
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
        let mut events = self
            .runed
            .events(hako_client::runed::run_events(run), Some(token))
            .await
            .map_err(hint)?;
        let mut last_state = None;
        while let Some(ev) = events.next().await? {
            if let RunStreamEvent::State { state, .. } = &ev {
                last_state = Some(*state);
            }
            each(&ev);
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

/// `op` at `client`, as [`Daemons::call`] (the Telegram adapter's routes, at its own URL).
pub async fn call_at<R: DeserializeOwned>(
    client: &Client,
    op: Op<R>,
    token: &str,
) -> anyhow::Result<R> {
    client.call(op, Some(token)).await.map_err(hint)
}

/// A call's failure for the operator: no answer says what to check.
fn hint(e: CallError) -> anyhow::Error {
    match e {
        CallError::Unavailable { .. } => anyhow!("{e}: is the stack up (`hako status`)?"),
        e => e.into(),
    }
}
