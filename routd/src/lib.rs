//! routd: hako's routing daemon. It keeps the message log (the sole appender), the groups and
//! the routes that map chats to them, decides when a turn runs (one live turn per folder), asks
//! runed for the run, turns the agent's output into replies, moves the chat's cursor, and
//! delivers the replies (server-sent events, signed webhooks). It never touches Docker and
//! never signs a token. `main.rs` only reads the environment and calls [`start`], so tests run
//! a real routd in-process on a loopback port.

#![warn(missing_docs)]

mod api;
mod approvals;
mod chats;
mod commands;
pub mod config;
mod delivery;
mod error;
mod gateway;
pub mod live;
pub mod metrics;
pub mod routing;
pub mod runed;
mod sockets;
mod state;
pub mod store;
mod tasks;
mod tools;
mod turn_io;
mod turns;
mod waiters;
mod web;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hako_shared::auth::Verifier;
use hako_shared::http::{Ops, Served, daemon_router};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use config::Config;

use metrics::RoutdMetrics;
use routing::Routing;
use runed::RunedClient;
use state::Shared;
use store::Store;

/// routd's OpenAPI document as committed (`routd/openapi.json`); a test keeps it equal to
/// [`openapi`], which the server serves.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// routd's OpenAPI document, generated from its handlers and wire types.
pub fn openapi() -> utoipa::openapi::OpenApi {
    hako_shared::http::document(api::documented())
}

/// Why routd could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The database failed.
    #[error("routd.db: {0}")]
    Db(#[from] hako_shared::db::DbError),
    /// The authd client, the verifier or the runed client could not be built.
    #[error("authd: {0}")]
    Auth(#[from] hako_shared::auth::ClientError),
    /// The listener failed.
    #[error("listener: {0}")]
    Listener(std::io::Error),
}

/// A running routd. [`Running::shutdown`] stops it; dropping it does too.
pub struct Running {
    served: Served,
    /// The live turns' tasks, drained at shutdown.
    turn_tasks: Arc<live::TurnTasks>,
    /// How long shutdown waits for them.
    grace: Duration,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr())
            .finish()
    }
}

impl Running {
    /// The address routd listens on.
    pub fn addr(&self) -> SocketAddr {
        self.served.addr()
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.served.url()
    }

    /// Stops accepting requests and stops driving turns (they resume at the next start):
    /// each turn's task finishes the step it is in (a run runed is starting is recorded)
    /// within `ROUTD_SHUTDOWN_GRACE`, and what is still busy then is cut off. When this
    /// returns, nothing of this routd acts on a turn any more.
    pub async fn shutdown(mut self) {
        // One grace for both: the whole stop stays within it.
        let deadline = tokio::time::Instant::now() + self.grace;
        if let Err(e) = self.served.stop_server(self.grace).await {
            tracing::warn!(error = %e, "routd's server stopped with an error");
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let cut = self.turn_tasks.drain(left).await;
        if cut > 0 {
            tracing::warn!(
                tasks = cut,
                "turn tasks still busy at the end of the grace were cut off; their turns resume at the next start"
            );
        }
        self.served.abort_tasks();
    }
}

/// Starts routd on `listener`: opens (creating and migrating) `routd.db`, resumes the turns
/// that were live when it stopped, and serves until [`Running::shutdown`]. It asks the runed
/// at `config.runed_url`.
pub async fn start(
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<Running, StartError> {
    let runed = RunedClient::new(
        &config.runed_url,
        config.verifier.authd_url.as_deref(),
        config.service_key.as_deref(),
        config.runed_timeout,
    )?;
    start_with(config, listener, Arc::new(runed)).await
}

/// [`start`], asking `runed` for runs: the turn logic's tests answer with a scripted runed
/// (no runed, no containers).
pub async fn start_with(
    config: Config,
    listener: tokio::net::TcpListener,
    runed: Arc<dyn runed::Runs>,
) -> Result<Running, StartError> {
    let addr = listener.local_addr().map_err(StartError::Listener)?;
    let store = Store::open(&config.db_path).await?;
    let verifier = Verifier::new(config.verifier.clone())?;
    if config.verifier.authd_url.is_none() {
        tracing::warn!(
            "OPEN MODE (HAKO_OPEN_DEV=1, no AUTHD_URL): routd's API accepts any caller on loopback, and routd calls runed without a token. Local development only."
        );
    }
    let routing = Routing::default();
    routing.reload(&store).await?;
    let webhook_http = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .timeout(config.webhook_timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| hako_shared::auth::ClientError::Transport(e.to_string()))?;
    let llm_http = reqwest::Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| hako_shared::auth::ClientError::Transport(e.to_string()))?;
    let watchers =
        hako_shared::watchers::Gate::new(config.max_streams, config.max_streams_per_caller);
    let shared = Arc::new(Shared {
        cfg: config,
        store,
        routing,
        runed,
        verifier,
        metrics: RoutdMetrics::new(),
        stopping: CancellationToken::new(),
        turns: live::Turns::default(),
        chats: chats::Chats::new(webhook_http, watchers),
        approvals: waiters::Waiters::default(),
        signed_out: state::SignedOut::default(),
        tasks_changed: Notify::new(),
        llm_http,
    });
    shared.chats.reload_webhooks(&shared.store).await?;

    let ready = Arc::downgrade(&shared);
    let ops = Ops {
        info: api::INFO,
        metrics: shared.metrics.registry.clone(),
        ready: Arc::new(move || {
            let sh = ready.clone();
            Box::pin(async move {
                let sh = sh.upgrade().ok_or("routd is stopping")?;
                sh.store
                    .ping()
                    .await
                    .map_err(|e| format!("routd.db: {e}"))?;
                sh.runed.reachable().await?;
                Ok(())
            })
        }),
    };
    // The API, behind the layer that lets a browser session act as its link's token; then
    // the web page, which the API document does not list.
    let api = api::documented()
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            web::session::api_layer,
        ))
        .with_state(api::AppState(shared.clone()))
        .merge(utoipa_axum::router::OpenApiRouter::from(web::router(
            shared.clone(),
        )));
    let limits = hako_shared::http::BodyLimits {
        default: shared.cfg.body_limit,
        routes: vec![(api::media::ROUTE, shared.cfg.media_max)],
    };
    let (router, _doc) = daemon_router(api, ops, limits);
    let router = if shared.verifier.is_open() {
        hako_shared::http::local_only(router)
    } else {
        router
    };
    // Before any task steers: messages left steering by a turn that is over wait for a turn
    // again (a live turn's follow-ups are settled by its run's end).
    let released = shared.store.release_steering().await?;
    if released > 0 {
        tracing::info!(
            messages = released,
            "messages left steering by an ended turn wait for the next turn"
        );
    }
    // Held calls of an earlier routd were cut with its sockets: a live turn's requests wait
    // for its agent to ask again; the others are denied.
    let abandoned = approvals::adopt_pending(&shared).await?;
    if abandoned > 0 {
        tracing::info!(
            requests = abandoned,
            "approval requests an earlier routd left pending, of turns that are over, are denied"
        );
    }
    let tasks = [
        tokio::spawn(turns::scheduler(shared.clone())),
        tokio::spawn(delivery::worker(shared.clone())),
        tokio::spawn(turns::watch_backlog(shared.clone())),
        tokio::spawn(tasks::run(shared.clone())),
        tokio::spawn(web::sweep_revoked(shared.clone())),
        tokio::spawn(approvals::sweep(shared.clone())),
    ]
    .map(|t| t.abort_handle());
    turns::resume(&shared).await;
    let served =
        Served::spawn(listener, router, shared.cfg.serve, tasks).map_err(StartError::Listener)?;
    // Dropping or shutting down the handle cancels it: turns stop being driven.
    let served = served.stopping(shared.stopping.clone());
    tracing::info!(%addr, runed = %shared.cfg.runed_url, "routd listening");
    Ok(Running {
        served,
        turn_tasks: shared.turns.tasks.clone(),
        grace: shared.cfg.shutdown_grace,
    })
}

