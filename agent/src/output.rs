//! Everything the agent writes: output blocks and noise on stdout, log lines on stderr.
//!
//! Blocks are framed as `\n<START>\n<json>\n<END>\n` and handed to the kernel in one write
//! call, so a reader never sees a block interleaved with another write of ours. The leading
//! newline puts the start marker at the beginning of a line even when noise before it did not
//! end with one.
//!
//! Writes happen on a dedicated thread fed by a bounded channel: when the host stops reading
//! stdout, only that thread blocks, so the async side still sees SIGTERM and the deadline, and
//! memory stays bounded by the channel's capacity.

use std::io::Write;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use hako_shared::contract::{Markers, OutputBlock};
use tokio::sync::mpsc;

/// How many writes may wait for the writer thread; with [`NOISE_CHUNK`] this bounds memory.
const QUEUE: usize = 8;
/// Size of one write of noise (floods).
pub const NOISE_CHUNK: usize = 64 * 1024;

/// Writes one log line to stderr, prefixed `[hako-agent]`.
///
/// Logs never carry prompts, tokens or secrets: callers pass sizes and names, not contents.
pub fn log(msg: impl std::fmt::Display) {
    let line = format!("[hako-agent] {msg}\n");
    // One write call per line; a failed log write has nowhere to be reported.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Frames a block exactly as the container contract says: `\n<START>\n<json>\n<END>\n`.
pub fn frame_block(markers: &Markers, block: &OutputBlock) -> Vec<u8> {
    // OutputBlock holds only strings and an enum: serialization cannot fail, but fall back to
    // a hand-written fatal block rather than panic if it ever does.
    let json = serde_json::to_string(block).unwrap_or_else(|_| {
        r#"{"status":"fatal","result":null,"error":"hako-agent: could not serialize a block"}"#
            .to_owned()
    });
    frame_raw(markers, &json)
}

/// Frames arbitrary text between the markers (used for deliberately broken blocks).
pub fn frame_raw(markers: &Markers, body: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(markers.start.len() + markers.end.len() + body.len() + 4);
    out.push(b'\n');
    out.extend_from_slice(markers.start.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(body.as_bytes());
    out.push(b'\n');
    out.extend_from_slice(markers.end.as_bytes());
    out.push(b'\n');
    out
}

/// Which stream a chunk goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Standard output: blocks and noise.
    Stdout,
    /// Standard error: log lines and noise.
    Stderr,
}

/// Handle for writing to stdout/stderr through the writer thread. Cheap to clone.
#[derive(Clone)]
pub struct Output {
    tx: mpsc::Sender<(Stream, Vec<u8>)>,
    markers: Markers,
}

/// Waits for the writer thread to drain; returned by [`Output::start`].
pub struct Drain {
    done: std_mpsc::Receiver<()>,
}

impl Drain {
    /// Waits up to `limit` for everything queued so far to reach the kernel. Every [`Output`]
    /// handle must be dropped first, or this waits the whole `limit`. Returns whether the
    /// queue drained.
    pub fn wait(self, limit: Duration) -> bool {
        self.done.recv_timeout(limit).is_ok()
    }
}

impl Output {
    /// Starts the writer thread.
    pub fn start(markers: Markers) -> (Output, Drain) {
        let (tx, mut rx) = mpsc::channel::<(Stream, Vec<u8>)>(QUEUE);
        let (done_tx, done) = std_mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("hako-agent-out".into())
            .spawn(move || {
                let mut broken = [false, false];
                while let Some((stream, bytes)) = rx.blocking_recv() {
                    let idx = stream as usize;
                    if broken[idx] {
                        // Keep draining so senders never block on a reader that is gone.
                        continue;
                    }
                    let res = match stream {
                        Stream::Stdout => {
                            let mut out = std::io::stdout().lock();
                            out.write_all(&bytes).and_then(|()| out.flush())
                        }
                        Stream::Stderr => std::io::stderr().lock().write_all(&bytes),
                    };
                    if let Err(e) = res {
                        broken[idx] = true;
                        log(format_args!(
                            "write to {stream:?} failed, dropping further output: {e}"
                        ));
                    }
                }
                let _ = done_tx.send(());
            });
        if let Err(e) = spawned {
            // Without the thread nothing is ever written; the receiver is gone, so every send
            // fails and callers see their output dropped rather than a hang.
            log(format_args!("cannot start the output thread: {e}"));
        }
        (Output { tx, markers }, Drain { done })
    }

    /// The markers in use.
    pub fn markers(&self) -> &Markers {
        &self.markers
    }

    /// Emits one output block (one write call, then flush).
    pub async fn block(&self, block: &OutputBlock) {
        log(format_args!("emit {} block", block.status.as_str()));
        self.raw(Stream::Stdout, frame_block(&self.markers, block))
            .await;
    }

    /// Writes raw bytes to a stream, in one write call.
    pub async fn raw(&self, stream: Stream, bytes: Vec<u8>) {
        // An error means the writer thread is gone; the output is lost either way.
        let _ = self.tx.send((stream, bytes)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::contract::BlockStatus;

    #[test]
    fn block_framing_is_exact() {
        let m = Markers::default();
        let b = OutputBlock::ok("hi\nthere");
        let framed = String::from_utf8(frame_block(&m, &b)).unwrap();
        assert_eq!(
            framed,
            "\n---ARIZUKO_OUTPUT_START---\n{\"status\":\"ok\",\"result\":\"hi\\nthere\"}\n---ARIZUKO_OUTPUT_END---\n"
        );
    }

    #[test]
    fn block_framing_uses_custom_markers_and_fields() {
        let m = Markers::for_prefix("NANOCLAW");
        let mut b = OutputBlock::failure(BlockStatus::Fatal, "boom");
        b.new_session_id = Some("s2".into());
        let framed = String::from_utf8(frame_block(&m, &b)).unwrap();
        assert_eq!(
            framed,
            "\n---NANOCLAW_OUTPUT_START---\n{\"status\":\"fatal\",\"result\":null,\"newSessionId\":\"s2\",\"error\":\"boom\"}\n---NANOCLAW_OUTPUT_END---\n"
        );
    }

    #[test]
    fn raw_framing() {
        let m = Markers::default();
        assert_eq!(
            frame_raw(&m, "{bad"),
            b"\n---ARIZUKO_OUTPUT_START---\n{bad\n---ARIZUKO_OUTPUT_END---\n".to_vec()
        );
    }
}
