//! The agent's settings, read once from the environment at start.

use std::path::PathBuf;
use std::time::Duration;

use hako_shared::config::{ConfigError, Env};
use hako_shared::contract::{
    API_SOCKET, INPUT_DIR, LLM_API_ENV, MARKER_END_ENV, MARKER_START_ENV, MCP_SOCKET, MODEL_ENV,
    Markers, QUERY_TIMEOUT_ENV, WARM_ENV,
};
use hako_shared::runs::LlmApi;

use crate::brain::harness::Settings as CliSettings;
use crate::brain::llm::LlmSettings;

/// Overrides the follow-up directory (tests outside a container).
pub const INPUT_DIR_ENV: &str = "HAKO_INPUT_DIR";
/// Overrides the MCP socket path.
pub const MCP_SOCKET_ENV: &str = "HAKO_MCP_SOCKET";
/// Chooses the brain: `script` (the default without a model), `llm` (the default with one),
/// `claude` (Claude Code) or `codex` (Codex; both need a model).
pub use hako_shared::contract::BRAIN_ENV;
/// The `claude` program the Claude Code brain runs.
pub const CLAUDE_BIN_ENV: &str = "HAKO_CLAUDE_BIN";
/// The `codex` program the Codex brain runs.
pub const CODEX_BIN_ENV: &str = "HAKO_CODEX_BIN";
/// Overrides the gateway socket.
pub const API_SOCKET_ENV: &str = "HAKO_API_SOCKET";
/// Output tokens per model step (default 4096).
pub const MAX_TOKENS_ENV: &str = "HAKO_LLM_MAX_TOKENS";
/// Model steps per query (default 25).
pub const MAX_STEPS_ENV: &str = "HAKO_LLM_MAX_STEPS";
/// Where the LLM brain keeps sessions (default `$HOME/.hako/sessions`).
pub const SESSION_DIR_ENV: &str = "HAKO_SESSION_DIR";
/// Overrides the follow-up poll interval in milliseconds (default 500).
pub const POLL_INTERVAL_ENV: &str = "HAKO_POLL_INTERVAL_MS";

/// The default follow-up poll interval of the container contract.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Which brain answers queries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BrainKind {
    /// The deterministic script brain (echo plus test commands).
    Script,
    /// A model through routd's gateway.
    Llm(LlmSettings),
    /// Claude Code, its model through routd's gateway.
    Claude(CliSettings),
    /// Codex, its model through routd's gateway.
    Codex(CliSettings),
}

/// Everything the agent reads from its environment.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Block markers.
    pub markers: Markers,
    /// The follow-up directory.
    pub input_dir: PathBuf,
    /// The MCP socket that `/mcp` talks to.
    pub mcp_socket: PathBuf,
    /// The query deadline, measured from process start; `None` when unset or 0.
    pub query_timeout: Option<Duration>,
    /// How often the follow-up directory is listed when no signal arrives.
    pub poll_interval: Duration,
    /// The brain.
    pub brain: BrainKind,
    /// A warm box (`HAKO_WARM=1`): started before its turn, so the wait for the input has no
    /// deadline, and the deadline counts from the input's arrival.
    pub warm: bool,
}

/// Markers alone: they are needed to report every other configuration error, so they can
/// never fail (an unset or empty variable means the default).
pub fn markers(env: &Env) -> Markers {
    let default = Markers::default();
    Markers {
        start: env.string_or(MARKER_START_ENV, &default.start),
        end: env.string_or(MARKER_END_ENV, &default.end),
    }
}

impl BrainKind {
    /// For the start line of the log.
    pub fn describe(&self) -> String {
        match self {
            BrainKind::Script => "script".into(),
            BrainKind::Llm(l) => format!("llm ({} {})", l.api, l.model),
            BrainKind::Claude(c) => format!("claude ({})", c.model),
            BrainKind::Codex(c) => format!("codex ({})", c.model),
        }
    }
}

