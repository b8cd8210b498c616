//! The proxy itself: one hyper HTTP/1.1 connection per client, each request either a
//! `CONNECT host:port` (answered 200, then the bytes are relayed both ways untouched, unless
//! the run's brokered secrets are bound to that host: then `intercept`) or an absolute
//! `http://` URL (forwarded on a fresh connection to the target, `Proxy-*` and hop-by-hop
//! headers removed, placeholders never replaced). Every request is authorised on its own
//! (token, allowlist, addresses) before the proxy opens anything toward the target.

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hako_shared::allowlist::{self, EgressRule, TargetHost};
use hako_shared::auth::{AuthError, Claims, TokenType, Verifier, scopes};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::broker::{Known, Toward};
use crate::config::Config;
use crate::intercept::Broker;
use crate::metrics::ProxyMetrics;
use crate::policy::{self, Denial, Failure};
use crate::sessions::{Sessions, Slot};

/// What the proxy answers with: the target's body, or one of its own.
pub type Body = Either<Incoming, Full<Bytes>>;

/// The proxy's shared state.
pub struct Proxy {
    pub(crate) cfg: Config,
    pub(crate) verifier: Verifier,
    pub(crate) sessions: Sessions,
    pub(crate) metrics: ProxyMetrics,
    pub(crate) dns: DnsCache,
    /// Brokered secrets (none: bound hosts are refused).
    pub(crate) broker: Option<Broker>,
    /// Placeholders seen in verified tokens.
    pub(crate) known: Known,
}

/// Most names remembered (full: forgotten all at once, O(1) amortised).
const DNS_CACHE_CAP: usize = 1024;

/// Names resolved in the last `EGRESS_DNS_CACHE`: what a lookup answered, not a verdict
/// (every use checks the addresses again), so a short memory cannot let anything new through.
#[derive(Default)]
pub struct DnsCache {
    map: std::sync::Mutex<std::collections::HashMap<(String, u16), Resolved>>,
}

/// When a name was resolved, and to what.
type Resolved = (Instant, Vec<SocketAddr>);

impl DnsCache {
    fn get(&self, name: &str, port: u16, ttl: Duration) -> Option<Vec<SocketAddr>> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let (at, addrs) = map.get(&(name.to_owned(), port))?;
        (at.elapsed() < ttl).then(|| addrs.clone())
    }

    fn put(&self, name: &str, port: u16, addrs: &[SocketAddr]) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= DNS_CACHE_CAP {
            map.clear();
        }
        map.insert((name.to_owned(), port), (Instant::now(), addrs.to_vec()));
    }
}

/// A request's target.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) host: TargetHost,
    pub(crate) port: u16,
}

/// Who asked: for the deny log (never the token).
#[derive(Default)]
pub(crate) struct Who {
    pub(crate) folder: Option<String>,
    pub(crate) run: Option<String>,
}

impl Who {
    pub(crate) fn of(c: &Claims) -> Self {
        Self {
            folder: c.folder.clone(),
            run: c.run_id.clone(),
        }
    }
}

/// A permitted request, ready to go.
pub(crate) struct Grant {
    pub(crate) claims: Arc<Claims>,
    pub(crate) slot: Slot,
    pub(crate) stream: TcpStream,
    /// The addresses checked for the target (a later connection goes to these, never to a
    /// second lookup's).
    pub(crate) addrs: Vec<SocketAddr>,
}

enum Refusal {
    Denied(Denial, Who),
    Failed(Failure, Who),
}

