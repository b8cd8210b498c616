//! MCP over unix sockets: the client of the turn's tools (on rmcp, the official SDK, as routd
//! serves them), behind the script brain's `/mcp` and the LLM brain's tool calls; and a tiny
//! hand-written server behind `hako-agent serve-mcp` (a reference sidecar with one `echo`
//! tool, kept off rmcp so that the static agent carries no server stack).
//!
//! Every connect, call, read and write has a timeout and every line a size bound, so a silent
//! or hostile peer can neither hang the agent nor make it buffer without limit.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt as _;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Map, Value, json};
use thiserror::Error;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::time::timeout;

use crate::output::log;

/// The protocol version the echo server answers with when the client's is unknown to it.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Versions the echo server accepts (it answers with the client's if listed).
pub const SUPPORTED_VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// Upper bound of one JSON-RPC line (the echo server).
pub const MAX_LINE: usize = 1024 * 1024;
/// Client: connect and handshake timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Client: timeout of a tool listing.
pub const LIST_TIMEOUT: Duration = Duration::from_secs(10);
/// Client: timeout of one tool call. A call may be held for a person's approval (routd
/// bounds that wait by the group's setting and the turn's end; the run's deadline bounds
/// everything), so this only guards against a server that never answers.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3600);
/// Client: how long a call whose connection broke keeps trying to reach the turn's socket
/// again (routd restarting binds it anew within seconds); past it the call fails.
pub const RECONNECT_WAIT: Duration = Duration::from_secs(120);
/// Client: how often it tries while the socket is away.
const RECONNECT_POLL: Duration = Duration::from_millis(250);
/// Server: a connection with no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// Server: connections served at once.
const MAX_CONNECTIONS: usize = 64;

/// An MCP call that did not produce a tool result.
#[derive(Debug, Error)]
pub enum McpError {
    /// The socket could not be reached.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket path.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The peer did not answer in time.
    #[error("timed out during {0}")]
    Timeout(&'static str),
    /// The handshake failed.
    #[error("initialize failed: {0}")]
    Initialize(String),
    /// The connection broke before the answer (routd restarting, the socket closed).
    #[error("{what}: the connection broke ({message})")]
    Broken {
        /// The request.
        what: &'static str,
        /// How.
        message: String,
    },
    /// The peer answered a request with an error, or broke the protocol.
    #[error("{what} failed: {message}")]
    Service {
        /// The request.
        what: &'static str,
        /// The error.
        message: String,
    },
}

/// The result of a `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolResult {
    /// The text content items, joined by newlines (other items shown as `[type]`).
    pub text: String,
    /// The tool's `isError`.
    pub is_error: bool,
}

/// A tool the server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    /// Its name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// Its arguments' JSON schema.
    pub input_schema: Map<String, Value>,
}

/// A connection to an MCP server over a unix socket (the official SDK's client).
pub struct Client {
    service: RunningService<RoleClient, ()>,
}

impl Client {
    /// Connects and initializes.
    pub async fn connect(socket: &Path) -> Result<Self, McpError> {
        let stream = timeout(CONNECT_TIMEOUT, UnixStream::connect(socket))
            .await
            .map_err(|_| McpError::Timeout("connect"))?
            .map_err(|source| McpError::Connect {
                path: socket.display().to_string(),
                source,
            })?;
        let service = timeout(CONNECT_TIMEOUT, ().serve(stream))
            .await
            .map_err(|_| McpError::Timeout("initialize"))?
            .map_err(|e| McpError::Initialize(e.to_string()))?;
        Ok(Self { service })
    }

    /// Every tool the server offers.
    pub async fn tools(&self) -> Result<Vec<ToolSpec>, McpError> {
        let tools = timeout(LIST_TIMEOUT, self.service.list_all_tools())
            .await
            .map_err(|_| McpError::Timeout("tools/list"))?
            .map_err(|e| McpError::Service {
                what: "tools/list",
                message: e.to_string(),
            })?;
        Ok(tools
            .into_iter()
            .map(|t| ToolSpec {
                name: t.name.into_owned(),
                description: t.description.map(|d| d.into_owned()).unwrap_or_default(),
                input_schema: (*t.input_schema).clone(),
            })
            .collect())
    }

