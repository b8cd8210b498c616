//! One shape for CLI agents: a third party's agent program (Claude Code, Codex) as a child
//! process behind the container contract, with two small adapters ([`super::claude`],
//! [`super::codex`]) and everything else shared here.
//!
//! - **One process per run**, started at the first query (or before the turn in a warm box);
//!   each query (the initial messages, then every follow-up) goes to the same live process
//!   and session. Dropping the brain kills it (the deadline, SIGTERM).
//! - **The model without the key** ([`relay`]): the program gets a loopback URL and a
//!   placeholder key; the relay puts the run's token on each request to the gateway.
//! - **The turn's tools** as stdio MCP servers that are the turn's sockets ([`bridge`]): the
//!   seeded `.claude/settings.json`'s servers (the turn's `mcp.sock` as `arizuko`, each
//!   sidecar's), or the turn's socket alone.
//! - **Started before the turn** ([`Harness::prepare`]): with the [`Launch`] the folder's last
//!   turn left; its bridges wait for the turn's mark, its model calls for the token. The turn
//!   takes it only if its own launch is the same; otherwise it is killed and one started for
//!   the turn, as in a cold box.
//! - **Approvals** ([`approval`]): where the program would ask a person, the group's grants
//!   decide through the turn's `agent_tool`.
//! - **Blocks**: text the model writes before a tool call goes out as an `ok` block at once;
//!   the query's answer is its `ok` block, `newSessionId` the program's session.
//! - **Failures**: the program ending its query with an error is an `error` block; the
//!   program exiting or its output ending before the answer is `fatal` when nothing was said
//!   yet (else `error`), with its exit status and the last line of its stderr.
//!
//! An adapter ([`Adapter`]) says how to start its program (command line, environment, how it
//! takes MCP servers and the placeholder key), how to open a session, how to send a query and
//! how to read its events; `specs/agent-script.md` ("CLI agents") lists what one provides.

pub mod approval;
pub mod bridge;
pub mod child;
pub mod relay;

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Brain, BrainError, Io, Outcome, Query, Reply};
use crate::output::log;
use child::{Pipes, Proc};
use hako_shared::contract::{ContainerInput, OutputBlock};

/// The name of the turn's MCP server (the seeded settings').
pub const TURN_SERVER: &str = "arizuko";

/// A CLI agent's settings (from the environment; `specs/agent-script.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The model every call uses (`HAKO_MODEL`).
    pub model: String,
    /// The program (`HAKO_CLAUDE_BIN`, `HAKO_CODEX_BIN`).
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
    /// (`hako_shared::contract::SKILLS_PLUGIN_DIR`; Claude Code's skills).
    pub plugin_dir: PathBuf,
}

/// What a program is started with that a turn must share to use it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Launch {
    /// The session it resumes; a new one when `None`.
    #[serde(default)]
    pub session_id: Option<String>,
    /// The group's system prompt it was given; none when blank.
    #[serde(default)]
    pub system_prompt: String,
}

/// Whether `id` can be a session id of Claude Code or Codex (a UUID, as both make them):
/// anything else starts afresh, and is never a file name or an argument.
pub fn valid_session(id: &str) -> bool {
    id.len() == 36
        && id.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
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

    /// What the folder's last turn left for the next box at `file` under `home`, if anything
    /// readable (checked like a turn's input: the agent could have written it).
    pub fn read_next(home: &Path, file: &str) -> Option<Launch> {
        let bytes = std::fs::read(home.join(file)).ok()?;
        let l: Launch = serde_json::from_slice(&bytes).ok()?;
        Some(Launch::new(l.session_id, &l.system_prompt))
    }

    /// Leaves this for the folder's next box (written whole, then renamed into place).
    pub fn write_next(&self, home: &Path, file: &str) -> std::io::Result<()> {
        let path = home.join(file);
        let dir = path.parent().expect("a file under home");
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!(".next-launch.{}.tmp", std::process::id()));
        std::fs::write(
            &tmp,
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, &path)
    }
}

/// A stdio MCP server the program starts: a bridge to a socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpServer {
    /// Its name (the program names its tools `mcp__<name>__<tool>`).
    pub name: String,
    /// The command.
    pub command: String,
    /// Its arguments.
    pub args: Vec<String>,
}

