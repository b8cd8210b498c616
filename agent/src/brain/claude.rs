//! The Claude Code brain: the real `claude` program as a child process, driven in its
//! stream-JSON mode, reaching its model only through routd's gateway and its tools only
//! through the turn's sockets.
//!
//! - **One process per run.** The first query starts `claude -p --input-format stream-json
//!   --output-format stream-json`; each query (the initial messages, then every follow-up) is
//!   one user message written to its stdin, answered by the events it prints up to its
//!   `result`. A follow-up therefore reaches the same live process and session.
//! - **The model without the key.** A `network: none` box has loopback only: a relay on
//!   `127.0.0.1` ([`relay`]) proxies to the gateway's `api.sock` and puts the run's spawn
//!   token on each request itself. The child gets `ANTHROPIC_BASE_URL` pointing at it and a
//!   placeholder `ANTHROPIC_API_KEY`: neither it nor anything it starts ever holds the token.
//!   Every model it may pick (main, small and fast, subagents) is the group's (`HAKO_MODEL`);
//!   the gateway refuses any other.
//! - **Started before the turn.** In a warm box ([`ClaudeBrain::prepare`]) the child starts
//!   while the box waits for its input, with the session and system prompt the folder's last
//!   turn left for the next one (`$HOME/.hako/claude-next.json`); its MCP bridges wait for the
//!   turn (a mark the agent makes when its input comes) and its model requests for the token. The turn uses it only if its own
//!   session and system prompt are the same; otherwise it is killed and a child started for
//!   the turn, as in a cold box.
//! - **The turn's tools.** The MCP servers of the seeded `.claude/settings.json` (the turn's
//!   `mcp.sock`, each sidecar's), each reached by `hako-agent mcp-bridge` instead of `socat`,
//!   are passed with `--strict-mcp-config`: nothing else can attach an MCP server to the run.
//! - **Permissions.** Never an interactive prompt: where Claude Code would ask, it calls the
//!   turn's `agent_tool` (`--permission-prompt-tool mcp__arizuko__agent_tool`), so the
//!   group's grants decide, and an ask rule (`?agent_tool:Bash`) holds the call for a
//!   person's verdict in the chat. Without the turn's server: `bypassPermissions` (the box
//!   is the boundary).
//! - **Blocks.** Text the model writes before a tool call goes out as an `ok` block at once;
//!   the `result` is the query's reply, `newSessionId` Claude Code's session id (its
//!   transcript lives under `$HOME`, which persists per folder), resumed with `--resume`.
//! - **Failures.** A `result` with `is_error` is an `error` block; the child exiting or
//!   printing garbage before its `result` is `fatal` when nothing was said yet (never a hang:
//!   its stdout closing ends the wait). Dropping the brain kills the child.

pub mod relay;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};

use super::{Brain, BrainError, Io, Outcome, Query, Reply};
use crate::output::log;
use hako_shared::contract::{ContainerInput, OutputBlock};

/// The name of the turn's MCP server in Claude Code's configuration (the seeded settings').
const TURN_SERVER: &str = "arizuko";
/// The longest line of Claude Code's output accepted (a tool result can be large).
const MAX_LINE: usize = 32 << 20;
/// How much of the child's stderr is kept for an error message.
const STDERR_TAIL: usize = 4 << 10;
/// What the last turn leaves for the next box's early start, under `$HOME`.
const NEXT_LAUNCH: &str = ".hako/claude-next.json";
/// Claude Code's MCP connection timeout for a child started before its turn (its
/// `MCP_TIMEOUT`, in ms): the turn's sockets appear only with the turn, however long the box
/// waits. The largest value its timers take.
const WARM_MCP_TIMEOUT_MS: &str = "2147483647";

/// The Claude Code brain's settings (from the environment; `specs/agent-script.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaudeSettings {
    /// The model every call uses (`HAKO_MODEL`).
    pub model: String,
    /// The `claude` program (`HAKO_CLAUDE_BIN`).
    pub program: PathBuf,
    /// The gateway socket (`HAKO_API_SOCKET`).
    pub api_socket: PathBuf,
    /// The turn's MCP socket, used when no settings file names the servers.
    pub mcp_socket: PathBuf,
    /// The agent's home (`HOME`), holding the seeded `.claude/settings.json`.
    pub home: PathBuf,
    /// This program, for the MCP bridges (`/proc/self/exe` by default).
    pub bridge: PathBuf,
    /// The read-only plugin directory whose `skills/` is the operator's bundle
    /// (`hako_shared::contract::SKILLS_PLUGIN_DIR`).
    pub plugin_dir: PathBuf,
}

