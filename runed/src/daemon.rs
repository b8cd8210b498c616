//! The daemon's core: the shared state, the scheduler that moves runs from the queue into
//! containers, and each run's life from `queued` to its terminal state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hako_shared::auth::{Verifier, now_secs};
use hako_shared::contract::{ContainerInput, OutputBlock, Redacted, Secrets};
use hako_shared::runs::{Outcome, RunRequest, RunState};
use hako_shared::time::unix_millis;
use serde::Serialize;
use tokio::sync::{Notify, broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::config::Config;
use crate::metrics::DaemonMetrics;
use crate::queue::{Entry, FairQueue, Kind};
use crate::runner::{CloseWhen, LiveRun, RunControl, RunEnd, RunEvent, RunReport, RunSpec, Runner};
use crate::store::{Finish, Store};
use crate::tokens::{Broker, BrokerError};
use hako_shared::runs::SessionEntry;

/// What SSE subscribers and long-polls hear.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A run changed state.
    State {
        /// The run.
        run_id: String,
        /// Its new state.
        state: RunState,
    },
    /// A run produced an output block.
    Output {
        /// The run.
        run_id: String,
        /// Its position.
        index: usize,
        /// The block, when it is small ([`INLINE_BLOCK`]); larger ones are read from the
        /// store by whoever needs them, so the broadcast ring stays small.
        block: Option<OutputBlock>,
    },
}

impl Event {
    /// The run concerned.
    pub fn run_id(&self) -> &str {
        match self {
            Event::State { run_id, .. } | Event::Output { run_id, .. } => run_id,
        }
    }
}

/// Blocks up to this many text bytes travel inside their event; the ring of recent events
/// (`EVENT_RING` of them) therefore holds at most a few MiB, whoever lags behind it.
pub const INLINE_BLOCK: usize = 4 << 10;
/// Events kept for subscribers; one that falls further behind re-reads the store.
pub const EVENT_RING: usize = 1024;

/// What a waiting run keeps in memory: only what is never stored. The request itself waits
/// in `runed.db` (without its secrets) and is read back when the run starts.
#[derive(Default)]
pub(crate) struct Pending {
    /// The request's secrets (stdin only; bounded by `MAX_SECRETS_BYTES`).
    pub secrets: Secrets,
    /// A hold's time to live.
    pub hold_ttl: Duration,
    /// The id of the request that created the run: its logs and its calls to authd carry it.
    pub request_id: Option<Arc<str>>,
}

/// The most secret bytes (names and values) one run request may carry: they wait in memory.
pub const MAX_SECRETS_BYTES: usize = 64 << 10;

/// A run or hold that holds a slot.
pub(crate) struct Live {
    pub folder: String,
    pub kind: Kind,
    pub control: RunControl,
    pub run: Arc<LiveRun>,
}

pub(crate) struct Sched {
    pub queue: FairQueue,
    pub pending: HashMap<String, Pending>,
    pub live: HashMap<String, Live>,
    /// Places promised to requests being written to the store, overall and per folder.
    pub reserved: usize,
    pub reserved_per: HashMap<String, usize>,
}

/// Why a request cannot be queued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueFull {
    /// Too many runs and holds wait overall.
    #[error("{0} runs and holds are queued, the limit (RUNED_MAX_QUEUED); try again later")]
    Total(usize),
    /// Too many wait for this folder.
    #[error(
        "{0} runs and holds of this folder are queued, the limit (RUNED_MAX_QUEUED_PER_FOLDER); try again later"
    )]
    Folder(usize),
}

/// A place in the queue promised to a request until it is enqueued (or fails).
pub(crate) struct Reserved<'a> {
    sh: &'a Shared,
    folder: String,
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let mut s = self.sh.sched();
        s.reserved = s.reserved.saturating_sub(1);
        if let Some(n) = s.reserved_per.get_mut(&self.folder) {
            *n -= 1;
            if *n == 0 {
                s.reserved_per.remove(&self.folder);
            }
        }
    }
}

