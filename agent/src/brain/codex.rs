//! The Codex adapter: OpenAI's Codex CLI driven through its app server (`codex app-server`,
//! JSON-RPC over stdio; the rest, relay, bridges, warm start, blocks and failures, is the
//! [`harness`]'s).
//!
//! Why the app server and not `codex exec --json` with `exec resume`: one process serves the
//! whole run (a follow-up is one more `turn/start` on the same thread, with no new process
//! and no reload of the session), it can be started and its session opened before the turn
//! (a warm box), and its approval requests come to hako-agent as requests it answers, which
//! `exec` cannot (there an MCP call or a command that needs approval is simply cancelled).
//! Measured against a stub model: `codex exec` about 260 ms per query (start included);
//! the app server 150-290 ms to start once, then about 60 ms per turn.
//!
//! - **Session**: `thread/start`, or `thread/resume` of the turn's `sessionId` (a Codex
//!   thread id, a UUID); the group's system prompt as its developer instructions. Each query
//!   is a `turn/start`; its agent messages are the text, its `turn/completed` the answer.
//! - **The model**: a provider `hako` with `wire_api = "responses"` at the relay
//!   (`http://127.0.0.1:<port>/v1`), its key the placeholder in `HAKO_CODEX_API_KEY`; the
//!   group's model for everything (`model`, `review_model`); the gateway refuses any other.
//! - **The tools**: the harness's bridges as `mcp_servers`, their tools approved by Codex
//!   without asking (`default_tools_approval_mode = "approve"`: routd checks the grants of
//!   every call itself), with an hour per call (a call may wait for a person's verdict).
//! - **Approvals**: `approval_policy = "untrusted"`: every command that is not read-only, and
//!   every file change, is asked of hako-agent, which asks the group's grants (the turn's
//!   `agent_tool`) with the tool named as Claude Code's is, so that one rule covers both
//!   agents: a command is `Bash` (`{"command", "cwd"}`), a file change `Edit` (`{"changes"}`).
//!   Allowed: `accept`; denied: `decline` (the model reads it and goes on). Without the
//!   turn's server every request is accepted (the box is the boundary).
//! - **Its own sandbox is off** (`danger-full-access`): it needs capabilities and user
//!   namespaces a hako box never has. The box is the sandbox.
//! - **No configuration from the agent's files**: `CODEX_HOME` is a directory hako-agent
//!   makes afresh on the box's `/tmp` at each start, holding only its `config.toml` (which
//!   marks the working directory untrusted: Codex then loads no project `.codex/` config,
//!   hooks or exec policy rules from the workspace) and a link to the folder's sessions
//!   (`$HOME/.codex/sessions`, data, never settings). Everything else is passed with `-c`,
//!   Codex's highest layer; Codex reads its configuration when a thread starts, and the only
//!   thread is opened before the model can run anything in this box (subagents, which would
//!   be new threads, are off); hooks are switched off, and the image's managed
//!   requirements (`/etc/codex/requirements.toml`) allow no other approval policy, reviewer,
//!   sandbox or web search whatever any layer says. The folder's `AGENTS.md` (and
//!   `CLAUDE.md`, the memory a Claude Code group keeps) are read as instructions, as memory
//!   is.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::harness::approval::{Approver, Verdict};
use super::harness::{self, Adapter, Broke, Event, Start, child::Pipes, relay};
use crate::output::log;