/// What a child is started with that a turn must share to use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launch {
    /// The session it resumes (`--resume`); a new one when `None`.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Its `--append-system-prompt`; none when blank.
    #[serde(default)]
    pub system_prompt: String,
}

impl Launch {
    /// What a turn with this input needs.
    pub fn of(input: &ContainerInput) -> Launch {
        Launch::new(Some(input.session_id.clone()), &input.system_prompt)
    }

    fn new(session_id: Option<String>, system_prompt: &str) -> Launch {
        Launch {
            session_id: session_id.filter(|s| valid_session(s)),
            system_prompt: if system_prompt.trim().is_empty() {
                String::new()
            } else {
                system_prompt.to_owned()
            },
        }
    }

    /// What the folder's last turn left for the next box, if anything readable.
    pub fn read_next(home: &Path) -> Option<Launch> {
        let bytes = std::fs::read(home.join(NEXT_LAUNCH)).ok()?;
        let l: Launch = serde_json::from_slice(&bytes).ok()?;
        Some(Launch::new(l.session_id, &l.system_prompt))
    }

    /// Leaves this for the folder's next box (written whole, then renamed into place).
    pub fn write_next(&self, home: &Path) -> std::io::Result<()> {
        let path = home.join(NEXT_LAUNCH);
        let dir = path.parent().expect("a file under home");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".claude-next.{}.tmp", std::process::id()));
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &path)
    }
}

/// The live child and what reads it.
struct Live {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    stderr: std::sync::Arc<std::sync::Mutex<VecDeque<u8>>>,
    /// What it was started with.
    launch: Launch,
    /// Started before the turn and not yet checked against it.
    early: bool,
    /// Serves the child's model calls; stops when dropped.
    relay: relay::Relay,
}

/// The brain.
pub struct ClaudeBrain {
    cfg: ClaudeSettings,
    live: Option<Live>,
    session: Option<String>,
    partial: String,
    /// The file whose existence tells an early child's MCP bridges that the turn began.
    turn_mark: PathBuf,
}

impl ClaudeBrain {
    /// A brain with these settings; the child starts at the first query.
    pub fn new(cfg: ClaudeSettings) -> Self {
        Self {
            cfg,
            live: None,
            session: None,
            partial: String::new(),
            turn_mark: std::env::temp_dir().join(format!("hako-turn.{}", std::process::id())),
        }
    }

    /// Starts Claude Code before the turn (a warm box): with what the folder's last turn left,
    /// its tools waiting for the turn's sockets and its model calls for the token. A child
    /// that cannot start is only logged: the turn starts its own.
    pub async fn prepare(&mut self) {
        let launch = Launch::read_next(&self.cfg.home).unwrap_or_default();
        if let Err(e) = self.start(launch, true).await {
            log(format_args!(
                "cannot start Claude Code before the turn: {e}"
            ));
        }
    }

