//! The follow-up inbox: files the host drops into the input directory.
//!
//! Claim protocol (exactly-once; the host relies on it): list the directory in name order,
//! skipping dotfiles and `*.tmp` (the host writes a temp name, then renames). For each file:
//! read it, then unlink it, and process it only if *our* unlink succeeded. An unlink that
//! fails with `NotFound` means the host took the file back (for example because its wake
//! signal could not be delivered): the file is skipped, never processed twice.
//!
//! The file `_close` means finish; files sorting before it are processed first.
//!
//! Plain blocking `std::fs` calls are used: they touch one local directory and return in
//! microseconds, and keeping them synchronous means a claimed file is always handed over
//! (never dropped between the unlink and its processing by a cancelled future).

use std::collections::{BinaryHeap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use hako_shared::contract::CLOSE_FILE;

use crate::output::log;

/// At most this many names are taken from one listing (the smallest ones, so the order stays
/// right); the rest are seen by the next listing.
pub const SCAN_LIMIT: usize = 4096;
/// At most this many unclaimable names are remembered (to avoid re-reading them every poll).
const SKIP_LIMIT: usize = 1024;

/// Whether a directory entry name can be a follow-up (or `_close`).
pub fn is_candidate(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && !b.starts_with(b".") && !b.ends_with(b".tmp")
}

/// Lists the candidate regular files of `dir`, in byte order of their names, at most `limit`
/// of them (the smallest), leaving out the names in `skip`.
pub fn scan(dir: &Path, limit: usize, skip: &HashSet<OsString>) -> io::Result<Vec<OsString>> {
    // A max-heap of the smallest `limit` names: bounded memory however many files there are.
    let mut heap: BinaryHeap<OsString> = BinaryHeap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if !is_candidate(&name) || skip.contains(&name) {
            continue;
        }
        // Only regular files: reading a FIFO would block, a directory cannot be claimed, and
        // the host only ever writes plain files. `file_type` does not follow symlinks.
        match entry.file_type() {
            Ok(t) if t.is_file() => {}
            _ => continue,
        }
        if heap.len() < limit {
            heap.push(name);
        } else if heap.peek().is_some_and(|max| name < *max) {
            heap.pop();
            heap.push(name);
        }
    }
    Ok(heap.into_sorted_vec())
}

/// What unlinking a file to claim it gave.
#[derive(Debug)]
pub enum Unlink {
    /// We removed it: it is ours.
    Removed,
    /// It was already gone: the host took it back.
    Gone,
    /// Some other failure: not ours.
    Failed(io::Error),
}

/// Unlinks `path` to claim it.
pub fn unlink(path: &Path) -> Unlink {
    match std::fs::remove_file(path) {
        Ok(()) => Unlink::Removed,
        Err(e) if e.kind() == io::ErrorKind::NotFound => Unlink::Gone,
        Err(e) => Unlink::Failed(e),
    }
}

/// Result of claiming one follow-up file.
#[derive(Debug)]
pub enum Claim {
    /// Ours, with its content.
    Claimed(Vec<u8>),
    /// Ours, but over the size bound; its content was not kept.
    TooLarge,
    /// The host took it back (before our read or before our unlink).
    Gone,
    /// It could not be claimed; it stays where it is and is not processed.
    Failed(io::Error),
}

/// Reads at most `max` bytes; `Ok(None)` when the file is larger.
pub fn read_bounded(path: &Path, max: usize) -> io::Result<Option<Vec<u8>>> {
    let file = std::fs::File::open(path)?;
    let mut buf = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut buf)?;
    Ok((buf.len() <= max).then_some(buf))
}

/// Claims `path`: read, then unlink; ours only if our unlink succeeded.
pub fn claim(path: &Path, max: usize) -> Claim {
    claim_with(path, max, || {})
}

/// [`claim`] with a hook between the read and the unlink, so tests can play the host taking
/// the file back at the worst moment.
pub(crate) fn claim_with(path: &Path, max: usize, between: impl FnOnce()) -> Claim {
    let content = match read_bounded(path, max) {
        Ok(c) => c,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Claim::Gone,
        Err(e) => return Claim::Failed(e),
    };
    between();
    match unlink(path) {
        Unlink::Removed => content.map_or(Claim::TooLarge, Claim::Claimed),
        Unlink::Gone => Claim::Gone,
        Unlink::Failed(e) => Claim::Failed(e),
    }
}

/// Something the inbox hands to the agent.
#[derive(Debug)]
pub enum Event {
    /// A claimed follow-up file's bytes (not yet parsed).
    Message {
        /// The file name.
        name: String,
        /// Its content.
        bytes: Vec<u8>,
    },
    /// A claimed follow-up file over the size bound.
    TooLarge {
        /// The file name.
        name: String,
    },
    /// `_close` was claimed: finish.
    Close,
}

/// The follow-up directory and what is left of its last listing.
#[derive(Debug)]
pub struct Inbox {
    dir: PathBuf,
    max_bytes: usize,
    pending: VecDeque<OsString>,
    skip: HashSet<OsString>,
    scan_failed: bool,
}

impl Inbox {
    /// An inbox over `dir`, claiming files of at most `max_bytes`.
    pub fn new(dir: PathBuf, max_bytes: usize) -> Self {
        Self {
            dir,
            max_bytes,
            pending: VecDeque::new(),
            skip: HashSet::new(),
            scan_failed: false,
        }
    }

