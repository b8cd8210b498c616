//! `hako chat [group-folder]`: a conversation with an agent, no daemon, no database (seed
//! `003_…`). The same container runner as runed, the same mounts, the same MCP tools.
//!
//! - The first line starts ONE container for the conversation; every later line is dropped
//!   into it as a follow-up (a file, temp name then rename, and SIGUSR1: the runner's steer,
//!   exactly once). Replies are printed as their blocks arrive.
//! - The conversation's container ends after `--idle` without output; the next line starts a
//!   new one that resumes the same agent session.
//! - With a folder: that group's directories under `DATA_DIR`, and `cli-session.json` in the
//!   folder's host-owned directory (session id, start, message count), so the next chat
//!   continues where this one stopped. Without one: a temporary directory, gone at exit.
//! - The turn's MCP tools are served in-process on the folder's `ipc/mcp.sock`, with the CLI's
//!   backend ([`tools`]).
//! - End of input, Ctrl-C, SIGTERM and SIGHUP (a closed terminal) stop and remove the
//!   container (and the temporary directory) before exit. One chat of a folder lives at a
//!   time, and what a chat that died anyway left running is removed by the next ([`owner`]). Exit code: 0 when every turn succeeded, 1 otherwise, 130 when
//!   interrupted, 2 for bad arguments.

pub mod gateway;
pub mod input;
pub mod owner;
pub mod tools;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use hako_runner::{CloseWhen, LiveRun, RunControl, RunEnd, RunEvent, RunSpec, Runner, docker};
use hako_shared::config::Env;
use hako_shared::contract::{BlockStatus, ContainerInput, Message};
use hako_shared::folder::GroupFolder;
use hako_shared::grants::Grants;
use hako_shared::ids::{RunId, TurnId};
use hako_shared::layout::{DataLayout, FolderDir};
use hako_shared::runs::{AgentKind, GroupSpec, LlmSpec, Outcome, Trust};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use input::{Input, Screen};
use tools::{CliTools, ToolEvent};

/// Arguments of `hako chat`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:\n  \
    hako chat                      a temporary session, gone at exit\n  \
    hako chat team/dev             the group's folder under DATA_DIR, resumed next time\n  \
    printf 'a\\nb\\n' | hako chat     two turns in one container, only the replies printed\n  \
    hako chat team/dev -m 'hello'  one message, then exit")]
pub struct ChatArgs {
    /// The group folder the agent works in (its storage is under `$DATA_DIR/folders/`);
    /// without one, a temporary session.
    pub folder: Option<String>,
    /// Send this one message instead of reading lines.
    #[arg(short, long)]
    pub message: Option<String>,
    /// A conversation quiet this long ends its container (the next line starts a new one,
    /// same session).
    #[arg(long, default_value = "10m", value_parser = hako_shared::config::parse_duration)]
    pub idle: Duration,
    /// The model the agent calls (Anthropic format; OpenAI's for Codex), through a gateway the
    /// chat serves on the turn's socket with `ANTHROPIC_API_KEY` (`OPENAI_API_KEY` for Codex)
    /// from this environment (never the container's).
    #[arg(long)]
    pub model: Option<String>,
    /// The agent: `hako` (hako-agent; its LLM brain with --model, else the script brain),
    /// `claude` (Claude Code in the hako-claude image) or `codex` (Codex in the hako-codex
    /// image); the last two need --model.
    #[arg(long, default_value = "hako", value_parser = ["hako", "claude", "codex"])]
    pub agent: String,
}

/// `cli-session.json`: the CLI's record of a folder's conversation (no database).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct CliSession {
    /// The agent's session (its last `newSessionId`).
    pub session_id: String,
    /// When the first chat of this folder started (RFC 3339).
    pub started_at: String,
    /// Messages sent in all its chats.
    pub messages: u64,
}

/// Where a chat keeps its files: a folder under `DATA_DIR`, or a temporary directory.
struct Place {
    data: PathBuf,
    folder: GroupFolder,
    temp: Option<tempfile::TempDir>,
}

impl Place {
    /// The folder's host-owned directory (`folders/<key>/`): `cli-session.json` lives there,
    /// where no agent can write.
    fn session_file(&self) -> PathBuf {
        DataLayout::new(&self.data)
            .dir(&self.folder, FolderDir::Home)
            .parent()
            .map(|p| p.join("cli-session.json"))
            .unwrap_or_else(|| self.data.join("cli-session.json"))
    }
}

fn load_session(path: &Path) -> CliSession {
    let read = std::fs::read(path).ok().filter(|b| b.len() <= 64 << 10);
    read.and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| CliSession {
            started_at: hako_shared::time::rfc3339(SystemTime::now()),
            ..CliSession::default()
        })
}

