//! Wire types of runs: what a caller asks runed for (`RunRequest`, `GroupSpec`) and what it
//! reports back (`RunState`, `Outcome`, `RunStatus`). Field names are the wire's (`runed/openapi.json`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::contract::{Message, OutputBlock, Secrets};
use crate::folder::GroupFolder;
use crate::ids::{RunId, TurnId};

/// A duration written as text (`20m`, `30s`, `1h30m`) on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HumanDuration(pub Duration);

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self.0;
        let text = if d.subsec_millis() != 0 || d.as_secs() == 0 {
            format!("{}ms", d.as_millis())
        } else {
            format!("{}s", d.as_secs())
        };
        s.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        crate::config::parse_duration(&raw)
            .map(HumanDuration)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for HumanDuration {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::string(
            "A duration: a number and a unit (ms, s, m, h, d), several in a row",
            Some("^([0-9]+(ms|s|m|h|d))+$"),
            "5m",
        )
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for HumanDuration {}

/// A byte size written as text (`1g`, `512m`) on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        crate::config::parse_size(&raw)
            .map(ByteSize)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for ByteSize {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::string(
            "A size in bytes, with an optional unit (k, m, g, t)",
            Some("^[0-9]+[kmgtKMGT]?$"),
            "512m",
        )
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for ByteSize {}

/// How much a group is trusted.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// An ordinary group: `groups/global/` read-only, no project mount, no `GH_TOKEN`.
    #[default]
    Untrusted,
    /// The operator's own group: the project mounted read-only, `GH_TOKEN` allowed.
    Main,
}

/// A group's network policy.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// No network at all (the default).
    #[default]
    None,
    /// Only the hosts of the egress allowlist, through the egress proxy.
    Allowlist,
    /// Unrestricted outbound network.
    Open,
}

/// An extra host directory a group asks to mount at `/workspace/extra/<container_path>/`.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtraMount {
    /// The host directory (`~` is the daemon user's home).
    pub host_path: String,
    /// The name under `/workspace/extra/`.
    pub container_path: String,
    /// Read-only unless `false` and both the allowlist root and the group allow writes.
    #[serde(default = "yes")]
    pub readonly: bool,
}

fn yes() -> bool {
    true
}

/// A per-group MCP sidecar container, started before the agent and removed after it.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SidecarSpec {
    /// Name: the socket is `sidecars/<name>.sock` and the MCP server entry is `<name>`.
    pub name: String,
    /// Image to run.
    pub image: String,
    /// Command (arguments to the image's entrypoint); `{socket}` is replaced by the socket path.
    #[serde(default)]
    pub command: Vec<String>,
    /// Memory limit (default 256m).
    #[serde(default)]
    pub memory: Option<ByteSize>,
    /// CPU limit (default 0.5).
    #[serde(default)]
    pub cpus: Option<f64>,
}

/// A group's container settings, as sent with each run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// Trust level.
    #[serde(default)]
    pub trust: Trust,
    /// Network policy.
    #[serde(default)]
    pub network: Network,
    /// What `network: allowlist` reaches through the egress proxy: `host`, `*.suffix` or an
    /// IPv4 address, each with an optional `:port` (default 443 and 80). See `specs/egress.md`.
    #[serde(default)]
    pub egress_allowlist: Vec<String>,
    /// Brokered secrets (`network: allowlist` only): each names a secret the operator set
    /// (`hako secrets set`) and the hosts (on `egress_allowlist`) its value may be sent to.
    /// The box's environment gets a per-run placeholder under the secret's name; the egress
    /// proxy puts the value in its place on the wire to those hosts (`specs/egress.md`).
    #[serde(default)]
    pub secrets: Vec<crate::secrets::SecretBinding>,
    /// Run ceiling (defaults to `RUNED_RUN_TIMEOUT`; never above it).
    #[serde(default)]
    pub timeout: Option<HumanDuration>,
    /// Memory limit (default 1g).
    #[serde(default)]
    pub memory: Option<ByteSize>,
    /// CPU limit (default 2).
    #[serde(default)]
    pub cpus: Option<f64>,
    /// Process limit.
    #[serde(default)]
    pub pids: Option<i64>,
    /// Extra mounts, validated against the mount allowlist.
    #[serde(default)]
    pub mounts: Vec<ExtraMount>,
    /// MCP sidecars.
    #[serde(default)]
    pub sidecars: Vec<SidecarSpec>,
    /// Names of host variables written to the group's env file.
    #[serde(default)]
    pub env_allowlist: Vec<String>,
    /// Image (defaults to `CONTAINER_IMAGE`).
    #[serde(default)]
    pub image: Option<String>,
    /// The model the agent calls through routd's gateway, and the group's daily budget.
    #[serde(default)]
    pub llm: Option<LlmSpec>,
    /// Which agent answers: hako-agent's own brains (default), Claude Code (`claude`: the
    /// `hako-claude` image, its model through the gateway; needs `llm`, Anthropic format) or
    /// Codex (`codex`: the `hako-codex` image; needs `llm`, OpenAI format).
    #[serde(default)]
    pub agent: AgentKind,
    /// The OCI runtime its containers run under (a name the Docker daemon lists, e.g.
    /// `runsc` for gVisor); default: runed's `RUNED_UNTRUSTED_RUNTIME` for untrusted groups,
    /// Docker's default otherwise.
    #[serde(default)]
    pub runtime: Option<String>,
    /// `false`: runed keeps no warm box for this group, and each of its turns starts a fresh
    /// container. Default: a warm box when the install keeps them (`RUNED_WARM_MAX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<bool>,
}

