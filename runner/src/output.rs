//! The supervisor's record of one run: the block parser, the blocks kept (within the output
//! cap), the stderr tail, and the run log rendered from them.
//!
//! The cap counts every text field of a block (`result`, `error`, `newSessionId`): once
//! `output_cap` bytes or `max_blocks` blocks are kept, later blocks are counted and dropped,
//! neither stored nor sent, so a run's stored output, and anything that reads it back (a GET,
//! an SSE replay), stays within the cap however much the agent writes.

use std::time::SystemTime;

use hako_shared::GroupFolder;
use hako_shared::contract::{BlockStatus, ContainerInput, OutputBlock};
use hako_shared::ids::RunId;

use super::config::RunnerConfig;
use super::engine::Frame;
use super::outcome;
use super::runlog;
use super::safefs::SafeDir;
use super::sentinel::{ParseEvent, SentinelParser};
use hako_shared::layout::{self, FolderDir};

/// The secret values of an input (its token and secrets), for redaction.
pub(super) fn secrets_of(input: &ContainerInput) -> Vec<String> {
    let mut v: Vec<String> = input.secrets.0.values().cloned().collect();
    if !input.token.expose().is_empty() {
        v.push(input.token.expose().to_owned());
    }
    v
}

/// The text bytes of a block that count against the cap.
fn size(b: &OutputBlock) -> usize {
    [&b.result, &b.error, &b.new_session_id]
        .iter()
        .map(|f| f.as_ref().map_or(0, String::len))
        .sum()
}

/// `text` cut to at most `room` bytes at a character boundary; returns the bytes kept.
fn cut(text: &mut Option<String>, room: usize) -> usize {
    let Some(t) = text.as_mut() else { return 0 };
    if t.len() > room {
        let mut at = room;
        while !t.is_char_boundary(at) {
            at -= 1;
        }
        t.truncate(at);
    }
    t.len()
}

/// Whether `parsed` (read back from the container's log) is the block `stored` (which the
/// cap may have cut).
fn same(stored: &OutputBlock, parsed: &OutputBlock) -> bool {
    let prefix = |s: &Option<String>, p: &Option<String>| match (s, p) {
        (None, _) => true,
        (Some(s), Some(p)) => p.starts_with(s.as_str()),
        (Some(_), None) => false,
    };
    stored.status == parsed.status
        && prefix(&stored.result, &parsed.result)
        && prefix(&stored.error, &parsed.error)
        && (stored.new_session_id.is_none() || stored.new_session_id == parsed.new_session_id)
}

/// One run's record.
pub(super) struct RunOutput {
    pub run_id: RunId,
    pub folder: GroupFolder,
    parser: SentinelParser,
    events: Vec<ParseEvent>,
    /// The blocks kept, in order; a block's index is its position here.
    pub blocks: Vec<OutputBlock>,
    /// Blocks a re-adopted run had already stored, matched against what the log replays.
    prior: usize,
    matched: usize,
    stored: usize,
    cap: usize,
    max_blocks: usize,
    /// Blocks dropped at the cap, and the status of the last of them (it still counts for
    /// the outcome).
    dropped: u64,
    late_status: Option<BlockStatus>,
    pub truncated: bool,
    invalid: Vec<String>,
    stderr: runlog::Tail,
    secrets: Vec<String>,
    /// Whether `secrets` are the run's (not after a restart: they are never stored).
    secrets_known: bool,
    pub container_id: Option<String>,
    pub started_at: Option<SystemTime>,
    created: SystemTime,
    /// Whether sidecars may exist for this run (unknown after a restart: assume so).
    pub sidecars: bool,
}

impl RunOutput {
    /// The record of a new run.
    pub fn new(
        cfg: &RunnerConfig,
        run_id: &RunId,
        folder: &GroupFolder,
        secrets: Vec<String>,
    ) -> Self {
        Self {
            run_id: run_id.clone(),
            folder: folder.clone(),
            parser: SentinelParser::new(&cfg.markers, cfg.max_block),
            events: Vec::new(),
            blocks: Vec::new(),
            prior: 0,
            matched: 0,
            stored: 0,
            cap: cfg.output_cap,
            max_blocks: cfg.max_blocks,
            dropped: 0,
            late_status: None,
            truncated: false,
            invalid: Vec::new(),
            stderr: runlog::Tail::new(cfg.log_cap),
            secrets,
            secrets_known: true,
            container_id: None,
            started_at: None,
            created: SystemTime::now(),
            sidecars: true,
        }
    }

    /// The record of a re-adopted run that had stored `prior` already: they count against
    /// the cap, and the log's replay of them is recognised and skipped, even when Docker
    /// rotated the log and the replay starts part-way.
    pub fn adopted(
        cfg: &RunnerConfig,
        run_id: &RunId,
        folder: &GroupFolder,
        prior: Vec<OutputBlock>,
    ) -> Self {
        let mut st = Self::new(cfg, run_id, folder, Vec::new());
        st.secrets_known = false;
        st.stored = prior.iter().map(size).sum();
        st.truncated = st.stored >= st.cap || prior.len() >= st.max_blocks;
        st.prior = prior.len();
        st.blocks = prior;
        st
    }