    /// Calls one tool; `key` names the call (`_meta.hako/call`): asked again with the same
    /// key after a broken connection, it is the same call to routd (the same held request,
    /// the same message).
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        key: Option<&str>,
    ) -> Result<ToolResult, McpError> {
        let mut params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        if let Some(k) = key {
            let mut meta = serde_json::Map::new();
            meta.insert(CALL_KEY_META.into(), Value::from(k));
            params.meta = Some(rmcp::model::RequestMetaObject(rmcp::model::MetaObject(
                meta,
            )));
        }
        let r = timeout(CALL_TIMEOUT, self.service.call_tool(params))
            .await
            .map_err(|_| McpError::Timeout("tools/call"))?
            .map_err(|e| match e {
                rmcp::ServiceError::TransportClosed
                | rmcp::ServiceError::TransportSend(_)
                | rmcp::ServiceError::Cancelled { .. } => McpError::Broken {
                    what: "tools/call",
                    message: e.to_string(),
                },
                e => McpError::Service {
                    what: "tools/call",
                    message: e.to_string(),
                },
            })?;
        let text = r
            .content
            .iter()
            .map(|c| match c {
                ContentBlock::Text(t) => t.text.clone(),
                ContentBlock::Image(_) => "[image]".to_owned(),
                ContentBlock::Audio(_) => "[audio]".to_owned(),
                ContentBlock::Resource(_) => "[resource]".to_owned(),
                ContentBlock::ResourceLink(_) => "[resource_link]".to_owned(),
                _ => "[?]".to_owned(),
            })
            .collect::<Vec<_>>()
            .join("\n");
        Ok(ToolResult {
            text,
            is_error: r.is_error.unwrap_or(false),
        })
    }

    /// Closes the connection.
    pub async fn close(self) {
        let _ = timeout(Duration::from_secs(2), self.service.cancel()).await;
    }
}

/// The `_meta` key naming a call (as routd reads it: `hako_mcp::CALL_KEY_META`).
pub const CALL_KEY_META: &str = "hako/call";

/// A fresh name for one call: unique across boxes and runs (96 random bits).
pub fn new_call_key() -> String {
    hako_shared::ids::random_id("c", 12)
}

/// Calls one tool over the MCP socket on a connection of its own. A connection that breaks
/// (routd restarting while a person decides) is made again, for up to [`RECONNECT_WAIT`],
/// and the call asked again under the same name: routd attaches it to what it started.
pub async fn call_tool(
    socket: &Path,
    tool: &str,
    arguments: Value,
) -> Result<ToolResult, McpError> {
    let Value::Object(arguments) = arguments else {
        return Err(McpError::Service {
            what: "tools/call",
            message: "arguments must be a JSON object".into(),
        });
    };
    let key = new_call_key();
    // A socket that is not there at all fails at once; one that broke mid-call (routd
    // restarting) is waited for, and the call asked again under its name.
    let mut broke: Option<tokio::time::Instant> = None;
    loop {
        let r = match Client::connect(socket).await {
            Ok(client) => {
                let r = client.call(tool, arguments.clone(), Some(&key)).await;
                client.close().await;
                r
            }
            Err(e) => Err(e),
        };
        match (r, broke) {
            (Err(e @ McpError::Broken { .. }), at)
                if at.is_none_or(|t| t.elapsed() < RECONNECT_WAIT) =>
            {
                log(format_args!(
                    "tool {tool}: {e}; asking again when the socket is back"
                ));
                broke.get_or_insert_with(tokio::time::Instant::now);
            }
            (Err(e @ (McpError::Connect { .. } | McpError::Initialize(_))), Some(at))
                if at.elapsed() < RECONNECT_WAIT =>
            {
                log(format_args!("tool {tool}: {e}; trying again"));
                tokio::time::sleep(RECONNECT_POLL).await;
            }
            (r, _) => return r,
        }
    }
}

/// Reads one line (without its newline) of at most `max` bytes; `None` at EOF.
pub async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    max: usize,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = Vec::new();
    loop {
        let buf = r.fill_buf().await?;
        if buf.is_empty() {
            return Ok((!line.is_empty()).then_some(line));
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (buf.len(), false),
        };
        if line.len() + take > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        line.extend_from_slice(&buf[..take]);
        r.consume(take + usize::from(done));
        if done {
            return Ok(Some(line));
        }
    }
}

async fn send<W: AsyncWrite + Unpin>(w: &mut W, msg: &Value) -> std::io::Result<()> {
    let mut bytes = msg.to_string().into_bytes();
    bytes.push(b'\n');
    timeout(Duration::from_secs(10), w.write_all(&bytes))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "write timed out"))?
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// The echo server's answer to one JSON-RPC line (`None` for notifications).
pub fn handle_line(line: &[u8]) -> Option<Value> {
    let Ok(msg) = serde_json::from_slice::<Value>(line) else {
        return Some(rpc_error(Value::Null, -32700, "parse error"));
    };
    let Some(method) = msg.get("method").and_then(Value::as_str) else {
        return Some(rpc_error(
            msg.get("id").cloned().unwrap_or(Value::Null),
            -32600,
            "invalid request",
        ));
    };
    // Notifications (no id) get no answer, whatever their method.
    let id = msg.get("id")?.clone();
    let params = msg.get("params").cloned().unwrap_or(Value::Null);
    let result = match method {
        "initialize" => {
            let asked = params.get("protocolVersion").and_then(Value::as_str);
            let version = asked
                .filter(|v| SUPPORTED_VERSIONS.contains(v))
                .unwrap_or(PROTOCOL_VERSION);
            json!({
                "protocolVersion": version,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hako-agent-echo", "version": env!("CARGO_PKG_VERSION")},
            })
        }
        "ping" => json!({}),
        "tools/list" => json!({"tools": [{
            "name": "echo",
            "description": "Returns its arguments as JSON text.",
            "inputSchema": {"type": "object"},
        }]}),
        "tools/call" => {
            let name = params.get("name").and_then(Value::as_str);
            if name != Some("echo") {
                return Some(rpc_error(id, -32602, "unknown tool"));
            }
            let args = params
                .get("arguments")
                .cloned()
                .unwrap_or_else(|| json!({}));
            json!({
                "content": [{"type": "text", "text": args.to_string()}],
                "structuredContent": args,
                "isError": false,
            })
        }
        _ => return Some(rpc_error(id, -32601, "method not found")),
    };
    Some(json!({"jsonrpc": "2.0", "id": id, "result": result}))
}

