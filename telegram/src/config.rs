//! The adapter's environment, parsed once (specs/channels.md, "Configuration").

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::config::{ConfigError, Env};

/// Everything the adapter reads from its environment.
#[derive(Clone)]
pub struct Config {
    /// Where the adapter's webhook receiver and `/health` listen (`TELEGRAM_LISTEN`).
    pub listen_addr: SocketAddr,
    /// The adapter's SQLite file: the poll offset, the outbox (`TELEGRAM_DB`).
    pub db: PathBuf,
    /// The Bot API's base URL, without the `/bot<token>` part (`TELEGRAM_API_URL`).
    pub api_url: String,
    /// The bot token, read from `TELEGRAM_TOKEN_FILE`; never logged (see [`crate::botapi`]).
    pub token: Secret,
    /// The Telegram chat ids allowed to reach hako (`TELEGRAM_CHATS`).
    pub chats: BTreeSet<i64>,
    /// routd's base URL (`ROUTD_URL`).
    pub routd_url: String,
    /// authd's base URL (`AUTHD_URL`) and the `channel` identity's key (`AUTHD_SERVICE_KEY`
    /// or `AUTHD_SERVICE_KEY_FILE`).
    pub authd_url: String,
    pub service_key: Secret,
    /// The secret routd signs its webhook deliveries with (`TELEGRAM_WEBHOOK_SECRET` or
    /// `TELEGRAM_WEBHOOK_SECRET_FILE`).
    pub webhook_secret: Secret,
    /// `getUpdates`' long-poll timeout (`TELEGRAM_POLL_TIMEOUT`, 25 s).
    pub poll_timeout: Duration,
    /// How long a reply is retried before it counts as failed (`TELEGRAM_SEND_MAX_AGE`, 1 h).
    pub send_max_age: Duration,
    /// The first pause after a 5xx or a connection that failed (`TELEGRAM_RETRY_BASE`, 1 s),
    /// doubling to a minute.
    pub retry_base: Duration,
    /// "typing…" is shown at most this long after a message if no reply comes
    /// (`TELEGRAM_TYPING_MAX`, 2 m).
    pub typing_max: Duration,
    /// The largest photo, voice note or document fetched for the agent (`TELEGRAM_MEDIA_MAX`,
    /// 20 MiB: the Bot API's own download limit); a larger one is named in the message, not
    /// fetched.
    pub media_max: u64,
}

/// A secret string: its `Debug` says nothing.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("listen_addr", &self.listen_addr)
            .field("db", &self.db)
            .field("api_url", &self.api_url)
            .field("chats", &self.chats)
            .field("routd_url", &self.routd_url)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Reads the configuration; a bad value names its variable (never a secret's value).
    pub fn from_env(env: &Env) -> Result<Config, ConfigError> {
        if env.get("TELEGRAM_TOKEN").is_some() {
            return Err(ConfigError::Invalid {
                var: "TELEGRAM_TOKEN".into(),
                value: "<hidden>".into(),
                reason: "the bot token is read from a file only: set TELEGRAM_TOKEN_FILE".into(),
            });
        }
        let token = env.required_secret("TELEGRAM_TOKEN")?;
        if token.contains(|c: char| c.is_whitespace() || c == '/') {
            return Err(ConfigError::Invalid {
                var: "TELEGRAM_TOKEN_FILE".into(),
                value: env.get("TELEGRAM_TOKEN_FILE").unwrap_or_default().into(),
                reason: "the file does not hold one bot token".into(),
            });
        }
        let chats = env
            .get("TELEGRAM_CHATS")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i64>().map_err(|e| ConfigError::Invalid {
                    var: "TELEGRAM_CHATS".into(),
                    value: s.into(),
                    reason: format!("a chat id is an integer: {e}"),
                })
            })
            .collect::<Result<BTreeSet<_>, _>>()?;
        let api_url = env
            .string_or("TELEGRAM_API_URL", "https://api.telegram.org")
            .trim_end_matches('/')
            .to_owned();
        Ok(Config {
            listen_addr: env.listen_addr_or("TELEGRAM_LISTEN", "127.0.0.1:8190")?,
            db: env.path_or("TELEGRAM_DB", "./telegram.db"),
            api_url,
            token: Secret(token),
            chats,
            routd_url: env
                .string_or("ROUTD_URL", "http://127.0.0.1:8183")
                .trim_end_matches('/')
                .to_owned(),
            authd_url: env.required("AUTHD_URL")?,
            service_key: Secret(env.required_secret("AUTHD_SERVICE_KEY")?),
            webhook_secret: Secret(env.required_secret("TELEGRAM_WEBHOOK_SECRET")?),
            poll_timeout: env.duration_or("TELEGRAM_POLL_TIMEOUT", Duration::from_secs(25))?,
            send_max_age: env.duration_or("TELEGRAM_SEND_MAX_AGE", Duration::from_secs(3600))?,
            retry_base: env.duration_or("TELEGRAM_RETRY_BASE", Duration::from_secs(1))?,
            typing_max: env.duration_or("TELEGRAM_TYPING_MAX", Duration::from_secs(120))?,
            media_max: env.size_or("TELEGRAM_MEDIA_MAX", 20 << 20)?,
        })
    }
}