    /// Handles one output frame; returns the new blocks kept, with their indexes.
    pub fn frame(&mut self, frame: Frame) -> Vec<(usize, OutputBlock)> {
        match frame {
            Frame::Stdout(message) => self.parser.feed(&message, &mut self.events),
            Frame::Stderr(message) => {
                self.stderr.push(&message);
                return Vec::new();
            }
        }
        let mut out = Vec::new();
        // Taken and put back, so the buffer's capacity is reused frame after frame.
        let mut events = std::mem::take(&mut self.events);
        for ev in events.drain(..) {
            match ev {
                ParseEvent::Block(b) => {
                    if let Some(kept) = self.keep(b) {
                        out.push(kept);
                    }
                }
                ParseEvent::Invalid { reason, len } => {
                    if self.invalid.len() < 32 {
                        self.invalid.push(format!("{reason} ({len} bytes dropped)"));
                    }
                }
                ParseEvent::Oversize { limit } => {
                    if self.invalid.len() < 32 {
                        self.invalid
                            .push(format!("block larger than {limit} bytes dropped"));
                    }
                }
            }
        }
        self.events = events;
        out
    }

    fn keep(&mut self, mut b: OutputBlock) -> Option<(usize, OutputBlock)> {
        // A re-adopted run's log replays what was stored before the restart.
        if self.matched < self.prior {
            if same(&self.blocks[self.matched], &b) {
                self.matched += 1;
                return None;
            }
            // The log was rotated: the replay starts at a later stored block.
            if self.matched == 0
                && let Some(k) = (1..self.prior).find(|&k| same(&self.blocks[k], &b))
            {
                self.matched = k + 1;
                return None;
            }
            self.matched = self.prior;
        }
        let room = self.cap.saturating_sub(self.stored);
        if room == 0 || self.blocks.len() >= self.max_blocks {
            self.truncated = true;
            self.dropped += 1;
            self.late_status = Some(b.status);
            return None;
        }
        if size(&b) > room {
            self.truncated = true;
            // A session id is whole or nothing; then the result, then the error.
            if b.new_session_id.as_ref().is_some_and(|s| s.len() > room) {
                b.new_session_id = None;
            }
            let mut left = room - b.new_session_id.as_ref().map_or(0, String::len);
            left -= cut(&mut b.result, left);
            cut(&mut b.error, left);
        }
        self.stored += size(&b);
        let index = self.blocks.len();
        self.blocks.push(b.clone());
        Some((index, b))
    }

    /// The statuses that decide the outcome: every kept block's, then the last dropped one.
    pub fn statuses(&self) -> Vec<BlockStatus> {
        self.blocks
            .iter()
            .map(|b| b.status)
            .chain(self.late_status)
            .collect()
    }

    /// The folder's log directory, if it exists.
    pub fn logs_dir(&self, root: &SafeDir) -> Option<SafeDir> {
        root.subdir(&layout::dir_rel(&self.folder, FolderDir::Logs))
            .ok()
    }

