//! runed's configuration, read once from the environment (see `specs/runed.md`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::auth::VerifierConfig;
use hako_shared::config::{ConfigError, Env};

use hako_runner::RunnerConfig;

/// Everything the daemon needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// `RUNED_LISTEN` or `LISTEN_ADDR`, default `127.0.0.1:8182`.
    pub listen_addr: SocketAddr,
    /// `RUNED_DB`, default `DATA_DIR/runed.db`.
    pub db_path: PathBuf,
    /// `MAX_CONTAINERS`, default 4: agent containers alive at once.
    pub max_containers: usize,
    /// `RUNED_MAX_CONTAINERS_PER_TENANT` (default: half of `MAX_CONTAINERS`, at least 1): the
    /// live containers of one tenant (a folder's first segment).
    pub max_per_tenant: usize,
    /// `AUTHD_URL` and friends; unset URL: open local-dev mode.
    pub verifier: VerifierConfig,
    /// `AUTHD_SERVICE_KEY` (or `AUTHD_SERVICE_KEY_FILE`): runed's key for its service token
    /// (required with `AUTHD_URL`).
    pub service_key: Option<String>,
    /// `DOCKER_HOST` (`unix://…`), default `/var/run/docker.sock`.
    pub docker_socket: String,
    /// The engine boxes run on instead of Docker at `docker_socket` (the simulated one, in
    /// logic tests); never from the environment. `None`: Docker.
    pub engine: Option<hako_runner::engine::EngineRef>,
    /// `RUNED_BODY_LIMIT`, default 1 MiB.
    pub body_limit: usize,
    /// `RUNED_MEDIA_MAX`, default 20 MiB: one file a chat sends its agent (Telegram's own
    /// download limit).
    pub media_max: usize,
    /// `RUNED_MEDIA_FOLDER_MAX`, default 256 MiB: a folder's media directory, all files.
    pub media_folder_max: u64,
    /// `RUNED_MAX_WAIT`, default 120s: the longest `?wait=` honoured.
    pub max_wait: Duration,
    /// `RUNED_MAX_QUEUED`, default 1000: runs and holds waiting at once.
    pub max_queued: usize,
    /// `RUNED_MAX_QUEUED_PER_FOLDER`, default 50: the same, per folder.
    pub max_queued_per_folder: usize,
    /// `RUNED_MAX_STREAMS`, default 256: SSE streams and long-polls open at once.
    pub max_streams: usize,
    /// `RUNED_MAX_STREAMS_PER_CALLER`, default 16: the same, per token subject.
    pub max_streams_per_caller: usize,
    /// `RUNED_RETENTION`, default 7d: finished runs, logs and tokens older than this are pruned.
    pub retention: Duration,
    /// `RUNED_GC_INTERVAL`, default 10m.
    pub gc_interval: Duration,
    /// `RUNED_TOKEN_MARGIN`, default 60s: a spawn token outlives the run ceiling by this.
    pub token_margin: Duration,
    /// `HAKO_MAX_CONNECTIONS`, `HAKO_HEADER_TIMEOUT`: bounds on the connections served.
    pub serve: hako_shared::http::ServeLimits,
    /// The container runner's settings (`DATA_DIR`, `CONTAINER_IMAGE`, `RUNED_RUN_TIMEOUT`…).
    pub runner: RunnerConfig,
}