    /// The MCP servers the child gets: the seeded settings' (`socat` entries become bridges),
    /// or the turn's socket alone. `early`: the bridges wait for the turn.
    fn mcp_config(&self, early: bool) -> Value {
        let seeded = std::fs::read(self.cfg.home.join(".claude/settings.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let mut servers = serde_json::Map::new();
        if let Some(Value::Object(list)) = seeded.as_ref().and_then(|s| s.get("mcpServers")) {
            for (name, entry) in list {
                if let Some(socket) = socat_socket(entry) {
                    servers.insert(name.clone(), self.bridge(&socket, early));
                }
            }
        }
        if servers.is_empty() {
            let socket = self.cfg.mcp_socket.display().to_string();
            servers.insert(TURN_SERVER.into(), self.bridge(&socket, early));
        }
        json!({ "mcpServers": servers })
    }

    fn bridge(&self, socket: &str, early: bool) -> Value {
        let mark = self.turn_mark.display().to_string();
        let mut args = vec!["mcp-bridge", "--socket", socket];
        if early {
            args.extend(["--after", mark.as_str()]);
        }
        json!({
            "type": "stdio",
            "command": self.cfg.bridge.display().to_string(),
            "args": args,
        })
    }

    /// What Claude Code reads from disk: nothing the agent can write decides what it may do.
    /// No settings file is loaded (`--setting-sources ""`: not `$HOME/.claude/settings.json`,
    /// not the workspace's `.claude/settings*.json`, which the agent's own Write tool reaches
    /// and Claude Code would honour, permissions and hooks alike); the seeded `env` comes
    /// inline with every hook off; skills come only from the operator's read-only bundle
    /// (mounted as a plugin directory), and the workspace's `CLAUDE.md` is read as memory
    /// text, which is all it is.
    fn lock_down(&self, cmd: &mut tokio::process::Command) {
        let env = std::fs::read(self.cfg.home.join(".claude/settings.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|s| s.get("env").filter(|e| e.is_object()).cloned())
            .unwrap_or_else(|| json!({}));
        let settings = json!({"disableAllHooks": true, "env": env});
        cmd.args(["--setting-sources", ""])
            .arg("--settings")
            .arg(settings.to_string());
        if let Ok(cwd) = std::env::current_dir() {
            cmd.arg("--add-dir")
                .arg(cwd)
                .env("CLAUDE_CODE_ADDITIONAL_DIRECTORIES_CLAUDE_MD", "1");
        }
        if self.cfg.plugin_dir.join("skills").is_dir() {
            cmd.arg("--plugin-dir").arg(&self.cfg.plugin_dir);
        }
    }

    /// Starts the child; `early`: before the turn (its tools wait for the turn's sockets).
    async fn start(&mut self, launch: Launch, early: bool) -> Result<(), BrainError> {
        let relay = relay::Relay::start(self.cfg.api_socket.clone())
            .await
            .map_err(|e| BrainError::Fatal(format!("cannot serve the model relay: {e}")))?;
        let model = &self.cfg.model;
        let mcp = self.mcp_config(early);
        let mut cmd = tokio::process::Command::new(&self.cfg.program);
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
        // Without the turn's server there is no one to ask, and the box is the boundary.
        if mcp["mcpServers"].get(TURN_SERVER).is_some() {
            cmd.args([
                "--permission-mode",
                "default",
                "--permission-prompt-tool",
                &format!("mcp__{TURN_SERVER}__agent_tool"),
            ]);
        } else {
            cmd.args(["--permission-mode", "bypassPermissions"]);
        }
        cmd.args(["--strict-mcp-config", "--mcp-config"])
            .arg(mcp.to_string());
        self.lock_down(&mut cmd);
        if let Some(sid) = &launch.session_id {
            cmd.args(["--resume", sid]);
        }
        if !launch.system_prompt.is_empty() {
            // One argument, so no prompt can read as another flag.
            cmd.arg(format!("--append-system-prompt={}", launch.system_prompt));
        }
        if early {
            cmd.env("MCP_TIMEOUT", WARM_MCP_TIMEOUT_MS);
        }
        cmd.env("ANTHROPIC_BASE_URL", format!("http://{}", relay.addr()))
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
            .env_remove("ANTHROPIC_AUTH_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| {
            BrainError::Fatal(format!(
                "cannot start Claude Code ({}): {e}",
                self.cfg.program.display()
            ))
        })?;
        let (Some(stdin), Some(stdout), Some(mut err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(BrainError::Fatal("Claude Code's pipes are missing".into()));
        };
        // Its stderr: a bounded tail, for an error message if it dies.
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend(&buf[..n]);
                let over = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..over);
            }
        });
        log(format_args!(
            "Claude Code started{} (model {model}, {}, relay {})",
            if early { " before its turn" } else { "" },
            if launch.session_id.is_some() {
                "resuming its session"
            } else {
                "a new session"
            },
            relay.addr()
        ));
        self.live = Some(Live {
            child,
            stdin,
            stdout: BufReader::with_capacity(64 << 10, stdout),
            stderr,
            launch,
            early,
            relay,
        });
        Ok(())
    }

