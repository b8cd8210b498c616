//! The turn's MCP server over a real unix socket, spoken to as raw JSON-RPC lines (what an
//! agent's client sends), with an in-memory backend: protocol versions, tool lists by grants,
//! calls, refusals as tool errors, the turn's end, and the bounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hako_mcp::tools::{Backend, Call, Scope, ToolError};
use hako_mcp::{ServeOptions, serve};
use hako_shared::GroupFolder;
use hako_shared::grants::Grants;
use hako_shared::runs::Trust;
use hako_shared::testing::eventually;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio_util::sync::CancellationToken;

struct Memory {
    live: AtomicBool,
    sent: std::sync::Mutex<Vec<(String, String)>>,
}

impl Backend for Memory {
    async fn is_live(&self, _scope: &Scope) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    async fn call(&self, scope: &Scope, call: Call) -> Result<Value, ToolError> {
        match call {
            Call::SendMessage(m) => {
                let chat = m.chat_jid.unwrap_or_else(|| scope.chat_jid.to_string());
                self.sent.lock().unwrap().push((chat.clone(), m.text));
                Ok(json!({"id": "m-1", "chat_jid": chat}))
            }
            Call::ListTasks(_) => Ok(json!({"tasks": []})),
            other => Err(ToolError::not_found(format!(
                "{:?} not in this test",
                other.tool()
            ))),
        }
    }
}

struct Conn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    id: i64,
}

impl Conn {
    async fn open(path: &std::path::Path) -> Conn {
        let (r, w) = UnixStream::connect(path).await.unwrap().into_split();
        Conn {
            r: BufReader::new(r),
            w,
            id: 0,
        }
    }

    async fn send(&mut self, v: Value) {
        let mut line = v.to_string();
        line.push('\n');
        self.w.write_all(line.as_bytes()).await.unwrap();
    }

    async fn recv(&mut self) -> Option<Value> {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(10), self.r.read_line(&mut line))
            .await
            .expect("an answer within 10 s")
            .ok()?;
        (n > 0).then(|| serde_json::from_str(&line).unwrap())
    }

    async fn request(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let v = self.recv().await.expect("connection open");
            if v["id"] == id {
                return v;
            }
        }
    }

    async fn init(&mut self, version: &str) -> Value {
        let v = self
            .request(
                "initialize",
                json!({"protocolVersion": version, "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}),
            )
            .await;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        v
    }

    async fn call(&mut self, tool: &str, args: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": args}))
            .await
    }
}

struct Turn {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    backend: Arc<Memory>,
    ended: CancellationToken,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn turn(grants: &[&str], trust: Trust, opts: ServeOptions) -> Turn {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mcp.sock");
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let rules: Vec<String> = grants.iter().map(|g| (*g).to_owned()).collect();
    let scope = Arc::new(Scope {
        folder: GroupFolder::new("acme").unwrap(),
        turn_id: hako_shared::ids::TurnId::new("turn-1").unwrap(),
        chat_jid: hako_shared::ChatJid::new("web:acme").unwrap(),
        grants: Grants::parse(&rules, trust).unwrap(),
    });
    let backend = Arc::new(Memory {
        live: AtomicBool::new(true),
        sent: Default::default(),
    });
    let (ended, stop) = (CancellationToken::new(), CancellationToken::new());
    let task = tokio::spawn(serve(
        listener,
        backend.clone(),
        scope,
        ended.clone(),
        stop.clone(),
        opts,
    ));
    Turn {
        _dir: dir,
        path,
        backend,
        ended,
        stop,
        task,
    }
}

fn text(v: &Value) -> String {
    v["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn every_protocol_version_agents_speak_lists_and_calls() {
    let t = turn(&[], Trust::Untrusted, ServeOptions::default());
    for version in ["2025-03-26", "2025-06-18", "2025-11-25"] {
        let mut c = Conn::open(&t.path).await;
        let init = c.init(version).await;
        assert_eq!(init["result"]["protocolVersion"], version, "{init}");
        assert_eq!(init["result"]["serverInfo"]["name"], "hako");
        let list = c.request("tools/list", json!({})).await;
        let names: Vec<&str> = list["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        // An untrusted group is not offered the main-only tools.
        assert_eq!(
            names,
            [
                "send_message",
                "get_history",
                "set_status",
                "schedule_task",
                "list_tasks",
                "cancel_task",
                "reset_session",
                "agent_tool"
            ]
        );
        for tool in list["result"]["tools"].as_array().unwrap() {
            assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
            assert!(!tool["description"].as_str().unwrap().is_empty());
        }
        let r = c
            .call(
                "send_message",
                json!({"text": format!("hi from {version}")}),
            )
            .await;
        assert_eq!(r["result"]["isError"], false, "{r}");
        assert_eq!(r["result"]["structuredContent"]["chat_jid"], "web:acme");
    }
    assert_eq!(t.backend.sent.lock().unwrap().len(), 3);
    t.stop.cancel();
    t.task.await.unwrap();
}

#[tokio::test]
async fn refusals_are_tool_errors_and_the_connection_stays() {
    let t = turn(
        &["send_message:web:acme*", "!list_tasks"],
        Trust::Untrusted,
        ServeOptions::default(),
    );
    let mut c = Conn::open(&t.path).await;
    c.init("2025-06-18").await;
    // Not granted: another chat, a denied tool, a main-only tool.
    for (tool, args, says) in [
        (
            "send_message",
            json!({"text": "x", "chat_jid": "tg:42"}),
            "not_granted",
        ),
        ("list_tasks", json!({}), "not_granted"),
        (
            "spawn_group",
            json!({"folder": "acme/b", "prompt": "go"}),
            "not_granted: spawn_group is only for the operator's main group",
        ),
        (
            "send_message",
            json!({"text": ""}),
            "invalid_arguments: text is empty",
        ),
        ("send_message", json!({"txt": "x"}), "invalid_arguments"),
    ] {
        let r = c.call(tool, args).await;
        assert_eq!(r["result"]["isError"], true, "{tool}: {r}");
        assert!(text(&r).starts_with(says), "{tool}: {}", text(&r));
    }
    // An unknown tool is a protocol error (invalid params), still on the same connection.
    let r = c.call("rm_rf", json!({})).await;
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = c.call("send_message", json!({"text": "still here"})).await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    // A line past the bound is dropped, not buffered, and the connection keeps working.
    c.send(json!({"jsonrpc": "2.0", "id": 99, "method": "tools/call", "params": {"name": "send_message", "arguments": {"text": "y".repeat(2 << 20)}}})).await;
    let r = c
        .call("send_message", json!({"text": "after the flood"}))
        .await;
    assert_eq!(r["result"]["isError"], false, "{r}");
    let sent = t.backend.sent.lock().unwrap().clone();
    assert_eq!(
        sent.iter().map(|s| s.1.as_str()).collect::<Vec<_>>(),
        ["still here", "after the flood"]
    );
    t.stop.cancel();
    t.task.await.unwrap();
}

#[tokio::test]
async fn after_the_turn_calls_are_refused_then_the_socket_closes() {
    let t = turn(
        &[],
        Trust::Main,
        ServeOptions {
            grace: Duration::from_millis(500),
            ..Default::default()
        },
    );
    let mut c = Conn::open(&t.path).await;
    c.init("2025-06-18").await;
    t.ended.cancel();
    let r = c.call("send_message", json!({"text": "too late"})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(text(&r).contains("turn turn-1 has ended"), "{}", text(&r));
    // After the grace the connection is closed and nobody accepts on the socket.
    assert!(c.recv().await.is_none());
    tokio::time::timeout(Duration::from_secs(5), t.task)
        .await
        .unwrap()
        .unwrap();
    assert!(UnixStream::connect(&t.path).await.is_err());
    // A backend that says the turn is over refuses too (the store knows before the socket).
    let t = turn(&[], Trust::Main, ServeOptions::default());
    t.backend.live.store(false, Ordering::SeqCst);
    let mut c = Conn::open(&t.path).await;
    c.init("2025-03-26").await;
    let r = c.call("list_tasks", json!({})).await;
    assert!(text(&r).starts_with("turn_ended"), "{r}");
    assert!(t.backend.sent.lock().unwrap().is_empty());
    t.stop.cancel();
}

#[tokio::test]
async fn connections_are_bounded() {
    let t = turn(
        &[],
        Trust::Untrusted,
        ServeOptions {
            max_connections: 2,
            ..Default::default()
        },
    );
    let mut a = Conn::open(&t.path).await;
    let mut b = Conn::open(&t.path).await;
    a.init("2025-06-18").await;
    b.init("2025-06-18").await;
    // The third is closed at once; the first two still work.
    let mut c = Conn::open(&t.path).await;
    c.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}})).await;
    assert!(c.recv().await.is_none());
    assert_eq!(
        a.call("list_tasks", json!({})).await["result"]["isError"],
        false
    );
    drop(a);
    // A slot freed by a closed connection is usable again.
    eventually(
        "the freed slot taking a connection",
        Duration::from_secs(5),
        || async {
            let mut d = Conn::open(&t.path).await;
            d.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "x", "version": "0"}}})).await;
            if d.recv().await.is_some() {
                Ok(())
            } else {
                Err("closed at once")
            }
        },
    )
    .await;
    drop(b);
    t.stop.cancel();
}

