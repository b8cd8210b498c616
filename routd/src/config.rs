//! routd's configuration, read once from the environment (see `specs/routd.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::auth::VerifierConfig;
use hako_shared::config::{ConfigError, Env};
use hako_shared::contract::Redacted;
use hako_shared::http::ServeLimits;
use hako_shared::layout::DataLayout;
use hako_shared::runs::LlmApi;

/// Everything routd needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// `ROUTD_LISTEN` or `LISTEN_ADDR`, default `127.0.0.1:8183`.
    pub listen_addr: SocketAddr,
    /// `ROUTD_DB`, default `DATA_DIR/routd.db`.
    pub db_path: PathBuf,
    /// `RUNED_URL`, default `http://127.0.0.1:8182`.
    pub runed_url: String,
    /// `AUTHD_URL` and friends (open dev mode only with `HAKO_OPEN_DEV=1`).
    pub verifier: VerifierConfig,
    /// `AUTHD_SERVICE_KEY` (or `AUTHD_SERVICE_KEY_FILE`): routd's key for its service token
    /// (required with `AUTHD_URL`).
    pub service_key: Option<String>,
    /// `ROUTD_BODY_LIMIT`, default 256 KiB.
    pub body_limit: usize,
    /// `ROUTD_MEDIA_MAX`, default 20 MiB: one file a chat sends its agent (runed's
    /// `RUNED_MEDIA_MAX` bounds it again).
    pub media_max: usize,
    /// `ROUTD_MAX_CONTENT`, default 64 KiB: the longest message text.
    pub max_content: usize,
    /// `ROUTD_BATCH_MAX`, default 50: messages one turn takes at most.
    pub batch_max: usize,
    /// `ROUTD_MAX_TURN_RETRIES`, default 3: tries after the first, for a turn with no output.
    pub max_turn_retries: u32,
    /// `ROUTD_RETRY_BASE`, default 2s: the first retry's backoff (doubling, with jitter).
    pub retry_base: Duration,
    /// `ROUTD_RETRY_MAX`, default 5m: the longest backoff.
    pub retry_max: Duration,
    /// `ROUTD_WEBHOOK_ATTEMPTS`, default 8.
    pub webhook_attempts: u32,
    /// `ROUTD_WEBHOOK_MAX_AGE`, default 1h: a message older than this is not retried.
    pub webhook_max_age: Duration,
    /// `ROUTD_WEBHOOK_TIMEOUT`, default 10s: one attempt's limit.
    pub webhook_timeout: Duration,
    /// `ROUTD_WEBHOOK_RETRY_BASE`, default 1s: the first redelivery's backoff (doubling,
    /// with jitter, at most 5 minutes).
    pub webhook_retry_base: Duration,
    /// `ROUTD_RUNED_TIMEOUT`, default 10s: a call to runed (not a stream).
    pub runed_timeout: Duration,
    /// `ROUTD_SHUTDOWN_GRACE`, default 5s: at shutdown, how long requests in flight and the
    /// turns' steps under way may take to finish before they are cut off (keep it under the
    /// stop timeout of whatever stops routd: Docker's is 10 s).
    pub shutdown_grace: Duration,
    /// `ROUTD_MAX_STREAMS_PER_CALLER`, default 16 (and 256 overall): open chat event streams.
    pub max_streams_per_caller: usize,
    /// `ROUTD_MAX_STREAMS`.
    pub max_streams: usize,
    /// `HAKO_MAX_CONNECTIONS`, `HAKO_HEADER_TIMEOUT`.
    pub serve: ServeLimits,
    /// `DATA_DIR`, shared with runed: where each folder's `ipc/` gets the turn's sockets.
    pub layout: DataLayout,
    /// `ROUTD_MAX_TASKS`, default 100: active scheduled tasks per group.
    pub max_tasks: usize,
    /// `ROUTD_MAX_TENANT_GROUPS`, default 100: the groups at or below a folder-bound
    /// caller's folder (its own `PUT`s and its main group's `register_group` both count).
    pub max_tenant_groups: usize,
    /// What one turn's tools may write: `ROUTD_TURN_MAX_MESSAGES` (100) `send_message`
    /// calls, `ROUTD_TURN_MAX_BYTES` (1 MiB) of their text, `ROUTD_TURN_MAX_STATUS` (100)
    /// `set_status` edits.
    pub turn_writes: TurnWrites,
    /// `ROUTD_GROUP_MAX_BYTES_PER_DAY`, default 64 MiB: what a group's turns may write into
    /// the log per UTC day, all its turns together.
    pub group_bytes_per_day: u64,
    /// `ROUTD_APPROVAL_REATTACH`, default 60s: how long a held call's request may have no
    /// one waiting on it (routd restarted, the agent's connection broke) before it is denied.
    pub approval_reattach: std::time::Duration,
    /// `ROUTD_CHANNEL_CHATS`, default `*`: JID globs the `channel` identity (a chat adapter)
    /// may post to and read. `web:` chats are never a channel's unless a glob starting with
    /// `web:` names them: they belong to the callers of their folder.
    pub channel_chats: Vec<String>,
    /// `ROUTD_WEBHOOK_ALLOW_PRIVATE`, default off: webhooks may target loopback, link-local
    /// and private addresses (a receiver on the host or its LAN).
    pub webhook_allow_private: bool,
    /// The LLM gateway: providers, budget, bounds.
    pub llm: LlmConfig,
    /// The web page's sessions (`specs/web.md`).
    pub web: WebConfig,
}

