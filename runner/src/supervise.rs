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
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::engine::{BoxControl, EngineError, Frame, FrameStream};
use super::outcome::Ending;
use super::output::RunOutput;
use super::{CloseWhen, LiveRun, RunControl, RunError, RunEvent, Runner};

/// What supervision uses of the runner: the engine, its deadlines, and the close.
pub(super) struct Hands<'a> {
    pub engine: Arc<dyn BoxControl>,
    pub timing: Timing,
    pub closer: &'a dyn Close,
}

/// The deadlines supervision keeps (from `RunnerConfig`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Timing {
    /// One engine call's deadline.
    pub call: Duration,
    /// Between SIGTERM and SIGKILL when the caller kills the run.
    pub kill_grace: Duration,
    /// Between SIGTERM and SIGKILL at the run's ceiling.
    pub stop_grace: Duration,
}

/// Asking the agent to close (`Runner::close`: the close file, then a wake-up signal).
pub(super) trait Close: Sync {
    fn close<'a>(&'a self, live: &'a LiveRun) -> BoxFuture<'a, Result<(), RunError>>;
}

impl Close for Runner {
    fn close<'a>(&'a self, live: &'a LiveRun) -> BoxFuture<'a, Result<(), RunError>> {
        Box::pin(Runner::close(self, live))
    }
}