    /// The child for this query: the one started early if it fits the turn, else a new one;
    /// authorized with the turn's token.
    async fn child_for(&mut self, query: &Query<'_>) -> Result<(), BrainError> {
        let wanted = Launch::of(query.input);
        if self.live.as_ref().is_some_and(|l| l.early) {
            // The turn's sockets are bound (routd binds them before asking for the run): the
            // early child's bridges may connect.
            if let Err(e) = std::fs::write(&self.turn_mark, b"") {
                log(format_args!("cannot mark the turn's start: {e}"));
                self.live = None;
            }
        }
        if let Some(live) = self.live.as_mut().filter(|l| l.early) {
            if let Ok(Some(status)) = live.child.try_wait() {
                log(format_args!(
                    "the Claude Code started before the turn exited ({status}): starting one for the turn"
                ));
                self.live = None;
            } else if live.launch == wanted {
                live.early = false;
                log("the turn takes the Claude Code started before it");
            } else {
                log(format_args!(
                    "the Claude Code started before the turn has another {}: starting one for the turn",
                    if live.launch.session_id == wanted.session_id {
                        "system prompt"
                    } else {
                        "session"
                    }
                ));
                self.live = None;
            }
        }
        if self.live.is_none() {
            self.start(wanted, false).await?;
        }
        let live = self.live.as_ref().expect("started");
        live.relay
            .authorize(query.input.token.expose())
            .map_err(BrainError::Fatal)
    }

    /// Why the child is gone: its exit status and the end of its stderr.
    async fn died(&mut self) -> String {
        let Some(mut live) = self.live.take() else {
            return "Claude Code is not running".into();
        };
        let status = match tokio::time::timeout(
            std::time::Duration::from_secs(5),
            live.child.wait(),
        )
        .await
        {
            Ok(Ok(s)) => s.to_string(),
            _ => "no exit status".into(),
        };
        let tail: Vec<u8> = live
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        let tail = String::from_utf8_lossy(&tail);
        let last = tail.trim().lines().last().unwrap_or("").trim();
        if last.is_empty() {
            format!("Claude Code exited ({status})")
        } else {
            format!(
                "Claude Code exited ({status}): {}",
                last.chars().take(300).collect::<String>()
            )
        }
    }
}

/// The socket a seeded `socat STDIO UNIX-CONNECT:<path>` entry reaches.
fn socat_socket(entry: &Value) -> Option<String> {
    if entry.get("command")?.as_str()? != "socat" {
        return None;
    }
    entry
        .get("args")?
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("UNIX-CONNECT:"))
        .map(str::to_owned)
}

/// Whether `id` can be a Claude Code session id (a UUID): anything else starts afresh.
fn valid_session(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
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

/// Reads one line (at most [`MAX_LINE`] bytes); `None` at the end of the output.
async fn read_line(r: &mut BufReader<ChildStdout>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        return Err(std::io::Error::other(format!(
            "a line of Claude Code's output is over {MAX_LINE} bytes"
        )));
    }
    Ok(Some(line))
}