fn save_session(path: &Path, s: &CliSession) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(s)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The run of the conversation's container, while it lives.
struct Live {
    live: Arc<LiveRun>,
    control: RunControl,
    ended: tokio::sync::oneshot::Receiver<RunEnd>,
}

/// Runs the chat. The exit code says whether every turn succeeded.
pub async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    hako_shared::telemetry::init_with("warn")?;
    let env = Env::from_process();
    let place = match &args.folder {
        Some(f) => {
            let folder = match GroupFolder::new(f) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!(
                        "hako chat: {f:?} is not a group folder: {e}. A folder is 1-8 '/'-separated \
                         names of letters, digits, '_' and '-' (e.g. team/dev)"
                    );
                    return Ok(ExitCode::from(2));
                }
            };
            Place {
                data: std::path::absolute(env.path_or("DATA_DIR", "./data"))?,
                folder,
                temp: None,
            }
        }
        None => {
            let temp = tempfile::Builder::new()
                .prefix("hako-chat-")
                .tempdir()
                .context("cannot make a temporary session directory")?;
            eprintln!("hako chat: temporary session in {}", temp.path().display());
            Place {
                data: temp.path().to_owned(),
                folder: GroupFolder::new("chat").context("the temporary folder name")?,
                temp: Some(temp),
            }
        }
    };
    // One live chat per folder: a second one would split its follow-ups.
    let _lock = match &place.temp {
        Some(_) => None,
        None => match owner::lock_folder(&place.session_file().with_file_name("chat.lock")) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("hako chat: {}: {e}", place.folder);
                return Ok(ExitCode::FAILURE);
            }
        },
    };
    // The runner reads its settings from the environment; the data root is the chat's.
    let mut vars: Vec<(String, String)> = std::env::vars().collect();
    vars.retain(|(k, _)| k != "DATA_DIR");
    vars.push(("DATA_DIR".into(), place.data.display().to_string()));
    let mut cfg = hako_runner::RunnerConfig::from_env(&Env::from_pairs(vars))?;
    cfg.owner = Some(owner::me());
    // One chat, one box: a program copy would only start as the chat ends (runner/programs.rs).
    cfg.program_copies = false;
    let limit = cfg.docker_timeout;
    let runner = Arc::new(Runner::on_docker(
        docker::DockerEngine::connect_default()?,
        cfg,
    )?);
    runner.ensure_running().await?;
    // What chats that died without cleaning up left running (a closed terminal's, a
    // SIGKILLed one's): gone before this chat starts its own.
    match owner::reap_dead(runner.engine().as_ref(), limit).await {
        Ok(0) => {}
        Ok(n) => eprintln!("hako chat: removed {n} container(s) left by a chat that died"),
        Err(e) => eprintln!("hako chat: could not look for containers of dead chats: {e}"),
    }

    let (events_tx, events_rx) = mpsc::channel(16);
    let tools = CliTools::new(events_tx);
    let stop_tools = CancellationToken::new();
    let socket = DataLayout::new(&place.data).mcp_socket(&place.folder);
    let api_socket = DataLayout::new(&place.data).api_socket(&place.folder);
    let agent = match args.agent.as_str() {
        "claude" => AgentKind::Claude,
        "codex" => AgentKind::Codex,
        _ => AgentKind::Hako,
    };
    // A CLI agent's program speaks one format; hako-agent's LLM brain speaks Anthropic's here.
    let api = agent.program().map(|(api, _, _)| api).unwrap_or_default();
    let (group, token) = match &args.model {
        Some(model) => {
            let token = gateway::serve(&api_socket, model, api, stop_tools.clone())?;
            let group = GroupSpec {
                agent,
                llm: Some(LlmSpec {
                    model: model.clone(),
                    api,
                    daily_tokens: None,
                }),
                ..GroupSpec::default()
            };
            if let Err(e) = group.validate() {
                eprintln!("hako chat: --model {model}: {e}");
                return Ok(ExitCode::from(2));
            }
            (group, token)
        }
        None if agent != AgentKind::Hako => {
            eprintln!(
                "hako chat: --agent {} needs --model (the model its program calls)",
                args.agent
            );
            return Ok(ExitCode::from(2));
        }
        None => (GroupSpec::default(), String::new()),
    };
    let session_path = place.session_file();
    let session = load_session(&session_path);
    let mut chat = Chat {
        runner,
        place,
        session,
        session_path,
        tools: tools.clone(),
        idle: args.idle,
        live: None,
        failed: false,
        events: events_rx,
        group,
        token,
    };
    chat.serve_tools(&socket, &stop_tools)?;
    let code = chat.converse(args.message).await;
    tools.close();
    stop_tools.cancel();
    let _ = std::fs::remove_file(&socket);
    let _ = std::fs::remove_file(&api_socket);
    if let Some(t) = chat.place.temp.take() {
        let path = t.path().to_owned();
        t.close()
            .with_context(|| format!("cannot remove {}", path.display()))?;
    }
    code
}