/// Everything the daemon's tasks share.
pub struct Shared {
    pub(crate) cfg: Config,
    pub(crate) store: Store,
    /// The container runner, once Docker's socket exists (it may appear after start).
    pub(crate) runner: Mutex<Option<Runner>>,
    pub(crate) broker: Broker,
    pub(crate) verifier: Verifier,
    pub(crate) metrics: DaemonMetrics,
    pub(crate) sched: Mutex<Sched>,
    pub(crate) wake: Notify,
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    /// Why Docker is not usable, if it is not.
    pub(crate) docker_down: Mutex<Option<String>>,
    /// Until when starts wait because authd did not answer.
    pub(crate) broker_pause: Mutex<Option<(Instant, String)>>,
    /// Cancelled at shutdown: runs detach, long-polls and streams end.
    pub(crate) stopping: CancellationToken,
    /// Open SSE streams and long-polls, bounded.
    pub(crate) watchers: Arc<crate::watchers::Gate>,
    /// Set once re-adoption has run.
    pub(crate) adopted: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Builds the container runner on the configured Docker socket. bollard refuses a socket
/// path that does not exist yet, so this is retried until it does.
pub(crate) fn connect(cfg: &Config) -> Result<Runner, String> {
    let docker =
        bollard::Docker::connect_with_unix(&cfg.docker_socket, 120, bollard::API_DEFAULT_VERSION)
            .map_err(|e| format!("docker socket {}: {e}", cfg.docker_socket))?;
    Runner::new(docker, cfg.runner.clone()).map_err(|e| format!("runner: {e}"))
}

/// A new run id: `run-` and 16 random hex digits.
pub fn new_run_id() -> String {
    let mut b = [0u8; 8];
    if getrandom::fill(&mut b).is_err() {
        // No randomness: fall back to time and a counter (unique within this process).
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b = (unix_millis(SystemTime::now()) as u64 ^ (n << 40)).to_be_bytes();
    }
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("run-{hex}")
}

impl Shared {
    pub(crate) fn sched(&self) -> std::sync::MutexGuard<'_, Sched> {
        lock(&self.sched)
    }

    pub(crate) fn emit(&self, e: Event) {
        let _ = self.events.send(Arc::new(e));
    }

    /// Refreshes the queue gauges.
    pub(crate) fn gauges(&self) {
        let s = self.sched();
        self.metrics.queued.set(s.queue.len() as i64);
        self.metrics.active.set(s.queue.active() as i64);
        self.metrics
            .oldest_queued
            .set(s.queue.oldest_age(Instant::now()).as_secs() as i64);
    }

