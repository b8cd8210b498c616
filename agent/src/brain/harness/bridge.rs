//! The MCP bridge (`hako-agent mcp-bridge`): a stdio MCP server that is a unix socket, for
//! agent programs that only start MCP servers as processes (Claude Code, Codex).
//!
//! It relays JSON-RPC lines between its stdin/stdout and the socket. With `--after MARK` it
//! first waits until the file `MARK` exists: a program started before its turn (a warm box)
//! asks for the turn's tools before the turn exists, and the socket's path may still hold the
//! previous turn's socket until routd removes it. The agent creates the mark when its input
//! line arrives; routd binds a turn's sockets before the run is asked for, so from then on the
//! path is this turn's. The program's MCP handshake simply completes when the turn begins.
//!
//! **It outlives a routd restart.** Each `tools/call` gets a name (`_meta.hako/call`: this
//! bridge's key and the request's id). When the socket closes while the program still talks
//! (routd restarted while a person was deciding a held call), the bridge connects again as
//! soon as the restarted routd binds the turn's socket (for up to `RECONNECT_WAIT`), replays
//! the program's handshake (its answer swallowed), and asks again every request still
//! unanswered, under the same names: routd attaches each to the request it had started, so
//! the person's verdict, given before or after the restart, applies once. The program never
//! sees the break.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;

use crate::mcp::{CALL_KEY_META, RECONNECT_WAIT, new_call_key, read_line};
use crate::output::log;

/// How often a waiting bridge looks for the turn's mark where inotify cannot tell it (a
/// `stat` on the box's tmpfs): a few milliseconds of this are the whole cost a warm turn
/// pays for starting its tools early.
const MARK_POLL: Duration = Duration::from_millis(5);
/// How often it tries the socket again while routd is away.
const RECONNECT_POLL: Duration = Duration::from_millis(250);
/// The longest line relayed either way (a tool's result can be large).
const MAX_LINE: usize = 32 << 20;
/// The id of the handshake the bridge replays itself after a reconnect.
const REPLAY_ID: &str = "hako-bridge-replay";

/// What the bridge remembers of the program's session, to open it again on a new connection.
#[derive(Default)]
struct Session {
    /// The program's `initialize` request.
    initialize: Option<Value>,
    /// Whether it sent `notifications/initialized`.
    initialized: bool,
    /// Requests not yet answered, by their id's JSON text.
    pending: BTreeMap<String, Value>,
}

impl Session {
    /// Notes a line from the program (naming its `tools/call`s): what goes to the socket.
    fn program_said(&mut self, key: &str, mut msg: Value) -> Value {
        let method = msg.get("method").and_then(Value::as_str).map(str::to_owned);
        let id = msg.get("id").cloned();
        match (method.as_deref(), &id) {
            (Some("initialize"), _) => self.initialize = Some(msg.clone()),
            (Some("notifications/initialized"), None) => self.initialized = true,
            _ => {}
        }
        if method.as_deref() == Some("tools/call")
            && let Some(id) = &id
            && let Some(params) = msg.get_mut("params").and_then(Value::as_object_mut)
        {
            let meta = params
                .entry("_meta")
                .or_insert_with(|| json!({}))
                .as_object_mut();
            if let Some(meta) = meta {
                meta.entry(CALL_KEY_META)
                    .or_insert_with(|| Value::from(format!("{key}.{}", id_text(id))));
            }
        }
        if method.is_some()
            && let Some(id) = id
        {
            self.pending.insert(id.to_string(), msg.clone());
        }
        msg
    }

    /// Notes a line from the socket: whether the program should see it (the answer to the
    /// bridge's own replayed handshake it should not).
    fn socket_said(&mut self, msg: &Value) -> bool {
        if msg.get("method").is_none()
            && let Some(id) = msg.get("id")
        {
            if id == REPLAY_ID {
                return false;
            }
            self.pending.remove(&id.to_string());
        }
        true
    }
}

/// A JSON-RPC id as a call name's part: its text, reduced to the name grammar.
fn id_text(id: &Value) -> String {
    let raw = match id {
        Value::String(s) => s.clone(),
        v => v.to_string(),
    };
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect()
}

async fn write_line<W: AsyncWriteExt + Unpin>(w: &mut W, v: &Value) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(v).map_err(std::io::Error::other)?;
    line.push(b'\n');
    w.write_all(&line).await?;
    w.flush().await
}

