//! Validation of a group's extra mounts against the operator's allowlist.
//!
//! The allowlist is a JSON file kept outside every directory a container can see:
//!
//! ```json
//! {
//!   "allowedRoots": [{"path": "/srv/projects", "allowReadWrite": true, "description": "…"}],
//!   "blockedPatterns": ["secret"],
//!   "nonMainReadOnly": true
//! }
//! ```
//!
//! Rules, in order: the requested host path must not hold `:` or a `..` component (no option
//! injection, no traversal); it is resolved (symlinks followed) *before* any check; the
//! resolved path must lie under a resolved allowed root; no component of it, and no entry
//! directly inside it, may match a blocked pattern (built-in credential names always apply);
//! the mount is read-only unless the request, the root and the group all allow writes.
//! A rejected mount fails the run with an error naming it: nothing is silently dropped.

use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use hako_shared::runs::{ExtraMount, Trust};

/// Credential and key names that are never mountable, whatever the allowlist says.
pub const BUILTIN_BLOCKED: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".gpg",
    ".aws",
    ".azure",
    ".gcloud",
    ".kube",
    ".docker",
    ".env",
    ".netrc",
    ".npmrc",
    ".pypirc",
    ".git-credentials",
    ".password-store",
    "credentials",
    "id_rsa",
    "id_dsa",
    "id_ecdsa",
    "id_ed25519",
    "private_key",
    ".pem",
    ".p12",
    ".pfx",
    "secrets",
];

/// One allowed root.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoot {
    /// The root directory.
    pub path: String,
    /// Whether mounts under it may be writable.
    #[serde(default)]
    pub allow_read_write: bool,
    /// Free text.
    #[serde(default)]
    pub description: String,
}

/// The allowlist file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Allowlist {
    /// Roots under which mounts may live.
    #[serde(default)]
    pub allowed_roots: Vec<AllowedRoot>,
    /// Extra blocked name patterns (substring of a path component).
    #[serde(default)]
    pub blocked_patterns: Vec<String>,
    /// Force every non-main group's mounts read-only.
    #[serde(default = "yes")]
    pub non_main_read_only: bool,
    /// Directories no extra mount may overlap (the data root), resolved.
    #[serde(skip)]
    pub protected: Vec<PathBuf>,
}

/// Whether one of two resolved paths contains the other.
fn overlap(a: &Path, b: &Path) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

fn yes() -> bool {
    true
}

/// Why a mount was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    /// No allowlist is configured, so no extra mount is allowed.
    #[error("extra mount {name:?}: no mount allowlist is configured (set HAKO_MOUNT_ALLOWLIST)")]
    NoAllowlist {
        /// The mount's name.
        name: String,
    },
    /// The allowlist could not be read or parsed.
    #[error("mount allowlist {path}: {reason}")]
    BadAllowlist {
        /// Its path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The request is malformed.
    #[error("extra mount {name:?}: {reason}")]
    Rejected {
        /// The mount's name.
        name: String,
        /// Why.
        reason: String,
    },
}

/// A mount that passed validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedMount {
    /// The resolved host path.
    pub source: PathBuf,
    /// The name under `/workspace/extra/`.
    pub name: String,
    /// Whether it is mounted read-only.
    pub readonly: bool,
    /// Whether write access was asked for but refused.
    pub forced_readonly: bool,
}

