//! Serving: connection bounds, header timeouts, graceful shutdown, the container healthcheck.

use std::future::Future;
use std::sync::Arc;

use axum::Router;

/// Bounds on the connections a daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; at the bound no more are accepted (they wait in the
    /// kernel's backlog) until one closes.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers; it also closes a keep-alive
    /// connection left idle that long.
    pub header_timeout: std::time::Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_timeout: std::time::Duration::from_secs(10),
        }
    }
}

impl ServeLimits {
    /// From `HAKO_MAX_CONNECTIONS` (1024) and `HAKO_HEADER_TIMEOUT` (10s).
    pub fn from_env(env: &crate::config::Env) -> Result<Self, crate::config::ConfigError> {
        let d = Self::default();
        let l = Self {
            max_connections: env.parse_or("HAKO_MAX_CONNECTIONS", d.max_connections)?,
            header_timeout: env.duration_or("HAKO_HEADER_TIMEOUT", d.header_timeout)?,
        };
        if l.max_connections == 0 {
            return Err(crate::config::ConfigError::Invalid {
                var: "HAKO_MAX_CONNECTIONS".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if l.header_timeout.is_zero() {
            return Err(crate::config::ConfigError::Invalid {
                var: "HAKO_HEADER_TIMEOUT".into(),
                value: "0".into(),
                reason: "must be more than 0".into(),
            });
        }
        Ok(l)
    }
}

/// Where the serve loop takes connections from: a TCP listener (the daemons' APIs) or a unix
/// socket (the per-turn gateway).
pub trait Listener: Send + 'static {
    /// A connection.
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    fn accept_io(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        let (stream, _) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        Ok(self.accept().await?.0)
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, with the default limits.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, ServeLimits::default()).await
}

/// How long hako's HTTP clients keep an idle connection to a hako daemon for reuse: well
/// under the daemons' idle close (`HAKO_HEADER_TIMEOUT`, 10 s by default), so a client never
/// sends on a connection the daemon is closing at that moment ("error sending request": a
/// CLI command failed that way after a restart left its pooled connection idle for 10-30 s).
pub const CLIENT_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// Serves `router` on `listener` until `shutdown` resolves: HTTP/1.1, at most
/// `limits.max_connections` at once, each closed when a request's headers (or the next
/// request on a kept-alive connection) take longer than `limits.header_timeout`. On
/// shutdown it stops accepting and lets each connection finish its request in flight.
pub async fn serve_with(
    listener: impl Listener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ServeLimits,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept_io() => match r {
                Ok(c) => c,
                // Out of file descriptors and the like: wait a little instead of spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection closed with an error");
                    }
                    return;
                }
                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it is done: all slots back means all done.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// `<daemon> health`: the container healthcheck of a `FROM scratch` image (no shell, no curl).
/// Asks the daemon's own `/ready` on loopback, at the port of the first of `listen_vars` that
/// is set (else `default`), and answers the exit code: 0 when ready, 1 otherwise (what did
/// not answer is printed).
pub fn health_check(listen_vars: &[&str], default: &str) -> std::process::ExitCode {
    use std::io::{Read as _, Write as _};
    let addr = listen_vars
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| default.to_owned());
    let mut addr: std::net::SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            println!("unhealthy: listen address {addr:?}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let t = std::time::Duration::from_secs(5);
    let answer = (|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, t)?;
        s.set_read_timeout(Some(t))?;
        s.set_write_timeout(Some(t))?;
        s.write_all(b"GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut buf = Vec::new();
        s.take(64 << 10).read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    })();
    match answer {
        Ok(a) if a.starts_with("HTTP/1.1 200") || a.starts_with("HTTP/1.0 200") => {
            println!("ready");
            std::process::ExitCode::SUCCESS
        }
        Ok(a) => {
            let body = a.split("\r\n\r\n").nth(1).unwrap_or("").trim();
            println!("unhealthy: {} {body}", a.lines().next().unwrap_or(""));
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            println!("unhealthy: {addr}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// A daemon's HTTP server and its background tasks, as the daemon's `start` hands them back:
/// [`Served::stop_server`] stops the server gracefully, [`Served::abort_tasks`] ends the
/// tasks, and dropping it aborts both. The one handle inside authd's, runed's and routd's
/// `Running`.
pub struct Served {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    tasks: Vec<tokio::task::AbortHandle>,
    stopping: Option<tokio_util::sync::CancellationToken>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served").field("addr", &self.addr).finish()
    }
}

impl Served {
    /// Serves `router` on `listener` (as [`serve_with`]) in a task of its own; `tasks` are the
    /// daemon's background tasks, ended with it.
    pub fn spawn(
        listener: tokio::net::TcpListener,
        router: Router,
        limits: ServeLimits,
        tasks: impl IntoIterator<Item = tokio::task::AbortHandle>,
    ) -> std::io::Result<Self> {
        let addr = listener.local_addr()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_with(
            listener,
            router,
            async move {
                let _ = stopped.await;
            },
            limits,
        ));
        Ok(Self {
            addr,
            stop: Some(stop),
            server: Some(server),
            tasks: tasks.into_iter().collect(),
            stopping: None,
        })
    }

    /// `token` is cancelled when the daemon stops (shutdown or drop): the daemon's own work
    /// (turns, runs, streams) watches it, so no handle cancels it by hand.
    pub fn stopping(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        self.stopping = Some(token);
        self
    }

    /// Stops the daemon: [`Served::stop_server`], then [`Served::abort_tasks`].
    pub async fn shutdown(mut self, grace: std::time::Duration) -> std::io::Result<()> {
        let result = self.stop_server(grace).await;
        self.abort_tasks();
        result
    }

    /// The address the server listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cancels the stopping token, stops accepting and gives the requests in flight up to
    /// `grace`, then aborts the server.
    /// Answers the server's own result (a server aborted after the grace is not an error).
    pub async fn stop_server(&mut self, grace: std::time::Duration) -> std::io::Result<()> {
        if let Some(t) = &self.stopping {
            t.cancel();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let Some(mut h) = self.server.take() else {
            return Ok(());
        };
        match tokio::time::timeout(grace, &mut h).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(std::io::Error::other(join)),
            Err(_) => {
                h.abort();
                Ok(())
            }
        }
    }

    /// Ends the background tasks.
    pub fn abort_tasks(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(t) = &self.stopping {
            t.cancel();
        }
        if let Some(h) = self.server.take() {
            h.abort();
        }
        self.abort_tasks();
    }
}