/// What the last turn leaves for the next box's early start, under `$HOME`.
const NEXT_LAUNCH: &str = ".hako/codex-next.json";
/// Where the folder's Codex sessions are kept, under `$HOME`.
const SESSIONS: &str = ".codex/sessions";
/// The variable holding the placeholder key (the provider's `env_key`).
const KEY_ENV: &str = "HAKO_CODEX_API_KEY";
/// How long Codex waits for an MCP server to start: a program started before its turn waits
/// for the turn's sockets however long the box waits (about 24 days); otherwise a minute.
const WARM_MCP_STARTUP_SECS: u64 = 2_000_000;
const MCP_STARTUP_SECS: u64 = 60;
/// How long one MCP call may take: it may wait for a person's verdict (routd bounds that).
const MCP_CALL_SECS: u64 = 3600;
/// Retries of a model call that failed to connect or broke off (Codex's default is 5, with
/// back-off: 25 s of them before a turn fails).
const MODEL_RETRIES: u32 = 3;
/// Notifications hako-agent does not read (deltas of what it reads whole).
const UNREAD: &[&str] = &[
    "item/agentMessage/delta",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "item/reasoning/summaryTextDelta",
    "item/reasoning/summaryPartAdded",
    "item/reasoning/textDelta",
    "item/plan/delta",
    "thread/tokenUsage/updated",
    "account/rateLimits/updated",
];
/// Codex's features that would reach out of the box or run something on their own (hooks,
/// apps and plugins, browsers, image generation by the provider), and subagents: a subagent is
/// a new thread, and a new thread reads `CODEX_HOME/config.toml` again, which by then the
/// model's commands could have rewritten.
const OFF: &[&str] = &[
    "multi_agent",
    "hooks",
    "apps",
    "plugins",
    "remote_plugin",
    "image_generation",
    "browser_use",
    "browser_use_external",
    "computer_use",
    "in_app_browser",
];

/// The Codex brain.
pub type CodexBrain = harness::Harness<Codex>;

impl CodexBrain {
    /// A Codex brain with these settings.
    pub fn codex(cfg: harness::Settings) -> Self {
        let approver = Approver::new(cfg.mcp_socket.clone());
        harness::Harness::new(cfg, Codex::new(approver))
    }
}

/// An approval being asked: the request's id and the answer, once the grants said.
type Answer = Pin<Box<dyn Future<Output = (Value, Value)>>>;

/// The Codex adapter.
pub struct Codex {
    /// Its `CODEX_HOME` (made afresh at each start).
    home: PathBuf,
    next_id: u64,
    thread: Option<String>,
    /// The id of this query's `turn/start`.
    turn_request: Option<u64>,
    approver: Rc<Approver>,
    /// Whether requests are asked of the grants (the turn's server is there to ask).
    asks: bool,
    /// The MCP servers it was given (their own approval prompts are answered yes).
    servers: Vec<String>,
    approvals: FuturesUnordered<Answer>,
    /// The changes of file change items, by item id, for their approval requests.
    changes: HashMap<String, Value>,
    queued: VecDeque<Event>,
}

impl Codex {
    fn new(approver: Rc<Approver>) -> Self {
        Codex {
            home: std::env::temp_dir().join(format!("hako-codex.{}", std::process::id())),
            next_id: 0,
            thread: None,
            turn_request: None,
            approver,
            asks: false,
            servers: Vec::new(),
            approvals: FuturesUnordered::new(),
            changes: HashMap::new(),
            queued: VecDeque::new(),
        }
    }

    /// A fresh `CODEX_HOME`: its configuration hako-agent's alone, the folder's sessions
    /// linked in.
    fn make_home(&self, home: &Path, cwd: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt as _;
        let at = |path: &Path| {
            let path = path.display().to_string();
            move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{path}: {e}"))
        };
        match std::fs::remove_dir_all(&self.home) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(at(&self.home)(e)),
            _ => {}
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.home)
            .map_err(at(&self.home))?;
        let sessions = home.join(SESSIONS);
        std::fs::create_dir_all(&sessions).map_err(at(&sessions))?;
        std::os::unix::fs::symlink(&sessions, self.home.join("sessions"))
            .map_err(at(&self.home))?;
        // The working directory is untrusted: Codex loads no project config, hooks or exec
        // policy from it (it would mark it trusted itself, and then load them).
        let config = format!(
            "[projects.{}]\ntrust_level = \"untrusted\"\n",
            toml_str(&cwd.display().to_string())
        );
        std::fs::write(self.home.join("config.toml"), config)
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Sends a request; answers its id.
    async fn request(
        &mut self,
        pipes: &mut Pipes,
        method: &str,
        params: Value,
    ) -> Result<u64, Broke> {
        let id = self.id();
        write(
            pipes,
            &json!({"id": id, "method": method, "params": params}),
        )
        .await?;
        Ok(id)
    }

