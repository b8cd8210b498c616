//! The agent loop: the container contract around a brain.
//!
//! Order of a run: install signal handlers (an unhandled SIGUSR1 would kill the process),
//! read the configuration, read the one stdin line, answer the initial messages, then (if the
//! input directory exists) answer follow-ups until `_close`, the deadline or SIGTERM.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use hako_shared::config::Env;
use hako_shared::contract::{BlockStatus, ContainerInput, Message, OutputBlock};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::oneshot;

use crate::brain::claude::ClaudeBrain;
use crate::brain::codex::CodexBrain;
use crate::brain::llm::LlmBrain;
use crate::brain::script::ScriptBrain;
use crate::brain::{Brain, BrainError, Io, Outcome, Query};
use crate::config::{self, AgentConfig, BrainKind};
use crate::followup::{Event, Inbox};
use crate::input::{InputError, MAX_INPUT_BYTES, parse_follow_up, parse_input, read_line_bounded};
use crate::output::{Output, log};

/// How long the exit path waits for queued output to reach a slow reader.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// Upper bound of the partial reply quoted in a timeout summary, in characters.
const SUMMARY_PARTIAL_CHARS: usize = 1000;

/// Runs the agent and returns the process exit code. `started` is the process start, from
/// which `ARIZUKO_QUERY_TIMEOUT_MS` is measured.
pub async fn run(started: Instant) -> i32 {
    let env = Env::from_process();
    let (out, drain) = Output::start(config::markers(&env));
    let code = run_with(&env, started, out).await;
    // Every Output handle is dropped by now, so the writer thread finishes its queue and stops.
    if !drain.wait(DRAIN_LIMIT) {
        log("stdout did not drain in time; exiting anyway");
    }
    log(format_args!("exit {code}"));
    code
}

/// The signals the agent reacts to.
struct Signals {
    term: Signal,
    int: Signal,
    usr1: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            usr1: signal(SignalKind::user_defined1())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
}

/// Resolves on SIGTERM or SIGINT, unless `/ignore-sigterm` switched them off.
async fn terminated(term: &mut Signal, int: &mut Signal, ignore: &Cell<bool>) {
    loop {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        if ignore.get() {
            log(format_args!("{name} ignored (/ignore-sigterm)"));
        } else {
            log(format_args!("{name}: exiting"));
            return;
        }
    }
}

/// Resolves at the deadline; never without one.
async fn deadline_reached(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Reads and parses the stdin line on a plain thread (a blocking read cannot be cancelled;
/// the thread simply dies with the process).
async fn read_stdin() -> Result<ContainerInput, InputError> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("hako-agent-stdin".into())
        .spawn(move || {
            let res = read_line_bounded(std::io::stdin().lock(), MAX_INPUT_BYTES);
            let _ = tx.send(res);
        })?;
    let line = rx
        .await
        .map_err(|_| std::io::Error::other("the stdin reader stopped"))??;
    parse_input(&line)
}

async fn fatal(out: &Output, msg: impl Into<String>) -> i32 {
    let msg = msg.into();
    log(format_args!("fatal: {msg}"));
    out.block(&OutputBlock::failure(BlockStatus::Fatal, msg))
        .await;
    1
}

async fn run_with(env: &Env, started: Instant, out: Output) -> i32 {
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => return fatal(&out, format!("cannot install signal handlers: {e}")).await,
    };
    let cfg = match AgentConfig::from_env(env) {
        Ok(c) => c,
        Err(e) => return fatal(&out, format!("bad configuration: {e}")).await,
    };
    // A warm box waits for its turn without a deadline: the turn's own comes with the input.
    let before_input = (!cfg.warm)
        .then_some(cfg.query_timeout)
        .flatten()
        .map(|t| tokio::time::Instant::from_std(started + t));
    let ignore = Rc::new(Cell::new(false));
    let timeout = cfg
        .query_timeout
        .map_or_else(|| "none".to_owned(), |t| format!("{} ms", t.as_millis()));
    log(format_args!(
        "started (hako-agent {}, brain {}, query timeout {timeout}{})",
        env!("CARGO_PKG_VERSION"),
        cfg.brain.describe(),
        if cfg.warm {
            ", warm: waiting for the turn"
        } else {
            ""
        },
    ));

    let mut brain = match &cfg.brain {
        BrainKind::Script => Either::Script(ScriptBrain::new()),
        BrainKind::Llm(settings) => Either::Llm(Box::new(LlmBrain::new(settings.clone()))),
        BrainKind::Claude(settings) => {
            Either::Claude(Box::new(ClaudeBrain::claude(settings.clone())))
        }
        BrainKind::Codex(settings) => Either::Codex(Box::new(CodexBrain::codex(settings.clone()))),
    };
    if cfg.warm {
        brain.prepare().await;
    }
    let input = tokio::select! {
        biased;
        _ = terminated(&mut signals.term, &mut signals.int, &ignore) => return 0,
        _ = deadline_reached(before_input) => {
            return fatal(&out, "query timeout before the input arrived").await;
        }
        res = read_stdin() => res,
    };
    let input = match input {
        Ok(i) => i,
        Err(e) => return fatal(&out, e.to_string()).await,
    };
    let deadline = cfg
        .deadline(input.query_timeout_ms, started, Instant::now())
        .map(tokio::time::Instant::from_std);
    let io = Io::new(
        out,
        cfg.mcp_socket.clone(),
        cfg.input_dir.clone(),
        ignore.clone(),
    );
    Agent {
        cfg: cfg.clone(),
        io,
        input,
        signals,
        ignore,
        deadline,
        brain,
    }
    .serve()
    .await
}

