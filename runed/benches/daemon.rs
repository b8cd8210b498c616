//! runed against the docker CLI it replaces: `cargo bench -p hako-runed --bench daemon`.
//!
//! (a) end-to-end latency of one trivial run (POST → final result via `?wait=`) vs
//!     `docker run -i --rm --network none <image>` with the same input line (target ≤ 1.1);
//! (b) throughput of 40 trivial runs over 8 folders at `MAX_CONTAINERS=4`, with warm boxes
//!     (`RUNED_WARM_MAX=4`) and without (`0`), vs four parallel lanes of `docker run`, the
//!     three interleaved twice so each sees the same machine (targets: on ≥ off ≥ 1.3 ×
//!     lanes: warm boxes never cost throughput); a burst is timed until its last container
//!     is removed, as a lane is, and the boxes made after it settle before the next one;
//! (c) idle RSS of the `runed` binary, open auth mode (target ≤ 20 MiB).
//!
//! A real authd signs every run's spawn token, as in production. The docker CLI appears here
//! only as the reference to beat.

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hako_authd::testing::{RUNED_KEY, TestAuthd};
use hako_client::{CallError, Client, Daemon, runed as api};
use hako_shared::config::Env;
use hako_shared::runs::{Outcome, RunRequest, RunState};
use serde_json::json;
use tokio::io::AsyncWriteExt;

const N: usize = 10;
const THROUGHPUT_RUNS: usize = 40;
const THROUGHPUT_FOLDERS: usize = 8;
const LANES: usize = 4;
/// How long a call of runed's API (long polls aside) may take.
const CALL: Duration = Duration::from_secs(60);

/// A client of the runed at `url`.
fn client(url: &str) -> Client {
    Client::new(Daemon::Runed, url, CALL).expect("a runed client")
}

struct Bench {
    /// The runed (a)'s latency is measured on: warm boxes on.
    runed: Client,
    token: String,
    image: String,
    seq: std::sync::atomic::AtomicUsize,
}

impl Bench {
    /// One run through runed: POST, then long-poll until it ends. Returns its duration.
    async fn run(&self, folder: &str) -> Duration {
        self.run_on(&self.runed, folder).await
    }

    /// One run through the runed `runed`.
    async fn run_on(&self, runed: &Client, folder: &str) -> Duration {
        let i = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let req = json!({"folder": folder, "turn_id": format!("bench-{i}"),
                         "messages": [{"role": "user", "content": "x"}]});
        let req: RunRequest = serde_json::from_value(req).expect("a run");
        let t = Instant::now();
        let created = runed
            .call(api::create_run(&req), Some(&self.token))
            .await
            .expect("POST /v1/runs");
        self.wait(runed, &created.run_id).await;
        t.elapsed()
    }

    async fn wait(&self, runed: &Client, id: &str) {
        let op = api::run(id)
            .query("wait", "60s")
            .limit(Duration::from_secs(90));
        loop {
            match runed.call(op.clone(), Some(&self.token)).await {
                Ok(s)
                    if matches!(
                        s.state,
                        RunState::Queued | RunState::Starting | RunState::Running
                    ) =>
                {
                    continue;
                }
                // More runs wait than one caller may long-poll at once (16): ask again soon.
                Err(CallError::Refused { code, .. }) if code == "too_many_streams" => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Ok(s) if s.state == RunState::Exited && s.outcome == Some(Outcome::Ok) => return,
                r => panic!("run failed: {r:?}"),
            }
        }
    }