/// Connects to the socket, trying for up to [`RECONNECT_WAIT`] (the restarted routd binds it
/// again when it resumes the turn).
async fn reconnect(socket: &PathBuf) -> std::io::Result<UnixStream> {
    let give_up = tokio::time::Instant::now() + RECONNECT_WAIT;
    loop {
        match UnixStream::connect(socket).await {
            Ok(s) => return Ok(s),
            Err(e) if tokio::time::Instant::now() >= give_up => return Err(e),
            Err(_) => tokio::time::sleep(RECONNECT_POLL).await,
        }
    }
}

/// Waits until the file `mark` exists. inotify on its directory tells when a file appears
/// there, so a warm box's bridge costs nothing while it waits (it polled every
/// [`MARK_POLL`], 2% of a core per bridge, for as long as the box waited); where inotify
/// cannot watch (no directory yet, no inotify), it polls. The wait blocks a thread of its
/// own in `read`.
async fn wait_for_mark(mark: &std::path::Path) -> std::io::Result<()> {
    let mark = mark.to_owned();
    tokio::task::spawn_blocking(move || {
        use rustix::fs::inotify;
        let watch = mark.parent().and_then(|dir| {
            let fd = inotify::init(inotify::CreateFlags::CLOEXEC).ok()?;
            let on = inotify::WatchFlags::CREATE | inotify::WatchFlags::MOVED_TO;
            inotify::add_watch(&fd, dir, on).ok()?;
            Some(fd)
        });
        // Checked after the watch is set: a mark made before it is seen here.
        while !mark.try_exists()? {
            match &watch {
                // Blocks until something is made in the directory.
                Some(fd) => {
                    let mut buf = [std::mem::MaybeUninit::uninit(); 1024];
                    inotify::Reader::new(fd, &mut buf).next()?;
                }
                None => std::thread::sleep(MARK_POLL),
            }
        }
        Ok(())
    })
    .await
    .map_err(std::io::Error::other)?
}

