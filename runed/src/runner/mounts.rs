//! The data layout on the host and the mount table of an agent container: the one place
//! that says which host directory appears where, and how.
//!
//! | host | container | mode |
//! |---|---|---|
//! | `groups/<folder>/` | `/workspace/` (cwd) | rw |
//! | `groups/<world>/share/` | `/workspace/share/` | rw |
//! | `sessions/<folder>/` | `/home/agent/` ($HOME, holds `.claude/`) | rw |
//! | `ipc/<folder>/` | `/var/run/pub/arizuko/` | rw |
//! | `ipc/<folder>/input/` | `/workspace/ipc/input/` | rw |
//! | skills dir | `/skills/` | ro |
//! | `groups/<folder>/media/` | `/workspace/media/` | rw |
//! | web dir (optional) | `/workspace/web/` | ro |
//! | validated extra mounts | `/workspace/extra/<name>/` | ro unless allowed |
//! | `env/<folder>/` | `/workspace/env-dir/` | ro |
//! | project dir (main only) | `/workspace/project/` | ro |
//! | `groups/global/` (others) | `/workspace/global/` | ro |
//!
//! The agent runs as a non-root user whose `$HOME` is `/home/agent`, so the session directory
//! (the seed's `/root/`) is mounted there: that is where its tools look for `.claude/`.

use std::path::{Path, PathBuf};

use hako_shared::GroupFolder;
use hako_shared::runs::Trust;

/// The agent's home inside the container.
pub const HOME: &str = "/home/agent";
/// The agent's working directory.
pub const WORKSPACE: &str = "/workspace";

/// Directory names under the data root.
pub mod dirs {
    /// Group working directories.
    pub const GROUPS: &str = "groups";
    /// Per-group session state (`.claude/`).
    pub const SESSIONS: &str = "sessions";
    /// Per-group sockets and the follow-up drop.
    pub const IPC: &str = "ipc";
    /// Per-group env files.
    pub const ENV: &str = "env";
    /// Shared read-only memory of untrusted groups (under `groups/`).
    pub const GLOBAL: &str = "global";
    /// A world's shared directory (under `groups/<world>/`).
    pub const SHARE: &str = "share";
    /// The follow-up drop (under `ipc/<folder>/`).
    pub const INPUT: &str = "input";
    /// Sidecar sockets (under `ipc/<folder>/`).
    pub const SIDECARS: &str = "sidecars";
    /// Run logs (under `groups/<folder>/`).
    pub const LOGS: &str = "logs";
    /// Received media (under `groups/<folder>/`).
    pub const MEDIA: &str = "media";
}

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
    /// `groups/<folder>` relative to the data root.
    pub fn group_rel(folder: &GroupFolder) -> String {
        format!("{}/{folder}", dirs::GROUPS)
    }

    /// `<data>/<kind>/<folder>`.
    pub fn path(&self, kind: &str, folder: &GroupFolder) -> PathBuf {
        self.data_dir.join(kind).join(folder.as_str())
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
}

/// A directory the runner must create before the run, relative to the data root, and
/// whether the container's user should own it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrepDir {
    /// Path relative to the data root.
    pub rel: String,
    /// Owned by the agent user (writable by it) or by the host.
    pub agent_owned: bool,
}

