//! runed: hako's execution daemon: run API, durable queue, per-spawn tokens, re-adoption. It
//! runs each turn through the container runner (`hako-runner`, the crate it shares with the
//! `hako` CLI; cargo keeps the runner from reaching back into the daemon).
//! `main.rs` only reads the environment and calls [`start`], so tests run a real runed
//! in-process on a loopback port.

#![warn(missing_docs)]

mod api;
pub mod config;
mod daemon;
mod error;
mod gc;
pub mod metrics;
mod proxy_watch;
pub mod queue;
mod record;
mod recover;
mod state;
pub mod store;
pub mod tokens;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use hako_shared::auth::Verifier;
use hako_shared::http::{Ops, Served, daemon_router};
use tokio::sync::{Notify, broadcast};
use tokio_util::sync::CancellationToken;

pub use config::Config;
pub use state::Event;

use hako_runner::Runner;
use metrics::DaemonMetrics;
use queue::FairQueue;
use state::{Sched, Shared};
use store::Store;
use tokens::Broker;

/// runed's OpenAPI document as committed (`runed/openapi.json`); a test keeps it equal to
/// [`openapi`], which the server serves.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// runed's OpenAPI document, generated from its handlers and wire types.
pub fn openapi() -> utoipa::openapi::OpenApi {
    hako_shared::http::document(api::documented())
}
/// How long shutdown waits for in-flight requests and for runs to detach.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Why runed could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database failed.
    #[error("runed.db: {0}")]
    Db(#[from] hako_shared::db::DbError),
    /// The runner could not be set up.
    #[error("runner: {0}")]
    Runner(#[from] hako_runner::RunError),
    /// The Docker client could not be built.
    #[error("docker: {0}")]
    Docker(String),
    /// The authd client or verifier could not be built.
    #[error("authd: {0}")]
    Auth(#[from] hako_shared::auth::ClientError),
    /// The listener failed.
    #[error("listener: {0}")]
    Listener(std::io::Error),
    /// The runtime the install names for untrusted groups does not exist.
    #[error("{0}")]
    Runtime(String),
}

/// A running runed. [`Running::shutdown`] detaches live runs and stops; dropping it does too.
pub struct Running {
    served: Served,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr())
            .finish()
    }
}

impl Running {
    /// The address runed listens on.
    pub fn addr(&self) -> SocketAddr {
        self.served.addr()
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.served.url()
    }

    /// The container runner this daemon uses (`None` while Docker's socket is missing).
    pub fn runner(&self) -> Option<Runner> {
        self.shared.runner().ok()
    }

    /// Stops accepting requests, detaches live runs (their containers keep running and are
    /// re-adopted by the next start), and returns within a few seconds.
    pub async fn shutdown(mut self) {
        // Cancels `stopping` first: live runs detach.
        if let Err(e) = self.served.stop_server(SHUTDOWN_GRACE).await {
            tracing::warn!(error = %e, "runed's server stopped with an error");
        }
        // Runs return `Detached` as soon as their supervisors see the token; each one that
        // leaves wakes this wait.
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        loop {
            let left = self.shared.left.notified();
            tokio::pin!(left);
            // Registered before the check: a run leaving in between still wakes it.
            left.as_mut().enable();
            if self.shared.sched().live.is_empty() {
                break;
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                break;
            }
        }
        // Warm boxes wait on this process's attach: they would only read end-of-input.
        if let Ok(r) = self.shared.runner() {
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, r.drain_warm()).await;
        }
        self.served.abort_tasks();
    }
}

