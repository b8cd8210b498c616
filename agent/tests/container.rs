//! The container contract, end to end: real containers of the `hako-agent` image on the real
//! Docker daemon, driven and observed only from outside, through the Engine API.
//!
//! The image is built from source on first use (`hako_deploy::ensure_agent_image`), so the
//! test command alone works on a fresh machine. Every container carries the label
//! `io.hako.test=agent-container` and a unique name, and is removed when its test ends.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    AttachContainerOptionsBuilder, CreateContainerOptionsBuilder, InspectContainerOptions,
    KillContainerOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

const START: &str = "---ARIZUKO_OUTPUT_START---";
const END: &str = "---ARIZUKO_OUTPUT_END---";
/// The uid the image runs as: the follow-up directory must be writable by it.
const AGENT_UID: u32 = 1000;

/// One block as it arrived, with its arrival time.
type Arrival = (Instant, Value);

/// A running agent container, removed on drop.
struct Agent {
    docker: Docker,
    id: String,
    blocks: mpsc::UnboundedReceiver<Arrival>,
    stderr: Arc<Mutex<Vec<u8>>>,
    inbox: Option<tempfile::TempDir>,
}

struct Opts {
    env: Vec<String>,
    inbox: bool,
    markers: (String, String),
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            inbox: false,
            markers: (START.into(), END.into()),
        }
    }
}

fn input(text: &str) -> Value {
    json!({
        "sessionId": "",
        "messages": [{"role": "user", "content": text}],
        "folder": "demo",
        "turnId": "t-1",
        "runId": "r-1",
        "token": "tok-canary-3f9a",
        "secrets": {"ANTHROPIC_API_KEY": "sk-canary-3f9a"},
    })
}

fn unique(prefix: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).expect("random bytes");
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}-{hex}")
}

