//! The egress tests' rig: a real authd in-process, the proxy in-process on loopback ports,
//! targets on loopback, and raw HTTP helpers (what a client sends, byte for byte).
#![allow(dead_code)]

pub mod brokered;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hako_authd::testing::TestAuthd;
use hako_client::authd::AuthdClient;
use hako_shared::auth::AGENT_SCOPES;
use hako_shared::auth::wire::MintRequest;
use hako_shared::secrets::SecretClaim;
use hako_shared::testing::eventually;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

pub const LIMIT: Duration = Duration::from_secs(20);

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub authd: Option<TestAuthd>,
    pub runed_token: String,
    pub routd_token: String,
    pub client: AuthdClient,
}

impl Rig {
    pub async fn new() -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let authd = TestAuthd::start(&dir.path().join("authd")).await;
        let client = AuthdClient::new(&authd.url()).unwrap();
        let runed_token = authd.token("runed").await;
        let routd_token = authd.token("routd").await;
        Rig {
            dir,
            authd: Some(authd),
            runed_token,
            routd_token,
            client,
        }
    }

    pub fn authd_url(&self) -> String {
        self.authd.as_ref().unwrap().url()
    }

    /// A spawn token for run `run` of folder `acme/support` allowed `egress`.
    pub async fn spawn_token(&self, run: &str, egress: &[String], ttl: u64) -> (String, String) {
        self.spawn_token_with(run, egress, &[], ttl).await
    }

    /// The same, with brokered secrets (as runed mints them).
    pub async fn spawn_token_with(
        &self,
        run: &str,
        egress: &[String],
        secrets: &[SecretClaim],
        ttl: u64,
    ) -> (String, String) {
        let r = self
            .client
            .mint(
                &self.runed_token,
                &MintRequest {
                    scope: AGENT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
                    folder: Some("acme/support".into()),
                    ttl_seconds: Some(ttl),
                    run_id: Some(run.into()),
                    turn_id: Some(format!("turn-{run}")),
                    egress: egress.to_vec(),
                    secrets: secrets.to_vec(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        (r.token, r.jti)
    }

    pub fn config(&self) -> hako_egress::Config {
        config_for(&self.authd_url())
    }

    pub async fn proxy(&self, f: impl FnOnce(&mut hako_egress::Config)) -> hako_egress::Running {
        let mut cfg = self.config();
        f(&mut cfg);
        start_proxy(cfg).await
    }
}

pub fn config_for(authd: &str) -> hako_egress::Config {
    let mut cfg = hako_egress::Config::new(authd);
    cfg.verifier.leeway = Duration::from_secs(1);
    cfg.verifier.revoked_poll = Duration::from_millis(200);
    cfg.verifier.min_refetch_interval = Duration::from_millis(100);
    cfg.verifier.http_timeout = Duration::from_secs(2);
    cfg.revocation_max_age = Duration::from_secs(2);
    cfg.recheck = Duration::from_millis(100);
    cfg
}

pub async fn start_proxy(cfg: hako_egress::Config) -> hako_egress::Running {
    let p = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let a = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let running = hako_egress::start(cfg, p, a).await.unwrap();
    // Ready once the first revocation list is in.
    eventually("the proxy ready", LIMIT, || async {
        let (status, body) = admin_get(running.admin_addr(), "/ready").await;
        if status == 200 {
            Ok(())
        } else {
            Err((status, body))
        }
    })
    .await;
    running
}

/// An HTTP target that answers every request with its name and the request head it got.
pub async fn http_target(name: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let head = read_head(&mut s).await;
                let body = format!("target {name} got:\n{head}");
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\nx-target: {name}\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// A target that echoes what it reads (what a TLS server is to a CONNECT tunnel: bytes).
pub async fn echo_target() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.into_split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

pub async fn read_head(s: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") && buf.len() < 64 << 10 {
        match tokio::time::timeout(LIMIT, s.read(&mut byte)).await {
            Ok(Ok(1)) => buf.push(byte[0]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

/// Sends `raw` to the proxy and reads the answer to its end: (status, whole answer).
pub async fn send(proxy: SocketAddr, raw: &str) -> (u16, String) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(LIMIT, s.read_to_end(&mut out))
        .await
        .expect("the proxy answers in time")
        .unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    (status_of(&text), text)
}

pub fn status_of(text: &str) -> u16 {
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn bearer(token: &str) -> String {
    format!("Proxy-Authorization: Bearer {token}\r\n")
}

pub fn basic(token: &str) -> String {
    use base64::Engine as _;
    let b = base64::engine::general_purpose::STANDARD.encode(format!("hako:{token}"));
    format!("Proxy-Authorization: Basic {b}\r\n")
}

pub async fn get(proxy: SocketAddr, url: &str, auth: &str) -> (u16, String) {
    send(
        proxy,
        &format!("GET {url} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"),
    )
    .await
}

/// Opens a tunnel; `Ok(stream)` after a 200, else `Err((status, answer))`.
pub async fn connect(
    proxy: SocketAddr,
    target: &str,
    auth: &str,
) -> Result<TcpStream, (u16, String)> {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    // As curl, git and the SDKs do: no Nagle delay on small writes (a TLS handshake's).
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n").as_bytes())
        .await
        .unwrap();
    let head = read_head(&mut s).await;
    match status_of(&head) {
        200 => Ok(s),
        st => {
            // The body of a refusal, by its length (the connection may stay open).
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            let mut rest = vec![0u8; len];
            let _ = tokio::time::timeout(LIMIT, s.read_exact(&mut rest)).await;
            Err((st, format!("{head}{}", String::from_utf8_lossy(&rest))))
        }
    }
}

pub async fn echo_round(s: &mut TcpStream, msg: &[u8]) -> bool {
    if s.write_all(msg).await.is_err() {
        return false;
    }
    let mut back = vec![0u8; msg.len()];
    matches!(tokio::time::timeout(LIMIT, s.read_exact(&mut back)).await, Ok(Ok(_)) if back == msg)
}

/// Waits until the peer closes `s` (a read gives 0 bytes or fails).
pub async fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

pub async fn admin_get(admin: SocketAddr, path: &str) -> (u16, String) {
    send(
        admin,
        &format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n"),
    )
    .await
}

pub fn metric(p: &hako_egress::Running, series: &str) -> u64 {
    p.metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no series {series} in\n{}", p.metrics().render()))
}

/// A writer that keeps what the log says.
#[derive(Clone, Default)]
pub struct Captured(pub Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
