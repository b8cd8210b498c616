//! Claude Code through hako against Claude Code on the host: `cargo bench -p hako-routd
//! --bench claude`.
//!
//! The time to the first reply byte of a chat message answered by a `"agent": "claude"` group
//! (a cold turn: runed starts a `hako-claude` container, hako-agent starts Claude Code, Claude
//! Code calls the model through routd's gateway; the reply seen on the chat's event stream),
//! the same in a warm box (another group, whose next box runed started after its last turn,
//! with Claude Code already started in it and waiting for the turn),
//! against `claude -p` run directly on the host against the same stub provider (its first
//! stdout byte), interleaved, `BENCH_TURNS` (7) of each, medians. Where the time goes: from
//! the message to the model's first request (container start and Claude Code's start), and
//! from the model's answer to the reply in the chat. Target ratio ≤ 1.25.
//!
//! A real authd, runed and routd in-process; the stub answers at once, so what is measured is
//! hako and Claude Code, not a model.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_authd::testing::{ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::{Client, Daemon, routd as api, runed as runed_api};
use hako_shared::chat::{Direction, GroupConfig, PostMessage, TurnState};
use hako_shared::config::Env;
use serde_json::{Value, json};

/// How long a call of the daemons' APIs (event streams aside) may take.
const CALL: Duration = Duration::from_secs(30);

const MODEL: &str = "claude-stub-1";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The stub model: answers every call at once, streamed; records when each call came.
async fn stub() -> (Arc<Mutex<Vec<Instant>>>, String) {
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().fallback(axum::routing::any(move || {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(Instant::now());
            let ev = |n: &str, d: Value| format!("event: {n}\ndata: {d}\n\n");
            let body = [
                ev("message_start", json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "model": MODEL, "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})),
                ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
                ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello back"}})),
                ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
                ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}})),
                ev("message_stop", json!({"type": "message_stop"})),
            ]
            .concat();
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from(body))
                .unwrap()
        }
    }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (calls, url)
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let image = hako_deploy::ensure_claude_image().await.expect("image");
    let pipeline = hako_deploy::Pipeline::new(hako_deploy::connect_docker().unwrap());
    let claude = pipeline
        .fetch(&hako_deploy::CLAUDE_CODE)
        .await
        .expect("the claude binary");
    let (calls, url) = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let authd = TestAuthd::start(&dir.path().join("authd")).await;
    let rcfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        ("RUNED_CLAUDE_IMAGE", image.clone()),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runed = hako_runed::start(rcfg, l).await.expect("runed");
    let cfg = hako_routd::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
        ("RUNED_URL", runed.url()),
        ("ANTHROPIC_API_KEY", "sk-bench".into()),
        ("ROUTD_ANTHROPIC_URL", url.clone()),
        // The bench posts as a chat adapter into the groups' web: chats.
        ("ROUTD_CHANNEL_CHATS", "web:bench*".into()),
    ]))
    .expect("routd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let routd = hako_routd::start(cfg, l).await.expect("routd");
    let operator = authd.token("operator").await;
    let channel = authd.token("channel").await;
    let client = Client::new(Daemon::Routd, &routd.url(), CALL).expect("a routd client");
    let runed_client = Client::new(Daemon::Runed, &runed.url(), CALL).expect("a runed client");
    // One group whose every turn starts cold, one whose next box is warm.
    for (folder, warm) in [("bench", false), ("benchw", true)] {
        let cfg = json!({"name": folder, "group": {"agent": "claude", "llm": {"model": MODEL}, "warm": warm}});
        let cfg: GroupConfig = serde_json::from_value(cfg).expect("a group's settings");
        client
            .call(api::put_group(folder, &cfg), Some(&operator))
            .await
            .expect("the group");
    }
    let home = tempfile::tempdir().unwrap();
    let turn = |folder: &'static str, i: usize| {
        let (client, operator, channel, calls) = (&client, &operator, &channel, &calls);
        async move { hako_turn(client, operator, channel, calls, folder, i).await }
    };

    let (mut cold, mut cold_model, mut warm, mut warm_model, mut direct, mut direct_model) = (
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    for i in 0..=turns {
        let (c, cm) = turn("bench", i).await;
        // The warm group's box is made after its last turn; a chat's next message comes
        // later than that.
        if i > 0 {
            wait_warm_box(&runed_client).await;
        }
        let (w, wm) = turn("benchw", i).await;
        // The host: `claude -p` against the same stub, its first stdout byte.
        let t = Instant::now();
        let before = calls.lock().unwrap().len();
        let mut child = tokio::process::Command::new(&claude)
            .args(["-p", &format!("hello {i}"), "--model", MODEL])
            .env("HOME", home.path())
            .env("ANTHROPIC_BASE_URL", &url)
            .env("ANTHROPIC_API_KEY", "sk-bench")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("claude on the host");
        let mut out = child.stdout.take().unwrap();
        let mut b = [0u8; 1];
        tokio::io::AsyncReadExt::read(&mut out, &mut b)
            .await
            .unwrap();
        let host = t.elapsed();
        let host_model = calls
            .lock()
            .unwrap()
            .get(before)
            .map(|c| c.duration_since(t));
        let _ = child.wait().await;
        // The first of each warms the page cache and Docker (and is the warm group's first,
        // cold, turn): not counted.
        if i == 0 {
            continue;
        }
        cold.push(c);
        warm.push(w);
        direct.push(host);
        cold_model.extend(cm);
        warm_model.extend(wm);
        direct_model.extend(host_model);
    }
    let (h, hw, d) = (median(cold), median(warm), median(direct));
    let (hm, hwm, dm) = (median(cold_model), median(warm_model), median(direct_model));
    println!("claude code, message → first reply byte, medians of {turns}:");
    println!(
        "  through hako, cold turn (a new hako-claude container): {}",
        ms(h)
    );
    println!(
        "  through hako, warm turn (the folder's box, started before): {}",
        ms(hw)
    );
    println!(
        "  claude -p on the host, same stub:                       {}",
        ms(d)
    );
    println!(
        "  ratio cold/host {:.2} (target ≤ 1.25), warm/host {:.2}; warm saves {} (Claude Code's own start: {})",
        h.as_secs_f64() / d.as_secs_f64(),
        hw.as_secs_f64() / d.as_secs_f64(),
        ms(h.saturating_sub(hw)),
        ms(dm)
    );
    println!(
        "  to the model's first request: cold {} (container start + Claude Code's start), warm {}, host {} (Claude Code's start)",
        ms(hm),
        ms(hwm),
        ms(dm)
    );
    println!(
        "  after the model's answer: cold {}, warm {}, host {}",
        ms(h.saturating_sub(hm)),
        ms(hw.saturating_sub(hwm)),
        ms(d.saturating_sub(dm))
    );
    routd.shutdown().await;
    runed.shutdown().await;
    let _ = authd.shutdown().await;
}