    /// Promises a place in the queue to a request for `folder`, or says which bound is full.
    /// Hold it across the store write and the enqueue, so that concurrent requests never
    /// overshoot the bounds.
    pub(crate) fn reserve(&self, folder: &str) -> Result<Reserved<'_>, QueueFull> {
        let mut s = self.sched();
        let (total, per) = (self.cfg.max_queued, self.cfg.max_queued_per_folder);
        if s.queue.len() + s.reserved >= total {
            return Err(QueueFull::Total(total));
        }
        let mine = s.reserved_per.get(folder).copied().unwrap_or(0);
        if s.queue.folder_len(folder) + mine >= per {
            return Err(QueueFull::Folder(per));
        }
        s.reserved += 1;
        *s.reserved_per.entry(folder.to_owned()).or_insert(0) += 1;
        Ok(Reserved {
            sh: self,
            folder: folder.to_owned(),
        })
    }

    /// Queues a run (or hold) already stored as `queued`.
    pub(crate) fn enqueue(&self, run_id: &str, folder: &str, kind: Kind, p: Pending) {
        {
            let mut s = self.sched();
            s.pending.insert(run_id.to_owned(), p);
            s.queue.push(
                folder,
                Entry {
                    run_id: run_id.to_owned(),
                    kind,
                    since: Instant::now(),
                },
            );
        }
        self.gauges();
        self.wake.notify_one();
    }

    /// The runner, building it if Docker's socket has appeared since the last try.
    pub(crate) fn runner(&self) -> Result<Runner, String> {
        let mut r = lock(&self.runner);
        if let Some(r) = &*r {
            return Ok(r.clone());
        }
        let built = connect(&self.cfg)?;
        *r = Some(built.clone());
        Ok(built)
    }

    /// Probes Docker, recording latency and availability.
    pub(crate) async fn probe_docker(&self) -> Result<(), String> {
        let runner = match self.runner() {
            Ok(r) => r,
            Err(why) => {
                *lock(&self.docker_down) = Some(why.clone());
                return Err(why);
            }
        };
        let t = Instant::now();
        let r = runner.ensure_running().await;
        self.metrics
            .docker_latency
            .observe(t.elapsed().as_secs_f64());
        let r = r.map(drop).map_err(|e| e.to_string());
        *lock(&self.docker_down) = r.clone().err();
        r
    }

    /// Kills a run: a queued one never starts; a live one is stopped, killed and removed.
    /// Returns `false` when the run is not known to be waiting or live.
    pub(crate) async fn kill(self: &Arc<Self>, run_id: &str, folder: &str) -> bool {
        let waiting = {
            let mut s = self.sched();
            if s.queue.remove(folder, run_id) {
                s.pending.remove(run_id);
                true
            } else if let Some(l) = s.live.get(run_id) {
                l.control.kill.cancel();
                return true;
            } else {
                false
            }
        };
        self.gauges();
        let now = unix_millis(SystemTime::now());
        let f = Finish {
            state: RunState::Killed,
            outcome: Outcome::Killed,
            exit_code: None,
            error: Some("killed before it started".into()),
            truncated: false,
            container_id: None,
            started_at: None,
            ended_at: now,
        };
        match self.store.finish(run_id, &[RunState::Queued], f).await {
            Ok(true) => {
                self.metrics.finished(Outcome::Killed);
                self.emit(Event::State {
                    run_id: run_id.to_owned(),
                    state: RunState::Killed,
                });
                true
            }
            Ok(false) => waiting,
            Err(e) => {
                tracing::error!(run = run_id, error = %e, "recording a kill failed");
                waiting
            }
        }
    }

    fn release(&self, run_id: &str) {
        {
            let mut s = self.sched();
            if let Some(l) = s.live.remove(run_id) {
                s.queue.release(&l.folder, l.kind);
            }
        }
        self.gauges();
        self.wake.notify_one();
    }

    /// A run that could not start (no token, no Docker) goes back to the head of its folder's
    /// queue, to be tried again: `starting → queued`.
    async fn back_to_queue(&self, run_id: &str, folder: &str, secrets: Secrets) {
        let _ = self
            .store
            .transition(run_id, &[RunState::Starting], RunState::Queued)
            .await;
        self.emit(Event::State {
            run_id: run_id.to_owned(),
            state: RunState::Queued,
        });
        self.requeue(
            run_id,
            folder,
            Pending {
                secrets,
                hold_ttl: Duration::ZERO,
                request_id: hako_shared::http::current_request_id(),
            },
        );
    }

    fn requeue(&self, run_id: &str, folder: &str, p: Pending) {
        let mut s = self.sched();
        if let Some(l) = s.live.remove(run_id) {
            s.queue.release(&l.folder, l.kind);
        }
        s.pending.insert(run_id.to_owned(), p);
        s.queue.push_front(
            folder,
            Entry {
                run_id: run_id.to_owned(),
                kind: Kind::Run,
                since: Instant::now(),
            },
        );
    }

    fn close_when(&self) -> CloseWhen {
        match self.cfg.runner.idle_timeout {
            Some(d) => CloseWhen::Idle(d),
            None => CloseWhen::Manual,
        }
    }
}