#[cfg(test)]
mod tests {
    /// routd's modules depend on each other one way: `state` (what the tasks share) below
    /// every module that uses it, above the leaves its fields come from; no module uses an
    /// item of `lib.rs`.
    #[test]
    fn module_dependencies_have_no_cycle_and_no_upward_arrow() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let edges = hako_shared::testing::module_graph(&src);
        assert!(edges["turns"].contains("state"));
        for leaf in [
            "store", "config", "runed", "live", "sockets", "waiters", "chats",
        ] {
            assert!(
                !edges.get(leaf).is_some_and(|d| d.contains("state")),
                "{leaf} is below state"
            );
        }
    }

    /// The committed document is what the code generates (HAKO_BLESS=1 rewrites it), every
    /// route is in it with real schemas, and no route is mounted outside it.
    #[test]
    fn the_openapi_document_is_generated_and_committed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let expected = hako_shared::openapi::Expected {
            routes: &[
                ("/v1/messages", "post"),
                ("/v1/chats/{jid}/media/{name}", "put"),
                ("/v1/chats/{jid}/messages", "get"),
                ("/v1/chats/{jid}/events", "get"),
                ("/v1/groups/{folder}", "put"),
                ("/v1/groups/{folder}", "get"),
                ("/v1/groups/{folder}", "delete"),
                ("/v1/groups", "get"),
                ("/v1/routes", "post"),
                ("/v1/routes", "get"),
                ("/v1/routes/{id}", "delete"),
                ("/v1/webhooks", "post"),
                ("/v1/webhooks", "get"),
                ("/v1/webhooks/{id}", "delete"),
                ("/v1/turns/{turn_id}", "get"),
                ("/v1/turns", "get"),
                ("/v1/usage", "get"),
                ("/v1/audit", "get"),
                ("/health", "get"),
                ("/ready", "get"),
                ("/metrics", "get"),
                ("/openapi.json", "get"),
            ],
            schemas: &[
                "PostMessage",
                "Posted",
                "MediaSaved",
                "MessageView",
                "GroupConfig",
                "TurnView",
                "UsageReport",
                "UsageRow",
                "ErrorBody",
            ],
            // Top-level modules and `api/`: `gateway/` serves the turn's `api.sock`, and `web/`
            // the page (not API: `specs/web.md`), not this API.
            sources: &["src", "src/api"],
        };
        hako_shared::openapi::check_document(&super::openapi(), dir, &expected).unwrap();
    }
}
