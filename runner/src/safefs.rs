//! File operations inside directories the container can write.
//!
//! The agent owns its workspace, session and ipc directories and may plant symlinks there.
//! The host must never follow one: every path below a trusted root is walked one component at
//! a time with `openat(O_NOFOLLOW)`, files are created with `O_EXCL | O_NOFOLLOW` and
//! replaced by `renameat` (which swaps the directory entry, never writing through it), and
//! removal is `unlinkat`. A planted symlink therefore makes the operation fail (or, for
//! "create if missing", counts as present) instead of redirecting a root-owned write to an
//! arbitrary host path.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// The owner given to what the host creates for the container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    /// User id.
    pub uid: u32,
    /// Group id.
    pub gid: u32,
}

/// An open directory; everything below it is reached without following symlinks.
#[derive(Debug)]
pub struct SafeDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Checks that `name` is one plain path component.
fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(invalid(format!("{name:?} is not a plain file name")));
    }
    Ok(())
}

fn with_path(e: rustix::io::Errno, path: &Path) -> io::Error {
    let e = io::Error::from(e);
    let hint = if e.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
        || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
    {
        " (a symlink or non-directory where a directory was expected; not followed)"
    } else {
        ""
    };
    io::Error::new(e.kind(), format!("{}: {e}{hint}", path.display()))
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

impl SafeDir {
    /// Opens a trusted root (the operator's data directory). Symlinks in the root path itself
    /// are the operator's choice and are followed; nothing below it is.
    pub fn open_root(path: &Path) -> io::Result<SafeDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| with_path(e, path))?;
        Ok(SafeDir {
            fd,
            path: path.to_owned(),
        })
    }

    /// Creates the trusted root if missing (with its parents), then opens it.
    pub fn create_root(path: &Path) -> io::Result<SafeDir> {
        std::fs::create_dir_all(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Self::open_root(path)
    }

    /// This directory's path (for messages and mounts).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn components(rel: &str) -> io::Result<impl Iterator<Item = &str>> {
        if rel.starts_with('/') {
            return Err(invalid(format!("{rel:?} is not a relative path")));
        }
        for c in rel.split('/') {
            check_name(c)?;
        }
        Ok(rel.split('/'))
    }

    fn open_child(&self, name: &str) -> io::Result<SafeDir> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(&self.fd, name, DIR_FLAGS, Mode::empty())
            .map_err(|e| with_path(e, &path))?;
        Ok(SafeDir { fd, path })
    }

    /// Opens an existing directory below this one without following symlinks.
    pub fn subdir(&self, rel: &str) -> io::Result<SafeDir> {
        let mut parts = Self::components(rel)?;
        let first = parts.next().unwrap_or(rel);
        let mut dir = self.open_child(first)?;
        for c in parts {
            dir = dir.open_child(c)?;
        }
        Ok(dir)
    }

    /// Opens `rel` below this directory, creating each missing component with `mode` and
    /// `owner`. Existing directories keep their owner and mode.
    pub fn ensure_subdir(&self, rel: &str, mode: u32, owner: Option<Owner>) -> io::Result<SafeDir> {
        let mut dir: Option<SafeDir> = None;
        for c in Self::components(rel)? {
            let parent = dir.as_ref().unwrap_or(self);
            let next = match parent.open_child(c) {
                Ok(d) => d,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    match rustix::fs::mkdirat(&parent.fd, c, Mode::from_raw_mode(mode)) {
                        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                        Err(e) => return Err(with_path(e, &parent.path.join(c))),
                    }
                    let d = parent.open_child(c)?;
                    // mkdir's mode is filtered by the umask; set it exactly.
                    rustix::fs::fchmod(&d.fd, Mode::from_raw_mode(mode))
                        .map_err(|e| with_path(e, &d.path))?;
                    if let Some(o) = owner {
                        chown_fd(&d.fd, o, &d.path)?;
                    }
                    d
                }
                Err(e) => return Err(e),
            };
            dir = Some(next);
        }
        dir.ok_or_else(|| invalid("empty path".into()))
    }

    /// Like [`SafeDir::ensure_subdir`], but an entry on the way that is not a directory (a
    /// symlink or file planted in a directory the agent can write) is removed, never followed,
    /// and replaced by a directory, so that the group keeps working and the host stays safe.
    pub fn ensure_subdir_replacing(
        &self,
        rel: &str,
        mode: u32,
        owner: Option<Owner>,
    ) -> io::Result<SafeDir> {
        let mut dir: Option<SafeDir> = None;
        for c in Self::components(rel)? {
            let parent = dir.as_ref().unwrap_or(self);
            match parent.kind(c)? {
                None | Some(FileType::Directory) => {}
                Some(kind) => {
                    tracing::warn!(path = %parent.path.join(c).display(), ?kind, "replacing a non-directory where a directory belongs");
                    parent.remove(c)?;
                }
            }
            dir = Some(parent.ensure_subdir(c, mode, owner)?);
        }
        dir.ok_or_else(|| invalid("empty path".into()))
    }

    /// Sets this directory's owner.
    pub fn chown(&self, owner: Owner) -> io::Result<()> {
        chown_fd(&self.fd, owner, &self.path)
    }

    /// Sets this directory's permission bits.
    pub fn chmod(&self, mode: u32) -> io::Result<()> {
        rustix::fs::fchmod(&self.fd, Mode::from_raw_mode(mode))
            .map_err(|e| with_path(e, &self.path))
    }

    /// What `name` is, without following a symlink; `None` if absent.
    pub fn kind(&self, name: &str) -> io::Result<Option<FileType>> {
        check_name(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(FileType::from_raw_mode(st.st_mode))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(with_path(e, &self.path.join(name))),
        }
    }

    fn create_excl(&self, name: &str, mode: u32) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| with_path(e, &self.path.join(name)))?;
        Ok(File::from(fd))
    }

    /// Writes `data` to `name` atomically: a new temp file, then `renameat` over the old
    /// entry (a symlink at `name` is replaced, never written through).
    pub fn write_atomic(
        &self,
        name: &str,
        data: &[u8],
        mode: u32,
        owner: Option<Owner>,
    ) -> io::Result<()> {
        check_name(name)?;
        let tmp = format!(".{name}.hako-{}.tmp", random_suffix());
        let result = (|| {
            let mut f = self.create_excl(&tmp, mode)?;
            f.write_all(data)?;
            rustix::fs::fchmod(f.as_fd(), Mode::from_raw_mode(mode))
                .map_err(|e| with_path(e, &self.path.join(&tmp)))?;
            if let Some(o) = owner {
                chown_fd(f.as_fd(), o, &self.path.join(&tmp))?;
            }
            rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)
                .map_err(|e| with_path(e, &self.path.join(name)))
        })();
        if result.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
        }
        result
    }

    /// Creates `name` with `data` only if nothing (not even a symlink) is there.
    /// Returns whether it wrote.
    pub fn create_new(
        &self,
        name: &str,
        data: &[u8],
        mode: u32,
        owner: Option<Owner>,
    ) -> io::Result<bool> {
        check_name(name)?;
        let mut f = match self.create_excl(name, mode) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(e),
        };
        f.write_all(data)?;
        rustix::fs::fchmod(f.as_fd(), Mode::from_raw_mode(mode))
            .map_err(|e| with_path(e, &self.path.join(name)))?;
        if let Some(o) = owner {
            chown_fd(f.as_fd(), o, &self.path.join(name))?;
        }
        Ok(true)
    }

    /// Opens a new file for writing; fails if anything is already there.
    pub fn create_file(&self, name: &str, mode: u32) -> io::Result<File> {
        check_name(name)?;
        self.create_excl(name, mode)
    }

    /// Reads a regular file of at most `max` bytes, refusing symlinks.
    pub fn read(&self, name: &str, max: u64) -> io::Result<Vec<u8>> {
        check_name(name)?;
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NONBLOCK,
            Mode::empty(),
        )
        .map_err(|e| with_path(e, &path))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| with_path(e, &path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(invalid(format!("{}: not a regular file", path.display())));
        }
        let mut buf = Vec::new();
        File::from(fd).take(max + 1).read_to_end(&mut buf)?;
        if buf.len() as u64 > max {
            return Err(invalid(format!(
                "{}: larger than {max} bytes",
                path.display()
            )));
        }
        Ok(buf)
    }

    /// The names in this directory (without `.` and `..`), as raw names. Only for
    /// directories the host owns: an agent's directory could hold millions.
    pub fn names(&self) -> io::Result<Vec<std::ffi::OsString>> {
        use std::os::unix::ffi::OsStringExt;
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| with_path(e, &self.path))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| with_path(e, &self.path))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                out.push(std::ffi::OsString::from_vec(name.to_vec()));
            }
        }
        Ok(out)
    }

    /// The regular files directly in this directory and their total size, looking at no more
    /// than `max_entries` entries (`None` past that: a directory the agent can write may hold
    /// millions, and the caller treats "too many" as full). Symlinks and subdirectories count
    /// as entries of no size; nothing is followed.
    pub fn usage(&self, max_entries: usize) -> io::Result<Option<Usage>> {
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| with_path(e, &self.path))?;
        let mut u = Usage::default();
        let mut seen = 0usize;
        for entry in dir {
            let entry = entry.map_err(|e| with_path(e, &self.path))?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            seen += 1;
            if seen > max_entries {
                return Ok(None);
            }
            match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                    u.files += 1;
                    u.bytes += st.st_size.max(0) as u64;
                }
                Ok(_) | Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(with_path(e, &self.path)),
            }
        }
        Ok(Some(u))
    }

    /// The size of the regular file `name`; `None` when absent or not a regular file.
    pub fn file_size(&self, name: &str) -> io::Result<Option<u64>> {
        check_name(name)?;
        match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile => {
                Ok(Some(st.st_size.max(0) as u64))
            }
            Ok(_) | Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(with_path(e, &self.path.join(name))),
        }
    }

    /// Whether the directory has no entries (besides `.` and `..`).
    pub fn is_empty(&self) -> io::Result<bool> {
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| with_path(e, &self.path))?;
        for entry in dir {
            let entry = entry.map_err(|e| with_path(e, &self.path))?;
            let name = entry.file_name().to_bytes();
            if name != b"." && name != b".." {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Removes the entry `name` (a file or a symlink, never its target).
    /// Returns `false` if it was not there.
    pub fn remove(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(with_path(e, &self.path.join(name))),
        }
    }

    /// Moves the entry `name` into `to` under a fresh name starting with `prefix`, and returns
    /// that name. One `renameat`, whatever the entry holds: this is how a tree the agent made
    /// leaves a directory the host is about to reuse, without the host walking it.
    pub fn move_into(&self, name: &str, to: &SafeDir, prefix: &str) -> io::Result<String> {
        check_name(name)?;
        let fresh = format!("{prefix}-{}", random_suffix());
        check_name(&fresh)?;
        rustix::fs::renameat(&self.fd, name, &to.fd, fresh.as_str())
            .map_err(|e| with_path(e, &self.path.join(name)))?;
        Ok(fresh)
    }

    /// Renames `from` to `to` within this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        check_name(from)?;
        check_name(to)?;
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .map_err(|e| with_path(e, &self.path.join(to)))
    }
}