/// The scheduler: starts whatever the queue allows, whenever something changes.
pub(crate) async fn scheduler(sh: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = sh.wake.notified() => {}
            _ = tick.tick() => {}
            () = sh.stopping.cancelled() => return,
        }
        sh.gauges();
        if lock(&sh.docker_down).is_some() || !sh.adopted.load(std::sync::atomic::Ordering::SeqCst)
        {
            if sh.probe_docker().await.is_err() {
                continue;
            }
            if !sh.adopted.load(std::sync::atomic::Ordering::SeqCst) {
                crate::adopt::adopt_all(&sh).await;
            }
        }
        if let Some((until, _)) = lock(&sh.broker_pause).clone()
            && Instant::now() < until
        {
            continue;
        }
        loop {
            if sh.stopping.is_cancelled() {
                return;
            }
            let next = {
                let mut s = sh.sched();
                let Some((folder, e)) = s.queue.next_ready() else {
                    break;
                };
                let p = s.pending.remove(&e.run_id);
                let control = RunControl {
                    kill: CancellationToken::new(),
                    detach: sh.stopping.child_token(),
                };
                let folder_g = match hako_shared::GroupFolder::new(&folder) {
                    Ok(g) => g,
                    Err(_) => {
                        s.queue.release(&folder, e.kind);
                        continue;
                    }
                };
                let run = LiveRun::new(e.run_id.clone(), folder_g);
                s.live.insert(
                    e.run_id.clone(),
                    Live {
                        folder: folder.clone(),
                        kind: e.kind,
                        control: control.clone(),
                        run: run.clone(),
                    },
                );
                (folder, e, p, control, run)
            };
            sh.gauges();
            let (folder, e, p, control, run) = next;
            let sh2 = sh.clone();
            match e.kind {
                Kind::Run => {
                    // One span per run; the creating request's id goes along (and on to
                    // authd with the spawn token's mint).
                    let rid: Arc<str> = p
                        .as_ref()
                        .and_then(|p| p.request_id.clone())
                        .unwrap_or_else(|| Arc::from("-"));
                    let span = tracing::info_span!("run", run = %e.run_id, folder = %folder, request = %rid);
                    tokio::spawn(
                        hako_shared::http::with_request_id(
                            rid,
                            run_one(sh2, e.run_id, folder, p, control, run),
                        )
                        .instrument(span),
                    );
                }
                Kind::Hold => {
                    let ttl = p.map_or(sh.cfg.runner.run_timeout, |p| p.hold_ttl);
                    tokio::spawn(async move {
                        hold(sh2, e.run_id, control, ttl).await;
                    });
                }
            }
        }
    }
}

/// A hold keeps its folder's slot until released, its TTL passes, or shutdown.
pub(crate) async fn hold(sh: Arc<Shared>, run_id: String, control: RunControl, ttl: Duration) {
    match sh
        .store
        .mark_running(&run_id, "", unix_millis(SystemTime::now()))
        .await
    {
        Ok(true) => sh.emit(Event::State {
            run_id: run_id.clone(),
            state: RunState::Running,
        }),
        _ => {
            sh.release(&run_id);
            return;
        }
    }
    let (state, outcome) = tokio::select! {
        () = control.kill.cancelled() => (RunState::Exited, Outcome::Ok),
        () = tokio::time::sleep(ttl) => (RunState::TimedOut, Outcome::TimedOut),
        () = control.detach.cancelled() => {
            sh.release(&run_id);
            return;
        }
    };
    finalize_simple(&sh, &run_id, state, outcome, None).await;
    sh.release(&run_id);
}