impl Allowlist {
    /// Loads the allowlist, refusing one that sits inside a directory containers can see.
    pub fn load(path: &Path, mounted_roots: &[&Path]) -> Result<Allowlist, MountError> {
        let bad = |reason: String| MountError::BadAllowlist {
            path: path.display().to_string(),
            reason,
        };
        let real = std::fs::canonicalize(path).map_err(|e| bad(e.to_string()))?;
        for root in mounted_roots {
            if let Ok(root) = std::fs::canonicalize(root)
                && real.starts_with(&root)
            {
                return Err(bad(format!(
                    "must live outside every mounted directory, but is under {}",
                    root.display()
                )));
            }
        }
        let text = std::fs::read_to_string(&real).map_err(|e| bad(e.to_string()))?;
        let mut list: Allowlist = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        list.protected = mounted_roots
            .iter()
            .map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.to_path_buf()))
            .collect();
        // A root that holds the data directory would let a mount expose every tenant.
        for r in &list.allowed_roots {
            let rp = std::fs::canonicalize(&r.path).unwrap_or_else(|_| PathBuf::from(&r.path));
            if let Some(p) = list.protected.iter().find(|p| overlap(&rp, p)) {
                return Err(bad(format!(
                    "allowed root {} overlaps the data directory {}",
                    r.path,
                    p.display()
                )));
            }
        }
        Ok(list)
    }

    /// Validates one requested mount for a group of `trust`.
    pub fn validate(
        &self,
        m: &ExtraMount,
        trust: Trust,
        home: Option<&Path>,
    ) -> Result<ValidatedMount, MountError> {
        let name = m.container_path.clone();
        let reject = |reason: String| MountError::Rejected {
            name: name.clone(),
            reason,
        };
        validate_name(&m.container_path).map_err(|r| reject(r.into()))?;
        let raw = &m.host_path;
        if raw.contains(':') {
            return Err(reject("host path contains ':'".into()));
        }
        if raw.contains('\0') {
            return Err(reject("host path contains a NUL byte".into()));
        }
        let expanded = expand_home(raw, home)
            .ok_or_else(|| reject("cannot expand '~': no home directory".into()))?;
        if !expanded.is_absolute() {
            return Err(reject(
                "host path must be absolute (or start with ~)".into(),
            ));
        }
        if expanded
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(reject("host path contains '..'".into()));
        }
        // Resolve symlinks first: every check below is on the real path.
        let real = std::fs::canonicalize(&expanded)
            .map_err(|e| reject(format!("cannot resolve {}: {e}", expanded.display())))?;
        if !real.is_dir() {
            return Err(reject(format!("{} is not a directory", real.display())));
        }
        let root = self
            .allowed_roots
            .iter()
            .filter_map(|r| {
                let rp = expand_home(&r.path, home)?;
                std::fs::canonicalize(rp).ok().map(|rp| (rp, r))
            })
            .filter(|(rp, _)| real.starts_with(rp))
            .max_by_key(|(rp, _)| rp.components().count())
            .ok_or_else(|| reject(format!("{} is outside every allowed root", real.display())))?;
        if let Some(p) = self.protected.iter().find(|p| overlap(&real, p)) {
            return Err(reject(format!(
                "{} overlaps the data directory {}",
                real.display(),
                p.display()
            )));
        }
        if let Some(hit) = self.blocked_in(&real) {
            return Err(reject(format!(
                "{} matches blocked pattern {hit:?}",
                real.display()
            )));
        }
        let entries = std::fs::read_dir(&real)
            .map_err(|e| reject(format!("cannot list {}: {e}", real.display())))?;
        for entry in entries.flatten().take(10_000) {
            let child = entry.file_name();
            let child = child.to_string_lossy();
            if let Some(hit) = self.blocked_name(&child) {
                return Err(reject(format!(
                    "{} contains {child:?}, which matches blocked pattern {hit:?}",
                    real.display()
                )));
            }
        }
        let group_may_write = trust == Trust::Main || !self.non_main_read_only;
        let writable = !m.readonly && root.1.allow_read_write && group_may_write;
        Ok(ValidatedMount {
            source: real,
            name,
            readonly: !writable,
            forced_readonly: !m.readonly && !writable,
        })
    }

    fn blocked_name(&self, component: &str) -> Option<String> {
        let lower = component.to_ascii_lowercase();
        BUILTIN_BLOCKED
            .iter()
            .map(|p| (*p).to_owned())
            .chain(self.blocked_patterns.iter().map(|p| p.to_ascii_lowercase()))
            .find(|p| !p.is_empty() && lower.contains(p.as_str()))
    }

    fn blocked_in(&self, path: &Path) -> Option<String> {
        path.components().find_map(|c| match c {
            Component::Normal(s) => self.blocked_name(&s.to_string_lossy()),
            _ => None,
        })
    }
}

/// Validates the name of an extra mount: one plain segment, so that the target is exactly
/// `/workspace/extra/<name>`.
pub fn validate_name(name: &str) -> Result<(), &'static str> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() > 64 {
        return Err("container path must be 1 to 64 characters");
    }
    if !b[0].is_ascii_alphanumeric()
        || !b
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c))
    {
        return Err(
            "container path must be one name of letters, digits, '.', '_' or '-' (no '/', ':' or '..')",
        );
    }
    Ok(())
}

fn expand_home(raw: &str, home: Option<&Path>) -> Option<PathBuf> {
    if raw == "~" {
        return home.map(Path::to_owned);
    }
    match raw.strip_prefix("~/") {
        Some(rest) => home.map(|h| h.join(rest)),
        None => Some(PathBuf::from(raw)),
    }
}

