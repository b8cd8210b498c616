//! Following a started container to its end: a state machine over the container's wait, its
//! output, the run's ceiling, the caller's kill and detach, and the idle close.
//!
//! ```text
//!                ceiling, kill               exit                  output closed,
//!     Running ───────────────▶ Stopping ──────────▶ Draining ─────────────────────▶ Done
//!      │  │                      │                    ▲        or drained for 2 s
//!      │  └──────────── exit ────┼────────────────────┘
//!      │ detach                  │ not exited by the give-up time
//!      ▼                         ▼
//!   Detached                   Done (timed out / killed, no exit code)
//! ```
//!
//! From `Running` and `Stopping`, a wait that breaks on a container Docker cannot inspect
//! ends the run as failed. `Draining` still listens to a kill, the ceiling and a detach
//! (while nothing stopped the run yet): a stop asked for while the output drains decides
//! how the run ended. A kill during the ceiling's stop stops it again, as a kill.
//!
//! Each state is a variant of [`Phase`] holding what only it has (the stop under way, the
//! exit code, the drain's end), and [`Phase::next`] waits for the events that state listens
//! to and returns the next state. What every state shares (the output stream, the wait, the
//! idle close, the run's record) is the [`Supervisor`]. The output is read in every state
//! until it closes: blocks that arrive while the container is being stopped still count.
//!
//! (`output.rs` is the record this fills: parser, blocks within the cap, stderr tail.)

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bollard::container::LogOutput;
use bollard::query_parameters::{StopContainerOptionsBuilder, WaitContainerOptionsBuilder};
use futures_util::StreamExt;
use futures_util::stream::BoxStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::docker::{self, DockerError};
use super::outcome::Ending;
use super::output::RunOutput;
use super::{CloseWhen, LiveRun, RunControl, RunEvent, Runner};

/// The container's output: attach (a new run) or logs (a re-adopted one).
pub(super) type OutputStream = BoxStream<'static, Result<LogOutput, DockerError>>;

/// How long output may keep coming after the container exited (attach can stay open after
/// exit on some engines).
const DRAIN: Duration = Duration::from_secs(2);

/// Why the runner stops a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The run's ceiling was reached.
    Ceiling,
    /// The caller asked for a kill.
    Killed,
}

/// A stop under way: `docker stop` (SIGTERM, the grace, SIGKILL) in a task of its own.
struct Stop {
    why: Why,
    /// When the runner stops waiting for the container to exit and ends the run anyway.
    give_up: Instant,
    task: JoinHandle<()>,
}

/// Where a supervised run is.
enum Phase {
    /// The container runs.
    Running,
    /// A stop was asked for; the container has not exited yet.
    Stopping(Stop),
    /// The container exited with `exit`; its output drains until `until`. A stop asked for
    /// before (or during) the drain decides how the run ended.
    Draining {
        exit: i64,
        until: Instant,
        stop: Option<Stop>,
    },
    /// Over.
    Done(Ending),
    /// RunOutput stopped on request; the container keeps running.
    Detached,
}

/// What every phase of one run's supervision shares.
pub(super) struct Supervisor<'a> {
    runner: &'a Runner,
    st: &'a mut RunOutput,
    id: &'a str,
    /// The output, until it closes.
    output: Option<OutputStream>,
    /// The container's exit code (polled only until it answers: `Running`, `Stopping`).
    wait: Pin<Box<dyn Future<Output = Result<i64, DockerError>> + Send>>,
    /// The run's ceiling.
    deadline: Instant,
    idle: IdleClose,
    events: &'a mpsc::Sender<RunEvent>,
    control: &'a RunControl,
    live: &'a LiveRun,
}

/// `CloseWhen::Idle`: `_close` is dropped once output has been idle `after` a block; once.
struct IdleClose {
    /// `None` when the close is manual, or was sent.
    after: Option<Duration>,
    /// When it is due (armed by a block).
    due: Option<Instant>,
}

impl IdleClose {
    fn new(close: CloseWhen) -> Self {
        let after = match close {
            CloseWhen::Idle(d) => Some(d),
            CloseWhen::Manual => None,
        };
        Self { after, due: None }
    }

    /// A block arrived: the idle time starts again.
    fn block(&mut self) {
        if let Some(d) = self.after {
            self.due = Some(Instant::now() + d);
        }
    }