async fn finalize_simple(
    sh: &Shared,
    run_id: &str,
    state: RunState,
    outcome: Outcome,
    error: Option<String>,
) {
    let f = Finish {
        state,
        outcome,
        exit_code: None,
        error,
        truncated: false,
        container_id: None,
        started_at: None,
        ended_at: unix_millis(SystemTime::now()),
    };
    let from = [RunState::Queued, RunState::Starting, RunState::Running];
    match sh.store.finish(run_id, &from, f).await {
        Ok(true) => {
            sh.metrics.finished(outcome);
            sh.emit(Event::State {
                run_id: run_id.to_owned(),
                state,
            });
        }
        Ok(false) => {}
        Err(e) => tracing::error!(run = run_id, error = %e, "recording the end of a run failed"),
    }
    revoke_tokens(sh, run_id).await;
}

pub(crate) async fn revoke_tokens(sh: &Shared, run_id: &str) {
    let jtis = match sh.store.live_tokens(run_id).await {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(run = run_id, error = %e, "listing spawn tokens failed");
            return;
        }
    };
    for jti in jtis {
        match sh.broker.revoke(&jti).await {
            Ok(()) => {
                let _ = sh.store.token_revoked(&jti, now_secs()).await;
            }
            // Retried by `retry_revocations` (GC, start) until it expires.
            Err(e) => {
                tracing::warn!(run = run_id, jti, error = %e, "revoking a spawn token failed; retried later")
            }
        }
    }
}

/// Moves a run's events into the store and out to subscribers.
pub(crate) fn forward(
    sh: Arc<Shared>,
    run_id: String,
) -> (mpsc::Sender<RunEvent>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<RunEvent>(64);
    let h = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            match ev {
                RunEvent::Started { container_id } => {
                    let now = unix_millis(SystemTime::now());
                    match sh.store.mark_running(&run_id, &container_id, now).await {
                        Ok(true) => sh.emit(Event::State {
                            run_id: run_id.clone(),
                            state: RunState::Running,
                        }),
                        Ok(false) => {}
                        Err(e) => {
                            tracing::error!(run = run_id, error = %e, "recording a start failed")
                        }
                    }
                }
                RunEvent::Block { index, block } => {
                    if let Err(e) = sh.store.add_output(&run_id, index, &block).await {
                        tracing::error!(run = run_id, error = %e, "storing output failed");
                    }
                    let small = [&block.result, &block.error, &block.new_session_id]
                        .iter()
                        .map(|f| f.as_ref().map_or(0, String::len))
                        .sum::<usize>()
                        <= INLINE_BLOCK;
                    sh.emit(Event::Output {
                        run_id: run_id.clone(),
                        index,
                        block: small.then_some(block),
                    });
                }
            }
        }
    });
    (tx, h)
}

