//! Who owns a chat's containers, and the one live chat per folder.
//!
//! A `hako chat` killed without cleaning up (SIGKILL, a crash) leaves its container running,
//! polling the folder's follow-up drop until its deadline: a second chat of the folder would
//! then split the follow-ups with it, and lines would vanish. So:
//!
//! - a chat of a folder holds an exclusive lock on `folders/<key>/chat.lock` (host-owned) for
//!   its whole life; the kernel drops it when the process dies, however it dies. A second
//!   chat of the same folder is refused while the first lives, saying which process holds it;
//! - every container a chat starts carries `io.hako.owner=<pid>.<start time>` (the start time
//!   tells a reused pid apart), and every chat starts by removing the containers whose owner
//!   process is gone, of any folder and data root (a temporary session's too).

use std::fs::{File, TryLockError};
use std::io::{Read as _, Seek as _, Write as _};
use std::path::Path;
use std::time::Duration;

use hako_runner::engine::{Engine, EngineError, labels};

/// The folder's chat lock, held while this chat lives.
#[derive(Debug)]
pub struct FolderLock {
    _file: File,
}

/// Why a folder's chat could not start.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another chat of the folder is live.
    #[error(
        "another hako chat of this folder is live (process {holder}); end it first, or use another folder"
    )]
    Busy {
        /// The process that holds it, as it wrote itself in the lock file.
        holder: String,
    },
    /// The lock file could not be used.
    #[error("{path}: {err}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        err: std::io::Error,
    },
}

/// Takes the folder's chat lock at `path` (its directory is created if missing).
pub fn lock_folder(path: &Path) -> Result<FolderLock, LockError> {
    let io = |err| LockError::Io {
        path: path.display().to_string(),
        err,
    };
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            return Err(LockError::Busy {
                holder: holder.trim().chars().take(64).collect(),
            });
        }
        Err(TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    Ok(FolderLock { _file: file })
}

/// This process as an owner label: `<pid>.<start time in clock ticks since boot>`.
pub fn me() -> String {
    let pid = std::process::id();
    format!("{pid}.{}", start_time(pid).unwrap_or(0))
}

/// A process's start time (field 22 of `/proc/<pid>/stat`), if it exists.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process an owner label names still runs (the same process, not a new one
/// that got its pid).
pub fn alive(owner: &str) -> bool {
    let Some((pid, start)) = owner.split_once('.') else {
        return false;
    };
    match (pid.parse::<u32>(), start.parse::<u64>()) {
        (Ok(pid), Ok(start)) => start_time(pid) == Some(start),
        _ => false,
    }
}

/// Removes every container whose owning chat is dead (any folder, any data root). Answers how
/// many were removed.
pub async fn reap_dead(engine: &dyn Engine, limit: Duration) -> Result<usize, EngineError> {
    let mut n = 0;
    for c in engine.list(labels::OWNER, None, limit).await? {
        let owner = c
            .labels
            .get(labels::OWNER)
            .map(String::as_str)
            .unwrap_or("");
        if alive(owner) {
            continue;
        }
        match engine
            .remove(&c.id, Some(Duration::from_secs(1)), limit)
            .await
        {
            Ok(()) => n += 1,
            Err(e) => {
                tracing::warn!(container = c.id, error = %e, "removing a dead chat's container")
            }
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat reaps the boxes of chats whose process is gone, of any install, and leaves a
    /// living chat's boxes and boxes no chat owns.
    #[tokio::test]
    async fn only_a_dead_chats_boxes_are_reaped() {
        let sim = hako_runner::sim::SimEngine::new();
        let mine = sim.plant(&[(labels::OWNER, &me())], true);
        let dead = sim.plant(
            &[(labels::OWNER, "4194304.5"), (labels::INSTALL, "other")],
            true,
        );
        let exited = sim.plant(&[(labels::OWNER, "garbage")], false);
        let unowned = sim.plant(&[(labels::INSTALL, "other")], true);
        let n = reap_dead(&sim, Duration::from_secs(5)).await.unwrap();
        assert_eq!(n, 2);
        let mut left = vec![mine, unowned];
        left.sort();
        assert_eq!(sim.boxes(), left);
        let removed: Vec<_> = sim.removals().into_iter().map(|(id, _)| id).collect();
        assert!(removed.contains(&dead) && removed.contains(&exited));
    }

    #[test]
    fn this_process_is_alive_and_a_made_up_one_is_not() {
        assert!(alive(&me()));
        let pid = std::process::id();
        assert!(
            !alive(&format!("{pid}.1")),
            "a reused pid is another process"
        );
        assert!(!alive("4194304.5"), "no such pid");
        assert!(!alive("garbage"));
    }

    #[test]
    fn one_chat_per_folder_and_the_lock_goes_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f/chat.lock");
        let held = lock_folder(&path).unwrap();
        match lock_folder(&path) {
            Err(LockError::Busy { holder }) => {
                assert_eq!(holder, std::process::id().to_string())
            }
            other => panic!("{other:?}"),
        }
        drop(held);
        lock_folder(&path).expect("free again");
    }
}