struct Chat {
    runner: Arc<Runner>,
    place: Place,
    session: CliSession,
    session_path: PathBuf,
    tools: Arc<CliTools>,
    idle: Duration,
    live: Option<Live>,
    failed: bool,
    events: mpsc::Receiver<ToolEvent>,
    /// The container settings of every run: the agent and its model.
    group: GroupSpec,
    /// The agent's credential for the chat's gateway (stdin only).
    token: String,
}

impl Chat {
    fn serve_tools(&self, socket: &Path, stop: &CancellationToken) -> anyhow::Result<()> {
        let (listener, _) = hako_mcp::bind_socket(socket)
            .with_context(|| format!("cannot serve the tools on {}", socket.display()))?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let scope = hako_mcp::Scope {
            folder: self.place.folder.clone(),
            turn_id: hako_shared::ids::TurnId::new("cli").expect("in the id grammar"),
            chat_jid: hako_shared::ChatJid::new("cli").expect("a chat JID"),
            // The person at the terminal is the operator: every tool.
            grants: Grants::parse(&["*".to_owned()], Trust::Main)
                .map_err(|e| anyhow::anyhow!("grants: {e}"))?,
        };
        tokio::spawn(hako_mcp::serve(
            listener,
            Arc::new(tools::Handle(self.tools.clone())),
            Arc::new(scope),
            stop.clone(),
            stop.clone(),
            hako_mcp::ServeOptions::default(),
        ));
        Ok(())
    }

