//! The turn's tools: what each takes (a JSON schema an LLM can follow, and the serde type the
//! call is parsed into: a test keeps the two equal), the grant check, and the [`Backend`]
//! that carries a call out (routd's store, or the CLI's stubs).

use std::future::Future;

use hako_shared::GroupFolder;
use hako_shared::grants::{Gate, Grants, Refused, Tool};
use hako_shared::ids::TurnId;
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The longest text a tool takes (a message, a status, a prompt).
pub const MAX_TEXT: usize = 64 * 1024;
/// The most messages one `get_history` call returns.
pub const MAX_HISTORY: u32 = 200;

/// Who is calling: the turn a socket (or a spawn token) belongs to, and what its group may do.
#[derive(Debug, Clone)]
pub struct Scope {
    /// The turn's folder.
    pub folder: GroupFolder,
    /// The turn.
    pub turn_id: TurnId,
    /// The chat that started the turn (where replies go by default).
    pub chat_jid: hako_shared::ChatJid,
    /// The group's grants.
    pub grants: Grants,
}

/// Why a tool call did not happen: a closed set, each with the HTTP status the tools' HTTP
/// face answers with, so no code is ever mapped from a string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCode {
    /// Bad arguments (400).
    InvalidArguments,
    /// The group's grants do not allow the call (403).
    NotGranted,
    /// A person denied it, or no one approved it in time (403).
    Denied,
    /// What the arguments name does not exist, or is not the group's (404).
    NotFound,
    /// The turn is over (409).
    TurnEnded,
    /// The call conflicts with what exists (409).
    Conflict,
    /// Over a bound on what a turn or group may write (429).
    RateLimited,
    /// The tool does not exist here (the CLI's chat mode has no routd) (501).
    NotAvailable,
    /// Something it needs does not answer now; try again later (503).
    Unavailable,
    /// A failure on the server's side (500).
    Internal,
}

impl ToolCode {
    /// The wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            ToolCode::InvalidArguments => "invalid_arguments",
            ToolCode::NotGranted => "not_granted",
            ToolCode::Denied => "denied",
            ToolCode::NotFound => "not_found",
            ToolCode::TurnEnded => "turn_ended",
            ToolCode::Conflict => "conflict",
            ToolCode::RateLimited => "rate_limited",
            ToolCode::NotAvailable => "not_available",
            ToolCode::Unavailable => "unavailable",
            ToolCode::Internal => "internal",
        }
    }

    /// The HTTP status of a call refused with this code.
    pub const fn http_status(self) -> u16 {
        match self {
            ToolCode::InvalidArguments => 400,
            ToolCode::NotGranted | ToolCode::Denied => 403,
            ToolCode::NotFound => 404,
            ToolCode::TurnEnded | ToolCode::Conflict => 409,
            ToolCode::RateLimited => 429,
            ToolCode::Internal => 500,
            ToolCode::NotAvailable => 501,
            ToolCode::Unavailable => 503,
        }
    }
}

impl std::fmt::Display for ToolCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A tool call that did not happen, with a reason the agent can act on. MCP answers it as a
/// tool error (the model reads it), HTTP as the error envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// Why.
    pub code: ToolCode,
    /// What happened, for the agent.
    pub message: String,
}

impl ToolError {
    /// Over a bound on what a turn or group may write (HTTP 429).
    pub fn rate_limited(message: impl Into<String>) -> Self {
        ToolError {
            code: ToolCode::RateLimited,
            message: message.into(),
        }
    }

    /// A person denied the call, or no one approved it in time (HTTP 403).
    pub fn denied(message: impl Into<String>) -> Self {
        ToolError {
            code: ToolCode::Denied,
            message: message.into(),
        }
    }

    /// Bad arguments.
    pub fn invalid(message: impl Into<String>) -> Self {
        ToolError {
            code: ToolCode::InvalidArguments,
            message: message.into(),
        }
    }

    /// Something the arguments name does not exist (or is not the group's).
    pub fn not_found(message: impl Into<String>) -> Self {
        ToolError {
            code: ToolCode::NotFound,
            message: message.into(),
        }
    }

    /// The turn is over: its tools are gone with it.
    pub fn turn_ended(turn_id: &str) -> Self {
        ToolError {
            code: ToolCode::TurnEnded,
            message: format!("turn {turn_id} has ended; its tools are no longer available"),
        }
    }

