//! authd: hako's token authority, the only signer.
//!
//! It keeps Ed25519 signing keys in `authd.db`, exchanges daemons' service keys for service
//! tokens, mints downscoped child tokens, revokes tokens, rotates keys, and records all of it
//! (and every denial) in an audit log. Every other daemon verifies its tokens offline with
//! `hako_shared::auth::Verifier`. The library is the daemon; `main.rs` only reads the
//! environment and calls [`start`], so tests run a real authd in-process:
//!
//! ```no_run
//! # async fn demo(cfg: hako_authd::Config) -> Result<(), hako_authd::StartError> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! let authd = hako_authd::start(cfg, listener).await?;
//! println!("authd at {}", authd.url());
//! authd.shutdown().await?;
//! # Ok(()) }
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hako_shared::auth::{Signer, Verifier, now_secs};
use hako_shared::http::{Ops, Served, daemon_router};
use hako_shared::metrics::Metrics;

pub mod config;
pub mod error;
pub mod jti;
pub mod keys;
pub mod mint;
mod server;
pub mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::Config;

use keys::{KeyRing, Retiring};
use server::{AppState, Counters};
use store::{AuditRow, IssuedScan, Store, StoreError};

/// authd's OpenAPI document.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// authd's OpenAPI document, generated from its handlers and wire types.
pub fn openapi() -> utoipa::openapi::OpenApi {
    hako_shared::http::document(server::documented())
}
/// Request bodies larger than this are refused with 413.
pub const BODY_LIMIT: usize = 64 * 1024;
/// How often expired rows are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(600);
/// How long shutdown waits for in-flight requests.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Why authd could not start or stop cleanly.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A file or directory problem.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The operating system gave no randomness for a key.
    #[error("cannot generate a signing key: {0}")]
    Random(String),
    /// The listener failed.
    #[error("listener: {0}")]
    Listener(std::io::Error),
}

/// A running authd. Dropping it aborts the server; [`Running::shutdown`] stops it gracefully.
pub struct Running {
    served: Served,
    metrics: Metrics,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running")
            .field("addr", &self.addr())
            .finish()
    }
}

impl Running {
    /// The address authd listens on.
    pub fn addr(&self) -> SocketAddr {
        self.served.addr()
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        self.served.url()
    }

