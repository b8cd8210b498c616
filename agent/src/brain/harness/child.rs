//! An agent program as a child process: its pipes, a bounded tail of its stderr for an error
//! message, why it died, and one line of its output at a time.

use std::collections::VecDeque;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// The longest line of a program's output accepted (a tool result can be large).
pub const MAX_LINE: usize = 32 << 20;
/// How much of the child's stderr is kept for an error message.
const STDERR_TAIL: usize = 4 << 10;

/// What the protocol speaks over: the child's stdin and its stdout, line by line.
pub struct Pipes {
    /// Its stdin.
    pub stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// A line being read (kept across a cancelled read: a read raced against something else
    /// loses nothing).
    line: Vec<u8>,
}

impl Pipes {
    /// Reads one line (at most [`MAX_LINE`] bytes, without its `\n`); `None` at the end of the
    /// output. Cancel-safe: what a cancelled call had read stays for the next.
    pub async fn read_line(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        loop {
            let room = (MAX_LINE + 1).saturating_sub(self.line.len()) as u64;
            let n = (&mut self.stdout)
                .take(room)
                .read_until(b'\n', &mut self.line)
                .await?;
            if self.line.len() > MAX_LINE {
                self.line.clear();
                return Err(std::io::Error::other(format!(
                    "a line of the program's output is over {MAX_LINE} bytes"
                )));
            }
            if self.line.last() == Some(&b'\n') {
                let mut line = std::mem::take(&mut self.line);
                line.pop();
                return Ok(Some(line));
            }
            if n == 0 {
                // The end: a last line without its newline still counts.
                return Ok((!self.line.is_empty()).then(|| std::mem::take(&mut self.line)));
            }
        }
    }
}

/// A running program; killed when dropped (the deadline, SIGTERM, a brain replaced).
pub struct Proc {
    child: Child,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    /// Reads its stderr until the end.
    reader: tokio::task::JoinHandle<()>,
    name: &'static str,
}

impl Proc {
    /// Starts `cmd` with piped stdio; answers the process and its pipes.
    pub fn spawn(name: &'static str, mut cmd: Command) -> std::io::Result<(Proc, Pipes)> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn()?;
        let (Some(stdin), Some(stdout), Some(mut err)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(std::io::Error::other("the child's pipes are missing"));
        };
        // Its stderr: a bounded tail, for an error message if it dies.
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let tail = stderr.clone();
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend(&buf[..n]);
                let over = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..over);
            }
        });
        Ok((
            Proc {
                child,
                stderr,
                reader,
                name,
            },
            Pipes {
                stdin,
                stdout: BufReader::with_capacity(64 << 10, stdout),
                line: Vec::new(),
            },
        ))
    }

    /// Whether it has exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Why it is gone: its exit status and the last line of its stderr.
    pub async fn died(mut self) -> String {
        let status = match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(Ok(s)) => s.to_string(),
            _ => "no exit status".into(),
        };
        // What it wrote last, read to the end (its children may hold the pipe: bounded).
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut self.reader).await;
        let tail: Vec<u8> = self
            .stderr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        let tail = String::from_utf8_lossy(&tail);
        let last = tail.trim().lines().last().unwrap_or("").trim();
        if last.is_empty() {
            format!("{} exited ({status})", self.name)
        } else {
            format!(
                "{} exited ({status}): {}",
                self.name,
                last.chars().take(300).collect::<String>()
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_whole_or_last_and_the_exit_reason() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "printf 'one\\ntwo\\nlast'; echo 'it broke' >&2; exit 3",
        ]);
        let (proc, mut pipes) = Proc::spawn("Prog", cmd).unwrap();
        let mut lines = Vec::new();
        while let Some(l) = pipes.read_line().await.unwrap() {
            lines.push(String::from_utf8(l).unwrap());
        }
        assert_eq!(lines, ["one", "two", "last"]);
        let why = proc.died().await;
        assert!(why.starts_with("Prog exited (exit status: 3)"), "{why}");
        assert!(why.ends_with(": it broke"), "{why}");
    }
}
