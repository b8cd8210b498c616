//! The runner's configuration, parsed once from the environment.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::config::{ConfigError, Env};
use hako_shared::contract::Markers;
use hako_shared::runs::{ByteSize, GroupSpec};

use super::engine::Limits;
use super::mounts::Layout;
use super::mountsec::Allowlist;
use super::safefs::Owner;

/// Host variables that a group's `env_allowlist` may pick from, by default.
pub const DEFAULT_PASSTHROUGH: &str =
    "GIT_AUTHOR_NAME,GIT_AUTHOR_EMAIL,GIT_COMMITTER_NAME,GIT_COMMITTER_EMAIL,GH_TOKEN,TZ,LANG";

/// Warm boxes kept by default when runed reads its environment.
pub const DEFAULT_WARM_MAX: usize = 4;

/// Everything the container runner needs to know.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Where things live, locally and on the Docker host.
    pub layout: Layout,
    /// This install's id (the `io.hako.install` label).
    pub install_id: String,
    /// Image used when a group names none.
    pub default_image: String,
    /// The image of `agent: claude` groups (`RUNED_CLAUDE_IMAGE`).
    pub claude_image: String,
    /// The image of `agent: codex` groups (`RUNED_CODEX_IMAGE`).
    pub codex_image: String,
    /// The OCI runtime of untrusted groups that name none (`RUNED_UNTRUSTED_RUNTIME`, e.g.
    /// `runsc`); `None`: the Docker daemon's default.
    pub untrusted_runtime: Option<String>,
    /// The run ceiling (`RUNED_RUN_TIMEOUT`).
    pub run_timeout: Duration,
    /// Warm boxes kept at most, one per folder (`RUNED_WARM_MAX`; 0: none).
    pub warm_max: usize,
    /// Whether agent images' programs are served from the host (`programs.rs`;
    /// `RUNED_PROGRAM_COPIES`, on in runed's `from_env`), not the library's default (tests,
    /// `hako chat`, which ends with its one box and would leave a copy under way behind).
    pub program_copies: bool,
    /// How long a warm box waits for its folder's next run (`RUNED_WARM_TTL`).
    pub warm_ttl: Duration,
    /// Grace between SIGTERM and SIGKILL when stopping at the ceiling.
    pub stop_grace: Duration,
    /// Grace for a kill on request.
    pub kill_grace: Duration,
    /// The container user, owner of the directories it writes.
    pub agent_user: Owner,
    /// Whether to chown what the host creates (only possible as root).
    pub chown: bool,
    /// Bundled skills.
    pub skills_dir: Option<PathBuf>,
    /// Project directory mounted read-only into main groups.
    pub project_dir: Option<PathBuf>,
    /// Web assets mounted read-only, if any.
    pub web_dir: Option<PathBuf>,
    /// The extra-mount allowlist, if configured.
    pub allowlist: Option<Allowlist>,
    /// Home for `~` in mount paths.
    pub home: Option<PathBuf>,
    /// Output block markers.
    pub markers: Markers,
    /// Default limits.
    pub limits: Limits,
    /// Largest single output block.
    pub max_block: usize,
    /// Cap on stored output per run (every text field of every block counts).
    pub output_cap: usize,
    /// Cap on blocks stored per run.
    pub max_blocks: usize,
    /// Run log files kept per folder (the oldest go first).
    pub log_files: usize,
    /// Cap on kept stderr per run.
    pub log_cap: usize,
    /// Host variables a group may receive, by name (values snapshotted at start).
    pub host_env: BTreeMap<String, String>,
    /// Bound on each Docker API call.
    pub docker_timeout: Duration,
    /// How long a sidecar may take to create its socket.
    pub sidecar_ready: Duration,
    /// How long the agent may wait idle after its output before it is told to close
    /// (`None`: only when the caller closes it).
    pub idle_timeout: Option<Duration>,
    /// How long a steer waits for the agent to take a follow-up.
    pub steer_wait: Duration,
    /// Network used for `network: open`.
    pub open_network: String,
    /// The process that owns the containers when it is not runed (`hako chat`): put on
    /// each container as `io.hako.owner`, so that a later chat can tell a dead owner's
    /// containers from a live one's. `None` for runed (its runs outlive it by design).
    pub owner: Option<String>,
    /// The egress proxy for `network: allowlist` (`RUNED_EGRESS_IMAGE`); `None`: refused.
    pub egress: Option<super::proxy_container::EgressConfig>,
    /// The Docker socket the client talks to (named in errors).
    pub docker_socket: String,
}

