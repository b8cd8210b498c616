//! Wire types of runs: what a caller asks runed for (`RunRequest`, `GroupSpec`) and what it
//! reports back (`RunState`, `Outcome`, `RunStatus`). Field names follow CONTRACTS.md.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::contract::{Message, OutputBlock, Secrets};
use crate::folder::GroupFolder;

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

/// How much a group is trusted.
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
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupSpec {
    /// Trust level.
    #[serde(default)]
    pub trust: Trust,
    /// Network policy.
    #[serde(default)]
    pub network: Network,
    /// Hosts reachable with `network: allowlist`.
    #[serde(default)]
    pub egress_allowlist: Vec<String>,
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
}

impl GroupSpec {
    /// Whether this spec asks for anything beyond the defaults a folder-bound caller may use:
    /// trust, extra mounts, network, a different image, sidecars or env passthrough.
    pub fn elevated(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.trust != Trust::Untrusted {
            v.push("trust");
        }
        if !self.mounts.is_empty() {
            v.push("mounts");
        }
        if self.network != Network::None || !self.egress_allowlist.is_empty() {
            v.push("network");
        }
        if self.image.is_some() {
            v.push("image");
        }
        if !self.sidecars.is_empty() {
            v.push("sidecars");
        }
        if !self.env_allowlist.is_empty() {
            v.push("env_allowlist");
        }
        v
    }
}

/// `POST /v1/runs` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The group folder.
    pub folder: GroupFolder,
    /// The turn; runs are idempotent on it.
    pub turn_id: String,
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

/// The lifecycle of a run.
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
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Queued => "queued",
            RunState::Starting => "starting",
            RunState::Running => "running",
            RunState::Exited => "exited",
            RunState::Error => "error",
            RunState::Killed => "killed",
            RunState::TimedOut => "timed_out",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "queued" => RunState::Queued,
            "starting" => RunState::Starting,
            "running" => RunState::Running,
            "exited" => RunState::Exited,
            "error" => RunState::Error,
            "killed" => RunState::Killed,
            "timed_out" => RunState::TimedOut,
            _ => return None,
        })
    }

    /// Whether the run is over.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Exited | RunState::Error | RunState::Killed | RunState::TimedOut
        )
    }
}

impl fmt::Display for RunState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finished run means for the turn.
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

impl Outcome {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Fatal => "fatal",
            Outcome::Killed => "killed",
            Outcome::TimedOut => "timed_out",
        }
    }

    /// Parses the wire name.
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "ok" => Outcome::Ok,
            "error" => Outcome::Error,
            "fatal" => Outcome::Fatal,
            "killed" => Outcome::Killed,
            "timed_out" => Outcome::TimedOut,
            _ => return None,
        })
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /v1/runs/{run_id}` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunStatus {
    /// The run.
    pub run_id: String,
    /// Its folder.
    pub folder: String,
    /// Its turn.
    pub turn_id: String,
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
            r.group.elevated(),
            vec!["trust", "mounts", "image", "sidecars", "env_allowlist"]
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
        assert!(r.group.elevated().is_empty());
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
        assert_eq!(
            serde_json::to_value(HumanDuration(Duration::from_millis(1500))).unwrap(),
            json!("1500ms")
        );
    }
}
