//! hako-egress: the egress proxy of `allowlist` groups (`specs/egress.md`).
//!
//! An HTTP/1.1 forward proxy: `CONNECT host:port` for TLS (relayed untouched, except toward
//! the hosts a run's brokered secrets are bound to, where the proxy answers the TLS itself with
//! a certificate of the install's CA and puts the secrets' values in place of the run's
//! placeholders: `intercept`) and absolute `http://` URLs for plain HTTP. The credentials are the run's
//! spawn token (proxy basic auth or `Proxy-Authorization: Bearer`), checked with the shared
//! offline verifier (EdDSA, expiry, authd's revocation list); the allowed targets are exactly
//! the token's `egress` claim. Everything else is refused, counted and logged (folder, run and
//! host, never the token). It fails closed: no token, a bad, expired or revoked token, a host
//! not named, a name that resolves only to private addresses, authd's keys or revocation list
//! out of reach: refused.
//!
//! `main.rs` only reads the environment and calls [`start`], so tests run the real proxy
//! in-process.

#![warn(missing_docs)]

pub mod broker;
pub mod config;
pub mod intercept;
pub mod metrics;
pub mod policy;
mod proxy;
pub mod sessions;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hako_shared::auth::{Verifier, now_secs};
use hako_shared::http::{ApiInfo, Ops};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use config::{Cidr, Config};
use intercept::Broker;
use metrics::ProxyMetrics;
use proxy::Proxy;
use sessions::Sessions;

/// The admin listener's name in `/health` and its OpenAPI document.
pub const INFO: ApiInfo = ApiInfo {
    name: "hako-egress",
    version: env!("CARGO_PKG_VERSION"),
    description: "hako's egress proxy: its ops routes (the proxy itself listens on its own port)",
};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The verifier could not be built (a bad `AUTHD_URL`).
    #[error("authd: {0}")]
    Auth(#[from] hako_shared::auth::ClientError),
    /// The CA or the roots of brokered secrets could not be loaded or made.
    #[error("brokered secrets: {0}")]
    Tls(#[from] tls::TlsError),
}

/// A running proxy. [`Running::shutdown`] stops it; dropping it does too.
pub struct Running {
    proxy_addr: SocketAddr,
    admin_addr: SocketAddr,
    proxy: Arc<Proxy>,
    stops: Vec<oneshot::Sender<()>>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("proxy", &self.proxy_addr)
            .field("admin", &self.admin_addr)
            .finish()
    }
}

impl Running {
    /// Where the proxy listens.
    pub fn proxy_addr(&self) -> SocketAddr {
        self.proxy_addr
    }

    /// Where `/health`, `/ready` and `/metrics` are served.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// The metrics registry (what `/metrics` renders).
    pub fn metrics(&self) -> &hako_shared::metrics::Metrics {
        &self.proxy.metrics.registry
    }

    /// Connections to targets open now (tunnels and forwarded requests).
    pub fn open_connections(&self) -> usize {
        self.proxy.sessions.open()
    }

    /// Stops accepting and ends every task (tunnels included).
    pub async fn shutdown(mut self) {
        for s in self.stops.drain(..) {
            let _ = s.send(());
        }
        for t in self.tasks.drain(..) {
            if tokio::time::timeout(Duration::from_secs(2), &mut *Box::pin(t))
                .await
                .is_err()
            {
                tracing::debug!("a task did not stop in time");
            }
        }
        self.proxy.sessions.sweep(|_| Some("shutdown"));
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        self.proxy.sessions.sweep(|_| Some("shutdown"));
    }
}

/// Binds `cfg.listen` and `cfg.admin_listen`, then [`start`]s.
pub async fn bind_and_start(cfg: Config) -> Result<Running, StartError> {
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Listen { addr, source })
    };
    let proxy = bind(cfg.listen).await?;
    let admin = bind(cfg.admin_listen).await?;
    start(cfg, proxy, admin).await
}

