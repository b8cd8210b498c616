//! `hako chat`: one line in, one turn in one fresh container, the reply out.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hako_runed::runner::{
    CloseWhen, LiveRun, RunControl, RunEnd, RunEvent, RunSpec, Runner, RunnerConfig, docker,
};
use hako_shared::config::Env;
use hako_shared::contract::{BlockStatus, ContainerInput, Message};
use hako_shared::folder::GroupFolder;
use hako_shared::runs::{GroupSpec, Outcome};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;

/// Arguments of `hako chat`.
#[derive(Debug, clap::Args)]
pub struct ChatArgs {
    /// The group folder the agent works in (its storage is under `$DATA_DIR/folders/`).
    #[arg(default_value = "demo")]
    pub folder: String,
    /// Send this one message instead of reading lines from stdin.
    #[arg(short, long)]
    pub message: Option<String>,
}

/// Longest accepted line of input: a turn's prompt, not a file upload.
const MAX_LINE: usize = 1024 * 1024;

/// Runs the chat until stdin ends (or the one `--message`). Exit code 1 if any turn failed.
pub async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    hako_shared::telemetry::init_with("warn")?;
    let folder = GroupFolder::new(&args.folder)
        .with_context(|| format!("{:?} is not a valid group folder", args.folder))?;
    let env = Env::from_process();
    let cfg = RunnerConfig::from_env(&env)?;
    let runner = Runner::new(docker::connect()?, cfg)?;
    runner.ensure_running().await?;

    let mut chat = Chat {
        runner,
        folder,
        session: String::new(),
        failed: false,
    };
    match args.message {
        Some(m) => chat.turn(&m).await?,
        None => chat.read_stdin().await?,
    }
    Ok(if chat.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

struct Chat {
    runner: Runner,
    folder: GroupFolder,
    /// The agent's session, carried from turn to turn (`newSessionId`).
    session: String,
    failed: bool,
}

impl Chat {
    async fn read_stdin(&mut self) -> anyhow::Result<()> {
        let interactive = std::io::stdin().is_terminal();
        let mut lines = BufReader::new(tokio::io::stdin());
        let mut line = Vec::new();
        loop {
            if interactive {
                let mut out = tokio::io::stderr();
                out.write_all(b"you> ").await?;
                out.flush().await?;
            }
            line.clear();
            let n = (&mut lines)
                .take(MAX_LINE as u64 + 1)
                .read_until(b'\n', &mut line)
                .await
                .context("reading stdin")?;
            if n == 0 {
                return Ok(());
            }
            anyhow::ensure!(
                line.len() <= MAX_LINE,
                "a line of input is longer than {MAX_LINE} bytes"
            );
            let text = String::from_utf8(line.clone()).context("input is not UTF-8")?;
            let text = text.trim_end_matches(['\n', '\r']);
            if text.trim().is_empty() {
                continue;
            }
            self.turn(text).await?;
        }
    }

    /// One turn: a fresh container, its blocks printed as they arrive.
    async fn turn(&mut self, text: &str) -> anyhow::Result<()> {
        let run_id = format!("cli-{}", random_hex());
        let spec = RunSpec {
            run_id: run_id.clone(),
            turn_id: run_id.clone(),
            folder: self.folder.clone(),
            input: ContainerInput {
                session_id: self.session.clone(),
                messages: vec![Message::user(text)],
                ..ContainerInput::default()
            },
            group: GroupSpec::default(),
            // One turn, one container: close as soon as the reply is out.
            close: CloseWhen::Idle(Duration::ZERO),
        };
        let (tx, mut rx) = mpsc::channel(64);
        let control = RunControl::default();
        let live = LiveRun::new(run_id, self.folder.clone());
        let runner = &self.runner;
        let run = runner.run(spec, tx, control.clone(), Arc::clone(&live));
        tokio::pin!(run);
        let mut stdout = tokio::io::stdout();
        let end = loop {
            tokio::select! {
                end = &mut run => break end,
                Some(ev) = rx.recv() => print(&mut self.session, &mut stdout, ev).await?,
                _ = tokio::signal::ctrl_c() => {
                    eprintln!("hako: interrupted, stopping the container");
                    control.kill.cancel();
                }
            }
        };
        // Blocks sent just before the run ended.
        while let Ok(ev) = rx.try_recv() {
            print(&mut self.session, &mut stdout, ev).await?;
        }
        let report = match end {
            RunEnd::Finished(r) => r,
            RunEnd::Detached => anyhow::bail!("the run was detached"),
        };
        // The CLI records nothing, so the containers go at once.
        for e in runner.remove_containers(&report).await {
            eprintln!("hako: cleanup: {e}");
        }
        if report.outcome != Outcome::Ok {
            self.failed = true;
            let why = report
                .error
                .unwrap_or_else(|| report.outcome.as_str().into());
            eprintln!("hako: the turn failed ({}): {why}", report.outcome.as_str());
            if report.outcome == Outcome::Killed {
                anyhow::bail!("interrupted");
            }
        }
        Ok(())
    }
}

/// Prints one event: `ok` results to stdout, errors to stderr; follows the session id.
async fn print(
    session: &mut String,
    out: &mut tokio::io::Stdout,
    ev: RunEvent,
) -> anyhow::Result<()> {
    let RunEvent::Block { block, .. } = ev else {
        return Ok(());
    };
    if let Some(s) = block.new_session_id.as_deref().filter(|s| !s.is_empty()) {
        *session = s.to_owned();
    }
    match block.status {
        BlockStatus::Ok => {
            if let Some(r) = block.result {
                out.write_all(r.as_bytes()).await?;
                out.write_all(b"\n").await?;
                out.flush().await?;
            }
        }
        status => eprintln!(
            "agent {}: {}",
            if status == BlockStatus::Fatal {
                "fatal"
            } else {
                "error"
            },
            block.error.as_deref().unwrap_or("(no message)")
        ),
    }
    Ok(())
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    // Without randomness the time still makes the id unique enough for one CLI.
    if getrandom::fill(&mut b).is_err() {
        let t = hako_shared::time::unix_millis(std::time::SystemTime::now());
        b = t.to_le_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}
