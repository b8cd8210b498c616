//! The operator's brokered secrets on disk (`specs/egress.md`, Secrets): one file per secret,
//! named after it, 0600 and owned by the egress proxy's user, in `DATA_DIR/egress/secrets/`
//! (0700, the proxy's user). That directory is mounted read-only into the proxy container and
//! into nothing else; runed writes and removes values there for the operator's API and never
//! reads one back (the proxy is the only reader). Never a database, a log or an error.
//!
//! Also the proxy's own directory for its CA (`egress/ca/`, the proxy's user, read-write for
//! it alone) and the bundle boxes trust (`egress/ca-bundle.pem`, the host's).

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use hako_shared::layout::{CA_BUNDLE, EGRESS, EGRESS_CA, EGRESS_SECRETS};
use hako_shared::secrets::{self, SecretName};

use super::safefs::{Owner, SafeDir};

/// The uid the egress proxy runs as, and owns its files with: `nobody` (65534) when runed is
/// root, else runed's own (which cannot give files away).
pub fn proxy_owner() -> Owner {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        Owner {
            uid: 65534,
            gid: 65534,
        }
    } else {
        Owner {
            uid,
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// Why the store refused (never holding a value).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The value is not one (empty, too long, a byte a header cannot carry).
    #[error("{0}")]
    Value(#[from] secrets::ValueError),
    /// The disk.
    #[error("secret store: {0}")]
    Io(#[from] io::Error),
}

/// One stored secret: its name and when it was last set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The name.
    pub name: SecretName,
    /// When it was set (the file's modification time).
    pub set_at: SystemTime,
}

/// The store under a data root.
#[derive(Debug, Clone)]
pub struct SecretStore {
    data_dir: PathBuf,
    owner: Owner,
}

impl SecretStore {
    /// The store of the data root `data_dir`, its files owned by `owner` (the proxy's user).
    pub fn new(data_dir: impl Into<PathBuf>, owner: Owner) -> Self {
        Self {
            data_dir: data_dir.into(),
            owner,
        }
    }

    /// Creates (or tightens) `egress/` (0700, the host's), `egress/secrets/` and `egress/ca/`
    /// (0700, the proxy's user). Nothing is followed: a link in their place is replaced.
    pub fn ensure(&self) -> io::Result<()> {
        let root = SafeDir::create_root(&self.data_dir)?;
        let egress = root.ensure_subdir_replacing(EGRESS, 0o700, None)?;
        egress.chmod(0o700)?;
        for rel in [EGRESS_SECRETS, EGRESS_CA] {
            let d = root.ensure_subdir_replacing(rel, 0o700, Some(self.owner))?;
            d.chown(self.owner)?;
            d.chmod(0o700)?;
        }
        Ok(())
    }

    fn dir(&self) -> io::Result<SafeDir> {
        self.ensure()?;
        SafeDir::open_root(&self.data_dir)?.subdir(EGRESS_SECRETS)
    }

    /// The secrets directory (a bind source of the proxy).
    pub fn secrets_dir(&self) -> PathBuf {
        self.data_dir.join(EGRESS_SECRETS)
    }

    /// The CA's directory (a bind source of the proxy).
    pub fn ca_dir(&self) -> PathBuf {
        self.data_dir.join(EGRESS_CA)
    }

    /// The bundle boxes trust (a bind source of boxes with brokered secrets).
    pub fn bundle_path(&self) -> PathBuf {
        self.data_dir.join(CA_BUNDLE)
    }

    /// Sets `name` to `value` (checked first), replacing any earlier value at once.
    pub fn set(&self, name: &SecretName, value: &[u8]) -> Result<(), StoreError> {
        secrets::check_value(value)?;
        self.dir()?
            .write_atomic(name.as_str(), value, 0o600, Some(self.owner))?;
        Ok(())
    }

    /// Removes `name`; whether it was there.
    pub fn remove(&self, name: &SecretName) -> Result<bool, StoreError> {
        Ok(self.dir()?.remove(name.as_str())?)
    }

    /// Whether `name` is set.
    pub fn contains(&self, name: &SecretName) -> bool {
        std::fs::symlink_metadata(self.secrets_dir().join(name.as_str())).is_ok_and(|m| m.is_file())
    }

    /// Every secret, by name (files whose names are not secret names, such as a write's
    /// temporary file, are not listed).
    pub fn list(&self) -> Result<Vec<Stored>, StoreError> {
        let dir = self.dir()?;
        let mut out: Vec<Stored> = dir
            .names()?
            .into_iter()
            .filter_map(|n| SecretName::parse(n.to_str()?).ok())
            .filter_map(|name| {
                let m = std::fs::symlink_metadata(dir.path().join(name.as_str())).ok()?;
                m.is_file().then(|| Stored {
                    name,
                    set_at: m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                })
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Writes the bundle boxes trust, if it changed (temporary file and rename: a box that
    /// has the old one mounted keeps it).
    pub fn write_bundle(&self, pem: &[u8]) -> io::Result<bool> {
        self.ensure()?;
        let egress = SafeDir::open_root(&self.data_dir)?.subdir(EGRESS)?;
        if egress
            .read("ca-bundle.pem", 16 << 20)
            .is_ok_and(|old| old == pem)
        {
            return Ok(false);
        }
        egress.write_atomic("ca-bundle.pem", pem, 0o644, None)?;
        Ok(true)
    }

    /// Whether the bundle is there.
    pub fn has_bundle(&self) -> bool {
        Path::new(&self.bundle_path()).is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn name(s: &str) -> SecretName {
        SecretName::parse(s).unwrap()
    }

    #[test]
    fn values_are_0600_files_of_the_proxy_user_listed_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let me = Owner {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        };
        let s = SecretStore::new(dir.path(), me);
        s.set(&name("GH_TOKEN"), b"ghp_one").unwrap();
        s.set(&name("GH_TOKEN"), b"ghp_two").unwrap();
        s.set(&name("NPM_TOKEN"), b"npm_x").unwrap();
        let f = std::fs::metadata(s.secrets_dir().join("GH_TOKEN")).unwrap();
        assert_eq!(f.permissions().mode() & 0o777, 0o600);
        assert_eq!(f.uid(), me.uid);
        assert_eq!(
            std::fs::read(s.secrets_dir().join("GH_TOKEN")).unwrap(),
            b"ghp_two"
        );
        for d in [dir.path().join("egress"), s.secrets_dir(), s.ca_dir()] {
            let m = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
            assert_eq!(m, 0o700, "{}", d.display());
        }
        let names: Vec<String> = s
            .list()
            .unwrap()
            .iter()
            .map(|x| x.name.to_string())
            .collect();
        assert_eq!(names, vec!["GH_TOKEN", "NPM_TOKEN"]);
        assert!(s.contains(&name("GH_TOKEN")));
        assert!(s.remove(&name("GH_TOKEN")).unwrap());
        assert!(!s.remove(&name("GH_TOKEN")).unwrap());
        assert!(!s.contains(&name("GH_TOKEN")));
        // A value a header cannot carry is refused, and the error does not hold it.
        let e = s.set(&name("X"), b"a\r\nb").unwrap_err().to_string();
        assert!(!e.contains("a\r\nb"), "{e}");
        assert!(!s.contains(&name("X")));
        // A link planted where the directory belongs is replaced, never written through.
        let outside = tempfile::tempdir().unwrap();
        std::fs::remove_dir_all(s.secrets_dir()).unwrap();
        std::os::unix::fs::symlink(outside.path(), s.secrets_dir()).unwrap();
        s.set(&name("GH_TOKEN"), b"ghp_three").unwrap();
        assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
        // The bundle is written when it changes.
        assert!(s.write_bundle(b"pem").unwrap());
        assert!(!s.write_bundle(b"pem").unwrap());
        assert!(s.has_bundle());
    }
}