/// The web page's sign-in and sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebConfig {
    /// `ROUTD_WEB_SESSION_TTL`, default 12h: how long a browser stays signed in.
    pub session_ttl: Duration,
    /// `ROUTD_WEB_LINK_MAX_TTL`, default 15m: the longest life a sign-in link's token may have
    /// (a longer-lived token is an API credential, not a link, and is refused).
    pub link_max_ttl: Duration,
    /// `ROUTD_WEB_COOKIE_SECURE`, default off: mark the session cookie `Secure` (set it when
    /// the page is served over TLS, behind a proxy that terminates it).
    pub cookie_secure: bool,
}

impl Default for WebConfig {
    fn default() -> Self {
        Self {
            session_ttl: Duration::from_secs(12 * 3600),
            link_max_ttl: Duration::from_secs(15 * 60),
            cookie_secure: false,
        }
    }
}

/// Bounds on what one turn's tools write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnWrites {
    /// `send_message` calls.
    pub messages: u64,
    /// Bytes of their text.
    pub bytes: u64,
    /// `set_status` edits.
    pub status: u64,
}

/// A model provider the gateway forwards to, with the key the agents never see.
#[derive(Debug, Clone)]
pub struct Provider {
    /// Base URL, without a trailing `/` (`https://api.anthropic.com`).
    pub base_url: String,
    /// The real key.
    pub key: Redacted,
}

/// The LLM gateway's settings.
#[derive(Debug, Clone)]
pub struct LlmConfig {
    /// `ROUTD_ANTHROPIC_URL` (default `https://api.anthropic.com`) and `ANTHROPIC_API_KEY`
    /// (or `ANTHROPIC_API_KEY_FILE`, or `anthropic.key` in `ROUTD_PROVIDER_KEYS_DIR`); `None`
    /// without a key.
    pub anthropic: Option<Provider>,
    /// `ROUTD_OPENAI_URL` (default `https://api.openai.com`) and `OPENAI_API_KEY` (or
    /// `OPENAI_API_KEY_FILE`, or `openai.key` in `ROUTD_PROVIDER_KEYS_DIR`); `None` without
    /// a key.
    pub openai: Option<Provider>,
    /// `ROUTD_LLM_DAILY_TOKENS`, default 1,000,000: a group's tokens (input and output) per
    /// UTC day, unless its `llm.daily_tokens` says otherwise.
    pub daily_tokens: u64,
    /// `ROUTD_LLM_BODY_LIMIT`, default 16 MiB: one request to the gateway.
    pub body_limit: usize,
    /// `ROUTD_LLM_MAX_RESPONSE`, default 64 MiB: one answer (a stream is cut there).
    pub max_response: u64,
    /// `ROUTD_LLM_TIMEOUT`, default 10m: until the provider's answer starts.
    pub timeout: Duration,
    /// `ROUTD_LLM_IDLE_TIMEOUT`, default 5m: the longest silence inside an answer.
    pub idle_timeout: Duration,
    /// `ROUTD_LLM_MAX_CALLS`, default 4: a turn's calls in flight at once (the budget is
    /// checked as each starts, so this bounds how far a turn can overshoot it).
    pub max_calls: usize,
}

