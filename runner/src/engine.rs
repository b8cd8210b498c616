//! The seam between a run's life and the container engine under it: what supervision and the
//! clean-up ask of a box (its exit, a stop, a signal, its state, its output as frames, the
//! install's boxes, a removal), with no Docker type in a signature. [`bollard::Docker`] is the engine runed runs on (`docker.rs`);
//! the unit tests of the supervision machine (`supervise.rs`) script a fake one, and an engine
//! on another substrate (a pod per run, `specs/scale.md`) fits the same calls.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

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

/// What the engine knows of a container's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessState {
    /// It still runs.
    pub running: bool,
    /// Its exit code, once it exited.
    pub exit_code: Option<i64>,
}

/// A container of this install, as listed.
#[derive(Debug, Clone)]
pub struct Listed {
    /// Container id.
    pub id: String,
    /// Labels.
    pub labels: HashMap<String, String>,
    /// `running`, `exited`, …
    pub state: String,
}

impl Listed {
    /// The run id label, if any.
    pub fn run_id(&self) -> Option<&str> {
        self.labels
            .get(crate::docker::labels::RUN)
            .map(String::as_str)
    }
}

/// The calls supervision makes on a started container, by the engine's id for it. Each call's
/// future owns what it needs (`'static`), so a stop can run in a task of its own; each is
/// bounded by `limit`, the engine's own deadline for the call.
pub trait Engine: Send + Sync {
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

    /// Every box (running or not) labelled with `install`, and no other install's.
    fn list(
        &self,
        install: &str,
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