    /// A server-side failure; the message says only what the agent may see.
    pub fn internal(message: impl Into<String>) -> Self {
        ToolError {
            code: ToolCode::Internal,
            message: message.into(),
        }
    }
}

impl From<Refused> for ToolError {
    fn from(r: Refused) -> Self {
        ToolError {
            code: ToolCode::NotGranted,
            message: r.to_string(),
        }
    }
}

/// `send_message`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SendMessage {
    /// The text.
    pub text: String,
    /// Another chat of the group (default: the turn's chat).
    #[serde(default)]
    pub chat_jid: Option<String>,
    /// A key of the caller's: a second call with the same key sends nothing.
    #[serde(default)]
    pub idempotency_key: Option<String>,
}

/// `get_history`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GetHistory {
    /// How many messages (default 50, at most [`MAX_HISTORY`]).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only messages before this `seq` (paging back).
    #[serde(default)]
    pub before: Option<i64>,
}

/// `set_status`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetStatus {
    /// The progress text.
    pub text: String,
}

/// `schedule_task`: exactly one of `at`, `after`, `cron`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleTask {
    /// The prompt the group receives when the task fires.
    pub prompt: String,
    /// Once, at this instant (RFC 3339).
    #[serde(default)]
    pub at: Option<String>,
    /// Once, after this long (`90s`, `10m`, `2h`).
    #[serde(default)]
    pub after: Option<String>,
    /// Repeatedly, on this five-field cron schedule (UTC).
    #[serde(default)]
    pub cron: Option<String>,
    /// The chat the prompt arrives in (default: the turn's chat).
    #[serde(default)]
    pub chat_jid: Option<String>,
}

/// `list_tasks`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListTasks {}

/// `cancel_task`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelTask {
    /// The task, as `schedule_task` or `list_tasks` named it.
    pub id: String,
}

/// `reset_session`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResetSession {}

/// `register_group`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterGroup {
    /// The new group's folder: a sub-folder of the caller's (`<folder>/<name>`).
    pub folder: String,
    /// Its display name.
    pub name: String,
    /// Its system prompt.
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Its grants (default: none, which means every tool but the main-only ones).
    #[serde(default)]
    pub grants: Option<Vec<String>>,
}

/// `spawn_group`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnGroup {
    /// The group to run: a sub-folder of the caller's.
    pub folder: String,
    /// What it is asked.
    pub prompt: String,
}

/// `agent_tool`: Claude Code's permission prompt (`--permission-prompt-tool`), asking whether
/// one of its own tools may run. Unknown fields are ignored: the caller is a program whose
/// prompt format may grow.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AgentTool {
    /// The agent's tool (`Bash`, `Write`, …): the target of grant rules.
    pub tool_name: String,
    /// What it would be called with (shown to the person who decides).
    #[serde(default)]
    pub input: Value,
    /// The agent's id of the call.
    #[serde(default)]
    pub tool_use_id: Option<String>,
}

impl AgentTool {
    /// The answer Claude Code's permission prompt expects: allowed, unchanged.
    pub fn allow(&self) -> Value {
        json!({"behavior": "allow", "updatedInput": self.input})
    }

    /// The answer for a refusal: denied, and why (the model reads it).
    pub fn deny(message: &str) -> Value {
        json!({"behavior": "deny", "message": message})
    }
}

/// A parsed call.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Call {
    SendMessage(SendMessage),
    GetHistory(GetHistory),
    SetStatus(SetStatus),
    ScheduleTask(ScheduleTask),
    ListTasks(ListTasks),
    CancelTask(CancelTask),
    ResetSession(ResetSession),
    RegisterGroup(RegisterGroup),
    SpawnGroup(SpawnGroup),
    AgentTool(AgentTool),
}

