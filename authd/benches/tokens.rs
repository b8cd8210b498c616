//! Tokens minted per second through authd's HTTP API, and verified per second by `Verifier`.
//!
//! `cargo bench -p hako-authd --bench tokens` (targets: mint >= 20,000/s, verify >= 15,000/s,
//! each on one core).
//!
//! - Mint: a real authd (`hako_authd::start`, temp data dir, real `authd.db`) runs on its own
//!   thread with a tokio current_thread runtime: one core. A load generator on another thread
//!   keeps `BENCH_CONNS` keep-alive loopback connections busy with `POST /v1/tokens` (runed's
//!   service token asking for a spawn token, as runed does once per run). Every answer is
//!   checked to be a 200 with a token.
//! - Verify: a remote `Verifier` (JWKS fetched from that authd over HTTP) on a current_thread
//!   runtime verifies distinct freshly minted tokens, each once, so every call checks a
//!   signature. Re-verifying a token already seen (the common case: one spawn token per tool
//!   call) is printed too.
//!
//! The machine may be shared, so wall-clock rates move with the neighbours' load. The bench
//! also reads the CPU time authd's threads used (its runtime thread plus its SQLite thread,
//! from /proc, in nanoseconds) and prints mints per CPU-second: what one dedicated core does.
//! Mints are counted in one-second windows (`BENCH_SECS` of them, default 7); PASS/FAIL is
//! judged on the median window, printed with the slowest and fastest window and the whole
//! run's figure, so that one burst of a neighbour spoils a window rather than the verdict.
//! Verify is judged on the verifier thread's CPU time. Wall-clock rates are printed too.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hako_authd::Config;
use hako_authd::config::ServiceKeys;
use hako_client::authd::AuthdClient;
use hako_shared::auth::{Verifier, VerifierConfig};

const MINT_TARGET: f64 = 20_000.0;
const VERIFY_TARGET: f64 = 15_000.0;
const RUNED_KEY: &str = "bench-runed-key-0123456789";

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU seconds used so far by this process's threads whose name is one of `names`.
///
/// Read from `/proc/self/task/*/schedstat` (nanoseconds); where that is missing, from `stat`
/// (10 ms ticks, too coarse for one-second windows).
fn thread_cpu(names: &[&str]) -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return f64::NAN;
    };
    let mut secs = 0.0;
    for task in dir.flatten() {
        let p = task.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default();
        if !names.contains(&comm.trim()) {
            continue;
        }
        let ns = std::fs::read_to_string(p.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok());
        if let Some(ns) = ns {
            secs += ns as f64 * 1e-9;
            continue;
        }
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        // Fields after the `)` that closes the name: state is the first, utime the 12th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() > 12 {
            let ticks = f[11].parse::<u64>().unwrap_or(0) + f[12].parse::<u64>().unwrap_or(0);
            secs += ticks as f64 * 0.01;
        }
    }
    secs
}

fn verdict(rate: f64, target: f64) -> &'static str {
    if rate >= target { "PASS" } else { "FAIL" }
}

