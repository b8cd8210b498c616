//! The container runner: one agent turn in one locked-down container. This is the seam:
//! runed and the `hako` CLI both call [`Runner::run`], unchanged.
//!
//! A run's life, one room each:
//!
//! | step | module |
//! |---|---|
//! | check the group, create and seed the folder's directories, write the env file | `prepare` |
//! | start the sidecars; create, attach and start the agent; write its input line | `launch` |
//! | follow it to its end: output, the ceiling, kill, detach, idle close (a state machine) | `supervise` |
//! | keep what it said within the caps; render its log | `output` |
//! | decide the outcome, write the log, report; remove the containers afterwards | `conclude` (`outcome`) |
//! | steer it and ask it to close while it runs | `steer` |
//! | supervise a container again after a restart | `adopt` |
//! | keep a folder's next box started, blocked before its input | `warm` |
//!
//! This file holds the public types and the entry points; `engine` (the seam to the container
//! engine: `docker` is Docker, every call with a deadline; `sim` a simulated one for tests),
//! `mounts` (the mount table), `sentinel` (the output parser), `storage` and `safefs` (the
//! data root, never following a link) and `seed` serve the steps above.

#![warn(missing_docs)]

mod adopt;
mod conclude;
pub mod config;
pub mod docker;
pub mod engine;
mod launch;
pub mod media;
pub mod mounts;
pub mod mountsec;
pub mod outcome;
mod prepare;
pub mod programs;
pub mod proxy_container;
pub mod runlog;
pub mod safefs;
pub mod secret_store;
pub mod seed;
pub mod sentinel;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
mod steer;
pub use steer::{FollowUpFate, StagedFollowUp};
mod output;
#[cfg(test)]
mod run_tests;
pub mod storage;
mod supervise;
pub mod warm;
pub use warm::{NotWarmed, Start, WarmMiss};

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use tokio::sync::{RwLock, mpsc};
use tokio_util::sync::CancellationToken;

use hako_shared::GroupFolder;
use hako_shared::contract::{ContainerInput, OutputBlock};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::{GroupSpec, Outcome, RunState};

pub use config::RunnerConfig;
use engine::{Engine, EngineError, labels};
use launch::Launched;
use mounts::Layout;
use outcome::Ending;
use output::{RunOutput, secrets_of};
use safefs::Owner;
use storage::Storage;
use supervise::Supervisor;

/// Errors before a run could be attempted, and around steering.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Docker failed.
    #[error(transparent)]
    Docker(#[from] EngineError),
    /// A host file operation failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// Preparing the group's directories failed (what the agent left there included).
    #[error("preparing the group's directories: {0}")]
    Prepare(std::io::Error),
    /// The data root cannot be used.
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    /// An extra mount was refused.
    #[error(transparent)]
    Mount(#[from] mountsec::MountError),
    /// The env allowlist was refused.
    #[error(transparent)]
    Env(#[from] seed::EnvFileError),
    /// The request is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// The run is not live (not started yet, or over).
    #[error("run {0} is not live")]
    NotLive(String),
}

impl From<&RunError> for Ending {
    /// A run that failed before or around its container: terminal when a retry cannot help.
    fn from(e: &RunError) -> Self {
        Ending::Failed {
            error: e.to_string(),
            terminal: e.is_terminal(),
        }
    }
}

impl RunError {
    /// Whether retrying the same run cannot help: a missing image, a request Docker refuses
    /// as invalid (400), a refused mount or env request. Transient Docker failures (5xx, a
    /// conflict, the daemon away) are retryable.
    pub fn is_terminal(&self) -> bool {
        match self {
            RunError::Docker(EngineError::ImageMissing(_)) => true,
            RunError::Docker(e @ EngineError::Api { .. }) => e.is_status(400),
            RunError::Docker(_) => false,
            RunError::Io(_) | RunError::NotLive(_) => false,
            RunError::Mount(_)
            | RunError::Env(_)
            | RunError::Invalid(_)
            | RunError::Prepare(_)
            | RunError::Storage(_) => true,
        }
    }
}

/// When the agent is asked to close (`_close`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseWhen {
    /// After its output has been idle this long.
    Idle(Duration),
    /// Only when the caller calls [`Runner::close`] (interactive use).
    Manual,
}

/// One run to perform.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Unique id of the run.
    pub run_id: RunId,
    /// The turn it serves; none for a warm box, made before any turn.
    pub turn_id: Option<TurnId>,
    /// The group.
    pub folder: GroupFolder,
    /// The stdin payload (its folder, turn and run ids are filled in by the runner).
    pub input: ContainerInput,
    /// Container settings.
    pub group: GroupSpec,
    /// When to close the agent's follow-up channel.
    pub close: CloseWhen,
    /// Called when the run takes a warm box, before its input is written.
    pub bind: Option<BindHook>,
    /// The brokered secrets of an `allowlist` run, as its spawn token carries them: the box's
    /// environment gets each placeholder under the secret's name (never a value), and the CA
    /// bundle the proxy hands out (`specs/egress.md`, Secrets).
    pub brokered: Vec<hako_shared::secrets::SecretClaim>,
}

