//! `hako chat` end to end: the real binary, through a pipe and in a pseudo-terminal, a temp
//! data dir, real containers (counted through the Docker API by this test's install label).

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bollard::query_parameters::ListContainersOptionsBuilder;
use hako_shared::testing::eventually;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(90);

fn unique(prefix: &str) -> String {
    let mut b = [0u8; 4];
    getrandom::fill(&mut b).unwrap();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}-{hex}")
}

/// `hako chat …` with piped stdin (kept open) and stdout read line by line.
struct Session {
    child: Child,
    lines: mpsc::Receiver<String>,
    install: String,
}

impl Session {
    fn start(data: &std::path::Path, image: &str, args: &[&str]) -> Session {
        let data = data.display().to_string();
        Session::start_with(
            args,
            &[("DATA_DIR", &data), ("CONTAINER_IMAGE", image)],
            "cli-test",
        )
    }

    /// `hako <args>` with `env`, its install named after `prefix`.
    fn start_with(args: &[&str], env: &[(&str, &str)], prefix: &str) -> Session {
        let install = unique(prefix);
        let mut child = Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(args)
            .envs(env.iter().copied())
            .env("HAKO_INSTALL_ID", &install)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn hako");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        Session {
            child,
            lines,
            install,
        }
    }

    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn next(&self) -> String {
        self.lines
            .recv_timeout(T)
            .expect("a reply within the limit")
    }

    /// Closes stdin and waits for the exit code.
    async fn end(mut self) -> (i32, String) {
        drop(self.child.stdin.take());
        // `try_wait` does not block: the probe answers a ready future (an async block could
        // not hold the `&mut` child past the probe's call).
        let s = eventually("hako chat's exit", T, || {
            std::future::ready(self.child.try_wait().unwrap().ok_or("still running"))
        })
        .await;
        let rest: Vec<String> = self.lines.try_iter().collect();
        (s.code().unwrap_or(-1), rest.join("\n"))
    }
}

impl Drop for Session {
    /// A failed assertion kills `hako chat` before it cleans up: its containers go here.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let install = self.install.clone();
        let _ = std::thread::spawn(move || {
            if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                let _ = rt.block_on(hako_cli::stack::remove_agents(&install));
            }
        })
        .join();
    }
}

/// The ids of this install's containers (running or not), from the Docker API.
async fn containers(install: &str) -> Vec<String> {
    let docker = hako_deploy::connect_docker().unwrap();
    let filters = std::collections::HashMap::from([(
        "label".to_owned(),
        vec![format!("io.hako.install={install}")],
    )]);
    docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

fn input_json(line: &str) -> Value {
    serde_json::from_str(line.strip_prefix("input: ").expect("an /echo-input line")).unwrap()
}

/// A provider on loopback: each call answered with `answer(body)` as an event stream, the
/// value of its `key_header` recorded. Answers the keys seen and the URL.
async fn stub_provider(
    key_header: &'static str,
    answer: fn(&Value) -> String,
) -> (std::sync::Arc<std::sync::Mutex<Vec<String>>>, String) {
    let keys: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let seen = keys.clone();
    let app = axum::Router::new().fallback(axum::routing::any(
        move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let key = headers.get(key_header).and_then(|v| v.to_str().ok());
                seen.lock().unwrap().push(key.unwrap_or("").to_owned());
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from(answer(&v)))
                    .unwrap()
            }
        },
    ));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    (keys, url)
}

/// Two lines, two replies, from one container, which is gone when the chat ends; the
/// provider saw `key` and nothing else.
async fn two_lines_in_one_container(
    mut s: Session,
    keys: &std::sync::Mutex<Vec<String>>,
    key: &str,
) {
    let install = s.install.clone();
    s.say("first line");
    assert_eq!(s.next(), "You said: first line");
    let first = containers(&install).await;
    assert_eq!(first.len(), 1, "{first:?}");
    s.say("second line");
    assert_eq!(s.next(), "You said: second line");
    assert_eq!(containers(&install).await, first, "the same container");
    assert_eq!(s.end().await.0, 0);
    assert!(containers(&install).await.is_empty(), "removed at the end");
    let keys = keys.lock().unwrap().clone();
    assert!(!keys.is_empty());
    assert!(
        keys.iter().all(|k| k == key),
        "the provider got the operator's key only: {keys:?}"
    );
}

