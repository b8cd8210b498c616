//! The client side: one request (`fetch`), a held tunnel (`hold`), and the bench's load.
//! Proxy settings come from the environment as an ordinary client reads them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

use crate::opt;

/// A parsed `http://[user[:pass]@]host:port` proxy URL.
#[derive(Debug, Clone)]
pub struct ProxyUrl {
    /// `host:port`.
    pub addr: String,
    /// The credential: the password, or the user when the password is empty.
    pub token: Option<String>,
}

impl ProxyUrl {
    /// Parses a proxy variable's value.
    pub fn parse(raw: &str) -> Option<Self> {
        let rest = raw.strip_prefix("http://")?.trim_end_matches('/');
        let (cred, addr) = match rest.rsplit_once('@') {
            Some((c, a)) => (Some(c), a),
            None => (None, rest),
        };
        let token = cred.map(|c| match c.split_once(':') {
            Some((u, "")) => u.to_owned(),
            Some((_, p)) => p.to_owned(),
            None => c.to_owned(),
        });
        Some(Self {
            addr: addr.to_owned(),
            token,
        })
    }

    /// From the environment, for `scheme` (`https` reads `HTTPS_PROXY`/`https_proxy`).
    pub fn from_env(scheme: &str) -> Option<Self> {
        let names: [&str; 2] = if scheme == "https" {
            ["HTTPS_PROXY", "https_proxy"]
        } else {
            ["HTTP_PROXY", "http_proxy"]
        };
        names
            .iter()
            .filter_map(|n| std::env::var(n).ok())
            .find(|v| !v.is_empty())
            .and_then(|v| Self::parse(&v))
    }
}

/// What one request gave.
pub struct Fetched {
    pub status: Option<u16>,
    pub denied: Option<String>,
    pub body: String,
    pub error: Option<String>,
}

impl Fetched {
    fn err(e: impl std::fmt::Display) -> Self {
        Self {
            status: None,
            denied: None,
            body: String::new(),
            error: Some(e.to_string()),
        }
    }

    pub fn json(&self, ms: f64) -> Value {
        json!({"status": self.status, "denied": self.denied, "body": self.body,
               "error": self.error, "ms": (ms * 1000.0).round() / 1000.0})
    }
}

fn auth_header(token: &str, bearer: bool) -> String {
    if bearer {
        format!("Bearer {token}")
    } else {
        let b = base64::engine::general_purpose::STANDARD.encode(format!("hako:{token}"));
        format!("Basic {b}")
    }
}

fn tls_connector(ca_b64: Option<&str>) -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(b64) = ca_b64 {
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|e| format!("--ca: {e}"))?;
        roots
            .add(rustls::pki_types::CertificateDer::from(der))
            .map_err(|e| format!("--ca: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

async fn tcp(addr: &str, limit: Duration) -> Result<TcpStream, String> {
    match tokio::time::timeout(limit, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => {
            let _ = s.set_nodelay(true);
            Ok(s)
        }
        Ok(Err(e)) => Err(format!("connect {addr}: {e}")),
        Err(_) => Err(format!("connect {addr}: timed out")),
    }
}

/// An HTTP/1.1 sender over any stream.
async fn sender<S>(io: S) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(send)
}

async fn read(resp: hyper::Response<hyper::body::Incoming>) -> Fetched {
    let status = resp.status().as_u16();
    let denied = resp
        .headers()
        .get("x-hako-egress-denied")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match http_body_util::Limited::new(resp.into_body(), 1 << 20)
        .collect()
        .await
    {
        Ok(b) => String::from_utf8_lossy(&b.to_bytes())
            .chars()
            .take(300)
            .collect(),
        Err(e) => format!("(body: {e})"),
    };
    Fetched {
        status: Some(status),
        denied,
        body,
        error: None,
    }
}

/// The pieces of a target URL.
struct Target {
    https: bool,
    host: String,
    authority: String,
    path: String,
}

fn target(url: &str) -> Result<Target, String> {
    let uri: Uri = url.parse().map_err(|e| format!("url: {e}"))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => return Err("url must be http:// or https://".into()),
    };
    let host = uri.host().ok_or("url without host")?.to_owned();
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(Target {
        https,
        authority: format!("{host}:{port}"),
        host,
        path: uri
            .path_and_query()
            .map_or("/".into(), |p| p.as_str().to_owned()),
    })
}

