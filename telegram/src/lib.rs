//! hako-telegram: the Telegram channel adapter (specs/channels.md).
//!
//! - `poll`: long polling `getUpdates`, each update posted to routd as the `channel`
//!   identity (ids from Telegram's own, so a replay is a duplicate), the offset persisted;
//! - `receiver`: routd's signed webhook deliveries in, each turned into Bot API calls
//!   recorded in the outbox before anything is sent; `/health` for `hako status`;
//! - `outbox`: the one sender, in order, honouring 429's `retry_after`, retrying 5xx;
//! - `botapi`: frankenstein's types over the tree's reqwest, the token never in an error;
//! - `pairing`: a chat not on the allowlist gets a code; the operator accepts it.

pub mod botapi;
pub mod config;
mod media;
mod outbox;
mod pairing;
mod poll;
mod receiver;
mod routd;
pub mod store;
pub mod text;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::Config;

/// The bot as `getMe` answered.
#[derive(Debug, Clone)]
pub struct Me {
    pub id: u64,
    pub username: String,
}

/// What `/health` tells about polling.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct PollHealth {
    /// Unix ms of the last `getUpdates` that answered.
    pub last_poll_ms: Option<i64>,
    /// Why the last one failed, if it did (redacted).
    pub last_poll_error: Option<String>,
    /// Updates handled since start.
    pub updates: u64,
    /// Messages routd refused for good (logged and skipped).
    pub refused_by_routd: u64,
}

/// What the tasks share.
pub(crate) struct Shared {
    pub cfg: Config,
    pub bot: botapi::Bot,
    pub store: store::Store,
    pub routd: routd::Routd,
    pub me: OnceLock<Me>,
    pub poll: Mutex<PollHealth>,
    /// Wakes the outbox sender.
    pub send: Notify,
    /// Chats shown "typing…" until this time (or until a reply comes).
    pub typing: Mutex<HashMap<i64, tokio::time::Instant>>,
    pub stopping: CancellationToken,
    /// Checks the operator's token on the pairing routes.
    pub verifier: hako_shared::auth::Verifier,
    /// The chats the operator let in with a pairing code (beside `TELEGRAM_CHATS`).
    pub paired: Mutex<std::collections::BTreeSet<i64>>,
}

impl Shared {
    /// Whether chat `chat` may reach the agent: on `TELEGRAM_CHATS`, or paired.
    pub(crate) fn allowed(&self, chat: i64) -> bool {
        self.cfg.chats.contains(&chat) || self.paired.lock().unwrap().contains(&chat)
    }
}

/// A started adapter.
pub struct Running {
    pub addr: SocketAddr,
    stopping: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Running {
    /// Stops polling, sending and serving; waits for them.
    pub async fn shutdown(self) {
        self.stopping.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Resolves when the adapter stops (a task ended).
    pub async fn stopped(&self) {
        self.stopping.cancelled().await;
    }
}

/// Why the adapter could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("database: {0}")]
    Db(#[from] hako_shared::db::DbError),
    #[error("{0}")]
    Client(String),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
}

/// Starts the adapter on `listener`.
pub async fn start(cfg: Config, listener: tokio::net::TcpListener) -> Result<Running, StartError> {
    let addr = listener.local_addr()?;
    let store = store::Store::open(&cfg.db).await?;
    // The long poll holds the connection up to its timeout; a margin beyond it.
    let bot = botapi::Bot::new(
        &cfg.api_url,
        cfg.token.clone(),
        cfg.poll_timeout + Duration::from_secs(15),
    )
    .map_err(|e| StartError::Client(e.to_string()))?;
    let routd = routd::Routd::new(&cfg).map_err(StartError::Client)?;
    let verifier =
        hako_shared::auth::Verifier::new(hako_shared::auth::VerifierConfig::remote(&cfg.authd_url))
            .map_err(|e| StartError::Client(e.to_string()))?;
    let paired = store
        .paired()
        .await?
        .into_iter()
        .map(|p| p.chat_id)
        .collect();
    let stopping = CancellationToken::new();
    let sh = Arc::new(Shared {
        cfg,
        bot,
        store,
        routd,
        me: OnceLock::new(),
        poll: Mutex::new(PollHealth::default()),
        send: Notify::new(),
        typing: Mutex::new(HashMap::new()),
        stopping: stopping.clone(),
        verifier,
        paired: Mutex::new(paired),
    });
    let router = receiver::router(sh.clone());
    let stop = stopping.clone();
    let mut tasks = vec![tokio::spawn(async move {
        let shut = stop.clone();
        if let Err(e) =
            hako_shared::http::serve(listener, router, async move { shut.cancelled().await }).await
        {
            tracing::error!(error = %e, "the receiver stopped");
        }
        stop.cancel();
    })];
    tasks.push(tokio::spawn(poll::run(sh.clone())));
    tasks.push(tokio::spawn(outbox::run(sh.clone())));
    tasks.push(tokio::spawn(outbox::typing(sh.clone())));
    tracing::info!(%addr, chats = sh.cfg.chats.len(), "hako-telegram started");
    Ok(Running {
        addr,
        stopping,
        tasks,
    })
}

/// Unix milliseconds now.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The hako chat JID of Telegram chat `id`.
pub fn chat_jid(id: i64) -> String {
    format!("tg:{id}")
}

/// The Telegram chat id of a hako JID this adapter serves.
pub fn chat_id(jid: &str) -> Option<i64> {
    jid.strip_prefix("tg:")?.parse().ok()
}
