//! The turn's sockets in its folder's `ipc/` directory (the agent's `/var/run/pub/arizuko/`):
//! `mcp.sock`, the turn's tools, and `api.sock`, its LLM gateway. They are bound before the run is asked for, live as long as
//! the turn's driver (a restarted routd binds them again when it resumes the turn), and are
//! removed when the turn ends; calls on connections still open then get `turn_ended`.
//!
//! `ipc/` is host-owned (the layout says so, and runed creates it so): no agent can plant a
//! link where a socket is bound or chmodded. routd checks that before binding and refuses a
//! directory another user could write. The socket is mode 0666 because the agent's user must
//! connect; only that folder's container mounts the directory.

use hako_shared::ids::TurnId;
use std::collections::HashMap;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::Mutex;

use tokio_util::sync::CancellationToken;

/// A bound socket: its path and inode (removed at the end only if it is still this one).
pub(crate) struct Bound {
    pub(crate) path: PathBuf,
    ino: u64,
}

struct OpenTurn {
    ended: CancellationToken,
    sockets: Vec<Bound>,
}

/// The open turns' sockets.
#[derive(Default)]
pub(crate) struct TurnSockets {
    open: Mutex<HashMap<TurnId, OpenTurn>>,
}

/// Why a turn's sockets could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SocketError {
    /// routd's database failed.
    #[error("routd.db: {0}")]
    Db(#[from] hako_shared::db::DbError),
    /// The turn or its group is gone.
    #[error("{0}")]
    Gone(String),
    /// Binding failed.
    #[error("{path}: {source}")]
    Io {
        /// The socket's path.
        path: PathBuf,
        /// What failed.
        source: io::Error,
    },
}

/// Removes a bound socket, unless another one took its place since.
pub(crate) fn remove(s: &Bound) {
    if std::fs::symlink_metadata(&s.path).is_ok_and(|m| m.ino() == s.ino) {
        let _ = std::fs::remove_file(&s.path);
    }
}

/// Binds a socket off the runtime (it checks and may remove files).
pub(crate) async fn listen(
    path: PathBuf,
) -> Result<(tokio::net::UnixListener, Bound), SocketError> {
    let p = path.clone();
    let io = |source| SocketError::Io {
        path: path.clone(),
        source,
    };
    let (listener, ino) = tokio::task::spawn_blocking(move || hako_mcp::bind_socket(&p))
        .await
        .map_err(|e| io(io::Error::other(e)))?
        .map_err(io)?;
    let listener = tokio::net::UnixListener::from_std(listener).map_err(io)?;
    Ok((listener, Bound { path, ino }))
}

impl TurnSockets {
    /// Whether the turn's sockets are open here.
    pub fn is_open(&self, turn_id: &TurnId) -> bool {
        self.lock().contains_key(turn_id)
    }

    /// Records the turn's bound sockets and the token that ends their connections.
    pub fn insert(&self, turn_id: &TurnId, ended: CancellationToken, sockets: Vec<Bound>) {
        self.lock()
            .insert(turn_id.clone(), OpenTurn { ended, sockets });
    }

    /// Ends the turn's sockets: removed from `ipc/` (unless a later turn bound its own
    /// there already), open connections told `turn_ended`, then closed.
    pub fn close(&self, turn_id: &TurnId) {
        let Some(open) = self.lock().remove(turn_id) else {
            return;
        };
        for s in &open.sockets {
            remove(s);
        }
        open.ended.cancel();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TurnId, OpenTurn>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}