/// One keep-alive HTTP/1.1 connection speaking just enough of the protocol.
struct Conn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    async fn open(addr: SocketAddr) -> std::io::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream,
            buf: Vec::with_capacity(16 * 1024),
        })
    }

    /// Sends `req` and returns the status and body of the answer.
    async fn round_trip(&mut self, req: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(req).await?;
        loop {
            if let Some(end) = find(&self.buf, b"\r\n\r\n") {
                let head = std::str::from_utf8(&self.buf[..end])
                    .map_err(|_| std::io::Error::other("non-UTF-8 head"))?;
                let status: u16 = head
                    .get(9..12)
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| std::io::Error::other("bad status line"))?;
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse().ok())?
                    })
                    .ok_or_else(|| std::io::Error::other("no content-length"))?;
                let total = end + 4 + len;
                while self.buf.len() < total {
                    self.read_more().await?;
                }
                let body = self.buf[end + 4..total].to_vec();
                self.buf.drain(..total);
                return Ok((status, body));
            }
            self.read_more().await?;
        }
    }

    async fn read_more(&mut self) -> std::io::Result<()> {
        use tokio::io::AsyncReadExt;
        let mut chunk = [0u8; 8192];
        let n = tokio::time::timeout(Duration::from_secs(10), self.stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("authd did not answer within 10 s"))??;
        if n == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

struct Minted {
    count: u64,
    wall: Duration,
    /// CPU seconds of authd's runtime thread.
    runtime_cpu: f64,
    /// CPU seconds of authd's SQLite thread.
    sqlite_cpu: f64,
    /// Mints per CPU-second of both threads, in each one-second window.
    windows: Vec<f64>,
    tokens: Vec<String>,
}

/// Signatures and bare signature checks per CPU-second on this thread: the floor under the
/// figures above, for comparison.
fn crypto_floor() -> (f64, f64) {
    use hako_shared::auth::{Signer, jws};
    let s = Signer::generate().expect("key");
    let claims = serde_json::json!({"iss": "hako-authd", "sub": "runed", "typ": "spawn",
        "scope": ["llm:call", "egress:connect"], "folder": "acme/support", "jti": "x".repeat(22),
        "iat": 1, "nbf": 1, "exp": 2, "run_id": "run-1", "turn_id": "turn-1",
        "parent_jti": "y".repeat(22), "egress": ["pypi.org"]});
    // Long enough (a few tenths of a second each) for /proc's 10 ms CPU-time ticks.
    let n = 20_000;
    let me = ["crypto-floor"];
    let c0 = thread_cpu(&me);
    let tokens: Vec<String> = (0..n).map(|_| s.sign(&claims).expect("sign")).collect();
    let c1 = thread_cpu(&me);
    let key = s.verifying_key();
    for t in &tokens {
        jws::verify::<serde_json::Value>(t, &key).expect("verify");
    }
    let c2 = thread_cpu(&me);
    (n as f64 / (c1 - c0), n as f64 / (c2 - c1))
}

/// Drives `POST /v1/tokens` for `secs` (after a warm-up) over `conns` connections.
fn mint_load(addr: SocketAddr, parent: &str, conns: usize, secs: u64, keep: usize) -> Minted {
    let body = br#"{"scope":["llm:call","egress:connect"],"folder":"acme/support","run_id":"run-1","turn_id":"turn-1","egress":["pypi.org"],"ttl_seconds":600}"#;
    // Raw HTTP/1.1 on purpose (not hako-client's `authd::mint`): a load generator that costs
    // next to nothing, so what is measured is authd's one core.
    let req: Arc<Vec<u8>> = Arc::new(
        [
            format!(
                "POST /v1/tokens HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {parent}\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .into_bytes(),
            body.to_vec(),
        ]
        .concat(),
    );
    let rt = current_thread();
    rt.block_on(async move {
        let counting = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let count = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for i in 0..conns {
            let (req, counting, stop, count) =
                (req.clone(), counting.clone(), stop.clone(), count.clone());
            // Every connection keeps its share, so the verify bench gets `keep` tokens.
            let keep_here = keep / conns + usize::from(i < keep % conns);
            tasks.push(tokio::spawn(async move {
                let mut c = Conn::open(addr).await.expect("connect to authd");
                let mut kept = Vec::with_capacity(keep_here);
                while !stop.load(Ordering::Relaxed) {
                    let (status, body) = c.round_trip(&req).await.expect("mint round trip");
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
                    if counting.load(Ordering::Relaxed) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    if kept.len() < keep_here {
                        let v: serde_json::Value =
                            serde_json::from_slice(&body).expect("mint answer is JSON");
                        kept.push(v["token"].as_str().expect("token").to_owned());
                    }
                }
                kept
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await; // warm-up
        let authd_cpu = || (thread_cpu(&["authd-bench"]), thread_cpu(&["sqlite"]));
        let (rt0, sq0) = authd_cpu();
        let t0 = Instant::now();
        counting.store(true, Ordering::Relaxed);
        // One-second windows: a neighbour's burst on this shared VM spoils one window, not
        // the whole figure.
        let mut windows = Vec::with_capacity(secs as usize);
        let (mut n_prev, mut cpu_prev) = (0, rt0 + sq0);
        for _ in 0..secs {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let n = count.load(Ordering::Relaxed);
            let (rt, sq) = authd_cpu();
            windows.push((n - n_prev) as f64 / (rt + sq - cpu_prev));
            (n_prev, cpu_prev) = (n, rt + sq);
        }
        counting.store(false, Ordering::Relaxed);
        let wall = t0.elapsed();
        let (rt1, sq1) = authd_cpu();
        stop.store(true, Ordering::Relaxed);
        let mut tokens = Vec::new();
        for t in tasks {
            tokens.extend(t.await.expect("load task"));
        }
        Minted {
            count: count.load(Ordering::Relaxed),
            wall,
            runtime_cpu: rt1 - rt0,
            sqlite_cpu: sq1 - sq0,
            windows,
            tokens,
        }
    })
}

fn main() {
    let conns = env_or("BENCH_CONNS", 32) as usize;
    let secs = env_or("BENCH_SECS", 7).max(1);
    let verify_n = env_or("BENCH_VERIFY_TOKENS", 30_000) as usize;

    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = Config {
        data_dir: tmp.path().join("data"),
        listen_addr: "127.0.0.1:0".parse().expect("addr"),
        service_keys: ServiceKeys::parse(&format!("runed={RUNED_KEY}")).expect("keys"),
        issuer: hako_shared::auth::DEFAULT_ISSUER.into(),
        service_token_ttl: Duration::from_secs(3600),
        max_token_ttl: Duration::from_secs(3600),
        clock_skew: Duration::from_secs(30),
        audit_retention: Duration::from_secs(86_400),
        serve: Default::default(),
    };

    // authd on its own one-core runtime.
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = std::thread::Builder::new()
        .name("authd-bench".into())
        .spawn(move || {
            current_thread().block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind");
                let running = hako_authd::start(cfg, listener).await.expect("authd");
                addr_tx.send(running.addr()).expect("send addr");
                let _ = stop_rx.await;
                let batches = running.metrics().render();
                running.shutdown().await.expect("shutdown");
                batches
            })
        })
        .expect("authd thread");
    let addr = addr_rx.recv().expect("authd address");
    let url = format!("http://{addr}");

    let parent = current_thread().block_on(async {
        AuthdClient::new(&url)
            .expect("client")
            .service_token("runed", RUNED_KEY)
            .await
            .expect("service token")
            .token
    });
    // Sanity: the hand-written client speaks HTTP well enough.
    {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }

    println!(
        "authd token bench: {conns} keep-alive connections, {secs}s measured after 1s warm-up"
    );
    let m = mint_load(addr, &parent, conns, secs, verify_n);
    let wall_rate = m.count as f64 / m.wall.as_secs_f64();
    let cpu_rate = m.count as f64 / (m.runtime_cpu + m.sqlite_cpu);
    let runtime_rate = m.count as f64 / m.runtime_cpu;
    println!(
        "mint   (POST /v1/tokens over HTTP): {wall_rate:>9.0}/s wall-clock; {} mints took authd \
         {:.2} CPU-s on its runtime thread + {:.2} on its SQLite thread",
        m.count, m.runtime_cpu, m.sqlite_cpu
    );
    let mut w = m.windows;
    w.sort_by(f64::total_cmp);
    let median = w.get(w.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "       per core, both threads: {median:>9.0}/s median of {} one-second windows \
         (slowest {:.0}, fastest {:.0}), {cpu_rate:.0}/s over the whole run  \
         (target {MINT_TARGET:.0}/s) {}",
        w.len(),
        w.first().copied().unwrap_or(f64::NAN),
        w.last().copied().unwrap_or(f64::NAN),
        verdict(median, MINT_TARGET)
    );
    println!("       per core, the runtime thread alone: {runtime_rate:>9.0}/s over the whole run");

    // Verify: distinct tokens, each once, by a remote verifier on this thread's runtime.
    let tokens = m.tokens;
    let (fresh_rate, fresh_cpu_rate, cached_rate, verified) = std::thread::Builder::new()
        .name("verify-bench".into())
        .spawn(move || {
            current_thread().block_on(async move {
                let v = Verifier::new(VerifierConfig::remote(&url)).expect("verifier");
                // Learn the key first (one JWKS fetch), outside the measurement.
                v.verify(&tokens[0]).await.expect("first token verifies");
                let rest = &tokens[1..];
                let cpu0 = thread_cpu(&["verify-bench"]);
                let t0 = Instant::now();
                for t in rest {
                    v.verify(t).await.expect("minted token verifies");
                }
                let wall = t0.elapsed().as_secs_f64();
                let cpu = thread_cpu(&["verify-bench"]) - cpu0;
                let n = rest.len() as f64;
                // A working set the verified-token cache (4,096 entries) holds whole: more
                // would measure the cache being cleared, not a hit.
                let recent = &rest[rest.len().saturating_sub(1024)..];
                let t0 = Instant::now();
                let rounds = 10;
                for _ in 0..rounds {
                    for t in recent {
                        v.verify(t).await.expect("cached token verifies");
                    }
                }
                let cached = (recent.len() * rounds) as f64 / t0.elapsed().as_secs_f64();
                (n / wall, n / cpu, cached, rest.len())
            })
        })
        .expect("verify thread")
        .join()
        .expect("verify bench");
    println!(
        "verify (Verifier, {verified} distinct tokens): {:>9.0}/s wall-clock, {:>9.0}/s per core  (target {VERIFY_TARGET:.0}/s) {}",
        fresh_rate,
        fresh_cpu_rate,
        verdict(fresh_cpu_rate, VERIFY_TARGET)
    );
    println!("verify (Verifier, token seen before): {cached_rate:>9.0}/s wall-clock");

    let (sign_rate, raw_verify_rate) = std::thread::Builder::new()
        .name("crypto-floor".into())
        .spawn(crypto_floor)
        .expect("crypto thread")
        .join()
        .expect("crypto floor");
    println!(
        "floor  (Ed25519 alone, per core): sign {sign_rate:>9.0}/s, verify {raw_verify_rate:>9.0}/s"
    );
    // The box's speed swings between runs; these ratios do not, and say what the code adds.
    println!(
        "ratios: a mint costs {:.1} bare signatures of CPU; the verifier runs at {:.0} % of a bare verify",
        sign_rate / median,
        100.0 * fresh_cpu_rate / raw_verify_rate
    );

    let _ = stop_tx.send(());
    let metrics = server.join().expect("authd thread");
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    let batches = line("authd_commit_batch_requests_count");
    let rows = line("authd_commit_batch_requests_sum");
    println!(
        "group commit: {batches:.0} transactions for {rows:.0} requests ({:.1} requests per commit)",
        rows / batches
    );
}
