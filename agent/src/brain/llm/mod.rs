//! The LLM brain: a tool-use loop against routd's gateway (`api.sock`), with the turn's MCP
//! tools (`mcp.sock`) offered to the model.
//!
//! One query: the user's messages join the conversation; the model is asked (streaming); text
//! it writes before a tool call goes out at once as an `ok` block; its tool calls are carried
//! out over MCP and their results sent back; this repeats until the model stops, whose last
//! text is the query's reply. The conversation is the session: kept across follow-ups in
//! memory and across runs in the agent's home ([`session`]). The spawn token from stdin is the
//! gateway credential: the agent never holds a provider key.
//!
//! Failures: the gateway's refusals (a spent budget's 429, a bad token's 401, the provider's
//! 4xx) are `error` blocks the chat sees; a gateway or provider that does not answer is
//! retried a little, then `fatal` when nothing was said yet (routd retries the turn later).

pub mod http;
pub mod session;
pub use hako_shared::sse;
pub mod wire;

use std::path::PathBuf;
use std::time::Duration;

use hako_shared::contract::{ContainerInput, OutputBlock};
use hako_shared::runs::LlmApi;
use serde_json::Value;

use super::{Brain, BrainError, Io, Outcome, Query, Reply};
use crate::mcp::{self, ToolSpec};
use crate::output::log;
use wire::{Assembly, Part, Role, Signal, Stop, Turn};

/// The largest event stream line or event accepted from the gateway.
const MAX_EVENT: usize = 16 << 20;
/// The most of an error answer read.
const MAX_ERROR_BODY: usize = 64 << 10;
/// Tries of one step when the gateway or provider does not answer (5xx, no connection).
const TRIES: u32 = 3;
/// The longest the gateway may take to start answering (the provider may think a while).
const WAIT: Duration = Duration::from_secs(600);
/// The longest silence inside an answer.
const IDLE: Duration = Duration::from_secs(300);

/// The LLM brain's settings (from the environment; see `specs/agent-script.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlmSettings {
    /// The wire format (`HAKO_LLM_API`).
    pub api: LlmApi,
    /// The model (`HAKO_MODEL`).
    pub model: String,
    /// The gateway socket (`HAKO_API_SOCKET`).
    pub socket: PathBuf,
    /// Output tokens per step (`HAKO_LLM_MAX_TOKENS`).
    pub max_tokens: u32,
    /// Model steps per query (`HAKO_LLM_MAX_STEPS`).
    pub max_steps: u32,
    /// Where sessions are kept (`HAKO_SESSION_DIR`).
    pub sessions: PathBuf,
}

/// The brain.
pub struct LlmBrain {
    cfg: LlmSettings,
    store: session::Store,
    session: Option<String>,
    turns: Vec<Turn>,
    tools: Option<Vec<ToolSpec>>,
    mcp: Option<mcp::Client>,
    partial: String,
}

/// A failed step, before it is told apart as `error` or `fatal`.
#[derive(Debug)]
enum StepError {
    /// The gateway or the provider did not answer (worth a retry).
    Unavailable(String),
    /// A refusal or a broken answer: the chat should see it.
    Refused(String),
}

impl LlmBrain {
    /// A brain with these settings.
    pub fn new(cfg: LlmSettings) -> Self {
        Self {
            store: session::Store::new(cfg.sessions.clone()),
            cfg,
            session: None,
            turns: Vec::new(),
            tools: None,
            mcp: None,
            partial: String::new(),
        }
    }

    fn open_session(&mut self, input: &ContainerInput) {
        if self.session.is_some() {
            return;
        }
        let resumed = Some(input.session_id.as_str()).filter(|id| session::valid_id(id));
        let id = match resumed {
            Some(id) => {
                self.turns = self.store.load(id);
                log(format_args!(
                    "session {id}: resumed with {} turn(s)",
                    self.turns.len()
                ));
                id.to_owned()
            }
            None => session::new_id(),
        };
        self.session = Some(id);
    }

    fn save(&self) {
        if let Some(id) = &self.session
            && let Err(e) = self.store.save(id, &self.turns)
        {
            log(format_args!("session {id}: not saved: {e}"));
        }
    }

    /// The turn's tools, listed once per run; without the socket the model gets none.
    async fn tools(&mut self, io: &Io) -> Vec<ToolSpec> {
        if let Some(t) = &self.tools {
            return t.clone();
        }
        let tools = match mcp::Client::connect(&io.mcp_socket).await {
            Ok(c) => {
                let mut t = c.tools().await.unwrap_or_else(|e| {
                    log(format_args!("tools: listing failed: {e}"));
                    Vec::new()
                });
                // The agent program's own permission prompt, not a tool for the model.
                t.retain(|t| t.name != "agent_tool");
                self.mcp = Some(c);
                t
            }
            Err(e) => {
                log(format_args!("tools: none ({e})"));
                Vec::new()
            }
        };
        log(format_args!("tools: {} offered to the model", tools.len()));
        self.tools = Some(tools.clone());
        tools
    }