/// What [`SafeDir::usage`] found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Regular files.
    pub files: usize,
    /// Their total size.
    pub bytes: u64,
}

/// Bounds on one [`reap`].
#[derive(Debug, Clone, Copy)]
pub struct ReapLimits {
    /// Directories held open at once; deeper subtrees are moved up and done later.
    pub max_depth: usize,
    /// Entries removed before giving up (the rest stays for the next reap).
    pub max_entries: u64,
}

impl Default for ReapLimits {
    fn default() -> Self {
        Self {
            max_depth: 32,
            max_entries: 1_000_000,
        }
    }
}

/// What a [`reap`] removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reaped {
    /// Files, symlinks, sockets and other non-directories unlinked.
    pub files: u64,
    /// Directories removed.
    pub dirs: u64,
    /// Subtrees too deep to hold open, moved up to be removed on their own.
    pub flattened: u64,
}

/// A directory being emptied: its fd, its name in its parent, its subdirectories left.
struct Frame {
    fd: OwnedFd,
    name: CString,
    subdirs: Vec<CString>,
}

/// Deletes every entry of `trash` (a host-owned directory that no container mounts) without
/// recursion and without following a symlink. Names are raw bytes: a non-UTF-8 name planted
/// by an agent is removed like any other. At most `limits.max_depth` directories are open at
/// once: a deeper subtree (a 10,000-deep `d/d/d…` chain) is renamed up into `trash` and taken
/// apart from there, so depth costs neither stack nor file descriptors. Work stops after
/// `limits.max_entries` entries with an error; what is left stays for the next call.
pub fn reap(trash: &SafeDir, limits: ReapLimits) -> io::Result<Reaped> {
    let mut done = Reaped::default();
    loop {
        let mut roots = Vec::new();
        for entry in rustix::fs::Dir::read_from(&trash.fd).map_err(|e| with_path(e, &trash.path))? {
            let entry = entry.map_err(|e| with_path(e, &trash.path))?;
            let name = entry.file_name();
            if name.to_bytes() != b"." && name.to_bytes() != b".." {
                roots.push(name.to_owned());
            }
        }
        if roots.is_empty() {
            return Ok(done);
        }
        for root in roots {
            reap_one(trash, root, limits, &mut done)?;
        }
    }
}

