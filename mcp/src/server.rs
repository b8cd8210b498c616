//! The MCP server of one turn, on its unix socket: rmcp's server over each accepted
//! connection (newline-delimited JSON-RPC), every protocol version rmcp knows (agents in
//! containers still speak 2025-03-26 and 2025-06-18).
//!
//! The socket's life is the turn's, which its owner decides: [`serve`] accepts until `ended`
//! is cancelled, then answers calls on connections already open with a `turn_ended` tool
//! error for [`ServeOptions::grace`] and closes them. Connections are bounded; a line is
//! bounded; a refusal is a tool error the model reads, never a dropped connection.

use std::io;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hako_shared::grants::Tool;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler, ServiceExt as _};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::tools::{Backend, Scope, ToolError, dispatch, offered};

/// Bounds of a turn's socket.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Connections open at once (an agent and its tools need a few).
    pub max_connections: usize,
    /// The longest JSON-RPC line read; longer ones are dropped (rmcp answers an error).
    pub max_line: usize,
    /// How long connections stay open after the turn ended, answering `turn_ended`.
    pub grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_connections: 16,
            max_line: 1 << 20,
            grace: Duration::from_secs(2),
        }
    }
}

/// One connection's handler.
struct TurnServer<B> {
    backend: Arc<B>,
    scope: Arc<Scope>,
    ended: CancellationToken,
}

impl<B: Backend> TurnServer<B> {
    fn result(outcome: Result<serde_json::Value, ToolError>) -> CallToolResult {
        match outcome {
            Ok(v) => {
                let text = match &v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
                if v.is_object() {
                    r.structured_content = Some(v);
                }
                r
            }
            Err(e) => CallToolResult::error(vec![ContentBlock::text(e.to_string())]),
        }
    }
}

impl<B: Backend> ServerHandler for TurnServer<B> {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("hako", env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "Tools of turn {} of the group {}: talk to the chat, keep notes of progress, schedule work.",
                self.scope.turn_id, self.scope.folder
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let tools = offered(&self.scope.grants)
            .into_iter()
            .map(|d| rmcp::model::Tool::new(d.tool.name(), d.description, Arc::new(d.input_schema)))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(tool) = Tool::from_name(&request.name) else {
            return Err(McpError::invalid_params(
                format!("no tool named {:?}", request.name),
                None,
            ));
        };
        let outcome = if self.ended.is_cancelled() {
            Err(ToolError::turn_ended(&self.scope.turn_id))
        } else {
            // A call key that is not one is no key: the call is a new one. (rmcp moves the
            // request's `_meta` into the context.)
            let key = context
                .meta
                .0
                .0
                .get(crate::tools::CALL_KEY_META)
                .and_then(|v| v.as_str())
                .and_then(crate::tools::CallKey::parse);
            let args = request.arguments.unwrap_or_default();
            dispatch(self.backend.as_ref(), &self.scope, tool, args, key.as_ref()).await
        };
        if let Err(e) = &outcome {
            tracing::info!(turn = %self.scope.turn_id, tool = tool.name(), code = e.code.as_str(), "tool call refused");
        }
        Ok(CallToolResponse::Complete(Self::result(outcome)))
    }
}

/// Serves the turn's tools on `listener` until `ended` (then a grace, then every connection
/// closes) or `stop` (at once).
pub async fn serve<B: Backend>(
    listener: UnixListener,
    backend: Arc<B>,
    scope: Arc<Scope>,
    ended: CancellationToken,
    stop: CancellationToken,
    opts: ServeOptions,
) {
    let slots = Arc::new(Semaphore::new(opts.max_connections));
    // Cancelled after the grace: closes every connection.
    let close = stop.child_token();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = ended.cancelled() => break,
            () = stop.cancelled() => break,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(turn = %scope.turn_id, "mcp accept failed: {e}");
                // EMFILE and the like: do not spin.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::warn!(turn = %scope.turn_id, "mcp: {} connections open; refusing one", opts.max_connections);
            drop(stream);
            continue;
        };
        let handler = TurnServer {
            backend: backend.clone(),
            scope: scope.clone(),
            ended: ended.clone(),
        };
        let conn = close.child_token();
        let max_line = opts.max_line;
        let turn = scope.turn_id.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let (r, w) = stream.into_split();
            let transport = AsyncRwTransport::new_server(r, w).with_max_line_length(max_line);
            match handler.serve_with_ct(transport, conn).await {
                Ok(running) => {
                    let _ = running.waiting().await;
                }
                Err(e) => {
                    tracing::info!(turn = %turn, "mcp connection ended before initialize: {e}")
                }
            }
        });
    }
    drop(listener);
    if !stop.is_cancelled() {
        tokio::select! {
            () = tokio::time::sleep(opts.grace) => {}
            () = stop.cancelled() => {}
        }
    }
    close.cancel();
}

/// Binds a unix socket at `path` (mode 0666: the agent's user connects; its directory limits
/// who can), replacing a stale one, after checking that the directory is writable only by
/// this process's user (or root): no agent can plant a link where it binds. Answers the
/// listener (non-blocking) and the socket's inode, to remove it later only if it is still
/// this one.
pub fn bind_socket(path: &Path) -> io::Result<(std::os::unix::net::UnixListener, u64)> {
    let dir = path
        .parent()
        .ok_or_else(|| io::Error::other("a socket path needs a directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    let me = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || (meta.uid() != me && meta.uid() != 0) || meta.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} must be a directory only this user (uid {me}) or root can write; it is owned by uid {} with mode {:o}",
            dir.display(),
            meta.uid(),
            meta.mode() & 0o7777
        )));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            return Err(io::Error::other("a directory is where the socket goes"));
        }
        // A stale socket of an earlier routd, or of this folder's previous turn.
        Ok(_) => std::fs::remove_file(path)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    listener.set_nonblocking(true)?;
    let ino = std::fs::symlink_metadata(path)?.ino();
    Ok((listener, ino))
}