/// The agent program a group runs.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentKind {
    /// hako-agent (the script brain, or its LLM brain with `llm`) in `CONTAINER_IMAGE`.
    #[default]
    Hako,
    /// Claude Code in the `hako-claude` image (`RUNED_CLAUDE_IMAGE`).
    Claude,
    /// OpenAI's Codex in the `hako-codex` image (`RUNED_CODEX_IMAGE`).
    Codex,
}

impl AgentKind {
    /// For a CLI agent, the wire format its program speaks (the group's `llm.api` must be
    /// it), its name on the wire, and the runed variable naming its image.
    pub fn program(self) -> Option<(LlmApi, &'static str, &'static str)> {
        match self {
            AgentKind::Hako => None,
            AgentKind::Claude => Some((LlmApi::Anthropic, "claude", "RUNED_CLAUDE_IMAGE")),
            AgentKind::Codex => Some((LlmApi::Openai, "codex", "RUNED_CODEX_IMAGE")),
        }
    }
}

/// Whether `name` can be an OCI runtime's name in Docker's configuration.
pub fn is_runtime_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The wire format an agent speaks to the LLM gateway, and so the provider it reaches.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LlmApi {
    /// Anthropic Messages (`POST /v1/messages`).
    #[default]
    Anthropic,
    /// OpenAI-compatible chat completions (`POST /v1/chat/completions`).
    Openai,
}

// The names on the wire and in metrics.
crate::wire_names!(LlmApi { Anthropic => "anthropic", Openai => "openai" });

/// A group's model: which one its agent asks for, in which wire format, and how many tokens
/// (input and output) its turns may spend per UTC day through the gateway.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmSpec {
    /// The provider's model name (`claude-sonnet-4-5`, `gpt-4.1`).
    pub model: String,
    /// The wire format (default `anthropic`).
    #[serde(default)]
    pub api: LlmApi,
    /// Tokens per UTC day (default: routd's `ROUTD_LLM_DAILY_TOKENS`).
    #[serde(default)]
    pub daily_tokens: Option<u64>,
}

/// The longest model name accepted.
pub const MAX_MODEL_NAME: usize = 128;

/// A container's resource limits: the install's defaults, or a group's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Bytes of memory (swap is not granted on top).
    pub memory: i64,
    /// CPUs, fractional.
    pub cpus: f64,
    /// Maximum number of processes.
    pub pids: i64,
}

/// The smallest memory limit Docker accepts (6 MiB).
pub const MIN_MEMORY: u64 = 6 << 20;
/// The largest memory limit accepted (1 TiB): more is a typo, not a plan.
pub const MAX_MEMORY: u64 = 1 << 40;
/// The smallest CPU limit accepted.
pub const MIN_CPUS: f64 = 0.01;
/// The largest CPU limit accepted.
pub const MAX_CPUS: f64 = 1024.0;
/// The largest process limit accepted.
pub const MAX_PIDS: i64 = 1 << 22;
/// The shortest run ceiling a group may ask for.
pub const MIN_TIMEOUT: Duration = Duration::from_secs(1);

/// A group setting that cannot be used, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct GroupSpecError {
    /// The field, e.g. `memory` or `sidecars[0].cpus`.
    pub field: String,
    /// What is wrong.
    pub reason: String,
}

fn check(ok: bool, field: impl Into<String>, reason: String) -> Result<(), GroupSpecError> {
    if ok {
        Ok(())
    } else {
        Err(GroupSpecError {
            field: field.into(),
            reason,
        })
    }
}

fn check_memory(m: ByteSize, field: String) -> Result<(), GroupSpecError> {
    check(
        (MIN_MEMORY..=MAX_MEMORY).contains(&m.0),
        field,
        format!("must be between 6m and 1t bytes, not {}", m.0),
    )
}