impl Proxy {
    /// Answers one request of a client connection. `hold` keeps the client connection's place
    /// in the global bound for as long as a tunnel made from it lives.
    pub async fn handle(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        peer: SocketAddr,
        hold: Arc<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<Response<Body>, Infallible> {
        let connect = req.method() == Method::CONNECT;
        let target = match target_of(&req) {
            Some(t) => t,
            None => {
                let shown = req.uri().to_string();
                return Ok(self.deny(Denial::BadRequest, &shown, &Who::default(), peer));
            }
        };
        let shown = format!("{}:{}", target.host, target.port);
        let grant = match self.authorize(req.headers(), &target).await {
            Ok(g) => g,
            Err(Refusal::Denied(d, who)) => return Ok(self.deny(d, &shown, &who, peer)),
            Err(Refusal::Failed(f, who)) => return Ok(self.fail(f, &shown, &who)),
        };
        // A run whose secrets are bound to this host: the proxy answers its TLS and puts the
        // values in; never a plain tunnel, which would carry the placeholders through unseen.
        let bound = connect
            && grant
                .claims
                .secrets
                .iter()
                .any(|s| s.bound_to(&target.host, target.port));
        if bound && self.broker.is_none() {
            let who = Who::of(&grant.claims);
            return Ok(self.deny(Denial::BrokerUnavailable, &shown, &who, peer));
        }
        let kind = match (connect, bound) {
            (true, true) => "intercept",
            (true, false) => "connect",
            (false, _) => "http",
        };
        self.metrics.allowed(kind).inc();
        tracing::debug!(
            folder = grant.claims.folder.as_deref().unwrap_or("-"),
            run = grant.claims.run_id.as_deref().unwrap_or("-"),
            host = %shown,
            kind,
            "egress allowed"
        );
        if connect {
            let on_upgrade = hyper::upgrade::on(&mut req);
            let this = Arc::clone(&self);
            tokio::spawn(async move {
                let _hold = hold;
                if bound {
                    this.intercept(on_upgrade, grant, target, shown).await;
                } else {
                    this.tunnel(on_upgrade, grant, shown).await;
                }
            });
            return Ok(Response::new(Either::Right(Full::new(Bytes::new()))));
        }
        Ok(self.forward(req, grant, &target, &shown).await)
    }

    async fn authorize(&self, headers: &HeaderMap, target: &Target) -> Result<Grant, Refusal> {
        let denied = |d, who| Err(Refusal::Denied(d, who));
        let token = match policy::token_of(headers) {
            Ok(Some(t)) => t,
            Ok(None) => return denied(Denial::NoToken, Who::default()),
            Err(_) => return denied(Denial::BadToken, Who::default()),
        };
        // Without a fresh revocation list a revoked token would pass: refuse everything.
        if !self.revocations_fresh() {
            return denied(Denial::VerifierUnavailable, Who::default());
        }
        let claims = match self.verifier.verify(&token).await {
            Ok(c) => c,
            Err(e) => {
                let d = match e {
                    AuthError::Expired => Denial::Expired,
                    AuthError::Revoked => Denial::Revoked,
                    AuthError::Unavailable(_) => Denial::VerifierUnavailable,
                    _ => Denial::BadToken,
                };
                return denied(d, Who::default());
            }
        };
        drop(token);
        self.learn(&claims);
        let who = Who::of(&claims);
        if claims.typ != TokenType::Spawn || !claims.has_scope(scopes::EGRESS_CONNECT) {
            return denied(Denial::NotForEgress, who);
        }
        let Some(rule) = allowlist::allowing(
            claims.egress.iter().map(String::as_str),
            &target.host,
            target.port,
        ) else {
            return denied(Denial::HostNotAllowed, who);
        };
        let Some(slot) = self.sessions.acquire(&claims) else {
            return denied(Denial::TooManyConnections, who);
        };
        let addrs = match self.resolve(target).await {
            Some(a) if !a.is_empty() => a,
            _ => return Err(Refusal::Failed(Failure::Resolve, who)),
        };
        let permitted: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| permitted(a.ip(), &rule, &self.cfg))
            .collect();
        if permitted.is_empty() {
            return denied(Denial::PrivateAddress, who);
        }
        // Connect to exactly the addresses checked: no second lookup a rebinding DNS could
        // answer differently.
        let Some(stream) = self.connect(&permitted).await else {
            return Err(Refusal::Failed(Failure::Connect, who));
        };
        Ok(Grant {
            claims,
            slot,
            stream,
            addrs: permitted,
        })
    }

