//! Runs the real `hako-agent` binary as a process and checks the container contract from the
//! outside: stdin line, output blocks, follow-up files, signals, deadline, exit codes.
//!
//! The block parser here is a small line-anchored one for the tests; the production parser
//! lives in runed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_hako-agent");
const START: &str = "---ARIZUKO_OUTPUT_START---";
const END: &str = "---ARIZUKO_OUTPUT_END---";
/// Cap of the captured stdout/stderr kept for assertions.
const CAPTURE_CAP: usize = 8 << 20;

/// What the test parser found between markers.
#[derive(Debug, Clone)]
enum Parsed {
    Block(Value),
    Bad(String),
}

/// Line-anchored marker parser: a marker counts only as a whole line.
struct Parser {
    start: String,
    end: String,
    partial: Vec<u8>,
    capture: Option<Vec<String>>,
}

impl Parser {
    fn feed(&mut self, bytes: &[u8], mut emit: impl FnMut(Parsed)) {
        self.partial.extend_from_slice(bytes);
        while let Some(i) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=i).collect();
            let line = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if line == self.start {
                self.capture = Some(Vec::new());
            } else if line == self.end {
                if let Some(lines) = self.capture.take() {
                    let body = lines.join("\n");
                    match serde_json::from_str::<Value>(&body) {
                        Ok(v) if v.get("status").is_some() => emit(Parsed::Block(v)),
                        _ => emit(Parsed::Bad(body)),
                    }
                }
            } else if let Some(c) = self.capture.as_mut() {
                c.push(line);
            }
        }
        // Noise without newlines must not grow the test's memory either.
        if self.partial.len() > 1 << 20 {
            self.partial.clear();
        }
    }
}

struct Agent {
    child: Child,
    stdin: Option<ChildStdin>,
    blocks: Receiver<(Instant, Parsed)>,
    stdout: Arc<Mutex<Vec<u8>>>,
    stdout_len: Arc<Mutex<usize>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_len: Arc<Mutex<usize>>,
    dir: tempfile::TempDir,
}

fn capture(
    mut r: impl Read + Send + 'static,
    keep: Arc<Mutex<Vec<u8>>>,
    total: Arc<Mutex<usize>>,
    mut parser: Option<(Parser, std::sync::mpsc::Sender<(Instant, Parsed)>)>,
) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 64 * 1024];
        loop {
            let n = match r.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let now = Instant::now();
            *total.lock().unwrap() += n;
            {
                let mut k = keep.lock().unwrap();
                let room = CAPTURE_CAP.saturating_sub(k.len()).min(n);
                k.extend_from_slice(&buf[..room]);
            }
            if let Some((p, tx)) = parser.as_mut() {
                p.feed(&buf[..n], |b| {
                    let _ = tx.send((now, b));
                });
            }
        }
    });
}

struct Opts {
    env: Vec<(String, String)>,
    /// Create the follow-up directory (else one-shot mode).
    follow_ups: bool,
    markers: (String, String),
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            env: Vec::new(),
            follow_ups: false,
            markers: (START.into(), END.into()),
        }
    }
}

fn input(content: &str) -> Value {
    json!({
        "sessionId": "",
        "messages": [{"role": "user", "content": content}],
        "systemPrompt": "",
        "grants": [],
        "folder": "acme",
        "senderJid": "u@x",
        "turnId": "t1",
        "runId": "r1",
    })
}

impl Agent {
    /// Starts the agent without writing stdin.
    fn start(opts: Opts) -> Agent {
        let dir = tempfile::tempdir().unwrap();
        let inbox = dir.path().join("input");
        if opts.follow_ups {
            std::fs::create_dir(&inbox).unwrap();
        }
        let mut cmd = Command::new(BIN);
        cmd.env_clear()
            .env("HAKO_INPUT_DIR", &inbox)
            .env("HOME", dir.path())
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let (tx, blocks) = channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stdout_len = Arc::new(Mutex::new(0));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_len = Arc::new(Mutex::new(0));
        let parser = Parser {
            start: opts.markers.0,
            end: opts.markers.1,
            partial: Vec::new(),
            capture: None,
        };
        capture(
            child.stdout.take().unwrap(),
            stdout.clone(),
            stdout_len.clone(),
            Some((parser, tx)),
        );
        capture(
            child.stderr.take().unwrap(),
            stderr.clone(),
            stderr_len.clone(),
            None,
        );
        Agent {
            stdin: child.stdin.take(),
            child,
            blocks,
            stdout,
            stdout_len,
            stderr,
            stderr_len,
            dir,
        }
    }