/// Opens a `CONNECT` tunnel through `proxy`; `Err(Fetched)` carries the proxy's refusal.
async fn tunnel(
    proxy: &ProxyUrl,
    authority: &str,
    token: Option<&str>,
    bearer: bool,
    limit: Duration,
) -> Result<hyper::upgrade::Upgraded, Fetched> {
    let s = tcp(&proxy.addr, limit).await.map_err(Fetched::err)?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(s))
            .await
            .map_err(Fetched::err)?;
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let mut req = Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .header("host", authority);
    if let Some(t) = token {
        req = req.header("proxy-authorization", auth_header(t, bearer));
    }
    let req = req.body(Empty::new()).map_err(Fetched::err)?;
    let resp = send.send_request(req).await.map_err(Fetched::err)?;
    if resp.status() != StatusCode::OK {
        return Err(read(resp).await);
    }
    hyper::upgrade::on(resp).await.map_err(Fetched::err)
}

/// One GET of `url`, through the environment's proxy if any; `token` `-` sends none.
pub async fn fetch(url: &str, ca: Option<&str>, token: Option<&str>, limit: Duration) -> Fetched {
    let t = match target(url) {
        Ok(t) => t,
        Err(e) => return Fetched::err(e),
    };
    let proxy = ProxyUrl::from_env(if t.https { "https" } else { "http" });
    // An explicit --token wins, sent as a bearer; else the URL's credential, as basic auth.
    let (cred, bearer) = match token {
        Some("-") => (None, false),
        Some(tok) => (Some(tok.to_owned()), true),
        None => (proxy.as_ref().and_then(|p| p.token.clone()), false),
    };
    let work = async {
        if t.https {
            let connector = tls_connector(ca).map_err(Fetched::err)?;
            let name =
                rustls::pki_types::ServerName::try_from(t.host.clone()).map_err(Fetched::err)?;
            let tls = match &proxy {
                Some(p) => {
                    let up = tunnel(p, &t.authority, cred.as_deref(), bearer, limit).await?;
                    let s = connector
                        .connect(name, TokioIo::new(up))
                        .await
                        .map_err(|e| Fetched::err(format!("tls: {e}")))?;
                    Box::new(s) as Box<dyn Io>
                }
                None => {
                    let s = tcp(&t.authority, limit).await.map_err(Fetched::err)?;
                    let s = connector
                        .connect(name, s)
                        .await
                        .map_err(|e| Fetched::err(format!("tls: {e}")))?;
                    Box::new(s) as Box<dyn Io>
                }
            };
            let mut send = sender(tls).await.map_err(Fetched::err)?;
            let req = Request::get(&t.path)
                .header("host", &t.authority)
                .body(Empty::new())
                .map_err(Fetched::err)?;
            let resp = send.send_request(req).await.map_err(Fetched::err)?;
            Ok::<_, Fetched>(read(resp).await)
        } else {
            let (addr, uri) = match &proxy {
                Some(p) => (p.addr.clone(), format!("http://{}{}", t.authority, t.path)),
                None => (t.authority.clone(), t.path.clone()),
            };
            let s = tcp(&addr, limit).await.map_err(Fetched::err)?;
            let mut send = sender(s).await.map_err(Fetched::err)?;
            let mut req = Request::get(uri).header("host", &t.authority);
            if let (Some(_), Some(c)) = (&proxy, &cred) {
                req = req.header("proxy-authorization", auth_header(c, bearer));
            }
            let req = req.body(Empty::new()).map_err(Fetched::err)?;
            let resp = send.send_request(req).await.map_err(Fetched::err)?;
            Ok(read(resp).await)
        }
    };
    match tokio::time::timeout(limit, work).await {
        Ok(Ok(f)) | Ok(Err(f)) => f,
        Err(_) => Fetched::err(format!("timed out after {limit:?}")),
    }
}

/// A stream hyper and rustls can both use.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

fn limit_of(args: &[String]) -> Duration {
    Duration::from_millis(
        opt(args, "--timeout-ms")
            .and_then(|v| v.parse().ok())
            .unwrap_or(5000),
    )
}