/// What a program is started with.
pub struct Start<'a> {
    /// The brain's settings.
    pub settings: &'a Settings,
    /// The session and system prompt.
    pub launch: &'a Launch,
    /// Where the relay listens (the program's model URL).
    pub relay: SocketAddr,
    /// The MCP servers it gets.
    pub servers: &'a [McpServer],
    /// Started before the turn: its tools wait for the turn, however long.
    pub early: bool,
}

impl Start<'_> {
    /// Whether the turn's own server is among the program's: only then can the grants be
    /// asked (otherwise there is no one to ask, and the box is the boundary).
    pub fn asks_the_grants(&self) -> bool {
        self.servers.iter().any(|s| s.name == TURN_SERVER)
    }
}

/// What a program said while it answered a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Text the model wrote (a message, or a text block of one).
    Text(String),
    /// A tool call began: the text so far goes out now, so the chat sees "let me look…"
    /// while the tools run.
    ToolCall,
    /// The session the program runs.
    Session(String),
    /// The query is answered: with the program's own final text, or (`None`) with the text
    /// written since the last tool call.
    Done(Option<String>),
    /// The program ended the query with an error the chat should see.
    Failed(String),
}

/// How a program's protocol broke: the output ended or was not what the protocol says.
#[derive(Debug)]
pub struct Broke(pub String);

/// What makes a CLI agent of a program (see `specs/agent-script.md`, "CLI agents").
///
/// Futures need not be `Send`: the agent runs on a current-thread runtime.
pub trait Adapter {
    /// The program's name, for logs and error messages.
    const NAME: &'static str;
    /// Where the folder's last turn leaves the launch for the next box, under `$HOME`.
    const NEXT_LAUNCH: &'static str;

    /// The command line and environment: the model (the group's, for every purpose), the
    /// relay's URL with [`relay::PLACEHOLDER_KEY`], the MCP servers, nothing the agent could
    /// have written taken as configuration, no interactive prompt.
    fn command(&mut self, start: &Start<'_>) -> std::io::Result<tokio::process::Command>;

    /// After the start, before any query (Codex: its handshake and session); answers the
    /// session if it is known now.
    fn open<'a>(
        &'a mut self,
        pipes: &'a mut Pipes,
        start: &'a Start<'a>,
    ) -> impl Future<Output = Result<Option<String>, Broke>> + 'a;

    /// Sends one query's text.
    fn send<'a>(
        &'a mut self,
        pipes: &'a mut Pipes,
        text: &'a str,
    ) -> impl Future<Output = Result<(), Broke>> + 'a;

    /// The next event of the query being answered (answering the program's own requests,
    /// such as approvals, meanwhile).
    fn next<'a>(
        &'a mut self,
        pipes: &'a mut Pipes,
    ) -> impl Future<Output = Result<Event, Broke>> + 'a;
}

/// The live program and what serves it.
struct Live {
    proc: Proc,
    pipes: Pipes,
    /// What it was started with.
    launch: Launch,
    /// Started before the turn and not yet checked against it.
    early: bool,
    /// Serves its model calls; stops when dropped.
    relay: relay::Relay,
}

/// A CLI agent as a brain.
pub struct Harness<A> {
    cfg: Settings,
    adapter: A,
    live: Option<Live>,
    session: Option<String>,
    partial: String,
    /// The file whose existence tells an early program's MCP bridges that the turn began.
    turn_mark: PathBuf,
}

impl<A: Adapter> Harness<A> {
    /// A brain with these settings; the program starts at the first query.
    pub fn new(cfg: Settings, adapter: A) -> Self {
        Self {
            cfg,
            adapter,
            live: None,
            session: None,
            partial: String::new(),
            turn_mark: std::env::temp_dir().join(format!("hako-turn.{}", std::process::id())),
        }
    }

