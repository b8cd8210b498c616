//! The host data layout: where every group folder's storage lives under `DATA_DIR`. runed's
//! container runner, routd (the per-turn sockets) and the `hako` CLI all find a folder's
//! directories through this module, and nowhere else.
//!
//! ```text
//! DATA_DIR/
//!   LAYOUT               "2": the layout version (an older layout is refused, not guessed at)
//!   folders/             host-owned, never mounted
//!     <key>/             host-owned, never mounted; one per folder, flat (see `folder_key`)
//!       workspace/       agent   /workspace (cwd)
//!       home/            agent   /home/agent ($HOME, holds .claude/)
//!       ipc/             host    /var/run/pub/arizuko (routd's sockets)
//!       input/           agent   /workspace/ipc/input (follow-ups)
//!       sidecars/        agent   /var/run/pub/arizuko/sidecars (sidecar sockets)
//!       env/             host    /workspace/env-dir (read-only)
//!       logs/            host    run logs, never mounted
//!   shares/              host-owned, never mounted
//!     <world>/           agent   /workspace/share of every folder of the world
//!   global/              host    /workspace/global of untrusted groups (read-only)
//!   trash/               host-owned, never mounted: agent-made trees moved aside to be deleted
//!   egress/              host-owned (0700), never mounted whole: the egress proxy's (runed makes it)
//!     secrets/           proxy   the operator's brokered secrets, one 0600 file each (proxy, read-only)
//!     ca/                proxy   the install's CA, made by the proxy (proxy, read-write)
//!     ca-bundle.pem      host    system roots + the CA's certificate (boxes with brokered secrets, read-only)
//! ```
//!
//! **The isolation invariant.** Every directory on the path from `DATA_DIR` to any bind
//! source (`folders/`, `folders/<key>/`, `shares/`) is host-owned and mounted into no
//! container, so no running container, of any folder, can rename, replace or link anything
//! on the way to another container's bind sources while Docker resolves them. Folders are
//! flat keys, not nested paths: a parent folder's storage does not contain its children's,
//! and no folder name can alias another folder's directory or one of the host's own names.
//! What a parent still shares with its children is only its world's `shares/<world>/`.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::folder::GroupFolder;

/// The file at the data root that names the layout version.
pub const VERSION_FILE: &str = "LAYOUT";
/// This layout's version, the content of [`VERSION_FILE`].
pub const VERSION: &str = "2";
/// Per-folder storage.
pub const FOLDERS: &str = "folders";
/// Per-world shared directories.
pub const SHARES: &str = "shares";
/// Shared read-only memory of untrusted groups.
pub const GLOBAL: &str = "global";
/// Agent-made trees waiting to be deleted.
pub const TRASH: &str = "trash";
/// The egress proxy's directory (`specs/egress.md`, Secrets).
pub const EGRESS: &str = "egress";
/// The operator's brokered secrets, relative to the data root.
pub const EGRESS_SECRETS: &str = "egress/secrets";
/// The proxy's CA, relative to the data root.
pub const EGRESS_CA: &str = "egress/ca";
/// What a box with brokered secrets trusts, relative to the data root.
pub const CA_BUNDLE: &str = "egress/ca-bundle.pem";
/// Top-level directory names of the old (version 1) layout, which nested folders inside one
/// another and is refused.
pub const OLD_LAYOUT: &[&str] = &["groups", "sessions", "ipc", "env"];

/// The directories of one folder, each directly under `folders/<key>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FolderDir {
    /// The group's working directory (`/workspace`).
    Workspace,
    /// The agent's home (`/home/agent`, holds `.claude/`).
    Home,
    /// Sockets the agent reaches (`mcp.sock`, `api.sock`).
    Ipc,
    /// The follow-up drop.
    Input,
    /// Sidecar sockets.
    Sidecars,
    /// The env file, read-only for the agent.
    Env,
    /// Run logs, host only.
    Logs,
}

impl FolderDir {
    /// Every directory of a folder.
    pub const ALL: [FolderDir; 7] = [
        FolderDir::Workspace,
        FolderDir::Home,
        FolderDir::Ipc,
        FolderDir::Input,
        FolderDir::Sidecars,
        FolderDir::Env,
        FolderDir::Logs,
    ];

    /// The directory's name under `folders/<key>/`.
    pub fn name(self) -> &'static str {
        match self {
            FolderDir::Workspace => "workspace",
            FolderDir::Home => "home",
            FolderDir::Ipc => "ipc",
            FolderDir::Input => "input",
            FolderDir::Sidecars => "sidecars",
            FolderDir::Env => "env",
            FolderDir::Logs => "logs",
        }
    }

    /// Whether the agent user owns (and can write) it. `ipc/` is the host's: routd binds the
    /// turn's sockets there, and an agent that could write it could swap them for its own or
    /// plant a link where routd creates one.
    pub fn agent_owned(self) -> bool {
        !matches!(self, FolderDir::Env | FolderDir::Logs | FolderDir::Ipc)
    }
}