impl Default for LlmConfig {
    fn default() -> Self {
        Self {
            anthropic: None,
            openai: None,
            daily_tokens: 1_000_000,
            body_limit: 16 << 20,
            max_response: 64 << 20,
            timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(300),
            max_calls: 4,
        }
    }
}

impl LlmConfig {
    /// The provider behind a wire format, if configured.
    pub fn provider(&self, api: LlmApi) -> Option<&Provider> {
        match api {
            LlmApi::Anthropic => self.anthropic.as_ref(),
            LlmApi::Openai => self.openai.as_ref(),
        }
    }

    fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let d = Self::default();
        let provider = |url_var: &str, default_url: &str, key_var: &str| {
            env.reject_empty(url_var)?;
            let url = env.string_or(url_var, default_url);
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(ConfigError::Invalid {
                    var: url_var.into(),
                    value: url,
                    reason: "expected an http:// or https:// URL".into(),
                });
            }
            let mut key = env.secret_or_file(key_var)?;
            // A directory of key files (a compose stack mounts one): `<name>.key`, if there.
            if key.is_none()
                && let Some(dir) = env.path("ROUTD_PROVIDER_KEYS_DIR")
            {
                let name = if key_var.starts_with("ANTHROPIC") {
                    "anthropic.key"
                } else {
                    "openai.key"
                };
                let file = dir.join(name).display().to_string();
                key = Env::from_pairs([(format!("{key_var}_FILE"), file.clone())])
                    .secret_or_file(key_var)
                    .or_else(|e| match std::fs::exists(&file) {
                        Ok(false) => Ok(None),
                        _ => Err(e),
                    })?;
            }
            Ok(key.map(|key| Provider {
                base_url: url.trim_end_matches('/').to_owned(),
                key: Redacted(key),
            }))
        };
        let c = Self {
            anthropic: provider(
                "ROUTD_ANTHROPIC_URL",
                "https://api.anthropic.com",
                "ANTHROPIC_API_KEY",
            )?,
            openai: provider(
                "ROUTD_OPENAI_URL",
                "https://api.openai.com",
                "OPENAI_API_KEY",
            )?,
            daily_tokens: env.parse_or("ROUTD_LLM_DAILY_TOKENS", d.daily_tokens)?,
            body_limit: env.size_or("ROUTD_LLM_BODY_LIMIT", d.body_limit as u64)? as usize,
            max_response: env.size_or("ROUTD_LLM_MAX_RESPONSE", d.max_response)?,
            timeout: env.duration_or("ROUTD_LLM_TIMEOUT", d.timeout)?,
            idle_timeout: env.duration_or("ROUTD_LLM_IDLE_TIMEOUT", d.idle_timeout)?,
            max_calls: env.parse_or("ROUTD_LLM_MAX_CALLS", d.max_calls)?,
        };
        for (var, zero) in [
            ("ROUTD_LLM_DAILY_TOKENS", c.daily_tokens == 0),
            ("ROUTD_LLM_BODY_LIMIT", c.body_limit == 0),
            ("ROUTD_LLM_MAX_RESPONSE", c.max_response == 0),
            ("ROUTD_LLM_TIMEOUT", c.timeout.is_zero()),
            ("ROUTD_LLM_IDLE_TIMEOUT", c.idle_timeout.is_zero()),
            ("ROUTD_LLM_MAX_CALLS", c.max_calls == 0),
        ] {
            if zero {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: env.get(var).unwrap_or_default().into(),
                    reason: "must be more than 0".into(),
                });
            }
        }
        Ok(c)
    }
}