/// One run, from the queue to its end.
async fn run_one(
    sh: Arc<Shared>,
    run_id: String,
    folder: String,
    p: Option<Pending>,
    control: RunControl,
    live: Arc<LiveRun>,
) {
    // The request waited on disk; only its secrets waited in memory.
    let stored = match sh.store.get(&run_id).await {
        Ok(row) => row
            .and_then(|r| r.request)
            .and_then(|r| serde_json::from_str::<RunRequest>(&r).ok()),
        Err(e) => {
            tracing::error!(run = run_id, error = %e, "reading a queued request failed");
            None
        }
    };
    let Some(mut req) = stored else {
        // Nothing to run (a lost request): fail it so the caller retries.
        finalize_simple(
            &sh,
            &run_id,
            RunState::Error,
            Outcome::Fatal,
            Some("the run's request was lost".into()),
        )
        .await;
        sh.release(&run_id);
        return;
    };
    req.secrets = p.map(|p| p.secrets).unwrap_or_default();
    match sh
        .store
        .transition(&run_id, &[RunState::Queued], RunState::Starting)
        .await
    {
        Ok(true) => sh.emit(Event::State {
            run_id: run_id.clone(),
            state: RunState::Starting,
        }),
        Ok(false) => {
            // Killed while waiting: never started.
            sh.release(&run_id);
            return;
        }
        Err(e) => {
            tracing::error!(run = run_id, error = %e, "recording a start failed");
            sh.release(&run_id);
            return;
        }
    }
    let ceiling = sh.cfg.runner.ceiling(req.group.timeout.map(|t| t.0));
    let token = match sh
        .broker
        .mint(
            &folder,
            req.turn_id.as_str(),
            &run_id,
            &req.group.egress_allowlist,
            ceiling + sh.cfg.token_margin,
        )
        .await
    {
        Ok(t) => t,
        Err(BrokerError::Unavailable(why)) => {
            tracing::warn!(run = run_id, error = %why, "no spawn token; the run stays queued");
            *lock(&sh.broker_pause) = Some((Instant::now() + Duration::from_secs(1), why));
            sh.back_to_queue(&run_id, &folder, req.secrets).await;
            return;
        }
        Err(e @ BrokerError::Refused(_)) => {
            finalize_simple(
                &sh,
                &run_id,
                RunState::Error,
                Outcome::Error,
                Some(e.to_string()),
            )
            .await;
            sh.release(&run_id);
            return;
        }
    };
    *lock(&sh.broker_pause) = None;
    // The jti is on disk before any container can hold the token, so every token a container
    // ever held can be revoked, by this process or after a restart (`retry_revocations`).
    if let Err(e) = sh
        .store
        .add_token(&token.jti, &run_id, &folder, token.expires_at)
        .await
    {
        tracing::error!(run = run_id, error = %e, "recording the spawn token failed");
        if let Err(e) = sh.broker.revoke(&token.jti).await {
            tracing::warn!(run = run_id, error = %e, "revoking the unrecorded spawn token failed; it expires with the run ceiling");
        }
        finalize_simple(
            &sh,
            &run_id,
            RunState::Error,
            Outcome::Fatal,
            Some(format!("recording the spawn token failed: {e}")),
        )
        .await;
        sh.release(&run_id);
        return;
    }
    let input = ContainerInput {
        session_id: req.session_id.clone(),
        messages: req.messages.clone(),
        system_prompt: req.system_prompt.clone(),
        grants: req.grants.clone(),
        folder: folder.clone(),
        sender_jid: req.sender_jid.clone(),
        turn_id: req.turn_id.to_string(),
        run_id: run_id.clone(),
        token: Redacted(token.token.clone()),
        secrets: req.secrets.clone(),
    };
    let spec = RunSpec {
        run_id: run_id.clone(),
        turn_id: req.turn_id.to_string(),
        folder: req.folder.clone(),
        input,
        group: req.group.clone(),
        close: sh.close_when(),
    };
    let (tx, fwd) = forward(sh.clone(), run_id.clone());
    let end = match sh.runner() {
        Ok(r) => r.run(spec, tx, control.clone(), live).await,
        Err(why) => {
            drop(tx);
            RunEnd::Finished(Box::new(RunReport {
                run_id: run_id.clone(),
                sidecars: false,
                state: RunState::Error,
                outcome: Outcome::Fatal,
                terminal: false,
                blocks: Vec::new(),
                truncated: false,
                exit_code: None,
                error: Some(why),
                log: String::new(),
                log_file: None,
                container_id: None,
                started_at: None,
                ended_at: SystemTime::now(),
            }))
        }
    };
    let _ = fwd.await;
    match end {
        RunEnd::Detached => {
            let mut s = sh.sched();
            s.live.remove(&run_id);
        }
        RunEnd::Finished(report) => {
            let never_started = report.state == RunState::Error
                && !report.terminal
                && report.container_id.is_none()
                && report.started_at.is_none();
            if never_started && sh.probe_docker().await.is_err() {
                // Docker went away before the container existed: back to the queue.
                tracing::warn!(
                    run = run_id,
                    "docker unavailable; the run goes back to the queue"
                );
                revoke_tokens(&sh, &run_id).await;
                sh.back_to_queue(&run_id, &folder, req.secrets).await;
                return;
            }
            // The container exists but runed lost it (the wait broke and the container could
            // not be inspected, nor removed): if Docker is away, the container most likely
            // still runs. The run keeps its slot and state and is re-attached once Docker
            // answers, so it finishes normally, is not run twice, and its container is removed.
            let lost = report.state == RunState::Error && !report.terminal;
            if lost
                && let Some(cid) = report.container_id.clone()
                && sh.probe_docker().await.is_err()
            {
                tracing::warn!(
                    run = run_id,
                    container = cid,
                    "docker unavailable mid-run; re-attaching when it is back"
                );
                crate::adopt::readopt_after_outage(sh.clone(), run_id, cid, control).await;
                return;
            }
            finalize(&sh, &folder, req.turn_id.as_str(), &req.session_id, &report).await;
            remove_containers(&sh, &report).await;
            sh.release(&run_id);
        }
    }
}

