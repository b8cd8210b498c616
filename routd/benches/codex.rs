//! Codex through hako against Codex on the host: `cargo bench -p hako-routd --bench codex`.
//!
//! The time to the first reply byte of a chat message answered by a `"agent": "codex"` group
//! (a cold turn: runed starts a `hako-codex` container, hako-agent starts Codex's app server,
//! Codex calls the model through routd's gateway; the reply seen on the chat's event stream),
//! the same in a warm box (another group, whose next box runed started after its last turn,
//! with Codex already started in it, its thread open, waiting for the turn), against `codex
//! exec` run directly on the host against the same stub provider (its first stdout byte: the
//! answer), interleaved, `BENCH_TURNS` (7) of each, medians. Where the time goes: from the
//! message to the model's first request (container start and Codex's start), and from the
//! model's answer to the reply in the chat. Targets: warm ≤ 0.5, cold ≤ 1.25 of the host's.
//!
//! A real authd, runed and routd in-process; the stub answers at once, so what is measured is
//! hako and Codex, not a model.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_authd::testing::{ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::{Client, Daemon, routd as api, runed as runed_api};
use hako_shared::chat::{Direction, GroupConfig, PostMessage, TurnState};
use hako_shared::config::Env;
use serde_json::{Value, json};

/// How long a call of the daemons' APIs (event streams aside) may take.
const CALL: Duration = Duration::from_secs(30);

const MODEL: &str = "gpt-stub-bench";

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The stub model (the Responses API): answers every call at once, streamed; records when
/// each call came.
async fn stub() -> (Arc<Mutex<Vec<Instant>>>, String) {
    let calls: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().fallback(axum::routing::any(move || {
        let seen = seen.clone();
        async move {
            seen.lock().unwrap().push(Instant::now());
            let ev = |d: Value| format!("event: {}\ndata: {d}\n\n", d["type"].as_str().unwrap());
            let item = json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "hello back", "annotations": []}]});
            let body = [
                ev(json!({"type": "response.created", "sequence_number": 0, "response": {"id": "r", "object": "response", "status": "in_progress", "output": []}})),
                ev(json!({"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "hello back"})),
                ev(json!({"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": item})),
                ev(json!({"type": "response.completed", "sequence_number": 3, "response": {"id": "r", "object": "response", "status": "completed", "output": [item],
                    "usage": {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}}})),
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
    let image = hako_deploy::ensure_codex_image().await.expect("image");
    let pipeline = hako_deploy::Pipeline::new(hako_deploy::connect_docker().unwrap());
    let codex = pipeline
        .fetch(&hako_deploy::CODEX_CLI)
        .await
        .expect("the codex binary");
    let (calls, url) = stub().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let authd = TestAuthd::start(&dir.path().join("authd")).await;
    let rcfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        ("RUNED_CODEX_IMAGE", image.clone()),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runed = hako_runed::start(rcfg, l).await.expect("runed");
    let cfg = hako_routd::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
        ("RUNED_URL", runed.url()),
        ("OPENAI_API_KEY", "sk-bench".into()),
        ("ROUTD_OPENAI_URL", url.clone()),
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
        let cfg = json!({"name": folder, "group": {"agent": "codex", "llm": {"model": MODEL, "api": "openai"}, "warm": warm}});
        let cfg: GroupConfig = serde_json::from_value(cfg).expect("a group's settings");
        client
            .call(api::put_group(folder, &cfg), Some(&operator))
            .await
            .expect("the group");
    }
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let provider = format!(
        "model_providers.bench={{name = \"bench\", base_url = \"{url}/v1\", wire_api = \"responses\", env_key = \"BENCH_KEY\"}}"
    );
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
        // The host: `codex exec` against the same stub, its first stdout byte (the answer).
        let t = Instant::now();
        let before = calls.lock().unwrap().len();
        let mut child = tokio::process::Command::new(&codex)
            .args(["exec", "--skip-git-repo-check", "-m", MODEL])
            .args(["-c", "model_provider=\"bench\"", "-c", &provider])
            .arg("-C")
            .arg(work.path())
            .arg(format!("hello {i}"))
            .env("CODEX_HOME", home.path())
            .env("BENCH_KEY", "sk-bench")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("codex on the host");
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
    println!("codex, message → first reply byte, medians of {turns}:");
    println!(
        "  through hako, cold turn (a new hako-codex container):  {}",
        ms(h)
    );
    println!(
        "  through hako, warm turn (the folder's box, started before): {}",
        ms(hw)
    );
    println!(
        "  codex exec on the host, same stub:                      {}",
        ms(d)
    );
    println!(
        "  ratio cold/host {:.2} (target ≤ 1.25), warm/host {:.2} (target ≤ 0.5); warm saves {} (Codex's own start: {})",
        h.as_secs_f64() / d.as_secs_f64(),
        hw.as_secs_f64() / d.as_secs_f64(),
        ms(h.saturating_sub(hw)),
        ms(dm)
    );
    println!(
        "  to the model's first request: cold {} (container start + Codex's start), warm {}, host {} (Codex's start)",
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

/// Waits until runed keeps a warm box (`runed_warm_boxes` 1) whose Codex is started and waits
/// for its turn: its MCP bridge, which only a Codex past its thread's start runs, waits for
/// the turn (`mcp-bridge … --after`, seen in the host's `/proc`).
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
            assert!(Instant::now() < deadline, "no Codex waits in a warm box");
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
