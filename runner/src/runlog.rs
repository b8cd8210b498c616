//! The bounded record of one run: stderr kept as a bounded tail, secrets redacted, written
//! to `folders/<key>/logs/container-<timestamp>-<run>.log` (the newest `keep` files of a
//! folder are kept) and returned to the caller. The input (prompt, secrets, token) is never
//! part of it.

use std::io::{self, Write};
use std::path::PathBuf;

use hako_shared::ids::RunId;

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

/// Redacts a kept stderr tail: every whole secret, and also a piece of one cut at either
/// edge: a tail that lost its beginning may start with the end of a secret, and a stream cut
/// mid-write may end with its beginning. Pieces shorter than 4 bytes are left (they say
/// nothing).
pub fn redact_tail(text: &str, secrets: &[&str], cut_at_start: bool) -> String {
    const MIN_PIECE: usize = 4;
    let mut out = redact(text, secrets);
    for s in secrets.iter().filter(|s| s.len() >= 6) {
        let s = s.as_bytes();
        if cut_at_start
            && let Some(k) = (MIN_PIECE..s.len())
                .rev()
                .find(|&k| out.as_bytes().starts_with(&s[s.len() - k..]))
        {
            out = format!(
                "<redacted>{}",
                String::from_utf8_lossy(&out.as_bytes()[k..])
            );
        }
        if let Some(k) = (MIN_PIECE..s.len())
            .rev()
            .find(|&k| out.as_bytes().ends_with(&s[..k]))
        {
            let keep = out.len() - k;
            out = format!(
                "{}<redacted>",
                String::from_utf8_lossy(&out.as_bytes()[..keep])
            );
        }
    }
    out
}

/// Writes the log into `dir` under a unique name, never through a symlink, never over an
/// existing file; then removes the folder's oldest logs beyond the newest `keep`.
pub fn write_file(
    dir: &SafeDir,
    stamp: &str,
    run_id: &RunId,
    text: &str,
    keep: usize,
) -> io::Result<PathBuf> {
    let short: String = run_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(16)
        .collect();
    let name = format!("container-{stamp}-{short}.log");
    let mut f = dir.create_file(&name, 0o640)?;
    f.write_all(text.as_bytes())?;
    // Names start with a sortable UTC stamp: name order is age order.
    let mut logs: Vec<String> = dir
        .names()?
        .into_iter()
        .filter_map(|n| n.into_string().ok())
        .filter(|n| n.starts_with("container-") && n.ends_with(".log"))
        .collect();
    if logs.len() > keep {
        logs.sort();
        for old in &logs[..logs.len() - keep] {
            dir.remove(old)?;
        }
    }
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
    fn a_secret_cut_at_an_edge_of_the_tail_is_still_redacted() {
        let secret = "sk-canary-0123456789";
        // The tail lost the secret's first bytes; a stream cut mid-write ends with its start.
        let t = redact_tail("0123456789 then more", &[secret], true);
        assert_eq!(t, "<redacted> then more");
        let t = redact_tail("text sk-canar", &[secret], false);
        assert_eq!(t, "text <redacted>");
        // An uncut tail keeps its start; short pieces mean nothing.
        assert_eq!(redact_tail("6789 x", &[secret], false), "6789 x");
        assert_eq!(redact_tail("789 x", &[secret], true), "789 x");
    }

    #[test]
    fn log_files_are_unique_no_follow_and_rotated() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SafeDir::open_root(tmp.path()).unwrap();
        let p = write_file(
            &dir,
            "20261123T000000.000Z",
            &RunId::new("run-1").unwrap(),
            "x",
            3,
        )
        .unwrap();
        assert!(p.ends_with("container-20261123T000000.000Z-run1.log"));
        assert!(
            write_file(
                &dir,
                "20261123T000000.000Z",
                &RunId::new("run-1").unwrap(),
                "y",
                3
            )
            .is_err(),
            "never overwrites"
        );
        std::fs::write(tmp.path().join("other.txt"), "kept").unwrap();
        for i in 1..6 {
            write_file(
                &dir,
                &format!("20261123T00000{i}.000Z"),
                &RunId::new("run-1").unwrap(),
                "x",
                3,
            )
            .unwrap();
        }
        let mut names: Vec<String> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "container-20261123T000003.000Z-run1.log",
                "container-20261123T000004.000Z-run1.log",
                "container-20261123T000005.000Z-run1.log",
                "other.txt"
            ]
        );
    }
}
