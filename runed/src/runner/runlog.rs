//! The bounded record of one run: stderr kept as a bounded tail, secrets redacted, written
//! to `groups/<folder>/logs/container-<timestamp>-<run>.log` and returned to the caller.
//! The input (prompt, secrets, token) is never part of it.

use std::io::{self, Write};
use std::path::PathBuf;

use super::safefs::SafeDir;

/// The last `cap` bytes of a stream, and how much was dropped before them.
#[derive(Debug)]
pub struct Tail {
    buf: Vec<u8>,
    cap: usize,
    dropped: u64,
}

impl Tail {
    /// An empty tail keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        Self {
            buf: Vec::new(),
            cap,
            dropped: 0,
        }
    }

    /// Appends bytes, dropping the oldest beyond the cap.
    pub fn push(&mut self, data: &[u8]) {
        if data.len() >= self.cap {
            self.dropped += (self.buf.len() + data.len() - self.cap) as u64;
            self.buf.clear();
            self.buf.extend_from_slice(&data[data.len() - self.cap..]);
            return;
        }
        let over = (self.buf.len() + data.len()).saturating_sub(self.cap);
        if over > 0 {
            // Drop in bulk (at least a quarter) so that the copy cost stays amortized.
            let cut = over.max(self.cap / 4).min(self.buf.len());
            self.buf.drain(..cut);
            self.dropped += cut as u64;
        }
        self.buf.extend_from_slice(data);
    }

    /// Bytes dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The kept bytes as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

/// Replaces every occurrence of each secret (6 bytes or longer) with `<redacted>`.
pub fn redact(text: &str, secrets: &[&str]) -> String {
    let mut out = text.to_owned();
    for s in secrets.iter().filter(|s| s.len() >= 6) {
        if out.contains(s) {
            out = out.replace(s, "<redacted>");
        }
    }
    out
}

/// Writes the log into `dir` under a unique name; never through a symlink, never over an
/// existing file.
pub fn write_file(dir: &SafeDir, stamp: &str, run_id: &str, text: &str) -> io::Result<PathBuf> {
    let short: String = run_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(16)
        .collect();
    let name = format!("container-{stamp}-{short}.log");
    let mut f = dir.create_file(&name, 0o640)?;
    f.write_all(text.as_bytes())?;
    Ok(dir.path().join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_is_bounded_and_keeps_the_end() {
        let mut t = Tail::new(100);
        for i in 0..1000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let text = t.text();
        assert!(text.len() <= 100);
        assert!(text.ends_with("line 999\n"));
        assert!(t.dropped() > 0);
        let mut big = Tail::new(10);
        big.push(&[b'x'; 50]);
        assert_eq!(big.text().len(), 10);
        assert_eq!(big.dropped(), 40);
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact("key=sk-canary-123 ok", &["sk-canary-123", "abc"]),
            "key=<redacted> ok"
        );
        assert_eq!(
            redact("abc", &["abc"]),
            "abc",
            "short strings are not secrets"
        );
    }

    #[test]
    fn log_files_are_unique_and_no_follow() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SafeDir::open_root(tmp.path()).unwrap();
        let p = write_file(&dir, "20261123T000000.000Z", "run-1", "x").unwrap();
        assert!(p.ends_with("container-20261123T000000.000Z-run1.log"));
        assert!(
            write_file(&dir, "20261123T000000.000Z", "run-1", "y").is_err(),
            "never overwrites"
        );
    }
}