impl RunSpec {
    /// The turn as the container and its labels carry it: empty for a warm box.
    pub(crate) fn turn_text(&self) -> String {
        self.turn_id.as_deref().unwrap_or_default().to_owned()
    }
}

/// A warm box a run took: its labels name no run, so a caller that re-adopts runs after a
/// restart records this before the box gets its input (`specs/runner.md`, Warm boxes).
#[derive(Debug, Clone)]
pub struct Bound {
    /// The box's container.
    pub container_id: String,
    /// The run's ceiling, Unix ms (counted from the take, not from the box's start).
    pub deadline_ms: i64,
}

/// What [`RunSpec::bind`] calls; the run waits for it.
#[derive(Clone)]
pub struct BindHook(
    pub Arc<dyn Fn(Bound) -> futures_util::future::BoxFuture<'static, ()> + Send + Sync>,
);

impl std::fmt::Debug for BindHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BindHook")
    }
}

/// What the runner reports while a run goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// The container started (or a warm box was taken).
    Started {
        /// Its id.
        container_id: String,
        /// Cold, or from a warm box.
        start: Start,
    },
    /// An output block, in order (index from 0).
    Block {
        /// Position among the run's blocks.
        index: usize,
        /// The block (its result may be cut at the output cap).
        block: OutputBlock,
    },
}

/// The caller's controls over a run.
#[derive(Debug, Clone, Default)]
pub struct RunControl {
    /// Kill the run (stop, kill, remove); the outcome is `killed`.
    pub kill: CancellationToken,
    /// Stop supervising and leave the container running (daemon shutdown).
    pub detach: CancellationToken,
}

/// A run's shared state, for steering and closing while it runs.
#[derive(Debug)]
pub struct LiveRun {
    run_id: RunId,
    folder: GroupFolder,
    container: std::sync::Mutex<Option<String>>,
    /// `true` while the agent can take follow-ups; steers hold it shared while they wait.
    gate: RwLock<bool>,
    ended: CancellationToken,
    closed: std::sync::atomic::AtomicBool,
    /// The agent wrote something (stdout or stderr): it runs its own code, so it has had its
    /// chance to handle SIGUSR1. Before that a wake-up signal could kill it (SIGUSR1's
    /// default action), so follow-ups and the close rely on the agent's polling alone.
    spoken: std::sync::atomic::AtomicBool,
}