impl Call {
    /// Parses `args` for `tool`; the error names the bad argument.
    pub fn parse(tool: Tool, args: Map<String, Value>) -> Result<Call, ToolError> {
        fn p<T: for<'de> Deserialize<'de>>(args: Map<String, Value>) -> Result<T, ToolError> {
            serde_json::from_value(Value::Object(args))
                .map_err(|e| ToolError::invalid(e.to_string()))
        }
        let call = match tool {
            Tool::SendMessage => Call::SendMessage(p(args)?),
            Tool::GetHistory => Call::GetHistory(p(args)?),
            Tool::SetStatus => Call::SetStatus(p(args)?),
            Tool::ScheduleTask => Call::ScheduleTask(p(args)?),
            Tool::ListTasks => Call::ListTasks(p(args)?),
            Tool::CancelTask => Call::CancelTask(p(args)?),
            Tool::ResetSession => Call::ResetSession(p(args)?),
            Tool::RegisterGroup => Call::RegisterGroup(p(args)?),
            Tool::SpawnGroup => Call::SpawnGroup(p(args)?),
            Tool::AgentTool => Call::AgentTool(p(args)?),
        };
        call.check_sizes()?;
        Ok(call)
    }

    /// The tool.
    pub fn tool(&self) -> Tool {
        match self {
            Call::SendMessage(_) => Tool::SendMessage,
            Call::GetHistory(_) => Tool::GetHistory,
            Call::SetStatus(_) => Tool::SetStatus,
            Call::ScheduleTask(_) => Tool::ScheduleTask,
            Call::ListTasks(_) => Tool::ListTasks,
            Call::CancelTask(_) => Tool::CancelTask,
            Call::ResetSession(_) => Tool::ResetSession,
            Call::RegisterGroup(_) => Tool::RegisterGroup,
            Call::SpawnGroup(_) => Tool::SpawnGroup,
            Call::AgentTool(_) => Tool::AgentTool,
        }
    }

    /// What the call acts on, for grant rules with a target: a chat or a folder.
    pub fn target<'a>(&'a self, scope: &'a Scope) -> Option<&'a str> {
        match self {
            Call::SendMessage(c) => Some(c.chat_jid.as_deref().unwrap_or(&scope.chat_jid)),
            Call::ScheduleTask(c) => Some(c.chat_jid.as_deref().unwrap_or(&scope.chat_jid)),
            Call::RegisterGroup(c) => Some(&c.folder),
            Call::SpawnGroup(c) => Some(&c.folder),
            Call::AgentTool(c) => Some(&c.tool_name),
            _ => None,
        }
    }