impl Brain for ClaudeBrain {
    async fn respond<'a>(
        &'a mut self,
        query: Query<'a>,
        io: &'a Io,
    ) -> Result<Outcome, BrainError> {
        self.partial.clear();
        let text = query.user_text();
        if text.trim().is_empty() {
            return Ok(Outcome::Reply(Reply::default()));
        }
        self.child_for(&query).await?;
        let line = json!({
            "type": "user",
            "message": {"role": "user", "content": text},
        })
        .to_string();
        let live = self.live.as_mut().expect("started");
        let wrote = async {
            live.stdin.write_all(line.as_bytes()).await?;
            live.stdin.write_all(b"\n").await?;
            live.stdin.flush().await
        }
        .await;
        if let Err(e) = wrote {
            let why = self.died().await;
            return Err(BrainError::Fatal(format!("{why} (writing the query: {e})")));
        }
        let mut said = false;
        // Text of the answer not yet out: Claude Code prints one message per content block,
        // so text before a tool call comes in its own message, the call in the next.
        let mut pending: Vec<String> = Vec::new();
        loop {
            let live = self.live.as_mut().expect("started");
            let line = match read_line(&mut live.stdout).await {
                Ok(Some(l)) => l,
                Ok(None) | Err(_) => {
                    let why = self.died().await;
                    return Err(if said {
                        BrainError::Failed(why)
                    } else {
                        BrainError::Fatal(why)
                    });
                }
            };
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                // Noise on stdout is not an event; Claude Code prints JSON lines only.
                continue;
            };
            match ev["type"].as_str() {
                Some("system") => {
                    if let Some(sid) = ev["session_id"].as_str() {
                        self.session = Some(sid.to_owned());
                    }
                }
                // A subagent's messages stay inside its task.
                Some("assistant") if ev["parent_tool_use_id"].is_null() => {
                    let (texts, tool) = assistant_parts(&ev["message"]);
                    for t in &texts {
                        if !self.partial.is_empty() {
                            self.partial.push_str("\n\n");
                        }
                        self.partial.push_str(t);
                    }
                    pending.extend(texts);
                    // Text before a tool call goes out now: the chat sees "let me look…"
                    // while the tools run.
                    if tool {
                        for t in pending.drain(..) {
                            io.out.block(&OutputBlock::ok(t)).await;
                            said = true;
                        }
                    }
                }
                Some("result") => {
                    if let Some(sid) = ev["session_id"].as_str() {
                        self.session = Some(sid.to_owned());
                    }
                    let result = ev["result"].as_str().unwrap_or_default().to_owned();
                    if ev["is_error"].as_bool() == Some(true) {
                        let why = if result.trim().is_empty() {
                            format!(
                                "Claude Code ended the turn with an error ({})",
                                ev["subtype"].as_str().unwrap_or("unknown")
                            )
                        } else {
                            result
                        };
                        return Err(BrainError::Failed(why));
                    }
                    // The next box of this folder starts its child with this session.
                    let next = Launch::new(self.session.clone(), &query.input.system_prompt);
                    if let Err(e) = next.write_next(&self.cfg.home) {
                        log(format_args!(
                            "cannot leave the launch for the next box: {e}"
                        ));
                    }
                    return Ok(Outcome::Reply(Reply {
                        text: result,
                        new_session_id: self.session.clone(),
                    }));
                }
                _ => {}
            }
        }
    }

    fn partial(&self) -> String {
        self.partial.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socat_entries_become_bridges() {
        let entry = json!({"command": "socat", "args": ["STDIO", "UNIX-CONNECT:/var/run/pub/arizuko/mcp.sock"]});
        assert_eq!(
            socat_socket(&entry).as_deref(),
            Some("/var/run/pub/arizuko/mcp.sock")
        );
        assert_eq!(
            socat_socket(&json!({"command": "npx", "args": ["x"]})),
            None
        );
    }

    #[test]
    fn only_uuids_are_resumed() {
        assert!(valid_session("5e49896a-ae85-4c55-be81-2f56268bf666"));
        assert!(!valid_session("../../etc/passwd"));
        assert!(!valid_session("s-42"));
        assert!(!valid_session(""));
    }

    #[test]
    fn the_launch_left_for_the_next_box_round_trips_and_is_checked_on_read() {
        let home = tempfile::tempdir().unwrap();
        assert_eq!(Launch::read_next(home.path()), None, "nothing left yet");
        let sid = "5e49896a-ae85-4c55-be81-2f56268bf666";
        let l = Launch::new(Some(sid.into()), "Be brief.");
        l.write_next(home.path()).unwrap();
        assert_eq!(Launch::read_next(home.path()), Some(l.clone()));
        // What a turn with that session and prompt needs is the same launch; a blank prompt
        // and a session that is no UUID are none.
        assert_eq!(Launch::new(Some(sid.into()), "Be brief."), l);
        assert_eq!(Launch::new(Some("../x".into()), "  \n"), Launch::default());
        // A file the agent could have written: checked like a turn's input, or ignored.
        let path = home.path().join(NEXT_LAUNCH);
        std::fs::write(&path, r#"{"sessionId": "--dangerously-skip-permissions"}"#).unwrap();
        assert_eq!(Launch::read_next(home.path()), Some(Launch::default()));
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(Launch::read_next(home.path()), None);
    }

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
}