impl LiveRun {
    /// State for a run about to start.
    pub fn new(run_id: RunId, folder: GroupFolder) -> Arc<Self> {
        Arc::new(Self {
            run_id,
            folder,
            container: std::sync::Mutex::new(None),
            gate: RwLock::new(false),
            ended: CancellationToken::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
            spoken: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The run id.
    pub fn run_id(&self) -> &RunId {
        &self.run_id
    }

    /// The container id, once created.
    pub fn container_id(&self) -> Option<String> {
        self.container
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Whether the container has started and taken its input: follow-ups and the close can
    /// reach the agent from now on.
    pub fn is_started(&self) -> bool {
        self.gate.try_read().is_ok_and(|g| *g)
    }

    /// Whether the agent has written anything yet (then a wake-up signal is safe to send).
    pub fn has_spoken(&self) -> bool {
        self.spoken.load(std::sync::atomic::Ordering::Acquire)
    }

    fn set_spoken(&self) {
        self.spoken
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether the run has ended (its container gone or going).
    pub fn has_ended(&self) -> bool {
        self.ended.is_cancelled()
    }

    fn set_container(&self, id: &str) {
        *self.container.lock().unwrap_or_else(|p| p.into_inner()) = Some(id.to_owned());
    }
}

/// The result of a steer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SteerReport {
    /// Whether the agent took the follow-up (exactly once). When `false`, no file is left.
    pub delivered: bool,
    /// Why not, when not.
    pub reason: Option<String>,
}

/// Everything known about a finished run.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The run.
    pub run_id: RunId,
    /// Final state.
    pub state: RunState,
    /// Outcome for the turn.
    pub outcome: Outcome,
    /// Whether the failure is permanent.
    pub terminal: bool,
    /// Blocks, in order (results cut at the output cap).
    pub blocks: Vec<OutputBlock>,
    /// Whether stored output was cut.
    pub truncated: bool,
    /// The container's exit code.
    pub exit_code: Option<i64>,
    /// What went wrong.
    pub error: Option<String>,
    /// The bounded, redacted run log.
    pub log: String,
    /// Where the log file was written.
    pub log_file: Option<std::path::PathBuf>,
    /// The container, if one was created.
    pub container_id: Option<String>,
    /// Whether the run may have sidecars to remove.
    pub sidecars: bool,
    /// When the container started.
    pub started_at: Option<SystemTime>,
    /// When the run ended.
    pub ended_at: SystemTime,
}

/// How [`Runner::run`] returned.
#[derive(Debug)]
pub enum RunEnd {
    /// The run is over.
    Finished(Box<RunReport>),
    /// RunOutput stopped on request; the container keeps running and can be adopted.
    Detached,
}

impl RunEnd {
    /// The report, if finished.
    pub fn report(self) -> Option<RunReport> {
        match self {
            RunEnd::Finished(r) => Some(*r),
            RunEnd::Detached => None,
        }
    }
}

/// What the runner needs to re-adopt a container after a restart.
#[derive(Debug, Clone)]
pub struct Adoption {
    /// The container.
    pub container_id: String,
    /// The run.
    pub run_id: RunId,
    /// The group.
    pub folder: GroupFolder,
    /// The blocks already recorded: the log's replay of them is skipped, they count against
    /// the output cap, and new blocks are numbered after them.
    pub prior: Vec<OutputBlock>,
    /// When the agent is told to close.
    pub close: CloseWhen,
    /// The run's ceiling (Unix ms) when the caller recorded one: a run that took a warm box
    /// has none in its labels. `None`: the label's.
    pub deadline_ms: Option<i64>,
}

/// The container runner.
#[derive(Clone)]
pub struct Runner {
    /// The container engine (Docker; the simulated one in logic tests).
    engine: Arc<dyn Engine>,
    cfg: Arc<RunnerConfig>,
    storage: Arc<Storage>,
    /// The egress proxy, when `cfg.egress` is set.
    egress: Option<Arc<proxy_container::Egress>>,
    /// The OCI runtimes the Docker daemon lists, once asked.
    runtimes: Arc<std::sync::Mutex<Option<Vec<String>>>>,
    /// Warm boxes (`warm`).
    warm: Arc<warm::WarmPool>,
    /// Program copies served from the host (`programs`).
    programs: Arc<programs::Programs>,
}

impl Runner {
    /// A runner on Docker over `cfg`, creating the data root and its top-level directories.
    pub fn on_docker(docker: docker::DockerEngine, cfg: RunnerConfig) -> Result<Runner, RunError> {
        Self::new(Arc::new(docker), cfg)
    }

    /// A runner on `engine` (Docker, or the simulated one in logic tests). The egress proxy
    /// of `cfg.egress` and the runs' networks are on the same engine.
    pub fn new(engine: Arc<dyn Engine>, cfg: RunnerConfig) -> Result<Runner, RunError> {
        let egress = cfg.egress.clone().map(|e| {
            Arc::new(proxy_container::Egress::new(
                engine.clone(),
                e,
                cfg.install_id.clone(),
                cfg.docker_timeout,
                cfg.layout.clone(),
            ))
        });
        Self::build(engine, egress, cfg)
    }

    fn build(
        engine: Arc<dyn Engine>,
        egress: Option<Arc<proxy_container::Egress>>,
        mut cfg: RunnerConfig,
    ) -> Result<Runner, RunError> {
        make_absolute(&mut cfg)?;
        let storage = Arc::new(Storage::open(&cfg.layout.data_dir)?);
        // What an earlier process moved aside and did not finish deleting.
        storage.schedule_reap();
        Ok(Runner {
            engine,
            cfg: Arc::new(cfg),
            storage,
            egress,
            runtimes: Arc::default(),
            warm: Arc::default(),
            programs: Arc::default(),
        })
    }

    /// The OCI runtimes the Docker daemon lists (asked once, then remembered).
    pub async fn runtimes(&self) -> Result<Vec<String>, EngineError> {
        if let Some(r) = self
            .runtimes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        {
            return Ok(r);
        }
        let r = self.engine.runtimes(self.cfg.docker_timeout).await?;
        *self.runtimes.lock().unwrap_or_else(|p| p.into_inner()) = Some(r.clone());
        Ok(r)
    }

    /// Checks that the runtime the install names for untrusted groups is one the Docker
    /// daemon lists: never a silent fallback to the default. The error names the variable.
    pub async fn check_runtimes(&self) -> Result<(), RunError> {
        let Some(r) = &self.cfg.untrusted_runtime else {
            return Ok(());
        };
        let known = self.runtimes().await?;
        if known.contains(r) {
            return Ok(());
        }
        Err(RunError::Invalid(format!(
            "RUNED_UNTRUSTED_RUNTIME={r}: the Docker daemon has no runtime {r:?} (it has: {}); \
             register it in /etc/docker/daemon.json \"runtimes\" and send dockerd SIGHUP, or \
             unset the variable",
            known.join(", ")
        )))
    }

    /// The runtime a group's containers run under: its own, else the install's for untrusted
    /// groups, else the Docker daemon's default (`None`). Where the daemon lists variants of
    /// it, a container without a network runs under `<runtime>-nonet` and one with a network
    /// under `<runtime>-net` (gVisor needs its own `--network=none` for the first, and on
    /// hosts where its netstack cannot take a container's network namespace,
    /// `--network=host` for the second: `specs/runner.md`). A runtime the daemon does not
    /// list is refused, by name.
    pub async fn runtime_for(
        &self,
        g: &GroupSpec,
        network: &str,
    ) -> Result<Option<String>, RunError> {
        let chosen = g.runtime.clone().or_else(|| match g.trust {
            hako_shared::runs::Trust::Untrusted => self.cfg.untrusted_runtime.clone(),
            hako_shared::runs::Trust::Main => None,
        });
        let Some(r) = chosen else {
            return Ok(None);
        };
        let known = self.runtimes().await?;
        if !known.contains(&r) {
            return Err(RunError::Invalid(format!(
                "the group's runtime {r:?} is not one the Docker daemon lists (it has: {})",
                known.join(", ")
            )));
        }
        let variant = if network == "none" {
            format!("{r}-nonet")
        } else {
            format!("{r}-net")
        };
        Ok(Some(if known.contains(&variant) { variant } else { r }))
    }

    /// The egress proxy of `allowlist` runs, if configured.
    pub fn egress(&self) -> Option<&proxy_container::Egress> {
        self.egress.as_deref()
    }

    /// The configuration.
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    /// The container engine.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.engine
    }

    fn owner(&self) -> Option<Owner> {
        self.cfg.chown.then_some(self.cfg.agent_user)
    }

    /// EnsureRunning: the Docker daemon answers. Returns its API version.
    pub async fn ensure_running(&self) -> Result<String, EngineError> {
        self.engine
            .version(Duration::from_secs(5))
            .await
            .map_err(|e| match e {
                EngineError::Unavailable { message, .. } => EngineError::Unavailable {
                    socket: self.cfg.docker_socket.clone(),
                    message,
                },
                EngineError::Timeout(..) => EngineError::Unavailable {
                    socket: self.cfg.docker_socket.clone(),
                    message: "no answer within 5s".into(),
                },
                other => other,
            })
    }

    /// CleanupOrphans: removes this install's containers whose run is not in `live` (run ids,
    /// or container ids: a run in a warm box is known by its box) and that are not this
    /// runner's warm boxes. Other installs' containers are never touched. Returns how many
    /// were removed.
    pub async fn cleanup_orphans(&self, live: &HashSet<String>) -> Result<usize, EngineError> {
        let t = self.cfg.docker_timeout;
        let orphans: Vec<_> = self
            .engine
            .list(labels::INSTALL, Some(&self.cfg.install_id), t)
            .await?
            .into_iter()
            // The egress proxy belongs to the install, not to a run.
            .filter(|c| {
                c.labels.get(labels::ROLE).map(String::as_str) != Some(proxy_container::ROLE_PROXY)
            })
            .filter(|c| !c.run_id().is_some_and(|r| live.contains(r)))
            .filter(|c| !live.contains(&c.id) && !self.warm.holds(&c.id))
            .collect();
        // In parallel (a few at a time): a restart after a crash may find many.
        let results: Vec<Result<(), EngineError>> = futures_util::stream::iter(orphans)
            .map(|c| async move {
                tracing::info!(container = %c.id, run = ?c.run_id(), "removing orphaned container");
                self.engine.remove(&c.id, Some(Duration::ZERO), t).await
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let removed = results.iter().filter(|r| r.is_ok()).count();
        self.remove_stale_copy_boxes().await;
        if let Some(e) = &self.egress
            && let Err(err) = e.cleanup_networks(live).await
        {
            tracing::warn!(error = %err, "removing orphaned egress networks failed");
        }
        // Every orphan was tried; the first failure is reported.
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// This install's agent containers, for re-adoption.
    pub async fn list_agents(&self) -> Result<Vec<engine::Listed>, EngineError> {
        let all = self
            .engine
            .list(
                labels::INSTALL,
                Some(&self.cfg.install_id),
                self.cfg.docker_timeout,
            )
            .await?;
        Ok(all
            .into_iter()
            .filter(|c| c.labels.get(labels::ROLE).map(String::as_str) == Some("agent"))
            .collect())
    }

    /// Runs one turn. Blocks stream to `events` as they arrive; `control` kills or detaches.
    pub async fn run(
        &self,
        spec: RunSpec,
        events: mpsc::Sender<RunEvent>,
        control: RunControl,
        live: Arc<LiveRun>,
    ) -> RunEnd {
        let mut st = RunOutput::new(
            &self.cfg,
            &spec.run_id,
            &spec.folder,
            secrets_of(&spec.input),
        );
        // Without sidecars there is nothing to look for at the end: one Docker call saved.
        st.sidecars = !spec.group.sidecars.is_empty();
        let ceiling = self.cfg.ceiling(spec.group.timeout.map(|t| t.0));
        if control.kill.is_cancelled() {
            return self.conclude(st, Ending::Killed(None), &live).await;
        }
        let Launched {
            id,
            output,
            deadline,
            start,
        } = match self.start_run(&spec, ceiling, &live).await {
            Ok(l) => l,
            Err(e) => return self.conclude(st, Ending::from(&e), &live).await,
        };
        st.container_id = Some(id.clone());
        st.started_at = Some(SystemTime::now());
        let _ = events
            .send(RunEvent::Started {
                container_id: id.clone(),
                start,
            })
            .await;
        let supervisor = Supervisor::new(
            self.hands(),
            &mut st,
            &id,
            output,
            deadline,
            spec.close,
            &events,
            &control,
            &live,
        );
        match supervisor.run().await {
            None => RunEnd::Detached,
            Some(ending) => self.conclude(st, ending, &live).await,
        }
    }

    /// Empties the trash now (agent-made trees moved aside by earlier runs).
    pub async fn reap_trash(&self) -> Result<safefs::Reaped, RunError> {
        let storage = self.storage.clone();
        tokio::task::spawn_blocking(move || storage.reap_now())
            .await
            .map_err(|e| RunError::Io(std::io::Error::other(e)))?
            .map_err(RunError::Io)
    }

    /// The layout (for callers that need paths, e.g. tests and the CLI).
    pub fn layout(&self) -> &Layout {
        &self.cfg.layout
    }
}

/// Bind sources must be absolute (Docker refuses relative ones, e.g. the default
/// `DATA_DIR=./data`): every configured directory is made absolute against the cwd.
fn make_absolute(cfg: &mut RunnerConfig) -> std::io::Result<()> {
    let abs = |p: &mut std::path::PathBuf| -> std::io::Result<()> {
        if p.is_relative() {
            *p = std::path::absolute(&*p)?;
        }
        Ok(())
    };
    abs(&mut cfg.layout.data_dir)?;
    abs(&mut cfg.layout.app_dir)?;
    for p in [&mut cfg.skills_dir, &mut cfg.project_dir, &mut cfg.web_dir]
        .into_iter()
        .flatten()
    {
        abs(p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configured_dirs_become_absolute() {
        let mut cfg = RunnerConfig::new("./data");
        cfg.skills_dir = Some("skills".into());
        cfg.web_dir = Some("/srv/web".into());
        make_absolute(&mut cfg).unwrap();
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(cfg.layout.data_dir, cwd.join("data"));
        assert_eq!(cfg.skills_dir, Some(cwd.join("skills")));
        assert_eq!(cfg.web_dir, Some("/srv/web".into()));
    }

    #[test]
    fn only_permanent_failures_are_terminal() {
        let d = |e: EngineError| RunError::Docker(e).is_terminal();
        assert!(d(EngineError::ImageMissing("x".into())));
        let answer = |status, message: &str| EngineError::Api {
            status: Some(status),
            message: message.into(),
        };
        assert!(d(answer(400, "invalid mount config")));
        assert!(!d(answer(500, "failed to create shim")));
        assert!(!d(answer(409, "Conflict. The container name is in use")));
        assert!(
            !d(EngineError::api(
                "400: a message that only looks like a status"
            )),
            "judged by the daemon's status, not by the text"
        );
        assert!(!d(EngineError::NotFound("c".into())));
        assert!(!d(EngineError::Timeout("create", Duration::from_secs(1))));
        assert!(RunError::Invalid("x".into()).is_terminal());
    }

    use crate::sim::{Op, SimEngine};

    fn plant(sim: &SimEngine, run: &str, role: &str) -> String {
        sim.plant(
            &[
                (labels::INSTALL, "i-1"),
                (labels::RUN, run),
                (labels::ROLE, role),
            ],
            true,
        )
    }

    /// A runner on a scratch data root and the simulated engine.
    fn runner(sim: &SimEngine) -> (Runner, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let mut cfg = RunnerConfig::new(tmp.path());
        cfg.install_id = "i-1".into();
        let r = Runner::new(Arc::new(sim.clone()), cfg).unwrap();
        (r, tmp)
    }

    #[tokio::test]
    async fn orphan_cleanup_removes_only_boxes_of_runs_not_live() {
        let sim = SimEngine::new();
        let live_box = plant(&sim, "run-1", "agent");
        let dead = plant(&sim, "run-2", "agent");
        let side = plant(&sim, "run-2", "sidecar");
        let proxy = plant(&sim, "", crate::proxy_container::ROLE_PROXY);
        // A run in a warm box is known by its box's id.
        let warm_run = plant(&sim, "warm-1", "agent");
        let other_install = sim.plant(&[(labels::INSTALL, "i-2"), (labels::RUN, "run-9")], true);
        let (r, _tmp) = runner(&sim);
        let live = HashSet::from(["run-1".to_owned(), warm_run.clone()]);
        assert_eq!(r.cleanup_orphans(&live).await.unwrap(), 2);
        let now = Some(Duration::ZERO);
        let mut want = vec![(dead, now), (side, now)];
        want.sort();
        assert_eq!(sim.removals(), want);
        let mut left = vec![live_box, proxy, warm_run, other_install];
        left.sort();
        assert_eq!(
            sim.boxes(),
            left,
            "the live run's box, the proxy, the run in a warm box and another install's stay"
        );
    }

    #[tokio::test]
    async fn a_killed_processs_copy_boxes_are_swept_but_not_a_copy_being_taken() {
        use crate::programs::LABEL_COPY_FOR;
        let sim = SimEngine::new();
        let stale = sim.plant(&[(LABEL_COPY_FOR, "i-1")], false);
        let taking = sim.plant(&[(LABEL_COPY_FOR, "i-1")], false);
        let other_install = sim.plant(&[(LABEL_COPY_FOR, "i-2")], false);
        let (r, _tmp) = runner(&sim);
        // The sim names a planted box by its id.
        assert!(r.programs.enter(&taking));
        r.cleanup_orphans(&HashSet::new()).await.unwrap();
        assert_eq!(sim.removals(), vec![(stale, Some(Duration::ZERO))]);
        let mut left = vec![taking, other_install];
        left.sort();
        assert_eq!(sim.boxes(), left);
    }

    #[tokio::test]
    async fn a_finished_runs_boxes_go_together_and_failures_are_named() {
        let sim = SimEngine::new();
        let agent = plant(&sim, "run-2", "agent");
        let side = plant(&sim, "run-2", "sidecar");
        let other_side = plant(&sim, "run-3", "sidecar");
        let stuck = plant(&sim, "run-2", "sidecar");
        let (r, _tmp) = runner(&sim);
        let report = RunReport {
            run_id: RunId::new("run-2").unwrap(),
            state: RunState::Exited,
            outcome: Outcome::Ok,
            terminal: false,
            blocks: Vec::new(),
            truncated: false,
            exit_code: Some(0),
            error: None,
            log: String::new(),
            log_file: None,
            container_id: Some(agent.clone()),
            sidecars: true,
            started_at: None,
            ended_at: SystemTime::now(),
        };
        sim.fail(
            Op::Remove,
            Some(&stuck),
            EngineError::api("removal already in progress"),
        );
        let errors = r.remove_containers(&report).await;
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with(&format!("sidecar {stuck}")),
            "{errors:?}"
        );
        let grace = Some(Duration::from_secs(2));
        let mut want = vec![(agent, None), (side, grace), (stuck.clone(), grace)];
        want.sort();
        assert_eq!(
            sim.removals(),
            want,
            "the agent by force, the run's sidecars stopped first, no other run's"
        );
        let mut left = vec![other_side, stuck];
        left.sort();
        assert_eq!(sim.boxes(), left, "the stuck one stays, to be tried again");
    }
}
