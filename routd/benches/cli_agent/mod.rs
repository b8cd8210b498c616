//! What the Claude Code and Codex benches share: the stack (authd, runed with the agent's
//! image, routd with the stub provider), the two groups (every turn cold; the next box warm),
//! a timed turn through hako, the host's run of the same program, and the report. Each bench
//! says only what differs: the image, the provider, the group's agent and the host command.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_authd::testing::{ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::{Client, Daemon, routd as api, runed as runed_api};
use hako_shared::chat::{Direction, GroupConfig, PostMessage, TurnState};
use hako_shared::config::Env;
use serde_json::{Value, json};

/// How long a call of the daemons' APIs (event streams aside) may take.
const CALL: Duration = Duration::from_secs(30);

/// When each call of the stub model came.
pub type Calls = Arc<Mutex<Vec<Instant>>>;

/// One agent program, as the bench compares it.
pub struct Agent {
    /// How the report names it (`claude code`, `codex`).
    pub name: &'static str,
    /// The container the cold turn starts (`hako-claude`).
    pub container: &'static str,
    /// What the host runs, for the report (`claude -p`).
    pub host: &'static str,
    /// runed's variable naming its image, and the image.
    pub image: (&'static str, String),
    /// The group's `group` settings (agent, llm), `warm` added per group.
    pub group: Value,
    /// routd's variables for the stub provider (`url` is the stub's).
    pub provider: fn(url: &str) -> Vec<(&'static str, String)>,
    /// The body of every answer of the stub model (an event stream).
    pub answer: String,
    /// The targets the report states.
    pub targets: &'static str,
}

/// Runs the bench: `BENCH_TURNS` (7) interleaved rounds of a cold turn, a warm turn and the
/// host's run (`host(i, stub_url)`, timed to its first stdout byte), after one round not
/// counted; prints the medians.
pub async fn bench(agent: Agent, host: impl Fn(usize, &str) -> tokio::process::Command) {
    let turns: usize = std::env::var("BENCH_TURNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let (calls, url) = stub(agent.answer.clone()).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let authd = TestAuthd::start(&dir.path().join("authd")).await;
    let rcfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        (agent.image.0, agent.image.1.clone()),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let runed = hako_runed::start(rcfg, l).await.expect("runed");
    let mut env = vec![
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", ROUTD_KEY.into()),
        ("RUNED_URL", runed.url()),
        // The bench posts as a chat adapter into the groups' web: chats.
        ("ROUTD_CHANNEL_CHATS", "web:bench*".into()),
    ];
    env.extend((agent.provider)(&url));
    let cfg = hako_routd::Config::from_env(&Env::from_pairs(env)).expect("routd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let routd = hako_routd::start(cfg, l).await.expect("routd");
    let operator = authd.token("operator").await;
    let channel = authd.token("channel").await;
    let client = Client::new(Daemon::Routd, &routd.url(), CALL).expect("a routd client");
    let runed_client = Client::new(Daemon::Runed, &runed.url(), CALL).expect("a runed client");
    // One group whose every turn starts cold, one whose next box is warm.
    for (folder, warm) in [("bench", false), ("benchw", true)] {
        let mut group = agent.group.clone();
        group["warm"] = json!(warm);
        let cfg = json!({"name": folder, "group": group});
        let cfg: GroupConfig = serde_json::from_value(cfg).expect("a group's settings");
        client
            .call(api::put_group(folder, &cfg), Some(&operator))
            .await
            .expect("the group");
    }
    let turn = |folder: &'static str, i: usize| {
        let (client, operator, channel, calls) = (&client, &operator, &channel, &calls);
        async move { hako_turn(client, operator, channel, calls, folder, i).await }
    };

    let mut m = Samples::default();
    for i in 0..=turns {
        let (c, cm) = turn("bench", i).await;
        // The warm group's box is made after its last turn; a chat's next message comes
        // later than that.
        if i > 0 {
            wait_warm_box(&runed_client, agent.name).await;
        }
        let (w, wm) = turn("benchw", i).await;
        // The host: the same program against the same stub, its first stdout byte.
        let t = Instant::now();
        let before = calls.lock().unwrap().len();
        let mut child = host(i, &url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the agent on the host");
        let mut out = child.stdout.take().unwrap();
        let mut b = [0u8; 1];
        tokio::io::AsyncReadExt::read(&mut out, &mut b)
            .await
            .unwrap();
        let h = t.elapsed();
        let hm = calls
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
        m.cold.push(c);
        m.warm.push(w);
        m.host.push(h);
        m.cold_model.extend(cm);
        m.warm_model.extend(wm);
        m.host_model.extend(hm);
    }
    m.report(&agent, turns);
    routd.shutdown().await;
    runed.shutdown().await;
    let _ = authd.shutdown().await;
}

/// What each round measured: to the first reply byte, and to the model's first request.
#[derive(Default)]
struct Samples {
    cold: Vec<Duration>,
    warm: Vec<Duration>,
    host: Vec<Duration>,
    cold_model: Vec<Duration>,
    warm_model: Vec<Duration>,
    host_model: Vec<Duration>,
}

impl Samples {
    fn report(self, agent: &Agent, turns: usize) {
        let (h, hw, d) = (median(self.cold), median(self.warm), median(self.host));
        let (hm, hwm, dm) = (
            median(self.cold_model),
            median(self.warm_model),
            median(self.host_model),
        );
        let name = agent.name;
        println!("{name}, message → first reply byte, medians of {turns}:");
        let rows = [
            (
                format!(
                    "through hako, cold turn (a new {} container):",
                    agent.container
                ),
                h,
            ),
            (
                "through hako, warm turn (the folder's box, started before):".into(),
                hw,
            ),
            (format!("{} on the host, same stub:", agent.host), d),
        ];
        for (what, t) in rows {
            println!("  {what:<60} {}", ms(t));
        }
        println!(
            "  ratio cold/host {:.2}, warm/host {:.2} ({}); warm saves {} ({name}'s own start: {})",
            h.as_secs_f64() / d.as_secs_f64(),
            hw.as_secs_f64() / d.as_secs_f64(),
            agent.targets,
            ms(h.saturating_sub(hw)),
            ms(dm)
        );
        println!(
            "  to the model's first request: cold {} (container start + {name}'s start), warm {}, host {} ({name}'s start)",
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
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// An event stream's frame: `event: <type>` and the data.
pub fn sse(event: &str, data: &Value) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

/// The stub model: answers every call at once with `answer`, streamed; records when each
/// call came.
async fn stub(answer: String) -> (Calls, String) {
    let calls: Calls = Arc::default();
    let seen = calls.clone();
    let app = axum::Router::new().fallback(axum::routing::any(move || {
        let (seen, answer) = (seen.clone(), answer.clone());
        async move {
            seen.lock().unwrap().push(Instant::now());
            axum::response::Response::builder()
                .header("content-type", "text/event-stream")
                .body(axum::body::Body::from(answer))
                .unwrap()
        }
    }));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (calls, url)
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

/// Waits until runed keeps a warm box (`runed_warm_boxes` 1) whose agent is started and
/// waits for its turn: its MCP bridge, which only an agent past its own start runs, waits
/// for the turn (`mcp-bridge … --after`, seen in the host's `/proc`).
async fn wait_warm_box(runed: &Client, name: &str) {
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
            assert!(Instant::now() < deadline, "no {name} waits in a warm box");
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