/// Several turns of one conversation run in ONE container (the same id from the Docker API
/// at each turn); the session and the files carry over to the next chat of the folder.
#[tokio::test]
async fn a_conversation_is_one_container_and_the_next_chat_resumes_it() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let mut s = Session::start(data.path(), &image, &["chat", "team/dev"]);
    s.say("hello");
    assert_eq!(s.next(), "hello");
    let first = containers(&s.install).await;
    assert_eq!(first.len(), 1, "{first:?}");
    s.say("/session s-42");
    assert_eq!(s.next(), "session: s-42");
    s.say("/write notes.txt remember-me");
    assert_eq!(s.next(), "write notes.txt: ok (11 bytes)");
    s.say("/echo-input");
    let input = input_json(&s.next());
    assert_eq!(input["followUp"], true, "a follow-up into the same agent");
    assert_eq!(
        containers(&s.install).await,
        first,
        "still the one container"
    );
    let install = s.install.clone();
    let (code, _) = s.end().await;
    assert_eq!(code, 0);
    assert!(containers(&install).await.is_empty(), "removed at the end");
    let session: Value = serde_json::from_slice(
        &std::fs::read(data.path().join("folders/team.dev/cli-session.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        (&session["session_id"], &session["messages"]),
        (&json!("s-42"), &json!(4)),
        "{session}"
    );

    // The next chat: the same session id, the same files.
    let mut s = Session::start(data.path(), &image, &["chat", "team/dev"]);
    s.say("/echo-input");
    let input = input_json(&s.next());
    assert_eq!(input["sessionId"], "s-42");
    s.say("/read notes.txt");
    assert_eq!(s.next(), r#"read notes.txt: "remember-me""#);
    assert_eq!(s.end().await.0, 0);
}

/// A line typed while the agent is still answering the previous one is answered after it,
/// by the same agent, in order.
#[tokio::test]
async fn a_follow_up_typed_while_a_reply_is_under_way() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let mut s = Session::start(data.path(), &image, &["chat"]);
    s.say("/sleep 2\nslow one");
    s.say("/echo-input");
    s.say("quick one");
    assert_eq!(s.next(), "slept 2 s");
    assert_eq!(s.next(), "slow one");
    let input = input_json(&s.next());
    assert_eq!(input["followUp"], true);
    assert_eq!(s.next(), "quick one");
    let install = s.install.clone();
    assert_eq!(s.end().await.0, 0);
    assert!(containers(&install).await.is_empty());
}

/// The MCP tools in chat mode: the CLI's stubs answer `not_available` where routd is needed,
/// and the rest work on the conversation (history; a scheduled task fires into the chat).
#[tokio::test]
async fn the_tools_work_in_chat_mode_with_the_cli_stubs() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let mut s = Session::start(data.path(), &image, &["chat"]);
    s.say("hi there");
    assert_eq!(s.next(), "hi there");
    s.say(r#"/mcp send_message {"text": "x"}"#);
    let line = s.next();
    assert!(
        line.contains("tool error: not_available") && line.contains("CLI mode"),
        "{line}"
    );
    s.say(r#"/mcp get_history {"limit": 10}"#);
    let line = s.next();
    assert!(line.contains("hi there"), "{line}");
    s.say(r#"/mcp schedule_task {"prompt": "the task's prompt", "after": "1s"}"#);
    assert!(s.next().starts_with("mcp schedule_task: "));
    assert_eq!(
        s.next(),
        "the task's prompt",
        "the task fired into the chat"
    );
    assert_eq!(s.end().await.0, 0);
}

/// Ctrl-C at the terminal during a turn: the container is stopped and removed and the
/// temporary session directory is gone; the prompt and replies are what a person sees.
#[tokio::test]
async fn ctrl_c_in_a_terminal_stops_the_container_and_removes_the_session() {
    const DRIVER: &str = r#"
import json, os, pty, select, sys, time
i = json.load(sys.stdin)
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(i["env"])
    os.execv(i["hako"], [i["hako"], "chat"])
out = b""
def read_until(needle, limit):
    global out
    end = time.time() + limit
    while needle not in out and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return needle in out
ok_prompt = read_until(b"you> ", 60)
os.write(fd, b"hello\r")
ok_reply = read_until(b"agent> hello", 60)
os.write(fd, b"/sleep 60\r")
time.sleep(3)
os.write(fd, b"\x03")
end = time.time() + 60
status = None
while time.time() < end:
    p, s = os.waitpid(pid, os.WNOHANG)
    if p:
        status = os.waitstatus_to_exitcode(s)
        break
    read_until(b"\x00", 0.2)
print(json.dumps({"prompt": ok_prompt, "reply": ok_reply, "status": status,
                  "out": out.decode("utf-8", "replace")}))
"#;
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let install = unique("cli-pty");
    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let input = json!({
        "hako": env!("CARGO_BIN_EXE_hako"),
        "env": {"CONTAINER_IMAGE": image, "HAKO_INSTALL_ID": install,
                "HOME": home.path().display().to_string(), "TERM": "xterm"},
    });
    let seen = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(&python, DRIVER, &input)
    })
    .await
    .unwrap();
    let out = seen["out"].as_str().unwrap_or_default();
    assert_eq!(seen["prompt"], true, "{out}");
    assert_eq!(seen["reply"], true, "{out}");
    assert_eq!(seen["status"], 130, "exit 130 on Ctrl-C: {out}");
    assert!(out.contains("interrupted"), "{out}");
    assert!(
        containers(&install).await.is_empty(),
        "the container is gone"
    );
    let temp = out
        .split("temporary session in ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the temporary directory is named");
    assert!(
        !std::path::Path::new(temp).exists(),
        "{temp} is gone: {out}"
    );
}

/// A closed terminal (the pty's master closed: the kernel sends SIGHUP) ends the chat as
/// SIGTERM does: its container is removed, nothing is left polling the folder's follow-ups.
#[tokio::test]
async fn a_closed_terminal_stops_the_chat_and_its_container() {
    const DRIVER: &str = r#"
import json, os, pty, select, sys, time
i = json.load(sys.stdin)
pid, fd = pty.fork()
if pid == 0:
    os.environ.update(i["env"])
    os.execv(i["hako"], [i["hako"], "chat", "team/hup"])
out = b""
def read_until(needle, limit):
    global out
    end = time.time() + limit
    while needle not in out and time.time() < end:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return needle in out
ok_prompt = read_until(b"you> ", 60)
os.write(fd, b"hello\r")
ok_reply = read_until(b"agent> hello", 60)
os.write(fd, b"/sleep 60\r")
time.sleep(2)
os.close(fd)
end = time.time() + 60
status = None
while time.time() < end:
    p, s = os.waitpid(pid, os.WNOHANG)
    if p:
        status = os.waitstatus_to_exitcode(s)
        break
    time.sleep(0.1)
print(json.dumps({"prompt": ok_prompt, "reply": ok_reply, "status": status,
                  "out": out.decode("utf-8", "replace")}))
"#;
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let install = unique("cli-hup");
    let python = tokio::task::spawn_blocking(hako_shared::testing::conformance_python)
        .await
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let input = json!({
        "hako": env!("CARGO_BIN_EXE_hako"),
        "env": {"CONTAINER_IMAGE": image, "HAKO_INSTALL_ID": install,
                "DATA_DIR": data.path().display().to_string(),
                "HOME": home.path().display().to_string(), "TERM": "xterm"},
    });
    let seen = tokio::task::spawn_blocking(move || {
        hako_shared::testing::run_python(&python, DRIVER, &input)
    })
    .await
    .unwrap();
    let out = seen["out"].as_str().unwrap_or_default();
    assert_eq!(seen["reply"], true, "{out}");
    assert!(
        seen["status"].is_i64(),
        "hako chat exits when its terminal closes: {seen}"
    );
    assert!(
        containers(&install).await.is_empty(),
        "its container is gone with it"
    );
}

/// A chat killed outright (SIGKILL) cannot clean up: its container stays, polling the
/// folder's follow-ups. The next chat of the folder removes it before it starts, so it
/// answers every line (7 of 12 vanished into the orphan before); while a chat of the folder
/// lives, a second one is refused, naming it.
#[tokio::test]
async fn a_killed_chats_container_never_eats_the_next_chats_lines() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let mut dead = Session::start(data.path(), &image, &["chat", "team/kill"]);
    dead.say("hello");
    assert_eq!(dead.next(), "hello");
    assert_eq!(containers(&dead.install).await.len(), 1);
    // (Any chat starting from now on may remove the orphan: other tests' chats too.)
    dead.child.kill().unwrap();
    dead.child.wait().unwrap();

    let mut s = Session::start(data.path(), &image, &["chat", "team/kill"]);
    // Live (it holds the folder's lock) once it has answered.
    s.say("first");
    assert_eq!(s.next(), "first");
    // A second chat beside a live one is refused, and says why.
    let second = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["chat", "team/kill", "-m", "hi"])
        .env("DATA_DIR", data.path())
        .env("CONTAINER_IMAGE", &image)
        .env("HAKO_INSTALL_ID", unique("cli-test"))
        .output()
        .unwrap();
    let why = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{why}");
    assert!(
        why.contains("another hako chat of this folder is live"),
        "{why}"
    );
    for i in 0..12 {
        s.say(&format!("line {i}"));
    }
    let got: Vec<String> = (0..12).map(|_| s.next()).collect();
    let want: Vec<String> = (0..12).map(|i| format!("line {i}")).collect();
    assert_eq!(got, want, "every line answered, in order");
    assert!(
        containers(&dead.install).await.is_empty(),
        "the dead chat's container was removed"
    );
    let install = s.install.clone();
    assert_eq!(s.end().await.0, 0);
    assert!(containers(&install).await.is_empty());
    drop(dead);
}