    /// The conversation: lines in, replies out, until the end of input or an interrupt.
    async fn converse(&mut self, one: Option<String>) -> anyhow::Result<ExitCode> {
        let history = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".local/share/hako/chat-history"));
        let (screen, mut inputs) = match one {
            Some(m) => {
                let (tx, rx) = mpsc::channel(2);
                let _ = tx.send(Input::Line(m)).await;
                let _ = tx.send(Input::End).await;
                (input::start_pipe_screen(), rx)
            }
            None => input::start(history),
        };
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        // A closed terminal or a dropped ssh session: the same as SIGTERM.
        let mut hup = signal(SignalKind::hangup())?;
        let (block_tx, mut blocks) = mpsc::channel::<RunEvent>(64);
        let mut ending = false;
        loop {
            tokio::select! {
                i = inputs.recv(), if !ending => match i.unwrap_or(Input::End) {
                    Input::Line(l) => self.say(&l, &screen, &block_tx).await?,
                    Input::End => {
                        ending = true;
                        if !self.close_live() {
                            return Ok(self.code());
                        }
                    }
                    Input::Interrupt => return self.interrupt(&screen).await,
                    Input::Failed(e) => {
                        screen.note(&format!("hako chat: {e}"));
                        self.failed = true;
                        ending = true;
                        if !self.close_live() {
                            return Ok(self.code());
                        }
                    }
                },
                Some(ev) = blocks.recv() => self.show(ev, &screen),
                Some(ev) = self.events.recv() => match ev {
                    ToolEvent::Prompt(p) => {
                        screen.note(&format!("(a scheduled task) {p}"));
                        self.say(&p, &screen, &block_tx).await?;
                    }
                    ToolEvent::Status(s) => screen.note(&format!("status: {s}")),
                },
                end = wait_end(&mut self.live) => {
                    while let Ok(ev) = blocks.try_recv() {
                        self.show(ev, &screen);
                    }
                    self.finished(end, &screen).await;
                    if ending {
                        return Ok(self.code());
                    }
                }
                _ = tokio::signal::ctrl_c() => return self.interrupt(&screen).await,
                _ = term.recv() => return self.interrupt(&screen).await,
                _ = hup.recv() => return self.interrupt(&screen).await,
            }
        }
    }

    /// Tells the live container to finish once it has started (a `_close` dropped before its
    /// creation would be swept away with the stale follow-ups, and a wake-up signal before
    /// the agent runs would kill it); `false` without one.
    fn close_live(&self) -> bool {
        let Some(l) = &self.live else {
            return false;
        };
        let (runner, live) = (self.runner.clone(), l.live.clone());
        tokio::spawn(async move {
            while !live.is_started() && !live.has_ended() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let _ = runner.close(&live).await;
        });
        true
    }

    fn code(&self) -> ExitCode {
        if self.failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }

    /// Ctrl-C or SIGTERM: the container is killed and removed before the exit.
    async fn interrupt(&mut self, screen: &Screen) -> anyhow::Result<ExitCode> {
        if let Some(l) = self.live.take() {
            screen.note("hako chat: interrupted; stopping the container");
            l.control.kill.cancel();
            if let Ok(end) = l.ended.await {
                self.finished(end, screen).await;
            }
        }
        Ok(ExitCode::from(130))
    }

    /// One line: into the live container (a follow-up), else a new container.
    async fn say(
        &mut self,
        text: &str,
        screen: &Screen,
        blocks: &mpsc::Sender<RunEvent>,
    ) -> anyhow::Result<()> {
        self.tools.record("in", text);
        self.session.messages += 1;
        screen.working(true);
        if let Some(l) = &self.live {
            // Until the container has started the follow-up cannot be dropped: wait a little.
            for _ in 0..600 {
                match self.runner.steer(&l.live, &[text.to_owned()]).await {
                    Ok(r) if r.delivered => return Ok(()),
                    Ok(_) => break,
                    Err(hako_runner::RunError::NotLive(_)) if !l.live.has_ended() => {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(_) => break,
                }
            }
            // The container ended meanwhile: a new one takes the line.
        }
        self.start(text, blocks);
        Ok(())
    }

    fn start(&mut self, text: &str, blocks: &mpsc::Sender<RunEvent>) {
        if self.tools.reset.swap(false, Ordering::SeqCst) {
            self.session.session_id.clear();
        }
        let run_id = RunId::random("cli-", 8);
        let spec = RunSpec {
            bind: None,
            // `hako chat` runs no allowlist groups: no proxy, so no brokered secrets.
            brokered: Vec::new(),
            run_id: run_id.clone(),
            turn_id: Some(TurnId::new(run_id.to_string()).expect("a run id is a turn id")),
            folder: self.place.folder.clone(),
            input: ContainerInput {
                session_id: self.session.session_id.clone(),
                messages: vec![Message::user(text)],
                token: hako_shared::contract::Redacted(self.token.clone()),
                ..ContainerInput::default()
            },
            group: self.group.clone(),
            close: CloseWhen::Idle(self.idle),
        };
        let control = RunControl::default();
        let live = LiveRun::new(run_id, self.place.folder.clone());
        let (end_tx, end_rx) = tokio::sync::oneshot::channel();
        let runner = self.runner.clone();
        let (tx, c, l) = (blocks.clone(), control.clone(), live.clone());
        tokio::spawn(async move {
            let end = runner.run(spec, tx, c, l).await;
            let _ = end_tx.send(end);
        });
        self.live = Some(Live {
            live,
            control,
            ended: end_rx,
        });
    }

    fn show(&mut self, ev: RunEvent, screen: &Screen) {
        let RunEvent::Block { block, .. } = ev else {
            return;
        };
        if let Some(s) = block.new_session_id.as_deref().filter(|s| !s.is_empty()) {
            self.session.session_id = s.to_owned();
        }
        screen.working(false);
        match block.status {
            BlockStatus::Ok => {
                if let Some(r) = block.result.filter(|r| !r.is_empty()) {
                    self.tools.record("out", &r);
                    screen.reply(&r);
                }
            }
            status => {
                self.failed = true;
                screen.note(&format!(
                    "agent {}: {}",
                    if status == BlockStatus::Fatal {
                        "fatal"
                    } else {
                        "error"
                    },
                    block.error.as_deref().unwrap_or("(no message)")
                ));
            }
        }
        if let Err(e) = save_session(&self.session_path, &self.session) {
            screen.note(&format!("hako chat: cli-session.json not saved: {e}"));
        }
    }

    /// The container ended: it is removed (the CLI records nothing), and a failure counts.
    async fn finished(&mut self, end: RunEnd, screen: &Screen) {
        screen.working(false);
        self.live = None;
        let report = match end {
            RunEnd::Finished(r) => r,
            RunEnd::Detached => {
                self.failed = true;
                return;
            }
        };
        for e in self.runner.remove_containers(&report).await {
            screen.note(&format!("hako chat: cleanup: {e}"));
        }
        if !matches!(report.outcome, Outcome::Ok) {
            self.failed = true;
            if report.outcome != Outcome::Killed {
                let why = report
                    .error
                    .clone()
                    .unwrap_or_else(|| report.outcome.as_str().into());
                screen.note(&format!(
                    "hako chat: the container ended ({}): {why}",
                    report.outcome.as_str()
                ));
            }
        }
        let _ = save_session(&self.session_path, &self.session);
    }
}

/// The end of the live run; pending forever without one.
async fn wait_end(live: &mut Option<Live>) -> RunEnd {
    match live {
        Some(l) => match (&mut l.ended).await {
            Ok(end) => end,
            Err(_) => RunEnd::Detached,
        },
        None => std::future::pending().await,
    }
}