impl RunnerConfig {
    /// Defaults for a data directory (tests and the CLI start from here).
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        // Bind sources must be absolute: `./data` becomes `$PWD/data`.
        let data_dir = absolute(data_dir.into());
        let euid = rustix::process::geteuid().as_raw();
        let egid = rustix::process::getegid().as_raw();
        let root = euid == 0;
        Self {
            install_id: install_id_for(&data_dir),
            layout: Layout {
                data_dir,
                host_data_dir: None,
                app_dir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
                host_app_dir: None,
            },
            default_image: "hako-agent:latest".into(),
            claude_image: "hako-claude:latest".into(),
            codex_image: "hako-codex:latest".into(),
            untrusted_runtime: None,
            run_timeout: Duration::from_secs(20 * 60),
            // Off in the library's defaults (tests, `hako chat`); runed's environment turns
            // it on (`from_env`).
            warm_max: 0,
            program_copies: false,
            warm_ttl: Duration::from_secs(10 * 60),
            stop_grace: Duration::from_secs(10),
            kill_grace: Duration::from_secs(2),
            agent_user: if root {
                Owner {
                    uid: 1000,
                    gid: 1000,
                }
            } else {
                Owner {
                    uid: euid,
                    gid: egid,
                }
            },
            chown: root,
            skills_dir: None,
            project_dir: None,
            web_dir: None,
            allowlist: None,
            home: std::env::var_os("HOME").map(PathBuf::from),
            markers: Markers::default(),
            limits: Limits {
                memory: 1 << 30,
                cpus: 2.0,
                pids: 512,
            },
            max_block: 1 << 20,
            output_cap: 4 << 20,
            max_blocks: 1000,
            log_files: 100,
            log_cap: 64 << 10,
            host_env: BTreeMap::new(),
            docker_timeout: Duration::from_secs(30),
            sidecar_ready: Duration::from_secs(10),
            idle_timeout: Some(Duration::ZERO),
            steer_wait: Duration::from_secs(10),
            open_network: "bridge".into(),
            owner: None,
            egress: None,
            docker_socket: super::docker::socket_path(),
        }
    }

    /// Reads the runner's variables (see `specs/runner.md`).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let data_dir = env.path_or("DATA_DIR", "./data");
        let mut c = Self::new(data_dir);
        c.layout.host_data_dir = env.path("HOST_DATA_DIR");
        c.program_copies = env.bool_or("RUNED_PROGRAM_COPIES", true)?;
        if let Some(app) = env.path("HAKO_APP_DIR") {
            c.layout.app_dir = absolute(app);
        }
        c.layout.host_app_dir = env.path("HOST_APP_DIR");
        if let Some(id) = env.get("HAKO_INSTALL_ID") {
            if !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                || id.len() > 64
            {
                return Err(ConfigError::Invalid {
                    var: "HAKO_INSTALL_ID".into(),
                    value: id.into(),
                    reason: "use up to 64 letters, digits, '-' or '_'".into(),
                });
            }
            c.install_id = id.to_owned();
        }
        c.default_image = env.string_or("CONTAINER_IMAGE", &c.default_image);
        c.claude_image = env.string_or("RUNED_CLAUDE_IMAGE", &c.claude_image);
        c.codex_image = env.string_or("RUNED_CODEX_IMAGE", &c.codex_image);
        if let Some(r) = env.get("RUNED_UNTRUSTED_RUNTIME") {
            if !hako_shared::runs::is_runtime_name(r) {
                return Err(ConfigError::Invalid {
                    var: "RUNED_UNTRUSTED_RUNTIME".into(),
                    value: r.into(),
                    reason: "a runtime name the Docker daemon lists (runsc), 1-64 of letters, \
                             digits and . _ -"
                        .into(),
                });
            }
            c.untrusted_runtime = Some(r.to_owned());
        }
        c.run_timeout = env.duration_or("RUNED_RUN_TIMEOUT", c.run_timeout)?;
        if c.run_timeout < Duration::from_secs(1) {
            return Err(ConfigError::Invalid {
                var: "RUNED_RUN_TIMEOUT".into(),
                value: env.get("RUNED_RUN_TIMEOUT").unwrap_or_default().into(),
                reason: "must be at least 1s".into(),
            });
        }
        c.stop_grace = env.duration_or("RUNED_STOP_GRACE", c.stop_grace)?;
        c.warm_max = env.parse_or("RUNED_WARM_MAX", DEFAULT_WARM_MAX)?;
        c.warm_ttl = env.duration_or("RUNED_WARM_TTL", c.warm_ttl)?;
        if c.warm_ttl.is_zero() {
            return Err(ConfigError::Invalid {
                var: "RUNED_WARM_TTL".into(),
                value: env.get("RUNED_WARM_TTL").unwrap_or_default().into(),
                reason: "must be above 0; set RUNED_WARM_MAX=0 to keep no warm boxes".into(),
            });
        }
        c.idle_timeout = match env.get("RUNED_IDLE_TIMEOUT") {
            Some("never") => None,
            _ => Some(env.duration_or("RUNED_IDLE_TIMEOUT", Duration::ZERO)?),
        };
        if let Some(uid) = env.get("HAKO_AGENT_UID") {
            c.agent_user.uid = uid.parse().map_err(|_| ConfigError::Invalid {
                var: "HAKO_AGENT_UID".into(),
                value: uid.into(),
                reason: "expected a numeric uid".into(),
            })?;
            c.agent_user.gid = env.parse_or("HAKO_AGENT_GID", c.agent_user.uid)?;
        }
        c.skills_dir = env
            .path("SKILLS_DIR")
            .or_else(|| Some(c.layout.app_dir.join("agent/skills")).filter(|p| p.is_dir()));
        // Only when asked for: a default (the working directory) could hold DATA_DIR.
        c.project_dir = env.path("HAKO_PROJECT_DIR");
        c.web_dir = env.path("HAKO_WEB_DIR");
        // A read-only mount that holds the data directory would show every tenant's files;
        // one inside it would sit where containers write.
        for (var, dir) in [
            ("SKILLS_DIR", &c.skills_dir),
            ("HAKO_PROJECT_DIR", &c.project_dir),
            ("HAKO_WEB_DIR", &c.web_dir),
        ] {
            if let Some(d) = dir
                && overlaps(d, &c.layout.data_dir)
            {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: d.display().to_string(),
                    reason: format!(
                        "overlaps DATA_DIR ({}); mount a directory outside it",
                        c.layout.data_dir.display()
                    ),
                });
            }
        }
        let default_allowlist = c
            .home
            .as_ref()
            .map(|h| h.join(".config/hako/mount-allowlist.json"));
        let allowlist_path = env
            .path("HAKO_MOUNT_ALLOWLIST")
            .or(default_allowlist.filter(|p| p.exists()));
        if let Some(p) = allowlist_path {
            let roots = [c.layout.data_dir.as_path()];
            c.allowlist = Some(
                Allowlist::load(&p, &roots).map_err(|e| ConfigError::Invalid {
                    var: "HAKO_MOUNT_ALLOWLIST".into(),
                    value: p.display().to_string(),
                    reason: e.to_string(),
                })?,
            );
        }
        if let Some(prefix) = env.get("HAKO_OUTPUT_MARKER_PREFIX") {
            c.markers = Markers::for_prefix(prefix);
        }
        // The install's defaults obey the bounds every group's limits obey.
        let memory = env.size_or("CONTAINER_MEMORY", c.limits.memory as u64)?;
        let cpus: f64 = env.parse_or("CONTAINER_CPUS", c.limits.cpus)?;
        let pids: i64 = env.parse_or("CONTAINER_PIDS", c.limits.pids)?;
        let as_group = GroupSpec {
            memory: Some(ByteSize(memory)),
            cpus: Some(cpus),
            pids: Some(pids),
            ..GroupSpec::default()
        };
        if let Err(e) = as_group.validate() {
            let var = match e.field.as_str() {
                "memory" => "CONTAINER_MEMORY",
                "cpus" => "CONTAINER_CPUS",
                _ => "CONTAINER_PIDS",
            };
            return Err(ConfigError::Invalid {
                var: var.into(),
                value: env.get(var).unwrap_or_default().into(),
                reason: e.reason,
            });
        }
        c.limits = as_group.limits(&c.limits);
        c.output_cap = env.size_or("RUNED_OUTPUT_CAP", c.output_cap as u64)? as usize;
        c.max_block = env.size_or("RUNED_MAX_BLOCK", c.max_block as u64)? as usize;
        c.max_blocks = env.parse_or("RUNED_MAX_BLOCKS", c.max_blocks)?;
        c.log_files = env.parse_or("RUNED_LOG_FILES", c.log_files)?;
        for (var, v) in [
            ("RUNED_MAX_BLOCKS", c.max_blocks),
            ("RUNED_LOG_FILES", c.log_files),
        ] {
            if v == 0 {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: "0".into(),
                    reason: "must be at least 1".into(),
                });
            }
        }
        c.open_network = env.string_or("RUNED_OPEN_NETWORK", &c.open_network);
        c.egress = super::proxy_container::EgressConfig::from_env(env)?;
        let passthrough = env.string_or("HAKO_ENV_PASSTHROUGH", DEFAULT_PASSTHROUGH);
        c.host_env = passthrough
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .filter_map(|n| env.get(n).map(|v| (n.to_owned(), v.to_owned())))
            .collect();
        Ok(c)
    }

    /// The ceiling for a run that asks for `requested` (never above the configured one).
    pub fn ceiling(&self, requested: Option<Duration>) -> Duration {
        requested
            .map_or(self.run_timeout, |r| r.min(self.run_timeout))
            .max(Duration::from_secs(1))
    }
}