/// `--message`: one turn, the reply, and the container told to finish at once (not after the
/// idle timeout), even though the end of input comes before the container exists.
#[tokio::test]
async fn one_message_is_answered_and_the_chat_ends_at_once() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let install = unique("cli-test");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["chat", "demo", "--message", "hello, hako"])
        .env("DATA_DIR", data.path())
        .env("CONTAINER_IMAGE", &image)
        .env("HAKO_INSTALL_ID", &install)
        .output()
        .expect("hako runs");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello, hako\n");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "ended by the close, not the 10-minute idle timeout"
    );
    assert!(containers(&install).await.is_empty());
}

#[tokio::test]
async fn a_failed_turn_is_reported_and_sets_the_exit_code() {
    let image = hako_deploy::ensure_agent_image().await.expect("image");
    let data = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["chat", "demo", "--message", "/fatal boom\n/exit 1"])
        .env("DATA_DIR", data.path())
        .env("CONTAINER_IMAGE", &image)
        .env("HAKO_INSTALL_ID", unique("cli-test"))
        .output()
        .expect("hako runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("agent fatal: boom"), "{stderr}");
}

#[test]
fn a_bad_folder_or_setting_says_what_to_fix() {
    let data = tempfile::tempdir().expect("tempdir");
    for bad in ["../etc", "a/../../b", "/abs", "a b"] {
        let out = Command::new(env!("CARGO_BIN_EXE_hako"))
            .args(["chat", bad])
            .env("DATA_DIR", data.path())
            .stdin(Stdio::null())
            .output()
            .expect("hako runs");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("is not a group folder"), "{bad}: {stderr}");
    }
    assert_eq!(
        std::fs::read_dir(data.path()).unwrap().count(),
        0,
        "nothing was made"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hako"))
        .args(["chat", "demo", "--message", "hi"])
        .env("DATA_DIR", data.path())
        .env("RUNED_RUN_TIMEOUT", "soon")
        .output()
        .expect("hako runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("RUNED_RUN_TIMEOUT"), "{stderr}");
}

/// `hako chat --agent claude` in a pipe: the real Claude Code in one hako-claude container
/// answers two lines (the second a follow-up into the same process), its model reached
/// through the gateway the chat serves on the turn's socket (the key from the chat's own
/// environment, never the container's), against a stub Anthropic provider on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_in_chat_mode_two_lines_two_replies_one_container() {
    let image = hako_deploy::ensure_claude_image().await.expect("image");
    // The stub: "You said: <last text>", streamed; it records the keys it was given.
    let (keys, url) = stub_provider("x-api-key", claude_answer).await;
    let data = tempfile::tempdir().expect("tempdir");
    let data = data.path().display().to_string();
    let args = [
        "chat",
        "team/cc",
        "--agent",
        "claude",
        "--model",
        "claude-stub-1",
    ];
    let env = [
        ("DATA_DIR", data.as_str()),
        ("RUNED_CLAUDE_IMAGE", &image),
        ("ANTHROPIC_API_KEY", "sk-the-operators-own-key"),
        ("HAKO_ANTHROPIC_URL", &url),
    ];
    let s = Session::start_with(&args, &env, "cli-claude");
    two_lines_in_one_container(s, &keys, "sk-the-operators-own-key").await;
}

