//! The data root as the runner holds it: the layout check at start, the top-level
//! directories of [`hako_shared::layout`], and the trash where agent-made trees go to be
//! deleted.
//!
//! The host never walks a tree an agent made in a directory it is about to reuse (the
//! follow-up drop, the sidecar sockets): a directory that holds anything is moved whole into
//! `trash/` with one `renameat` and a fresh one takes its place, so a run's preparation costs
//! the same whatever the agent left behind. The trash is emptied in the background by
//! [`safefs::reap`], which never recurses and never follows a link.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use hako_shared::layout::{self, OLD_LAYOUT, TRASH, VERSION, VERSION_FILE};

use super::safefs::{self, Owner, ReapLimits, Reaped, SafeDir};

/// Why the data root cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A file operation on the data root failed.
    #[error("data directory {path}: {source}")]
    Io {
        /// The data root.
        path: String,
        /// What failed.
        source: io::Error,
    },
    /// The data root holds another layout.
    #[error("data directory {path}: {reason}")]
    Layout {
        /// The data root.
        path: String,
        /// What is wrong and what to do.
        reason: String,
    },
}

/// The opened data root.
#[derive(Debug)]
pub struct Storage {
    root: SafeDir,
    trash: SafeDir,
    /// Held while the trash is being emptied.
    reap_lock: Mutex<()>,
    reaping: AtomicBool,
    again: AtomicBool,
}

impl Storage {
    /// Opens (creating) the data root, checks its layout version and creates the top-level
    /// directories. A data root in the old nested layout is refused with what to do.
    pub fn open(data_dir: &Path) -> Result<Storage, StorageError> {
        let io_err = |source: io::Error| StorageError::Io {
            path: data_dir.display().to_string(),
            source,
        };
        let root = SafeDir::create_root(data_dir).map_err(io_err)?;
        check_version(&root, data_dir)?;
        // Closed to every other account of the host (and to a host user who happens to have
        // the agent's uid): nobody but the daemons lists, reads or reaches a tenant's files or
        // a live turn's sockets. Containers reach their bind mounts without traversing these;
        // an older install's 0755 is closed here too.
        for top in [layout::FOLDERS, layout::SHARES, layout::GLOBAL] {
            let dir = root.ensure_subdir(top, 0o700, None).map_err(io_err)?;
            dir.chmod(0o700).map_err(io_err)?;
        }
        let trash = root.ensure_subdir(TRASH, 0o700, None).map_err(io_err)?;
        Ok(Storage {
            root,
            trash,
            reap_lock: Mutex::new(()),
            reaping: AtomicBool::new(false),
            again: AtomicBool::new(false),
        })
    }

    /// The data root.
    pub fn root(&self) -> &SafeDir {
        &self.root
    }

    /// Opens `rel` (an existing directory below the root, reached without following links)
    /// empty: if it holds anything, or is not a directory, it goes to the trash whole and a
    /// new directory owned by `owner` takes its place. Its parent must be host-owned.
    pub fn fresh_dir(&self, rel: &str, owner: Option<Owner>) -> io::Result<SafeDir> {
        let (parent_rel, name) = rel
            .rsplit_once('/')
            .ok_or_else(|| io::Error::other(format!("{rel}: no parent")))?;
        let parent = self.root.subdir(parent_rel)?;
        match parent.kind(name)? {
            Some(rustix::fs::FileType::Directory) => {
                let dir = parent.subdir(name)?;
                if dir.is_empty()? {
                    return Ok(dir);
                }
                parent.move_into(name, &self.trash, name)?;
            }
            Some(_) => {
                parent.move_into(name, &self.trash, name)?;
            }
            None => {}
        }
        parent.ensure_subdir(name, 0o755, owner)
    }

    /// Moves the entry `name` of `dir` into the trash (a directory the agent put where the
    /// host writes a file).
    pub fn discard(&self, dir: &SafeDir, name: &str) -> io::Result<()> {
        dir.move_into(name, &self.trash, name).map(drop)
    }

    /// Moves a folder's whole directory (`folders/<key>`: workspace, home, transcripts,
    /// everything its agents left) into the trash, and empties the trash in the background.
    /// Answers whether there was one. A group made later in the folder starts from nothing.
    pub fn retire_folder(self: &Arc<Self>, folder: &hako_shared::GroupFolder) -> io::Result<bool> {
        let folders = self.root.subdir(layout::FOLDERS)?;
        let key = layout::folder_key(folder);
        if folders.kind(&key)?.is_none() {
            return Ok(false);
        }
        folders.move_into(&key, &self.trash, "retired")?;
        self.schedule_reap();
        Ok(true)
    }