    async fn call_tool(&mut self, io: &Io, name: &str, input: &Value) -> (String, bool) {
        let Value::Object(args) = input else {
            return ("the arguments must be a JSON object".into(), true);
        };
        // One name for the call however often it is asked: a connection routd closed (a
        // restart, while a person decides) is made again and the call asked again, and routd
        // attaches it to the request or message it started.
        let key = mcp::new_call_key();
        // When the connection broke; a socket not there at all fails at once.
        let mut broke: Option<tokio::time::Instant> = None;
        loop {
            if self.mcp.is_none() {
                match mcp::Client::connect(&io.mcp_socket).await {
                    Ok(c) => self.mcp = Some(c),
                    Err(e) if broke.is_some_and(|at| at.elapsed() < mcp::RECONNECT_WAIT) => {
                        log(format_args!("tool {name}: {e}; trying again"));
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                        continue;
                    }
                    Err(e) => return (format!("the tools are not reachable: {e}"), true),
                }
            }
            let Some(client) = &self.mcp else { continue };
            match client.call(name, args.clone(), Some(&key)).await {
                Ok(r) => return (r.text, r.is_error),
                Err(e @ mcp::McpError::Broken { .. })
                    if broke.is_none_or(|at| at.elapsed() < mcp::RECONNECT_WAIT) =>
                {
                    log(format_args!("tool {name}: {e}; reconnecting"));
                    broke.get_or_insert_with(tokio::time::Instant::now);
                    if let Some(c) = self.mcp.take() {
                        c.close().await;
                    }
                }
                Err(e) => return (format!("the tool call failed: {e}"), true),
            }
        }
    }

    /// One model step: the request, the streamed answer assembled. Text before a tool call is
    /// emitted as soon as the call begins; `emitted` counts the text parts already out.
    async fn step(
        &mut self,
        input: &ContainerInput,
        io: &Io,
        tools: &[ToolSpec],
        emitted: &mut usize,
    ) -> Result<(Vec<Part>, Stop), StepError> {
        let body = wire::request(
            self.cfg.api,
            &self.cfg.model,
            self.cfg.max_tokens,
            &input.system_prompt,
            &self.turns,
            tools,
        );
        let body = serde_json::to_vec(&body).map_err(|e| StepError::Refused(e.to_string()))?;
        let token = input.token.expose();
        let bearer = format!("Bearer {token}");
        let (path, headers): (&str, Vec<(&str, &str)>) = match self.cfg.api {
            LlmApi::Anthropic => (
                "/v1/messages",
                vec![("x-api-key", token), ("anthropic-version", "2023-06-01")],
            ),
            LlmApi::Openai => ("/v1/chat/completions", vec![("authorization", &bearer)]),
        };
        let mut answer = http::post_json(&self.cfg.socket, path, &headers, body, WAIT, IDLE)
            .await
            .map_err(|e| StepError::Unavailable(e.to_string()))?;
        if answer.status != 200 {
            let status = answer.status;
            let should_retry = answer.should_retry;
            let text = answer.text(MAX_ERROR_BODY).await.unwrap_or_default();
            let (code, why) = error_message(&text);
            let msg = format!("the model gateway answered {status}: {why}");
            // A refusal no retry can fix (the provider refusing routd's key, no key, a spent
            // budget) says so (`x-should-retry: false`): the chat should see it at once.
            let transient = matches!(status, 500 | 502 | 503 | 504 | 529)
                && should_retry != Some(false)
                && code.as_deref() != Some("provider_not_configured");
            return Err(if transient {
                StepError::Unavailable(msg)
            } else {
                StepError::Refused(msg)
            });
        }
        let mut parser = sse::Parser::new(MAX_EVENT);
        let mut assembly = Assembly::new(self.cfg.api);
        let mut events = Vec::new();
        while let Some(piece) = answer
            .next()
            .await
            .map_err(|e| StepError::Refused(format!("the answer broke off: {e}")))?
        {
            parser
                .feed(&piece, &mut events)
                .map_err(|e| StepError::Refused(e.to_string()))?;
            for ev in events.drain(..) {
                let signal = assembly.event(&ev).map_err(StepError::Refused)?;
                if signal == Some(Signal::ToolStarted) {
                    self.emit_texts(io, &assembly.parts, emitted).await;
                }
            }
        }
        assembly.finish().map_err(StepError::Refused)
    }

