//! routd's benches: `cargo bench -p hako-routd --bench routd`.
//!
//! (a) ingest: `BENCH_MESSAGES` (20,000) messages POSTed over HTTP on loopback by 16
//!     keep-alive connections, with one SSE subscriber on the chat that must see every one
//!     (target ≥ 5,000 messages/s on a 2-core machine);
//! (b) latency: a message in to its reply out (seen on the chat's SSE stream) through routd,
//!     against the same run posted straight to runed and followed on its event stream to its
//!     first output block, interleaved, median of 15 each
//!     (target ratio ≤ 1.15);
//! (c) idle RSS of the `routd` binary after start and a few requests (target ≤ 20 MiB).
//!
//! A real authd, runed (with `hako-agent` containers) and routd, as in production.

use std::time::{Duration, Instant};

use hako_authd::testing::{ROUTD_KEY, RUNED_KEY, TestAuthd};
use hako_client::{Client, Daemon, Events, Op, routd as api, runed as runed_api};
use hako_shared::chat::{Direction, GroupConfig, MessageView, PostMessage};
use hako_shared::config::Env;
use hako_shared::runs::{RunRequest, RunStreamEvent};
use serde::de::DeserializeOwned;
use serde_json::json;

const CONNS: usize = 16;
const N: usize = 15;
/// How long a call of the daemons' APIs (event streams aside) may take.
const CALL: Duration = Duration::from_secs(60);