fn brain(env: &Env) -> Result<BrainKind, ConfigError> {
    let model = env.get(MODEL_ENV);
    let default = if model.is_some() { "llm" } else { "script" };
    match env.get(BRAIN_ENV).unwrap_or(default) {
        "script" => Ok(BrainKind::Script),
        "llm" => {
            let model = model.ok_or_else(|| ConfigError::Required {
                var: MODEL_ENV.into(),
                hint: "the llm brain needs a model (the group's `llm.model`)".into(),
            })?;
            let api = match env.get(LLM_API_ENV).unwrap_or("anthropic") {
                "anthropic" => LlmApi::Anthropic,
                "openai" => LlmApi::Openai,
                other => {
                    return Err(ConfigError::Invalid {
                        var: LLM_API_ENV.into(),
                        value: other.into(),
                        reason: "expected anthropic or openai".into(),
                    });
                }
            };
            let max_tokens: u32 = env.parse_or(MAX_TOKENS_ENV, 4096)?;
            let max_steps: u32 = env.parse_or(MAX_STEPS_ENV, 25)?;
            for (var, v) in [(MAX_TOKENS_ENV, max_tokens), (MAX_STEPS_ENV, max_steps)] {
                if v == 0 {
                    return Err(ConfigError::Invalid {
                        var: var.into(),
                        value: "0".into(),
                        reason: "must be at least 1".into(),
                    });
                }
            }
            let home = env.path_or("HOME", "/home/agent");
            Ok(BrainKind::Llm(LlmSettings {
                api,
                model: model.to_owned(),
                socket: env.path_or(API_SOCKET_ENV, API_SOCKET),
                max_tokens,
                max_steps,
                sessions: env.path_or(SESSION_DIR_ENV, home.join(".hako/sessions")),
            }))
        }
        kind @ ("claude" | "codex") => {
            let (name, bin_env, bin) = match kind {
                "claude" => ("Claude Code", CLAUDE_BIN_ENV, "/usr/local/bin/claude"),
                _ => ("Codex", CODEX_BIN_ENV, "/usr/local/bin/codex"),
            };
            let model = model.ok_or_else(|| ConfigError::Required {
                var: MODEL_ENV.into(),
                hint: format!("{name} needs a model (the group's `llm.model`)"),
            })?;
            let settings = CliSettings {
                model: model.to_owned(),
                program: env.path_or(bin_env, bin),
                api_socket: env.path_or(API_SOCKET_ENV, API_SOCKET),
                mcp_socket: env.path_or(MCP_SOCKET_ENV, MCP_SOCKET),
                home: env.path_or("HOME", "/home/agent"),
                bridge: std::env::current_exe()
                    .unwrap_or_else(|_| PathBuf::from("/usr/local/bin/hako-agent")),
                plugin_dir: PathBuf::from(hako_shared::contract::SKILLS_PLUGIN_DIR),
            };
            Ok(if kind == "claude" {
                BrainKind::Claude(settings)
            } else {
                BrainKind::Codex(settings)
            })
        }
        other => Err(ConfigError::Invalid {
            var: BRAIN_ENV.into(),
            value: other.into(),
            reason: "unknown brain; expected script, llm, claude or codex".into(),
        }),
    }
}

impl AgentConfig {
    /// The query deadline: the input's own (counted from its arrival), else the env's,
    /// counted from the process start, or from the input's arrival in a warm box.
    pub fn deadline(
        &self,
        input_timeout_ms: Option<u64>,
        started: std::time::Instant,
        arrived: std::time::Instant,
    ) -> Option<std::time::Instant> {
        match input_timeout_ms.filter(|ms| *ms > 0) {
            Some(ms) => Some(arrived + Duration::from_millis(ms)),
            None if self.warm => self.query_timeout.map(|t| arrived + t),
            None => self.query_timeout.map(|t| started + t),
        }
    }