    /// Starts the program before the turn (a warm box): with what the folder's last turn
    /// left, its tools waiting for the turn's sockets and its model calls for the token. A
    /// program that cannot start is only logged: the turn starts its own.
    pub async fn prepare(&mut self) {
        let launch = Launch::read_next(&self.cfg.home, A::NEXT_LAUNCH).unwrap_or_default();
        if let Err(e) = self.start(launch, true).await {
            log(format_args!(
                "cannot start {} before the turn: {e}",
                A::NAME
            ));
        }
    }

    /// The MCP servers the program gets: the seeded settings' (`socat` entries become
    /// bridges), or the turn's socket alone. `early`: the bridges wait for the turn.
    fn servers(&self, early: bool) -> Vec<McpServer> {
        let seeded = std::fs::read(self.cfg.home.join(".claude/settings.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        let mut servers = Vec::new();
        if let Some(Value::Object(list)) = seeded.as_ref().and_then(|s| s.get("mcpServers")) {
            for (name, entry) in list {
                if let Some(socket) = socat_socket(entry) {
                    servers.push(self.bridge(name, &socket, early));
                }
            }
        }
        if servers.is_empty() {
            let socket = self.cfg.mcp_socket.display().to_string();
            servers.push(self.bridge(TURN_SERVER, &socket, early));
        }
        servers
    }

    fn bridge(&self, name: &str, socket: &str, early: bool) -> McpServer {
        let mut args = vec![
            "mcp-bridge".to_owned(),
            "--socket".into(),
            socket.to_owned(),
        ];
        if early {
            args.extend(["--after".to_owned(), self.turn_mark.display().to_string()]);
        }
        McpServer {
            name: name.to_owned(),
            command: self.cfg.bridge.display().to_string(),
            args,
        }
    }

    /// Starts the program; `early`: before the turn (its tools wait for the turn's sockets).
    async fn start(&mut self, launch: Launch, early: bool) -> Result<(), BrainError> {
        let relay = relay::Relay::start(self.cfg.api_socket.clone())
            .await
            .map_err(|e| BrainError::Fatal(format!("cannot serve the model relay: {e}")))?;
        let servers = self.servers(early);
        let start = Start {
            settings: &self.cfg,
            launch: &launch,
            relay: relay.addr(),
            servers: &servers,
            early,
        };
        let cannot = |e: std::io::Error| {
            BrainError::Fatal(format!(
                "cannot start {} ({}): {e}",
                A::NAME,
                self.cfg.program.display()
            ))
        };
        let cmd = self.adapter.command(&start).map_err(cannot)?;
        let (proc, mut pipes) = Proc::spawn(A::NAME, cmd).map_err(cannot)?;
        let session = match self.adapter.open(&mut pipes, &start).await {
            Ok(s) => s,
            Err(Broke(why)) => {
                return Err(BrainError::Fatal(format!("{} ({why})", proc.died().await)));
            }
        };
        log(format_args!(
            "{} started{} (model {}, {}, relay {})",
            A::NAME,
            if early { " before its turn" } else { "" },
            self.cfg.model,
            if launch.session_id.is_some() {
                "resuming its session"
            } else {
                "a new session"
            },
            relay.addr()
        ));
        if session.is_some() {
            self.session = session;
        }
        self.live = Some(Live {
            proc,
            pipes,
            launch,
            early,
            relay,
        });
        Ok(())
    }

    /// The program for this query: the one started early if it fits the turn, else a new
    /// one; authorized with the turn's token.
    async fn program_for(&mut self, query: &Query<'_>) -> Result<(), BrainError> {
        let wanted = Launch::of(query.input);
        if self.live.as_ref().is_some_and(|l| l.early) {
            // The turn's sockets are bound (routd binds them before asking for the run): the
            // early program's bridges may connect.
            if let Err(e) = std::fs::write(&self.turn_mark, b"") {
                log(format_args!("cannot mark the turn's start: {e}"));
                self.live = None;
            }
        }
        if let Some(live) = self.live.as_mut().filter(|l| l.early) {
            if let Some(status) = live.proc.exited() {
                log(format_args!(
                    "the {} started before the turn exited ({status}): starting one for the turn",
                    A::NAME
                ));
                self.live = None;
            } else if live.launch == wanted {
                live.early = false;
                log(format_args!(
                    "the turn takes the {} started before it",
                    A::NAME
                ));
            } else {
                log(format_args!(
                    "the {} started before the turn has another {}: starting one for the turn",
                    A::NAME,
                    if live.launch.session_id == wanted.session_id {
                        "system prompt"
                    } else {
                        "session"
                    }
                ));
                self.live = None;
                // Its session (if any) is not this turn's.
                self.session = None;
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

    /// Why the program is gone.
    async fn died(&mut self) -> String {
        match self.live.take() {
            Some(live) => live.proc.died().await,
            None => format!("{} is not running", A::NAME),
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

impl<A: Adapter> Brain for Harness<A> {
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
        self.program_for(&query).await?;
        let live = self.live.as_mut().expect("started");
        if let Err(Broke(e)) = self.adapter.send(&mut live.pipes, &text).await {
            let why = self.died().await;
            return Err(BrainError::Fatal(format!("{why} (sending the query: {e})")));
        }
        let mut said = false;
        // Text of the answer not yet out.
        let mut pending: Vec<String> = Vec::new();
        loop {
            let live = self.live.as_mut().expect("started");
            let event = match self.adapter.next(&mut live.pipes).await {
                Ok(e) => e,
                Err(Broke(e)) => {
                    let why = format!("{} ({e})", self.died().await);
                    return Err(if said {
                        BrainError::Failed(why)
                    } else {
                        BrainError::Fatal(why)
                    });
                }
            };
            match event {
                Event::Text(t) => {
                    if t.trim().is_empty() {
                        continue;
                    }
                    if !self.partial.is_empty() {
                        self.partial.push_str("\n\n");
                    }
                    self.partial.push_str(&t);
                    pending.push(t);
                }
                Event::ToolCall => {
                    for t in pending.drain(..) {
                        io.out.block(&OutputBlock::ok(t)).await;
                        said = true;
                    }
                }
                Event::Session(s) => self.session = Some(s),
                Event::Failed(why) => return Err(BrainError::Failed(why)),
                Event::Done(text) => {
                    // The next box of this folder starts its program with this session.
                    let next = Launch::new(self.session.clone(), &query.input.system_prompt);
                    if let Err(e) = next.write_next(&self.cfg.home, A::NEXT_LAUNCH) {
                        log(format_args!(
                            "cannot leave the launch for the next box: {e}"
                        ));
                    }
                    return Ok(Outcome::Reply(Reply {
                        text: text.unwrap_or_else(|| pending.join("\n\n")),
                        new_session_id: self.session.clone(),
                    }));
                }
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
    use serde_json::json;

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
        assert!(valid_session("01a2250d-0d81-74c2-bef9-f063e0a0437d"));
        assert!(!valid_session("../../etc/passwd"));
        assert!(!valid_session("s-42"));
        assert!(!valid_session(""));
    }

    #[test]
    fn the_launch_left_for_the_next_box_round_trips_and_is_checked_on_read() {
        const FILE: &str = ".hako/test-next.json";
        let home = tempfile::tempdir().unwrap();
        assert_eq!(
            Launch::read_next(home.path(), FILE),
            None,
            "nothing left yet"
        );
        let sid = "5e49896a-ae85-4c55-be81-2f56268bf666";
        let l = Launch::new(Some(sid.into()), "Be brief.");
        l.write_next(home.path(), FILE).unwrap();
        assert_eq!(Launch::read_next(home.path(), FILE), Some(l.clone()));
        // What a turn with that session and prompt needs is the same launch; a blank prompt
        // and a session that is no UUID are none.
        assert_eq!(Launch::new(Some(sid.into()), "Be brief."), l);
        assert_eq!(Launch::new(Some("../x".into()), "  \n"), Launch::default());
        // A file the agent could have written: checked like a turn's input, or ignored.
        let path = home.path().join(FILE);
        std::fs::write(&path, r#"{"sessionId": "--dangerously-skip-permissions"}"#).unwrap();
        assert_eq!(
            Launch::read_next(home.path(), FILE),
            Some(Launch::default())
        );
        std::fs::write(&path, "not json").unwrap();
        assert_eq!(Launch::read_next(home.path(), FILE), None);
    }
}
