//! File operations inside directories the container can write.
//!
//! The agent owns its workspace, session and ipc directories and may plant symlinks there.
//! The host must never follow one: every path below a trusted root is walked one component at
//! a time with `openat(O_NOFOLLOW)`, files are created with `O_EXCL | O_NOFOLLOW` and
//! replaced by `renameat` (which swaps the directory entry, never writing through it), and
//! removal is `unlinkat`. A planted symlink therefore makes the operation fail (or, for
//! "create if missing", counts as present) instead of redirecting a root-owned write to an
//! arbitrary host path.

use std::ffi::OsStr;
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

    /// The names in this directory (without `.` and `..`), with their types.
    pub fn entries(&self) -> io::Result<Vec<(String, FileType)>> {
        let dir = rustix::fs::Dir::read_from(&self.fd).map_err(|e| with_path(e, &self.path))?;
        let mut out = Vec::new();
        for entry in dir {
            let entry = entry.map_err(|e| with_path(e, &self.path))?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let name = String::from_utf8_lossy(name).into_owned();
            out.push((name, entry.file_type()));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
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

    /// Removes a directory tree below this one without following symlinks.
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        match self.kind(name)? {
            None => Ok(()),
            Some(FileType::Directory) => {
                let sub = self.open_child(name)?;
                for (child, kind) in sub.entries()? {
                    if kind == FileType::Directory {
                        sub.remove_tree(&child)?;
                    } else {
                        sub.remove(&child)?;
                    }
                }
                rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
                    .map_err(|e| with_path(e, &self.path.join(name)))
            }
            Some(_) => self.remove(name).map(drop),
        }
    }

    /// Renames `from` to `to` within this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        check_name(from)?;
        check_name(to)?;
        rustix::fs::renameat(&self.fd, from, &self.fd, to)
            .map_err(|e| with_path(e, &self.path.join(to)))
    }
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
    let mut b = [0u8; 6];
    // An unavailable RNG only makes names less unique; O_EXCL still prevents clobbering.
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
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
        root.remove_tree("input").unwrap();
        assert!(keep.join("f").exists());
        assert!(!tmp.path().join("r/input").exists());
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