    /// Emits the text parts not yet out, each as an `ok` block.
    async fn emit_texts(&mut self, io: &Io, parts: &[Part], emitted: &mut usize) {
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        for t in texts.iter().skip(*emitted) {
            if !t.trim().is_empty() {
                io.out.block(&OutputBlock::ok(*t)).await;
            }
        }
        *emitted = texts.len();
    }

    fn remember(&mut self, parts: &[Part]) {
        for p in parts {
            if let Part::Text { text } = p {
                if !self.partial.is_empty() {
                    self.partial.push_str("\n\n");
                }
                self.partial.push_str(text);
            }
        }
    }
}

/// The code (hako's envelope) and message of an error answer: hako's envelope, Anthropic's
/// or OpenAI's error object, or the text itself.
fn error_message(body: &str) -> (Option<String>, String) {
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    let from = |v: &Value| v.get("message").and_then(Value::as_str).map(str::to_owned);
    let code = v.get("error").and_then(Value::as_str).map(str::to_owned);
    let msg = from(&v)
        .or_else(|| v.get("error").and_then(from))
        .unwrap_or_else(|| body.chars().take(500).collect());
    (code, msg)
}

impl Brain for LlmBrain {
    async fn respond<'a>(
        &'a mut self,
        query: Query<'a>,
        io: &'a Io,
    ) -> Result<Outcome, BrainError> {
        self.partial.clear();
        self.open_session(query.input);
        let text = query.user_text();
        if text.trim().is_empty() {
            return Ok(Outcome::Reply(Reply::default()));
        }
        // A user turn after a user turn (the last query failed before the model answered):
        // one turn, as the APIs want roles to alternate.
        match self.turns.last_mut() {
            Some(t) if t.is_user_text() => t.content.push(Part::Text { text }),
            _ => self.turns.push(Turn {
                role: Role::User,
                content: vec![Part::Text { text }],
            }),
        }
        let tools = self.tools(io).await;
        let mut said_anything = false;
        let mut steps = 0;
        let reply = loop {
            steps += 1;
            if steps > self.cfg.max_steps {
                break format!(
                    "(stopped after {} model steps; HAKO_LLM_MAX_STEPS)",
                    self.cfg.max_steps
                );
            }
            let mut emitted = 0;
            let mut tries = 0;
            let (parts, stop) = loop {
                tries += 1;
                match self.step(query.input, io, &tools, &mut emitted).await {
                    Ok(r) => break r,
                    Err(StepError::Unavailable(why)) if tries < TRIES && emitted == 0 => {
                        log(format_args!("step {steps}: {why}; trying again"));
                        tokio::time::sleep(Duration::from_secs(u64::from(tries) * 2)).await;
                    }
                    Err(StepError::Unavailable(why)) if !said_anything && emitted == 0 => {
                        self.save();
                        return Err(BrainError::Fatal(why));
                    }
                    Err(StepError::Unavailable(why) | StepError::Refused(why)) => {
                        self.save();
                        return Err(BrainError::Failed(why));
                    }
                }
            };
            said_anything |= emitted > 0;
            self.remember(&parts);
            let calls: Vec<(String, String, Value)> = parts
                .iter()
                .filter_map(|p| match p {
                    Part::ToolUse { id, name, input } => {
                        Some((id.clone(), name.clone(), input.clone()))
                    }
                    _ => None,
                })
                .collect();
            let texts: Vec<String> = parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text { text } => Some(text.clone()),
                    _ => None,
                })
                .skip(emitted)
                .collect();
            self.turns.push(Turn {
                role: Role::Assistant,
                content: parts,
            });
            if stop != Stop::ToolUse || calls.is_empty() {
                self.save();
                break texts.join("\n\n");
            }
            // Text after the last call, if any, is out before the tools run.
            for t in &texts {
                if !t.trim().is_empty() {
                    io.out.block(&OutputBlock::ok(t.as_str())).await;
                    said_anything = true;
                }
            }
            let mut results = Vec::with_capacity(calls.len());
            for (id, name, input) in calls {
                let (content, is_error) = self.call_tool(io, &name, &input).await;
                log(format_args!(
                    "tool {name}: {} ({} bytes)",
                    if is_error { "error" } else { "ok" },
                    content.len()
                ));
                results.push(Part::ToolResult {
                    tool_use_id: id,
                    content,
                    is_error,
                });
            }
            self.turns.push(Turn {
                role: Role::User,
                content: results,
            });
            self.save();
        };
        Ok(Outcome::Reply(Reply {
            text: reply,
            new_session_id: self.session.clone(),
        }))
    }

    fn partial(&self) -> String {
        self.partial.clone()
    }
}