impl MountPlan<'_> {
    /// The bind sources and mount points to create before the run. Mount points inside the
    /// workspace must exist, or Docker would create them as root.
    pub fn prep_dirs(&self) -> Vec<PrepDir> {
        let f = self.folder.as_str();
        let world = self.folder.world();
        let agent = |rel: String| PrepDir {
            rel,
            agent_owned: true,
        };
        let host = |rel: String| PrepDir {
            rel,
            agent_owned: false,
        };
        let g = format!("{}/{f}", dirs::GROUPS);
        let mut v = vec![
            agent(g.clone()),
            agent(format!("{g}/{}", dirs::MEDIA)),
            agent(format!("{g}/ipc/input")),
            agent(format!("{g}/env-dir")),
            agent(format!("{}/{world}/{}", dirs::GROUPS, dirs::SHARE)),
            agent(format!("{}/{f}", dirs::SESSIONS)),
            agent(format!("{}/{f}", dirs::IPC)),
            agent(format!("{}/{f}/{}", dirs::IPC, dirs::INPUT)),
            agent(format!("{}/{f}/{}", dirs::IPC, dirs::SIDECARS)),
            host(format!("{}/{f}", dirs::ENV)),
        ];
        if self.folder.world() != f {
            v.push(agent(format!("{g}/{}", dirs::SHARE)));
        }
        match self.trust {
            Trust::Main => {
                if self.project_dir.is_some() {
                    v.push(agent(format!("{g}/project")));
                }
            }
            Trust::Untrusted => {
                v.push(host(format!("{}/{}", dirs::GROUPS, dirs::GLOBAL)));
                v.push(agent(format!("{g}/{}", dirs::GLOBAL)));
            }
        }
        if self.web_dir.is_some() {
            v.push(agent(format!("{g}/web")));
        }
        for (_, name, _) in self.extra {
            v.push(agent(format!("{g}/extra/{name}")));
        }
        v
    }

    /// The mount table.
    pub fn mounts(&self) -> Vec<MountEntry> {
        let l = self.layout;
        let f = self.folder;
        let group = l.path(dirs::GROUPS, f);
        let ipc = l.path(dirs::IPC, f);
        let m = |source: PathBuf, target: &str, readonly: bool| MountEntry {
            source,
            target: target.to_owned(),
            readonly,
        };
        let mut v = vec![
            m(group.clone(), WORKSPACE, false),
            m(
                l.data_dir
                    .join(dirs::GROUPS)
                    .join(f.world())
                    .join(dirs::SHARE),
                "/workspace/share",
                false,
            ),
            m(l.path(dirs::SESSIONS, f), HOME, false),
            m(ipc.clone(), hako_shared::contract::SOCKET_DIR, false),
            m(
                ipc.join(dirs::INPUT),
                hako_shared::contract::INPUT_DIR,
                false,
            ),
            m(group.join(dirs::MEDIA), "/workspace/media", false),
            m(l.path(dirs::ENV, f), "/workspace/env-dir", true),
        ];
        if let Some(skills) = self.skills_dir {
            v.push(m(skills.to_owned(), "/skills", true));
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
                l.data_dir.join(dirs::GROUPS).join(dirs::GLOBAL),
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
        v
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

    #[test]
    fn untrusted_group_table() {
        let l = layout();
        let f = GroupFolder::new("acme/support").unwrap();
        let plan = MountPlan {
            layout: &l,
            folder: &f,
            trust: Trust::Untrusted,
            skills_dir: Some(Path::new("/app/skills")),
            project_dir: Some(Path::new("/app")),
            web_dir: None,
            extra: &[],
        };
        let v = plan.mounts();
        let ws = find(&v, "/workspace").unwrap();
        assert_eq!(
            (ws.source.to_str(), ws.readonly),
            (Some("/data/groups/acme/support"), false)
        );
        assert_eq!(
            find(&v, "/workspace/share").unwrap().source,
            Path::new("/data/groups/acme/share")
        );
        assert_eq!(
            find(&v, HOME).unwrap().source,
            Path::new("/data/sessions/acme/support")
        );
        assert_eq!(
            find(&v, "/var/run/pub/arizuko").unwrap().source,
            Path::new("/data/ipc/acme/support")
        );
        assert_eq!(
            find(&v, "/workspace/ipc/input").unwrap().source,
            Path::new("/data/ipc/acme/support/input")
        );
        assert!(find(&v, "/workspace/env-dir").unwrap().readonly);
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
        let plan = MountPlan {
            layout: &l,
            folder: &f,
            trust: Trust::Main,
            skills_dir: None,
            project_dir: Some(Path::new("/app")),
            web_dir: Some(Path::new("/app/web")),
            extra: &extra,
        };
        let v = plan.mounts();
        assert!(find(&v, "/workspace/project").unwrap().readonly);
        assert!(find(&v, "/workspace/global").is_none());
        assert!(find(&v, "/workspace/web").unwrap().readonly);
        assert!(!find(&v, "/workspace/extra/p").unwrap().readonly);
        let prep = plan.prep_dirs();
        assert!(
            prep.iter()
                .any(|d| d.rel == "groups/main/extra/p" && d.agent_owned)
        );
        assert!(prep.iter().any(|d| d.rel == "env/main" && !d.agent_owned));
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
            l.host_path(Path::new("/data/groups/a")),
            Path::new("/srv/hako/data/groups/a")
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