async fn serve_conn(stream: UnixStream) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let line = match timeout(IDLE_TIMEOUT, read_line(&mut r, MAX_LINE)).await {
            Err(_) | Ok(Ok(None)) => return,
            Ok(Ok(Some(line))) => line,
            Ok(Err(e)) => {
                // Too long or broken: answer once if possible, then hang up.
                let _ = send(&mut w, &rpc_error(Value::Null, -32700, &e.to_string())).await;
                return;
            }
        };
        if let Some(reply) = handle_line(&line)
            && send(&mut w, &reply).await.is_err()
        {
            return;
        }
    }
}

/// Serves the echo MCP server on `socket` until SIGTERM or SIGINT. A stale socket file at the
/// path is replaced; the socket is removed on exit.
pub async fn serve(socket: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    use tokio::signal::unix::{SignalKind, signal};

    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    if let Ok(meta) = std::fs::symlink_metadata(socket)
        && meta.file_type().is_socket()
    {
        std::fs::remove_file(socket)?;
    }
    let listener = UnixListener::bind(socket)?;
    // The agent usually runs as another uid than the sidecar; the socket's directory is what
    // limits who can reach it.
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o666))?;
    log(format_args!("serve-mcp: listening on {}", socket.display()));
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(permit) = slots.clone().try_acquire_owned() else {
                        log("serve-mcp: too many connections; refusing one");
                        continue;
                    };
                    tokio::spawn(async move {
                        serve_conn(stream).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    log(format_args!("serve-mcp: accept failed: {e}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let _ = std::fs::remove_file(socket);
    log("serve-mcp: stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_answers() {
        let init = handle_line(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}"#,
        )
        .unwrap();
        assert_eq!(init["result"]["protocolVersion"], "2025-03-26");
        let init = handle_line(
            br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999"}}"#,
        )
        .unwrap();
        assert_eq!(init["result"]["protocolVersion"], PROTOCOL_VERSION);
        assert!(
            handle_line(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).is_none()
        );
        let list = handle_line(br#"{"jsonrpc":"2.0","id":"x","method":"tools/list"}"#).unwrap();
        assert_eq!(list["id"], "x");
        assert_eq!(list["result"]["tools"][0]["name"], "echo");
        let call = handle_line(
            br#"{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"echo","arguments":{"a":1}}}"#,
        )
        .unwrap();
        assert_eq!(call["result"]["content"][0]["text"], r#"{"a":1}"#);
        assert_eq!(call["result"]["isError"], false);
        let bad = handle_line(
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"nope"}}"#,
        )
        .unwrap();
        assert_eq!(bad["error"]["code"], -32602);
        assert_eq!(handle_line(b"{nope").unwrap()["error"]["code"], -32700);
        let unknown = handle_line(br#"{"jsonrpc":"2.0","id":4,"method":"x"}"#).unwrap();
        assert_eq!(unknown["error"]["code"], -32601);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn bounded_lines() {
        let data = b"abc\ndefgh\nxy".to_vec();
        let mut r = BufReader::with_capacity(2, &data[..]);
        assert_eq!(read_line(&mut r, 4).await.unwrap().unwrap(), b"abc");
        assert!(read_line(&mut r, 4).await.is_err());
        let mut r = BufReader::new(&data[..]);
        read_line(&mut r, 5).await.unwrap();
        assert_eq!(read_line(&mut r, 5).await.unwrap().unwrap(), b"defgh");
        assert_eq!(read_line(&mut r, 5).await.unwrap().unwrap(), b"xy");
        assert!(read_line(&mut r, 5).await.unwrap().is_none());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn client_and_server_talk() {
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("mcp.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            serve_conn(s).await;
        });
        let r = call_tool(&sock, "echo", json!({"k": "v"})).await.unwrap();
        assert_eq!(r.text, r#"{"k":"v"}"#);
        server.await.unwrap();
        let err = call_tool(&d.path().join("none.sock"), "echo", json!({}))
            .await
            .unwrap_err();
        assert!(matches!(err, McpError::Connect { .. }), "{err}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn silent_server_times_out() {
        tokio::time::pause();
        let d = tempfile::tempdir().unwrap();
        let sock = d.path().join("mcp.sock");
        let listener = UnixListener::bind(&sock).unwrap();
        let _keep = tokio::spawn(async move {
            let (s, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
            drop(s);
        });
        let err = call_tool(&sock, "echo", json!({})).await.unwrap_err();
        assert!(matches!(err, McpError::Timeout("initialize")), "{err}");
    }
}
