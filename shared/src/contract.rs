//! The container contract: what an agent image reads and writes.
//!
//! Field names are those the agent images of the systems hako replaces already speak
//! (camelCase on the wire), so that those images work unchanged. Secrets travel only inside
//! [`ContainerInput`] on stdin; the types here never print them in `Debug` output.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The default start marker of an output block.
pub const OUTPUT_START: &str = "---ARIZUKO_OUTPUT_START---";
/// The default end marker of an output block.
pub const OUTPUT_END: &str = "---ARIZUKO_OUTPUT_END---";
/// Env var the agent reads to learn its query deadline, in milliseconds.
pub const QUERY_TIMEOUT_ENV: &str = "ARIZUKO_QUERY_TIMEOUT_MS";
/// Env var overriding the start marker (NanoClaw images use `---NANOCLAW_OUTPUT_START---`).
pub const MARKER_START_ENV: &str = "HAKO_OUTPUT_START_MARKER";
/// Env var overriding the end marker.
pub const MARKER_END_ENV: &str = "HAKO_OUTPUT_END_MARKER";
/// The follow-up directory inside the container.
pub const INPUT_DIR: &str = "/workspace/ipc/input";
/// The name of the file that tells the agent to finish and exit.
pub const CLOSE_FILE: &str = "_close";
/// The MCP socket directory inside the container.
pub const SOCKET_DIR: &str = "/var/run/pub/arizuko";
/// The MCP socket served by routd, inside the container.
pub const MCP_SOCKET: &str = "/var/run/pub/arizuko/mcp.sock";
/// routd's LLM gateway (HTTP over a unix socket), inside the container.
pub const API_SOCKET: &str = "/var/run/pub/arizuko/api.sock";
/// Env var naming the model the agent asks the gateway for (set from the group's `llm`).
pub const MODEL_ENV: &str = "HAKO_MODEL";
/// Env var naming the wire format the agent speaks to the gateway (`anthropic`, `openai`).
pub const LLM_API_ENV: &str = "HAKO_LLM_API";
/// The brain hako-agent runs (`script`, `llm`, `claude`): runed sets `claude` for `agent:
/// claude` groups.
pub const BRAIN_ENV: &str = "HAKO_BRAIN";
/// Env var set to `1` on a warm box: one started before its turn. Its agent waits for the
/// stdin line without a deadline, and takes the deadline from that line
/// ([`ContainerInput::query_timeout_ms`]), counted from when the line arrived.
pub const WARM_ENV: &str = "HAKO_WARM";
/// Image label (`1`) by which an agent image says it understands [`WARM_ENV`]: runed starts
/// warm boxes only of images that carry it, since an image that counts
/// [`QUERY_TIMEOUT_ENV`] from its own start would count the wait before its turn.
pub const WARM_LABEL: &str = "io.hako.warm";
/// Where the operator's skills bundle is mounted read-only a second time, as the `skills/`
/// of a Claude Code plugin directory (`--plugin-dir`): Claude Code reads no skill from a
/// place the agent can write (`specs/agent-script.md`, "Claude Code").
pub const SKILLS_PLUGIN_DIR: &str = "/opt/hako/claude-plugin";

/// The pair of lines that frame an output block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    /// Line that opens a block.
    pub start: String,
    /// Line that closes a block.
    pub end: String,
}

impl Default for Markers {
    fn default() -> Self {
        Self {
            start: OUTPUT_START.to_owned(),
            end: OUTPUT_END.to_owned(),
        }
    }
}

impl Markers {
    /// Markers for a product prefix: `NANOCLAW` gives `---NANOCLAW_OUTPUT_START---`.
    pub fn for_prefix(prefix: &str) -> Self {
        Self {
            start: format!("---{prefix}_OUTPUT_START---"),
            end: format!("---{prefix}_OUTPUT_END---"),
        }
    }
}

/// One chat message handed to the agent.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `user`, `assistant`, …
    pub role: String,
    /// The text.
    pub content: String,
    /// Any further fields (sender, timestamp, …) are carried through untouched.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Message {
    /// A user message with no extra fields.
    pub fn user(content: impl Into<String>) -> Self {
        Self {
            role: "user".into(),
            content: content.into(),
            extra: BTreeMap::new(),
        }
    }
}

/// A string that never shows in `Debug` or logs.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Redacted(pub String);

impl Redacted {
    /// The secret value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Named secrets for the agent; `Debug` lists the names only.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secrets(pub BTreeMap<String, String>);

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for Secrets {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::string_map(
            "Named secrets for the agent: they reach it on stdin only, never env, disk, logs or the database",
        )
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for Secrets {}

/// The single JSON line written to the agent's stdin.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerInput {
    /// Session to resume, empty for a new one.
    #[serde(default)]
    pub session_id: String,
    /// The messages of this turn.
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Prepended context blocks.
    #[serde(default)]
    pub system_prompt: String,
    /// Grant rules for the agent.
    #[serde(default)]
    pub grants: Vec<String>,
    /// The group folder.
    #[serde(default)]
    pub folder: String,
    /// JID of the originating sender.
    #[serde(default)]
    pub sender_jid: String,
    /// The turn this run serves.
    #[serde(default)]
    pub turn_id: String,
    /// The run id.
    #[serde(default)]
    pub run_id: String,
    /// The per-spawn token (the agent's credential for routd's tools and gateway).
    #[serde(default)]
    pub token: Redacted,
    /// Secrets, only ever here.
    #[serde(default)]
    pub secrets: Secrets,
    /// The query deadline in milliseconds, counted from when the agent read this line. It is
    /// [`QUERY_TIMEOUT_ENV`]'s value for a box started before its turn (whose process start
    /// is not the turn's); agents that do not know it keep counting the env from their start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query_timeout_ms: Option<u64>,
}

/// Status of one output block.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlockStatus {
    /// Success; the cursor advances. NanoClaw images say `success`.
    #[serde(alias = "success")]
    Ok,
    /// Failure with output; the cursor advances.
    Error,
    /// No usable output; the turn is retried.
    Fatal,
}