fn check_cpus(c: f64, field: String) -> Result<(), GroupSpecError> {
    // Docker reads 0 as "no limit"; NaN and infinities are never meant.
    check(
        c.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&c),
        field,
        format!("must be between {MIN_CPUS} and {MAX_CPUS}, not {c}"),
    )
}

impl GroupSpec {
    /// Refuses values that are never meant, for every caller: limits of 0 or below (Docker
    /// reads them as "unlimited"), absurd sizes, a zero timeout. The error names the field.
    pub fn validate(&self) -> Result<(), GroupSpecError> {
        if let Some(m) = self.memory {
            check_memory(m, "memory".into())?;
        }
        if let Some(c) = self.cpus {
            check_cpus(c, "cpus".into())?;
        }
        if let Some(p) = self.pids {
            check(
                (1..=MAX_PIDS).contains(&p),
                "pids",
                format!("must be between 1 and {MAX_PIDS}, not {p}"),
            )?;
        }
        if let Some(t) = self.timeout {
            check(t.0 >= MIN_TIMEOUT, "timeout", "must be at least 1s".into())?;
        }
        if let Some(l) = &self.llm {
            // It reaches the container's environment: a plain name, nothing else.
            check(
                !l.model.is_empty()
                    && l.model.len() <= MAX_MODEL_NAME
                    && l.model
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._:/@-".contains(&b)),
                "llm.model",
                format!("must be 1-{MAX_MODEL_NAME} characters of letters, digits and . _ : / @ -"),
            )?;
            check(
                l.daily_tokens != Some(0),
                "llm.daily_tokens",
                "must be at least 1 (leave it out for routd's default)".into(),
            )?;
        }
        if let Some(r) = &self.runtime {
            check(
                is_runtime_name(r),
                "runtime",
                "must be 1-64 of letters, digits and . _ - (a runtime the Docker daemon lists)"
                    .into(),
            )?;
        }
        if let Some((api, name, image)) = self.agent.program() {
            check(
                self.llm.as_ref().is_some_and(|l| l.api == api),
                "agent",
                format!("{name} needs llm (a model in the {api} format: its program speaks it)"),
            )?;
            check(
                self.image.is_none(),
                "image",
                format!("agent {name} runs the hako-{name} image ({image}); leave image out"),
            )?;
        }
        check(
            self.egress_allowlist.len() <= crate::allowlist::MAX_ENTRIES,
            "egress_allowlist",
            format!("at most {} entries", crate::allowlist::MAX_ENTRIES),
        )?;
        for (i, e) in self.egress_allowlist.iter().enumerate() {
            if let Err(why) = crate::allowlist::EgressRule::parse(e) {
                return Err(GroupSpecError {
                    field: format!("egress_allowlist[{i}]"),
                    reason: why,
                });
            }
        }
        self.validate_secrets()?;
        for (i, s) in self.sidecars.iter().enumerate() {
            if let Some(m) = s.memory {
                check_memory(m, format!("sidecars[{i}].memory"))?;
            }
            if let Some(c) = s.cpus {
                check_cpus(c, format!("sidecars[{i}].cpus"))?;
            }
        }
        Ok(())
    }

    /// A group's brokered secrets: at most [`crate::secrets::MAX_SECRETS`], each named once,
    /// not also in `env_allowlist`, only with `network: allowlist`, each bound to 1 to
    /// [`crate::secrets::MAX_HOSTS`] exact host names that `egress_allowlist` allows.
    fn validate_secrets(&self) -> Result<(), GroupSpecError> {
        use crate::secrets::{MAX_HOSTS, MAX_SECRETS};
        if self.secrets.is_empty() {
            return Ok(());
        }
        check(
            self.network == Network::Allowlist,
            "secrets",
            "need network: allowlist (the egress proxy puts their values on the wire)".into(),
        )?;
        check(
            self.secrets.len() <= MAX_SECRETS,
            "secrets",
            format!("at most {MAX_SECRETS} secrets"),
        )?;
        for (i, s) in self.secrets.iter().enumerate() {
            let name = s.name.as_str();
            check(
                !self.secrets[..i].iter().any(|o| o.name == s.name),
                format!("secrets[{i}].name"),
                format!("{name} is named twice"),
            )?;
            check(
                !self.env_allowlist.iter().any(|e| e == name),
                format!("secrets[{i}].name"),
                format!(
                    "{name} is also in env_allowlist, which would hand its value to the box: take it out of env_allowlist"
                ),
            )?;
            check(
                !s.hosts.is_empty() && s.hosts.len() <= MAX_HOSTS,
                format!("secrets[{i}].hosts"),
                format!("1 to {MAX_HOSTS} hosts"),
            )?;
            let hosts = s.parsed_hosts().map_err(|(j, reason)| GroupSpecError {
                field: format!("secrets[{i}].hosts[{j}]"),
                reason,
            })?;
            for (j, h) in hosts.iter().enumerate() {
                let target = crate::allowlist::TargetHost::Name(h.name.clone());
                check(
                    crate::allowlist::allowing(
                        self.egress_allowlist.iter().map(String::as_str),
                        &target,
                        h.port,
                    )
                    .is_some(),
                    format!("secrets[{i}].hosts[{j}]"),
                    format!(
                        "{h} is not on egress_allowlist: a value goes only where the run may go"
                    ),
                )?;
            }
        }
        Ok(())
    }