/// Removes a finished run's containers, once its end is on disk (a leftover after a crash
/// is an orphan that the next cleanup removes).
pub(crate) async fn remove_containers(sh: &Shared, report: &RunReport) {
    if let Ok(runner) = sh.runner() {
        runner.remove_containers(report).await;
    }
}

/// Records a finished run in one transaction (its blocks, state and outcome, log and session),
/// then revokes its spawn tokens. Runs before its containers are removed.
pub(crate) async fn finalize(
    sh: &Shared,
    folder: &str,
    turn_id: &str,
    session_id: &str,
    r: &RunReport,
) {
    let run_id = r.run_id.as_str();
    let ended = unix_millis(r.ended_at);
    let started = r.started_at.map(unix_millis);
    if let Some(s) = r.started_at
        && let Ok(d) = r.ended_at.duration_since(s)
    {
        sh.metrics.duration.observe(d.as_secs_f64());
    }
    let f = Finish {
        state: r.state,
        outcome: r.outcome,
        exit_code: r.exit_code,
        error: r.error.clone(),
        truncated: r.truncated,
        container_id: r.container_id.clone(),
        started_at: started,
        ended_at: ended,
    };
    let session = SessionEntry {
        id: 0,
        folder: folder.to_owned(),
        session_id: session_id.to_owned(),
        new_session_id: r.blocks.iter().rev().find_map(|b| b.new_session_id.clone()),
        run_id: run_id.to_owned(),
        turn_id: turn_id.to_owned(),
        outcome: r.outcome.as_str().to_owned(),
        at: ended,
    };
    let from = [RunState::Starting, RunState::Running];
    match sh
        .store
        .finish_run(run_id, &from, f, r.blocks.clone(), r.log.clone(), session)
        .await
    {
        Ok(true) => {
            sh.metrics.finished(r.outcome);
            sh.emit(Event::State {
                run_id: run_id.to_owned(),
                state: r.state,
            });
        }
        Ok(false) => {}
        Err(e) => tracing::error!(run = run_id, error = %e, "recording the end of a run failed"),
    }
    revoke_tokens(sh, run_id).await;
}

/// Revokes spawn tokens whose revocation failed before (authd away, runed killed): every
/// unexpired, unrevoked token of a run that is over. Returns how many were revoked.
pub(crate) async fn retry_revocations(sh: &Shared) -> usize {
    let due = match sh.store.tokens_to_revoke(now_secs()).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "listing spawn tokens to revoke failed");
            return 0;
        }
    };
    let mut n = 0;
    for (jti, run_id) in due {
        match sh.broker.revoke(&jti).await {
            Ok(()) => {
                let _ = sh.store.token_revoked(&jti, now_secs()).await;
                n += 1;
            }
            Err(e) => {
                tracing::warn!(run = run_id, jti, error = %e, "revoking a spawn token failed; retried later");
                break;
            }
        }
    }
    n
}