    /// Waits for the answer to request `id` (handling what comes meanwhile); `Err(message)`
    /// for a JSON-RPC error.
    async fn answer(&mut self, pipes: &mut Pipes, id: u64) -> Result<Result<Value, String>, Broke> {
        loop {
            let msg = read(pipes).await?;
            if msg.get("method").is_none() && msg["id"] == id {
                return Ok(match msg.get("error") {
                    Some(e) => Err(e["message"].as_str().unwrap_or("error").to_owned()),
                    None => Ok(msg["result"].clone()),
                });
            }
            self.handle(pipes, msg).await?;
        }
    }

    /// One message of Codex's that is not an awaited answer.
    async fn handle(&mut self, pipes: &mut Pipes, msg: Value) -> Result<(), Broke> {
        let method = msg["method"].as_str().unwrap_or("").to_owned();
        if msg.get("id").is_some() && !method.is_empty() {
            return self.request_from_codex(pipes, &method, msg).await;
        }
        if method.is_empty() {
            // An answer: only `turn/start`'s matters (its error ends the query).
            if msg["id"] == json!(self.turn_request) && msg.get("error").is_some() {
                self.turn_request = None;
                let why = msg["error"]["message"].as_str().unwrap_or("refused");
                self.queued
                    .push_back(Event::Failed(format!("Codex refused the query: {why}")));
            }
            return Ok(());
        }
        let p = &msg["params"];
        match method.as_str() {
            "item/started" => {
                let item = &p["item"];
                match item["type"].as_str().unwrap_or("") {
                    "agentMessage" | "userMessage" | "reasoning" | "plan" | "hookPrompt"
                    | "contextCompaction" => {}
                    ty => {
                        if ty == "fileChange"
                            && let Some(id) = item["id"].as_str()
                        {
                            self.changes.insert(id.to_owned(), item["changes"].clone());
                        }
                        self.queued.push_back(Event::ToolCall);
                    }
                }
            }
            "item/completed" => {
                let item = &p["item"];
                if item["type"] == "agentMessage"
                    && let Some(text) = item["text"].as_str()
                {
                    self.queued.push_back(Event::Text(text.to_owned()));
                }
                if let Some(id) = item["id"].as_str() {
                    self.changes.remove(id);
                }
            }
            "turn/completed" => {
                let turn = &p["turn"];
                self.turn_request = None;
                self.queued.push_back(match turn["status"].as_str() {
                    Some("completed") => Event::Done(None),
                    Some("interrupted") => Event::Failed("Codex's turn was interrupted".into()),
                    _ => Event::Failed(turn["error"]["message"].as_str().map_or_else(
                        || "Codex failed the turn".to_owned(),
                        |m| format!("Codex failed the turn: {m}"),
                    )),
                });
            }
            "error" if p["willRetry"] != true => log(format_args!(
                "Codex: {}",
                p["error"]["message"].as_str().unwrap_or("an error")
            )),
            _ => {}
        }
        Ok(())
    }

    /// A request of Codex's: approvals go to the grants (answered when they say), anything
    /// else is answered now.
    async fn request_from_codex(
        &mut self,
        pipes: &mut Pipes,
        method: &str,
        msg: Value,
    ) -> Result<(), Broke> {
        let id = msg["id"].clone();
        let p = &msg["params"];
        let ask = match method {
            "item/commandExecution/requestApproval" => Some((
                "Bash",
                json!({"command": p["command"], "cwd": p["cwd"], "reason": p["reason"]}),
            )),
            "item/fileChange/requestApproval" => Some((
                "Edit",
                json!({
                    "changes": p["itemId"].as_str().and_then(|i| self.changes.get(i)).cloned(),
                    "reason": p["reason"],
                    "grantRoot": p["grantRoot"],
                }),
            )),
            _ => None,
        };
        if let Some((tool, input)) = ask {
            if !self.asks {
                return respond(pipes, &id, json!({"decision": "accept"})).await;
            }
            let approver = self.approver.clone();
            let item = p["itemId"].as_str().map(str::to_owned);
            self.approvals.push(Box::pin(async move {
                let decision = match approver.ask(tool, input, item.as_deref()).await {
                    Verdict::Allow => "accept",
                    Verdict::Deny(_) => "decline",
                };
                (id, json!({"decision": decision}))
            }));
            return Ok(());
        }
        let result = match method {
            // The tools of hako's own servers: routd checks the grants of every call.
            "mcpServer/elicitation/request"
                if p["_meta"]["codex_approval_kind"] == "mcp_tool_call"
                    && self.servers.iter().any(|s| p["serverName"] == *s) =>
            {
                json!({"action": "accept", "content": null})
            }
            // No person sits at Codex: questions and forms go unanswered.
            "mcpServer/elicitation/request" => json!({"action": "decline", "content": null}),
            "item/tool/requestUserInput" => json!({"answers": {}}),
            "item/permissions/requestApproval" => json!({"permissions": {}}),
            _ => {
                return write(
                    pipes,
                    &json!({"id": id, "error": {"code": -32601,
                        "message": format!("hako-agent does not answer {method}")}}),
                )
                .await;
            }
        };
        respond(pipes, &id, result).await
    }
}