    /// The same with the docker CLI: one `docker run -i --rm` fed the same input line.
    async fn cli(&self, folder: &str) -> Duration {
        let line = json!({"messages": [{"role": "user", "content": "x"}], "folder": folder,
                          "turn_id": "bench-cli", "run_id": "bench-cli"})
        .to_string()
            + "\n";
        let t = Instant::now();
        let mut c = tokio::process::Command::new("docker")
            .args(["run", "-i", "--rm", "--network", "none", &self.image])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker CLI");
        let mut stdin = c.stdin.take().expect("stdin");
        stdin.write_all(line.as_bytes()).await.expect("write");
        drop(stdin);
        let out = c.wait_with_output().await.expect("docker run");
        assert!(out.status.success(), "docker run failed");
        assert!(String::from_utf8_lossy(&out.stdout).contains("\"result\":\"x\""));
        t.elapsed()
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(bench());
}

/// A runed on its own data directory with `warm_max` warm boxes, its token from `authd`.
async fn start_runed(
    authd: &TestAuthd,
    data: &std::path::Path,
    image: &str,
    warm_max: usize,
) -> hako_runed::Running {
    let cfg = hako_runed::Config::from_env(&Env::from_pairs([
        ("DATA_DIR", data.display().to_string()),
        ("AUTHD_URL", authd.url()),
        ("AUTHD_SERVICE_KEY", RUNED_KEY.into()),
        ("MAX_CONTAINERS", LANES.to_string()),
        ("CONTAINER_IMAGE", image.to_owned()),
        ("RUNED_WARM_MAX", warm_max.to_string()),
        // Its own install: its containers are told apart from the other runed's.
        (
            "HAKO_INSTALL_ID",
            format!("bench-{}-{warm_max}", std::process::id()),
        ),
    ]))
    .expect("runed config");
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    hako_runed::start(cfg, l).await.expect("runed")
}

/// `THROUGHPUT_RUNS` runs over `THROUGHPUT_FOLDERS` folders, all posted at once to `runed`:
/// the time until every run is answered and every run's container removed (as `docker run
/// --rm` lanes are timed until their last removal: a removal left for after the clock would
/// flatter runed and slow the next measurement). The warm boxes made after the burst are not
/// waited for.
async fn burst(
    b: &Arc<Bench>,
    daemon: &hako_runed::Running,
    runed: &Client,
    round: usize,
) -> Duration {
    let runner = daemon.runner().expect("docker");
    let t = Instant::now();
    let mut hs = Vec::new();
    for i in 0..THROUGHPUT_RUNS {
        let (b, runed) = (b.clone(), runed.clone());
        hs.push(tokio::spawn(async move {
            b.run_on(&runed, &format!("tp{round}-{}", i % THROUGHPUT_FOLDERS))
                .await;
        }));
    }
    for h in hs {
        h.await.expect("run task");
    }
    loop {
        let left = runner
            .list_agents()
            .await
            .expect("list containers")
            .into_iter()
            .filter(|c| !hako_runner::warm::is_warm(c))
            .count();
        if left == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    t.elapsed()
}

/// Waits (untimed) until `runed`'s boxes made after a burst are made: the next measurement
/// does not share the machine with them.
async fn settle(runed: &hako_runed::Running) {
    let runner = runed.runner().expect("docker");
    let mut last = usize::MAX;
    loop {
        let all = runner.list_agents().await.expect("list containers");
        let making = all.iter().any(|c| c.state != "running");
        if !making && all.len() == last {
            return;
        }
        last = all.len();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// The same runs as `LANES` lanes of `docker run`, one after another in each lane.
async fn lanes(b: &Arc<Bench>) -> Duration {
    let t = Instant::now();
    let mut hs = Vec::new();
    for lane in 0..LANES {
        let b = b.clone();
        hs.push(tokio::spawn(async move {
            for _ in 0..THROUGHPUT_RUNS / LANES {
                b.cli(&format!("tp{lane}")).await;
            }
        }));
    }
    for h in hs {
        h.await.expect("cli task");
    }
    t.elapsed()
}

async fn bench() {
    let image = hako_deploy::ensure_agent_image()
        .await
        .expect("agent image builds");
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path();
    let authd = TestAuthd::start(&data.join("authd")).await;
    let warm = start_runed(&authd, &data.join("runed-warm"), &image, 4).await;
    let cold = start_runed(&authd, &data.join("runed-cold"), &image, 0).await;
    let token = authd.token("routd").await;
    let cold_client = client(&cold.url());
    let b = Arc::new(Bench {
        runed: client(&warm.url()),
        token,
        image: image.clone(),
        seq: Default::default(),
    });

    // (a) latency, alternating so both see the same machine load.
    for _ in 0..2 {
        b.run("warm").await;
        b.cli("warm").await;
    }
    let (mut rd, mut cl) = (Vec::new(), Vec::new());
    for _ in 0..N {
        rd.push(b.run("lat").await);
        cl.push(b.cli("lat").await);
    }
    let (rd, cl) = (median(rd), median(cl));
    let ratio = rd.as_secs_f64() / cl.as_secs_f64();
    println!(
        "latency (median of {N}): runed {:.0} ms, docker run {:.0} ms, ratio {ratio:.3} (target <= 1.1)",
        rd.as_secs_f64() * 1e3,
        cl.as_secs_f64() * 1e3
    );

    // (b) throughput: warm boxes on, off, and the CLI lanes, interleaved; each round its own
    // folders, so no round starts with another's boxes.
    let (mut on, mut off, mut cli) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
    for round in 0..2 {
        on += burst(&b, &warm, &b.runed, round).await;
        settle(&warm).await;
        off += burst(&b, &cold, &cold_client, round).await;
        settle(&cold).await;
        cli += lanes(&b).await;
    }
    let rate = |d: Duration| 2.0 * THROUGHPUT_RUNS as f64 / d.as_secs_f64();
    let (on, off, cli) = (rate(on), rate(off), rate(cli));
    println!(
        "throughput ({THROUGHPUT_RUNS} runs over {THROUGHPUT_FOLDERS} folders, {LANES} at once, 2 rounds): warm boxes on {on:.2} runs/s, off {off:.2} runs/s, docker run lanes {cli:.2} runs/s; on/lanes {:.3}, off/lanes {:.3}, on/off {:.3} (targets: on >= off >= 1.3 x lanes)",
        on / cli,
        off / cli,
        on / off
    );
    warm.shutdown().await;
    cold.shutdown().await;
    let _ = authd.shutdown().await;

    // (c) idle RSS of the binary.
    println!(
        "idle RSS of runed: {:.1} MiB (target <= 20 MiB)",
        idle_rss(&image).await as f64 / 1024.0
    );
}

/// Starts `runed` (open mode, a fresh data directory), waits until it is ready, and reads its
/// resident set in KiB.
async fn idle_rss(image: &str) -> u64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_runed"))
        .env_remove("AUTHD_URL")
        .env_remove("DOCKER_HOST")
        .env("HAKO_OPEN_DEV", "1")
        .env("DATA_DIR", dir.path())
        .env("CONTAINER_IMAGE", image)
        .env("RUNED_LISTEN", format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("runed binary");
    let runed = client(&format!("http://127.0.0.1:{port}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if runed.call(api::ready(), None).await.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "runed did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Settle: a few scheduler ticks and a metrics scrape, as in normal idle life.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let _ = runed.text(api::metrics(), None).await;
    let pid = child.id().expect("pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    let _ = child.kill().await;
    kib
}
