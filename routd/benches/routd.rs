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
use hako_shared::config::Env;
use serde_json::{Value, json};

const CONNS: usize = 16;
const N: usize = 15;

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

/// Reads an SSE stream until `n` events arrived; returns when each came.
async fn subscribe(
    http: reqwest::Client,
    url: String,
    token: String,
    n: usize,
) -> Vec<(Instant, Value)> {
    subscribe_until(http, url, token, move |seen: &[(Instant, Value)]| {
        seen.len() >= n
    })
    .await
}

/// Reads an SSE stream until `done` says so; returns each event with when it came.
async fn subscribe_until(
    http: reqwest::Client,
    url: String,
    token: String,
    done: impl Fn(&[(Instant, Value)]) -> bool,
) -> Vec<(Instant, Value)> {
    let mut resp = http
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("stream");
    assert_eq!(resp.status(), 200);
    let mut buf = String::new();
    let mut out = Vec::new();
    while !done(&out) {
        let Some(chunk) = tokio::time::timeout(Duration::from_secs(120), resp.chunk())
            .await
            .expect("events keep coming")
            .expect("stream")
        else {
            break;
        };
        buf.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buf.find("\n\n") {
            let ev: String = buf.drain(..end + 2).collect();
            if let Some(d) = ev.lines().find_map(|l| l.strip_prefix("data:")) {
                out.push((
                    Instant::now(),
                    serde_json::from_str(d.trim()).expect("json"),
                ));
            }
        }
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
    let http = reqwest::Client::builder().no_proxy().build().expect("http");
    let base = routd.url();

    // (a) ingest into one chat with a subscriber.
    let chat = "bench:ingest";
    let sub = tokio::spawn(subscribe(
        http.clone(),
        format!("{base}/v1/chats/bench%3Aingest/events?after=0"),
        operator.clone(),
        messages,
    ));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = Instant::now();
    let per = messages / CONNS;
    let posts: Vec<_> = (0..CONNS)
        .map(|c| {
            let (http, base, channel) = (http.clone(), base.clone(), channel.clone());
            tokio::spawn(async move {
                for i in 0..per {
                    let r = http
                        .post(format!("{base}/v1/messages"))
                        .bearer_auth(&channel)
                        .json(&json!({"id": format!("b-{c}-{i}"), "chat_jid": chat, "sender": "bench", "content": "some text of a chat message"}))
                        .send()
                        .await
                        .expect("post");
                    assert_eq!(r.status(), 201);
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
    let s = http
        .put(format!("{base}/v1/groups/lat"))
        .bearer_auth(&operator)
        .json(&json!({"name": "lat"}))
        .send()
        .await
        .expect("group")
        .status();
    assert!(s.is_success(), "group: {s}");
    // Interleaved, so both see the same machine.
    let (mut via_routd, mut direct) = (Vec::new(), Vec::new());
    for i in 0..N {
        let sub = tokio::spawn(subscribe_until(
            http.clone(),
            format!("{base}/v1/chats/web%3Alat/events"),
            operator.clone(),
            |seen: &[(Instant, Value)]| seen.iter().any(|(_, v)| v["direction"] == "out"),
        ));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = Instant::now();
        let r = http
            .post(format!("{base}/v1/messages"))
            .bearer_auth(&channel)
            .json(&json!({"id": format!("lat-{i}"), "chat_jid": "web:lat", "sender": "bench", "content": "x"}))
            .send()
            .await
            .expect("post");
        assert_eq!(r.status(), 201);
        let events = sub.await.expect("events");
        if std::env::var_os("BENCH_TRACE").is_some() {
            for (at, v) in &events {
                println!("  routd +{:?} {v}", at.duration_since(t));
            }
        }
        let reply = events.last().expect("a reply");
        assert_eq!(reply.1["direction"], "out", "{events:?}");
        via_routd.push(reply.0.duration_since(t));
        // Let the turn end (the folder is free) before the next.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let t = Instant::now();
        let v: Value = http
            .post(format!("{}/v1/runs", runed.url()))
            .bearer_auth(&routd_token)
            .json(&json!({"folder": "direct", "turn_id": format!("direct-{i}"), "messages": [{"role": "user", "content": "x"}]}))
            .send()
            .await
            .expect("run")
            .json()
            .await
            .expect("run id");
        let id = v["run_id"].as_str().expect("id").to_owned();
        // The run's own stream, to the first output block: what routd waits for too.
        let events = subscribe_until(
            http.clone(),
            format!("{}/v1/runs/{id}/events", runed.url()),
            routd_token.clone(),
            |seen: &[(Instant, Value)]| seen.iter().any(|(_, v)| !v["block"].is_null()),
        )
        .await;
        if std::env::var_os("BENCH_TRACE").is_some() {
            for (at, v) in &events {
                println!("  direct +{:?} {v}", at.duration_since(t));
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
    let url = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while http.get(format!("{url}/health")).send().await.is_err() {
        assert!(Instant::now() < deadline, "routd binary did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..20 {
        let _ = http
            .post(format!("{url}/v1/messages"))
            .json(&json!({"id": format!("i-{i}"), "chat_jid": "idle:1", "sender": "b", "content": "x"}))
            .send()
            .await;
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