    /// Resolves when the close is due; never when it is not armed.
    fn due(&self) -> impl Future<Output = ()> + use<> {
        let due = self.due;
        async move {
            match due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }

    fn sent(&mut self) {
        self.after = None;
        self.due = None;
    }
}

/// The next output item, or never once the output has closed.
async fn next_frame(output: &mut Option<OutputStream>) -> Option<Result<LogOutput, DockerError>> {
    match output {
        Some(o) => o.next().await,
        None => std::future::pending().await,
    }
}

impl Phase {
    /// Waits for what this phase listens to and returns the phase it leads to. The order of
    /// each `select!` is its priority: the caller's controls first, then the ceiling, then
    /// output before the exit, so that output already there is read before the drain starts.
    async fn next(self, s: &mut Supervisor<'_>) -> Phase {
        match self {
            Phase::Running => tokio::select! {
                biased;
                () = s.control.detach.cancelled() => Phase::Detached,
                () = s.control.kill.cancelled() => Phase::Stopping(s.stop(Why::Killed)),
                () = tokio::time::sleep_until(s.deadline) => {
                    tracing::info!(run = %s.st.run_id, "run ceiling reached; stopping");
                    Phase::Stopping(s.stop(Why::Ceiling))
                }
                item = next_frame(&mut s.output) => {
                    s.output_item(item).await;
                    Phase::Running
                }
                () = s.idle.due() => {
                    s.close().await;
                    Phase::Running
                }
                r = &mut s.wait => s.exited(r, None).await,
            },
            Phase::Stopping(stop) => tokio::select! {
                biased;
                // A kill after the ceiling's stop: stopped again, as a kill (the first stop's
                // task runs on).
                () = s.control.kill.cancelled(), if stop.why != Why::Killed => {
                    Phase::Stopping(s.stop(Why::Killed))
                }
                item = next_frame(&mut s.output) => {
                    s.output_item(item).await;
                    Phase::Stopping(stop)
                }
                () = s.idle.due() => {
                    s.close().await;
                    Phase::Stopping(stop)
                }
                r = &mut s.wait => s.exited(r, Some(stop)).await,
                () = tokio::time::sleep_until(stop.give_up) => {
                    // Stop and kill did not end it in time: give up on a clean ending (the
                    // caller's removal forces it).
                    s.live.ended.cancel();
                    Phase::Done(match stop.why {
                        Why::Killed => Ending::Killed(None),
                        Why::Ceiling => Ending::TimedOut(None),
                    })
                }
            },
            Phase::Draining { exit, until, stop } => {
                if s.output.is_none() {
                    let why = match stop {
                        Some(stop) => {
                            let _ = stop.task.await;
                            Some(stop.why)
                        }
                        None => None,
                    };
                    return Phase::Done(match why {
                        Some(Why::Killed) => Ending::Killed(Some(exit)),
                        Some(Why::Ceiling) => Ending::TimedOut(Some(exit)),
                        None => Ending::Exited(exit),
                    });
                }
                let stopped = stop.as_ref().map(|s| s.why);
                tokio::select! {
                    biased;
                    () = s.control.detach.cancelled(), if stopped.is_none() => Phase::Detached,
                    () = s.control.kill.cancelled(), if stopped != Some(Why::Killed) => {
                        let stop = Some(s.stop(Why::Killed));
                        Phase::Draining { exit, until, stop }
                    }
                    () = tokio::time::sleep_until(s.deadline), if stopped.is_none() => {
                        tracing::info!(run = %s.st.run_id, "run ceiling reached; stopping");
                        let stop = Some(s.stop(Why::Ceiling));
                        Phase::Draining { exit, until, stop }
                    }
                    item = next_frame(&mut s.output) => {
                        s.output_item(item).await;
                        Phase::Draining { exit, until, stop }
                    }
                    () = s.idle.due() => {
                        s.close().await;
                        Phase::Draining { exit, until, stop }
                    }
                    () = tokio::time::sleep_until(until) => {
                        // Drained long enough: what did not come is not waited for.
                        s.output = None;
                        Phase::Draining { exit, until, stop }
                    }
                }
            }
            done @ (Phase::Done(_) | Phase::Detached) => done,
        }
    }
}

impl<'a> Supervisor<'a> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        runner: &'a Runner,
        st: &'a mut RunOutput,
        id: &'a str,
        output: OutputStream,
        deadline: Instant,
        close: CloseWhen,
        events: &'a mpsc::Sender<RunEvent>,
        control: &'a RunControl,
        live: &'a LiveRun,
    ) -> Self {
        let wait_opts = WaitContainerOptionsBuilder::new()
            .condition("not-running")
            .build();
        let docker = runner.docker.clone();
        let wait_id = id.to_owned();
        let wait = Box::pin(async move {
            let mut s = docker.wait_container(&wait_id, Some(wait_opts));
            match s.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                    Ok(code)
                }
                Some(Err(e)) => Err(DockerError::from_bollard(e, &wait_id)),
                None => Err(DockerError::api("wait stream ended without a status")),
            }
        });
        Self {
            runner,
            st,
            id,
            output: Some(output),
            wait,
            deadline,
            idle: IdleClose::new(close),
            events,
            control,
            live,
        }
    }

    /// Follows the container to its end. `None` means detached.
    pub(super) async fn run(mut self) -> Option<Ending> {
        let mut phase = Phase::Running;
        loop {
            phase = match phase {
                Phase::Done(ending) => return Some(ending),
                Phase::Detached => return None,
                p => p.next(&mut self).await,
            };
        }
    }

    /// Starts stopping the container for `why`: SIGTERM, the grace, SIGKILL.
    fn stop(&self, why: Why) -> Stop {
        let cfg = &self.runner.cfg;
        let t = cfg.docker_timeout;
        let grace = match why {
            Why::Killed => cfg.kill_grace,
            Why::Ceiling => cfg.stop_grace,
        };
        let docker = self.runner.docker.clone();
        let id = self.id.to_owned();
        let task = tokio::spawn(async move {
            let secs = grace.as_secs().min(i32::MAX as u64) as i32;
            let opts = StopContainerOptionsBuilder::new().t(secs).build();
            if let Err(e) = docker::bounded(
                "stop",
                grace + t,
                &id,
                docker.stop_container(&id, Some(opts)),
            )
            .await
            {
                tracing::debug!(container = %id, error = %e, "stop");
                let _ = docker::signal(&docker, &id, "SIGKILL", t).await;
            }
        });
        Stop {
            why,
            give_up: Instant::now() + grace + t,
            task,
        }
    }

    /// The wait answered: the container exited (→ `Draining`), or runed lost it.
    async fn exited(&mut self, r: Result<i64, DockerError>, stop: Option<Stop>) -> Phase {
        self.live.ended.cancel();
        let exit = match r {
            Ok(code) => code,
            Err(e) => {
                // The wait broke (Docker restarted?): ask once more for the state.
                let t = self.runner.cfg.docker_timeout;
                let docker = &self.runner.docker;
                match docker::bounded(
                    "inspect",
                    t,
                    self.id,
                    docker.inspect_container(self.id, None),
                )
                .await
                {
                    Ok(info) if info.state.as_ref().and_then(|s| s.running) == Some(false) => {
                        info.state.and_then(|s| s.exit_code).unwrap_or(-1)
                    }
                    _ => {
                        if let Some(stop) = stop {
                            stop.task.abort();
                        }
                        return Phase::Done(Ending::Failed {
                            error: format!("lost the container: {e}"),
                            terminal: false,
                        });
                    }
                }
            }
        };
        Phase::Draining {
            exit,
            until: Instant::now() + DRAIN,
            stop,
        }
    }

    /// One item of output: its blocks are kept and sent; an error or the end closes it.
    async fn output_item(&mut self, item: Option<Result<LogOutput, DockerError>>) {
        let frame = match item {
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                tracing::warn!(run = %self.st.run_id, error = %e, "output stream failed");
                self.output = None;
                return;
            }
            None => {
                self.output = None;
                return;
            }
        };
        self.live.set_spoken();
        let t = self.runner.cfg.docker_timeout;
        for (index, block) in self.st.frame(frame) {
            // A slow consumer must not hold off the ceiling or a kill: the wait is bounded,
            // and the block stays in the report anyway.
            let limit = self.deadline.min(Instant::now() + t);
            tokio::select! {
                r = self.events.send(RunEvent::Block { index, block }) => drop(r),
                () = self.control.kill.cancelled() => {}
                () = tokio::time::sleep_until(limit) => {
                    tracing::warn!(run = %self.st.run_id, index, "event consumer too slow; block kept in the report only");
                }
            }
            self.idle.block();
        }
    }

    /// The idle time passed: tell the agent to finish.
    async fn close(&mut self) {
        self.idle.sent();
        if let Err(e) = self.runner.close(self.live).await {
            tracing::debug!(run = %self.st.run_id, error = %e, "close");
        }
    }
}