    /// Starts the agent, writes one input line and closes stdin (as runed does).
    fn run(opts: Opts, input: &Value) -> Agent {
        let mut a = Agent::start(opts);
        a.send_line(&input.to_string());
        a.close_stdin();
        a
    }

    /// Writes one line. An agent that fails fast (bad config) may exit before it
    /// reads stdin, so a broken pipe is not an error here: the test asserts on
    /// what the agent printed and its exit code instead.
    fn send_line(&mut self, line: &str) {
        let s = self.stdin.as_mut().expect("stdin is still open");
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        match s.write_all(&buf).and_then(|()| s.flush()) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            Err(e) => panic!("writing the agent's stdin: {e}"),
        }
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn inbox(&self) -> PathBuf {
        self.dir.path().join("input")
    }

    /// Drops a follow-up the way the host does: temp name, then rename.
    fn drop_file(&self, name: &str, content: &[u8]) {
        let tmp = self.inbox().join(format!("{name}.tmp"));
        std::fs::write(&tmp, content).unwrap();
        std::fs::rename(&tmp, self.inbox().join(name)).unwrap();
    }

    fn follow_up(&self, name: &str, text: &str) {
        self.drop_file(name, json!({"content": text}).to_string().as_bytes());
    }

    fn signal(&self, sig: Signal) {
        kill_process(Pid::from_child(&self.child), sig).unwrap();
    }

    fn next(&self, within: Duration) -> Option<(Instant, Parsed)> {
        self.blocks.recv_timeout(within).ok()
    }

    /// The next well-formed block, failing on a bad one or none.
    fn block(&self, within: Duration) -> (Instant, Value) {
        match self.next(within) {
            Some((t, Parsed::Block(v))) => (t, v),
            other => panic!(
                "expected a block, got {other:?}; stderr: {}",
                self.stderr_text()
            ),
        }
    }

    fn ok_result(&self, within: Duration) -> String {
        let (_, b) = self.block(within);
        assert_eq!(b["status"], "ok", "{b}");
        b["result"].as_str().unwrap().to_owned()
    }

    fn no_block(&self, within: Duration) {
        if let Some(b) = self.next(within) {
            panic!("unexpected block {b:?}");
        }
    }