impl Config {
    /// Whether the `channel` identity may post to and read `chat`.
    pub fn channel_reaches(&self, chat: &str) -> bool {
        let web = chat.starts_with("web:");
        self.channel_chats
            .iter()
            .any(|g| hako_shared::glob::glob(g, chat) && (!web || g.starts_with("web:")))
    }

    /// Defaults around a data directory, open dev mode (tests start here).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 8183)),
            db_path: data_dir.join("routd.db"),
            runed_url: "http://127.0.0.1:8182".into(),
            verifier: VerifierConfig::default(),
            service_key: None,
            body_limit: 256 << 10,
            media_max: 20 << 20,
            max_content: 64 << 10,
            batch_max: 50,
            max_turn_retries: 3,
            retry_base: Duration::from_secs(2),
            retry_max: Duration::from_secs(300),
            webhook_attempts: 8,
            webhook_max_age: Duration::from_secs(3600),
            webhook_timeout: Duration::from_secs(10),
            webhook_retry_base: Duration::from_secs(1),
            runed_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            max_streams_per_caller: 16,
            max_streams: 256,
            serve: ServeLimits::default(),
            layout: DataLayout::new(data_dir),
            max_tasks: 100,
            max_tenant_groups: 100,
            turn_writes: TurnWrites {
                messages: 100,
                bytes: 1 << 20,
                status: 100,
            },
            group_bytes_per_day: 64 << 20,
            approval_reattach: std::time::Duration::from_secs(60),
            channel_chats: vec!["*".into()],
            webhook_allow_private: false,
            llm: LlmConfig::default(),
            web: WebConfig::default(),
        }
    }

    /// Reads the configuration; every error names the variable (never a key's value).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        env.reject_empty("DATA_DIR")?;
        let data_dir = env.path_or("DATA_DIR", "./data");
        let mut c = Self::new(data_dir);
        let listen_var = if env.get("ROUTD_LISTEN").is_some() {
            "ROUTD_LISTEN"
        } else {
            "LISTEN_ADDR"
        };
        c.listen_addr = env.listen_addr_or(listen_var, "127.0.0.1:8183")?;
        if let Some(p) = env.path("ROUTD_DB") {
            c.db_path = p;
        }
        env.reject_empty("RUNED_URL")?;
        c.runed_url = env.string_or("RUNED_URL", &c.runed_url);
        if !(c.runed_url.starts_with("http://") || c.runed_url.starts_with("https://")) {
            return Err(ConfigError::Invalid {
                var: "RUNED_URL".into(),
                value: c.runed_url.clone(),
                reason: "expected an http:// or https:// URL".into(),
            });
        }
        c.runed_url = c.runed_url.trim_end_matches('/').to_owned();
        c.verifier = VerifierConfig::from_env(env)?;
        c.verifier.check_open_listen(listen_var, c.listen_addr)?;
        if c.verifier.authd_url.is_some() {
            c.service_key = Some(env.required_secret("AUTHD_SERVICE_KEY")?);
        }
        c.body_limit = env.size_or("ROUTD_BODY_LIMIT", c.body_limit as u64)? as usize;
        c.media_max = env.size_or("ROUTD_MEDIA_MAX", c.media_max as u64)? as usize;
        c.max_content = env.size_or("ROUTD_MAX_CONTENT", c.max_content as u64)? as usize;
        if c.max_content == 0 || c.max_content >= c.body_limit {
            return Err(ConfigError::Invalid {
                var: "ROUTD_MAX_CONTENT".into(),
                value: c.max_content.to_string(),
                reason: format!(
                    "must be at least 1 and below ROUTD_BODY_LIMIT ({})",
                    c.body_limit
                ),
            });
        }
        c.batch_max = env.parse_or("ROUTD_BATCH_MAX", c.batch_max)?;
        c.max_turn_retries = env.parse_or("ROUTD_MAX_TURN_RETRIES", c.max_turn_retries)?;
        c.retry_base = env.duration_or("ROUTD_RETRY_BASE", c.retry_base)?;
        c.retry_max = env.duration_or("ROUTD_RETRY_MAX", c.retry_max)?;
        c.webhook_attempts = env.parse_or("ROUTD_WEBHOOK_ATTEMPTS", c.webhook_attempts)?;
        c.webhook_max_age = env.duration_or("ROUTD_WEBHOOK_MAX_AGE", c.webhook_max_age)?;
        c.webhook_timeout = env.duration_or("ROUTD_WEBHOOK_TIMEOUT", c.webhook_timeout)?;
        c.webhook_retry_base = env.duration_or("ROUTD_WEBHOOK_RETRY_BASE", c.webhook_retry_base)?;
        c.runed_timeout = env.duration_or("ROUTD_RUNED_TIMEOUT", c.runed_timeout)?;
        c.shutdown_grace = env.duration_or("ROUTD_SHUTDOWN_GRACE", c.shutdown_grace)?;
        c.max_streams = env.parse_or("ROUTD_MAX_STREAMS", c.max_streams)?;
        c.max_streams_per_caller =
            env.parse_or("ROUTD_MAX_STREAMS_PER_CALLER", c.max_streams_per_caller)?;
        c.max_tasks = env.parse_or("ROUTD_MAX_TASKS", c.max_tasks)?;
        c.max_tenant_groups = env.parse_or("ROUTD_MAX_TENANT_GROUPS", c.max_tenant_groups)?;
        c.turn_writes.messages = env.parse_or("ROUTD_TURN_MAX_MESSAGES", c.turn_writes.messages)?;
        c.turn_writes.bytes = env.size_or("ROUTD_TURN_MAX_BYTES", c.turn_writes.bytes)?;
        c.turn_writes.status = env.parse_or("ROUTD_TURN_MAX_STATUS", c.turn_writes.status)?;
        c.group_bytes_per_day =
            env.size_or("ROUTD_GROUP_MAX_BYTES_PER_DAY", c.group_bytes_per_day)?;
        c.approval_reattach = env.duration_or("ROUTD_APPROVAL_REATTACH", c.approval_reattach)?;
        c.webhook_allow_private =
            env.bool_or("ROUTD_WEBHOOK_ALLOW_PRIVATE", c.webhook_allow_private)?;
        c.web.session_ttl = env.duration_or("ROUTD_WEB_SESSION_TTL", c.web.session_ttl)?;
        c.web.link_max_ttl = env.duration_or("ROUTD_WEB_LINK_MAX_TTL", c.web.link_max_ttl)?;
        c.web.cookie_secure = env.bool_or("ROUTD_WEB_COOKIE_SECURE", c.web.cookie_secure)?;
        for (var, zero) in [
            ("ROUTD_WEB_SESSION_TTL", c.web.session_ttl.is_zero()),
            ("ROUTD_WEB_LINK_MAX_TTL", c.web.link_max_ttl.is_zero()),
        ] {
            if zero {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: "0".into(),
                    reason: "must be above zero".into(),
                });
            }
        }
        if let Some(list) = env.get("ROUTD_CHANNEL_CHATS") {
            let globs: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_owned)
                .collect();
            if globs.is_empty() || globs.iter().any(|g| g.len() > 256) {
                return Err(ConfigError::Invalid {
                    var: "ROUTD_CHANNEL_CHATS".into(),
                    value: list.into(),
                    reason:
                        "a comma-separated list of JID globs (tg:*, wa:*), each 1-256 characters"
                            .into(),
                });
            }
            c.channel_chats = globs;
        }
        for (var, zero) in [
            ("ROUTD_MAX_TASKS", c.max_tasks == 0),
            ("ROUTD_MAX_TENANT_GROUPS", c.max_tenant_groups == 0),
            ("ROUTD_TURN_MAX_MESSAGES", c.turn_writes.messages == 0),
            ("ROUTD_TURN_MAX_BYTES", c.turn_writes.bytes == 0),
            ("ROUTD_TURN_MAX_STATUS", c.turn_writes.status == 0),
            ("ROUTD_GROUP_MAX_BYTES_PER_DAY", c.group_bytes_per_day == 0),
            ("ROUTD_BATCH_MAX", c.batch_max == 0),
            ("ROUTD_WEBHOOK_ATTEMPTS", c.webhook_attempts == 0),
            ("ROUTD_RETRY_BASE", c.retry_base.is_zero()),
            ("ROUTD_WEBHOOK_RETRY_BASE", c.webhook_retry_base.is_zero()),
            ("ROUTD_RUNED_TIMEOUT", c.runed_timeout.is_zero()),
            ("ROUTD_WEBHOOK_TIMEOUT", c.webhook_timeout.is_zero()),
            ("ROUTD_MAX_STREAMS", c.max_streams == 0),
            (
                "ROUTD_MAX_STREAMS_PER_CALLER",
                c.max_streams_per_caller == 0,
            ),
        ] {
            if zero {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: env.get(var).unwrap_or_default().into(),
                    reason: "must be more than 0".into(),
                });
            }
        }
        c.serve = ServeLimits::from_env(env)?;
        c.llm = LlmConfig::from_env(env)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_read_and_checked() {
        let c = Config::from_env(&Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("HAKO_OPEN_DEV", "1"),
            ("RUNED_URL", "http://127.0.0.1:9/"),
            ("ROUTD_MAX_TURN_RETRIES", "5"),
        ]))
        .unwrap();
        assert_eq!(c.db_path, PathBuf::from("/tmp/x/routd.db"));
        assert_eq!(c.runed_url, "http://127.0.0.1:9");
        assert_eq!(c.max_turn_retries, 5);
        let bad = |pairs: &[(&str, &str)]| {
            let mut all = vec![("DATA_DIR", "/tmp/x"), ("HAKO_OPEN_DEV", "1")];
            all.extend_from_slice(pairs);
            Config::from_env(&Env::from_pairs(all))
                .unwrap_err()
                .to_string()
        };
        assert!(bad(&[("RUNED_URL", "ftp://x")]).contains("RUNED_URL"));
        assert!(bad(&[("RUNED_URL", "")]).contains("RUNED_URL is set but empty"));
        assert!(bad(&[("ROUTD_MAX_CONTENT", "1m")]).contains("ROUTD_MAX_CONTENT"));
        assert!(bad(&[("ROUTD_BATCH_MAX", "0")]).contains("ROUTD_BATCH_MAX"));
        assert!(bad(&[("ROUTD_LISTEN", "0.0.0.0:8183")]).contains("loopback"));
        assert!(
            bad(&[("ROUTD_ANTHROPIC_URL", "api.anthropic.com")]).contains("ROUTD_ANTHROPIC_URL")
        );
        assert!(bad(&[("ROUTD_LLM_DAILY_TOKENS", "0")]).contains("ROUTD_LLM_DAILY_TOKENS"));
        let key_err = bad(&[("OPENAI_API_KEY", "sk-x"), ("OPENAI_API_KEY_FILE", "/k")]);
        assert!(
            key_err.contains("OPENAI_API_KEY_FILE") && !key_err.contains("sk-x"),
            "{key_err}"
        );
        let c = Config::from_env(&Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("HAKO_OPEN_DEV", "1"),
            ("ANTHROPIC_API_KEY", "sk-ant-1"),
            ("ROUTD_ANTHROPIC_URL", "http://127.0.0.1:9/"),
        ]))
        .unwrap();
        let p = c.llm.provider(LlmApi::Anthropic).unwrap();
        assert_eq!(
            (p.base_url.as_str(), p.key.expose()),
            ("http://127.0.0.1:9", "sk-ant-1")
        );
        assert!(c.llm.provider(LlmApi::Openai).is_none());
        assert!(
            !format!("{c:?}").contains("sk-ant-1"),
            "the key is never in Debug"
        );
        let e = Config::from_env(&Env::from_pairs([("DATA_DIR", "/tmp/x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("AUTHD_URL is required"), "{e}");
        let e = Config::from_env(&Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("AUTHD_URL", "http://127.0.0.1:1"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(e.contains("AUTHD_SERVICE_KEY"), "{e}");
    }
}
