//! A `CONNECT` to a host a run's secrets are bound to: the proxy answers the box's TLS itself,
//! with a certificate for exactly that host from the install's CA (and nothing but HTTP/1.1
//! inside), reads each request, puts the values of the run's bound secrets in place of their
//! placeholders in its headers, and sends it on over its own TLS connection to the host,
//! verified against the system roots. The token is checked again before every request.
//!
//! A payload that is not TLS, a TLS name other than the `CONNECT`'s, a client that will only
//! speak h2: the connection is closed, nothing is relayed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use hako_shared::allowlist::TargetHost;
use hako_shared::auth::{Claims, now_secs};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::{LazyConfigAcceptor, TlsConnector};

use crate::broker::{Outcome, Refused, Store, Substituter, Toward, redact_answer};
use crate::policy::{Denial, Failure};
use crate::proxy::{Active, Body, Grant, Proxy, Target, Who, idle, now_ms, strip_hop_by_hop};
use crate::tls::{Ca, Roots};

/// What brokering needs: the CA that answers boxes, the roots targets are checked against,
/// the store of values, and what boxes are handed to trust.
pub struct Broker {
    /// The install's CA.
    pub ca: Ca,
    /// The roots of targets.
    pub roots: Roots,
    /// The values.
    pub store: Store,
    /// The system roots and the CA's certificate, PEM (`/v1/ca-bundle.pem`).
    pub bundle: String,
}

impl Broker {
    /// Loads (or, the first time, makes) the CA in `ca_dir`, and the roots.
    pub fn load(cfg: &crate::config::BrokerConfig) -> Result<Self, crate::tls::TlsError> {
        let ca = Ca::load_or_create(&cfg.ca_dir)?;
        let roots = Roots::load(&cfg.system_roots, cfg.extra_roots.as_deref())?;
        let bundle = roots.bundle(&ca);
        Ok(Self {
            ca,
            roots,
            store: Store::new(&cfg.secrets_dir),
            bundle,
        })
    }
}

/// One intercepted client connection: its token's claims, its target, its connection to the
/// target (opened on the first request, again when the target closed it).
struct Session {
    proxy: Arc<Proxy>,
    claims: Arc<Claims>,
    target: Target,
    host: String,
    shown: String,
    last: Arc<AtomicU64>,
    cancel: tokio_util::sync::CancellationToken,
    upstream: tokio::sync::Mutex<Upstream>,
}

struct Upstream {
    /// The connection `authorize` opened, for the first request.
    first: Option<TcpStream>,
    /// The addresses `authorize` checked, for the next connections (no second lookup).
    addrs: Vec<SocketAddr>,
    sender: Option<hyper::client::conn::http1::SendRequest<Incoming>>,
}

