//! The seam between a run's life and the container engine under it, with no Docker type in a
//! signature. Two traits, by who asks:
//!
//! - [`BoxControl`]: what supervision and the clean-up ask of a box that exists (its exit, a
//!   stop, a signal, its state, the install's boxes, a removal). The supervision machine's
//!   unit tests (`supervise.rs`) script this half alone.
//! - [`Engine`]: the whole engine, adding what a launch, a warm box and a re-adoption ask
//!   (create, attach, start, inspect, logs, images, runtimes, the version).
//!
//! Docker is one engine (`docker.rs`, the only place bollard is called for a box); the
//! simulated engine (`sim.rs`) is another, with scripted boxes, and the runner's and runed's
//! logic tests run on it with no Docker daemon at all. An engine on another substrate (a pod
//! per run, `specs/scale.md`) fits the same calls.

use std::collections::HashMap;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use tokio::io::AsyncWrite;

pub use hako_shared::runs::Limits;

use crate::mounts::MountEntry;

/// Labels on every container hako starts.
pub mod labels {
    /// The install id: containers of another install are never touched.
    pub const INSTALL: &str = "io.hako.install";
    /// The group folder.
    pub const FOLDER: &str = "io.hako.folder";
    /// The run id.
    pub const RUN: &str = "io.hako.run";
    /// The turn id.
    pub const TURN: &str = "io.hako.turn";
    /// `agent` or `sidecar`.
    pub const ROLE: &str = "io.hako.role";
    /// The process that owns the container when it is not runed (`hako chat`).
    pub const OWNER: &str = "io.hako.owner";
    /// `1` on a warm box: started before any run (its `io.hako.run` is the box's own id).
    /// Not `io.hako.warm`: a container carries its image's labels too, and that one is the
    /// image's.
    pub const WARM_BOX: &str = "io.hako.warm-box";
}

/// What a box needs beyond the fixed security profile (which every engine applies to every
/// box: `docker::create_body` for Docker).
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    /// Unique container name.
    pub name: String,
    /// Image reference.
    pub image: String,
    /// `uid:gid`.
    pub user: String,
    /// Environment (`NAME=value`); never secrets.
    pub env: Vec<String>,
    /// Arguments to the entrypoint, if any.
    pub cmd: Option<Vec<String>>,
    /// Bind mounts (sources already translated to host paths).
    pub mounts: Vec<MountEntry>,
    /// `none`, `bridge` or a network name.
    pub network: String,
    /// Limits.
    pub limits: Limits,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// Keep stdin open for the one input line.
    pub stdin: bool,
    /// The OCI runtime (`None`: the engine's default).
    pub runtime: Option<String>,
    /// What the box is for.
    pub kind: BoxKind,
}

/// What a box is for: the security profile is the same; the working directory and scratch
/// space differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxKind {
    /// An agent's box (or a copy box of its image): it works in `/workspace` and has a small
    /// `/tmp` in memory.
    Agent,
    /// A service of the install (the egress proxy): its image's own working directory, no
    /// scratch space.
    Service,
}

/// A network for boxes to meet on (a run's network to the egress proxy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSpec {
    /// Unique name.
    pub name: String,
    /// No route out of it.
    pub internal: bool,
    /// The host has no address on it: a box on it cannot reach the host either.
    pub host_unreachable: bool,
    /// Labels.
    pub labels: HashMap<String, String>,
}

/// A network, as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedNetwork {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

/// Container engine failures, classified.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The daemon does not answer at all.
    #[error("docker daemon unavailable at {socket}: {message}")]
    Unavailable {
        /// The socket or host tried.
        socket: String,
        /// What failed.
        message: String,
    },
    /// The image does not exist (and cannot be pulled here).
    #[error("image {0} not found (build it with `hako-images build`; images are never pulled)")]
    ImageMissing(String),
    /// No such container.
    #[error("container {0} not found")]
    NotFound(String),
    /// The container is not running (a signal to it cannot land).
    #[error("container {0} is not running")]
    NotRunning(String),
    /// A call did not finish in time.
    #[error("docker call {0} timed out after {1:?}")]
    Timeout(&'static str, Duration),
    /// Anything else the daemon said: its HTTP status when it answered one (judged by
    /// number, never by reading the text), and its message.
    #[error("docker: {}{message}", status.map(|s| format!("{s}: ")).unwrap_or_default())]
    Api {
        /// The daemon's HTTP status, when the failure is an answer of the daemon.
        status: Option<u16>,
        /// What it said.
        message: String,
    },
}

impl EngineError {
    /// A failure that is no answer of the daemon's (no HTTP status).
    pub fn api(message: impl Into<String>) -> Self {
        EngineError::Api {
            status: None,
            message: message.into(),
        }
    }

    /// The daemon answered `status`.
    pub fn is_status(&self, status: u16) -> bool {
        matches!(self, EngineError::Api { status: Some(s), .. } if *s == status)
    }

    /// Whether the daemon itself is unreachable (as opposed to refusing a request).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            EngineError::Unavailable { .. } | EngineError::Timeout(..)
        )
    }
}

/// One piece of a container's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// From its stdout (or its console, with a TTY).
    Stdout(Bytes),
    /// From its stderr.
    Stderr(Bytes),
}