/// The brain the configuration chose.
enum Either {
    Script(ScriptBrain),
    Llm(Box<LlmBrain>),
    Claude(Box<ClaudeBrain>),
    Codex(Box<CodexBrain>),
}

impl Either {
    /// What a brain can do before its turn, in a warm box: a CLI agent starts its program.
    async fn prepare(&mut self) {
        match self {
            Either::Claude(b) => b.prepare().await,
            Either::Codex(b) => b.prepare().await,
            Either::Script(_) | Either::Llm(_) => {}
        }
    }
}

impl Brain for Either {
    async fn respond<'a>(
        &'a mut self,
        query: Query<'a>,
        io: &'a Io,
    ) -> Result<Outcome, BrainError> {
        match self {
            Either::Script(b) => b.respond(query, io).await,
            Either::Llm(b) => b.respond(query, io).await,
            Either::Claude(b) => b.respond(query, io).await,
            Either::Codex(b) => b.respond(query, io).await,
        }
    }

    fn partial(&self) -> String {
        match self {
            Either::Script(b) => b.partial(),
            Either::Llm(b) => b.partial(),
            Either::Claude(b) => b.partial(),
            Either::Codex(b) => b.partial(),
        }
    }
}

/// How one query ended, for the loop.
enum Step {
    Continue,
    Exit(i32),
}

struct Agent<B> {
    cfg: AgentConfig,
    io: Io,
    input: ContainerInput,
    signals: Signals,
    ignore: Rc<Cell<bool>>,
    deadline: Option<tokio::time::Instant>,
    brain: B,
}

impl<B: Brain> Agent<B> {
    async fn serve(&mut self) -> i32 {
        let messages = self.input.messages.clone();
        log(format_args!(
            "input: {} message(s), {} bytes of content",
            messages.len(),
            messages.iter().map(|m| m.content.len()).sum::<usize>()
        ));
        if let Step::Exit(code) = self.query(&messages, false).await {
            return code;
        }
        if !self.cfg.input_dir.is_dir() {
            log(format_args!(
                "{} does not exist: one-shot mode, done",
                self.cfg.input_dir.display()
            ));
            return 0;
        }
        self.follow_ups().await
    }