    /// The fields with which this spec asks for more than a folder-bound caller may: such a
    /// caller may only tighten the install's `defaults` (memory, CPUs, processes; the run
    /// ceiling is tighten-only for everyone), and may set nothing else. Every field is named
    /// here, so a field added later does not compile until it is given its rule.
    pub fn beyond(&self, defaults: &Limits) -> Vec<&'static str> {
        let GroupSpec {
            trust,
            network,
            egress_allowlist,
            secrets,
            timeout: _, // clamped to RUNED_RUN_TIMEOUT for every caller
            memory,
            cpus,
            pids,
            mounts,
            sidecars,
            env_allowlist,
            image,
            llm,
            agent,
            runtime,
            warm: _, // asks for nothing: a box the install keeps anyway, or none
        } = self;
        let mut v = Vec::new();
        let mut flag = |widens: bool, name| {
            if widens {
                v.push(name);
            }
        };
        flag(*trust != Trust::Untrusted, "trust");
        flag(*network != Network::None, "network");
        flag(!egress_allowlist.is_empty(), "egress_allowlist");
        // The operator's secrets: only the operator lends them to a group.
        flag(!secrets.is_empty(), "secrets");
        flag(
            memory.is_some_and(|m| m.0 > defaults.memory.max(0) as u64),
            "memory",
        );
        flag(cpus.is_some_and(|c| c > defaults.cpus), "cpus");
        flag(pids.is_some_and(|p| p > defaults.pids), "pids");
        flag(!mounts.is_empty(), "mounts");
        flag(!sidecars.is_empty(), "sidecars");
        flag(!env_allowlist.is_empty(), "env_allowlist");
        flag(image.is_some(), "image");
        // A model costs money: only the operator (through routd's group config) picks it.
        flag(llm.is_some(), "llm");
        flag(*agent != AgentKind::Hako, "agent");
        // The runtime is the box itself: the operator's.
        flag(runtime.is_some(), "runtime");
        v
    }

    /// This group's limits: the ones it sets, the install's `defaults` for the rest.
    pub fn limits(&self, defaults: &Limits) -> Limits {
        Limits {
            memory: self.memory.map_or(defaults.memory, |m| m.0 as i64),
            cpus: self.cpus.unwrap_or(defaults.cpus),
            pids: self.pids.unwrap_or(defaults.pids),
        }
    }
}

/// `POST /v1/runs` body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The group folder.
    pub folder: GroupFolder,
    /// The turn; runs are idempotent on it within the folder.
    pub turn_id: TurnId,
    /// Session to resume.
    #[serde(default)]
    pub session_id: String,
    /// Messages of the turn.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// System prompt.
    #[serde(default)]
    pub system_prompt: String,
    /// Grant rules.
    #[serde(default)]
    pub grants: Vec<String>,
    /// Originating sender.
    #[serde(default)]
    pub sender_jid: String,
    /// Secrets for the agent (stdin only).
    #[serde(default)]
    pub secrets: Secrets,
    /// Container settings.
    #[serde(default)]
    pub group: GroupSpec,
}

/// What a spawn is: runed's store and queue hold both kinds.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpawnKind {
    /// A container run: takes a container slot and the folder's slot.
    Run,
    /// An external job's claim (`POST /v1/holds`): takes the folder's slot only.
    Hold,
}

crate::wire_names!(SpawnKind { Run => "run", Hold => "hold" });

/// The lifecycle of a run.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for a slot.
    Queued,
    /// Preparing and launching the container.
    Starting,
    /// The container runs.
    Running,
    /// The container exited by itself.
    Exited,
    /// The run failed before or around the container (could not start, Docker error).
    Error,
    /// Stopped on request.
    Killed,
    /// Stopped at the run ceiling.
    TimedOut,
}

impl RunState {
    /// Where the state stands in a run's life (queued, starting, running, over): a run only
    /// moves forward, so a stream can drop a state it has already passed.
    pub fn stage(self) -> u8 {
        match self {
            RunState::Queued => 0,
            RunState::Starting => 1,
            RunState::Running => 2,
            RunState::Exited | RunState::Error | RunState::Killed | RunState::TimedOut => 3,
        }
    }