/// A container's output: attached (a new run) or from its log (a re-adopted one).
pub type FrameStream = BoxStream<'static, Result<Frame, EngineError>>;

/// A created box's input and output, attached before it starts (so no output is missed).
pub struct Attached {
    /// Its stdin: the run's one line is written here, then it is shut.
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    /// Its output from the attach on.
    pub output: FrameStream,
}

/// What the engine knows of a box.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inspected {
    /// Its process.
    pub state: ProcessState,
    /// Its labels (its image's included).
    pub labels: HashMap<String, String>,
    /// The image reference it was created from.
    pub image: String,
    /// Its address on each network it joined, by network name.
    pub addresses: HashMap<String, String>,
}

/// An image, as the engine has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInfo {
    /// Its content id (what a tag points at now).
    pub id: String,
    /// Its labels.
    pub labels: HashMap<String, String>,
}

/// What the engine knows of a container's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessState {
    /// It still runs.
    pub running: bool,
    /// Its exit code, once it exited.
    pub exit_code: Option<i64>,
}

/// A container, as listed.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Container id.
    pub id: String,
    /// Its name (without Docker's leading `/`).
    pub name: String,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// `running`, `exited`, …
    pub state: String,
}

impl Listed {
    /// The run id label, if any.
    pub fn run_id(&self) -> Option<&str> {
        self.labels.get(labels::RUN).map(String::as_str)
    }
}

/// The calls supervision makes on a started container, by the engine's id for it. Each call's
/// future owns what it needs (`'static`), so a stop can run in a task of its own; each is
/// bounded by `limit`, the engine's own deadline for the call.
pub trait BoxControl: Send + Sync {
    /// Resolves with the exit code once the container is not running. It has no deadline:
    /// it is as long as the run.
    fn wait(&self, id: &str) -> BoxFuture<'static, Result<i64, EngineError>>;

    /// Stops it: SIGTERM, `grace`, SIGKILL; bounded by `grace + limit`.
    fn stop(
        &self,
        id: &str,
        grace: Duration,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Sends `signal` (`SIGKILL`, `SIGUSR1`) to its init, which forwards it.
    fn signal(
        &self,
        id: &str,
        signal: &'static str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Whether it runs, and how it exited.
    fn state(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ProcessState, EngineError>>;

    /// Every box (running or not) whose label `label` is `value` (this install's boxes:
    /// [`labels::INSTALL`] and `Some(install id)`), or, with `None`, that carries `label` at
    /// all (any install's: `hako chat` reaps its dead chats' boxes by [`labels::OWNER`]).
    fn list(
        &self,
        label: &'static str,
        value: Option<&str>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<Listed>, EngineError>>;

    /// Removes it, by force, and confirms it is gone (gone already is done); with `stop`, it
    /// is stopped first with that grace. Bounded by `limit` per call.
    fn remove(
        &self,
        id: &str,
        stop: Option<Duration>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;
}

/// The whole engine: [`BoxControl`] and what making a box and reading it back take. Each call
/// is bounded by `limit` (the logs' stream excepted: it is as long as the box).
pub trait Engine: BoxControl {
    /// Creates a box from `spec` under the security profile; returns its id. A missing image
    /// is [`EngineError::ImageMissing`] (images are never pulled).
    fn create(
        &self,
        spec: &ContainerSpec,
        limit: Duration,
    ) -> BoxFuture<'static, Result<String, EngineError>>;

    /// Attaches to a created box's stdin, stdout and stderr.
    fn attach(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Attached, EngineError>>;

    /// Starts a created box.
    fn start(&self, id: &str, limit: Duration) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Its process and labels.
    fn inspect(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Inspected, EngineError>>;

    /// Its output from its start (what the engine kept), and with `follow` on until it ends.
    fn logs(&self, id: &str, follow: bool) -> FrameStream;

    /// The image `reference` names now.
    fn image(
        &self,
        reference: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ImageInfo, EngineError>>;

    /// A tar archive of `path` in a created box (its image's file), as it streams.
    fn archive(&self, id: &str, path: &str) -> BoxStream<'static, Result<Bytes, EngineError>>;

    /// The OCI runtimes it can run boxes under, sorted.
    fn runtimes(&self, limit: Duration) -> BoxFuture<'static, Result<Vec<String>, EngineError>>;

    /// It answers: its API version.
    fn version(&self, limit: Duration) -> BoxFuture<'static, Result<String, EngineError>>;

    /// Creates a network; one of that name already there is done.
    fn create_network(
        &self,
        spec: &NetworkSpec,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Joins box `id` to `network`, known there also as `alias`; joined already is done.
    fn connect(
        &self,
        network: &str,
        id: &str,
        alias: Option<&str>,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Takes box `id` off `network`; not on it (or either gone) is done.
    fn disconnect(
        &self,
        network: &str,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Removes a network; gone already is done.
    fn remove_network(
        &self,
        name: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>>;

    /// Every network whose label `label` is `value`.
    fn networks(
        &self,
        label: &'static str,
        value: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<ListedNetwork>, EngineError>>;
}

/// An engine to hand to a daemon's configuration (which is `Debug` and `Clone`).
#[derive(Clone)]
pub struct EngineRef(pub std::sync::Arc<dyn Engine>);

impl std::fmt::Debug for EngineRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EngineRef")
    }
}