/// `ARIZUKO_QUERY_TIMEOUT_MS` for a ceiling: 30 s less, so the agent can deliver a summary
/// before it is stopped. Short ceilings (tests) keep three quarters for the agent.
pub fn query_timeout(ceiling: Duration) -> Duration {
    let margin = Duration::from_secs(30).min(ceiling / 4);
    ceiling - margin
}

/// A stable install id from the data directory, so two installs on one host differ.
pub fn install_id_for(data_dir: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let canon = std::fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_owned());
    let d = Sha256::digest(canon.to_string_lossy().as_bytes());
    d.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// Whether one path contains the other, compared as resolved paths where they exist.
fn overlaps(a: &std::path::Path, b: &std::path::Path) -> bool {
    let real =
        |p: &std::path::Path| std::fs::canonicalize(p).unwrap_or_else(|_| absolute(p.to_owned()));
    let (a, b) = (real(a), real(b));
    a.starts_with(&b) || b.starts_with(&a)
}

/// `path` made absolute against the working directory (unchanged if that is unknown).
fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_math() {
        assert_eq!(
            query_timeout(Duration::from_secs(1200)),
            Duration::from_secs(1170)
        );
        assert_eq!(
            query_timeout(Duration::from_secs(4)),
            Duration::from_secs(3)
        );
        let c = RunnerConfig::new("/tmp/x");
        assert_eq!(c.ceiling(Some(Duration::from_secs(3600))), c.run_timeout);
        assert_eq!(
            c.ceiling(Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn env_errors_name_the_variable() {
        let bad = |k: &str, v: &str| {
            RunnerConfig::from_env(&Env::from_pairs([(k, v)]))
                .unwrap_err()
                .to_string()
        };
        assert!(bad("RUNED_RUN_TIMEOUT", "soon").contains("RUNED_RUN_TIMEOUT"));
        assert!(bad("RUNED_RUN_TIMEOUT", "0").contains("at least 1s"));
        assert!(bad("CONTAINER_MEMORY", "lots").contains("CONTAINER_MEMORY"));
        assert!(bad("CONTAINER_MEMORY", "0").contains("CONTAINER_MEMORY"));
        assert!(bad("CONTAINER_CPUS", "0").contains("CONTAINER_CPUS"));
        assert!(bad("CONTAINER_PIDS", "-1").contains("CONTAINER_PIDS"));
        assert!(bad("HAKO_AGENT_UID", "bob").contains("HAKO_AGENT_UID"));
        assert!(bad("HAKO_INSTALL_ID", "a b").contains("HAKO_INSTALL_ID"));
        assert!(
            bad("HAKO_MOUNT_ALLOWLIST", "/nonexistent/x.json").contains("HAKO_MOUNT_ALLOWLIST")
        );
        let overlap = |k: &str, v: &str| {
            RunnerConfig::from_env(&Env::from_pairs([("DATA_DIR", "/srv/hako/data"), (k, v)]))
                .unwrap_err()
                .to_string()
        };
        assert!(overlap("HAKO_PROJECT_DIR", "/srv/hako").contains("overlaps DATA_DIR"));
        assert!(overlap("HAKO_WEB_DIR", "/srv/hako/data/web").contains("HAKO_WEB_DIR"));
        assert!(overlap("SKILLS_DIR", "/").contains("SKILLS_DIR"));
        let c = RunnerConfig::from_env(&Env::from_pairs([("DATA_DIR", "/srv/hako/data")])).unwrap();
        assert_eq!(c.project_dir, None, "no project mount unless asked for");
    }

    #[test]
    fn passthrough_snapshot_only_named_vars() {
        let env = Env::from_pairs([
            ("GIT_AUTHOR_NAME", "a"),
            ("AUTHD_SERVICE_KEY", "secret"),
            ("DATA_DIR", "/tmp/d"),
        ]);
        let c = RunnerConfig::from_env(&env).unwrap();
        assert_eq!(
            c.host_env.keys().collect::<Vec<_>>(),
            vec!["GIT_AUTHOR_NAME"]
        );
        assert_ne!(
            install_id_for(std::path::Path::new("/a")),
            install_id_for(std::path::Path::new("/b"))
        );
    }
}
