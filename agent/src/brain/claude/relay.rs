//! The model relay: a TCP listener on `127.0.0.1` whose every connection is copied, byte for
//! byte, to the gateway's unix socket. Claude Code speaks HTTP to a base URL; a
//! `network: none` box has loopback and the turn's sockets, nothing else. The relay adds no
//! credential: the child sends its spawn token, and the gateway checks it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::net::{TcpListener, UnixStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use crate::output::log;

/// Connections relayed at once (the gateway allows a turn a few calls in flight).
const MAX_CONNECTIONS: usize = 16;

/// A running relay; stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on an ephemeral loopback port and relays to `socket`.
    pub async fn start(socket: PathBuf) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut tcp, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let socket = socket.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match UnixStream::connect(&socket).await {
                        Ok(mut unix) => {
                            let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                        }
                        // Claude Code sees a refused connection and says so.
                        Err(e) => log(format_args!(
                            "model relay: cannot reach {}: {e}",
                            socket.display()
                        )),
                    }
                });
            }
        });
        Ok(Relay { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `hako-agent mcp-bridge --socket PATH`: this process's stdin and stdout, copied to and from
/// a unix socket: a stdio MCP server for agents that only speak stdio (Claude Code), reaching
/// the turn's `mcp.sock` or a sidecar's. Ends when either side closes.
pub async fn bridge(socket: PathBuf) -> std::io::Result<()> {
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