    /// The next event, or `None` when a fresh listing has nothing for us. Lists the directory
    /// at most once per call, and only once the previous listing is used up, so files that
    /// arrive while a follow-up is being answered are seen right after it.
    pub fn next_event(&mut self) -> Option<Event> {
        let mut scanned = false;
        loop {
            let name = match self.pending.pop_front() {
                Some(n) => n,
                None if scanned => return None,
                None => {
                    scanned = true;
                    self.rescan();
                    continue;
                }
            };
            let path = self.dir.join(&name);
            let shown = name.to_string_lossy().into_owned();
            if name == CLOSE_FILE {
                match unlink(&path) {
                    Unlink::Removed => return Some(Event::Close),
                    Unlink::Gone => continue,
                    Unlink::Failed(e) => {
                        // Closing is idempotent, so a `_close` we could not delete still counts.
                        log(format_args!(
                            "cannot delete {CLOSE_FILE}: {e}; closing anyway"
                        ));
                        return Some(Event::Close);
                    }
                }
            }
            match claim(&path, self.max_bytes) {
                Claim::Claimed(bytes) => return Some(Event::Message { name: shown, bytes }),
                Claim::TooLarge => return Some(Event::TooLarge { name: shown }),
                Claim::Gone => log(format_args!("follow-up {shown} was taken back; skipped")),
                Claim::Failed(e) => {
                    // Not claimed, so not processed: at most once beats twice.
                    log(format_args!("cannot claim follow-up {shown}: {e}; skipped"));
                    if self.skip.len() < SKIP_LIMIT {
                        self.skip.insert(name);
                    }
                }
            }
        }
    }

    fn rescan(&mut self) {
        match scan(&self.dir, SCAN_LIMIT, &self.skip) {
            Ok(names) => {
                self.scan_failed = false;
                self.pending = names.into();
            }
            Err(e) => {
                if !self.scan_failed {
                    log(format_args!("cannot list {}: {e}", self.dir.display()));
                }
                self.scan_failed = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn names(v: &[OsString]) -> Vec<String> {
        v.iter().map(|n| n.to_string_lossy().into_owned()).collect()
    }

    #[test]
    fn candidates() {
        assert!(is_candidate(OsStr::new("1712.json")));
        assert!(is_candidate(OsStr::new("_close")));
        assert!(!is_candidate(OsStr::new(".1712.json")));
        assert!(!is_candidate(OsStr::new("1712.json.tmp")));
        assert!(!is_candidate(OsStr::new("")));
    }

    #[test]
    fn scan_orders_filters_and_bounds() {
        let d = tempfile::tempdir().unwrap();
        for n in [
            "3.json",
            "1.json",
            "_close",
            "2.json",
            ".hidden",
            "4.json.tmp",
        ] {
            fs::write(d.path().join(n), b"{}").unwrap();
        }
        fs::create_dir(d.path().join("0dir")).unwrap();
        let got = scan(d.path(), 100, &HashSet::new()).unwrap();
        assert_eq!(names(&got), ["1.json", "2.json", "3.json", "_close"]);
        let got = scan(d.path(), 2, &HashSet::new()).unwrap();
        assert_eq!(names(&got), ["1.json", "2.json"]);
        let skip: HashSet<OsString> = [OsString::from("1.json")].into();
        let got = scan(d.path(), 2, &skip).unwrap();
        assert_eq!(names(&got), ["2.json", "3.json"]);
    }

    #[test]
    fn claim_reads_and_removes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("1.json");
        fs::write(&p, b"hello").unwrap();
        assert!(matches!(claim(&p, 100), Claim::Claimed(b) if b == b"hello"));
        assert!(!p.exists());
        assert!(matches!(claim(&p, 100), Claim::Gone));
    }

    #[test]
    fn claim_is_void_when_the_host_takes_the_file_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("1.json");
        fs::write(&p, b"hello").unwrap();
        let got = claim_with(&p, 100, || fs::remove_file(&p).unwrap());
        assert!(matches!(got, Claim::Gone), "{got:?}");
    }

    #[test]
    fn oversize_is_claimed_without_content() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("1.json");
        fs::write(&p, [b'x'; 11]).unwrap();
        assert!(matches!(claim(&p, 10), Claim::TooLarge));
        assert!(!p.exists());
    }

    #[test]
    fn inbox_processes_files_before_close_then_stops() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("1.json"), b"a").unwrap();
        fs::write(d.path().join("2.json"), b"b").unwrap();
        fs::write(d.path().join("_close"), b"").unwrap();
        fs::write(d.path().join("x-after-close.json"), b"z").unwrap();
        let mut inbox = Inbox::new(d.path().to_owned(), 100);
        let mut seen = Vec::new();
        while let Some(ev) = inbox.next_event() {
            match ev {
                Event::Message { name, .. } => seen.push(name),
                Event::TooLarge { name } => seen.push(format!("big:{name}")),
                Event::Close => {
                    seen.push("close".into());
                    break;
                }
            }
        }
        assert_eq!(seen, ["1.json", "2.json", "close"]);
        assert!(d.path().join("x-after-close.json").exists());
        assert!(!d.path().join("_close").exists());
    }

    #[test]
    fn inbox_sees_files_added_while_answering() {
        let d = tempfile::tempdir().unwrap();
        fs::write(d.path().join("1.json"), b"a").unwrap();
        let mut inbox = Inbox::new(d.path().to_owned(), 100);
        assert!(
            matches!(inbox.next_event(), Some(Event::Message { name, .. }) if name == "1.json")
        );
        fs::write(d.path().join("2.json"), b"b").unwrap();
        assert!(
            matches!(inbox.next_event(), Some(Event::Message { name, .. }) if name == "2.json")
        );
        assert!(inbox.next_event().is_none());
    }

    #[test]
    fn missing_dir_is_not_fatal() {
        let mut inbox = Inbox::new(PathBuf::from("/nonexistent/hako-agent-test"), 100);
        assert!(inbox.next_event().is_none());
    }
}
