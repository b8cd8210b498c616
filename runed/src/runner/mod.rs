//! The container runner: one agent turn in one locked-down container. This is the seam:
//! runed and the `hako` CLI both call [`Runner::run`], unchanged.
//!
//! The lifecycle follows the seed step by step: EnsureRunning → CleanupOrphans → resolve the
//! group path → BuildMounts → validate extra mounts → seedSettings → seedSkills → env file →
//! StartSidecars → create/attach/start the agent, write the input line → stream output
//! through the sentinel parser → timeout (stop with grace, kill) → StopSidecars → remove
//! and confirm the container is gone → outcome, log.

pub mod config;
pub mod docker;
pub mod mounts;
pub mod mountsec;
pub mod outcome;
mod prepare;
pub mod runlog;
pub mod safefs;
pub mod seed;
pub mod sentinel;
pub mod storage;
mod supervision;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, LogsOptionsBuilder, WaitContainerOptionsBuilder,
};
use futures_util::stream::BoxStream;
use futures_util::{StreamExt, TryStreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::{RwLock, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use hako_shared::GroupFolder;
use hako_shared::contract::{
    CLOSE_FILE, ContainerInput, FollowUp, MARKER_END_ENV, MARKER_START_ENV, Markers, OutputBlock,
    QUERY_TIMEOUT_ENV,
};
use hako_shared::runs::{GroupSpec, Network, Outcome, RunState, SidecarSpec};

pub use config::RunnerConfig;
use docker::{ContainerSpec, DockerError, Limits, labels};
use hako_shared::layout::{self, FolderDir};
use mounts::Layout;
use outcome::{Ending, decide};
use prepare::Prepared;
use safefs::{Owner, SafeDir};
use storage::Storage;
use supervision::{Supervision, secrets_of};

/// Errors before a run could be attempted, and around steering.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Docker failed.
    #[error(transparent)]
    Docker(#[from] DockerError),
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
            RunError::Docker(DockerError::ImageMissing(_)) => true,
            RunError::Docker(DockerError::Api(m)) => m.starts_with("400"),
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

/// When the agent is told to finish (`_close`).
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
    pub run_id: String,
    /// The turn it serves.
    pub turn_id: String,
    /// The group.
    pub folder: GroupFolder,
    /// The stdin payload (its folder, turn and run ids are filled in by the runner).
    pub input: ContainerInput,
    /// Container settings.
    pub group: GroupSpec,
    /// When to close the agent's follow-up channel.
    pub close: CloseWhen,
}

/// What the runner reports while a run goes on.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEvent {
    /// The container started.
    Started {
        /// Its id.
        container_id: String,
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
    run_id: String,
    folder: GroupFolder,
    container: std::sync::Mutex<Option<String>>,
    /// `true` while the agent can take follow-ups; steers hold it shared while they wait.
    gate: RwLock<bool>,
    ended: CancellationToken,
    closed: std::sync::atomic::AtomicBool,
}

impl LiveRun {
    /// State for a run about to start.
    pub fn new(run_id: impl Into<String>, folder: GroupFolder) -> Arc<Self> {
        Arc::new(Self {
            run_id: run_id.into(),
            folder,
            container: std::sync::Mutex::new(None),
            gate: RwLock::new(false),
            ended: CancellationToken::new(),
            closed: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// The run id.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The container id, once created.
    pub fn container_id(&self) -> Option<String> {
        self.container
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
    pub run_id: String,
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
    /// Supervision stopped on request; the container keeps running and can be adopted.
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
    pub run_id: String,
    /// The group.
    pub folder: GroupFolder,
    /// The blocks already recorded: the log's replay of them is skipped, they count against
    /// the output cap, and new blocks are numbered after them.
    pub prior: Vec<OutputBlock>,
    /// When the agent is told to close.
    pub close: CloseWhen,
}

/// The container runner.
#[derive(Clone)]
pub struct Runner {
    docker: Docker,
    cfg: Arc<RunnerConfig>,
    storage: Arc<Storage>,
}

static STEER_SEQ: AtomicU64 = AtomicU64::new(0);

/// Label: the run's deadline, in Unix milliseconds (so re-adoption needs no database).
const LABEL_DEADLINE: &str = "io.hako.deadline";

impl Runner {
    /// A runner over `cfg`, creating the data root and its top-level directories.
    pub fn new(docker: Docker, mut cfg: RunnerConfig) -> Result<Runner, RunError> {
        make_absolute(&mut cfg)?;
        let storage = Arc::new(Storage::open(&cfg.layout.data_dir)?);
        // What an earlier process moved aside and did not finish deleting.
        storage.schedule_reap();
        Ok(Runner {
            docker,
            cfg: Arc::new(cfg),
            storage,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RunnerConfig {
        &self.cfg
    }

    /// The Docker client.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    fn owner(&self) -> Option<Owner> {
        self.cfg.chown.then_some(self.cfg.agent_user)
    }

    /// EnsureRunning: the Docker daemon answers. Returns its API version.
    pub async fn ensure_running(&self) -> Result<String, DockerError> {
        let v = docker::bounded(
            "version",
            Duration::from_secs(5),
            "daemon",
            self.docker.version(),
        )
        .await
        .map_err(|e| match e {
            DockerError::Unavailable { message, .. } => DockerError::Unavailable {
                socket: self.cfg.docker_socket.clone(),
                message,
            },
            DockerError::Timeout(..) => DockerError::Unavailable {
                socket: self.cfg.docker_socket.clone(),
                message: "no answer within 5s".into(),
            },
            other => other,
        })?;
        Ok(v.api_version.unwrap_or_default())
    }

    /// CleanupOrphans: removes this install's containers whose run is not in `live`.
    /// Other installs' containers are never touched. Returns how many were removed.
    pub async fn cleanup_orphans(&self, live: &HashSet<String>) -> Result<usize, DockerError> {
        let t = self.cfg.docker_timeout;
        let orphans: Vec<_> = docker::list_install(&self.docker, &self.cfg.install_id, t)
            .await?
            .into_iter()
            .filter(|c| !c.run_id().is_some_and(|r| live.contains(r)))
            .collect();
        // In parallel (a few at a time): a restart after a crash may find many.
        let results: Vec<Result<(), DockerError>> = futures_util::stream::iter(orphans)
            .map(|c| async move {
                tracing::info!(container = %c.id, run = ?c.run_id(), "removing orphaned container");
                docker::stop_and_remove(&self.docker, &c.id, Duration::ZERO, t).await
            })
            .buffer_unordered(8)
            .collect()
            .await;
        let removed = results.iter().filter(|r| r.is_ok()).count();
        // Every orphan was tried; the first failure is reported.
        match results.into_iter().find_map(Result::err) {
            Some(e) => Err(e),
            None => Ok(removed),
        }
    }

    /// This install's agent containers, for re-adoption.
    pub async fn list_agents(&self) -> Result<Vec<docker::Listed>, DockerError> {
        let all = docker::list_install(&self.docker, &self.cfg.install_id, self.cfg.docker_timeout)
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
        let mut st = Supervision::new(
            &self.cfg,
            &spec.run_id,
            &spec.folder,
            secrets_of(&spec.input),
        );
        // Without sidecars there is nothing to look for at the end: one Docker call saved.
        st.sidecars = !spec.group.sidecars.is_empty();
        let ceiling = self.cfg.ceiling(spec.group.timeout.map(|t| t.0));
        if control.kill.is_cancelled() {
            return self
                .finish(st, Ending::Killed(None), &live, &spec.run_id)
                .await;
        }
        let prepared = match self.prepare(&spec).await {
            Ok(p) => p,
            Err(e) => {
                return self.finish(st, Ending::from(&e), &live, &spec.run_id).await;
            }
        };
        if let Err(e) = self.start_sidecars(&spec, &prepared).await {
            return self.finish(st, Ending::from(&e), &live, &spec.run_id).await;
        }
        let deadline = Instant::now() + ceiling;
        let (id, output) = match self.launch(&spec, &prepared, ceiling, &live).await {
            Ok(v) => v,
            Err(e) => {
                st.container_id = live.container_id();
                return self.finish(st, Ending::from(&e), &live, &spec.run_id).await;
            }
        };
        st.container_id = Some(id.clone());
        st.started_at = Some(SystemTime::now());
        let _ = events
            .send(RunEvent::Started {
                container_id: id.clone(),
            })
            .await;
        let ending = self
            .supervise(
                &mut st, &id, output, deadline, spec.close, &events, &control, &live,
            )
            .await;
        match ending {
            None => RunEnd::Detached,
            Some(ending) => self.finish(st, ending, &live, &spec.run_id).await,
        }
    }

    /// Re-adopts a container of this install after a restart: its output is read back from
    /// the start (blocks below `blocks_seen` are not re-sent), then it is supervised to the
    /// end like any run. A container that already exited is finalized from its logs.
    pub async fn adopt(
        &self,
        a: Adoption,
        events: mpsc::Sender<RunEvent>,
        control: RunControl,
        live: Arc<LiveRun>,
    ) -> RunEnd {
        let mut st = Supervision::adopted(&self.cfg, &a.run_id, &a.folder, a.prior);
        st.container_id = Some(a.container_id.clone());
        live.set_container(&a.container_id);
        let t = self.cfg.docker_timeout;
        let info = match docker::bounded(
            "inspect",
            t,
            &a.container_id,
            self.docker.inspect_container(&a.container_id, None),
        )
        .await
        {
            Ok(i) => i,
            Err(e) => {
                let terminal = matches!(e, DockerError::NotFound(_));
                return self
                    .finish(
                        st,
                        Ending::Failed {
                            error: format!("re-adoption: {e}"),
                            terminal,
                        },
                        &live,
                        &a.run_id,
                    )
                    .await;
            }
        };
        let running = info.state.as_ref().and_then(|s| s.running).unwrap_or(false);
        let deadline_ms: Option<i64> = info
            .config
            .as_ref()
            .and_then(|c| c.labels.as_ref())
            .and_then(|l| l.get(LABEL_DEADLINE))
            .and_then(|v| v.parse().ok());
        let now_ms = hako_shared::time::unix_millis(SystemTime::now());
        let remaining = deadline_ms.map_or(self.cfg.run_timeout, |d| {
            Duration::from_millis((d - now_ms).max(0) as u64)
        });
        let opts = LogsOptionsBuilder::new()
            .follow(running)
            .stdout(true)
            .stderr(true)
            .build();
        let output = self
            .docker
            .logs(&a.container_id, Some(opts))
            .map_err(|e| DockerError::from_bollard(e, "logs"))
            .boxed();
        if running {
            *live.gate.write().await = true;
        }
        let ending = self
            .supervise(
                &mut st,
                &a.container_id,
                output,
                Instant::now() + remaining,
                a.close,
                &events,
                &control,
                &live,
            )
            .await;
        match ending {
            None => RunEnd::Detached,
            Some(ending) => self.finish(st, ending, &live, &a.run_id).await,
        }
    }

    fn base_labels(
        &self,
        run_id: &str,
        folder: &GroupFolder,
        role: &str,
    ) -> HashMap<String, String> {
        HashMap::from([
            (labels::INSTALL.to_owned(), self.cfg.install_id.clone()),
            (labels::FOLDER.to_owned(), folder.to_string()),
            (labels::RUN.to_owned(), run_id.to_owned()),
            (labels::ROLE.to_owned(), role.to_owned()),
        ])
    }

    fn container_name(&self, run_id: &str, suffix: &str) -> String {
        let clean: String = run_id
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
            .take(64)
            .collect();
        format!("hako-{}-{clean}{suffix}", self.cfg.install_id)
    }

    fn network_for(&self, g: &GroupSpec) -> String {
        match g.network {
            Network::None | Network::Allowlist => "none".into(),
            Network::Open => self.cfg.open_network.clone(),
        }
    }

    async fn start_sidecars(&self, spec: &RunSpec, p: &Prepared) -> Result<(), RunError> {
        let cfg = &self.cfg;
        let mut sc_dir: Option<SafeDir> = None;
        for sc in &spec.group.sidecars {
            let socket = seed::sidecar_socket(&sc.name);
            let spec_c = self.sidecar_spec(spec, sc, &socket, p);
            let id = docker::create(&self.docker, &spec_c, cfg.docker_timeout).await?;
            docker::bounded(
                "start",
                cfg.docker_timeout,
                &id,
                self.docker.start_container(&id, None),
            )
            .await?;
            if sc_dir.is_none() {
                sc_dir = Some(
                    self.storage
                        .root()
                        .subdir(&layout::dir_rel(&spec.folder, FolderDir::Sidecars))?,
                );
            }
            let Some(dir) = sc_dir.as_ref() else { continue };
            let sock_name = format!("{}.sock", sc.name);
            let deadline = Instant::now() + cfg.sidecar_ready;
            loop {
                if dir.kind(&sock_name)? == Some(rustix::fs::FileType::Socket) {
                    break;
                }
                let running = docker::bounded(
                    "inspect",
                    cfg.docker_timeout,
                    &id,
                    self.docker.inspect_container(&id, None),
                )
                .await?
                .state
                .and_then(|s| s.running)
                .unwrap_or(false);
                if !running {
                    return Err(RunError::Invalid(format!(
                        "sidecar {:?} exited before creating its socket",
                        sc.name
                    )));
                }
                if Instant::now() >= deadline {
                    return Err(RunError::Invalid(format!(
                        "sidecar {:?} did not create {socket} within {:?}",
                        sc.name, cfg.sidecar_ready
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    fn sidecar_spec(
        &self,
        spec: &RunSpec,
        sc: &SidecarSpec,
        socket: &str,
        p: &Prepared,
    ) -> ContainerSpec {
        ContainerSpec {
            name: self.container_name(&spec.run_id, &format!("-sc-{}", sc.name)),
            image: sc.image.clone(),
            user: format!("{}:{}", self.cfg.agent_user.uid, self.cfg.agent_user.gid),
            env: vec![format!("HAKO_SIDECAR_SOCKET={socket}")],
            cmd: (!sc.command.is_empty()).then(|| {
                sc.command
                    .iter()
                    .map(|a| a.replace("{socket}", socket))
                    .collect()
            }),
            mounts: p.sidecar_mounts.clone(),
            network: "none".into(),
            limits: Limits {
                memory: sc.memory.map_or(256 << 20, |m| m.0 as i64),
                cpus: sc.cpus.unwrap_or(0.5),
                pids: 128,
            },
            labels: self.base_labels(&spec.run_id, &spec.folder, "sidecar"),
            stdin: false,
        }
    }

    async fn launch(
        &self,
        spec: &RunSpec,
        p: &Prepared,
        ceiling: Duration,
        live: &LiveRun,
    ) -> Result<(String, BoxStream<'static, Result<LogOutput, DockerError>>), RunError> {
        let cfg = &self.cfg;
        let g = &spec.group;
        let mut env = vec![
            format!("HOME={}", mounts::HOME),
            format!(
                "{QUERY_TIMEOUT_ENV}={}",
                config::query_timeout(ceiling).as_millis()
            ),
            format!("ARIZUKO_FOLDER={}", spec.folder),
        ];
        if cfg.markers != Markers::default() {
            env.push(format!("{MARKER_START_ENV}={}", cfg.markers.start));
            env.push(format!("{MARKER_END_ENV}={}", cfg.markers.end));
        }
        let mut labels = self.base_labels(&spec.run_id, &spec.folder, "agent");
        labels.insert(labels::TURN.to_owned(), spec.turn_id.clone());
        let deadline_ms = hako_shared::time::unix_millis(SystemTime::now() + ceiling);
        labels.insert(LABEL_DEADLINE.to_owned(), deadline_ms.to_string());
        let cspec = ContainerSpec {
            name: self.container_name(&spec.run_id, ""),
            image: g.image.clone().unwrap_or_else(|| cfg.default_image.clone()),
            user: format!("{}:{}", cfg.agent_user.uid, cfg.agent_user.gid),
            env,
            cmd: None,
            mounts: p.mounts.clone(),
            network: self.network_for(g),
            limits: g.limits(&cfg.limits),
            labels,
            stdin: true,
        };
        let t = cfg.docker_timeout;
        let id = docker::create(&self.docker, &cspec, t).await?;
        live.set_container(&id);
        let opts = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .logs(false)
            .build();
        let attached = docker::bounded(
            "attach",
            t,
            &id,
            self.docker.attach_container(&id, Some(opts)),
        )
        .await?;
        docker::bounded("start", t, &id, self.docker.start_container(&id, None)).await?;
        let mut input = spec.input.clone();
        input.folder = spec.folder.to_string();
        input.turn_id = spec.turn_id.clone();
        input.run_id = spec.run_id.clone();
        let mut line = serde_json::to_vec(&input).map_err(|e| RunError::Invalid(e.to_string()))?;
        line.push(b'\n');
        let mut stdin = attached.input;
        let write = async {
            stdin.write_all(&line).await?;
            stdin.flush().await?;
            stdin.shutdown().await
        };
        match tokio::time::timeout(t, write).await {
            Ok(Ok(())) => {}
            // The agent may exit before reading its input; its output decides the outcome.
            Ok(Err(e)) => {
                tracing::warn!(run = %spec.run_id, error = %e, "writing the input line failed")
            }
            Err(_) => return Err(DockerError::Timeout("stdin", t).into()),
        }
        drop(line);
        *live.gate.write().await = true;
        let output = attached
            .output
            .map_err(|e| DockerError::from_bollard(e, "attach"))
            .boxed();
        Ok((id, output))
    }

    /// Follows a started container to its end. `None` means detached.
    #[allow(clippy::too_many_arguments)]
    async fn supervise(
        &self,
        st: &mut Supervision,
        id: &str,
        mut output: BoxStream<'static, Result<LogOutput, DockerError>>,
        deadline: Instant,
        close: CloseWhen,
        events: &mpsc::Sender<RunEvent>,
        control: &RunControl,
        live: &LiveRun,
    ) -> Option<Ending> {
        let cfg = &self.cfg;
        let t = cfg.docker_timeout;
        let wait_opts = WaitContainerOptionsBuilder::new()
            .condition("not-running")
            .build();
        let docker = self.docker.clone();
        let wait_id = id.to_owned();
        let mut wait = Box::pin(async move {
            let mut s = docker.wait_container(&wait_id, Some(wait_opts));
            match s.next().await {
                Some(Ok(r)) => Ok(r.status_code),
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                    Ok(code)
                }
                Some(Err(e)) => Err(DockerError::from_bollard(e, &wait_id)),
                None => Err(DockerError::Api(
                    "wait stream ended without a status".into(),
                )),
            }
        });
        let far = Instant::now() + Duration::from_secs(365 * 86_400);
        let mut exit: Option<i64> = None;
        let mut output_open = true;
        let mut drain_until: Option<Instant> = None;
        let mut stopping: Option<(Ending, Instant)> = None;
        let mut close_at: Option<Instant> = None;
        let mut closed = false;
        let mut stop_task: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            if exit.is_some() && !output_open {
                break;
            }
            tokio::select! {
                biased;
                () = control.detach.cancelled(), if stopping.is_none() => {
                    return None;
                }
                () = control.kill.cancelled(), if !matches!(stopping, Some((Ending::Killed(_), _))) => {
                    stopping = Some((Ending::Killed(None), Instant::now() + cfg.kill_grace + t));
                    stop_task = Some(self.spawn_stop(id, cfg.kill_grace));
                }
                () = tokio::time::sleep_until(deadline), if stopping.is_none() => {
                    tracing::info!(run = %st.run_id, "run ceiling reached; stopping");
                    stopping = Some((Ending::TimedOut(None), Instant::now() + cfg.stop_grace + t));
                    stop_task = Some(self.spawn_stop(id, cfg.stop_grace));
                }
                item = output.next(), if output_open => match item {
                    Some(Ok(frame)) => {
                        let new_blocks = st.frame(frame);
                        for (index, block) in new_blocks {
                            // A slow consumer must not hold off the ceiling or a kill: the
                            // wait is bounded, and the block stays in the report anyway.
                            let limit = deadline.min(Instant::now() + t);
                            tokio::select! {
                                r = events.send(RunEvent::Block { index, block }) => drop(r),
                                () = control.kill.cancelled() => {}
                                () = tokio::time::sleep_until(limit) => {
                                    tracing::warn!(run = %st.run_id, index, "event consumer too slow; block kept in the report only");
                                }
                            }
                            if let CloseWhen::Idle(d) = close && !closed {
                                close_at = Some(Instant::now() + d);
                            }
                        }
                    }
                    Some(Err(e)) => {
                        tracing::warn!(run = %st.run_id, error = %e, "output stream failed");
                        output_open = false;
                    }
                    None => output_open = false,
                },
                () = tokio::time::sleep_until(close_at.unwrap_or(far)), if close_at.is_some() && !closed => {
                    closed = true;
                    close_at = None;
                    if let Err(e) = self.close(live).await {
                        tracing::debug!(run = %st.run_id, error = %e, "close");
                    }
                }
                r = &mut wait, if exit.is_none() => {
                    live.ended.cancel();
                    match r {
                        Ok(code) => exit = Some(code),
                        Err(e) => {
                            // The wait broke (Docker restarted?): ask once more for the state.
                            match docker::bounded("inspect", t, id, self.docker.inspect_container(id, None)).await {
                                Ok(info) if info.state.as_ref().and_then(|s| s.running) == Some(false) => {
                                    exit = Some(info.state.and_then(|s| s.exit_code).unwrap_or(-1));
                                }
                                _ => {
                                    if let Some(task) = stop_task.take() { task.abort(); }
                                    return Some(Ending::Failed { error: format!("lost the container: {e}"), terminal: false });
                                }
                            }
                        }
                    }
                    // Attach can stay open after exit on some engines: drain briefly, then stop.
                    drain_until = Some(Instant::now() + Duration::from_secs(2));
                }
                () = tokio::time::sleep_until(drain_until.unwrap_or(far)), if drain_until.is_some() && output_open => {
                    output_open = false;
                }
                () = tokio::time::sleep_until(stopping.as_ref().map_or(far, |s| s.1)), if stopping.is_some() && exit.is_none() => {
                    // Stop and kill did not end it in time: give up on a clean ending.
                    let Some((ending, _)) = stopping.take() else { continue };
                    live.ended.cancel();
                    return Some(match ending {
                        Ending::Killed(_) => Ending::Killed(None),
                        _ => Ending::TimedOut(None),
                    });
                }
            }
        }
        if let Some(task) = stop_task {
            let _ = task.await;
        }
        let code = exit.unwrap_or(-1);
        Some(match stopping {
            Some((Ending::Killed(_), _)) => Ending::Killed(Some(code)),
            Some((_, _)) => Ending::TimedOut(Some(code)),
            None => Ending::Exited(code),
        })
    }

    fn spawn_stop(&self, id: &str, grace: Duration) -> tokio::task::JoinHandle<()> {
        let docker = self.docker.clone();
        let id = id.to_owned();
        let t = self.cfg.docker_timeout;
        tokio::spawn(async move {
            let secs = grace.as_secs().min(i32::MAX as u64) as i32;
            let opts = bollard::query_parameters::StopContainerOptionsBuilder::new()
                .t(secs)
                .build();
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
        })
    }

    /// Ends a run's supervision and reports it. The containers are left for
    /// [`Runner::remove_containers`], which the caller runs *after* it has recorded the
    /// report: a process killed between the two finds the run ended (and removes the
    /// leftover as an orphan), never an answered run without its container.
    async fn finish(
        &self,
        mut st: Supervision,
        ending: Ending,
        live: &LiveRun,
        run_id: &str,
    ) -> RunEnd {
        live.ended.cancel();
        // Wait for in-flight steers to settle, then refuse new ones.
        *live.gate.write().await = false;
        let exit_code = match &ending {
            Ending::Exited(c) => Some(*c),
            Ending::TimedOut(c) | Ending::Killed(c) => *c,
            Ending::Failed { .. } => None,
        };
        let verdict = decide(&ending, &st.statuses());
        let ended_at = SystemTime::now();
        let log = st.render_log(&verdict, exit_code, ended_at);
        let log_file = match st.logs_dir(self.storage.root()) {
            Some(dir) => {
                let (stamp, run, text, keep) = (
                    hako_shared::time::compact(ended_at),
                    run_id.to_owned(),
                    log.clone(),
                    self.cfg.log_files,
                );
                tokio::task::spawn_blocking(move || {
                    runlog::write_file(&dir, &stamp, &run, &text, keep)
                })
                .await
                .ok()
                .and_then(|r| {
                    r.map_err(|e| tracing::warn!(run = run_id, error = %e, "writing the run log"))
                        .ok()
                })
            }
            None => None,
        };
        if st.container_id.is_none() {
            st.container_id = live.container_id();
        }
        RunEnd::Finished(Box::new(RunReport {
            run_id: run_id.to_owned(),
            state: verdict.state,
            outcome: verdict.outcome,
            terminal: verdict.terminal,
            blocks: std::mem::take(&mut st.blocks),
            truncated: st.truncated,
            exit_code,
            error: verdict.error,
            log,
            log_file,
            container_id: st.container_id.take(),
            sidecars: st.sidecars,
            started_at: st.started_at,
            ended_at,
        }))
    }

    /// Removes a finished run's containers, its sidecars and its agent, together, and checks
    /// they are gone. Returns what could not be removed (a later orphan cleanup retries).
    pub async fn remove_containers(&self, report: &RunReport) -> Vec<String> {
        let t = self.cfg.docker_timeout;
        let run_id = report.run_id.as_str();
        let sidecars = async {
            let mut errors = Vec::new();
            if !report.sidecars {
                return errors;
            }
            match docker::list_install(&self.docker, &self.cfg.install_id, t).await {
                Ok(list) => {
                    let removals = list
                        .iter()
                        .filter(|c| {
                            c.run_id() == Some(run_id)
                                && c.labels.get(labels::ROLE).map(String::as_str) == Some("sidecar")
                        })
                        .map(|c| async move {
                            docker::stop_and_remove(&self.docker, &c.id, Duration::from_secs(2), t)
                                .await
                                .map_err(|e| format!("sidecar {}: {e}", c.id))
                        });
                    for r in futures_util::future::join_all(removals).await {
                        errors.extend(r.err());
                    }
                }
                Err(e) => errors.push(format!("listing sidecars: {e}")),
            }
            errors
        };
        let agent = async {
            match &report.container_id {
                Some(id) => docker::remove(&self.docker, id, t)
                    .await
                    .map_err(|e| format!("container {id}: {e}"))
                    .err(),
                None => None,
            }
        };
        let (mut errors, agent_error) = tokio::join!(sidecars, agent);
        errors.extend(agent_error);
        for e in &errors {
            tracing::error!(run = run_id, "cleanup: {e}");
        }
        errors
    }

    /// Sends follow-up `messages` to a live run, exactly once: the file is written under a
    /// temp name and renamed, the agent is woken with SIGUSR1, and the follow-up counts as
    /// delivered only if the agent takes (unlinks) the file. Otherwise the runner takes it
    /// back (its own unlink), reports it as not delivered, and no file is left behind. The
    /// one unlink that succeeds decides, so there is no double delivery and no loss.
    pub async fn steer(
        &self,
        live: &LiveRun,
        messages: &[String],
    ) -> Result<SteerReport, RunError> {
        let gate = live.gate.read().await;
        if !*gate || live.ended.is_cancelled() {
            return Err(RunError::NotLive(live.run_id.clone()));
        }
        let id = live
            .container_id()
            .ok_or_else(|| RunError::NotLive(live.run_id.clone()))?;
        let input = self.input_dir(&live.folder)?;
        let ms = hako_shared::time::unix_millis(SystemTime::now());
        let name = format!(
            "{ms:013}-{:06}.json",
            STEER_SEQ.fetch_add(1, Ordering::Relaxed) % 1_000_000
        );
        let body = serde_json::to_vec(&FollowUp {
            content: messages.join("\n\n"),
        })
        .map_err(|e| RunError::Invalid(e.to_string()))?;
        let tmp = format!(".{name}.tmp");
        input.create_new(&tmp, &body, 0o644, None)?;
        input.rename(&tmp, &name)?;
        let reason;
        if let Err(e) = docker::signal(&self.docker, &id, "SIGUSR1", self.cfg.docker_timeout).await
        {
            reason = Some(format!("could not signal the agent: {e}"));
        } else {
            let deadline = Instant::now() + self.cfg.steer_wait;
            loop {
                if input.kind(&name)?.is_none() {
                    return Ok(SteerReport {
                        delivered: true,
                        reason: None,
                    });
                }
                if live.ended.is_cancelled() {
                    reason = Some("the run ended before the agent took the follow-up".into());
                    break;
                }
                if Instant::now() >= deadline {
                    reason = Some(format!(
                        "the agent did not take the follow-up within {:?}",
                        self.cfg.steer_wait
                    ));
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    () = live.ended.cancelled() => {}
                }
            }
        }
        drop(gate);
        // Take it back; if the agent won the race, it was delivered after all.
        if input.remove(&name)? {
            Ok(SteerReport {
                delivered: false,
                reason,
            })
        } else {
            Ok(SteerReport {
                delivered: true,
                reason: None,
            })
        }
    }

    /// Tells the agent to finish: drops `_close` and wakes it.
    pub async fn close(&self, live: &LiveRun) -> Result<(), RunError> {
        if live.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let input = self.input_dir(&live.folder)?;
        input.write_atomic(CLOSE_FILE, b"", 0o644, None)?;
        if let Some(id) = live.container_id()
            && !live.ended.is_cancelled()
        {
            match docker::signal(&self.docker, &id, "SIGUSR1", self.cfg.docker_timeout).await {
                // It ended meanwhile: nothing left to close.
                Ok(()) | Err(DockerError::NotRunning(_) | DockerError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    fn input_dir(&self, folder: &GroupFolder) -> Result<SafeDir, RunError> {
        Ok(self
            .storage
            .root()
            .subdir(&layout::dir_rel(folder, FolderDir::Input))?)
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
        let d = |e: DockerError| RunError::Docker(e).is_terminal();
        assert!(d(DockerError::ImageMissing("x".into())));
        assert!(d(DockerError::Api("400: invalid mount config".into())));
        assert!(!d(DockerError::Api("500: failed to create shim".into())));
        assert!(!d(DockerError::Api(
            "409: Conflict. The container name is in use".into()
        )));
        assert!(!d(DockerError::NotFound("c".into())));
        assert!(!d(DockerError::Timeout("create", Duration::from_secs(1))));
        assert!(RunError::Invalid("x".into()).is_terminal());
    }
}
