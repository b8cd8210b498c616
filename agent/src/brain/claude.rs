//! The Claude Code adapter: the real `claude` program driven in its stream-JSON mode (the
//! rest, relay, bridges, warm start, blocks and failures, is the [`harness`]'s).
//!
//! - `claude -p --input-format stream-json --output-format stream-json`: each query is one
//!   user message on its stdin, answered by the events it prints up to its `result` (the
//!   query's answer; with `is_error`, an `error` block). Its session id (a UUID) comes with
//!   its events and is resumed with `--resume`; its transcript lives under `$HOME`, which
//!   persists per folder.
//! - The model: `ANTHROPIC_BASE_URL` is the relay, `ANTHROPIC_API_KEY` the placeholder;
//!   every model it may pick (main, small and fast, subagents) is the group's.
//! - The tools: `--strict-mcp-config --mcp-config` with the harness's bridges: nothing else
//!   can attach an MCP server to the run.
//! - Permissions: never an interactive prompt. Where Claude Code would ask, it calls the
//!   turn's `agent_tool` itself (`--permission-prompt-tool mcp__arizuko__agent_tool`).
//!   Without the turn's server: `bypassPermissions` (the box is the boundary). No settings,
//!   hooks or skills are read from where the agent writes ([`lock_down`]).
//! - Text blocks: Claude Code prints one message per content block, so text before a tool
//!   call comes in its own message, the call in the next.

use std::collections::VecDeque;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::harness::{self, Adapter, Broke, Event, Start, TURN_SERVER, child::Pipes, relay};

/// What the last turn leaves for the next box's early start, under `$HOME`.
const NEXT_LAUNCH: &str = ".hako/claude-next.json";
/// Claude Code's MCP connection timeout for a program started before its turn (its
/// `MCP_TIMEOUT`, in ms): the turn's sockets appear only with the turn, however long the box
/// waits. The largest value its timers take.
const WARM_MCP_TIMEOUT_MS: &str = "2147483647";

/// The Claude Code brain.
pub type ClaudeBrain = harness::Harness<Claude>;

/// The Claude Code adapter.
#[derive(Debug, Default)]
pub struct Claude {
    /// Events read but not yet handed out (one message may hold several).
    queued: VecDeque<Event>,
}

impl ClaudeBrain {
    /// A Claude Code brain with these settings.
    pub fn claude(cfg: harness::Settings) -> Self {
        harness::Harness::new(cfg, Claude::default())
    }
}

impl Adapter for Claude {
    const NAME: &'static str = "Claude Code";
    const NEXT_LAUNCH: &'static str = NEXT_LAUNCH;

    fn command(&mut self, start: &Start<'_>) -> std::io::Result<tokio::process::Command> {
        let model = &start.settings.model;
        let servers: serde_json::Map<String, Value> = start
            .servers
            .iter()
            .map(|s| {
                (
                    s.name.clone(),
                    json!({"type": "stdio", "command": s.command, "args": s.args}),
                )
            })
            .collect();
        let mut cmd = tokio::process::Command::new(&start.settings.program);
        cmd.args([
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            model,
        ]);
        // Where Claude Code would ask a person, it asks the turn's `agent_tool`: the group's
        // grants decide (`*` allows, `?agent_tool:Bash` holds it for a person's verdict).
        if start.asks_the_grants() {
            cmd.args([
                "--permission-mode",
                "default",
                "--permission-prompt-tool",
                &format!("mcp__{TURN_SERVER}__{}", harness::approval::TOOL),
            ]);
        } else {
            cmd.args(["--permission-mode", "bypassPermissions"]);
        }
        cmd.args(["--strict-mcp-config", "--mcp-config"])
            .arg(json!({ "mcpServers": servers }).to_string());
        lock_down(&mut cmd, start.settings);
        if let Some(sid) = &start.launch.session_id {
            cmd.args(["--resume", sid]);
        }
        if !start.launch.system_prompt.is_empty() {
            // One argument, so no prompt can read as another flag.
            cmd.arg(format!(
                "--append-system-prompt={}",
                start.launch.system_prompt
            ));
        }
        if start.early {
            cmd.env("MCP_TIMEOUT", WARM_MCP_TIMEOUT_MS);
        }
        cmd.env("ANTHROPIC_BASE_URL", format!("http://{}", start.relay))
            .env("ANTHROPIC_API_KEY", relay::PLACEHOLDER_KEY)
            .env("ANTHROPIC_MODEL", model)
            .env("ANTHROPIC_SMALL_FAST_MODEL", model)
            .env("ANTHROPIC_DEFAULT_HAIKU_MODEL", model)
            .env("ANTHROPIC_DEFAULT_SONNET_MODEL", model)
            .env("ANTHROPIC_DEFAULT_OPUS_MODEL", model)
            .env("CLAUDE_CODE_SUBAGENT_MODEL", model)
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_TELEMETRY", "1")
            .env("DISABLE_ERROR_REPORTING", "1")
            // The relay holds the token; no credential of any kind is passed down.
            .env_remove("ANTHROPIC_AUTH_TOKEN");
        Ok(cmd)
    }