    /// Whether the run is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Exited | RunState::Error | RunState::Killed | RunState::TimedOut
        )
    }
}

crate::wire_names!(RunState {
    Queued => "queued",
    Starting => "starting",
    Running => "running",
    Exited => "exited",
    Error => "error",
    Killed => "killed",
    TimedOut => "timed_out",
});

/// What a finished run means for the turn.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Output reached the user; the cursor advances.
    Ok,
    /// Failure with output, or a terminal failure; the cursor advances, no retry.
    Error,
    /// No usable output; the turn may be retried with backoff.
    Fatal,
    /// Stopped on request; never retried.
    Killed,
    /// Hit the ceiling without any output; the turn may be retried.
    TimedOut,
}

crate::wire_names!(Outcome {
    Ok => "ok",
    Error => "error",
    Fatal => "fatal",
    Killed => "killed",
    TimedOut => "timed_out",
});

/// One run in a list (`GET /v1/runs`): its status without its output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunSummary {
    /// The run (or hold).
    pub run_id: RunId,
    /// A run or a hold.
    pub kind: SpawnKind,
    /// Its folder.
    pub folder: String,
    /// Its turn (a hold's is `hold:<run id>`).
    pub turn_id: TurnId,
    /// Its state.
    pub state: RunState,
    /// Its outcome, once over.
    pub outcome: Option<Outcome>,
    /// The container's exit code.
    pub exit_code: Option<i64>,
    /// What went wrong.
    pub error: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub started_at: Option<String>,
    /// RFC 3339.
    pub ended_at: Option<String>,
}

/// `GET /v1/runs` answer, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunList {
    /// The runs.
    pub runs: Vec<RunSummary>,
    /// Pass as `before` for the next page; absent on the last.
    pub next_before: Option<i64>,
}

/// `GET /v1/runs/{run_id}` body.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// The run.
    pub run_id: RunId,
    /// Its folder.
    pub folder: String,
    /// Its turn.
    pub turn_id: TurnId,
    /// Where it is.
    pub state: RunState,
    /// What it means, once terminal.
    pub outcome: Option<Outcome>,
    /// The output blocks so far, in order.
    pub outputs: Vec<OutputBlock>,
    /// Whether stored output was cut at the cap.
    #[serde(default)]
    pub truncated: bool,
    /// The container's exit code.
    pub exit_code: Option<i64>,
    /// What went wrong, if anything.
    pub error: Option<String>,
    /// RFC 3339 times.
    pub created_at: String,
    /// When the container started.
    pub started_at: Option<String>,
    /// When the run ended.
    pub ended_at: Option<String>,
    /// Its follow-ups, oldest first; each final once the run is terminal.
    #[serde(default)]
    pub steers: Vec<SteerStatus>,
}

/// One event of `GET /v1/runs/{run_id}/events` (the `data` of each server-sent event; the
/// event name is the `type`). runed sends these very values, and routd reads them: one type
/// on both sides of the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunStreamEvent {
    /// The run changed state.
    State {
        /// The run.
        run_id: RunId,
        /// Its new state.
        state: RunState,
    },
    /// The run produced an output block.
    Output {
        /// The run.
        run_id: RunId,
        /// The block's place among the run's blocks, from 0.
        index: usize,
        /// The block. Always present on the event stream (runed reads a block too large for
        /// its in-memory broadcast, `INLINE_BLOCK`, from its store); `null` only inside that
        /// broadcast.
        block: Option<OutputBlock>,
    },
}

impl RunStreamEvent {
    /// The run concerned.
    pub fn run_id(&self) -> &RunId {
        match self {
            RunStreamEvent::State { run_id, .. } | RunStreamEvent::Output { run_id, .. } => run_id,
        }
    }
}

/// `POST /v1/runs` and `POST /v1/holds` answer (202).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedRun {
    /// The run (or hold).
    pub run_id: RunId,
    /// Its state now (`queued` for a new one).
    pub state: RunState,
    /// `true` when the turn already had this run (idempotent repeat).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub existing: bool,
}

/// One follow-up message: plain text or a `{"role", "content"}` object (only the content is
/// used).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(untagged)]
pub enum SteerMessage {
    /// The text.
    Text(String),
    /// A message object.
    Message {
        /// The text.
        content: String,
    },
}

impl SteerMessage {
    /// The text of the message.
    pub fn into_text(self) -> String {
        match self {
            SteerMessage::Text(t) | SteerMessage::Message { content: t } => t,
        }
    }
}

