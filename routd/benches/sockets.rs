//! The turn's sockets: `cargo bench -p hako-routd --bench sockets`.
//!
//! A real authd, runed and routd (one data directory), a live turn (a `hako-agent`
//! container sleeping), and:
//!
//! - **Tools**: a client on the turn's `mcp.sock` speaking newline-delimited JSON-RPC as an
//!   agent's client does: `BENCH_CALLS` (2,000) sequential calls each of a read
//!   (`get_history`, limit 1) and a write (`send_message`: a row in routd.db, the chat's event
//!   stream told). Prints p50 / p99 of the round trip per tool (targets: p50 ≤ 2 ms, p99 ≤
//!   10 ms), and, as the reference in the same run, the same calls on a `ping`.
//! - **The LLM gateway**: a stub provider on loopback that starts its event stream at once;
//!   `BENCH_STREAMS` (500) streaming `POST /v1/messages` with the turn's spawn token through
//!   the turn's `api.sock`, interleaved with the same request straight to the stub. Prints
//!   the time to the first streamed byte of each (p50 / p99) and what the gateway adds
//!   (target: ≤ 2 ms at p50), and the whole answer's time.

use std::time::{Duration, Instant};

use hako_authd::testing::{ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::authd::AuthdClient;
use hako_client::{Client, Daemon, routd as api};
use hako_shared::chat::{GroupConfig, PostMessage, TurnState, TurnView};
use hako_shared::config::Env;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

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
    let authd = TestAuthd::start(&dir.path().join("authd")).await;
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
    let stub = stub_provider().await;
    let cfg = hako_routd::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
        ("RUNED_URL", runed.url()),
        ("ROUTD_LISTEN", "127.0.0.1:0".into()),
        ("ANTHROPIC_API_KEY", "sk-bench".into()),
        ("ROUTD_ANTHROPIC_URL", stub.clone()),
        ("ROUTD_LLM_DAILY_TOKENS", "1000000000".into()),
    ]))
    .expect("routd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let routd = hako_routd::start(cfg, l).await.expect("routd");
    let operator = authd.token("operator").await;
    let channel = authd.token("channel").await;
    let client =
        Client::new(Daemon::Routd, &routd.url(), Duration::from_secs(30)).expect("a routd client");
    let cfg: GroupConfig = serde_json::from_value(json!({"name": "bench"})).expect("a group");
    client
        .call(api::put_group("bench", &cfg), Some(&operator))
        .await
        .expect("group");
    let say = |id: &str, content: &str| -> PostMessage {
        serde_json::from_value(
            json!({"id": id, "chat_jid": "web:bench", "sender": "bench", "content": content}),
        )
        .expect("a message")
    };
    let posted = client
        .call(
            api::post_message(&say("live", "/sleep 600")),
            Some(&channel),
        )
        .await
        .expect("post");
    assert!(!posted.duplicate, "{posted:?}");
    // The turn is live once runed runs it; its socket is bound before.
    let deadline = Instant::now() + Duration::from_secs(60);
    let turn = loop {
        let mut list = client
            .call(
                api::turns()
                    .query("folder", "bench")
                    .query("state", TurnState::Running),
                Some(&operator),
            )
            .await
            .expect("turns");
        if !list.turns.is_empty() {
            break list.turns.swap_remove(0);
        }
        assert!(Instant::now() < deadline, "the turn never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
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
    gateway(&authd, &turn, &data, &stub).await;
    let _ = client
        .call(api::post_message(&say("stop", "/stop")), Some(&channel))
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

/// A provider that answers every `POST /v1/messages` with a short event stream, the first
/// event written at once.
async fn stub_provider() -> String {
    const EVENTS: &str = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let app = axum::Router::new().route(
        "/v1/messages",
        axum::routing::post(|_body: axum::body::Bytes| async {
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from(EVENTS))
                .expect("response")
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// Time to the first byte and to the end of a streaming call, on a connection of its own
/// (as the agent's client makes one per call). Sent by hand on purpose: a provider's
/// `POST /v1/messages` (the stub's, or routd's LLM gateway on the turn's `api.sock`, with
/// the agent's `x-api-key`), not an operation of a daemon's API.
async fn timed(
    http: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    body: &Value,
) -> (Duration, Duration) {
    let t = Instant::now();
    let mut req = http.post(url).json(body);
    if let Some(tok) = token {
        req = req.header("x-api-key", tok);
    }
    let mut resp = req.send().await.expect("send");
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.expect("chunk").expect("a first piece");
    let ttfb = t.elapsed();
    assert!(!first.is_empty());
    while resp.chunk().await.expect("chunk").is_some() {}
    (ttfb, t.elapsed())
}

async fn gateway(authd: &TestAuthd, turn: &TurnView, data: &std::path::Path, stub: &str) {
    let streams: usize = std::env::var("BENCH_STREAMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let runed_token = authd.token("runed").await;
    let client = AuthdClient::new(&authd.url()).expect("client");
    let spawn = client
        .mint(
            &runed_token,
            &hako_shared::auth::wire::MintRequest {
                scope: vec!["llm:call".into()],
                folder: Some("bench".into()),
                ttl_seconds: Some(3600),
                run_id: turn.run_id.as_ref().map(|r| r.to_string()),
                turn_id: Some(format!("{}.1", turn.turn_id)),
                ..Default::default()
            },
        )
        .await
        .expect("spawn token")
        .token;
    let sock = data.join("folders/bench/ipc/api.sock");
    // A new connection per call on both sides, as the agent makes them.
    let via_gateway = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .unix_socket(sock)
        .build()
        .expect("client");
    let direct = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    let body = json!({"model": "m", "max_tokens": 10, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    // routd's LLM gateway speaks the provider's API on the turn's socket: no hako-client op.
    let gw_url = "http://gateway/v1/messages";
    let stub_url = format!("{stub}/v1/messages");
    for _ in 0..20 {
        timed(&via_gateway, gw_url, Some(&spawn), &body).await;
        timed(&direct, &stub_url, None, &body).await;
    }
    let (mut g_first, mut g_all, mut d_first, mut d_all) = (vec![], vec![], vec![], vec![]);
    for _ in 0..streams {
        let (f, a) = timed(&via_gateway, gw_url, Some(&spawn), &body).await;
        g_first.push(f);
        g_all.push(a);
        let (f, a) = timed(&direct, &stub_url, None, &body).await;
        d_first.push(f);
        d_all.push(a);
    }
    for v in [&mut g_first, &mut g_all, &mut d_first, &mut d_all] {
        v.sort();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("LLM gateway, {streams} streaming calls each way, interleaved:");
    println!(
        "  first byte  straight to the stub p50 {:>7.3} ms  p99 {:>7.3} ms",
        ms(pct(&d_first, 0.5)),
        ms(pct(&d_first, 0.99))
    );
    println!(
        "  first byte  through the gateway  p50 {:>7.3} ms  p99 {:>7.3} ms",
        ms(pct(&g_first, 0.5)),
        ms(pct(&g_first, 0.99))
    );
    println!(
        "  whole answer: straight p50 {:.3} ms, through the gateway p50 {:.3} ms",
        ms(pct(&d_all, 0.5)),
        ms(pct(&g_all, 0.5))
    );
    let added = pct(&g_first, 0.5).saturating_sub(pct(&d_first, 0.5));
    println!(
        "  added by the gateway at p50: {:.3} ms (target <= 2 ms: {})",
        ms(added),
        if added <= Duration::from_millis(2) {
            "PASS"
        } else {
            "FAIL"
        }
    );
}