    fn revocations_fresh(&self) -> bool {
        self.verifier
            .revocations_age()
            .is_some_and(|age| age <= self.cfg.revocation_max_age)
    }

    /// Why a live connection of `c` must be cut now, if it must.
    pub(crate) fn verdict(&self, c: &Claims, now: i64) -> Option<&'static str> {
        self.denial_now(c, now).map(Denial::code)
    }

    /// Why a token that passed once is no good now (revoked, expired, or the proxy can no
    /// longer tell), if it is not.
    pub(crate) fn denial_now(&self, c: &Claims, now: i64) -> Option<Denial> {
        let leeway = i64::try_from(self.cfg.verifier.leeway.as_secs()).unwrap_or(0);
        if self.verifier.is_revoked(&c.jti) {
            Some(Denial::Revoked)
        } else if now >= c.exp.saturating_add(leeway) {
            Some(Denial::Expired)
        } else if !self.revocations_fresh() {
            Some(Denial::VerifierUnavailable)
        } else {
            None
        }
    }

    async fn resolve(&self, t: &Target) -> Option<Vec<SocketAddr>> {
        match &t.host {
            TargetHost::Ip(ip) => Some(vec![SocketAddr::new(*ip, t.port)]),
            TargetHost::Name(n) => {
                let ttl = self.cfg.dns_cache;
                if !ttl.is_zero()
                    && let Some(hit) = self.dns.get(n, t.port, ttl)
                {
                    return Some(hit);
                }
                let lookup = tokio::net::lookup_host((n.as_str(), t.port));
                match tokio::time::timeout(self.cfg.dns_timeout, lookup).await {
                    Ok(Ok(addrs)) => {
                        let addrs: Vec<SocketAddr> = addrs.take(16).collect();
                        if !ttl.is_zero() && !addrs.is_empty() {
                            self.dns.put(n, t.port, &addrs);
                        }
                        Some(addrs)
                    }
                    _ => None,
                }
            }
        }
    }

    pub(crate) async fn connect(&self, addrs: &[SocketAddr]) -> Option<TcpStream> {
        let deadline = tokio::time::Instant::now() + self.cfg.connect_timeout;
        for a in addrs {
            match tokio::time::timeout_at(deadline, TcpStream::connect(a)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Some(s);
                }
                Ok(Err(e)) => tracing::debug!(addr = %a, error = %e, "connect failed"),
                Err(_) => return None,
            }
        }
        None
    }

    async fn tunnel(&self, on_upgrade: hyper::upgrade::OnUpgrade, g: Grant, shown: String) {
        let Grant {
            claims,
            slot,
            stream,
            ..
        } = g;
        let upgraded = match tokio::time::timeout(self.cfg.header_timeout, on_upgrade).await {
            Ok(Ok(u)) => u,
            _ => return,
        };
        let _open = self.metrics.tunnel_opened();
        let mut client = TokioIo::new(upgraded);
        let (mut upstream, last) = Active::new(stream);
        let outcome = tokio::select! {
            r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match r {
                Ok(_) => "done",
                Err(_) => "broken",
            },
            () = slot.cancel.cancelled() => slot.cut_reason().unwrap_or("cut"),
            () = idle(last, self.cfg.idle_timeout) => "idle",
        };
        self.metrics.closed(outcome).inc();
        if outcome != "done" && outcome != "broken" {
            tracing::info!(
                folder = claims.folder.as_deref().unwrap_or("-"),
                run = claims.run_id.as_deref().unwrap_or("-"),
                host = %shown,
                reason = outcome,
                "egress tunnel closed"
            );
        }
    }

    async fn forward(
        &self,
        mut req: Request<Incoming>,
        g: Grant,
        target: &Target,
        shown: &str,
    ) -> Response<Body> {
        let Grant {
            claims,
            slot,
            stream,
            ..
        } = g;
        let who = Who::of(&claims);
        // Plain HTTP: values would cross the network unencrypted, so placeholders are never
        // replaced here; any that turn up are recorded.
        let path = req.uri().to_string();
        let to = Toward {
            host: &target.host,
            port: target.port,
            tls: false,
        };
        if let Ok(o) = self
            .substituter(&claims)
            .substitute(req.headers_mut(), &path, to)
        {
            self.record(&o.refused, &who, shown);
        }
        let (io, last) = Active::new(stream);
        let handshake = hyper::client::conn::http1::Builder::new()
            .handshake::<_, Incoming>(TokioIo::new(io))
            .await;
        let (mut sender, conn) = match handshake {
            Ok(p) => p,
            Err(_) => return self.fail(Failure::Upstream, shown, &who),
        };
        let idle_limit = self.cfg.idle_timeout;
        let metrics = self.metrics.clone();
        // The connection lives until the answer's body is read (or the token is cut, or it
        // idles), and holds the token's slot until then.
        tokio::spawn(async move {
            let outcome = tokio::select! {
                r = conn => if r.is_ok() { "done" } else { "broken" },
                () = slot.cancel.cancelled() => slot.cut_reason().unwrap_or("cut"),
                () = idle(last, idle_limit) => "idle",
            };
            metrics.closed(outcome).inc();
        });
        let upstream_req = match origin_request(req, target) {
            Some(r) => r,
            None => return self.deny(Denial::BadRequest, shown, &who, None),
        };
        match tokio::time::timeout(self.cfg.idle_timeout, sender.send_request(upstream_req)).await {
            Ok(Ok(mut resp)) => {
                strip_hop_by_hop(resp.headers_mut());
                resp.map(Either::Left)
            }
            _ => self.fail(Failure::Upstream, shown, &who),
        }
    }

    pub(crate) fn deny(
        &self,
        d: Denial,
        shown: &str,
        who: &Who,
        peer: impl Into<Option<SocketAddr>>,
    ) -> Response<Body> {
        self.metrics.denied(d).inc();
        let peer = peer.into().map(|p| p.ip().to_string());
        tracing::info!(
            folder = who.folder.as_deref().unwrap_or("-"),
            run = who.run.as_deref().unwrap_or("-"),
            host = %shown,
            reason = d.code(),
            peer = peer.as_deref().unwrap_or("-"),
            "egress denied"
        );
        let body = format!(
            "hako egress proxy: {shown} denied ({}): {}\n",
            d.code(),
            d.explain()
        );
        let mut resp = answer(d.status(), body);
        resp.headers_mut().insert(
            HeaderName::from_static("x-hako-egress-denied"),
            HeaderValue::from_static(d.code()),
        );
        if d.status() == StatusCode::PROXY_AUTHENTICATION_REQUIRED {
            resp.headers_mut().insert(
                header::PROXY_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"hako-egress\""),
            );
        }
        resp
    }

    pub(crate) fn fail(&self, f: Failure, shown: &str, who: &Who) -> Response<Body> {
        self.metrics.failed(f).inc();
        tracing::info!(
            folder = who.folder.as_deref().unwrap_or("-"),
            run = who.run.as_deref().unwrap_or("-"),
            host = %shown,
            reason = f.code(),
            "egress target unreachable"
        );
        answer(
            f.status(),
            format!(
                "hako egress proxy: {shown} is allowed but could not be reached ({})\n",
                f.code()
            ),
        )
    }
}