/// Longest key kept readable; longer folders get a hashed key.
const MAX_PLAIN_KEY: usize = 200;

/// The flat directory name of a folder: its segments joined by `.` (`acme/support` →
/// `acme.support`). Segments never contain `.`, so the mapping is one-to-one. A folder whose
/// key would exceed 200 bytes (file names stop at 255) keeps its first 150 bytes, then `~`
/// and 32 hex digits of the SHA-256 of the whole name; `~` never appears in a plain key.
pub fn folder_key(folder: &GroupFolder) -> String {
    let plain = folder.as_str().replace('/', ".");
    if plain.len() <= MAX_PLAIN_KEY {
        return plain;
    }
    let digest = Sha256::digest(folder.as_str().as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    // The grammar is ASCII, so any byte index is a character boundary.
    format!("{}~{hex}", &plain[..150])
}

/// `folders/<key>`, relative to the data root.
pub fn folder_rel(folder: &GroupFolder) -> String {
    format!("{FOLDERS}/{}", folder_key(folder))
}

/// `folders/<key>/<dir>`, relative to the data root.
pub fn dir_rel(folder: &GroupFolder, dir: FolderDir) -> String {
    format!("{}/{}", folder_rel(folder), dir.name())
}

/// `shares/<world>`, relative to the data root.
pub fn share_rel(folder: &GroupFolder) -> String {
    format!("{SHARES}/{}", folder.world())
}

/// The data root and the paths below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataLayout {
    root: PathBuf,
}

impl DataLayout {
    /// The layout under `root` (`DATA_DIR`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The data root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A folder's directory.
    pub fn dir(&self, folder: &GroupFolder, dir: FolderDir) -> PathBuf {
        self.root.join(dir_rel(folder, dir))
    }

    /// The world's shared directory of a folder.
    pub fn share(&self, folder: &GroupFolder) -> PathBuf {
        self.root.join(share_rel(folder))
    }

    /// `global/`.
    pub fn global(&self) -> PathBuf {
        self.root.join(GLOBAL)
    }

    /// routd's MCP socket for a folder's turns (the agent sees it at `contract::MCP_SOCKET`).
    pub fn mcp_socket(&self, folder: &GroupFolder) -> PathBuf {
        self.dir(folder, FolderDir::Ipc).join("mcp.sock")
    }

    /// routd's LLM gateway socket for a folder's turns (`contract::API_SOCKET` inside).
    pub fn api_socket(&self, folder: &GroupFolder) -> PathBuf {
        self.dir(folder, FolderDir::Ipc).join("api.sock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn f(s: &str) -> GroupFolder {
        GroupFolder::new(s).unwrap()
    }

    #[test]
    fn keys_are_flat_and_distinct() {
        assert_eq!(folder_key(&f("acme")), "acme");
        assert_eq!(folder_key(&f("acme/support")), "acme.support");
        let names = [
            "a",
            "a/b",
            "ab",
            "a/b/c",
            "a/bc",
            "ab/c",
            "a/input",
            "a/env",
            "a/sidecars",
        ];
        let keys: HashSet<String> = names.iter().map(|n| folder_key(&f(n))).collect();
        assert_eq!(keys.len(), names.len());
        for k in &keys {
            assert!(!k.contains('/'), "{k}");
        }
    }

    #[test]
    fn long_folders_get_a_hashed_key_under_the_name_limit() {
        let seg = "x".repeat(64);
        let long = [seg.as_str(); 8].join("/");
        let other = format!("{}/y", [seg.as_str(); 7].join("/"));
        let (k1, k2) = (folder_key(&f(&long)), folder_key(&f(&other)));
        assert!(k1.len() <= 255 && k1.contains('~'), "{k1}");
        assert_ne!(k1, k2);
        assert!(!folder_key(&f("a/b")).contains('~'));
    }

    #[test]
    fn paths_go_through_the_flat_key() {
        let l = DataLayout::new("/data");
        let ab = f("acme/support");
        assert_eq!(
            l.dir(&ab, FolderDir::Workspace),
            Path::new("/data/folders/acme.support/workspace")
        );
        assert_eq!(l.share(&ab), Path::new("/data/shares/acme"));
        assert_eq!(
            l.mcp_socket(&ab),
            Path::new("/data/folders/acme.support/ipc/mcp.sock")
        );
        let names: HashSet<&str> = FolderDir::ALL.iter().map(|d| d.name()).collect();
        assert_eq!(names.len(), FolderDir::ALL.len());
    }
}