/// The Anthropic stub's answer: "You said: <the user's last text>".
fn claude_answer(v: &Value) -> String {
    let last = v["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .cloned()
        .unwrap_or(Value::Null);
    let text = match &last["content"] {
        Value::String(s) => s.clone(),
        // Claude Code puts context blocks (reminders, the environment) around
        // the user's own text.
        Value::Array(b) => b
            .iter()
            .rev()
            .filter_map(|b| b["text"].as_str())
            .find(|t| !t.starts_with("<system-reminder>") && !t.starts_with('#'))
            .unwrap_or("")
            .to_owned(),
        _ => String::new(),
    };
    let ev = |n: &str, d: Value| format!("event: {n}\ndata: {d}\n\n");
    [
        ev("message_start", json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "model": "claude-stub-1", "stop_reason": null, "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 1}}})),
        ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": format!("You said: {text}")}})),
        ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 3}})),
        ev("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

/// `hako chat --agent codex` in a pipe: the real Codex in one hako-codex container answers two
/// lines (the second a follow-up into the same app server), its model reached through the
/// gateway the chat serves on the turn's socket in the Responses format (the key from the
/// chat's own environment, never the container's), against a stub on loopback.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_in_chat_mode_two_lines_two_replies_one_container() {
    let image = hako_deploy::ensure_codex_image().await.expect("image");
    // The stub: "You said: <last text>", streamed; it records the keys it was given.
    let (keys, url) = stub_provider("authorization", codex_answer).await;
    let data = tempfile::tempdir().expect("tempdir");
    let data = data.path().display().to_string();
    let args = [
        "chat",
        "team/cx",
        "--agent",
        "codex",
        "--model",
        "gpt-stub-1",
    ];
    let env = [
        ("DATA_DIR", data.as_str()),
        ("RUNED_CODEX_IMAGE", &image),
        ("OPENAI_API_KEY", "sk-the-operators-own-openai-key"),
        ("HAKO_OPENAI_URL", &url),
    ];
    let s = Session::start_with(&args, &env, "cli-codex");
    two_lines_in_one_container(s, &keys, "Bearer sk-the-operators-own-openai-key").await;
}

/// The Responses stub's answer: "You said: <the user's last text>".
fn codex_answer(v: &Value) -> String {
    let text = v["input"]
        .as_array()
        .and_then(|i| i.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_array())
        .and_then(|c| c.iter().rev().find_map(|p| p["text"].as_str()))
        .unwrap_or("")
        .to_owned();
    let item = json!({"type": "message", "id": "msg_1", "role": "assistant",
        "status": "completed", "content": [{"type": "output_text",
        "text": format!("You said: {text}"), "annotations": []}]});
    let ev = |d: Value| format!("event: {}\ndata: {d}\n\n", d["type"].as_str().unwrap());
    [
        ev(json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "r", "object": "response", "status": "in_progress", "output": []}})),
        ev(
            json!({"type": "response.output_item.done", "sequence_number": 1,
            "output_index": 0, "item": item}),
        ),
        ev(json!({"type": "response.completed", "sequence_number": 2,
            "response": {"id": "r", "object": "response", "status": "completed", "output": [item],
            "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}}})),
    ]
    .concat()
}