    /// The run log: facts, then the redacted stderr tail.
    pub fn render_log(&self, v: &outcome::Verdict, exit: Option<i64>, ended: SystemTime) -> String {
        use std::fmt::Write as _;
        let rfc = hako_shared::time::rfc3339;
        let mut s = String::new();
        let _ = writeln!(s, "run: {}", self.run_id);
        let _ = writeln!(s, "folder: {}", self.folder);
        let _ = writeln!(
            s,
            "container: {}",
            self.container_id.as_deref().unwrap_or("-")
        );
        let _ = writeln!(s, "created: {}", rfc(self.created));
        let _ = writeln!(s, "started: {}", self.started_at.map_or("-".into(), rfc));
        let _ = writeln!(s, "ended: {}", rfc(ended));
        let _ = writeln!(s, "state: {} outcome: {}", v.state, v.outcome);
        let _ = writeln!(
            s,
            "exit_code: {}",
            exit.map_or("-".into(), |c| c.to_string())
        );
        if let Some(e) = &v.error {
            let _ = writeln!(s, "error: {e}");
        }
        let _ = writeln!(
            s,
            "blocks: {} truncated: {} dropped_at_cap: {}",
            self.blocks.len(),
            self.truncated,
            self.dropped
        );
        let _ = writeln!(s, "stdout_noise_bytes: {}", self.parser.noise_bytes());
        for i in &self.invalid {
            let _ = writeln!(s, "invalid_output: {i}");
        }
        if !self.secrets_known {
            // Secrets are never stored, so after a restart they cannot be redacted: keep none
            // of what the agent wrote to stderr.
            let _ = writeln!(
                s,
                "--- stderr not kept: re-adopted after a restart, its secrets are unknown ({} bytes) ---",
                self.stderr.text().len() as u64 + self.stderr.dropped()
            );
            return s;
        }
        let refs: Vec<&str> = self.secrets.iter().map(String::as_str).collect();
        let tail = runlog::redact_tail(&self.stderr.text(), &refs, self.stderr.dropped() > 0);
        let _ = writeln!(
            s,
            "--- stderr (last {} bytes; {} dropped) ---",
            tail.len(),
            self.stderr.dropped()
        );
        s.push_str(&tail);
        runlog::redact(&s, &refs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Ending;
    use hako_shared::contract::Markers;

    fn cfg(cap: usize, max_blocks: usize) -> RunnerConfig {
        let mut c = RunnerConfig::new("/tmp/x");
        c.output_cap = cap;
        c.max_blocks = max_blocks;
        c
    }

    fn block(status: &str, result: &str, error: &str, session: &str) -> Vec<u8> {
        let m = Markers::default();
        let opt = |s: &str| {
            if s.is_empty() {
                serde_json::Value::Null
            } else {
                s.into()
            }
        };
        let body = serde_json::json!({"status": status, "result": opt(result), "error": opt(error), "newSessionId": opt(session)});
        format!("\n{}\n{body}\n{}\n", m.start, m.end).into_bytes()
    }

    fn feed(st: &mut RunOutput, bytes: Vec<u8>) -> Vec<(usize, OutputBlock)> {
        st.frame(Frame::Stdout(bytes.into()))
    }

    fn folder() -> GroupFolder {
        GroupFolder::new("a").unwrap()
    }

    fn run() -> RunId {
        RunId::new("r").unwrap()
    }

    /// The review's finding: only `result` was cut, so 36 MB of `error` and `newSessionId`
    /// were stored under a 64 KiB cap. Every field counts; past the cap nothing is kept.
    #[test]
    fn every_field_counts_against_the_cap() {
        let mut st = RunOutput::new(&cfg(2000, 100), &run(), &folder(), Vec::new());
        let big = "x".repeat(600);
        let mut kept = 0;
        for _ in 0..50 {
            kept += feed(&mut st, block("ok", &big, &big, &big)).len();
        }
        assert_eq!(st.stored, 2000);
        assert_eq!(st.blocks.iter().map(size).sum::<usize>(), 2000);
        assert_eq!(kept, 2, "a whole first block's worth, then a cut one");
        assert!(st.truncated);
        assert_eq!(st.dropped, 48);
        assert_eq!(
            st.statuses().len(),
            3,
            "the last dropped status still counts"
        );
        // A session id is never cut into something that is not an id.
        assert!(st.blocks[1].new_session_id.is_none());
    }

    #[test]
    fn blocks_per_run_are_bounded() {
        let mut st = RunOutput::new(&cfg(1 << 20, 10), &run(), &folder(), Vec::new());
        for i in 0..100 {
            feed(&mut st, block("ok", &format!("b{i}"), "", ""));
        }
        assert_eq!(st.blocks.len(), 10);
        assert_eq!(st.dropped, 90);
    }

    #[test]
    fn adoption_skips_the_replay_even_after_log_rotation() {
        let stored: Vec<OutputBlock> = (0..3)
            .map(|i| OutputBlock {
                status: BlockStatus::Ok,
                result: Some(format!("b{i}")),
                new_session_id: None,
                error: None,
            })
            .collect();
        // The whole log replayed, then a new block.
        let mut st = RunOutput::adopted(&cfg(1 << 20, 100), &run(), &folder(), stored.clone());
        let mut new = Vec::new();
        for i in 0..4 {
            new.extend(feed(&mut st, block("ok", &format!("b{i}"), "", "")));
        }
        assert_eq!(new.len(), 1);
        assert_eq!((new[0].0, new[0].1.result.as_deref()), (3, Some("b3")));
        // Rotation dropped the first two blocks from the log.
        let mut st = RunOutput::adopted(&cfg(1 << 20, 100), &run(), &folder(), stored.clone());
        let mut new = Vec::new();
        for i in 2..5 {
            new.extend(feed(&mut st, block("ok", &format!("b{i}"), "", "")));
        }
        let idx: Vec<usize> = new.iter().map(|n| n.0).collect();
        assert_eq!(idx, vec![3, 4], "indexes continue after the stored blocks");
        // The cap counts what was stored before the restart.
        let mut st = RunOutput::adopted(&cfg(6, 100), &run(), &folder(), stored);
        assert!(st.truncated);
        assert!(feed(&mut st, block("ok", "b9", "", "")).is_empty());
    }

    #[test]
    fn an_adopted_runs_log_keeps_no_stderr() {
        let mut st = RunOutput::adopted(&cfg(100, 10), &run(), &folder(), Vec::new());
        st.frame(Frame::Stderr(b"token=sk-secret-value-123".to_vec().into()));
        let v = outcome::decide(&Ending::Exited(0), &[]);
        let log = st.render_log(&v, Some(0), SystemTime::now());
        assert!(!log.contains("sk-secret"), "{log}");
        assert!(log.contains("stderr not kept"), "{log}");
    }
}