    async fn open<'a>(
        &'a mut self,
        _pipes: &'a mut Pipes,
        _start: &'a Start<'a>,
    ) -> Result<Option<String>, Broke> {
        self.queued.clear();
        Ok(None)
    }

    async fn send<'a>(&'a mut self, pipes: &'a mut Pipes, text: &'a str) -> Result<(), Broke> {
        let line = json!({
            "type": "user",
            "message": {"role": "user", "content": text},
        })
        .to_string();
        async {
            pipes.stdin.write_all(line.as_bytes()).await?;
            pipes.stdin.write_all(b"\n").await?;
            pipes.stdin.flush().await
        }
        .await
        .map_err(|e| Broke(e.to_string()))
    }

    async fn next<'a>(&'a mut self, pipes: &'a mut Pipes) -> Result<Event, Broke> {
        loop {
            if let Some(e) = self.queued.pop_front() {
                return Ok(e);
            }
            let line = match pipes.read_line().await {
                Ok(Some(l)) => l,
                Ok(None) => return Err(Broke("its output ended".into())),
                Err(e) => return Err(Broke(e.to_string())),
            };
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                // Noise on stdout is not an event; Claude Code prints JSON lines only.
                continue;
            };
            self.queued.extend(events(&ev));
        }
    }
}

/// The events of one line of Claude Code's output.
/// What Claude Code reads from disk: nothing the agent can write decides what it may do.
/// No settings file is loaded (`--setting-sources ""`: not `$HOME/.claude/settings.json`,
/// not the workspace's `.claude/settings*.json`, which the agent's own Write tool reaches and
/// Claude Code would honour, permissions and hooks alike); the seeded `env` comes inline with
/// every hook off; skills come only from the operator's read-only bundle (mounted as a plugin
/// directory), and the workspace's `CLAUDE.md` is read as memory text, which is all it is.
fn lock_down(cmd: &mut tokio::process::Command, settings: &harness::Settings) {
    let env = std::fs::read(settings.home.join(".claude/settings.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .and_then(|s| s.get("env").filter(|e| e.is_object()).cloned())
        .unwrap_or_else(|| json!({}));
    let inline = json!({"disableAllHooks": true, "env": env});
    cmd.args(["--setting-sources", ""])
        .arg("--settings")
        .arg(inline.to_string());
    if let Ok(cwd) = std::env::current_dir() {
        cmd.arg("--add-dir")
            .arg(cwd)
            .env("CLAUDE_CODE_ADDITIONAL_DIRECTORIES_CLAUDE_MD", "1");
    }
    if settings.plugin_dir.join("skills").is_dir() {
        cmd.arg("--plugin-dir").arg(&settings.plugin_dir);
    }
}

fn events(ev: &Value) -> Vec<Event> {
    let mut out = Vec::new();
    match ev["type"].as_str() {
        Some("system") => out.extend(session(ev)),
        // A subagent's messages stay inside its task.
        Some("assistant") if ev["parent_tool_use_id"].is_null() => {
            let (texts, tool) = assistant_parts(&ev["message"]);
            out.extend(texts.into_iter().map(Event::Text));
            if tool {
                out.push(Event::ToolCall);
            }
        }
        Some("result") => {
            out.extend(session(ev));
            let result = ev["result"].as_str().unwrap_or_default().to_owned();
            out.push(if ev["is_error"].as_bool() == Some(true) {
                Event::Failed(if result.trim().is_empty() {
                    format!(
                        "Claude Code ended the turn with an error ({})",
                        ev["subtype"].as_str().unwrap_or("unknown")
                    )
                } else {
                    result
                })
            } else {
                Event::Done(Some(result))
            });
        }
        _ => {}
    }
    out
}

fn session(ev: &Value) -> Option<Event> {
    ev["session_id"]
        .as_str()
        .map(|s| Event::Session(s.to_owned()))
}

/// The text blocks of an assistant message, and whether it calls a tool.
fn assistant_parts(message: &Value) -> (Vec<String>, bool) {
    let mut texts = Vec::new();
    let mut tool = false;
    for c in message["content"].as_array().into_iter().flatten() {
        match c["type"].as_str() {
            Some("text") => {
                if let Some(t) = c["text"].as_str().filter(|t| !t.trim().is_empty()) {
                    texts.push(t.to_owned());
                }
            }
            Some("tool_use") => tool = true,
            _ => {}
        }
    }
    (texts, tool)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_before_a_tool_call_is_told_apart() {
        let (t, tool) = assistant_parts(&json!({"content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}},
        ]}));
        assert_eq!((t, tool), (vec!["Let me look.".to_owned()], true));
        let (t, tool) = assistant_parts(&json!({"content": [{"type": "text", "text": " "}]}));
        assert!(t.is_empty() && !tool);
    }

    #[test]
    fn results_and_sessions() {
        let sid = "5e49896a-ae85-4c55-be81-2f56268bf666";
        assert_eq!(
            events(&json!({"type": "result", "session_id": sid, "result": "hi"})),
            [Event::Session(sid.into()), Event::Done(Some("hi".into()))]
        );
        assert_eq!(
            events(
                &json!({"type": "result", "is_error": true, "subtype": "error_max_turns", "result": ""})
            ),
            [Event::Failed(
                "Claude Code ended the turn with an error (error_max_turns)".into()
            )]
        );
        // A subagent's message is not the answer's.
        assert!(
            events(&json!({"type": "assistant", "parent_tool_use_id": "t",
                "message": {"content": [{"type": "text", "text": "inner"}]}}))
            .is_empty()
        );
    }
}