impl Agent {
    async fn start(text: &str, opts: Opts) -> Agent {
        let image = hako_deploy::ensure_agent_image()
            .await
            .expect("the agent image builds");
        let docker = Docker::connect_with_unix_defaults().expect("docker socket");
        let inbox = opts.inbox.then(|| {
            let dir = tempfile::tempdir().expect("tempdir");
            std::os::unix::fs::chown(dir.path(), Some(AGENT_UID), Some(AGENT_UID))
                .expect("chown inbox");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
                .expect("chmod inbox");
            dir
        });
        let mounts = inbox.as_ref().map(|d| {
            vec![Mount {
                target: Some("/workspace/ipc/input".into()),
                source: Some(d.path().to_string_lossy().into_owned()),
                typ: Some(MountType::BIND),
                read_only: Some(false),
                ..Default::default()
            }]
        });
        let body = ContainerCreateBody {
            image: Some(image),
            env: Some(opts.env),
            open_stdin: Some(true),
            stdin_once: Some(true),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            labels: Some(HashMap::from([(
                "io.hako.test".to_owned(),
                "agent-container".to_owned(),
            )])),
            host_config: Some(HostConfig {
                mounts,
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges:true".into()]),
                readonly_rootfs: Some(true),
                network_mode: Some("none".into()),
                init: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = unique("hako-agent-test");
        let opts_c = CreateContainerOptionsBuilder::new().name(&name).build();
        let id = docker
            .create_container(Some(opts_c), body)
            .await
            .expect("create")
            .id;
        let attach = AttachContainerOptionsBuilder::new()
            .stdin(true)
            .stdout(true)
            .stderr(true)
            .stream(true)
            .build();
        let attached = docker
            .attach_container(&id, Some(attach))
            .await
            .expect("attach");
        docker.start_container(&id, None).await.expect("start");
        let mut stdin = attached.input;
        let mut line = serde_json::to_vec(&input(text)).expect("json");
        line.push(b'\n');
        stdin.write_all(&line).await.expect("write stdin");
        stdin.shutdown().await.expect("close stdin");

        let (tx, blocks) = mpsc::unbounded_channel();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let err_sink = stderr.clone();
        let (start, end) = opts.markers;
        let mut output = attached.output;
        tokio::spawn(async move {
            let mut buf = Vec::new();
            while let Some(Ok(frame)) = output.next().await {
                match frame {
                    LogOutput::StdOut { message } => {
                        buf.extend_from_slice(&message);
                        for block in take_blocks(&mut buf, &start, &end) {
                            let _ = tx.send((Instant::now(), block));
                        }
                    }
                    LogOutput::StdErr { message } => {
                        err_sink.lock().expect("lock").extend_from_slice(&message)
                    }
                    _ => {}
                }
            }
        });
        Agent {
            docker,
            id,
            blocks,
            stderr,
            inbox,
        }
    }

    /// The next block, within `within`.
    async fn block(&mut self, within: Duration) -> Arrival {
        match tokio::time::timeout(within, self.blocks.recv()).await {
            Ok(Some(b)) => b,
            Ok(None) => panic!("stdout ended without a block; stderr: {}", self.stderr()),
            Err(_) => panic!("no block within {within:?}; stderr: {}", self.stderr()),
        }
    }

    /// The result of the next block, which must be `ok`.
    async fn ok_result(&mut self, within: Duration) -> String {
        let (_, b) = self.block(within).await;
        assert_eq!(b["status"], "ok", "block: {b}");
        b["result"].as_str().expect("result").to_owned()
    }

    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().expect("lock")).into_owned()
    }

    fn inbox(&self) -> &Path {
        self.inbox.as_ref().expect("inbox").path()
    }

    /// Drops a follow-up the way the host does: a temporary name, then a rename.
    fn follow_up(&self, name: &str, text: &str) -> PathBuf {
        let tmp = self.inbox().join(format!(".{name}.tmp"));
        std::fs::write(&tmp, json!({"content": text}).to_string()).expect("write");
        let path = self.inbox().join(name);
        std::fs::rename(&tmp, &path).expect("rename");
        path
    }

    async fn signal(&self, sig: &str) {
        let opts = KillContainerOptionsBuilder::new().signal(sig).build();
        self.docker
            .kill_container(&self.id, Some(opts))
            .await
            .expect("signal");
    }

    /// Waits until the container is no longer running; its exit code.
    async fn exit_code(&self, within: Duration) -> i64 {
        let deadline = Instant::now() + within;
        loop {
            let c = self
                .docker
                .inspect_container(&self.id, None::<InspectContainerOptions>)
                .await
                .expect("inspect");
            let state = c.state.expect("state");
            if state.running != Some(true) {
                return state.exit_code.expect("exit code");
            }
            assert!(
                Instant::now() < deadline,
                "still running after {within:?}; stderr: {}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // Drop cannot await: remove the container from a thread with its own runtime and its
        // own client (the test's client is bound to the test's runtime, blocked here).
        let id = self.id.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let Ok(docker) = Docker::connect_with_unix_defaults() else {
                    return;
                };
                let opts = RemoveContainerOptionsBuilder::new().force(true).build();
                let _ = docker.remove_container(&id, Some(opts)).await;
            });
        })
        .join();
    }
}

/// Takes every complete block out of `buf`, leaving the unfinished tail. Markers count only
/// at the start of a line, as the contract says.
fn take_blocks(buf: &mut Vec<u8>, start: &str, end: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let text = String::from_utf8_lossy(buf).into_owned();
        let Some(s) = line_start_find(&text, start, 0) else {
            return out;
        };
        let body_from = s + start.len();
        let Some(e) = line_start_find(&text, end, body_from) else {
            return out;
        };
        let body = text[body_from..e].trim();
        out.push(serde_json::from_str(body).unwrap_or_else(|e| panic!("bad block {body:?}: {e}")));
        buf.drain(..e + end.len());
    }
}