/// `POST /v1/runs/{run_id}/steer` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SteerRequest {
    /// The caller's id for this follow-up (1-128 of `[A-Za-z0-9._:-]`): a repeat with the same
    /// id places nothing new and answers the first one's state, so a caller that lost an
    /// answer asks again instead of guessing. Made up when absent.
    #[serde(default)]
    pub steer_id: Option<String>,
    /// The follow-up messages (at least one), delivered together.
    pub messages: Vec<SteerMessage>,
}

/// Where a follow-up is. It moves `placed` → `taken` or `returned` once, decided by one
/// atomic file operation: the agent's unlink or runed's rename when the run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum SteerState {
    /// In the run's follow-up drop, for the agent to take while the run lives.
    Placed,
    /// The agent took it (exactly once).
    Taken,
    /// The run ended before the agent took it: runed took it back, the agent never saw it.
    Returned,
}

crate::wire_names!(SteerState {
    Placed => "placed",
    Taken => "taken",
    Returned => "returned",
});

/// One follow-up of a run, as `GET /v1/runs/{run_id}` lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SteerStatus {
    /// The caller's id of the follow-up.
    pub steer_id: String,
    /// Where it is; final once the run is terminal.
    pub state: SteerState,
}

/// `POST /v1/runs/{run_id}/steer` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SteerReply {
    /// The run.
    pub run_id: RunId,
    /// The follow-up's id (the caller's, or the one made up).
    pub steer_id: String,
    /// Where it is now: `placed` until the agent takes it or the run ends (then the run's
    /// status says `taken` or `returned`).
    pub state: SteerState,
}

/// `POST /v1/runs/stop` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct StopRequest {
    /// The folder whose live run is killed.
    pub folder: GroupFolder,
    /// Also retire the folder (its group was deleted): its warm box is removed and its
    /// directory goes to the trash, so a group made in it later starts from nothing.
    #[serde(default)]
    pub retire: bool,
}

/// `POST /v1/runs/stop` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StopReply {
    /// The folder.
    pub folder: String,
    /// The runs killed.
    pub killed: Vec<RunId>,
}

/// `POST /v1/holds` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HoldRequest {
    /// The folder whose run slot is claimed.
    pub folder: GroupFolder,
    /// How long the hold lasts unless released (default and ceiling: `RUNED_RUN_TIMEOUT`).
    #[serde(default)]
    pub ttl: Option<HumanDuration>,
}

/// One entry of the session history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionEntry {
    /// Row id (pages go below it).
    pub id: i64,
    /// Folder.
    pub folder: String,
    /// The session the run resumed.
    pub session_id: String,
    /// The session the agent reported.
    pub new_session_id: Option<String>,
    /// The run.
    pub run_id: RunId,
    /// The turn.
    pub turn_id: TurnId,
    /// The outcome.
    pub outcome: Outcome,
    /// Unix ms.
    pub at: i64,
}

