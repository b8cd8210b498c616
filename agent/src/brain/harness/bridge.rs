//! The MCP bridge (`hako-agent mcp-bridge`): a stdio MCP server that is a unix socket, for
//! agent programs that only start MCP servers as processes (Claude Code, Codex).
//!
//! It copies its stdin and stdout to and from the socket. With `--after MARK` it first waits
//! until the file `MARK` exists: a program started before its turn (a warm box) asks for the
//! turn's tools before the turn exists, and the socket's path may still hold the previous
//! turn's socket until routd removes it. The agent creates the mark when its input line
//! arrives; routd binds a turn's sockets before the run is asked for, so from then on the
//! path is this turn's. The program's MCP handshake simply completes when the turn begins.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::UnixStream;

/// How often a waiting bridge looks for the turn's mark (a `stat` on the box's tmpfs): a
/// few milliseconds of this are the whole cost a warm turn pays for starting its tools early.
const MARK_POLL: Duration = Duration::from_millis(5);

/// `hako-agent mcp-bridge --socket PATH [--after MARK]`: this process's stdin and stdout,
/// copied to and from a unix socket: a stdio MCP server for agents that only speak stdio
/// (Claude Code, Codex), reaching the turn's `mcp.sock` or a sidecar's. Ends when either side
/// closes. With `after`, nothing is connected before the file `MARK` exists (the turn began).
pub async fn bridge(socket: PathBuf, after: Option<PathBuf>) -> std::io::Result<()> {
    if let Some(mark) = after {
        while !tokio::fs::try_exists(&mark).await? {
            tokio::time::sleep(MARK_POLL).await;
        }
    }
    let unix = UnixStream::connect(&socket).await?;
    let (mut from_socket, mut to_socket) = unix.into_split();
    let up = async {
        let mut stdin = tokio::io::stdin();
        let r = tokio::io::copy(&mut stdin, &mut to_socket).await;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut to_socket).await;
        r
    };
    let down = async {
        let mut stdout = tokio::io::stdout();
        let r = tokio::io::copy(&mut from_socket, &mut stdout).await;
        let _ = tokio::io::AsyncWriteExt::flush(&mut stdout).await;
        r
    };
    // Either direction ending ends the bridge: the client hung up, or the socket closed.
    tokio::select! {
        r = up => r.map(drop),
        r = down => r.map(drop),
    }
}
