//! The turn's tools over its socket: `cargo bench -p hako-routd --bench mcp`.
//!
//! A real authd, runed and routd (one data directory), a live turn (a `hako-agent`
//! container sleeping), and a client on the turn's `mcp.sock` speaking newline-delimited
//! JSON-RPC as an agent's client does: `BENCH_CALLS` (2,000) sequential calls each of a read
//! (`get_history`, limit 1) and a write (`send_message`: a row in routd.db, the chat's event
//! stream told). Prints p50 / p99 of the round trip per tool (targets: p50 ≤ 2 ms, p99 ≤
//! 10 ms), and, as the reference in the same run, the same calls on a `ping`.

use std::time::{Duration, Instant};

use hako_shared::auth::AuthdClient;
use hako_shared::config::Env;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

const RUNED_KEY: &str = "runed-bench-key-0123456789";
const ROUTD_KEY: &str = "routd-bench-key-0123456789";
const OPERATOR_KEY: &str = "operator-bench-key-0123456789";
const CHANNEL_KEY: &str = "channel-bench-key-0123456789";

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

struct Conn {
    r: BufReader<tokio::net::unix::OwnedReadHalf>,
    w: tokio::net::unix::OwnedWriteHalf,
    id: i64,
    line: String,
}

impl Conn {
    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let mut out = json!({"jsonrpc": "2.0", "id": self.id, "method": method, "params": params})
            .to_string();
        out.push('\n');
        self.w.write_all(out.as_bytes()).await.expect("write");
        loop {
            self.line.clear();
            let n = tokio::time::timeout(Duration::from_secs(10), self.r.read_line(&mut self.line))
                .await
                .expect("an answer")
                .expect("read");
            assert!(n > 0, "the socket closed");
            let v: Value = serde_json::from_str(&self.line).expect("json");
            if v["id"] == self.id {
                return v;
            }
        }
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let calls: usize = std::env::var("BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let image = hako_deploy::ensure_agent_image()
        .await
        .expect("agent image");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let acfg = hako_authd::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", dir.path().join("authd").display().to_string()),
        (
            "AUTHD_SERVICE_KEYS",
            format!(
                "runed={RUNED_KEY},routd={ROUTD_KEY},operator={OPERATOR_KEY},channel={CHANNEL_KEY}"
            ),
        ),
    ]))
    .expect("authd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let authd = hako_authd::start(acfg, l).await.expect("authd");
    let rcfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        ("CONTAINER_IMAGE", image),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let runed = hako_runed::start(rcfg, l).await.expect("runed");
    let cfg = hako_routd::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
        ("RUNED_URL", runed.url()),
        ("ROUTD_LISTEN", "127.0.0.1:0".into()),
    ]))
    .expect("routd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let routd = hako_routd::start(cfg, l).await.expect("routd");
    let client = AuthdClient::new(&authd.url()).expect("client");
    let operator = client
        .service_token("operator", OPERATOR_KEY)
        .await
        .expect("op")
        .token;
    let channel = client
        .service_token("channel", CHANNEL_KEY)
        .await
        .expect("ch")
        .token;
    let http = reqwest::Client::builder().no_proxy().build().expect("http");
    let base = routd.url();
    let s = http
        .put(format!("{base}/v1/groups/bench"))
        .bearer_auth(&operator)
        .json(&json!({"name": "bench"}))
        .send()
        .await
        .expect("group")
        .status();
    assert!(s.is_success(), "group: {s}");
    let s = http
        .post(format!("{base}/v1/messages"))
        .bearer_auth(&channel)
        .json(&json!({"id": "live", "chat_jid": "web:bench", "sender": "bench", "content": "/sleep 600"}))
        .send()
        .await
        .expect("post")
        .status();
    assert_eq!(s, 201);
    // The turn is live once runed runs it; its socket is bound before.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v: Value = http
            .get(format!("{base}/v1/turns?folder=bench&state=running"))
            .bearer_auth(&operator)
            .send()
            .await
            .expect("turns")
            .json()
            .await
            .expect("json");
        if v["turns"].as_array().is_some_and(|t| !t.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sock = data.join("folders/bench/ipc/mcp.sock");
    let (r, w) = UnixStream::connect(&sock)
        .await
        .expect("connect")
        .into_split();
    let mut c = Conn {
        r: BufReader::new(r),
        w,
        id: 0,
        line: String::new(),
    };
    let init = c
        .request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "0"}}),
        )
        .await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18");
    c.w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await
        .expect("write");
    let cases: [(&str, &str, Value); 3] = [
        ("ping (reference)", "ping", json!({})),
        (
            "get_history",
            "tools/call",
            json!({"name": "get_history", "arguments": {"limit": 1}}),
        ),
        (
            "send_message",
            "tools/call",
            json!({"name": "send_message", "arguments": {"text": "bench"}}),
        ),
    ];
    println!("MCP round trips over the turn's socket, {calls} sequential calls each:");
    for (name, method, params) in cases {
        for _ in 0..50 {
            c.request(method, params.clone()).await;
        }
        let mut took = Vec::with_capacity(calls);
        for _ in 0..calls {
            let t = Instant::now();
            let v = c.request(method, params.clone()).await;
            took.push(t.elapsed());
            assert!(
                v.get("error").is_none() && v["result"]["isError"] != true,
                "{v}"
            );
        }
        took.sort();
        let (p50, p99) = (pct(&took, 0.5), pct(&took, 0.99));
        let verdict = if name.starts_with("ping") {
            String::new()
        } else {
            let ok = p50 <= Duration::from_millis(2) && p99 <= Duration::from_millis(10);
            format!(
                " (targets p50 <= 2 ms, p99 <= 10 ms: {})",
                if ok { "PASS" } else { "FAIL" }
            )
        };
        println!(
            "  {name:<16} p50 {:>7.3} ms  p99 {:>7.3} ms{verdict}",
            p50.as_secs_f64() * 1000.0,
            p99.as_secs_f64() * 1000.0
        );
    }
    let _ = http
        .post(format!("{base}/v1/messages"))
        .bearer_auth(&channel)
        .json(
            &json!({"id": "stop", "chat_jid": "web:bench", "sender": "bench", "content": "/stop"}),
        )
        .send()
        .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    routd.shutdown().await;
    if let Some(runner) = runed.runner() {
        runed.shutdown().await;
        let _ = runner.cleanup_orphans(&Default::default()).await;
    } else {
        runed.shutdown().await;
    }
    let _ = authd.shutdown().await;
}