impl Proxy {
    /// Serves a `CONNECT` to a bound host (see the module's doc). `hold` keeps the client
    /// connection's place meanwhile.
    pub(crate) async fn intercept(
        self: Arc<Self>,
        on_upgrade: hyper::upgrade::OnUpgrade,
        g: Grant,
        target: Target,
        shown: String,
    ) {
        let Some(broker) = self.broker.as_ref() else {
            return;
        };
        let TargetHost::Name(host) = &target.host else {
            return;
        };
        let host = host.clone();
        let Grant {
            claims,
            slot,
            stream,
            addrs,
        } = g;
        let upgraded = match tokio::time::timeout(self.cfg.header_timeout, on_upgrade).await {
            Ok(Ok(u)) => u,
            _ => return,
        };
        let _open = self.metrics.tunnel_opened();
        let last = Arc::new(AtomicU64::new(now_ms()));
        let client = Active::with(TokioIo::new(upgraded), Arc::clone(&last));
        let who = Who::of(&claims);
        let closed = |why: &'static str, detail: &str| {
            self.metrics.closed(why).inc();
            tracing::info!(
                folder = who.folder.as_deref().unwrap_or("-"),
                run = who.run.as_deref().unwrap_or("-"),
                host = %shown,
                reason = why,
                detail,
                "egress interception closed"
            );
        };
        let accept = LazyConfigAcceptor::new(Default::default(), client);
        let start = match tokio::time::timeout(self.cfg.header_timeout, accept).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return closed("tls_handshake", &e.to_string()),
            Err(_) => return closed("tls_handshake", "no TLS hello in time"),
        };
        // The certificate is for the CONNECT's host: a TLS name other than it would be a way
        // to reach another site behind the same address with the run's values.
        if let Some(sni) = start.client_hello().server_name()
            && !sni.trim_end_matches('.').eq_ignore_ascii_case(&host)
        {
            return closed("sni_mismatch", sni);
        }
        let config = match broker.ca.server_config(&host) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(host = %shown, error = %e, "issuing a certificate failed");
                return closed("tls_handshake", "no certificate");
            }
        };
        let tls =
            match tokio::time::timeout(self.cfg.header_timeout, start.into_stream(config)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => return closed("tls_handshake", &e.to_string()),
                Err(_) => return closed("tls_handshake", "handshake not done in time"),
            };
        let session = Arc::new(Session {
            proxy: Arc::clone(&self),
            claims,
            target,
            host,
            shown: shown.clone(),
            last: Arc::clone(&last),
            cancel: slot.cancel.clone(),
            upstream: tokio::sync::Mutex::new(Upstream {
                first: Some(stream),
                addrs,
                sender: None,
            }),
        });
        let served = Arc::clone(&session);
        let service = hyper::service::service_fn(move |req| {
            let s = Arc::clone(&served);
            async move { Ok::<_, Infallible>(s.request(req).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.cfg.header_timeout)
            .keep_alive(true);
        let conn = builder.serve_connection(TokioIo::new(tls), service);
        let outcome = tokio::select! {
            r = conn => if r.is_ok() { "done" } else { "broken" },
            () = slot.cancel.cancelled() => slot.cut_reason().unwrap_or("cut"),
            () = idle(last, self.cfg.idle_timeout) => "idle",
        };
        self.metrics.closed(outcome).inc();
        if outcome != "done" && outcome != "broken" {
            closed(outcome, "");
        }
    }

    /// Counts and logs placeholders left unreplaced: run, folder, secret, host, never a
    /// value (the record an operator reads for leak attempts).
    pub(crate) fn record(&self, refused: &[Refused], who: &Who, shown: &str) {
        for r in refused {
            self.metrics.refused(r.reason).inc();
            tracing::warn!(
                folder = who.folder.as_deref().unwrap_or("-"),
                run = who.run.as_deref().unwrap_or("-"),
                host = %shown,
                secret = r.secret.as_ref().map_or("-", |s| s.as_str()),
                owner_run = r.owner_run.as_deref().unwrap_or("-"),
                place = %r.place,
                reason = r.reason.code(),
                "egress placeholder not replaced"
            );
        }
    }

    /// The view of placeholders for a request of `claims`.
    pub(crate) fn substituter<'a>(&'a self, claims: &'a Claims) -> Substituter<'a> {
        Substituter {
            claims: &claims.secrets,
            run: claims.run_id.as_deref(),
            known: &self.known,
            store: self.broker.as_ref().map(|b| &b.store),
        }
    }

    /// Remembers the placeholders of a verified token (to name another run's, seen later).
    pub(crate) fn learn(&self, claims: &Claims) {
        self.known.learn(claims.run_id.as_deref(), &claims.secrets);
    }
}

/// The connection to the target, acknowledging at once what it reads (`TCP_QUICKACK` after
/// every read). The proxy sends a request the moment its TLS handshake is done, before the
/// target's session tickets arrive; with a delayed acknowledgement for those, a target whose
/// answer waits for it (Nagle's algorithm) answered 40 ms late. A tunnel never meets this: the
/// box's request comes later and carries the acknowledgement.
struct QuickAck(TcpStream);

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = std::pin::Pin::new(&mut self.0).poll_read(cx, buf);
        if matches!(r, std::task::Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let _ = rustix::net::sockopt::set_tcp_quickack(&self.0, true);
        }
        r
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl Session {
    fn who(&self) -> Who {
        Who::of(&self.claims)
    }

    async fn request(&self, req: Request<Incoming>) -> Response<Body> {
        let p = &self.proxy;
        // The token again: a run that ended (revoked) or expired gets nothing more, least of
        // all a value.
        if let Some(d) = p.denial_now(&self.claims, now_secs()) {
            return p.deny(d, &self.shown, &self.who(), None);
        }
        if req.method() == hyper::Method::TRACE || req.method().as_str() == "TRACK" {
            return p.deny(Denial::TraceRefused, &self.shown, &self.who(), None);
        }
        let (mut parts, body) = req.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();
        strip_hop_by_hop(&mut parts.headers);
        // `Host` is the intercepted host, whatever the client wrote.
        parts.headers.remove(header::HOST);
        let to = Toward {
            host: &self.target.host,
            port: self.target.port,
            tls: true,
        };
        let outcome: Outcome =
            match p
                .substituter(&self.claims)
                .substitute(&mut parts.headers, &path, to)
            {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(
                        folder = self.claims.folder.as_deref().unwrap_or("-"),
                        run = self.claims.run_id.as_deref().unwrap_or("-"),
                        host = %self.shown,
                        error = %e,
                        "a bound secret cannot be used"
                    );
                    return p.deny(Denial::SecretUnavailable, &self.shown, &self.who(), None);
                }
            };
        p.record(&outcome.refused, &self.who(), &self.shown);
        for (name, ..) in &outcome.replaced {
            p.metrics.replaced().inc();
            tracing::debug!(
                folder = self.claims.folder.as_deref().unwrap_or("-"),
                run = self.claims.run_id.as_deref().unwrap_or("-"),
                host = %self.shown,
                secret = name.as_str(),
                "egress secret put on the wire"
            );
        }
        let authority = if self.target.port == 443 {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.target.port)
        };
        let (Ok(uri), Ok(host)) = (path.parse::<Uri>(), HeaderValue::from_str(&authority)) else {
            return p.deny(Denial::BadRequest, &self.shown, &self.who(), None);
        };
        parts.uri = uri;
        parts.headers.insert(header::HOST, host);
        parts.version = hyper::Version::HTTP_11;
        let upstream_req = Request::from_parts(parts, body);
        let mut up = self.upstream.lock().await;
        let sender = match self.ready(&mut up).await {
            Ok(s) => s,
            Err(f) => return p.fail(f, &self.shown, &self.who()),
        };
        match tokio::time::timeout(p.cfg.idle_timeout, sender.send_request(upstream_req)).await {
            Ok(Ok(mut resp)) => {
                strip_hop_by_hop(resp.headers_mut());
                redact_answer(resp.headers_mut(), &outcome.replaced);
                resp.map(Either::Left)
            }
            _ => {
                up.sender = None;
                p.fail(Failure::Upstream, &self.shown, &self.who())
            }
        }
    }

    /// A sender on a live TLS connection to the target: the one open, else a new one (the
    /// first request takes the connection `authorize` opened).
    async fn ready<'u>(
        &self,
        up: &'u mut Upstream,
    ) -> Result<&'u mut hyper::client::conn::http1::SendRequest<Incoming>, Failure> {
        let p = &self.proxy;
        let alive = match up.sender.as_mut() {
            Some(s) => s.ready().await.is_ok(),
            None => false,
        };
        if !alive {
            up.sender = None;
            let tcp = match up.first.take() {
                Some(t) => t,
                None => p.connect(&up.addrs).await.ok_or(Failure::Connect)?,
            };
            let broker = p.broker.as_ref().ok_or(Failure::Tls)?;
            let name = ServerName::try_from(self.host.clone()).map_err(|_| Failure::Tls)?;
            let io = Active::with(QuickAck(tcp), Arc::clone(&self.last));
            let tls = match tokio::time::timeout(
                p.cfg.connect_timeout,
                TlsConnector::from(broker.roots.client()).connect(name, io),
            )
            .await
            {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::info!(host = %self.shown, error = %e, "TLS to the target failed");
                    return Err(Failure::Tls);
                }
                Err(_) => return Err(Failure::Tls),
            };
            let (sender, conn) = hyper::client::conn::http1::Builder::new()
                .handshake::<_, Incoming>(TokioIo::new(tls))
                .await
                .map_err(|_| Failure::Upstream)?;
            let cancel = self.cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = conn => {}
                    () = cancel.cancelled() => {}
                }
            });
            up.sender = Some(sender);
        }
        up.sender.as_mut().ok_or(Failure::Upstream)
    }
}