impl Config {
    /// Defaults around a data directory, open mode (tests start here).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Self {
            listen_addr: SocketAddr::from(([127, 0, 0, 1], 8182)),
            db_path: data_dir.join("runed.db"),
            max_containers: 4,
            max_per_tenant: 2,
            verifier: VerifierConfig::default(),
            service_key: None,
            docker_socket: "/var/run/docker.sock".into(),
            engine: None,
            body_limit: 1 << 20,
            media_max: 20 << 20,
            media_folder_max: 256 << 20,
            max_wait: Duration::from_secs(120),
            max_queued: 1000,
            max_queued_per_folder: 50,
            max_streams: 256,
            max_streams_per_caller: 16,
            retention: Duration::from_secs(7 * 86400),
            gc_interval: Duration::from_secs(600),
            token_margin: Duration::from_secs(60),
            serve: Default::default(),
            runner: RunnerConfig::new(data_dir),
        }
    }

    /// Reads the configuration; every error names the variable (never a key's value).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let runner = RunnerConfig::from_env(env)?;
        let mut c = Self::new(runner.layout.data_dir.clone());
        c.runner = runner;
        c.listen_addr = match env.get("RUNED_LISTEN") {
            Some(_) => env.listen_addr_or("RUNED_LISTEN", "127.0.0.1:8182")?,
            None => env.listen_addr_or("LISTEN_ADDR", "127.0.0.1:8182")?,
        };
        if let Some(p) = env.path("RUNED_DB") {
            c.db_path = p;
        }
        c.max_containers = env.parse_or("MAX_CONTAINERS", c.max_containers)?;
        c.max_per_tenant = env.parse_or(
            "RUNED_MAX_CONTAINERS_PER_TENANT",
            c.max_containers.div_ceil(2).max(1),
        )?;
        if c.max_per_tenant == 0 {
            return Err(ConfigError::Invalid {
                var: "RUNED_MAX_CONTAINERS_PER_TENANT".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if c.max_containers == 0 || c.max_containers > 10_000 {
            return Err(ConfigError::Invalid {
                var: "MAX_CONTAINERS".into(),
                value: c.max_containers.to_string(),
                reason: "must be between 1 and 10000".into(),
            });
        }
        c.verifier = VerifierConfig::from_env(env)?;
        let listen_var = if env.get("RUNED_LISTEN").is_some() {
            "RUNED_LISTEN"
        } else {
            "LISTEN_ADDR"
        };
        c.verifier.check_open_listen(listen_var, c.listen_addr)?;
        if c.verifier.authd_url.is_some() {
            c.service_key = Some(env.required_secret("AUTHD_SERVICE_KEY")?);
        }
        if let Some(h) = env.get("DOCKER_HOST") {
            c.docker_socket = h
                .strip_prefix("unix://")
                .ok_or_else(|| ConfigError::Invalid {
                    var: "DOCKER_HOST".into(),
                    value: h.into(),
                    reason: "only unix:// sockets are supported".into(),
                })?
                .into();
        }
        c.body_limit = env.size_or("RUNED_BODY_LIMIT", c.body_limit as u64)? as usize;
        c.media_max = env.size_or("RUNED_MEDIA_MAX", c.media_max as u64)? as usize;
        c.media_folder_max = env.size_or("RUNED_MEDIA_FOLDER_MAX", c.media_folder_max)?;
        c.max_wait = env.duration_or("RUNED_MAX_WAIT", c.max_wait)?;
        c.max_queued = env.parse_or("RUNED_MAX_QUEUED", c.max_queued)?;
        c.max_queued_per_folder =
            env.parse_or("RUNED_MAX_QUEUED_PER_FOLDER", c.max_queued_per_folder)?;
        c.max_streams = env.parse_or("RUNED_MAX_STREAMS", c.max_streams)?;
        c.max_streams_per_caller =
            env.parse_or("RUNED_MAX_STREAMS_PER_CALLER", c.max_streams_per_caller)?;
        c.retention = env.duration_or("RUNED_RETENTION", c.retention)?;
        c.gc_interval = env.duration_or("RUNED_GC_INTERVAL", c.gc_interval)?;
        if c.gc_interval < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                var: "RUNED_GC_INTERVAL".into(),
                value: format!("{:?}", c.gc_interval),
                reason: "must be at least 1s".into(),
            });
        }
        c.token_margin = env.duration_or("RUNED_TOKEN_MARGIN", c.token_margin)?;
        c.serve = hako_shared::http::ServeLimits::from_env(env)?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_is_read_and_checked() {
        let env = Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("MAX_CONTAINERS", "7"),
            ("RUNED_LISTEN", "127.0.0.1:9999"),
            ("HAKO_OPEN_DEV", "1"),
        ]);
        let c = Config::from_env(&env).unwrap();
        assert_eq!(c.max_containers, 7);
        assert_eq!(c.listen_addr.port(), 9999);
        assert_eq!(c.db_path, PathBuf::from("/tmp/x/runed.db"));
        assert!(c.verifier.authd_url.is_none());
        let env = Env::from_pairs([("DATA_DIR", "/tmp/x"), ("MAX_CONTAINERS", "0")]);
        assert!(Config::from_env(&env).is_err());
        let env = Env::from_pairs([("DATA_DIR", "/tmp/x"), ("AUTHD_URL", "http://127.0.0.1:1")]);
        let e = Config::from_env(&env).unwrap_err().to_string();
        assert!(e.contains("AUTHD_SERVICE_KEY"), "{e}");
        let env = Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("AUTHD_URL", "http://127.0.0.1:1"),
            ("AUTHD_SERVICE_KEY", ""),
        ]);
        let e = Config::from_env(&env).unwrap_err().to_string();
        assert!(e.contains("AUTHD_SERVICE_KEY is set but empty"), "{e}");
        // The review's finding: an empty AUTHD_URL and a public listen address were open mode.
        for (k, v) in [("AUTHD_URL", ""), ("RUNED_LISTEN", "0.0.0.0:8182")] {
            let env = Env::from_pairs([("DATA_DIR", "/tmp/x"), (k, v)]);
            assert!(Config::from_env(&env).is_err(), "{k}={v:?}");
        }
        let env = Env::from_pairs([
            ("DATA_DIR", "/tmp/x"),
            ("HAKO_OPEN_DEV", "1"),
            ("RUNED_LISTEN", "0.0.0.0:8182"),
        ]);
        let e = Config::from_env(&env).unwrap_err().to_string();
        assert!(e.contains("RUNED_LISTEN") && e.contains("loopback"), "{e}");
    }
}