/// `fetch URL [--ca B64] [--token T] [--timeout-ms MS]`: prints one JSON line.
pub async fn fetch_main(args: &[String]) -> Result<(), String> {
    let url = args.first().ok_or("fetch URL")?;
    let started = Instant::now();
    let f = fetch(url, opt(args, "--ca"), opt(args, "--token"), limit_of(args)).await;
    println!("{}", f.json(started.elapsed().as_secs_f64() * 1000.0));
    Ok(())
}

/// Opens a tunnel to `authority` through the environment's proxy with `token`, calls
/// `opened`, and waits until it is closed (or `limit`): how long it lived, or the refusal.
pub async fn hold(authority: &str, token: &str, limit: Duration, opened: impl FnOnce()) -> Value {
    let Some(proxy) = ProxyUrl::from_env("https") else {
        return json!({"error": "no proxy in the environment"});
    };
    let up = match tunnel(&proxy, authority, Some(token), false, limit).await {
        Ok(u) => u,
        Err(f) => return f.json(0.0),
    };
    opened();
    let started = Instant::now();
    let mut io = TokioIo::new(up);
    let mut buf = [0u8; 1024];
    let how =
        match tokio::time::timeout(limit, tokio::io::AsyncReadExt::read(&mut io, &mut buf)).await {
            Ok(Ok(0)) => "closed by the proxy",
            Ok(Ok(_)) => "data",
            Ok(Err(_)) => "reset",
            Err(_) => "still open",
        };
    json!({"held_ms": started.elapsed().as_millis() as u64, "end": how})
}

/// `bench URL --requests N --concurrency C [--via connect] [--token T]`: N GETs over C
/// kept-alive connections (direct when the environment has no proxy; through the proxy as
/// absolute-URL requests, or inside one `CONNECT` tunnel per connection with
/// `--via connect`). Prints requests per second and latency percentiles as JSON.
pub async fn bench_main(args: &[String]) -> Result<(), String> {
    let url = args.first().ok_or("bench URL")?.clone();
    let n: usize = opt(args, "--requests")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let c: usize = opt(args, "--concurrency")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let via_connect = opt(args, "--via") == Some("connect");
    let t = target(&url)?;
    let proxy = ProxyUrl::from_env("http");
    let token = opt(args, "--token")
        .map(str::to_owned)
        .or_else(|| proxy.as_ref().and_then(|p| p.token.clone()));
    let limit = Duration::from_secs(10);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..c {
        let (t_auth, t_path, proxy, token, next) = (
            t.authority.clone(),
            t.path.clone(),
            proxy.clone(),
            token.clone(),
            Arc::clone(&next),
        );
        workers.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut send = match (&proxy, via_connect) {
                (Some(p), true) => {
                    let up = tunnel(p, &t_auth, token.as_deref(), false, limit)
                        .await
                        .map_err(|f| format!("{}", f.json(0.0)))?;
                    sender(TokioIo::new(up)).await?
                }
                (Some(p), false) => sender(tcp(&p.addr, limit).await?).await?,
                (None, _) => sender(tcp(&t_auth, limit).await?).await?,
            };
            let absolute = proxy.is_some() && !via_connect;
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < n {
                let uri = if absolute {
                    format!("http://{t_auth}{t_path}")
                } else {
                    t_path.clone()
                };
                let mut req = Request::get(uri).header("host", &t_auth);
                if let (true, Some(tok)) = (absolute, &token) {
                    req = req.header("proxy-authorization", auth_header(tok, false));
                }
                let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
                let t0 = Instant::now();
                send.ready().await.map_err(|e| e.to_string())?;
                let resp = send.send_request(req).await.map_err(|e| e.to_string())?;
                let ok = resp.status() == StatusCode::OK;
                let _ = resp.into_body().collect().await;
                if !ok {
                    return Err("a request was not answered 200".to_string());
                }
                lat.push(t0.elapsed().as_secs_f64() * 1000.0);
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut all = Vec::new();
    for w in workers {
        all.extend(w.await.map_err(|e| e.to_string())??);
    }
    let secs = started.elapsed().as_secs_f64();
    all.sort_by(|a, b| a.total_cmp(b));
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "{}",
        json!({"requests": all.len(), "concurrency": c, "seconds": secs,
               "rps": all.len() as f64 / secs, "p50_ms": pct(0.5), "p90_ms": pct(0.9),
               "p99_ms": pct(0.99)})
    );
    Ok(())
}