/// `GET /v1/sessions` answer, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionPage {
    /// The entries.
    pub sessions: Vec<SessionEntry>,
    /// Pass as `before` for the next page; absent on the last.
    pub next_before: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const DEFAULTS: Limits = Limits {
        memory: 1 << 30,
        cpus: 2.0,
        pids: 512,
    };

    /// A CLI agent needs a model in the format its program speaks, and runs its own image.
    #[test]
    fn cli_agents_need_their_programs_format_and_image() {
        let spec = |agent: &str, api: Option<&str>, image: Option<&str>| -> GroupSpec {
            let mut v = json!({"agent": agent});
            if let Some(api) = api {
                v["llm"] = json!({"model": "m", "api": api});
            }
            if let Some(i) = image {
                v["image"] = json!(i);
            }
            serde_json::from_value(v).unwrap()
        };
        for (agent, good, bad) in [
            ("claude", "anthropic", "openai"),
            ("codex", "openai", "anthropic"),
        ] {
            spec(agent, Some(good), None).validate().unwrap();
            for wrong in [spec(agent, Some(bad), None), spec(agent, None, None)] {
                let e = wrong.validate().unwrap_err();
                assert_eq!(e.field, "agent", "{agent}: {e}");
                assert!(e.reason.contains(good), "{agent}: {e}");
            }
            let e = spec(agent, Some(good), Some("mine:1"))
                .validate()
                .unwrap_err();
            assert_eq!(e.field, "image");
            assert!(e.reason.contains(&format!("hako-{agent}")), "{e}");
        }
    }

    /// Generated from `GroupSpec`'s fields: each field on the wire must have an entry here,
    /// a value that widens the defaults (or `None`: it cannot widen anything) and one that
    /// only tightens them (or `None`: any value is a privilege). A field added later fails
    /// this test until someone decides which it is.
    #[test]
    fn every_group_field_has_an_authority_rule() {
        let table: &[(&str, Option<serde_json::Value>, Option<serde_json::Value>)] = &[
            ("trust", Some(json!("main")), None),
            ("network", Some(json!("open")), None),
            ("egress_allowlist", Some(json!(["x.example"])), None),
            (
                "secrets",
                Some(json!([{"name": "GH_TOKEN", "hosts": ["x.example"]}])),
                None,
            ),
            ("timeout", None, Some(json!("5s"))),
            ("memory", Some(json!("2g")), Some(json!("512m"))),
            ("cpus", Some(json!(2.5)), Some(json!(0.5))),
            ("pids", Some(json!(513)), Some(json!(64))),
            (
                "mounts",
                Some(json!([{"host_path": "/srv", "container_path": "s"}])),
                None,
            ),
            ("sidecars", Some(json!([{"name": "s", "image": "i"}])), None),
            ("env_allowlist", Some(json!(["TZ"])), None),
            ("image", Some(json!("other:1")), None),
            ("llm", Some(json!({"model": "m"})), None),
            ("agent", Some(json!("claude")), Some(json!("hako"))),
            ("runtime", Some(json!("runsc")), None),
        ];
        let fields = serde_json::to_value(GroupSpec::default()).unwrap();
        let fields = fields.as_object().unwrap();
        for name in fields.keys() {
            let row = table.iter().find(|(n, ..)| n == name).unwrap_or_else(|| {
                panic!(
                    "GroupSpec field {name:?} has no authority rule: add it to beyond() and here"
                )
            });
            let spec = |v: &serde_json::Value| -> GroupSpec {
                serde_json::from_value(json!({ name: v })).unwrap()
            };
            if let Some(wide) = &row.1 {
                let g = spec(wide);
                assert!(
                    g.beyond(&DEFAULTS).contains(&name.as_str()),
                    "{name}: {wide}"
                );
            }
            if let Some(tight) = &row.2 {
                let g = spec(tight);
                g.validate().unwrap();
                assert!(
                    g.beyond(&DEFAULTS).is_empty(),
                    "{name}: {tight} only tightens"
                );
            }
        }
        assert_eq!(
            fields.len(),
            table.len(),
            "a rule for a field that no longer exists"
        );
    }

    #[test]
    fn never_meant_limits_are_refused_for_everyone() {
        for (body, field) in [
            (json!({"memory": "0"}), "memory"),
            (json!({"memory": "4096g"}), "memory"),
            (json!({"cpus": 0}), "cpus"),
            (json!({"cpus": 1e-12}), "cpus"),
            (json!({"cpus": 1e9}), "cpus"),
            (json!({"pids": 0}), "pids"),
            (json!({"pids": -1}), "pids"),
            (json!({"timeout": "0s"}), "timeout"),
            (json!({"llm": {"model": ""}}), "llm.model"),
            (json!({"llm": {"model": "a b"}}), "llm.model"),
            (json!({"llm": {"model": "m\nX=1"}}), "llm.model"),
            (
                json!({"llm": {"model": "m", "daily_tokens": 0}}),
                "llm.daily_tokens",
            ),
            (
                json!({"sidecars": [{"name": "s", "image": "i", "memory": "0"}]}),
                "sidecars[0].memory",
            ),
            (
                json!({"sidecars": [{"name": "s", "image": "i", "cpus": 0}]}),
                "sidecars[0].cpus",
            ),
            (
                json!({"egress_allowlist": ["ok.example", "*.com"]}),
                "egress_allowlist[1]",
            ),
        ] {
            let g: GroupSpec = serde_json::from_value(body.clone()).unwrap();
            let e = g.validate().unwrap_err();
            assert_eq!(e.field, field, "{body}: {e}");
        }
    }

    #[test]
    fn secrets_go_only_where_the_run_may_go() {
        let allow = |secrets: serde_json::Value| {
            json!({"network": "allowlist", "egress_allowlist": ["github.com", "*.github.com", "plain.example:80"],
                   "secrets": secrets})
        };
        let ok: GroupSpec = serde_json::from_value(allow(json!([
            {"name": "GH_TOKEN", "hosts": ["github.com", "API.github.com"]},
            {"name": "NPM_TOKEN", "hosts": ["npm.github.com"]}
        ])))
        .unwrap();
        ok.validate().unwrap();
        for (body, field) in [
            (
                json!({"network": "open", "secrets": [{"name": "GH_TOKEN", "hosts": ["github.com"]}]}),
                "secrets",
            ),
            (
                allow(json!([{"name": "GH_TOKEN", "hosts": ["gitlab.com"]}])),
                "secrets[0].hosts[0]",
            ),
            (
                allow(json!([{"name": "GH_TOKEN", "hosts": ["github.com", "*.github.com"]}])),
                "secrets[0].hosts[1]",
            ),
            (
                allow(json!([{"name": "GH_TOKEN", "hosts": ["plain.example"]}])),
                "secrets[0].hosts[0]",
            ),
            (
                allow(json!([{"name": "GH_TOKEN", "hosts": []}])),
                "secrets[0].hosts",
            ),
            (
                allow(
                    json!([{"name": "A", "hosts": ["github.com"]}, {"name": "A", "hosts": ["github.com"]}]),
                ),
                "secrets[1].name",
            ),
            (
                json!({"network": "allowlist", "egress_allowlist": ["github.com"], "env_allowlist": ["GH_TOKEN"],
                       "secrets": [{"name": "GH_TOKEN", "hosts": ["github.com"]}]}),
                "secrets[0].name",
            ),
        ] {
            let g: GroupSpec = serde_json::from_value(body.clone()).unwrap();
            let e = g.validate().unwrap_err();
            assert_eq!(e.field, field, "{body}: {e}");
        }
        let ok: GroupSpec =
            serde_json::from_value(json!({"memory": "6m", "cpus": 0.01, "pids": 1})).unwrap();
        ok.validate().unwrap();
        assert_eq!(ok.limits(&DEFAULTS).pids, 1);
        assert_eq!(GroupSpec::default().limits(&DEFAULTS), DEFAULTS);
    }

    #[test]
    fn run_request_parses_the_contract_shape() {
        let v = json!({
            "folder": "acme/support", "turn_id": "t1", "session_id": "", "messages": [{"role":"user","content":"hi"}],
            "system_prompt": "", "grants": [], "sender_jid": "u@x", "secrets": {"K": "v"},
            "group": {"trust": "main", "network": "none", "egress_allowlist": [], "timeout": "5m",
                      "memory": "512m", "cpus": 1.5, "pids": 128,
                      "mounts": [{"host_path": "~/p", "container_path": "p"}],
                      "sidecars": [{"name": "fs", "image": "img"}], "env_allowlist": ["GIT_AUTHOR_NAME"], "image": "x"}
        });
        let r: RunRequest = serde_json::from_value(v).unwrap();
        assert_eq!(
            r.group.timeout,
            Some(HumanDuration(Duration::from_secs(300)))
        );
        assert_eq!(r.group.memory, Some(ByteSize(512 << 20)));
        assert!(r.group.mounts[0].readonly, "mounts default to read-only");
        assert_eq!(
            r.group.beyond(&DEFAULTS),
            vec!["trust", "mounts", "sidecars", "env_allowlist", "image"]
        );
    }

    #[test]
    fn bad_fields_are_refused() {
        let bad_folder = json!({"folder": "../etc", "turn_id": "t"});
        assert!(serde_json::from_value::<RunRequest>(bad_folder).is_err());
        let unknown = json!({"folder": "a", "turn_id": "t", "group": {"privileged": true}});
        assert!(serde_json::from_value::<RunRequest>(unknown).is_err());
        let bad_timeout = json!({"folder": "a", "turn_id": "t", "group": {"timeout": "soon"}});
        assert!(serde_json::from_value::<RunRequest>(bad_timeout).is_err());
        let minimal = json!({"folder": "a", "turn_id": "t"});
        let r: RunRequest = serde_json::from_value(minimal).unwrap();
        assert!(r.group.beyond(&DEFAULTS).is_empty());
    }

    #[test]
    fn states_and_outcomes_round_trip() {
        for s in [
            "queued",
            "starting",
            "running",
            "exited",
            "error",
            "killed",
            "timed_out",
        ] {
            assert_eq!(RunState::parse(s).unwrap().as_str(), s);
            assert_eq!(
                serde_json::to_value(RunState::parse(s).unwrap()).unwrap(),
                json!(s)
            );
        }
        for o in ["ok", "error", "fatal", "killed", "timed_out"] {
            assert_eq!(Outcome::parse(o).unwrap().as_str(), o);
        }
        for k in [SpawnKind::Run, SpawnKind::Hold] {
            assert_eq!(SpawnKind::parse(k.as_str()), Some(k));
            assert_eq!(serde_json::to_value(k).unwrap(), json!(k.as_str()));
        }
        assert_eq!(SpawnKind::parse("job"), None);
        // `hako runs` pads its columns.
        assert_eq!(format!("{:<9}|", RunState::Running), "running  |");
        assert_eq!(format!("{:<9}|", Outcome::Ok), "ok       |");
        assert_eq!(
            serde_json::to_value(HumanDuration(Duration::from_millis(1500))).unwrap(),
            json!("1500ms")
        );
    }
}
