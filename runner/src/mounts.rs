//! The mount table of an agent container: the one place that says which host directory
//! appears where, and how. Where each folder's directories live on the host is
//! [`hako_shared::layout`] (flat per-folder keys; read its isolation invariant first).
//!
//! | host (under the data dir) | container | mode |
//! |---|---|---|
//! | `folders/<key>/workspace/` | `/workspace/` (cwd) | rw |
//! | `shares/<world>/` | `/workspace/share/` | rw |
//! | `folders/<key>/home/` | `/home/agent/` ($HOME, holds `.claude/`) | rw |
//! | `folders/<key>/ipc/` | `/var/run/pub/arizuko/` | ro (connecting to a socket needs no write) |
//! | `folders/<key>/input/` | `/workspace/ipc/input/` | rw |
//! | `folders/<key>/sidecars/` | `/var/run/pub/arizuko/sidecars/` | rw |
//! | `folders/<key>/env/` | `/workspace/env-dir/` | ro |
//! | skills dir | `/skills/` | ro |
//! | web dir (optional) | `/workspace/web/` | ro |
//! | validated extra mounts | `/workspace/extra/<name>/` | ro unless allowed |
//! | project dir (main only, when configured) | `/workspace/project/` | ro |
//! | `global/` (others) | `/workspace/global/` | ro |
//! | `egress/ca-bundle.pem` (runs with brokered secrets) | `/etc/ssl/certs/ca-certificates.crt` | ro |
//!
//! The agent runs as a non-root user whose `$HOME` is `/home/agent`, so the session directory
//! (the seed's `/root/`) is mounted there: that is where its tools look for `.claude/`.
//! Received media live in the workspace (`/workspace/media/`), not in a mount of their own.

use std::path::{Path, PathBuf};

use hako_shared::GroupFolder;
use hako_shared::contract::{INPUT_DIR, SOCKET_DIR};
use hako_shared::layout::{self, FolderDir};
use hako_shared::runs::Trust;

/// The agent's home inside the container.
pub const HOME: &str = "/home/agent";
/// The agent's working directory.
pub const WORKSPACE: &str = "/workspace";
/// Where sidecar sockets appear, in the agent and in the sidecars.
pub const SIDECAR_DIR: &str = "/var/run/pub/arizuko/sidecars";
/// Received media, a directory of the workspace.
pub const MEDIA: &str = hako_shared::media::DIR;
/// Where a box with brokered secrets finds the CA bundle: Debian's own path, which curl,
/// OpenSSL, git and Python read even without the variables pointing at it.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// One bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountEntry {
    /// Local path of the source (as this process sees it).
    pub source: PathBuf,
    /// Path inside the container.
    pub target: String,
    /// Read-only?
    pub readonly: bool,
}

/// Where the host keeps things, and how to name them for the Docker daemon.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The data root as this process sees it.
    pub data_dir: PathBuf,
    /// The data root as the Docker daemon's host sees it (Docker-in-Docker), if different.
    pub host_data_dir: Option<PathBuf>,
    /// The application directory as this process sees it (project mount, skills).
    pub app_dir: PathBuf,
    /// The application directory as the host sees it, if different.
    pub host_app_dir: Option<PathBuf>,
}

impl Layout {
    /// A folder's directory, locally.
    pub fn dir(&self, folder: &GroupFolder, dir: FolderDir) -> PathBuf {
        self.data_dir.join(layout::dir_rel(folder, dir))
    }

    /// Translates a local path to the path the Docker daemon must use for a bind source.
    /// Paths under the data or app dir are rebased when `HOST_DATA_DIR` / `HOST_APP_DIR` are
    /// set; other paths (validated extra mounts) are already host paths.
    pub fn host_path(&self, local: &Path) -> PathBuf {
        let rebase = |from: &Path, to: &Option<PathBuf>| -> Option<PathBuf> {
            let to = to.as_ref()?;
            local.strip_prefix(from).ok().map(|rel| to.join(rel))
        };
        rebase(&self.data_dir, &self.host_data_dir)
            .or_else(|| rebase(&self.app_dir, &self.host_app_dir))
            .unwrap_or_else(|| local.to_owned())
    }
}