/// Starts the proxy on `proxy_listener` and its ops routes on `admin_listener`. Requests are
/// refused (`verifier_unavailable`) until authd's revocation list has been fetched once.
pub async fn start(
    cfg: Config,
    proxy_listener: tokio::net::TcpListener,
    admin_listener: tokio::net::TcpListener,
) -> Result<Running, StartError> {
    let addr_of =
        |l: &tokio::net::TcpListener, fallback: SocketAddr| l.local_addr().unwrap_or(fallback);
    let proxy_addr = addr_of(&proxy_listener, cfg.listen);
    let admin_addr = addr_of(&admin_listener, cfg.admin_listen);
    let verifier = Verifier::new(cfg.verifier.clone())?;
    let broker = cfg.broker.as_ref().map(Broker::load).transpose()?;
    let bundle: Option<Arc<str>> = broker.as_ref().map(|b| b.bundle.as_str().into());
    let proxy = Arc::new(Proxy {
        sessions: Sessions::new(cfg.max_per_token),
        metrics: ProxyMetrics::new(),
        dns: Default::default(),
        verifier,
        broker,
        known: Default::default(),
        cfg,
    });
    let (proxy_stop, proxy_stopped) = oneshot::channel::<()>();
    let (admin_stop, admin_stopped) = oneshot::channel::<()>();
    let ready_proxy = Arc::downgrade(&proxy);
    let ops = Ops {
        info: INFO,
        metrics: proxy.metrics.registry.clone(),
        ready: Arc::new(move || {
            let p = ready_proxy.clone();
            Box::pin(async move {
                let p = p.upgrade().ok_or("the proxy is stopping")?;
                match p.verifier.revocations_age() {
                    Some(age) if age <= p.cfg.revocation_max_age => Ok(()),
                    Some(age) => Err(format!(
                        "authd: the revocation list is {}s old (EGRESS_REVOCATION_MAX_AGE {}s): every request is refused",
                        age.as_secs(),
                        p.cfg.revocation_max_age.as_secs()
                    )),
                    None => Err(
                        "authd: no revocation list fetched yet: every request is refused".into(),
                    ),
                }
            })
        }),
    };
    let api = hako_shared::http::api_router(INFO)
        .routes(utoipa_axum::routes!(ca_bundle))
        .layer(axum::Extension(CaBundle(bundle)));
    let (router, _doc) = hako_shared::http::daemon_router(api, ops, 64 << 10);
    let admin = tokio::spawn(async move {
        let r = hako_shared::http::serve(admin_listener, router, async move {
            let _ = admin_stopped.await;
        })
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "the admin listener failed");
        }
    });
    let serving = tokio::spawn(proxy::serve(
        Arc::clone(&proxy),
        proxy_listener,
        async move {
            let _ = proxy_stopped.await;
        },
    ));
    let sweeper = tokio::spawn(sweep_loop(Arc::downgrade(&proxy)));
    tracing::info!(
        proxy = %proxy_addr,
        admin = %admin_addr,
        private_targets = ?proxy.cfg.private_targets.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "egress proxy listening"
    );
    Ok(Running {
        proxy_addr,
        admin_addr,
        proxy,
        stops: vec![proxy_stop, admin_stop],
        tasks: vec![serving, admin, sweeper],
    })
}

/// What boxes trust, when the proxy brokers secrets.
#[derive(Clone)]
struct CaBundle(Option<Arc<str>>);

/// The system roots and the install's CA certificate (PEM): what a box whose run has brokered
/// secrets trusts (runed fetches it and mounts it read-only). Public; 404 when this proxy
/// brokers no secrets.
#[utoipa::path(
    get,
    path = "/v1/ca-bundle.pem",
    tag = "egress",
    responses(
        (status = 200, description = "PEM certificates", content_type = "application/x-pem-file", body = String),
        (status = 404, description = "`not_found`: no brokered secrets here", body = hako_shared::http::ErrorBody),
    )
)]
async fn ca_bundle(
    axum::Extension(CaBundle(bundle)): axum::Extension<CaBundle>,
) -> Result<axum::response::Response, hako_shared::http::ApiError> {
    use axum::response::IntoResponse as _;
    let Some(b) = bundle else {
        return Err(hako_shared::http::ApiError::not_found(
            "this egress proxy brokers no secrets (EGRESS_SECRETS_DIR, EGRESS_CA_DIR)",
        ));
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-pem-file")],
        b.to_string(),
    )
        .into_response())
}

/// Every `recheck`, cuts the live connections of tokens that were revoked, expired, or can
/// no longer be checked.
async fn sweep_loop(proxy: std::sync::Weak<Proxy>) {
    let every = match proxy.upgrade() {
        Some(p) => p.cfg.recheck,
        None => return,
    };
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(p) = proxy.upgrade() else { return };
        let now = now_secs();
        for (why, n) in p.sessions.sweep(|c| p.verdict(c, now)) {
            tracing::info!(
                reason = why,
                connections = n,
                "cutting a token's live egress connections"
            );
        }
    }
}