fn env_or(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Reads an event stream until `n` events arrived; returns when each came.
async fn subscribe<T: DeserializeOwned>(
    client: Client,
    op: Op<Events<T>>,
    token: String,
    n: usize,
) -> Vec<(Instant, T)> {
    subscribe_until(client, op, token, move |seen: &[(Instant, T)]| {
        seen.len() >= n
    })
    .await
}

/// Reads an event stream until `done` says so; returns each event with when it came.
async fn subscribe_until<T: DeserializeOwned>(
    client: Client,
    op: Op<Events<T>>,
    token: String,
    done: impl Fn(&[(Instant, T)]) -> bool,
) -> Vec<(Instant, T)> {
    let mut events = client.events(op, Some(&token)).await.expect("stream");
    let mut out = Vec::new();
    while !done(&out) {
        let Some(ev) = tokio::time::timeout(Duration::from_secs(120), events.next())
            .await
            .expect("events keep coming")
            .expect("stream")
        else {
            break;
        };
        out.push((Instant::now(), ev));
    }
    out
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

async fn bench() {
    let messages = env_or("BENCH_MESSAGES", 20_000);
    let image = hako_deploy::ensure_agent_image()
        .await
        .expect("agent image");
    let dir = tempfile::tempdir().expect("tempdir");
    let authd = TestAuthd::start(&dir.path().join("authd")).await;
    let rcfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", dir.path().join("runed").display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        ("CONTAINER_IMAGE", image.clone()),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let runed = hako_runed::start(rcfg, l).await.expect("runed");
    let routd_env = |port: u16| {
        vec![
            (
                "DATA_DIR".to_owned(),
                dir.path().join("routd").display().to_string(),
            ),
            ("AUTHD_URL".to_owned(), authd.url()),
            ("AUTHD_SERVICE_KEY".to_owned(), ROUTD_KEY.to_owned()),
            ("RUNED_URL".to_owned(), runed.url()),
            ("ROUTD_LISTEN".to_owned(), format!("127.0.0.1:{port}")),
            // The bench posts as a chat adapter, into the latency group's web: chat too.
            ("ROUTD_CHANNEL_CHATS".to_owned(), "*,web:lat".to_owned()),
        ]
    };
    let cfg = hako_routd::Config::from_env(&Env::from_pairs(routd_env(0))).expect("routd config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let routd = hako_routd::start(cfg, l).await.expect("routd");
    let operator = authd.token("operator").await;
    let channel = authd.token("channel").await;
    let routd_token = authd.token("routd").await;
    let client = Client::new(Daemon::Routd, &routd.url(), CALL).expect("a routd client");
    let runed_client = Client::new(Daemon::Runed, &runed.url(), CALL).expect("a runed client");

    // (a) ingest into one chat with a subscriber.
    let chat = "bench:ingest";
    let sub = tokio::spawn(subscribe(
        client.clone(),
        api::chat_events(chat).query("after", 0),
        operator.clone(),
        messages,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let per = messages / CONNS;
    let posts: Vec<_> = (0..CONNS)
        .map(|c| {
            let (client, channel) = (client.clone(), channel.clone());
            tokio::spawn(async move {
                for i in 0..per {
                    let m = PostMessage {
                        id: Some(format!("b-{c}-{i}")),
                        chat_jid: chat.into(),
                        sender: "bench".into(),
                        sender_name: None,
                        content: "some text of a chat message".into(),
                        timestamp: None,
                        reply_to: None,
                    };
                    let posted = client
                        .call(api::post_message(&m), Some(&channel))
                        .await
                        .expect("post");
                    assert!(!posted.duplicate, "{posted:?}");
                }
            })
        })
        .collect();
    for p in posts {
        p.await.expect("poster");
    }
    let posted = t.elapsed();
    let seen = sub.await.expect("subscriber");
    let all_seen = seen.last().map_or(posted, |(at, _)| at.duration_since(t));
    let total = per * CONNS;
    assert_eq!(seen.len(), total, "the subscriber saw every message");
    let rate = total as f64 / all_seen.as_secs_f64();
    println!(
        "ingest: {total} messages over {CONNS} connections in {:.2} s posted, {:.2} s until the subscriber had all: {:.0} messages/s (target >= 5000: {})",
        posted.as_secs_f64(),
        all_seen.as_secs_f64(),
        rate,
        if rate >= 5000.0 { "PASS" } else { "FAIL" }
    );

    // (b) latency: through routd vs straight to runed.
    let cfg: GroupConfig = serde_json::from_value(json!({"name": "lat"})).expect("a group");
    client
        .call(api::put_group("lat", &cfg), Some(&operator))
        .await
        .expect("group");
    // Interleaved, so both see the same machine.
    let (mut via_routd, mut direct) = (Vec::new(), Vec::new());
    for i in 0..N {
        let sub = tokio::spawn(subscribe_until(
            client.clone(),
            api::chat_events("web:lat"),
            operator.clone(),
            |seen: &[(Instant, MessageView)]| {
                seen.iter().any(|(_, m)| m.direction == Direction::Out)
            },
        ));
        let m = json!({"id": format!("lat-{i}"), "chat_jid": "web:lat", "sender": "bench", "content": "x"});
        let m: PostMessage = serde_json::from_value(m).expect("a message");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        let posted = client
            .call(api::post_message(&m), Some(&channel))
            .await
            .expect("post");
        assert!(!posted.duplicate, "{posted:?}");
        let events = sub.await.expect("events");
        if std::env::var_os("BENCH_TRACE").is_some() {
            for (at, m) in &events {
                println!("  routd +{:?} {m:?}", at.duration_since(t));
            }
        }
        let reply = events.last().expect("a reply");
        assert_eq!(reply.1.direction, Direction::Out, "{events:?}");
        via_routd.push(reply.0.duration_since(t));
        // Let the turn end (the folder is free) before the next.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let req = json!({"folder": "direct", "turn_id": format!("direct-{i}"), "messages": [{"role": "user", "content": "x"}]});
        let req: RunRequest = serde_json::from_value(req).expect("a run");
        let t = Instant::now();
        let created = runed_client
            .call(runed_api::create_run(&req), Some(&routd_token))
            .await
            .expect("run");
        // The run's own stream, to the first output block: what routd waits for too.
        let events = subscribe_until(
            runed_client.clone(),
            runed_api::run_events(&created.run_id),
            routd_token.clone(),
            |seen: &[(Instant, RunStreamEvent)]| {
                seen.iter()
                    .any(|(_, e)| matches!(e, RunStreamEvent::Output { block: Some(_), .. }))
            },
        )
        .await;
        if std::env::var_os("BENCH_TRACE").is_some() {
            for (at, e) in &events {
                println!("  direct +{:?} {e:?}", at.duration_since(t));
            }
        }
        direct.push(events.last().expect("an output").0.duration_since(t));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (r, d) = (median(via_routd), median(direct));
    let ratio = r.as_secs_f64() / d.as_secs_f64();
    println!(
        "latency: message -> reply through routd {:.0} ms, run straight to runed {:.0} ms (medians of {N}): ratio {ratio:.2} (target <= 1.15: {})",
        r.as_secs_f64() * 1000.0,
        d.as_secs_f64() * 1000.0,
        if ratio <= 1.15 { "PASS" } else { "FAIL" }
    );

    // (c) idle RSS of the binary.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let bin_dir = tempfile::tempdir().expect("tempdir");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_routd"));
    cmd.env_clear()
        .env("DATA_DIR", bin_dir.path())
        .env("HAKO_OPEN_DEV", "1")
        .env("RUNED_URL", runed.url())
        .env("ROUTD_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().expect("routd binary");
    let bin = Client::new(Daemon::Routd, &format!("http://127.0.0.1:{port}"), CALL)
        .expect("a client of the routd binary");
    let deadline = Instant::now() + Duration::from_secs(20);
    // Any answer will do: it listens.
    while bin.raw(&api::health(), None).await.is_err() {
        assert!(Instant::now() < deadline, "routd binary did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..20 {
        let m =
            json!({"id": format!("i-{i}"), "chat_jid": "idle:1", "sender": "b", "content": "x"});
        let m: PostMessage = serde_json::from_value(m).expect("a message");
        let _ = bin.call(api::post_message(&m), None).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let _ = child.kill();
    let _ = child.wait();
    let mib = rss_kib as f64 / 1024.0;
    println!(
        "idle RSS of routd: {mib:.1} MiB (target <= 20: {})",
        if mib <= 20.0 { "PASS" } else { "FAIL" }
    );
    routd.shutdown().await;
    runed.shutdown().await;
    let _ = authd.shutdown().await;
}