impl BlockStatus {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockStatus::Ok => "ok",
            BlockStatus::Error => "error",
            BlockStatus::Fatal => "fatal",
        }
    }
}

/// One output block, the JSON between the markers.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputBlock {
    /// What kind of block.
    pub status: BlockStatus,
    /// The reply text (may be null for status-only blocks).
    #[serde(default)]
    pub result: Option<String>,
    /// The session to resume next time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_session_id: Option<String>,
    /// What went wrong, for `error` and `fatal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl OutputBlock {
    /// An `ok` block with a reply.
    pub fn ok(result: impl Into<String>) -> Self {
        Self {
            status: BlockStatus::Ok,
            result: Some(result.into()),
            new_session_id: None,
            error: None,
        }
    }

    /// An `error` or `fatal` block.
    pub fn failure(status: BlockStatus, error: impl Into<String>) -> Self {
        Self {
            status,
            result: None,
            new_session_id: None,
            error: Some(error.into()),
        }
    }
}

/// A follow-up message dropped into the input directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FollowUp {
    /// The text of the follow-up.
    pub content: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn input_uses_the_contract_field_names() {
        let mut secrets = BTreeMap::new();
        secrets.insert("ANTHROPIC_API_KEY".to_owned(), "sk-canary".to_owned());
        let input = ContainerInput {
            session_id: "s1".into(),
            messages: vec![Message::user("hi")],
            system_prompt: "sys".into(),
            grants: vec!["g".into()],
            folder: "acme".into(),
            sender_jid: "u@x".into(),
            turn_id: "t1".into(),
            run_id: "r1".into(),
            token: Redacted("jwt".into()),
            secrets: Secrets(secrets),
            query_timeout_ms: None,
        };
        let v = serde_json::to_value(&input).unwrap();
        assert_eq!(
            v,
            json!({
                "sessionId": "s1",
                "messages": [{"role": "user", "content": "hi"}],
                "systemPrompt": "sys",
                "grants": ["g"],
                "folder": "acme",
                "senderJid": "u@x",
                "turnId": "t1",
                "runId": "r1",
                "token": "jwt",
                "secrets": {"ANTHROPIC_API_KEY": "sk-canary"}
            })
        );
        let back: ContainerInput = serde_json::from_value(v).unwrap();
        assert_eq!(back, input);
        let dbg = format!("{input:?}");
        assert!(
            !dbg.contains("sk-canary") && !dbg.contains("\"jwt\""),
            "{dbg}"
        );
        assert!(dbg.contains("ANTHROPIC_API_KEY"));
        // The deadline of a box started before its turn rides along only when set.
        let warm = ContainerInput {
            query_timeout_ms: Some(1500),
            ..input
        };
        assert_eq!(
            serde_json::to_value(&warm).unwrap()["queryTimeoutMs"],
            json!(1500)
        );
    }

    #[test]
    fn seed_input_without_new_fields_parses() {
        let v = json!({"sessionId": "", "messages": [{"role": "user", "content": "x", "sender": "bob"}],
                       "systemPrompt": "", "grants": [], "folder": "f", "senderJid": "j"});
        let input: ContainerInput = serde_json::from_value(v).unwrap();
        assert_eq!(input.messages[0].extra["sender"], json!("bob"));
        assert_eq!(input.token.expose(), "");
    }

    #[test]
    fn output_block_field_names() {
        let b: OutputBlock = serde_json::from_str(
            r#"{"status":"ok","result":"agent reply text","newSessionId":"n","error":""}"#,
        )
        .unwrap();
        assert_eq!(b.status, BlockStatus::Ok);
        assert_eq!(b.result.as_deref(), Some("agent reply text"));
        assert_eq!(b.new_session_id.as_deref(), Some("n"));
        let nano: OutputBlock =
            serde_json::from_str(r#"{"status":"success","result":null}"#).unwrap();
        assert_eq!(nano.status, BlockStatus::Ok);
        assert!(serde_json::from_str::<OutputBlock>(r#"{"status":"weird"}"#).is_err());
        assert_eq!(
            serde_json::to_value(OutputBlock::failure(BlockStatus::Fatal, "boom")).unwrap(),
            json!({"status": "fatal", "result": null, "error": "boom"})
        );
    }

    #[test]
    fn follow_up_and_markers() {
        let f: FollowUp = serde_json::from_str(r#"{"content":"more"}"#).unwrap();
        assert_eq!(f.content, "more");
        assert_eq!(Markers::default().start, "---ARIZUKO_OUTPUT_START---");
        assert_eq!(
            Markers::for_prefix("NANOCLAW").end,
            "---NANOCLAW_OUTPUT_END---"
        );
    }
}