    /// Reads the configuration; a bad value names its variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let timeout_ms: u64 = env.parse_or(QUERY_TIMEOUT_ENV, 0)?;
        let poll_ms: u64 =
            env.parse_or(POLL_INTERVAL_ENV, DEFAULT_POLL_INTERVAL.as_millis() as u64)?;
        if poll_ms == 0 {
            return Err(ConfigError::Invalid {
                var: POLL_INTERVAL_ENV.into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        let brain = brain(env)?;
        Ok(Self {
            markers: markers(env),
            input_dir: env.path_or(INPUT_DIR_ENV, INPUT_DIR),
            mcp_socket: env.path_or(MCP_SOCKET_ENV, MCP_SOCKET),
            query_timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
            poll_interval: Duration::from_millis(poll_ms),
            brain,
            warm: env.get(WARM_ENV) == Some("1"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = AgentConfig::from_env(&Env::from_pairs::<&str, &str>([])).unwrap();
        assert_eq!(c.markers, Markers::default());
        assert_eq!(c.input_dir, PathBuf::from("/workspace/ipc/input"));
        assert_eq!(c.mcp_socket, PathBuf::from("/var/run/pub/arizuko/mcp.sock"));
        assert_eq!(c.query_timeout, None);
        assert_eq!(c.poll_interval, Duration::from_millis(500));
        assert_eq!(c.brain, BrainKind::Script);
    }

    #[test]
    fn overrides() {
        let c = AgentConfig::from_env(&Env::from_pairs([
            ("HAKO_OUTPUT_START_MARKER", "---NANOCLAW_OUTPUT_START---"),
            ("HAKO_OUTPUT_END_MARKER", "---NANOCLAW_OUTPUT_END---"),
            ("ARIZUKO_QUERY_TIMEOUT_MS", "1500"),
            ("HAKO_INPUT_DIR", "/tmp/in"),
            ("HAKO_MCP_SOCKET", "/tmp/mcp.sock"),
            ("HAKO_POLL_INTERVAL_MS", "20"),
        ]))
        .unwrap();
        assert_eq!(c.markers, Markers::for_prefix("NANOCLAW"));
        assert_eq!(c.query_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(c.input_dir, PathBuf::from("/tmp/in"));
        assert_eq!(c.mcp_socket, PathBuf::from("/tmp/mcp.sock"));
        assert_eq!(c.poll_interval, Duration::from_millis(20));
    }

    #[test]
    fn the_deadline_counts_from_the_turn_in_a_warm_box() {
        let started = std::time::Instant::now();
        let arrived = started + Duration::from_secs(600);
        let cold = AgentConfig::from_env(&Env::from_pairs([("ARIZUKO_QUERY_TIMEOUT_MS", "1500")]))
            .unwrap();
        assert!(!cold.warm);
        let ms = Duration::from_millis;
        assert_eq!(
            cold.deadline(None, started, arrived),
            Some(started + ms(1500))
        );
        assert_eq!(
            cold.deadline(Some(0), started, arrived),
            Some(started + ms(1500))
        );
        assert_eq!(
            cold.deadline(Some(900), started, arrived),
            Some(arrived + ms(900))
        );
        let warm = AgentConfig::from_env(&Env::from_pairs([
            ("ARIZUKO_QUERY_TIMEOUT_MS", "1500"),
            ("HAKO_WARM", "1"),
        ]))
        .unwrap();
        assert!(warm.warm);
        assert_eq!(
            warm.deadline(None, started, arrived),
            Some(arrived + ms(1500))
        );
        assert_eq!(
            warm.deadline(Some(900), started, arrived),
            Some(arrived + ms(900))
        );
        let none = AgentConfig::from_env(&Env::from_pairs([("HAKO_WARM", "1")])).unwrap();
        assert_eq!(none.deadline(None, started, arrived), None);
    }

    #[test]
    fn bad_values_name_the_variable() {
        let err = AgentConfig::from_env(&Env::from_pairs([("HAKO_BRAIN", "llm")])).unwrap_err();
        assert!(err.to_string().contains("HAKO_MODEL"), "{err}");
        for (var, value) in [
            ("HAKO_BRAIN", "gpt"),
            ("ARIZUKO_QUERY_TIMEOUT_MS", "soon"),
            ("HAKO_POLL_INTERVAL_MS", "0"),
        ] {
            let err = AgentConfig::from_env(&Env::from_pairs([(var, value)])).unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn a_model_chooses_the_llm_brain() {
        let c = AgentConfig::from_env(&Env::from_pairs([("HAKO_MODEL", "claude-x")])).unwrap();
        let BrainKind::Llm(l) = c.brain else {
            panic!("{:?}", c.brain)
        };
        assert_eq!(
            (l.api, l.model.as_str(), l.max_tokens, l.max_steps),
            (LlmApi::Anthropic, "claude-x", 4096, 25)
        );
        assert_eq!(l.socket, PathBuf::from("/var/run/pub/arizuko/api.sock"));
        assert_eq!(l.sessions, PathBuf::from("/home/agent/.hako/sessions"));
        let c = AgentConfig::from_env(&Env::from_pairs([
            ("HAKO_MODEL", "m"),
            ("HAKO_BRAIN", "script"),
        ]))
        .unwrap();
        assert_eq!(c.brain, BrainKind::Script);
        for (var, value) in [
            ("HAKO_LLM_API", "gemini"),
            ("HAKO_LLM_MAX_STEPS", "0"),
            ("HAKO_LLM_MAX_TOKENS", "x"),
        ] {
            let err = AgentConfig::from_env(&Env::from_pairs([("HAKO_MODEL", "m"), (var, value)]))
                .unwrap_err();
            assert!(err.to_string().contains(var), "{err}");
        }
    }

    #[test]
    fn zero_timeout_means_none() {
        let c =
            AgentConfig::from_env(&Env::from_pairs([("ARIZUKO_QUERY_TIMEOUT_MS", "0")])).unwrap();
        assert_eq!(c.query_timeout, None);
    }
}