    /// The chat the call acts on when it is not the turn's own.
    pub fn other_chat<'a>(&'a self, scope: &Scope) -> Option<&'a str> {
        let named = match self {
            Call::SendMessage(c) => c.chat_jid.as_deref(),
            Call::ScheduleTask(c) => c.chat_jid.as_deref(),
            _ => None,
        };
        named.filter(|c| *c != scope.chat_jid)
    }

    fn check_sizes(&self) -> Result<(), ToolError> {
        let text = |what: &str, t: &str| {
            if t.trim().is_empty() {
                Err(ToolError::invalid(format!("{what} is empty")))
            } else if t.len() > MAX_TEXT {
                Err(ToolError::invalid(format!(
                    "{what} is {} bytes; at most {MAX_TEXT}",
                    t.len()
                )))
            } else {
                Ok(())
            }
        };
        match self {
            Call::SendMessage(c) => {
                if c.idempotency_key.as_ref().is_some_and(|k| {
                    k.is_empty() || k.len() > 128 || k.chars().any(char::is_control)
                }) {
                    return Err(ToolError::invalid(
                        "idempotency_key: 1-128 printable characters",
                    ));
                }
                text("text", &c.text)
            }
            Call::SetStatus(c) => text("text", &c.text),
            Call::ScheduleTask(c) => text("prompt", &c.prompt),
            Call::SpawnGroup(c) => text("prompt", &c.prompt),
            Call::AgentTool(c) => {
                if c.tool_name.is_empty()
                    || c.tool_name.len() > 128
                    || c.tool_name.chars().any(char::is_control)
                {
                    Err(ToolError::invalid("tool_name: 1-128 printable characters"))
                } else {
                    Ok(())
                }
            }
            Call::RegisterGroup(c) => text("name", &c.name),
            Call::GetHistory(c) => match c.limit {
                Some(n) if n == 0 || n > MAX_HISTORY => {
                    Err(ToolError::invalid(format!("limit {n}: 1-{MAX_HISTORY}")))
                }
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// The `_meta` key under which a client names a call (`tools/call` params): the same call
/// asked again (its connection broke, routd restarted while a person was deciding) carries
/// the same name, and the backend attaches it to what the first asking started (the request
/// waiting for a verdict, the message it sent), instead of starting anew.
pub const CALL_KEY_META: &str = "hako/call";

/// A client's name for one call: 1-128 of `[A-Za-z0-9._:-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallKey(String);

impl CallKey {
    /// The key, if `raw` is one.
    pub fn parse(raw: &str) -> Option<CallKey> {
        let ok = !raw.is_empty()
            && raw.len() <= 128
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
        ok.then(|| CallKey(raw.to_owned()))
    }

    /// The key as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for CallKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Carries calls out. routd's backend acts on its store; the CLI's answers the tools it
/// cannot offer with `not_available`.
pub trait Backend: Send + Sync + 'static {
    /// Whether the scope's turn is still live; calls after its end are refused.
    fn is_live(&self, scope: &Scope) -> impl Future<Output = bool> + Send;
    /// Carries out a call the grants allowed; the answer is the tool's JSON result.
    fn call(
        &self,
        scope: &Scope,
        call: Call,
    ) -> impl Future<Output = Result<Value, ToolError>> + Send;
    /// Holds a call an ask rule matched until a person's verdict: `Ok` when approved, a
    /// `denied` error otherwise (denied, no verdict in time, the turn ended). A backend with
    /// no one to ask denies (the default).
    /// `args` are the call's arguments as the agent sent them (for the person who decides).
    /// `key` is the client's name for the call, when it gave one: the same key asked again
    /// is the same request.
    fn ask(
        &self,
        _scope: &Scope,
        call: &Call,
        _args: &Map<String, Value>,
        _key: Option<&CallKey>,
    ) -> impl Future<Output = Result<(), ToolError>> + Send {
        let tool = call.tool().name();
        async move {
            Err(ToolError::denied(format!(
                "{tool} needs a person's approval, and no one here can give it"
            )))
        }
    }
    /// Sees how every call ended (`Err` holds the error code), refused or not: metrics.
    fn record(&self, _tool: Tool, _outcome: Result<(), &'static str>) {}
}

/// Parses, checks the grants, checks the turn is live, holds a call an ask rule matched for
/// its verdict, and calls the backend: the one path of every tool call, over MCP or HTTP.
///
/// `key`, the client's name for the call ([`CALL_KEY_META`]), makes asking again safe: the
/// same held request is waited on, and a `send_message` without a key of its own sends under
/// this one (a second asking sends nothing).
pub async fn dispatch<B: Backend>(
    backend: &B,
    scope: &Scope,
    tool: Tool,
    args: Map<String, Value>,
    key: Option<&CallKey>,
) -> Result<Value, ToolError> {
    let outcome = async {
        let mut call = Call::parse(tool, args.clone())?;
        if let (Call::SendMessage(c), Some(k)) = (&mut call, key)
            && c.idempotency_key.is_none()
        {
            c.idempotency_key = Some(format!("call.{k}"));
        }
        if let Call::AgentTool(c) = &call {
            // The agent program asks, and reads a decision: a refusal is a `deny` it acts
            // on, never an error it might take for "no prompt tool".
            // Claude Code reads one text block holding the decision's JSON (structured
            // content beside it is refused), so the answer is that text.
            return match gate_of(backend, scope, &call, &args, key).await {
                Ok(()) => Ok(Value::String(c.allow().to_string())),
                Err(e)
                    if matches!(
                        e.code,
                        ToolCode::NotGranted | ToolCode::Denied | ToolCode::TurnEnded
                    ) =>
                {
                    Ok(Value::String(AgentTool::deny(&e.message).to_string()))
                }
                Err(e) => Err(e),
            };
        }
        gate_of(backend, scope, &call, &args, key).await?;
        backend.call(scope, call).await
    }
    .await;
    backend.record(
        tool,
        outcome.as_ref().map(drop).map_err(|e| e.code.as_str()),
    );
    outcome
}

/// The grants, the turn being live, and a person's verdict where an ask rule matched: `Ok`
/// when the call may run.
async fn gate_of<B: Backend>(
    backend: &B,
    scope: &Scope,
    call: &Call,
    args: &Map<String, Value>,
    key: Option<&CallKey>,
) -> Result<(), ToolError> {
    let tool = call.tool();
    let gate = match call.other_chat(scope) {
        // Past the turn's own chat: only a grant that names the chat.
        Some(chat) => scope.grants.check_beyond(tool, chat)?,
        None => scope.grants.check(tool, call.target(scope))?,
    };
    if !backend.is_live(scope).await {
        return Err(ToolError::turn_ended(&scope.turn_id));
    }
    if gate == Gate::Ask {
        backend.ask(scope, call, args, key).await?;
        // The wait may have outlived the turn.
        if !backend.is_live(scope).await {
            return Err(ToolError::turn_ended(&scope.turn_id));
        }
    }
    Ok(())
}

/// A tool as an agent is offered it.
#[derive(Debug, Clone)]
pub struct ToolDef {
    /// The tool.
    pub tool: Tool,
    /// What it does, for the model.
    pub description: &'static str,
    /// Its arguments, as a JSON schema object.
    pub input_schema: Map<String, Value>,
}

fn schema(properties: Value, required: &[&str]) -> Map<String, Value> {
    let v = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The definition of one tool.
pub fn definition(tool: Tool) -> ToolDef {
    let text = |d: &str| json!({"type": "string", "minLength": 1, "maxLength": MAX_TEXT, "description": d});
    let (description, input_schema) = match tool {
        Tool::SendMessage => (
            "Send a message to the chat this turn answers (or another chat of this group). It is delivered at once, while you keep working; your final answer is sent too, so do not repeat it here.",
            schema(
                json!({
                    "text": text("The message."),
                    "chat_jid": {"type": "string", "description": "Another chat of this group, by JID, when a grant names it; default: the turn's chat."},
                    "idempotency_key": {"type": "string", "maxLength": 128, "description": "Optional key of yours: a retry with the same key sends nothing twice."}
                }),
                &["text"],
            ),
        ),
        Tool::GetHistory => (
            "Read recent messages of the turn's chat, newest last. Page back with `before` (the smallest `seq` you have).",
            schema(
                json!({"limit": {"type": "integer", "minimum": 1, "maximum": MAX_HISTORY, "description": "How many messages (default 50)."}, "before": {"type": "integer", "description": "Only messages with a smaller seq."}}),
                &[],
            ),
        ),
        Tool::SetStatus => (
            "Show a short progress note in the chat (\"searching the docs…\"). There is one per turn: each call replaces the previous text.",
            schema(json!({"text": text("The progress note.")}), &["text"]),
        ),
        Tool::ScheduleTask => (
            "Schedule a prompt to arrive in this group later, as a message that starts a turn: once `at` an instant, once `after` a delay, or repeatedly on a `cron` schedule. Give exactly one of the three.",
            schema(
                json!({
                    "prompt": text("What you will be asked when it fires."),
                    "at": {"type": "string", "description": "RFC 3339 instant, e.g. 2026-12-01T09:00:00Z."},
                    "after": {"type": "string", "description": "A delay: 90s, 10m, 2h, 1h30m."},
                    "cron": {"type": "string", "description": "Five fields in UTC: minute hour day-of-month month day-of-week, e.g. \"0 9 * * 1-5\"."},
                    "chat_jid": {"type": "string", "description": "The chat it arrives in (another chat only when a grant names it); default: the turn's chat."}
                }),
                &["prompt"],
            ),
        ),
        Tool::ListTasks => (
            "List this group's scheduled tasks that are still active, with their next firing.",
            schema(json!({}), &[]),
        ),
        Tool::CancelTask => (
            "Cancel one of this group's scheduled tasks by id.",
            schema(
                json!({"id": {"type": "string", "description": "The task id."}}),
                &["id"],
            ),
        ),
        Tool::ResetSession => (
            "Forget this group's conversation: the next turn starts a fresh session.",
            schema(json!({}), &[]),
        ),
        Tool::RegisterGroup => (
            "Create (or update) a group in a sub-folder of this one, reachable at the chat `web:<folder>`.",
            schema(
                json!({
                    "folder": {"type": "string", "description": "<this folder>/<name>."},
                    "name": text("Display name."),
                    "system_prompt": {"type": "string", "description": "Its system prompt."},
                    "grants": {"type": "array", "items": {"type": "string"}, "description": "Its grant rules, e.g. [\"send_message\", \"get_history\"]."}
                }),
                &["folder", "name"],
            ),
        ),
        Tool::SpawnGroup => (
            "Send a prompt to a sub-folder's group (created with register_group); it runs its own turn and answers in its chat `web:<folder>`.",
            schema(
                json!({"folder": {"type": "string", "description": "<this folder>/<name>."}, "prompt": text("What it is asked.")}),
                &["folder", "prompt"],
            ),
        ),
        Tool::AgentTool => (
            "For the agent program, not the model: asks whether one of the agent's own tools may run (Claude Code's permission prompt). Answers {\"behavior\": \"allow\"|\"deny\", …}.",
            {
                let mut m = schema(
                    json!({
                        "tool_name": {"type": "string", "description": "The agent's tool, e.g. Bash."},
                        "input": {"type": "object", "description": "Its input."},
                        "tool_use_id": {"type": "string", "description": "The agent's id of the call."}
                    }),
                    &["tool_name"],
                );
                m.insert("additionalProperties".into(), json!(true));
                m
            },
        ),
    };
    ToolDef {
        tool,
        description,
        input_schema,
    }
}

/// The tools the scope's group is offered, in order.
pub fn offered(grants: &Grants) -> Vec<ToolDef> {
    Tool::ALL
        .into_iter()
        .filter(|t| grants.offers(*t))
        .map(definition)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::runs::Trust;

    /// A value of the schema's declared type, for every property.
    fn sample(prop: &Value) -> Value {
        match prop["type"].as_str() {
            Some("string") => json!("2026-12-01T09:00:00Z"),
            Some("integer") => json!(5),
            Some("array") => json!(["get_history"]),
            Some("object") => json!({}),
            other => panic!("no sample for {other:?}"),
        }
    }

    /// The schema and the type agree: every property the schema lists parses (all set at
    /// once), every required one is required, and an unknown one is refused.
    #[test]
    fn schemas_and_types_agree() {
        for tool in Tool::ALL {
            let def = definition(tool);
            let props = def.input_schema["properties"].as_object().unwrap();
            let all: Map<String, Value> =
                props.iter().map(|(k, v)| (k.clone(), sample(v))).collect();
            Call::parse(tool, all.clone()).unwrap_or_else(|e| panic!("{tool:?}: {e}"));
            for req in def.input_schema["required"].as_array().unwrap() {
                let mut less = all.clone();
                less.remove(req.as_str().unwrap());
                assert!(Call::parse(tool, less).is_err(), "{tool:?} without {req}");
            }
            let mut more = all.clone();
            more.insert("surprise".into(), json!(1));
            if tool == Tool::AgentTool {
                // A third-party program's prompt format: unknown fields pass.
                assert_eq!(def.input_schema["additionalProperties"], true);
                Call::parse(tool, more).unwrap();
                continue;
            }
            let e = Call::parse(tool, more).unwrap_err();
            assert!(e.message.contains("surprise"), "{tool:?}: {e}");
        }
    }

    #[test]
    fn sizes_and_targets() {
        let scope = Scope {
            folder: GroupFolder::new("a").unwrap(),
            turn_id: TurnId::new("t").unwrap(),
            chat_jid: hako_shared::ChatJid::new("web:a").unwrap(),
            grants: Grants::parse(&[], Trust::Untrusted).unwrap(),
        };
        let big = "x".repeat(MAX_TEXT + 1);
        let e = Call::parse(
            Tool::SendMessage,
            json!({"text": big}).as_object().unwrap().clone(),
        )
        .unwrap_err();
        assert_eq!(e.code, ToolCode::InvalidArguments);
        assert!(
            Call::parse(
                Tool::SetStatus,
                json!({"text": "  "}).as_object().unwrap().clone()
            )
            .is_err()
        );
        let c = Call::parse(
            Tool::SendMessage,
            json!({"text": "hi"}).as_object().unwrap().clone(),
        )
        .unwrap();
        assert_eq!(c.target(&scope), Some("web:a"));
        assert_eq!(offered(&scope.grants).len(), 8);
    }
}