    /// Empties the trash now, on this thread.
    pub fn reap_now(&self) -> io::Result<Reaped> {
        let _held = self.reap_lock.lock().unwrap_or_else(|p| p.into_inner());
        safefs::reap(&self.trash, ReapLimits::default())
    }

    /// Empties the trash on a blocking thread, unless that is already under way (then the
    /// running pass goes round once more). Outside a Tokio runtime it does nothing; the next
    /// start reaps.
    pub fn schedule_reap(self: &Arc<Self>) {
        self.again.store(true, Ordering::SeqCst);
        if self.reaping.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            self.reaping.store(false, Ordering::SeqCst);
            return;
        };
        let this = self.clone();
        rt.spawn_blocking(move || {
            loop {
                this.again.store(false, Ordering::SeqCst);
                match this.reap_now() {
                    Ok(r) if r != Reaped::default() => {
                        tracing::info!(files = r.files, dirs = r.dirs, "emptied the trash")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "emptying the trash"),
                }
                this.reaping.store(false, Ordering::SeqCst);
                if !this.again.load(Ordering::SeqCst) || this.reaping.swap(true, Ordering::SeqCst) {
                    break;
                }
            }
        });
    }
}

fn check_version(root: &SafeDir, data_dir: &Path) -> Result<(), StorageError> {
    let fail = |reason: String| StorageError::Layout {
        path: data_dir.display().to_string(),
        reason,
    };
    let io_err = |source: io::Error| StorageError::Io {
        path: data_dir.display().to_string(),
        source,
    };
    match root.read(VERSION_FILE, 64) {
        Ok(raw) => {
            let v = String::from_utf8_lossy(&raw);
            if v.trim() == VERSION {
                Ok(())
            } else {
                Err(fail(format!(
                    "{VERSION_FILE} says layout {:?}; this hako uses layout {VERSION}",
                    v.trim()
                )))
            }
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let old: Vec<&str> = OLD_LAYOUT
                .iter()
                .copied()
                .filter(|n| matches!(root.kind(n), Ok(Some(_))))
                .collect();
            if !old.is_empty() {
                return Err(fail(format!(
                    "it holds hako's old layout ({}), in which a parent group's agent could \
                     reach its sub-groups' files; move those directories aside and start with \
                     an empty data directory (specs/layout.md says how to carry a group over)",
                    old.join(", ")
                )));
            }
            root.create_new(VERSION_FILE, format!("{VERSION}\n").as_bytes(), 0o644, None)
                .map_err(io_err)?;
            Ok(())
        }
        Err(e) => Err(io_err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stamped_and_old_layouts_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path().join("data");
        Storage::open(&d).unwrap();
        assert_eq!(std::fs::read_to_string(d.join("LAYOUT")).unwrap(), "2\n");
        Storage::open(&d).unwrap();
        let old = tmp.path().join("old");
        std::fs::create_dir_all(old.join("groups/a")).unwrap();
        let e = Storage::open(&old).unwrap_err().to_string();
        assert!(e.contains("old layout (groups)"), "{e}");
        std::fs::write(d.join("LAYOUT"), "7").unwrap();
        assert!(Storage::open(&d).unwrap_err().to_string().contains("\"7\""));
    }

    #[test]
    fn fresh_dir_moves_a_used_dir_aside_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let s = Storage::open(tmp.path()).unwrap();
        let input = s
            .root()
            .ensure_subdir("folders/a/input", 0o755, None)
            .unwrap();
        let inode = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(input.path());
        // An empty directory is kept as it is.
        s.fresh_dir("folders/a/input", None).unwrap();
        assert_eq!(inode(input.path()), before);
        std::fs::create_dir_all(input.path().join("x/y")).unwrap();
        let fresh = s.fresh_dir("folders/a/input", None).unwrap();
        assert!(fresh.is_empty().unwrap());
        assert_ne!(inode(fresh.path()), before);
        // A symlink where the directory belongs is moved aside, never followed.
        std::fs::remove_dir(fresh.path()).unwrap();
        std::os::unix::fs::symlink("/etc", tmp.path().join("folders/a/input")).unwrap();
        let fresh = s.fresh_dir("folders/a/input", None).unwrap();
        assert!(fresh.is_empty().unwrap());
        s.reap_now().unwrap();
        assert!(s.trash.is_empty().unwrap());
        assert!(Path::new("/etc/hostname").exists() || Path::new("/etc").exists());
    }
}