/// Starts runed on `listener`: opens (creating and migrating) `runed.db`, connects to Docker
/// and authd, restores the queue and re-adopts containers (as soon as Docker answers), and
/// serves until [`Running::shutdown`].
pub async fn start(
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<Running, StartError> {
    let addr = listener.local_addr().map_err(StartError::Listener)?;
    let store = Store::open(&config.db_path).await?;
    // A missing socket is not fatal: runs queue and `/ready` says why until it appears.
    let runner = match state::connect(&config) {
        Ok(r) => Some(r),
        Err(why) => {
            tracing::warn!(%why, "docker is unavailable");
            None
        }
    };
    let verifier = Verifier::new(config.verifier.clone())?;
    let broker = Broker::new(
        config.verifier.authd_url.as_deref(),
        config.service_key.as_deref(),
    )?;
    let metrics = DaemonMetrics::new(config.runner.run_timeout);
    metrics.runtimes(config.runner.untrusted_runtime.as_deref());
    let (events, _) = broadcast::channel(state::EVENT_RING);
    let watchers =
        hako_shared::watchers::Gate::new(config.max_streams, config.max_streams_per_caller);
    let data_dir = std::path::absolute(&config.runner.layout.data_dir)
        .unwrap_or_else(|_| config.runner.layout.data_dir.clone());
    let secrets = hako_runner::secret_store::SecretStore::new(
        data_dir,
        hako_runner::secret_store::proxy_owner(),
    );
    let shared = Arc::new(Shared {
        sched: std::sync::Mutex::new(Sched {
            queue: FairQueue::new(config.max_containers, config.max_per_tenant),
            pending: Default::default(),
            live: Default::default(),
            reserved: 0,
            reserved_per: Default::default(),
            deferred: Vec::new(),
        }),
        cfg: config,
        store,
        runner: std::sync::Mutex::new(runner),
        broker,
        verifier,
        metrics,
        wake: Notify::new(),
        left: Notify::new(),
        events,
        docker_down: std::sync::Mutex::new(None),
        broker_pause: std::sync::Mutex::new(None),
        stopping: CancellationToken::new(),
        watchers,
        adopted: AtomicBool::new(false),
        secrets,
    });
    if let Err(why) = shared.probe_docker().await {
        tracing::warn!(%why, "docker is unavailable; runs stay queued until it answers");
    } else {
        // The runtime the install names for untrusted groups must exist: a silent fallback
        // to the default would run untrusted code on the host's kernel.
        if let Ok(runner) = shared.runner()
            && let Err(e) = runner.check_runtimes().await
        {
            return Err(StartError::Runtime(e.to_string()));
        }
        recover::adopt_all(&shared).await;
    }

    let ready = Arc::downgrade(&shared);
    let ops = Ops {
        info: api::INFO,
        metrics: shared.metrics.registry.clone(),
        ready: Arc::new(move || {
            let sh = ready.clone();
            Box::pin(async move {
                let sh = sh.upgrade().ok_or("runed is stopping")?;
                sh.store
                    .ping()
                    .await
                    .map_err(|e| format!("runed.db: {e}"))?;
                sh.probe_docker()
                    .await
                    .map_err(|e| format!("docker: {e}"))?;
                proxy_watch::ready(&sh)?;
                Ok(())
            })
        }),
    };
    let (router, _doc) = daemon_router(
        api::documented().with_state(api::AppState(shared.clone())),
        ops,
        hako_shared::http::BodyLimits {
            default: shared.cfg.body_limit,
            routes: vec![(api::media::ROUTE, shared.cfg.media_max)],
        },
    );
    let router = if shared.verifier.is_open() {
        hako_shared::http::local_only(router)
    } else {
        router
    };
    let tasks = [
        tokio::spawn(daemon::scheduler(shared.clone())),
        tokio::spawn(gc::gc_loop(shared.clone())),
        tokio::spawn(proxy_watch::supervise(shared.clone())),
    ]
    .map(|t| t.abort_handle());
    let served =
        Served::spawn(listener, router, shared.cfg.serve, tasks).map_err(StartError::Listener)?;
    // Dropping or shutting down the handle cancels it: live runs detach.
    let served = served.stopping(shared.stopping.clone());
    tracing::info!(%addr, max_containers = shared.cfg.max_containers, "runed listening");
    Ok(Running { served, shared })
}

#[cfg(test)]
mod tests {
    /// The daemon's modules depend on each other one way: `state` at the bottom, then
    /// `record`, `recover`, `daemon` (the runner is a crate of its own below them all). A
    /// `crate::x` in module `m` is an edge m → x; the graph must have no cycle.
    #[test]
    fn module_dependencies_have_no_cycle() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let edges = hako_shared::testing::module_graph(&src);
        assert!(edges.contains_key("state") && edges.contains_key("recover"));
    }

    /// The committed document is what the code generates (HAKO_BLESS=1 rewrites it), and
    /// routes are only ever registered through it: no handler is mounted with a bare
    /// `.route(` that the document would not list.
    #[test]
    fn the_openapi_document_is_generated_and_committed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let expected = hako_shared::openapi::Expected {
            routes: &[
                ("/v1/runs", "post"),
                ("/v1/runs/{run_id}", "get"),
                ("/v1/runs/{run_id}", "delete"),
                ("/v1/runs/{run_id}/events", "get"),
                ("/v1/runs/{run_id}/steer", "post"),
                ("/v1/runs/stop", "post"),
                ("/v1/holds", "post"),
                ("/v1/sessions", "get"),
                ("/v1/audit", "get"),
                ("/v1/secrets", "get"),
                ("/v1/secrets/{name}", "put"),
                ("/v1/secrets/{name}", "delete"),
                ("/v1/folders/{folder}/media/{name}", "put"),
                ("/health", "get"),
                ("/ready", "get"),
                ("/metrics", "get"),
                ("/openapi.json", "get"),
            ],
            schemas: &[
                "RunRequest",
                "GroupSpec",
                "RunStatus",
                "OutputBlock",
                "CreatedRun",
                "ErrorBody",
                "SecretList",
                "SecretValueRequest",
                "MediaSaved",
            ],
            sources: &["src", "src/api"],
        };
        hako_shared::openapi::check_document(&super::openapi(), dir, &expected).unwrap();
    }
}