/// `hako-agent mcp-bridge --socket PATH [--after MARK]`: this process's stdin and stdout,
/// relayed to and from a unix socket: a stdio MCP server for agents that only speak stdio
/// (Claude Code, Codex), reaching the turn's `mcp.sock` or a sidecar's. Ends when the
/// program hangs up, or the socket stays away past [`RECONNECT_WAIT`]. With `after`, nothing
/// is connected before the file `MARK` exists (the turn began).
pub async fn bridge(socket: PathBuf, after: Option<PathBuf>) -> std::io::Result<()> {
    if let Some(mark) = after {
        wait_for_mark(&mark).await?;
    }
    let key = new_call_key();
    let mut session = Session::default();
    // Lines are read by tasks of their own and handed over: a half-read line is never lost
    // to the other side's turn in the select below.
    let (program_tx, mut program) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
    tokio::spawn(async move {
        let mut stdin = BufReader::new(tokio::io::stdin());
        while let Ok(Some(line)) = read_line(&mut stdin, MAX_LINE).await {
            if program_tx.send(line).await.is_err() {
                break;
            }
        }
    });
    let mut stdout = tokio::io::stdout();
    let mut unix = UnixStream::connect(&socket).await?;
    let mut replay = false;
    loop {
        let (from_socket, mut to_socket) = unix.into_split();
        let (socket_tx, mut from_socket_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(64);
        let reader = tokio::spawn(async move {
            let mut from_socket = BufReader::new(from_socket);
            while let Ok(Some(line)) = read_line(&mut from_socket, MAX_LINE).await {
                if socket_tx.send(line).await.is_err() {
                    break;
                }
            }
        });
        let _reader = AbortOnDrop(reader);
        if replay {
            // A new connection: the program's handshake again, then what it still waits for.
            if let Some(init) = &session.initialize {
                let mut init = init.clone();
                init["id"] = Value::from(REPLAY_ID);
                write_line(&mut to_socket, &init).await?;
                if session.initialized {
                    write_line(
                        &mut to_socket,
                        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
                    )
                    .await?;
                }
            }
            for msg in session.pending.values() {
                write_line(&mut to_socket, msg).await?;
            }
            log(format_args!(
                "mcp-bridge: connected again; {} call(s) asked again",
                session.pending.len()
            ));
        }
        // Relay until the socket ends (the program ending ends the bridge).
        loop {
            tokio::select! {
                line = program.recv() => {
                    let Some(bytes) = line else {
                        let _ = to_socket.shutdown().await;
                        return Ok(());
                    };
                    let sent = match serde_json::from_slice::<Value>(&bytes) {
                        Ok(msg) => {
                            let out = session.program_said(&key, msg);
                            write_line(&mut to_socket, &out).await
                        }
                        // Not JSON: the server answers it as the protocol says.
                        Err(_) => {
                            let mut b = bytes;
                            b.push(b'\n');
                            to_socket.write_all(&b).await
                        }
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                line = from_socket_rx.recv() => {
                    let Some(bytes) = line else { break };
                    let show = serde_json::from_slice::<Value>(&bytes)
                        .map_or(true, |msg| session.socket_said(&msg));
                    if show {
                        let mut b = bytes;
                        b.push(b'\n');
                        stdout.write_all(&b).await?;
                        stdout.flush().await?;
                    }
                }
            }
        }
        log(format_args!(
            "mcp-bridge: the socket closed with {} call(s) unanswered; connecting again",
            session.pending.len()
        ));
        unix = reconnect(&socket).await?;
        replay = true;
    }
}

/// Aborts its task when dropped (a connection's reader ends with the connection).
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bridge waiting for its turn sees the mark when it is made (written or renamed
    /// into place), at once when it is there already, and where its directory does not
    /// exist yet (no watch) once the directory and the mark appear.
    #[tokio::test]
    async fn the_turns_mark_ends_the_wait_however_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let wait =
            |mark: std::path::PathBuf| tokio::spawn(async move { wait_for_mark(&mark).await });
        let ends = |h: tokio::task::JoinHandle<std::io::Result<()>>| async move {
            tokio::time::timeout(Duration::from_secs(10), h)
                .await
                .expect("the wait ends")
                .unwrap()
                .unwrap()
        };
        let mark = dir.path().join("hako-turn.1");
        let h = wait(mark.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!h.is_finished(), "no mark yet");
        std::fs::write(dir.path().join("other"), b"").unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!h.is_finished(), "another file is not the mark");
        std::fs::write(&mark, b"").unwrap();
        ends(h).await;
        ends(wait(mark)).await;

        let renamed = dir.path().join("hako-turn.2");
        let h = wait(renamed.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::fs::write(dir.path().join("tmp"), b"").unwrap();
        std::fs::rename(dir.path().join("tmp"), &renamed).unwrap();
        ends(h).await;

        let later = dir.path().join("later").join("hako-turn.3");
        let h = wait(later.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        std::fs::create_dir(dir.path().join("later")).unwrap();
        std::fs::write(&later, b"").unwrap();
        ends(h).await;
    }

    #[test]
    fn calls_are_named_and_answers_settle_them() {
        let mut s = Session::default();
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}});
        s.program_said("k", init.clone());
        s.program_said(
            "k",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        );
        let call = s.program_said(
            "k",
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                   "params": {"name": "send_message", "arguments": {"text": "x"}}}),
        );
        assert_eq!(call["params"]["_meta"][CALL_KEY_META], "k.7");
        let named = s.program_said(
            "k",
            json!({"jsonrpc": "2.0", "id": "a b", "method": "tools/call",
                   "params": {"name": "x", "_meta": {"hako/call": "mine"}}}),
        );
        assert_eq!(
            named["params"]["_meta"][CALL_KEY_META], "mine",
            "a name the program gave stays"
        );
        assert!(s.initialized && s.initialize == Some(init));
        // The handshake's answer and the call's answer settle them; the replay's is hidden.
        assert!(s.socket_said(&json!({"jsonrpc": "2.0", "id": 0, "result": {}})));
        assert_eq!(s.pending.len(), 2, "call 7 and \"a b\" wait");
        assert!(!s.socket_said(&json!({"jsonrpc": "2.0", "id": REPLAY_ID, "result": {}})));
        assert!(s.socket_said(&json!({"jsonrpc": "2.0", "id": 7, "result": {}})));
        assert_eq!(s.pending.len(), 1);
        assert_eq!(id_text(&json!("a b/c")), "a_b_c");
    }
}