/// Validates every requested mount; the first rejection fails the whole set.
pub fn validate_all(
    allowlist: Option<&Allowlist>,
    mounts: &[ExtraMount],
    trust: Trust,
    home: Option<&Path>,
) -> Result<Vec<ValidatedMount>, MountError> {
    let mut out: Vec<ValidatedMount> = Vec::with_capacity(mounts.len());
    for m in mounts {
        let list = allowlist.ok_or_else(|| MountError::NoAllowlist {
            name: m.container_path.clone(),
        })?;
        let v = list.validate(m, trust, home)?;
        if out.iter().any(|o| o.name == v.name) {
            return Err(MountError::Rejected {
                name: v.name,
                reason: "two mounts with the same container path".into(),
            });
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    struct Fixture {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        ro_root: PathBuf,
        outside: PathBuf,
        list: Allowlist,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("projects");
        let ro_root = tmp.path().join("docs");
        let outside = tmp.path().join("outside");
        for d in [&root, &ro_root, &outside] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::create_dir_all(root.join("webapp")).unwrap();
        std::fs::create_dir_all(ro_root.join("manual")).unwrap();
        let list: Allowlist = serde_json::from_value(serde_json::json!({
            "allowedRoots": [
                {"path": root.to_str().unwrap(), "allowReadWrite": true},
                {"path": ro_root.to_str().unwrap(), "allowReadWrite": false}
            ],
            "blockedPatterns": ["topsecret"],
            "nonMainReadOnly": true
        }))
        .unwrap();
        Fixture {
            root,
            ro_root,
            outside,
            list,
            _tmp: tmp,
        }
    }

    fn req(host: &Path, name: &str, readonly: bool) -> ExtraMount {
        ExtraMount {
            host_path: host.to_string_lossy().into_owned(),
            container_path: name.into(),
            readonly,
        }
    }

    fn reason(e: MountError) -> String {
        e.to_string()
    }

    #[test]
    fn allows_inside_root_and_forces_read_only_where_needed() {
        let f = fixture();
        let ok = f
            .list
            .validate(
                &req(&f.root.join("webapp"), "webapp", false),
                Trust::Main,
                None,
            )
            .unwrap();
        assert!(!ok.readonly);
        let nonmain = f
            .list
            .validate(
                &req(&f.root.join("webapp"), "webapp", false),
                Trust::Untrusted,
                None,
            )
            .unwrap();
        assert!(
            nonmain.readonly && nonmain.forced_readonly,
            "non-main groups are read-only"
        );
        let ro = f
            .list
            .validate(
                &req(&f.ro_root.join("manual"), "m", false),
                Trust::Main,
                None,
            )
            .unwrap();
        assert!(
            ro.readonly && ro.forced_readonly,
            "root without write forces read-only"
        );
        let asked_ro = f
            .list
            .validate(&req(&f.root.join("webapp"), "w", true), Trust::Main, None)
            .unwrap();
        assert!(asked_ro.readonly && !asked_ro.forced_readonly);
    }

    #[test]
    fn symlink_escape_is_resolved_then_refused() {
        let f = fixture();
        symlink(&f.outside, f.root.join("escape")).unwrap();
        let e = reason(
            f.list
                .validate(&req(&f.root.join("escape"), "x", true), Trust::Main, None)
                .unwrap_err(),
        );
        assert!(e.contains("outside every allowed root"), "{e}");
    }

    #[test]
    fn blocked_patterns_apply_after_resolution() {
        let f = fixture();
        std::fs::create_dir_all(f.outside.join(".ssh")).unwrap();
        std::fs::create_dir_all(f.root.join("keys/.ssh")).unwrap();
        let e = reason(
            f.list
                .validate(
                    &req(&f.root.join("keys/.ssh"), "x", true),
                    Trust::Main,
                    None,
                )
                .unwrap_err(),
        );
        assert!(e.contains("blocked pattern \".ssh\""), "{e}");
        // A harmless-looking symlink to a credential directory inside the root.
        symlink(f.root.join("keys/.ssh"), f.root.join("innocent")).unwrap();
        let e = reason(
            f.list
                .validate(&req(&f.root.join("innocent"), "x", true), Trust::Main, None)
                .unwrap_err(),
        );
        assert!(e.contains(".ssh"), "{e}");
        // A directory holding a credential file is refused too.
        std::fs::create_dir_all(f.root.join("app")).unwrap();
        std::fs::write(f.root.join("app/.env"), "K=V").unwrap();
        let e = reason(
            f.list
                .validate(&req(&f.root.join("app"), "x", true), Trust::Main, None)
                .unwrap_err(),
        );
        assert!(e.contains("contains \".env\""), "{e}");
        std::fs::create_dir_all(f.root.join("TopSecret-plans")).unwrap();
        let e = reason(
            f.list
                .validate(
                    &req(&f.root.join("TopSecret-plans"), "x", true),
                    Trust::Main,
                    None,
                )
                .unwrap_err(),
        );
        assert!(e.contains("topsecret"), "{e}");
    }

    #[test]
    fn colon_dotdot_and_bad_names_are_refused() {
        let f = fixture();
        let colon = format!("{}/webapp:/etc:rw", f.root.display());
        let m = ExtraMount {
            host_path: colon,
            container_path: "x".into(),
            readonly: true,
        };
        assert!(reason(f.list.validate(&m, Trust::Main, None).unwrap_err()).contains("':'"));
        let dots = format!("{}/webapp/../webapp", f.root.display());
        let m = ExtraMount {
            host_path: dots,
            container_path: "x".into(),
            readonly: true,
        };
        assert!(reason(f.list.validate(&m, Trust::Main, None).unwrap_err()).contains("'..'"));
        for bad in ["../x", "a/b", "a:b", "", ".hidden", "x y"] {
            let e = f
                .list
                .validate(&req(&f.root.join("webapp"), bad, true), Trust::Main, None)
                .unwrap_err();
            assert!(matches!(e, MountError::Rejected { .. }), "{bad:?}");
        }
        let rel = ExtraMount {
            host_path: "relative/path".into(),
            container_path: "x".into(),
            readonly: true,
        };
        assert!(reason(f.list.validate(&rel, Trust::Main, None).unwrap_err()).contains("absolute"));
    }

    #[test]
    fn outside_root_and_missing_allowlist() {
        let f = fixture();
        let e = reason(
            f.list
                .validate(&req(&f.outside, "o", true), Trust::Main, None)
                .unwrap_err(),
        );
        assert!(e.contains("outside every allowed root"), "{e}");
        let e = validate_all(None, &[req(&f.root, "x", true)], Trust::Main, None).unwrap_err();
        assert!(matches!(e, MountError::NoAllowlist { .. }));
        assert!(
            validate_all(None, &[], Trust::Main, None)
                .unwrap()
                .is_empty()
        );
        let dup = [
            req(&f.root.join("webapp"), "x", true),
            req(&f.ro_root.join("manual"), "x", true),
        ];
        assert!(validate_all(Some(&f.list), &dup, Trust::Main, None).is_err());
    }

    #[test]
    fn tilde_expands_to_home() {
        let f = fixture();
        let home = f.root.clone();
        let m = ExtraMount {
            host_path: "~/webapp".into(),
            container_path: "w".into(),
            readonly: true,
        };
        let v = f.list.validate(&m, Trust::Main, Some(&home)).unwrap();
        assert_eq!(
            v.source,
            std::fs::canonicalize(f.root.join("webapp")).unwrap()
        );
    }

    #[test]
    fn allowlist_inside_a_mounted_dir_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let inside = data.join("allow.json");
        std::fs::write(&inside, "{}").unwrap();
        let e = Allowlist::load(&inside, &[&data]).unwrap_err();
        assert!(
            e.to_string().contains("outside every mounted directory"),
            "{e}"
        );
        let outside = tmp.path().join("allow.json");
        std::fs::write(&outside, r#"{"allowedRoots": [], "bogus": 1}"#).unwrap();
        assert!(
            Allowlist::load(&outside, &[&data]).is_err(),
            "unknown fields are refused"
        );
        std::fs::write(&outside, r#"{"allowedRoots": []}"#).unwrap();
        assert!(
            Allowlist::load(&outside, &[&data])
                .unwrap()
                .non_main_read_only
        );
        // A root that contains the data directory, or lies inside it, is refused at load;
        // a mount that reaches into it through a wider root, at validation.
        for root in [tmp.path(), &data.join("folders")] {
            let text = format!(r#"{{"allowedRoots": [{{"path": "{}"}}]}}"#, root.display());
            std::fs::write(&outside, text).unwrap();
            let e = Allowlist::load(&outside, &[&data]).unwrap_err().to_string();
            assert!(e.contains("overlaps the data directory"), "{e}");
        }
        std::fs::write(&outside, r#"{"allowedRoots": [{"path": "/"}]}"#).unwrap();
        let mut list: Allowlist =
            serde_json::from_str(r#"{"allowedRoots": [{"path": "/"}]}"#).unwrap();
        list.protected = vec![std::fs::canonicalize(&data).unwrap()];
        std::fs::create_dir_all(data.join("folders/a/workspace")).unwrap();
        let e = list
            .validate(
                &req(&data.join("folders/a/workspace"), "w", true),
                Trust::Main,
                None,
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("overlaps the data directory"), "{e}");
        let e = list
            .validate(&req(tmp.path(), "t", true), Trust::Main, None)
            .unwrap_err();
        assert!(e.to_string().contains("overlaps the data directory"), "{e}");
    }
}