fn answer(status: StatusCode, body: String) -> Response<Body> {
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(body))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Whether `ip` may be connected to for `rule`: an entry naming an address reaches exactly it
/// (whatever its range); a name reaches only ordinary addresses, or the operator's ranges.
fn permitted(ip: IpAddr, rule: &EgressRule, cfg: &Config) -> bool {
    policy::address_allowed(ip, rule.is_ip(), &cfg.private_targets)
}

/// The target of a proxy request: the authority of a `CONNECT` (port required), or the host
/// and port of an absolute `http://` URL (default 80). Anything else is not a proxy request.
fn target_of(req: &Request<Incoming>) -> Option<Target> {
    let uri = req.uri();
    let auth = uri.authority()?;
    let port = if req.method() == Method::CONNECT {
        if uri.scheme().is_some() || uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
            return None;
        }
        auth.port_u16()?
    } else {
        if uri.scheme_str() != Some("http") {
            return None;
        }
        auth.port_u16().unwrap_or(80)
    };
    if port == 0 || auth.as_str().contains('@') {
        return None;
    }
    let host = allowlist::target_host(auth.host())?;
    Some(Target { host, port })
}

/// Headers that belong to one hop (RFC 9110 §7.6.1), and the proxy's own.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        h.remove(n);
    }
    for n in HOP_BY_HOP {
        h.remove(n);
    }
}