/// Claude Code's permission prompt on the turn's socket: the grants decide, in the decision
/// format it reads (`allow` with the input unchanged, or `deny` with why), and an ask rule
/// with no one to ask is a deny, never an error.
#[tokio::test]
async fn the_agents_own_tools_are_decided_by_the_grants() {
    let t = turn(
        &["*", "!agent_tool:WebFetch", "?agent_tool:Bash"],
        Trust::Untrusted,
        ServeOptions::default(),
    );
    let mut c = Conn::open(&t.path).await;
    c.init("2025-06-18").await;
    let decide = |r: &Value| -> Value {
        assert_eq!(r["result"]["isError"], false, "{r}");
        serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap()).unwrap()
    };
    let input = json!({"file_path": "/workspace/a.txt", "content": "x"});
    let r = c
        .call(
            "agent_tool",
            json!({"tool_name": "Write", "input": input, "tool_use_id": "toolu_1", "later_field": 1}),
        )
        .await;
    assert_eq!(
        decide(&r),
        json!({"behavior": "allow", "updatedInput": input})
    );
    let r = c
        .call(
            "agent_tool",
            json!({"tool_name": "WebFetch", "input": {"url": "https://x"}}),
        )
        .await;
    let d = decide(&r);
    assert_eq!(d["behavior"], "deny", "{d}");
    assert!(d["message"].as_str().unwrap().contains("WebFetch"), "{d}");
    let r = c
        .call(
            "agent_tool",
            json!({"tool_name": "Bash", "input": {"command": "ls"}}),
        )
        .await;
    let d = decide(&r);
    assert_eq!(d["behavior"], "deny", "{d}");
    assert!(d["message"].as_str().unwrap().contains("approval"), "{d}");
    let r = c.call("agent_tool", json!({"tool_name": ""})).await;
    assert_eq!(r["result"]["isError"], true, "{r}");
    t.stop.cancel();
}