/// Everything the mount table depends on.
#[derive(Debug, Clone)]
pub struct MountPlan<'a> {
    /// The data layout.
    pub layout: &'a Layout,
    /// The group.
    pub folder: &'a GroupFolder,
    /// Its trust level.
    pub trust: Trust,
    /// Bundled skills, if any.
    pub skills_dir: Option<&'a Path>,
    /// The project directory mounted read-only into main groups.
    pub project_dir: Option<&'a Path>,
    /// Web assets, if any.
    pub web_dir: Option<&'a Path>,
    /// Validated extra mounts: `(resolved host path, name, readonly)`.
    pub extra: &'a [(PathBuf, String, bool)],
    /// The CA bundle, for a run with brokered secrets.
    pub ca_bundle: bool,
}

/// A directory the runner must create before the run, relative to the data root, and
/// whether the container's user should own it. Parents come before their children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepDir {
    /// Path relative to the data root.
    pub rel: String,
    /// Owned by the agent user (writable by it) or by the host.
    pub agent_owned: bool,
}

impl MountPlan<'_> {
    /// The bind sources and mount points to create before the run: the host-owned parents,
    /// every bind source, and the mount points inside writable mounts (Docker would create
    /// missing ones as root).
    pub fn prep_dirs(&self) -> Vec<PrepDir> {
        let agent = |rel: String| PrepDir {
            rel,
            agent_owned: true,
        };
        let host = |rel: String| PrepDir {
            rel,
            agent_owned: false,
        };
        let f = self.folder;
        let mut v = vec![
            host(layout::FOLDERS.to_owned()),
            host(layout::folder_rel(f)),
            host(layout::SHARES.to_owned()),
            agent(layout::share_rel(f)),
        ];
        for d in FolderDir::ALL {
            v.push(PrepDir {
                rel: layout::dir_rel(f, d),
                agent_owned: d.agent_owned(),
            });
        }
        if self.trust == Trust::Untrusted {
            v.push(host(layout::GLOBAL.to_owned()));
        }
        // Mount points inside the writable mounts, and the media directory.
        let ws = layout::dir_rel(f, FolderDir::Workspace);
        let ipc = layout::dir_rel(f, FolderDir::Ipc);
        for m in self.mounts() {
            let inside = |base: &str| {
                m.target
                    .strip_prefix(base)
                    .and_then(|r| r.strip_prefix('/'))
            };
            if let Some(rel) = inside(SOCKET_DIR) {
                // A mount point in the host's socket directory (the sidecars' sockets).
                v.push(host(format!("{ipc}/{rel}")));
            } else if let Some(rel) = inside(WORKSPACE) {
                // `ipc/input` needs `ipc` first; `extra/<name>` needs `extra`.
                if let Some((parent, _)) = rel.rsplit_once('/') {
                    v.push(agent(format!("{ws}/{parent}")));
                }
                v.push(agent(format!("{ws}/{rel}")));
            }
        }
        v.push(agent(format!("{ws}/{MEDIA}")));
        let mut seen = std::collections::HashSet::new();
        v.retain(|d| seen.insert(d.rel.clone()));
        v
    }

    /// The mount table of the agent container.
    pub fn mounts(&self) -> Vec<MountEntry> {
        let l = self.layout;
        let f = self.folder;
        let m = |source: PathBuf, target: &str, readonly: bool| MountEntry {
            source,
            target: target.to_owned(),
            readonly,
        };
        let mut v = vec![
            m(l.dir(f, FolderDir::Workspace), WORKSPACE, false),
            m(
                l.data_dir.join(layout::share_rel(f)),
                "/workspace/share",
                false,
            ),
            m(l.dir(f, FolderDir::Home), HOME, false),
            // Read-only even where the agent's uid owns the directory (a daemon not run as
            // root): it may connect to routd's sockets, never swap them or plant links.
            m(l.dir(f, FolderDir::Ipc), SOCKET_DIR, true),
            m(l.dir(f, FolderDir::Input), INPUT_DIR, false),
            m(l.dir(f, FolderDir::Sidecars), SIDECAR_DIR, false),
            m(l.dir(f, FolderDir::Env), "/workspace/env-dir", true),
        ];
        if let Some(skills) = self.skills_dir {
            v.push(m(skills.to_owned(), "/skills", true));
            v.push(m(
                skills.to_owned(),
                &format!("{}/skills", hako_shared::contract::SKILLS_PLUGIN_DIR),
                true,
            ));
        }
        if let Some(web) = self.web_dir {
            v.push(m(web.to_owned(), "/workspace/web", true));
        }
        match self.trust {
            // Project mounts are read-only: a writable one let an agent edit the host's code.
            Trust::Main => {
                if let Some(p) = self.project_dir {
                    v.push(m(p.to_owned(), "/workspace/project", true));
                }
            }
            Trust::Untrusted => v.push(m(
                l.data_dir.join(layout::GLOBAL),
                "/workspace/global",
                true,
            )),
        }
        for (source, name, readonly) in self.extra {
            v.push(m(
                source.clone(),
                &format!("/workspace/extra/{name}"),
                *readonly,
            ));
        }
        if self.ca_bundle {
            v.push(m(l.data_dir.join(layout::CA_BUNDLE), CA_BUNDLE, true));
        }
        v
    }

    /// The one mount of a sidecar container: the folder's sidecar socket directory.
    pub fn sidecar_mounts(&self) -> Vec<MountEntry> {
        vec![MountEntry {
            source: self.layout.dir(self.folder, FolderDir::Sidecars),
            target: SIDECAR_DIR.to_owned(),
            readonly: false,
        }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            data_dir: "/data".into(),
            host_data_dir: None,
            app_dir: "/app".into(),
            host_app_dir: None,
        }
    }

    fn find<'a>(v: &'a [MountEntry], target: &str) -> Option<&'a MountEntry> {
        v.iter().find(|m| m.target == target)
    }

    fn plan<'a>(l: &'a Layout, f: &'a GroupFolder, trust: Trust) -> MountPlan<'a> {
        MountPlan {
            layout: l,
            folder: f,
            trust,
            skills_dir: Some(Path::new("/app/skills")),
            project_dir: Some(Path::new("/srv/project")),
            web_dir: Some(Path::new("/app/web")),
            extra: &[],
            ca_bundle: false,
        }
    }

    #[test]
    fn untrusted_group_table() {
        let l = layout();
        let f = GroupFolder::new("acme/support").unwrap();
        let v = plan(&l, &f, Trust::Untrusted).mounts();
        let ws = find(&v, "/workspace").unwrap();
        assert_eq!(
            (ws.source.to_str(), ws.readonly),
            (Some("/data/folders/acme.support/workspace"), false)
        );
        assert_eq!(
            find(&v, "/workspace/share").unwrap().source,
            Path::new("/data/shares/acme")
        );
        assert_eq!(
            find(&v, HOME).unwrap().source,
            Path::new("/data/folders/acme.support/home")
        );
        assert_eq!(
            find(&v, "/var/run/pub/arizuko").unwrap().source,
            Path::new("/data/folders/acme.support/ipc")
        );
        assert_eq!(
            find(&v, "/workspace/ipc/input").unwrap().source,
            Path::new("/data/folders/acme.support/input")
        );
        assert!(find(&v, "/workspace/env-dir").unwrap().readonly);
        assert!(find(&v, "/var/run/pub/arizuko").unwrap().readonly);
        assert!(find(&v, "/skills").unwrap().readonly);
        assert!(find(&v, "/workspace/global").unwrap().readonly);
        assert!(
            find(&v, "/workspace/project").is_none(),
            "only main gets the project"
        );
        let targets: Vec<_> = v.iter().map(|m| m.target.as_str()).collect();
        let mut dedup = targets.clone();
        dedup.sort();
        dedup.dedup();
        assert_eq!(dedup.len(), targets.len(), "no target twice");
    }

    #[test]
    fn main_group_gets_project_read_only_and_no_global() {
        let l = layout();
        let f = GroupFolder::new("main").unwrap();
        let extra = vec![(PathBuf::from("/srv/p"), "p".to_owned(), false)];
        let mut p = plan(&l, &f, Trust::Main);
        p.extra = &extra;
        let v = p.mounts();
        assert!(find(&v, "/workspace/project").unwrap().readonly);
        assert!(find(&v, "/workspace/global").is_none());
        assert!(find(&v, "/workspace/web").unwrap().readonly);
        assert!(!find(&v, "/workspace/extra/p").unwrap().readonly);
        let prep = p.prep_dirs();
        let has =
            |rel: &str, agent: bool| prep.iter().any(|d| d.rel == rel && d.agent_owned == agent);
        assert!(has("folders/main/workspace/extra", true));
        assert!(has("folders/main/workspace/extra/p", true));
        assert!(has("folders/main/workspace/ipc/input", true));
        assert!(has("folders/main/ipc/sidecars", false));
        assert!(has("folders/main/ipc", false));
        assert!(has("folders/main/env", false));
        assert!(has("folders/main", false));
        assert!(has("folders", false));
        // Every prep dir comes after its parent (when the parent is prepared at all).
        for (i, d) in prep.iter().enumerate() {
            if let Some((parent, _)) = d.rel.rsplit_once('/')
                && let Some(j) = prep.iter().position(|p| p.rel == parent)
            {
                assert!(j < i, "{} before its parent", d.rel);
            }
        }
    }

    /// The isolation invariant, over every folder shape that once aliased or nested: no
    /// directory on the path to any bind source (of an agent or a sidecar, of any folder) lies
    /// inside a writable bind source of any folder, so no running container can swap
    /// anything on the way while Docker resolves the path; and no two folders share a
    /// private bind source.
    #[test]
    fn no_container_can_write_on_the_path_to_any_bind_source() {
        let l = layout();
        let names = [
            "a",
            "a/b",
            "a/b/c",
            "ab",
            "a/input",
            "a/env",
            "a/sidecars",
            "a/ipc",
            "a/share",
            "a/logs",
            "a/home",
            "a/workspace",
            "global",
            "share",
            "b",
            "b/a",
        ];
        let folders: Vec<GroupFolder> =
            names.iter().map(|n| GroupFolder::new(n).unwrap()).collect();
        let mut all: Vec<(String, MountEntry)> = Vec::new();
        for f in &folders {
            for trust in [Trust::Untrusted, Trust::Main] {
                let p = plan(&l, f, trust);
                for m in p.mounts().into_iter().chain(p.sidecar_mounts()) {
                    all.push((f.to_string(), m));
                }
            }
        }
        let writable: Vec<&PathBuf> = all
            .iter()
            .filter(|(_, m)| !m.readonly)
            .map(|(_, m)| &m.source)
            .collect();
        for (f, m) in &all {
            let mut dir = m.source.parent();
            while let Some(d) = dir {
                for w in &writable {
                    assert!(
                        !d.starts_with(w),
                        "{f}: {} lies on the path to {} and inside writable {}",
                        d.display(),
                        m.source.display(),
                        w.display()
                    );
                }
                dir = d.parent();
            }
        }
        // Private sources (everything but the world's share and the operator's dirs) are
        // never shared between folders, nor nested in one another.
        let private: Vec<(&String, &PathBuf)> = all
            .iter()
            .filter(|(_, m)| m.source.starts_with("/data/folders"))
            .map(|(f, m)| (f, &m.source))
            .collect();
        for (f, a) in &private {
            for (g, b) in &private {
                if f != g {
                    assert!(
                        !a.starts_with(b),
                        "{f}'s {} is inside {g}'s {}",
                        a.display(),
                        b.display()
                    );
                }
            }
        }
    }

    #[test]
    fn docker_in_docker_translation() {
        let l = Layout {
            data_dir: "/data".into(),
            host_data_dir: Some("/srv/hako/data".into()),
            app_dir: "/app".into(),
            host_app_dir: Some("/srv/hako/app".into()),
        };
        assert_eq!(
            l.host_path(Path::new("/data/folders/a/workspace")),
            Path::new("/srv/hako/data/folders/a/workspace")
        );
        assert_eq!(
            l.host_path(Path::new("/app/skills")),
            Path::new("/srv/hako/app/skills")
        );
        assert_eq!(
            l.host_path(Path::new("/srv/other")),
            Path::new("/srv/other")
        );
        assert_eq!(
            l.host_path(Path::new("/database")),
            Path::new("/database"),
            "prefix is by component"
        );
    }
}