impl Runner {
    /// The runner's engine, deadlines and close, for one supervision.
    pub(super) fn hands(&self) -> Hands<'_> {
        Hands {
            engine: self.engine.clone() as Arc<dyn BoxControl>,
            timing: Timing {
                call: self.cfg.docker_timeout,
                kill_grace: self.cfg.kill_grace,
                stop_grace: self.cfg.stop_grace,
            },
            closer: self,
        }
    }
}

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
    hands: Hands<'a>,
    st: &'a mut RunOutput,
    id: &'a str,
    /// The output, until it closes.
    output: Option<FrameStream>,
    /// The container's exit code (polled only until it answers: `Running`, `Stopping`).
    wait: BoxFuture<'static, Result<i64, EngineError>>,
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
async fn next_frame(output: &mut Option<FrameStream>) -> Option<Result<Frame, EngineError>> {
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
        hands: Hands<'a>,
        st: &'a mut RunOutput,
        id: &'a str,
        output: FrameStream,
        deadline: Instant,
        close: CloseWhen,
        events: &'a mpsc::Sender<RunEvent>,
        control: &'a RunControl,
        live: &'a LiveRun,
    ) -> Self {
        let wait = hands.engine.wait(id);
        Self {
            hands,
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
        let timing = self.hands.timing;
        let t = timing.call;
        let grace = match why {
            Why::Killed => timing.kill_grace,
            Why::Ceiling => timing.stop_grace,
        };
        let engine = self.hands.engine.clone();
        let id = self.id.to_owned();
        let task = tokio::spawn(async move {
            if let Err(e) = engine.stop(&id, grace, t).await {
                tracing::debug!(container = %id, error = %e, "stop");
                let _ = engine.signal(&id, "SIGKILL", t).await;
            }
        });
        Stop {
            why,
            give_up: Instant::now() + grace + t,
            task,
        }
    }

    /// The wait answered: the container exited (→ `Draining`), or runed lost it.
    async fn exited(&mut self, r: Result<i64, EngineError>, stop: Option<Stop>) -> Phase {
        self.live.ended.cancel();
        let exit = match r {
            Ok(code) => code,
            Err(e) => {
                // The wait broke (Docker restarted?): ask once more for the state.
                match self
                    .hands
                    .engine
                    .state(self.id, self.hands.timing.call)
                    .await
                {
                    Ok(state) if !state.running => state.exit_code.unwrap_or(-1),
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
    async fn output_item(&mut self, item: Option<Result<Frame, EngineError>>) {
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
        let t = self.hands.timing.call;
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

    /// The idle time passed: ask the agent to close.
    async fn close(&mut self) {
        self.idle.sent();
        if let Err(e) = self.hands.closer.close(self.live).await {
            tracing::debug!(run = %self.st.run_id, error = %e, "close");
        }
    }
}

/// The machine against a scripted engine, on paused time: each test scripts the container
/// (its output, its exit, how it answers a stop) and checks the ending and the engine calls
/// a user would see the effect of (which grace a stop got, whether SIGKILL followed).
#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hako_shared::GroupFolder;
    use hako_shared::contract::Markers;
    use hako_shared::ids::RunId;
    use tokio::sync::watch;

    use super::*;
    use crate::RunnerConfig;
    use crate::engine::ProcessState;

    const KILL_GRACE: Duration = Duration::from_secs(1);
    const STOP_GRACE: Duration = Duration::from_secs(10);
    const CALL: Duration = Duration::from_secs(5);

    /// A container as the test scripts it.
    #[derive(Default)]
    struct Script {
        /// What each stop does, in order: `Some(code)` the container exits with it, `None` it
        /// hangs past the stop's deadline. Past the list: hangs.
        stops: Vec<Option<i64>>,
        /// A stop answers an error at once (and does nothing).
        stop_fails: bool,
        /// SIGKILL makes it exit with this code.
        on_sigkill: Option<i64>,
        /// The wait breaks (the engine restarted) instead of reporting the exit.
        wait_breaks: bool,
        /// What asking for its state answers (`None`: the engine no longer knows it).
        state: Option<ProcessState>,
    }

    struct Fake {
        script: Script,
        exit: watch::Sender<Option<i64>>,
        calls: Mutex<Vec<String>>,
        stops: AtomicUsize,
    }

    impl Fake {
        fn new(script: Script) -> Arc<Self> {
            Arc::new(Fake {
                script,
                exit: watch::channel(None).0,
                calls: Mutex::default(),
                stops: AtomicUsize::new(0),
            })
        }

        fn exit(&self, code: i64) {
            self.exit.send_replace(Some(code));
        }

        fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }

        fn call(&self, c: String) {
            self.calls.lock().unwrap().push(c);
        }
    }

    impl BoxControl for Fake {
        fn wait(&self, _id: &str) -> BoxFuture<'static, Result<i64, EngineError>> {
            let mut exit = self.exit.subscribe();
            let breaks = self.script.wait_breaks;
            Box::pin(async move {
                if breaks {
                    return Err(EngineError::api("the wait broke"));
                }
                let code = exit.wait_for(Option::is_some).await.map(|c| c.unwrap());
                code.map_err(|_| EngineError::api("gone"))
            })
        }

        fn stop(
            &self,
            _id: &str,
            grace: Duration,
            limit: Duration,
        ) -> BoxFuture<'static, Result<(), EngineError>> {
            self.call(format!("stop {grace:?}"));
            let n = self.stops.fetch_add(1, Ordering::SeqCst);
            if self.script.stop_fails {
                return Box::pin(async { Err(EngineError::api("stop refused")) });
            }
            let exits = self.script.stops.get(n).copied().flatten();
            let exit = self.exit.clone();
            Box::pin(async move {
                match exits {
                    Some(code) => {
                        exit.send_replace(Some(code));
                        Ok(())
                    }
                    None => {
                        tokio::time::sleep(grace + limit).await;
                        Err(EngineError::Timeout("stop", grace + limit))
                    }
                }
            })
        }

        fn signal(
            &self,
            _id: &str,
            signal: &'static str,
            _limit: Duration,
        ) -> BoxFuture<'static, Result<(), EngineError>> {
            self.call(format!("signal {signal}"));
            if signal == "SIGKILL"
                && let Some(code) = self.script.on_sigkill
            {
                self.exit(code);
            }
            Box::pin(async { Ok(()) })
        }

        fn state(
            &self,
            id: &str,
            _limit: Duration,
        ) -> BoxFuture<'static, Result<ProcessState, EngineError>> {
            self.call("state".into());
            let answer = self
                .script
                .state
                .ok_or_else(|| EngineError::NotFound(id.to_owned()));
            Box::pin(async move { answer })
        }

        fn list(
            &self,
            _label: &'static str,
            _value: Option<&str>,
            _limit: Duration,
        ) -> BoxFuture<'static, Result<Vec<crate::engine::Listed>, EngineError>> {
            Box::pin(async { Err(EngineError::api("not scripted")) })
        }

        fn remove(
            &self,
            _id: &str,
            _stop: Option<Duration>,
            _limit: Duration,
        ) -> BoxFuture<'static, Result<(), EngineError>> {
            Box::pin(async { Err(EngineError::api("not scripted")) })
        }
    }

    /// Counts the closes sent.
    #[derive(Default)]
    struct Closes(AtomicUsize);

    impl Close for Closes {
        fn close<'a>(&'a self, _live: &'a LiveRun) -> BoxFuture<'a, Result<(), RunError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(()) })
        }
    }

    /// One supervised run: the fake engine, the output's sending end, the caller's controls.
    struct Rig {
        fake: Arc<Fake>,
        /// Dropped to close the output.
        output: Mutex<Option<mpsc::UnboundedSender<Result<Frame, EngineError>>>>,
        control: RunControl,
        live: Arc<LiveRun>,
        closes: Closes,
        /// Capacity of the event channel (what a slow consumer leaves room for).
        events: usize,
        rx: Option<mpsc::UnboundedReceiver<Result<Frame, EngineError>>>,
    }

    /// What the run came to.
    struct Ran {
        ending: Option<Ending>,
        /// Block indexes sent as events, in order.
        blocks: Vec<usize>,
        /// Time from the start to the end (paused time: exact).
        took: Duration,
    }

    fn rig(script: Script) -> Rig {
        let (output, rx) = mpsc::unbounded_channel();
        Rig {
            fake: Fake::new(script),
            output: Mutex::new(Some(output)),
            control: RunControl::default(),
            live: LiveRun::new(
                RunId::new("r-1").unwrap(),
                GroupFolder::new("main").unwrap(),
            ),
            closes: Closes::default(),
            events: 64,
            rx: Some(rx),
        }
    }

    /// A complete output block with `result`.
    fn block(result: &str) -> Frame {
        let m = Markers::default();
        let body = serde_json::json!({"status": "success", "result": result});
        Frame::Stdout(
            format!("\n{}\n{body}\n{}\n", m.start, m.end)
                .into_bytes()
                .into(),
        )
    }

    impl Rig {
        /// After `after`, `what` happens (to the script's container or the caller's controls).
        fn at(&self, after: Duration, what: impl FnOnce(&Rig) + Send + 'static) -> Handle {
            Handle {
                after,
                what: Box::new(what),
            }
        }

        /// Supervises until the end; `script` runs beside it, each step at its time.
        async fn run(mut self, ceiling: Duration, close: CloseWhen, script: Vec<Handle>) -> Ran {
            let cfg = RunnerConfig::new("/tmp/unused");
            let mut st = RunOutput::new(&cfg, self.live.run_id(), &self.live.folder, Vec::new());
            let (tx, mut events) = mpsc::channel(self.events);
            let rx = self.rx.take().unwrap();
            let output = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            })
            .boxed();
            let t0 = Instant::now();
            let hands = Hands {
                engine: self.fake.clone(),
                timing: Timing {
                    call: CALL,
                    kill_grace: KILL_GRACE,
                    stop_grace: STOP_GRACE,
                },
                closer: &self.closes,
            };
            let supervise = Supervisor::new(
                hands,
                &mut st,
                "c-1",
                output,
                t0 + ceiling,
                close,
                &tx,
                &self.control,
                &self.live,
            )
            .run();
            let steps = async {
                for step in script {
                    tokio::time::sleep_until(t0 + step.after).await;
                    (step.what)(&self);
                }
                std::future::pending::<()>().await
            };
            let ending = tokio::select! {
                ending = supervise => ending,
                () = steps => unreachable!(),
            };
            let took = t0.elapsed();
            drop(tx);
            let mut blocks = Vec::new();
            while let Some(e) = events.recv().await {
                if let RunEvent::Block { index, .. } = e {
                    blocks.push(index);
                }
            }
            Ran {
                ending,
                blocks,
                took,
            }
        }

        fn send(&self, frame: Frame) {
            let output = self.output.lock().unwrap();
            output.as_ref().unwrap().send(Ok(frame)).unwrap();
        }

        fn close_output(&self) {
            self.output.lock().unwrap().take();
        }
    }

    /// A scripted step.
    struct Handle {
        after: Duration,
        what: Box<dyn FnOnce(&Rig) + Send>,
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    const CEILING: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_exit_after_its_output_is_the_runs_exit_and_every_block_is_sent() {
        let r = rig(Script::default());
        let steps = vec![
            r.at(secs(1), |r| r.send(block("one"))),
            r.at(secs(2), |r| r.send(Frame::Stderr("a warning\n".into()))),
            r.at(secs(3), |r| r.send(block("two"))),
            r.at(secs(4), |r| r.fake.exit(0)),
            // The output closes with the exit.
            r.at(secs(4), |r| r.close_output()),
        ];
        let (fake, live) = (r.fake.clone(), r.live.clone());
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Exited(0)));
        assert_eq!(ran.blocks, [0, 1]);
        assert_eq!(ran.took, secs(4));
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
        assert!(live.has_ended() && live.has_spoken());
    }

    #[tokio::test(start_paused = true)]
    async fn output_left_open_after_the_exit_drains_for_two_seconds_and_still_counts() {
        let r = rig(Script::default());
        let steps = vec![
            r.at(secs(1), |r| r.fake.exit(3)),
            r.at(Duration::from_millis(2500), |r| r.send(block("late"))),
        ];
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Exited(3)));
        assert_eq!(ran.blocks, [0], "a block within the drain is kept");
        assert_eq!(ran.took, secs(1) + DRAIN);
    }

    #[tokio::test(start_paused = true)]
    async fn the_ceiling_stops_with_the_stop_grace_and_ends_timed_out_with_the_exit() {
        let r = rig(Script {
            stops: vec![Some(143)],
            ..Script::default()
        });
        let steps = vec![r.at(secs(1), |r| r.send(block("partial")))];
        let fake = r.fake.clone();
        let ran = r.run(secs(30), CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::TimedOut(Some(143))));
        assert_eq!(fake.calls(), [format!("stop {STOP_GRACE:?}")]);
        assert_eq!(ran.blocks, [0]);
        // Stopped at the ceiling; the output never closed, so it drained.
        assert_eq!(ran.took, secs(30) + DRAIN);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_stops_with_the_kill_grace() {
        let r = rig(Script {
            stops: vec![Some(137)],
            ..Script::default()
        });
        let steps = vec![r.at(secs(5), |r| r.control.kill.cancel())];
        let fake = r.fake.clone();
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Killed(Some(137))));
        assert_eq!(fake.calls(), [format!("stop {KILL_GRACE:?}")]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_stop_falls_back_to_sigkill() {
        let r = rig(Script {
            stop_fails: true,
            on_sigkill: Some(137),
            ..Script::default()
        });
        let steps = vec![r.at(secs(5), |r| r.control.kill.cancel())];
        let fake = r.fake.clone();
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Killed(Some(137))));
        assert_eq!(
            fake.calls(),
            [format!("stop {KILL_GRACE:?}"), "signal SIGKILL".into()]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_that_never_exits_is_given_up_after_the_grace_and_a_call() {
        // Neither the stop nor SIGKILL ends it.
        let r = rig(Script::default());
        let (fake, live) = (r.fake.clone(), r.live.clone());
        let ran = r.run(secs(30), CloseWhen::Manual, Vec::new()).await;
        assert_eq!(ran.ending, Some(Ending::TimedOut(None)));
        assert_eq!(ran.took, secs(30) + STOP_GRACE + CALL);
        assert_eq!(fake.calls()[0], format!("stop {STOP_GRACE:?}"));
        assert!(
            live.has_ended(),
            "the caller's removal must not wait for it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_during_the_ceilings_stop_stops_again_as_a_kill() {
        // The ceiling's stop hangs; the kill's stop ends it.
        let r = rig(Script {
            stops: vec![None, Some(137)],
            ..Script::default()
        });
        let steps = vec![r.at(secs(12), |r| r.control.kill.cancel())];
        let fake = r.fake.clone();
        let ran = r.run(secs(10), CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Killed(Some(137))));
        assert_eq!(
            fake.calls()[..2],
            [
                format!("stop {STOP_GRACE:?}"),
                format!("stop {KILL_GRACE:?}")
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_while_the_output_drains_decides_the_ending() {
        // The stop of an exited container answers at once.
        let r = rig(Script {
            stops: vec![Some(0)],
            ..Script::default()
        });
        let steps = vec![
            r.at(secs(1), |r| r.fake.exit(0)),
            r.at(Duration::from_millis(1500), |r| r.control.kill.cancel()),
        ];
        let fake = r.fake.clone();
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Killed(Some(0))));
        assert_eq!(fake.calls(), [format!("stop {KILL_GRACE:?}")]);
    }

    #[tokio::test(start_paused = true)]
    async fn detach_leaves_the_container_running() {
        let r = rig(Script::default());
        let steps = vec![
            r.at(secs(1), |r| r.send(block("one"))),
            r.at(secs(2), |r| r.control.detach.cancel()),
        ];
        let (fake, live) = (r.fake.clone(), r.live.clone());
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, None);
        assert!(fake.calls().is_empty(), "{:?}", fake.calls());
        assert!(!live.has_ended());
        assert_eq!(ran.took, secs(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_broken_wait_asks_the_engine_for_the_exit_once_more() {
        let r = rig(Script {
            wait_breaks: true,
            state: Some(ProcessState {
                running: false,
                exit_code: Some(7),
            }),
            ..Script::default()
        });
        let steps = vec![r.at(Duration::ZERO, |r| r.close_output())];
        let fake = r.fake.clone();
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Exited(7)));
        assert_eq!(fake.calls(), ["state"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_container_the_engine_lost_fails_the_run_as_retryable() {
        for state in [
            None,
            Some(ProcessState {
                running: true,
                exit_code: None,
            }),
        ] {
            let r = rig(Script {
                wait_breaks: true,
                state,
                ..Script::default()
            });
            let ran = r.run(CEILING, CloseWhen::Manual, Vec::new()).await;
            match ran.ending {
                Some(Ending::Failed { error, terminal }) => {
                    assert!(error.starts_with("lost the container"), "{error}");
                    assert!(!terminal);
                }
                other => panic!("{state:?}: {other:?}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn idle_output_sends_the_close_once() {
        let r = rig(Script::default());
        let steps = vec![
            r.at(secs(1), |r| r.send(block("one"))),
            // Idle from 1 s: the close is due at 6 s.
            r.at(secs(7), |r| {
                assert_eq!(r.closes.0.load(Ordering::SeqCst), 1, "closed at 6 s");
                r.send(block("two"));
            }),
            // Idle again, but the close was sent already.
            r.at(secs(20), |r| r.fake.exit(0)),
        ];
        let ran = r.run(CEILING, CloseWhen::Idle(secs(5)), steps).await;
        assert_eq!(ran.ending, Some(Ending::Exited(0)));
        assert_eq!(ran.blocks, [0, 1]);
    }

    #[tokio::test(start_paused = true)]
    async fn no_close_before_the_first_block() {
        let r = rig(Script::default());
        let steps = vec![r.at(secs(30), |r| {
            assert_eq!(r.closes.0.load(Ordering::SeqCst), 0);
            r.fake.exit(0);
        })];
        let ran = r.run(CEILING, CloseWhen::Idle(secs(5)), steps).await;
        assert_eq!(ran.ending, Some(Ending::Exited(0)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_consumer_that_reads_no_events_holds_off_neither_a_kill_nor_the_end() {
        let mut r = rig(Script {
            stops: vec![Some(137)],
            ..Script::default()
        });
        // Room for one event, and nobody reads them until the run is over.
        r.events = 1;
        let steps = vec![
            r.at(secs(1), |r| {
                for i in 0..3 {
                    r.send(block(&format!("b{i}")));
                }
            }),
            r.at(secs(2), |r| r.control.kill.cancel()),
        ];
        let ran = r.run(CEILING, CloseWhen::Manual, steps).await;
        assert_eq!(ran.ending, Some(Ending::Killed(Some(137))));
        assert!(ran.took < secs(2) + CALL, "{:?}", ran.took);
    }
}
