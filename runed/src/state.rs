//! The daemon's shared state: what its tasks share ([`Shared`]: the store, the runner, the
//! queue and the live runs, the event broadcast), and the small operations on it that every
//! part of the daemon uses (queue a run, reserve a place, release a slot, kill).
//!
//! It depends on nothing else of the daemon: `daemon` (the scheduler and a run's life),
//! `adopt` (re-adoption), `record` (a run's record and its end) and `api` all build on it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use hako_shared::auth::Verifier;
use hako_shared::contract::Secrets;
use hako_shared::ids::RunId;
use hako_shared::runs::{Outcome, RunState, SpawnKind};
use hako_shared::time::unix_millis;
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::metrics::DaemonMetrics;
use crate::queue::{Entry, FairQueue};
use crate::store::{EndRow, Store};
use crate::tokens::Broker;
use hako_runner::{CloseWhen, LiveRun, RunControl, RunSpec, Runner};

/// What SSE subscribers and long-polls hear: the wire's own type.
pub type Event = hako_shared::runs::RunStreamEvent;

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

/// The TTL of a hold, stored in its request column.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct HoldInfo {
    pub ttl_ms: u64,
}

/// The most secret bytes (names and values) one run request may carry: they wait in memory.
pub const MAX_SECRETS_BYTES: usize = 64 << 10;

/// A run or hold that holds a slot.
pub(crate) struct Live {
    pub folder: String,
    pub kind: SpawnKind,
    pub control: RunControl,
    pub run: Arc<LiveRun>,
}

pub(crate) struct Sched {
    pub queue: FairQueue,
    pub pending: HashMap<RunId, Pending>,
    pub live: HashMap<RunId, Live>,
    /// Places promised to requests being written to the store, overall and per folder.
    pub reserved: usize,
    pub reserved_per: HashMap<String, usize>,
    /// Folders whose next box waits for runed to be idle (`daemon::warm_next`), each with the
    /// spec of its last run, the newest last; at most `RUNED_WARM_MAX`.
    pub deferred: Vec<(String, RunSpec)>,
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

/// A started run's (or hold's) folder slot: given back when this is dropped, on every way
/// out of the run, unless the run hands it on ([`Slot::keep`]: back to the queue, re-attached
/// after a Docker outage, detached at shutdown), so no path can forget it.
pub(crate) struct Slot<'a> {
    sh: &'a Shared,
    run_id: &'a RunId,
    kept: bool,
}

impl<'a> Slot<'a> {
    pub(crate) fn new(sh: &'a Shared, run_id: &'a RunId) -> Self {
        Slot {
            sh,
            run_id,
            kept: false,
        }
    }

    /// The run hands its slot on: dropping this gives nothing back.
    pub(crate) fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.sh.release(self.run_id);
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
    /// Every waiter is woken whenever a run leaves `live` (shutdown waits on it).
    pub(crate) left: Notify,
    pub(crate) events: broadcast::Sender<Arc<Event>>,
    /// Why Docker is not usable, if it is not.
    pub(crate) docker_down: Mutex<Option<String>>,
    /// Until when starts wait because authd did not answer.
    pub(crate) broker_pause: Mutex<Option<(Instant, String)>>,
    /// Cancelled at shutdown: runs detach, long-polls and streams end.
    pub(crate) stopping: CancellationToken,
    /// Open SSE streams and long-polls, bounded.
    pub(crate) watchers: Arc<hako_shared::watchers::Gate>,
    /// Set once re-adoption has run.
    pub(crate) adopted: std::sync::atomic::AtomicBool,
    /// The operator's brokered secrets (written here, read only by the egress proxy).
    pub(crate) secrets: hako_runner::secret_store::SecretStore,
}

/// Locks `m`, taking the data of a poisoned lock (a panicked holder) as it is.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Builds the container runner on the configured engine: Docker at its socket, unless one
/// was given. bollard refuses a socket path that does not exist yet, so this is retried
/// until it does.
pub(crate) fn connect(cfg: &Config) -> Result<Runner, String> {
    let runner = match &cfg.engine {
        Some(e) => Runner::new(e.0.clone(), cfg.runner.clone()),
        None => {
            let docker = hako_runner::docker::DockerEngine::connect(&cfg.docker_socket)
                .map_err(|e| format!("docker socket {}: {e}", cfg.docker_socket))?;
            Runner::on_docker(docker, cfg.runner.clone())
        }
    };
    runner.map_err(|e| format!("runner: {e}"))
}

/// A new run id: `run-` and 16 random hex digits.
pub fn new_run_id() -> RunId {
    RunId::random("run-", 8)
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
        drop(s);
        if let Some(r) = &*lock(&self.runner) {
            self.metrics.warm_boxes.set(r.warm_boxes() as i64);
        }
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
    pub(crate) fn enqueue(&self, run_id: &RunId, folder: &str, kind: SpawnKind, p: Pending) {
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
    pub(crate) async fn kill(self: &Arc<Self>, run_id: &RunId, folder: &str) -> bool {
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
        let f = EndRow {
            state: RunState::Killed,
            outcome: Outcome::Killed,
            exit_code: None,
            error: Some("killed before it started".into()),
            truncated: false,
            container_id: None,
            started_at: None,
            ended_at: now,
        };
        match self.store.end_run(run_id, &[RunState::Queued], f).await {
            Ok(true) => {
                self.metrics.ended(Outcome::Killed);
                self.emit(Event::State {
                    run_id: run_id.to_owned(),
                    state: RunState::Killed,
                });
                true
            }
            Ok(false) => waiting,
            Err(e) => {
                tracing::error!(run = %run_id, error = %e, "recording a kill failed");
                waiting
            }
        }
    }

    /// Releases a run's slot (its folder may start the next run) and wakes the scheduler.
    pub(crate) fn release(&self, run_id: &RunId) {
        {
            let mut s = self.sched();
            if let Some(l) = s.live.remove(run_id) {
                s.queue.release(&l.folder, l.kind);
            }
        }
        self.left.notify_waiters();
        self.gauges();
        self.wake.notify_one();
    }

    /// A detached run leaves `live` keeping its folder's slot (the next start re-adopts it).
    pub(crate) fn detached(&self, run_id: &RunId) {
        self.sched().live.remove(run_id);
        self.left.notify_waiters();
    }

    /// A run that could not start (no token, no Docker) goes back to the head of its folder's
    /// queue, to be tried again: `starting → queued`.
    pub(crate) async fn back_to_queue(&self, run_id: &RunId, folder: &str, secrets: Secrets) {
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

    fn requeue(&self, run_id: &RunId, folder: &str, p: Pending) {
        let mut s = self.sched();
        if let Some(l) = s.live.remove(run_id) {
            s.queue.release(&l.folder, l.kind);
            self.left.notify_waiters();
        }
        s.pending.insert(run_id.to_owned(), p);
        s.queue.push_front(
            folder,
            Entry {
                run_id: run_id.to_owned(),
                kind: SpawnKind::Run,
                since: Instant::now(),
            },
        );
    }

    /// When runs are told to close: after the idle timeout, or only on request.
    pub(crate) fn close_when(&self) -> CloseWhen {
        match self.cfg.runner.idle_timeout {
            Some(d) => CloseWhen::Idle(d),
            None => CloseWhen::Manual,
        }
    }
}