/// A message into `web:<folder>`; the time to the first reply on the chat's stream, and to
/// the model's first request.
async fn hako_turn(
    routd: &Client,
    operator: &str,
    channel: &str,
    calls: &Mutex<Vec<Instant>>,
    folder: &str,
    i: usize,
) -> (Duration, Option<Duration>) {
    let jid = format!("web:{folder}");
    let last = last_seq(routd, operator, &jid).await;
    let mut events = routd
        .events(api::chat_events(&jid).query("after", last), Some(operator))
        .await
        .expect("the chat's event stream");
    let m = json!({"id": format!("m-{folder}-{i}"), "chat_jid": jid, "sender": "bench", "content": format!("hello {i}")});
    let m: PostMessage = serde_json::from_value(m).expect("a message");
    let before = calls.lock().unwrap().len();
    let t = Instant::now();
    let posted = routd
        .call(api::post_message(&m), Some(channel))
        .await
        .expect("the message taken");
    assert!(!posted.duplicate, "{posted:?}");
    let took = loop {
        let m = tokio::time::timeout(Duration::from_secs(120), events.next())
            .await
            .expect("a reply within 2 minutes")
            .expect("the chat's event stream")
            .expect("the stream stays open");
        if m.direction == Direction::Out {
            break t.elapsed();
        }
    };
    let model_at = calls
        .lock()
        .unwrap()
        .get(before)
        .map(|c| c.duration_since(t));
    wait_idle(routd, operator, folder).await;
    (took, model_at)
}

/// Waits until runed keeps a warm box (`runed_warm_boxes` 1) whose Claude Code is started
/// and waits for its turn: its MCP bridge, which only a Claude Code past its own start runs,
/// waits for the turn (`mcp-bridge … --after`, seen in the host's `/proc`).
async fn wait_warm_box(runed: &Client) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let bridge = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .any(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("mcp-bridge") && c.contains("--after")
            });
        if !bridge {
            assert!(
                Instant::now() < deadline,
                "no Claude Code waits in a warm box"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let text = runed
            .text(runed_api::metrics(), None)
            .await
            .expect("runed's metrics");
        if text.lines().any(|l| l == "runed_warm_boxes 1") {
            return;
        }
        assert!(Instant::now() < deadline, "no warm box");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn last_seq(routd: &Client, token: &str, jid: &str) -> i64 {
    let page = routd
        .call(api::chat_messages(jid).query("limit", 1), Some(token))
        .await
        .expect("the chat's messages");
    page.messages.last().map_or(0, |m| m.seq)
}

async fn wait_idle(routd: &Client, token: &str, folder: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut live = 0;
        for state in TurnState::LIVE {
            let list = routd
                .call(
                    api::turns().query("folder", folder).query("state", state),
                    Some(token),
                )
                .await
                .expect("the folder's turns");
            live += list.turns.len();
        }
        if live == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "the turn never ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
