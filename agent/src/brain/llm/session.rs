//! The conversation kept between runs: one JSON file per session in the agent's home
//! (`$HOME/.hako/sessions/<id>.json`, on the folder's own `home/` mount), so the next turn's
//! run resumes it by the session id routd sends back.
//!
//! Written to a temporary name and renamed, so a run killed mid-write leaves the last whole
//! version. Bounded: when the file would pass [`MAX_BYTES`] the oldest exchanges are dropped,
//! cutting only before a user's message so that every tool call keeps its result.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::wire::Turn;

/// The largest session file written.
pub const MAX_BYTES: usize = 2 << 20;

/// A session id the agent accepts from its input: it names a file.
pub fn valid_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// A fresh session id.
pub fn new_id() -> String {
    hako_shared::ids::random_id("s-", 12)
}

/// Where sessions live.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    /// Sessions in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// The conversation of session `id`; empty if there is none (or it cannot be read: the
    /// agent then starts afresh rather than failing the turn).
    pub fn load(&self, id: &str) -> Vec<Turn> {
        if !valid_id(id) {
            return Vec::new();
        }
        let path = self.path(id);
        match std::fs::read(&path) {
            Ok(bytes) if bytes.len() <= MAX_BYTES * 2 => serde_json::from_slice(&bytes)
                .unwrap_or_else(|e| {
                    crate::output::log(format_args!(
                        "session {id}: unreadable ({e}); starting afresh"
                    ));
                    Vec::new()
                }),
            Ok(_) => Vec::new(),
            Err(_) => Vec::new(),
        }
    }

    /// Saves the conversation (trimmed to the bound) as session `id`.
    pub fn save(&self, id: &str, turns: &[Turn]) -> std::io::Result<()> {
        if !valid_id(id) {
            return Err(std::io::Error::other("invalid session id"));
        }
        let bytes = bounded(turns)?;
        std::fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!(".{id}.json.tmp"));
        write_new(&tmp, &bytes)?;
        std::fs::rename(&tmp, self.path(id))
    }
}

/// The JSON of the newest exchanges that fit in [`MAX_BYTES`].
fn bounded(turns: &[Turn]) -> std::io::Result<Vec<u8>> {
    let mut from = 0;
    loop {
        let bytes = serde_json::to_vec(&turns[from..]).map_err(std::io::Error::other)?;
        if bytes.len() <= MAX_BYTES {
            return Ok(bytes);
        }
        // Drop up to the next user message (keeping tool calls with their results).
        match turns[from + 1..].iter().position(Turn::is_user_text) {
            Some(i) => from += 1 + i,
            None => return Ok(b"[]".to_vec()),
        }
    }
}

fn write_new(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_data()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::brain::llm::wire::{Part, Role};

    fn user(text: &str) -> Turn {
        Turn {
            role: Role::User,
            content: vec![Part::Text { text: text.into() }],
        }
    }

    #[test]
    fn ids_are_file_names() {
        assert!(valid_id("s-0123abcd") && valid_id(&new_id()));
        for bad in ["", "../x", "a/b", ".x", "a b", &"x".repeat(65)] {
            assert!(!valid_id(bad), "{bad}");
        }
    }

    #[test]
    fn saved_sessions_load_and_stay_bounded() {
        let d = tempfile::tempdir().unwrap();
        let s = Store::new(d.path().join("sessions"));
        assert!(s.load("s-1").is_empty());
        let turns = vec![
            user("one"),
            Turn {
                role: Role::Assistant,
                content: vec![Part::Text { text: "two".into() }],
            },
        ];
        s.save("s-1", &turns).unwrap();
        assert_eq!(s.load("s-1"), turns);
        assert!(s.save("../x", &turns).is_err());

        let big = "x".repeat(MAX_BYTES / 4);
        let many: Vec<Turn> = (0..10).map(|i| user(&format!("{i}{big}"))).collect();
        s.save("s-2", &many).unwrap();
        let kept = s.load("s-2");
        assert!(!kept.is_empty() && kept.len() < 10);
        assert_eq!(kept.last(), many.last(), "the newest are kept");
        std::fs::write(d.path().join("sessions/s-3.json"), b"{broken").unwrap();
        assert!(s.load("s-3").is_empty());
    }
}