    /// authd's metrics registry (what `/metrics` renders).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Stops accepting, lets in-flight requests finish (up to a grace period), then stops.
    pub async fn shutdown(self) -> Result<(), StartError> {
        self.served
            .shutdown(SHUTDOWN_GRACE)
            .await
            .map_err(StartError::Listener)
    }
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let io = |source| StartError::Io {
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io)?;
    let mode = std::fs::metadata(dir).map_err(io)?.permissions().mode();
    if mode & 0o077 != 0 {
        tracing::warn!(
            dir = %dir.display(),
            mode = format!("{:o}", mode & 0o777),
            "DATA_DIR is readable by other users; authd.db itself stays 0600, but 0700 is advised"
        );
    }
    Ok(())
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> Result<(), StartError> {
    std::fs::create_dir_all(dir).map_err(|source| StartError::Io {
        path: dir.to_owned(),
        source,
    })
}

/// `authd.db` (and its WAL files) must be 0600 even if someone loosened them.
#[cfg(unix)]
fn tighten_db_files(db: &Path) -> Result<(), StartError> {
    use std::os::unix::fs::PermissionsExt;
    for suffix in ["", "-wal", "-shm"] {
        let mut p = db.as_os_str().to_owned();
        p.push(suffix);
        let p = PathBuf::from(p);
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.permissions().mode() & 0o077 != 0 {
            tracing::warn!(file = %p.display(), "tightening permissions to 0600");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).map_err(
                |source| StartError::Io {
                    path: p.clone(),
                    source,
                },
            )?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn tighten_db_files(_: &Path) -> Result<(), StartError> {
    Ok(())
}

/// Loads the key ring (creating the first key on a new database) and teaches `verifier` every
/// key that still verifies.
async fn load_keys(store: &Store, verifier: &Verifier) -> Result<KeyRing, StartError> {
    let now = now_secs();
    let mut active: Option<Signer> = None;
    let mut retiring = Vec::new();
    for k in store.load_keys(now).await? {
        let signer = Signer::from_secret(&k.secret);
        if signer.kid() != k.kid {
            return Err(
                StoreError::Corrupt(format!("key {} does not match its secret", k.kid)).into(),
            );
        }
        verifier.insert_key(signer.kid(), signer.verifying_key(), k.drop_after);
        match k.drop_after {
            None if active.is_none() => active = Some(signer),
            None => {
                return Err(StoreError::Corrupt("more than one active key".into()).into());
            }
            Some(drop_at) => retiring.push(Retiring {
                jwk: signer.jwk(),
                drop_at,
            }),
        }
    }
    let active = match active {
        Some(a) => a,
        None => {
            let s = Signer::generate().map_err(|e| StartError::Random(e.to_string()))?;
            let audit = AuditRow {
                at_ms: now.saturating_mul(1000),
                actor: "authd".into(),
                actor_jti: None,
                action: hako_shared::audit::AuditAction::KeyCreate,
                outcome: hako_shared::audit::AuditOutcome::Ok.as_str().into(),
                detail: format!("kid={}", s.kid()),
                request_id: None,
            };
            store
                .insert_active_key(s.kid().to_owned(), s.secret_bytes(), now, audit)
                .await?;
            verifier.insert_key(s.kid(), s.verifying_key(), None);
            tracing::info!(kid = %s.kid(), "created the first signing key");
            s
        }
    };
    Ok(KeyRing {
        active: Arc::new(active),
        retiring,
    })
}

/// Starts authd on `listener`: opens (creating and migrating) `DATA_DIR/authd.db`, loads or
/// creates the signing key, and serves until [`Running::shutdown`] or drop.
pub async fn start(
    config: Config,
    listener: tokio::net::TcpListener,
) -> Result<Running, StartError> {
    let addr = listener.local_addr().map_err(StartError::Listener)?;
    create_private_dir(&config.data_dir)?;
    let db_path = config.data_dir.join("authd.db");
    let metrics = Metrics::default();
    let batch_sizes = metrics.histogram(
        "authd_commit_batch_requests",
        "Requests per group commit.",
        &[],
        &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
    );
    let store = Store::open(&db_path, batch_sizes).await?;
    tighten_db_files(&db_path)?;

    let verifier = Verifier::local(config.issuer.clone(), config.clock_skew);
    let ring = load_keys(&store, &verifier).await?;
    for e in store.revoked(now_secs()).await? {
        verifier.mark_revoked(&e.jti, e.exp);
    }
    store
        .prune(
            now_secs(),
            config.clock_skew,
            config.audit_retention,
            IssuedScan::All,
        )
        .await?;
    tracing::info!(
        kid = %ring.active.kid(),
        daemons = ?config.service_keys,
        issuer = %config.issuer,
        "authd keys loaded"
    );

    let serve_limits = config.serve;
    let app = Arc::new(AppState {
        counters: Counters::new(&metrics),
        cfg: config,
        verifier,
        keys: RwLock::new(ring),
        store: store.clone(),
        metrics: metrics.clone(),
        rotate_lock: tokio::sync::Mutex::new(()),
    });

    let ready_store = store.clone();
    let ops = Ops {
        info: server::INFO,
        metrics: metrics.clone(),
        ready: Arc::new(move || {
            let s = ready_store.clone();
            Box::pin(async move { s.ping().await.map_err(|e| format!("authd.db: {e}")) })
        }),
    };
    let (router, _doc) = daemon_router(
        server::documented().with_state(app.clone()),
        ops,
        BODY_LIMIT,
    );

    let prune_app = Arc::downgrade(&app);
    drop(app);
    let pruner = tokio::spawn(async move {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(app) = prune_app.upgrade() else {
                return;
            };
            if let Err(e) = app
                .store
                .prune(
                    now_secs(),
                    app.cfg.clock_skew,
                    app.cfg.audit_retention,
                    IssuedScan::OlderThan(app.cfg.rotation_window()),
                )
                .await
            {
                tracing::warn!(error = %e, "pruning authd.db failed");
            }
        }
    });

    let served = Served::spawn(listener, router, serve_limits, [pruner.abort_handle()])
        .map_err(StartError::Listener)?;
    tracing::info!(%addr, "authd listening");
    Ok(Running { served, metrics })
}

#[cfg(test)]
mod openapi_tests {
    /// The committed document is what the code generates (HAKO_BLESS=1 rewrites it), every
    /// route is in it with real schemas, and no route is mounted outside it.
    #[test]
    fn the_openapi_document_is_generated_and_committed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let expected = hako_shared::openapi::Expected {
            routes: &[
                ("/v1/keys", "get"),
                ("/v1/keys/rotate", "post"),
                ("/v1/service-token", "post"),
                ("/v1/tokens", "post"),
                ("/v1/tokens/{jti}", "delete"),
                ("/v1/revoked", "get"),
                ("/v1/audit", "get"),
                ("/health", "get"),
                ("/ready", "get"),
                ("/metrics", "get"),
                ("/openapi.json", "get"),
            ],
            schemas: &[
                "MintRequest",
                "MintResponse",
                "Jwks",
                "AuditList",
                "ErrorBody",
            ],
            sources: &["src"],
        };
        hako_shared::openapi::check_document(&super::openapi(), dir, &expected).unwrap();
    }
}