/// The request as the target sees it: origin-form, `Host` set to the allowed authority, no
/// credentials for the proxy.
fn origin_request(req: Request<Incoming>, target: &Target) -> Option<Request<Incoming>> {
    let (mut parts, body) = req.into_parts();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = path.parse::<Uri>().ok()?;
    strip_hop_by_hop(&mut parts.headers);
    // `Host` is the authority that was allowed, whatever the client wrote: a different one
    // would reach another site behind the same address (a CDN's), around the allowlist.
    let host = if target.port == 80 {
        target.host.to_string()
    } else {
        format!("{}:{}", target.host, target.port)
    };
    parts
        .headers
        .insert(header::HOST, HeaderValue::from_str(&host).ok()?);
    parts.version = hyper::Version::HTTP_11;
    Some(Request::from_parts(parts, body))
}

/// Milliseconds on a clock of the process's own (for activity stamps).
pub(crate) fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// Resolves once `last` (an activity stamp) is older than `limit`.
pub(crate) async fn idle(last: Arc<AtomicU64>, limit: Duration) {
    let step = (limit / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
    let limit_ms = limit.as_millis() as u64;
    loop {
        tokio::time::sleep(step).await;
        if now_ms().saturating_sub(last.load(Ordering::Relaxed)) >= limit_ms {
            return;
        }
    }
}

/// A stream that stamps every read and write, so that idleness can be watched from outside.
pub struct Active<S> {
    inner: S,
    last: Arc<AtomicU64>,
}

impl<S> Active<S> {
    fn new(inner: S) -> (Self, Arc<AtomicU64>) {
        let last = Arc::new(AtomicU64::new(now_ms()));
        (Self::with(inner, Arc::clone(&last)), last)
    }

    /// `inner`, stamping `last` (shared with another stream of the same connection).
    pub(crate) fn with(inner: S, last: Arc<AtomicU64>) -> Self {
        Self { inner, last }
    }

    fn touch(&self) {
        self.last.store(now_ms(), Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Active<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Active<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Serves proxy clients on `listener` until `shutdown` resolves: at most
/// `max_connections` client connections (a tunnel holds its client's place), each request's
/// headers within `header_timeout`.
pub async fn serve(
    proxy: Arc<Proxy>,
    listener: tokio::net::TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(proxy.cfg.max_connections));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(proxy.cfg.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => Arc::new(p),
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let p = Arc::clone(&proxy);
        let hold = Arc::clone(&permit);
        let service = hyper::service::service_fn(move |req| {
            Arc::clone(&p).handle(req, peer, Arc::clone(&hold))
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        tokio::spawn(async move {
            let _permit = permit;
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection closed with an error");
            }
        });
    }
}