    async fn follow_ups(&mut self) -> i32 {
        log(format_args!(
            "waiting for follow-ups in {} (poll {:?}, SIGUSR1 wakes)",
            self.cfg.input_dir.display(),
            self.cfg.poll_interval
        ));
        let mut inbox = Inbox::new(self.cfg.input_dir.clone(), MAX_INPUT_BYTES);
        loop {
            loop {
                // Past the deadline nothing new is claimed: it would only be cut short.
                if self
                    .deadline
                    .is_some_and(|d| tokio::time::Instant::now() >= d)
                {
                    log("query deadline reached while idle: exiting");
                    return 0;
                }
                let Some(event) = inbox.next_event() else {
                    break;
                };
                match event {
                    Event::Close => {
                        log("_close: finishing");
                        return 0;
                    }
                    Event::TooLarge { name } => {
                        log(format_args!("follow-up {name} too large; deleted"));
                        let msg =
                            format!("follow-up {name} is larger than {MAX_INPUT_BYTES} bytes");
                        self.io
                            .out
                            .block(&OutputBlock::failure(BlockStatus::Error, msg))
                            .await;
                    }
                    Event::Message { name, bytes } => match parse_follow_up(&bytes) {
                        Err(e) => {
                            log(format_args!("follow-up {name}: {e}; deleted"));
                            let msg = format!("invalid follow-up {name}: {e}");
                            self.io
                                .out
                                .block(&OutputBlock::failure(BlockStatus::Error, msg))
                                .await;
                        }
                        Ok(f) => {
                            log(format_args!(
                                "follow-up {name} claimed ({} bytes)",
                                f.content.len()
                            ));
                            let msgs = [Message::user(f.content)];
                            if let Step::Exit(code) = self.query(&msgs, true).await {
                                return code;
                            }
                        }
                    },
                }
            }
            let Signals { term, int, usr1 } = &mut self.signals;
            tokio::select! {
                biased;
                _ = terminated(term, int, &self.ignore) => return 0,
                _ = deadline_reached(self.deadline) => {
                    log("query deadline reached while idle: exiting");
                    return 0;
                }
                _ = usr1.recv() => log("SIGUSR1: checking for follow-ups"),
                _ = tokio::time::sleep(self.cfg.poll_interval) => {}
            }
        }
    }

    /// Answers one query under the deadline and SIGTERM.
    async fn query(&mut self, messages: &[Message], follow_up: bool) -> Step {
        enum Ended<T> {
            Done(T),
            TimedOut,
            Terminated,
        }
        let query = Query {
            input: &self.input,
            messages,
            follow_up,
        };
        let Signals { term, int, .. } = &mut self.signals;
        let ended = tokio::select! {
            biased;
            _ = terminated(term, int, &self.ignore) => Ended::Terminated,
            _ = deadline_reached(self.deadline) => Ended::TimedOut,
            res = self.brain.respond(query, &self.io) => Ended::Done(res),
        };
        match ended {
            Ended::Done(Ok(Outcome::Reply(reply))) => {
                log(format_args!("reply: {} bytes", reply.text.len()));
                let mut block = OutputBlock::ok(reply.text);
                block.new_session_id = reply.new_session_id;
                self.io.out.block(&block).await;
                Step::Continue
            }
            Ended::Done(Ok(Outcome::Exit(code))) => {
                log(format_args!("/exit {code}"));
                Step::Exit(code)
            }
            Ended::Done(Err(e)) => {
                let status = match e {
                    BrainError::Failed(_) => BlockStatus::Error,
                    BrainError::Fatal(_) => BlockStatus::Fatal,
                };
                log(format_args!("query failed: {e}"));
                self.io
                    .out
                    .block(&OutputBlock::failure(status, e.to_string()))
                    .await;
                Step::Continue
            }
            Ended::TimedOut => {
                let ms = self.cfg.query_timeout.unwrap_or_default().as_millis();
                log(format_args!(
                    "query timeout after {ms} ms: emitting the summary"
                ));
                let summary = timeout_summary(ms, &self.brain.partial());
                self.io.out.block(&OutputBlock::ok(summary)).await;
                Step::Exit(0)
            }
            Ended::Terminated => Step::Exit(0),
        }
    }
}

/// The `ok` result emitted when the deadline cuts a query: short, with the start of what the
/// query had produced.
pub fn timeout_summary(ms: u128, partial: &str) -> String {
    let partial = if partial.is_empty() {
        "(none)".to_owned()
    } else if partial.chars().count() > SUMMARY_PARTIAL_CHARS {
        let cut: String = partial.chars().take(SUMMARY_PARTIAL_CHARS).collect();
        format!("{cut}…")
    } else {
        partial.to_owned()
    };
    format!("query timeout after {ms} ms; partial: {partial}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary() {
        assert_eq!(
            timeout_summary(300, "hello\nworld"),
            "query timeout after 300 ms; partial: hello\nworld"
        );
        assert_eq!(
            timeout_summary(5, ""),
            "query timeout after 5 ms; partial: (none)"
        );
        let long = "é".repeat(5000);
        let s = timeout_summary(5, &long);
        assert!(s.ends_with('…'));
        assert_eq!(
            s.chars().filter(|&c| c == 'é').count(),
            SUMMARY_PARTIAL_CHARS
        );
    }
}