fn reap_one(
    trash: &SafeDir,
    root: CString,
    limits: ReapLimits,
    done: &mut Reaped,
) -> io::Result<()> {
    let over = |done: &Reaped| done.files + done.dirs >= limits.max_entries;
    let mut stack: Vec<Frame> = Vec::new();
    match open_frame(&trash.fd, root, done, limits.max_entries)? {
        Some(f) => stack.push(f),
        None => return Ok(()),
    }
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else { break };
        if over(done) {
            return Err(io::Error::other(format!(
                "{}: stopped after {} entries; the rest is removed later",
                trash.path.display(),
                limits.max_entries
            )));
        }
        if let Some(sub) = top.subdirs.pop() {
            if depth >= limits.max_depth {
                let fresh = format!(".deep-{}", random_suffix());
                rustix::fs::renameat(&top.fd, sub.as_c_str(), &trash.fd, fresh.as_str())
                    .map_err(|e| with_path(e, &trash.path))?;
                done.flattened += 1;
                continue;
            }
            let parent = &top.fd;
            let child = open_frame(parent, sub, done, limits.max_entries)?;
            stack.extend(child);
            continue;
        }
        let Some(finished) = stack.pop() else { break };
        let parent = stack.last().map_or(&trash.fd, |f| &f.fd);
        match rustix::fs::unlinkat(parent, finished.name.as_c_str(), AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => done.dirs += 1,
            // Something was added meanwhile (nothing should write here): list it again.
            Err(rustix::io::Errno::NOTEMPTY) => {
                let again = open_frame(parent, finished.name, done, limits.max_entries)?;
                stack.extend(again);
            }
            Err(e) => return Err(with_path(e, &trash.path)),
        }
    }
    Ok(())
}