    fn wait(&mut self, within: Duration) -> ExitStatus {
        let until = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!(
                    "agent still running after {within:?}; stderr: {}",
                    self.stderr_text()
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn still_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    fn wait_stderr(&self, needle: &str, within: Duration) {
        let until = Instant::now() + within;
        while !self.stderr_text().contains(needle) {
            assert!(
                Instant::now() < until,
                "stderr never said {needle:?}: {}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// How many times stderr says `needle`.
    fn stderr_count(&self, needle: &str) -> usize {
        self.stderr_text().matches(needle).count()
    }

    /// Waits until stderr has said `needle` at least `n` times.
    fn wait_stderr_count(&self, needle: &str, n: usize, within: Duration) {
        let until = Instant::now() + within;
        while self.stderr_count(needle) < n {
            assert!(
                Instant::now() < until,
                "stderr said {needle:?} {} times, not {n}: {}",
                self.stderr_count(needle),
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Waits until the agent is idle: every thread of it asleep in the kernel (state `S`)
    /// on a few reads in a row, as it is while it waits for follow-ups.
    fn wait_idle(&self, within: Duration) {
        let tasks = format!("/proc/{}/task", self.child.id());
        let until = Instant::now() + within;
        let mut quiet = 0;
        while quiet < 5 {
            let asleep = std::fs::read_dir(&tasks)
                .unwrap()
                .filter_map(Result::ok)
                .all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // `pid (comm) S …`: the state follows the last parenthesis.
                    stat.rsplit_once(") ")
                        .is_some_and(|(_, rest)| rest.starts_with('S'))
                });
            quiet = if asleep { quiet + 1 } else { 0 };
            assert!(Instant::now() < until, "the agent never went idle");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until no signal `sig` is pending for the process: it was delivered.
    fn wait_delivered(&self, sig: Signal, within: Duration) {
        let bit = 1u64 << (sig.as_raw() - 1);
        let status = format!("/proc/{}/status", self.child.id());
        let until = Instant::now() + within;
        loop {
            let text = std::fs::read_to_string(&status).unwrap_or_default();
            let pending = ["SigPnd:", "ShdPnd:"].iter().any(|f| {
                text.lines()
                    .find_map(|l| l.strip_prefix(f))
                    .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                    .is_some_and(|m| m & bit != 0)
            });
            if !pending {
                return;
            }
            assert!(Instant::now() < until, "signal {sig:?} still pending");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout.lock().unwrap()).into_owned()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const T: Duration = Duration::from_secs(5);

fn with_dir() -> Opts {
    Opts {
        follow_ups: true,
        ..Opts::default()
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn version_flag() {
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("hako-agent {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(BIN).arg("--bogus").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn echo_reply_one_shot() {
    let mut a = Agent::run(Opts::default(), &input("hello\nworld"));
    assert_eq!(a.ok_result(T), "hello\nworld");
    assert_eq!(a.wait(T).code(), Some(0));
    a.no_block(Duration::from_millis(50));
    // The process has exited, but the thread copying its stderr may not have read the last
    // of it yet on a loaded machine: wait for the line, not for a moment.
    a.wait_stderr("[hako-agent]", T);
    // Exact framing on the wire.
    assert!(a.stdout_text().contains(&format!(
        "\n{START}\n{{\"status\":\"ok\",\"result\":\"hello\\nworld\"}}\n{END}\n"
    )));
}

#[test]
fn several_user_messages_make_one_reply() {
    let mut i = input("one");
    i["messages"] = json!([
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "ignored"},
        {"role": "user", "content": "two", "sender": "bob"}
    ]);
    let mut a = Agent::run(Opts::default(), &i);
    assert_eq!(a.ok_result(T), "one\ntwo");
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn several_blocks_in_one_run() {
    let mut a = Agent::run(Opts::default(), &input("/blocks 3\ndone"));
    for i in 1..=3 {
        assert_eq!(a.ok_result(T), format!("block {i}/3"));
    }
    assert_eq!(a.ok_result(T), "emitted 3 blocks\ndone");
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn error_fatal_and_session() {
    let mut a = Agent::run(
        Opts::default(),
        &input("/error it broke\n/fatal no output\n/session s-42"),
    );
    let (_, e) = a.block(T);
    assert_eq!(
        e,
        json!({"status": "error", "result": null, "error": "it broke"})
    );
    let (_, f) = a.block(T);
    assert_eq!(
        f,
        json!({"status": "fatal", "result": null, "error": "no output"})
    );
    let (_, r) = a.block(T);
    assert_eq!(r["newSessionId"], "s-42");
    assert_eq!(
        r["result"],
        "emitted an error block\nemitted a fatal block\nsession: s-42"
    );
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn exit_command_exits_with_its_code_and_no_block() {
    let mut a = Agent::run(Opts::default(), &input("text first\n/exit 7\nnever"));
    assert_eq!(a.wait(T).code(), Some(7));
    a.no_block(Duration::from_millis(100));
}

#[test]
fn unknown_command_is_a_line() {
    let mut a = Agent::run(Opts::default(), &input("/frobnicate\n//sleep 1\n/sleep x"));
    assert_eq!(
        a.ok_result(T),
        "unknown command: /frobnicate\n/sleep 1\nsleep: invalid seconds \"x\""
    );
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn follow_up_via_file_drop_then_close() {
    let mut a = Agent::run(with_dir(), &input("first"));
    assert_eq!(a.ok_result(T), "first");
    a.follow_up("1000.json", "second");
    // Without a signal the 500 ms poll finds it.
    assert_eq!(a.ok_result(T), "second");
    assert!(
        !a.inbox().join("1000.json").exists(),
        "consumed files are deleted"
    );
    a.drop_file("_close", b"");
    assert_eq!(a.wait(T).code(), Some(0));
    assert!(!a.inbox().join("_close").exists());
}

/// `/await-followup` ends when a follow-up lands, not when its bound runs out, and leaves the
/// follow-up to be answered as any other; with nothing dropped it ends at its bound.
#[test]
fn await_followup_ends_when_one_lands() {
    let mut a = Agent::run(with_dir(), &input("/await-followup 600"));
    a.wait_stderr("await", T);
    a.no_block(Duration::from_millis(100));
    a.follow_up("1000.json", "second");
    assert_eq!(a.ok_result(T), "a follow-up is waiting");
    assert_eq!(a.ok_result(T), "second");
    a.drop_file("_close", b"");
    assert_eq!(a.wait(T).code(), Some(0));

    let mut a = Agent::run(Opts::default(), &input("/await-followup 0.2"));
    assert_eq!(a.ok_result(T), "no follow-up within 0.2 s");
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn files_before_close_are_processed_in_name_order() {
    let mut a = Agent::start(with_dir());
    a.follow_up("0002.json", "b");
    a.follow_up("0001.json", "a");
    a.follow_up("0003.json", "c");
    a.drop_file("_close", b"");
    a.follow_up("zz-after-close.json", "never");
    a.send_line(&input("first").to_string());
    a.close_stdin();
    for want in ["first", "a", "b", "c"] {
        assert_eq!(a.ok_result(T), want);
    }
    assert_eq!(a.wait(T).code(), Some(0));
    a.no_block(Duration::from_millis(50));
    assert!(a.inbox().join("zz-after-close.json").exists());
}

/// The median of `samples`.
fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[test]
fn sigusr1_wakes_within_100ms_with_the_default_500ms_poll() {
    let a = Agent::run(with_dir(), &input("first"));
    assert_eq!(a.ok_result(T), "first");
    a.wait_stderr("waiting for follow-ups", T);
    // Each wake is taken from idle (the agent asleep in its poll), and each goes through the
    // signal (it logs the wake). The latency is the median of several: one sample on a
    // loaded machine says little, and the 500 ms poll alone would put it near 250 ms.
    let mut latencies = Vec::new();
    for i in 0..7 {
        a.wait_idle(T);
        a.follow_up(&format!("{i:04}.json"), &format!("steer {i}"));
        let sent = Instant::now();
        a.signal(Signal::USR1);
        let (at, b) = a.block(T);
        assert_eq!(b["result"], format!("steer {i}"));
        latencies.push(at.saturating_duration_since(sent));
        a.wait_stderr_count("SIGUSR1: checking for follow-ups", i + 1, T);
    }
    let m = median(latencies.clone());
    assert!(
        m < Duration::from_millis(100),
        "median reply {m:?} after SIGUSR1: {latencies:?}"
    );
}

#[test]
fn sigusr1_is_the_only_wake_with_a_long_poll() {
    // With a one-minute poll, nothing answers a follow-up until the signal, and then it is
    // answered well within the minute: the reply is caused by the signal. Its latency is
    // the median of several wakes.
    let opts = Opts {
        env: env(&[("HAKO_POLL_INTERVAL_MS", "60000")]),
        ..with_dir()
    };
    let a = Agent::run(opts, &input("first"));
    assert_eq!(a.ok_result(T), "first");
    a.wait_stderr("waiting for follow-ups", T);
    let mut latencies = Vec::new();
    for i in 0..5 {
        a.wait_idle(T);
        a.follow_up(&format!("{i:04}.json"), &format!("steer {i}"));
        a.no_block(Duration::from_millis(if i == 0 { 300 } else { 50 }));
        let sent = Instant::now();
        a.signal(Signal::USR1);
        let (at, b) = a.block(T);
        assert_eq!(b["result"], format!("steer {i}"));
        latencies.push(at.saturating_duration_since(sent));
    }
    let m = median(latencies.clone());
    assert!(
        m < Duration::from_millis(100),
        "median reply {m:?} after SIGUSR1: {latencies:?}"
    );
}

#[test]
fn sigusr1_before_input_does_not_kill() {
    let mut a = Agent::start(Opts::default());
    a.wait_stderr("started", T);
    a.signal(Signal::USR1);
    // Delivered (no longer pending); then the agent still takes its input and answers.
    a.wait_delivered(Signal::USR1, T);
    assert!(a.still_running());
    a.send_line(&input("still here").to_string());
    a.close_stdin();
    assert_eq!(a.ok_result(T), "still here");
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn claim_protocol_skips_files_the_host_took_back() {
    let opts = Opts {
        env: env(&[("HAKO_POLL_INTERVAL_MS", "60000")]),
        ..with_dir()
    };
    let a = Agent::run(opts, &input("first"));
    assert_eq!(a.ok_result(T), "first");
    a.wait_stderr("waiting for follow-ups", T);
    // The host drops a file, fails to deliver the wake, and takes the file back.
    a.follow_up("0001.json", "taken back");
    std::fs::remove_file(a.inbox().join("0001.json")).unwrap();
    a.follow_up("0002.json", "delivered");
    a.signal(Signal::USR1);
    assert_eq!(a.ok_result(T), "delivered");
    a.no_block(Duration::from_millis(200));
}

#[test]
fn invalid_follow_up_is_an_error_block_and_the_agent_goes_on() {
    let opts = Opts {
        env: env(&[("HAKO_POLL_INTERVAL_MS", "60000")]),
        ..with_dir()
    };
    let a = Agent::run(opts, &input("first"));
    assert_eq!(a.ok_result(T), "first");
    a.drop_file("0001.json", b"not json");
    a.follow_up("0002.json", "fine");
    a.signal(Signal::USR1);
    let (_, e) = a.block(T);
    assert_eq!(e["status"], "error", "{e}");
    assert!(e["error"].as_str().unwrap().contains("0001.json"), "{e}");
    assert_eq!(a.ok_result(T), "fine");
    assert!(!a.inbox().join("0001.json").exists());
}

#[test]
fn temp_and_dot_files_are_ignored() {
    let opts = Opts {
        env: env(&[("HAKO_POLL_INTERVAL_MS", "60000")]),
        ..with_dir()
    };
    let a = Agent::run(opts, &input("first"));
    assert_eq!(a.ok_result(T), "first");
    let body = json!({"content": "nope"}).to_string();
    std::fs::write(a.inbox().join("0001.json.tmp"), &body).unwrap();
    std::fs::write(a.inbox().join(".0002.json"), &body).unwrap();
    a.signal(Signal::USR1);
    a.no_block(Duration::from_millis(300));
    assert!(a.inbox().join("0001.json.tmp").exists());
    assert!(a.inbox().join(".0002.json").exists());
}

#[test]
fn query_timeout_emits_a_summary_and_exits_0() {
    let opts = Opts {
        env: env(&[("ARIZUKO_QUERY_TIMEOUT_MS", "600")]),
        ..with_dir()
    };
    let started = Instant::now();
    let mut a = Agent::run(opts, &input("before the nap\n/sleep 30\nafter"));
    assert_eq!(
        a.ok_result(T),
        "query timeout after 600 ms; partial: before the nap"
    );
    assert_eq!(a.wait(T).code(), Some(0));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_secs(3),
        "{took:?}"
    );
}

#[test]
fn deadline_while_idle_exits_0() {
    let opts = Opts {
        env: env(&[("ARIZUKO_QUERY_TIMEOUT_MS", "700")]),
        ..with_dir()
    };
    let started = Instant::now();
    let mut a = Agent::run(opts, &input("quick"));
    assert_eq!(a.ok_result(T), "quick");
    assert_eq!(a.wait(T).code(), Some(0));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_secs(3),
        "{took:?}"
    );
    a.no_block(Duration::from_millis(50));
}

#[test]
fn sigterm_during_a_query_exits_0_promptly() {
    let mut a = Agent::run(Opts::default(), &input("/sleep 30"));
    a.wait_stderr("input:", T);
    let sent = Instant::now();
    a.signal(Signal::TERM);
    assert_eq!(a.wait(T).code(), Some(0));
    assert!(
        sent.elapsed() < Duration::from_secs(1),
        "{:?}",
        sent.elapsed()
    );
}

#[test]
fn sigterm_while_idle_exits_0() {
    let mut a = Agent::run(with_dir(), &input("hi"));
    assert_eq!(a.ok_result(T), "hi");
    a.wait_stderr("waiting for follow-ups", T);
    a.signal(Signal::TERM);
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn sigterm_before_input_exits_0() {
    let mut a = Agent::start(Opts::default());
    a.wait_stderr("started", T);
    a.signal(Signal::TERM);
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn ignore_sigterm_keeps_running_until_close() {
    let mut a = Agent::run(with_dir(), &input("/ignore-sigterm"));
    assert_eq!(a.ok_result(T), "ignoring SIGTERM");
    a.wait_stderr("waiting for follow-ups", T);
    a.signal(Signal::TERM);
    a.wait_stderr("SIGTERM ignored", T);
    // Handled and ignored: it is still there, and answers after it.
    assert!(a.still_running());
    a.follow_up("0001.json", "still answering");
    a.signal(Signal::USR1);
    assert_eq!(a.ok_result(T), "still answering");
    assert!(a.still_running());
    a.drop_file("_close", b"");
    a.signal(Signal::USR1);
    assert_eq!(a.wait(T).code(), Some(0));
}

#[test]
fn one_shot_mode_without_the_input_dir() {
    let mut a = Agent::run(Opts::default(), &input("only"));
    assert!(!a.inbox().exists());
    assert_eq!(a.ok_result(T), "only");
    assert_eq!(a.wait(T).code(), Some(0));
    a.wait_stderr("one-shot", T);
}

#[test]
fn bad_stdin_is_fatal_exit_1() {
    for (case, bytes) in [
        ("not json", b"not json\n".to_vec()),
        ("wrong shape", br#"{"messages": "sk-canary-xyz"}"#.to_vec()),
        ("empty", Vec::new()),
        ("oversize", vec![b'x'; 16 * 1024 * 1024 + 1]),
    ] {
        let mut a = Agent::start(Opts::default());
        let mut stdin = a.stdin.take().unwrap();
        // The agent may stop reading (oversize) before everything is written.
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&bytes);
        });
        let (_, b) = a.block(T);
        assert_eq!(b["status"], "fatal", "{case}: {b}");
        assert_eq!(a.wait(T).code(), Some(1), "{case}");
        assert!(!a.stdout_text().contains("sk-canary"), "{case}");
        assert!(!a.stderr_text().contains("sk-canary"), "{case}");
        writer.join().unwrap();
    }
}

#[test]
fn unknown_brain_is_fatal_and_names_the_variable() {
    let opts = Opts {
        env: env(&[("HAKO_BRAIN", "gpt")]),
        ..Opts::default()
    };
    let mut a = Agent::run(opts, &input("hi"));
    let (_, b) = a.block(T);
    assert_eq!(b["status"], "fatal");
    assert!(b["error"].as_str().unwrap().contains("HAKO_BRAIN"), "{b}");
    assert_eq!(a.wait(T).code(), Some(1));
}

#[test]
fn custom_markers() {
    let opts = Opts {
        env: env(&[
            ("HAKO_OUTPUT_START_MARKER", "---NANOCLAW_OUTPUT_START---"),
            ("HAKO_OUTPUT_END_MARKER", "---NANOCLAW_OUTPUT_END---"),
        ]),
        markers: (
            "---NANOCLAW_OUTPUT_START---".into(),
            "---NANOCLAW_OUTPUT_END---".into(),
        ),
        ..Opts::default()
    };
    let mut a = Agent::run(opts, &input("nano"));
    assert_eq!(a.ok_result(T), "nano");
    assert_eq!(a.wait(T).code(), Some(0));
    assert!(!a.stdout_text().contains("ARIZUKO"));
}

#[test]
fn fake_markers_and_bad_blocks_do_not_parse_as_blocks() {
    let mut a = Agent::run(Opts::default(), &input("/fake-marker\n/bad-block\nend"));
    match a.next(T) {
        Some((_, Parsed::Bad(body))) => assert!(body.contains("never closes"), "{body}"),
        other => panic!("expected the bad block, got {other:?}"),
    }
    let r = a.ok_result(T);
    assert!(r.starts_with("wrote "), "{r}");
    assert!(r.ends_with("emitted a bad block\nend"), "{r}");
    assert_eq!(a.wait(T).code(), Some(0));
    a.no_block(Duration::from_millis(50));
    let out = a.stdout_text();
    assert!(out.contains("FAKE BLOCK") && out.contains(&format!("x{START}")));
}

#[test]
fn flood_both_streams() {
    let mut a = Agent::run(Opts::default(), &input("/flood 1m\n/flood 300k stderr"));
    assert_eq!(
        a.ok_result(Duration::from_secs(20)),
        "flooded 1048576 bytes to stdout\nflooded 307200 bytes to stderr"
    );
    assert_eq!(a.wait(T).code(), Some(0));
    assert!(*a.stdout_len.lock().unwrap() > 1 << 20);
    assert!(*a.stderr_len.lock().unwrap() > 300 << 10);
}

#[test]
fn secrets_and_token_never_leave_stdin() {
    let mut i = input("/env\n/secrets\n/echo-input\n/whoami\n/ls .\n/read nonexistent");
    i["token"] = json!("tok-canary-1");
    i["secrets"] = json!({"ANTHROPIC_API_KEY": "sk-canary-2", "OTHER": "sk-canary-3"});
    let opts = Opts {
        env: env(&[("SOME_VAR", "env-canary-4")]),
        ..Opts::default()
    };
    let mut a = Agent::run(opts, &i);
    let r = a.ok_result(T);
    assert_eq!(a.wait(T).code(), Some(0));
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(lines.len(), 6, "{r}");
    let names: Vec<String> = serde_json::from_str(lines[0].strip_prefix("env: ").unwrap()).unwrap();
    assert!(names.contains(&"SOME_VAR".to_owned()), "{names:?}");
    assert_eq!(lines[1], r#"secrets: ["ANTHROPIC_API_KEY","OTHER"]"#);
    let echoed: Value = serde_json::from_str(lines[2].strip_prefix("input: ").unwrap()).unwrap();
    assert_eq!(echoed["folder"], "acme");
    assert_eq!(echoed["turnId"], "t1");
    assert_eq!(echoed["runId"], "r1");
    assert_eq!(echoed["messages"], 1);
    let who: Value = serde_json::from_str(lines[3].strip_prefix("whoami: ").unwrap()).unwrap();
    assert!(who["uid"].is_u64() && who["CapEff"].is_string(), "{who}");
    assert!(
        lines[5].starts_with("read nonexistent: error: "),
        "{}",
        lines[5]
    );
    let everything = a.stdout_text() + &a.stderr_text();
    for canary in ["tok-canary-1", "sk-canary-2", "sk-canary-3", "env-canary-4"] {
        assert!(!everything.contains(canary), "{canary} leaked");
    }
    // Nothing written to disk either: the only entries are the agent's cwd contents we made.
    let files: Vec<_> = std::fs::read_dir(a.dir.path()).unwrap().collect();
    assert!(files.is_empty(), "{files:?}");
}

#[test]
fn write_read_ls() {
    let a = Agent::run(
        Opts::default(),
        &input("/write notes.txt hello  there\n/read notes.txt\n/ls .\n/write /nonexistent/x y"),
    );
    let r = a.ok_result(T);
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(lines[0], "write notes.txt: ok (12 bytes)");
    assert_eq!(lines[1], r#"read notes.txt: "hello  there""#);
    assert_eq!(lines[2], r#"ls .: ["notes.txt"]"#);
    assert!(
        lines[3].starts_with("write /nonexistent/x: error: "),
        "{}",
        lines[3]
    );
    assert_eq!(
        std::fs::read_to_string(a.dir.path().join("notes.txt")).unwrap(),
        "hello  there"
    );
}

#[test]
fn connect_reports_success_and_failure() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let open = listener.local_addr().unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let a = Agent::run(
        Opts::default(),
        &input(&format!("/connect {open}\n/connect {closed} 500")),
    );
    let r = a.ok_result(T);
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(lines[0], format!("connect {open}: connected to {open}"));
    assert!(
        lines[1].starts_with(&format!("connect {closed}: error: ")),
        "{}",
        lines[1]
    );
    drop(listener);
}

fn wait_for(path: &Path) {
    let until = Instant::now() + T;
    while !path.exists() {
        assert!(Instant::now() < until, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mcp_call_through_the_serve_mcp_sidecar() {
    let d = tempfile::tempdir().unwrap();
    let sock = d.path().join("mcp.sock");
    let mut server = Command::new(BIN)
        .args(["serve-mcp", "--socket"])
        .arg(&sock)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock);
    let opts = Opts {
        env: env(&[("HAKO_MCP_SOCKET", sock.to_str().unwrap())]),
        ..Opts::default()
    };
    let a = Agent::run(
        opts,
        &input("/mcp echo {\"x\": [1, \"two\"]}\n/mcp nope {}\n"),
    );
    let r = a.ok_result(T);
    let lines: Vec<&str> = r.lines().collect();
    assert_eq!(lines[0], r#"mcp echo: {"x":[1,"two"]}"#);
    // The server's JSON-RPC error, as the SDK's client reports it.
    assert!(
        lines[1].starts_with("mcp nope: error: ")
            && lines[1].contains("-32602")
            && lines[1].contains("unknown tool"),
        "{}",
        lines[1]
    );
    kill_process(Pid::from_child(&server), Signal::TERM).unwrap();
    let until = Instant::now() + T;
    let status = loop {
        if let Some(s) = server.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < until, "serve-mcp ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!sock.exists(), "socket removed on exit");
}

#[test]
fn mcp_without_a_socket_is_a_line() {
    let opts = Opts {
        env: env(&[("HAKO_MCP_SOCKET", "/nonexistent/mcp.sock")]),
        ..Opts::default()
    };
    let a = Agent::run(opts, &input("/mcp echo"));
    let r = a.ok_result(T);
    assert!(
        r.starts_with("mcp echo: error: cannot connect to /nonexistent/mcp.sock"),
        "{r}"
    );
}

/// A stand-in for `codex app-server` (JSON-RPC over stdio, as Codex 0.147 speaks it): the
/// handshake, a thread, one turn with text, a command whose approval it asks (and checks the
/// answer: hako-agent could not reach the grants, so it must be declined), the answer; then
/// it dies on the next turn, saying why on stderr.
const FAKE_CODEX: &str = r#"#!/bin/sh
read l; case "$l" in *'"initialize"'*) ;; *) echo "not initialize: $l" >&2; exit 2;; esac
echo '{"id":1,"result":{"userAgent":"fake"}}'
read l
read l; case "$l" in *'"thread/start"'*'"developerInstructions":"Be brief."'*) ;; *) echo "no thread/start: $l" >&2; exit 2;; esac
echo '{"method":"thread/started","params":{"thread":{"id":"01a2250d-0d81-74c2-bef9-f063e0a0437d"}}}'
echo '{"id":2,"result":{"thread":{"id":"01a2250d-0d81-74c2-bef9-f063e0a0437d"}}}'
read l; case "$l" in *'"turn/start"'*'"text":"first"'*) ;; *) echo "no turn/start: $l" >&2; exit 2;; esac
echo '{"id":3,"result":{"turn":{"id":"t1","status":"inProgress"}}}'
echo '{"method":"item/completed","params":{"item":{"type":"agentMessage","id":"m1","text":"Let me look."}}}'
echo '{"method":"item/started","params":{"item":{"type":"commandExecution","id":"c1","command":"rm -rf x"}}}'
echo '{"id":0,"method":"item/commandExecution/requestApproval","params":{"itemId":"c1","command":"rm -rf x","cwd":"/w"}}'
read l; case "$l" in *'"id":0'*'"decision":"decline"'*) ;; *) echo "not declined: $l" >&2; exit 2;; esac
echo '{"method":"item/completed","params":{"item":{"type":"agentMessage","id":"m2","text":"All done."}}}'
echo '{"method":"turn/completed","params":{"turn":{"id":"t1","status":"completed"}}}'
read l
echo 'boom: the fake fell over' >&2
exit 1
"#;

/// The Codex brain against a stand-in app server: text before a tool call goes out at once,
/// the answer names the thread as the session, an approval hako-agent cannot ask the grants
/// about is declined (fail closed), and the program dying on a follow-up is a `fatal` block
/// with its exit status and last words.
#[test]
fn codex_brain_speaks_the_app_server_protocol() {
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("codex");
    std::fs::write(&fake, FAKE_CODEX).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let none = bin.path().join("none.sock");
    let mut opts = with_dir();
    opts.env = env(&[
        ("HAKO_BRAIN", "codex"),
        ("HAKO_MODEL", "gpt-test"),
        ("HAKO_CODEX_BIN", fake.to_str().unwrap()),
        ("HAKO_API_SOCKET", none.to_str().unwrap()),
        ("HAKO_MCP_SOCKET", none.to_str().unwrap()),
    ]);
    let mut i = input("first");
    i["systemPrompt"] = json!("Be brief.");
    let mut a = Agent::run(opts, &i);
    assert_eq!(a.ok_result(T), "Let me look.", "{}", a.stderr_text());
    let (_, r) = a.block(T);
    assert_eq!(
        (&r["status"], &r["result"], &r["newSessionId"]),
        (
            &json!("ok"),
            &json!("All done."),
            &json!("01a2250d-0d81-74c2-bef9-f063e0a0437d")
        ),
        "{}",
        a.stderr_text()
    );
    a.follow_up("1000.json", "second");
    let (_, f) = a.block(T);
    assert_eq!(f["status"], "fatal", "{f}");
    let why = f["error"].as_str().unwrap();
    assert!(
        why.starts_with("Codex exited (exit status: 1): boom: the fake fell over"),
        "{why}"
    );
    a.drop_file("_close", b"");
    assert_eq!(a.wait(T).code(), Some(0));
}