fn line_start_find(text: &str, pat: &str, from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = text[at..].find(pat) {
        let pos = at + i;
        if pos == 0 || text.as_bytes()[pos - 1] == b'\n' {
            return Some(pos);
        }
        at = pos + 1;
    }
    None
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn echo_reply_then_one_shot_exit() {
    let mut a = Agent::start("hello from the host", Opts::default()).await;
    assert_eq!(a.ok_result(30 * SECOND).await, "hello from the host");
    // No input directory mounted: one-shot mode.
    assert_eq!(a.exit_code(10 * SECOND).await, 0);
    let log = a.stderr();
    assert!(!log.contains("canary"), "a secret reached the log: {log}");
}

#[tokio::test]
async fn several_blocks_stream_in_order() {
    let mut a = Agent::start("/blocks 3\nafter", Opts::default()).await;
    for i in 1..=3 {
        assert_eq!(a.ok_result(30 * SECOND).await, format!("block {i}/3"));
    }
    assert_eq!(a.ok_result(10 * SECOND).await, "emitted 3 blocks\nafter");
    assert_eq!(a.exit_code(10 * SECOND).await, 0);
}

#[tokio::test]
async fn markers_are_configurable_for_nanoclaw_images() {
    let (s, e) = ("---NANOCLAW_OUTPUT_START---", "---NANOCLAW_OUTPUT_END---");
    let mut a = Agent::start(
        "custom markers",
        Opts {
            env: vec![
                format!("HAKO_OUTPUT_START_MARKER={s}"),
                format!("HAKO_OUTPUT_END_MARKER={e}"),
            ],
            markers: (s.into(), e.into()),
            ..Opts::default()
        },
    )
    .await;
    assert_eq!(a.ok_result(30 * SECOND).await, "custom markers");
}

#[tokio::test]
async fn follow_up_by_file_drop_then_close() {
    let mut a = Agent::start(
        "first",
        Opts {
            inbox: true,
            ..Opts::default()
        },
    )
    .await;
    assert_eq!(a.ok_result(30 * SECOND).await, "first");
    let f = a.follow_up("0001.json", "second");
    // Found by the 500 ms poll, no signal sent.
    assert_eq!(a.ok_result(5 * SECOND).await, "second");
    assert!(!f.exists(), "the agent claims a follow-up by unlinking it");
    std::fs::write(a.inbox().join("_close"), b"").expect("write _close");
    assert_eq!(a.exit_code(5 * SECOND).await, 0);
    assert!(!a.inbox().join("_close").exists());
}

#[tokio::test]
async fn sigusr1_wakes_the_agent_at_once() {
    // A one-minute poll: only the signal can explain a fast reply.
    let mut a = Agent::start(
        "ready",
        Opts {
            env: vec!["HAKO_POLL_INTERVAL_MS=60000".into()],
            inbox: true,
            ..Opts::default()
        },
    )
    .await;
    assert_eq!(a.ok_result(30 * SECOND).await, "ready");
    let mut latencies = Vec::new();
    for i in 0..3 {
        let text = format!("wake {i}");
        a.follow_up(&format!("000{i}.json"), &text);
        let sent = Instant::now();
        a.signal("SIGUSR1").await;
        let (at, b) = a.block(5 * SECOND).await;
        assert_eq!(b["result"], text.as_str());
        latencies.push(at.duration_since(sent));
    }
    eprintln!("SIGUSR1 to reply: {latencies:?}");
    let best = latencies.iter().min().copied().unwrap_or_default();
    assert!(
        best < Duration::from_millis(100),
        "replies came {latencies:?} after the signal, want < 100 ms"
    );
}

#[tokio::test]
async fn query_timeout_emits_a_summary_and_exits_0() {
    let mut a = Agent::start(
        "partial text\n/sleep 60",
        Opts {
            env: vec!["ARIZUKO_QUERY_TIMEOUT_MS=1500".into()],
            inbox: true,
            ..Opts::default()
        },
    )
    .await;
    let result = a.ok_result(20 * SECOND).await;
    assert!(
        result.starts_with("query timeout after 1500 ms; partial: partial text"),
        "{result}"
    );
    assert_eq!(a.exit_code(10 * SECOND).await, 0);
}

#[tokio::test]
async fn sigterm_ends_a_waiting_agent_with_exit_0() {
    let mut a = Agent::start(
        "waiting",
        Opts {
            inbox: true,
            ..Opts::default()
        },
    )
    .await;
    assert_eq!(a.ok_result(30 * SECOND).await, "waiting");
    let asked = Instant::now();
    // A 20 s grace: the stop returns early only because the agent exits on SIGTERM.
    let stop = StopContainerOptionsBuilder::new().t(20).build();
    a.docker
        .stop_container(&a.id, Some(stop))
        .await
        .expect("stop");
    let took = asked.elapsed();
    assert_eq!(a.exit_code(SECOND).await, 0);
    assert!(
        took < 10 * SECOND,
        "stop took {took:?}: SIGTERM was not honoured"
    );
}