/// A TOML string (a JSON string is one, for the characters JSON escapes).
fn toml_str(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

async fn write(pipes: &mut Pipes, msg: &Value) -> Result<(), Broke> {
    let mut line = msg.to_string();
    line.push('\n');
    async {
        pipes.stdin.write_all(line.as_bytes()).await?;
        pipes.stdin.flush().await
    }
    .await
    .map_err(|e| Broke(format!("writing to Codex: {e}")))
}

async fn respond(pipes: &mut Pipes, id: &Value, result: Value) -> Result<(), Broke> {
    write(pipes, &json!({"id": id, "result": result})).await
}

/// The next JSON-RPC message (lines that are no JSON object are skipped).
async fn read(pipes: &mut Pipes) -> Result<Value, Broke> {
    loop {
        let line = match pipes.read_line().await {
            Ok(Some(l)) => l,
            Ok(None) => return Err(Broke("its output ended".into())),
            Err(e) => return Err(Broke(e.to_string())),
        };
        if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(&line) {
            return Ok(v);
        }
    }
}

impl Adapter for Codex {
    const NAME: &'static str = "Codex";
    const NEXT_LAUNCH: &'static str = NEXT_LAUNCH;

    fn command(&mut self, start: &Start<'_>) -> std::io::Result<tokio::process::Command> {
        let cwd = std::env::current_dir()?;
        self.make_home(&start.settings.home, &cwd)?;
        self.asks = start.asks_the_grants();
        self.servers = start.servers.iter().map(|s| s.name.clone()).collect();
        let model = toml_str(&start.settings.model);
        let startup = if start.early {
            WARM_MCP_STARTUP_SECS
        } else {
            MCP_STARTUP_SECS
        };
        let servers: Vec<String> = start
            .servers
            .iter()
            .map(|s| {
                let args: Vec<String> = s.args.iter().map(|a| toml_str(a)).collect();
                format!(
                    "{} = {{command = {}, args = [{}], startup_timeout_sec = {startup}, \
                     tool_timeout_sec = {MCP_CALL_SECS}, default_tools_approval_mode = \"approve\"}}",
                    toml_str(&s.name),
                    toml_str(&s.command),
                    args.join(", ")
                )
            })
            .collect();
        let mut config = vec![
            format!("model={model}"),
            format!("review_model={model}"),
            "model_provider=\"hako\"".to_owned(),
            format!(
                "model_providers.hako={{name = \"hako\", base_url = {}, wire_api = \"responses\", \
                 env_key = \"{KEY_ENV}\", request_max_retries = {MODEL_RETRIES}, \
                 stream_max_retries = {MODEL_RETRIES}}}",
                toml_str(&format!("http://{}/v1", start.relay))
            ),
            format!("mcp_servers={{{}}}", servers.join(", ")),
            "approval_policy=\"untrusted\"".to_owned(),
            "approvals_reviewer=\"user\"".to_owned(),
            "sandbox_mode=\"danger-full-access\"".to_owned(),
            "web_search=\"disabled\"".to_owned(),
            "check_for_update_on_startup=false".to_owned(),
            "analytics.enabled=false".to_owned(),
            "history.persistence=\"none\"".to_owned(),
            "project_doc_fallback_filenames=[\"CLAUDE.md\"]".to_owned(),
        ];
        config.extend(OFF.iter().map(|f| format!("features.{f}=false")));
        let mut cmd = tokio::process::Command::new(&start.settings.program);
        cmd.arg("app-server");
        for c in config {
            cmd.arg("-c").arg(c);
        }
        cmd.env("CODEX_HOME", &self.home)
            .env(KEY_ENV, relay::PLACEHOLDER_KEY)
            // The relay holds the token; no credential of any kind is passed down.
            .env_remove("OPENAI_API_KEY")
            .env_remove("CODEX_API_KEY")
            .env_remove("OPENAI_BASE_URL");
        Ok(cmd)
    }

    async fn open<'a>(
        &'a mut self,
        pipes: &'a mut Pipes,
        start: &'a Start<'a>,
    ) -> Result<Option<String>, Broke> {
        self.queued.clear();
        self.thread = None;
        let init = self
            .request(
                pipes,
                "initialize",
                json!({
                    "clientInfo": {"name": "hako-agent", "version": env!("CARGO_PKG_VERSION")},
                    "capabilities": {"optOutNotificationMethods": UNREAD},
                }),
            )
            .await?;
        if let Err(e) = self.answer(pipes, init).await? {
            return Err(Broke(format!("initialize: {e}")));
        }
        write(pipes, &json!({"method": "initialized"})).await?;
        let cwd = std::env::current_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|_| "/workspace".into());
        let prompt = &start.launch.system_prompt;
        let mut params = json!({"cwd": cwd});
        if !prompt.is_empty() {
            params["developerInstructions"] = json!(prompt);
        }
        if let Some(sid) = &start.launch.session_id {
            let mut resume = params.clone();
            resume["threadId"] = json!(sid);
            let id = self.request(pipes, "thread/resume", resume).await?;
            match self.answer(pipes, id).await? {
                Ok(r) => self.thread = r["thread"]["id"].as_str().map(str::to_owned),
                Err(e) => log(format_args!(
                    "Codex cannot resume the chat's session ({e}): a new one"
                )),
            }
        }
        if self.thread.is_none() {
            let id = self.request(pipes, "thread/start", params).await?;
            match self.answer(pipes, id).await? {
                Ok(r) => self.thread = r["thread"]["id"].as_str().map(str::to_owned),
                Err(e) => return Err(Broke(format!("thread/start: {e}"))),
            }
        }
        match &self.thread {
            Some(t) => Ok(Some(t.clone())),
            None => Err(Broke("Codex named no thread".into())),
        }
    }

    async fn send<'a>(&'a mut self, pipes: &'a mut Pipes, text: &'a str) -> Result<(), Broke> {
        self.queued.clear();
        let thread = self
            .thread
            .clone()
            .ok_or_else(|| Broke("no thread".into()))?;
        let id = self
            .request(
                pipes,
                "turn/start",
                json!({"threadId": thread, "input": [{"type": "text", "text": text}]}),
            )
            .await?;
        self.turn_request = Some(id);
        Ok(())
    }

    async fn next<'a>(&'a mut self, pipes: &'a mut Pipes) -> Result<Event, Broke> {
        loop {
            if let Some(e) = self.queued.pop_front() {
                return Ok(e);
            }
            // Codex waits for the approvals it asked for; its other messages are read
            // meanwhile (a read cut short by an answer loses nothing).
            let msg = tokio::select! {
                m = read(pipes) => m?,
                Some((id, result)) = self.approvals.next(), if !self.approvals.is_empty() => {
                    respond(pipes, &id, result).await?;
                    continue;
                }
            };
            self.handle(pipes, msg).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_are_quoted_and_escaped() {
        assert_eq!(toml_str("gpt-5"), "\"gpt-5\"");
        assert_eq!(toml_str("a\"b\\c\nd"), "\"a\\\"b\\\\c\\nd\"");
    }
}