/// Opens directory `name` in `parent` (never following a symlink), unlinks its
/// non-directories and lists its subdirectories. `None`: it was not a directory (and is
/// unlinked now) or is gone.
fn open_frame(
    parent: &OwnedFd,
    name: CString,
    done: &mut Reaped,
    max: u64,
) -> io::Result<Option<Frame>> {
    let fd = match rustix::fs::openat(parent, name.as_c_str(), DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            match rustix::fs::unlinkat(parent, name.as_c_str(), AtFlags::empty()) {
                Ok(()) => done.files += 1,
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    };
    let mut subdirs = Vec::new();
    for entry in rustix::fs::Dir::read_from(&fd)? {
        if done.files + done.dirs >= max {
            break;
        }
        let entry = entry?;
        let child = entry.file_name();
        if child.to_bytes() == b"." || child.to_bytes() == b".." {
            continue;
        }
        let kind = match entry.file_type() {
            FileType::Unknown => match rustix::fs::statat(&fd, child, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => FileType::from_raw_mode(st.st_mode),
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            },
            k => k,
        };
        if kind == FileType::Directory {
            subdirs.push(child.to_owned());
        } else {
            match rustix::fs::unlinkat(&fd, child, AtFlags::empty()) {
                Ok(()) => done.files += 1,
                Err(rustix::io::Errno::NOENT) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(Some(Frame { fd, name, subdirs }))
}

fn chown_fd(fd: impl AsFd, o: Owner, path: &Path) -> io::Result<()> {
    rustix::fs::fchown(
        fd,
        Some(rustix::fs::Uid::from_raw(o.uid)),
        Some(rustix::fs::Gid::from_raw(o.gid)),
    )
    .map_err(|e| with_path(e, path))
}

/// A short random hex string for temp names.
pub fn random_suffix() -> String {
    hako_shared::ids::random_id("", 6)
}

/// Whether `name` is a plain component (helper for callers validating input).
pub fn is_plain_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty() && b != b"." && b != b".." && !b.contains(&b'/') && !b.contains(&0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn never_writes_through_a_planted_symlink() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root = SafeDir::create_root(&tmp.path().join("root")).unwrap();
        let session = root.ensure_subdir("sessions/a", 0o755, None).unwrap();
        // The agent plants a symlink where the host writes settings.
        symlink(outside.join("victim"), session.path().join("settings.json")).unwrap();
        session
            .write_atomic("settings.json", b"{}", 0o644, None)
            .unwrap();
        assert!(
            !outside.join("victim").exists(),
            "wrote through the symlink"
        );
        assert_eq!(
            std::fs::read(session.path().join("settings.json")).unwrap(),
            b"{}"
        );
        // create_new treats a symlink as present and does not follow it.
        symlink(outside.join("victim2"), session.path().join("x")).unwrap();
        assert!(!session.create_new("x", b"data", 0o644, None).unwrap());
        assert!(!outside.join("victim2").exists());
    }

    #[test]
    fn refuses_a_symlinked_directory_component() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let root = SafeDir::create_root(&tmp.path().join("root")).unwrap();
        root.ensure_subdir("groups", 0o755, None).unwrap();
        symlink(&outside, tmp.path().join("root/groups/evil")).unwrap();
        let err = root
            .ensure_subdir("groups/evil/logs", 0o755, None)
            .unwrap_err();
        assert!(err.to_string().contains("not followed"), "{err}");
        assert!(!outside.join("logs").exists());
        assert!(root.subdir("groups/evil").is_err());
        assert!(root.read("groups", 10).is_err());
    }

    #[test]
    fn read_refuses_symlinks_and_big_files() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("secret"), "s").unwrap();
        let root = SafeDir::open_root(tmp.path()).unwrap();
        symlink(tmp.path().join("secret"), tmp.path().join("link")).unwrap();
        assert!(root.read("link", 100).is_err());
        assert_eq!(root.read("secret", 100).unwrap(), b"s");
        assert!(root.read("secret", 0).is_err());
    }

    #[test]
    fn remove_never_follows() {
        let tmp = tempfile::tempdir().unwrap();
        let keep = tmp.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("f"), "x").unwrap();
        let root = SafeDir::create_root(&tmp.path().join("r")).unwrap();
        let d = root.ensure_subdir("input", 0o755, None).unwrap();
        symlink(&keep, d.path().join("link")).unwrap();
        std::fs::write(d.path().join("a.json"), "{}").unwrap();
        assert!(d.remove("link").unwrap());
        assert!(!d.remove("link").unwrap());
        symlink(&keep, d.path().join("link2")).unwrap();
        let trash = root.ensure_subdir("trash", 0o700, None).unwrap();
        root.move_into("input", &trash, "input").unwrap();
        assert!(!tmp.path().join("r/input").exists());
        reap(&trash, ReapLimits::default()).unwrap();
        assert!(keep.join("f").exists(), "the symlink's target survives");
        assert!(trash.is_empty().unwrap());
    }

    /// Builds a `d/d/d…` chain `depth` levels deep below `dir` (without ever naming the whole
    /// path, which would exceed PATH_MAX), with a file and a non-UTF-8 name at the bottom.
    fn deep_chain(dir: &Path, depth: usize) {
        let mut fd = rustix::fs::open(dir, DIR_FLAGS, Mode::empty()).unwrap();
        for _ in 0..depth {
            rustix::fs::mkdirat(&fd, "d", Mode::from_raw_mode(0o755)).unwrap();
            fd = rustix::fs::openat(&fd, "d", DIR_FLAGS, Mode::empty()).unwrap();
        }
        let bad = c"\xff\xfe-not-utf8";
        rustix::fs::mkdirat(&fd, bad, Mode::from_raw_mode(0o755)).unwrap();
        rustix::fs::openat(
            &fd,
            "f",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o644),
        )
        .unwrap();
    }

    #[test]
    fn reap_takes_apart_deep_wide_and_odd_trees_without_recursion() {
        let tmp = tempfile::tempdir().unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), "x").unwrap();
        let root = SafeDir::create_root(&tmp.path().join("r")).unwrap();
        let trash = root.ensure_subdir("trash", 0o700, None).unwrap();
        let a = trash.ensure_subdir("a", 0o755, None).unwrap();
        deep_chain(a.path(), 10_000);
        let b = trash.ensure_subdir("b", 0o755, None).unwrap();
        for i in 0..2_000 {
            std::fs::write(b.path().join(format!("f{i}")), "x").unwrap();
        }
        symlink(&outside, b.path().join("out")).unwrap();
        symlink(&outside, trash.path().join("toplink")).unwrap();
        std::fs::write(trash.path().join("plain"), "x").unwrap();
        // Run on a small thread stack: a recursive walk of 10,000 levels would overflow it.
        let done = std::thread::Builder::new()
            .stack_size(64 << 10)
            .spawn(move || reap(&trash, ReapLimits::default()).map(|d| (d, trash)))
            .unwrap()
            .join()
            .unwrap();
        let (done, trash) = done.unwrap();
        assert!(trash.is_empty().unwrap(), "{done:?}");
        // The chain, its non-UTF-8 leaf, `a` and `b`; the chain's file, `b`'s files, two links and a file.
        assert_eq!(done.dirs, 10_000 + 1 + 2, "{done:?}");
        assert_eq!(done.files, 1 + 2_000 + 1 + 2, "{done:?}");
        assert!(done.flattened > 0);
        assert!(
            outside.join("keep").exists(),
            "nothing followed out of the trash"
        );
    }

    #[test]
    fn reap_stops_at_its_budget_and_finishes_later() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SafeDir::create_root(tmp.path()).unwrap();
        let trash = root.ensure_subdir("trash", 0o700, None).unwrap();
        let w = trash.ensure_subdir("w", 0o755, None).unwrap();
        for i in 0..500 {
            std::fs::write(w.path().join(format!("f{i}")), "x").unwrap();
        }
        let small = ReapLimits {
            max_depth: 4,
            max_entries: 100,
        };
        let e = reap(&trash, small).unwrap_err();
        assert!(e.to_string().contains("stopped after 100"), "{e}");
        assert!(!trash.is_empty().unwrap());
        reap(&trash, ReapLimits::default()).unwrap();
        assert!(trash.is_empty().unwrap());
    }

    #[test]
    fn names_are_single_components() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SafeDir::open_root(tmp.path()).unwrap();
        for bad in ["", ".", "..", "a/b", "/abs"] {
            assert!(root.write_atomic(bad, b"", 0o644, None).is_err(), "{bad:?}");
        }
        assert!(root.ensure_subdir("a/../b", 0o755, None).is_err());
        assert!(root.ensure_subdir("/etc", 0o755, None).is_err());
    }

    #[test]
    fn created_dirs_get_exact_mode() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let root = SafeDir::open_root(tmp.path()).unwrap();
        root.ensure_subdir("a/b", 0o700, None).unwrap();
        let m = std::fs::metadata(tmp.path().join("a/b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(m & 0o777, 0o700);
    }
}
