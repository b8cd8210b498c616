//! What the host writes into a group's directories before each run: `settings.json`, the
//! skills tree and its migrations, `.claude.json`, and the per-group env file.
//!
//! Session directories are writable by the agent, so every write here goes through
//! [`SafeDir`]: no planted symlink is ever followed.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde_json::json;
use sha2::{Digest, Sha256};

use hako_shared::GroupFolder;
use hako_shared::contract::MCP_SOCKET;
use hako_shared::runs::{SidecarSpec, Trust};

use super::safefs::{Owner, SafeDir};

/// Bound on any one bundled skill file.
const MAX_SKILL_FILE: u64 = 4 << 20;
/// Bound on the number of files copied from a bundle.
const MAX_SKILL_FILES: usize = 10_000;

/// The MCP server entry that reaches a unix socket through `socat` (for stdio-only agents).
fn socat_entry(socket: &str) -> serde_json::Value {
    json!({"command": "socat", "args": ["STDIO", format!("UNIX-CONNECT:{socket}")]})
}

/// The settings file in `.claude/`, written before every run.
pub const SETTINGS: &str = "settings.json";
/// The env file in the folder's env directory (`/workspace/env-dir/env`).
pub const ENV_FILE: &str = "env";

/// The socket of sidecar `name` inside the container.
pub fn sidecar_socket(name: &str) -> String {
    format!("{}/{name}.sock", super::mounts::SIDECAR_DIR)
}

/// Writes `.claude/settings.json` (every run): env for the agent's tools and the MCP servers.
pub fn write_settings(
    claude: &SafeDir,
    env: &BTreeMap<String, String>,
    sidecars: &[SidecarSpec],
    owner: Option<Owner>,
) -> io::Result<()> {
    let mut servers = serde_json::Map::new();
    servers.insert("arizuko".into(), socat_entry(MCP_SOCKET));
    for s in sidecars {
        servers.insert(s.name.clone(), socat_entry(&sidecar_socket(&s.name)));
    }
    let doc = json!({"env": env, "mcpServers": servers});
    let text = serde_json::to_vec_pretty(&doc).map_err(io::Error::other)?;
    claude.write_atomic(SETTINGS, &text, 0o644, owner)
}

/// Seeds `.claude.json` in the session home if missing, keyed by folder so that the agent's
/// user id hash is stable across runs.
pub fn seed_claude_json(
    home: &SafeDir,
    folder: &GroupFolder,
    owner: Option<Owner>,
) -> io::Result<bool> {
    let digest = Sha256::digest(folder.as_str().as_bytes());
    let user_id: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    // No project is marked trusted: Claude Code loads no settings from the workspace (the
    // agent writes there), and its print mode never asks.
    let doc = json!({
        "userID": user_id,
        "hasCompletedOnboarding": true,
    });
    let text = serde_json::to_vec_pretty(&doc).map_err(io::Error::other)?;
    home.create_new(".claude.json", &text, 0o644, owner)
}

fn read_version(raw: &[u8]) -> Option<u32> {
    std::str::from_utf8(raw).ok()?.trim().parse().ok()
}

/// What [`seed_skills`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SkillsReport {
    /// Files copied on first seeding.
    pub copied: usize,
    /// Migrations applied, by number.
    pub migrations: Vec<u32>,
}

/// Copies the bundled skills into `.claude/skills/` once (never overwriting a file), then
/// applies numbered migrations `migrations/NNN-desc.md` when the bundle's `MIGRATION_VERSION`
/// is higher than the installed one. A migration names the files it replaces with lines
/// `<!-- overwrite: relative/path -->`; those, and only those, are copied over.
pub fn seed_skills(
    bundle: &Path,
    claude: &SafeDir,
    owner: Option<Owner>,
) -> io::Result<SkillsReport> {
    let mut report = SkillsReport::default();
    let bundled_version = std::fs::read(bundle.join("MIGRATION_VERSION"))
        .ok()
        .and_then(|r| read_version(&r))
        .unwrap_or(0);
    let skills = claude.ensure_subdir_replacing("skills", 0o755, owner)?;
    let installed = match skills.read("MIGRATION_VERSION", 64) {
        Ok(raw) => read_version(&raw),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        // Not a regular file (a symlink, a directory): treat as not installed, copy nothing
        // over it; the agent broke its own skills, the host stays safe.
        Err(_) => Some(bundled_version),
    };
    let Some(installed) = installed else {
        let mut budget = MAX_SKILL_FILES;
        report.copied = copy_tree(bundle, &skills, owner, &mut budget)?;
        return Ok(report);
    };
    if bundled_version <= installed {
        return Ok(report);
    }
    let mut migrations: Vec<(u32, std::path::PathBuf)> =
        match std::fs::read_dir(bundle.join("migrations")) {
            Ok(rd) => rd
                .flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let num: u32 = name.split('-').next()?.parse().ok()?;
                    name.ends_with(".md").then_some((num, e.path()))
                })
                .collect(),
            Err(_) => Vec::new(),
        };
    migrations.sort();
    for (num, path) in migrations {
        if num <= installed || num > bundled_version {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        for rel in text.lines().filter_map(|l| {
            l.trim()
                .strip_prefix("<!-- overwrite:")?
                .strip_suffix("-->")
                .map(str::trim)
        }) {
            overwrite_one(bundle, &skills, rel, owner)?;
        }
        report.migrations.push(num);
    }
    skills.write_atomic(
        "MIGRATION_VERSION",
        format!("{bundled_version}\n").as_bytes(),
        0o644,
        owner,
    )?;
    Ok(report)
}

fn overwrite_one(
    bundle: &Path,
    skills: &SafeDir,
    rel: &str,
    owner: Option<Owner>,
) -> io::Result<()> {
    // The bundle is trusted, but a migration naming `../x` must not reach outside it.
    if rel
        .split('/')
        .any(|c| c == ".." || c == "." || c.is_empty())
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("migration path {rel:?} is invalid"),
        ));
    }
    let data = read_bounded(&bundle.join(rel))?;
    match rel.rsplit_once('/') {
        Some((dir, name)) => skills
            .ensure_subdir(dir, 0o755, owner)?
            .write_atomic(name, &data, 0o644, owner),
        None => skills.write_atomic(rel, &data, 0o644, owner),
    }
}

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if meta.len() > MAX_SKILL_FILE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: larger than {MAX_SKILL_FILE} bytes", path.display()),
        ));
    }
    std::fs::read(path)
}

fn copy_tree(
    src: &Path,
    dst: &SafeDir,
    owner: Option<Owner>,
    budget: &mut usize,
) -> io::Result<usize> {
    let mut copied = 0;
    let mut entries: Vec<_> = std::fs::read_dir(src)?.flatten().collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name().to_string_lossy().into_owned();
        let ft = e.file_type()?;
        if ft.is_dir() {
            let sub = dst.ensure_subdir_replacing(&name, 0o755, owner)?;
            copied += copy_tree(&e.path(), &sub, owner, budget)?;
        } else if ft.is_file() {
            if *budget == 0 {
                return Err(io::Error::other("skills bundle has too many files"));
            }
            *budget -= 1;
            if dst.create_new(&name, &read_bounded(&e.path())?, 0o644, owner)? {
                copied += 1;
            }
        }
    }
    Ok(copied)
}

/// Host variables that never reach a container, whatever a group asks for: provider keys
/// go through the gateway, hako's own credentials stay with hako.
const NEVER_PASSED: &[&str] = &[
    "ANTHROPIC_",
    "OPENAI_",
    "GEMINI_",
    "GOOGLE_API",
    "MISTRAL_",
    "GROQ_",
    "COHERE_",
    "AZURE_OPENAI",
    "AWS_",
    "AUTHD_",
    "HAKO_",
    "RUNED_",
    "ROUTD_",
    "DOCKER_",
];

/// Why the env file could not be written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EnvFileError {
    /// A name that is not an environment variable name.
    #[error("env_allowlist: {0:?} is not a valid variable name")]
    BadName(String),
    /// A variable that is never passed to containers.
    #[error(
        "env_allowlist: {0} is never passed to containers (provider keys go through the gateway)"
    )]
    Forbidden(String),
    /// `GH_TOKEN` for an untrusted group.
    #[error("env_allowlist: GH_TOKEN is only passed to trusted (main) groups")]
    GhTokenUntrusted,
}

/// Selects the variables a group may see: names in `allowlist`, present in `host`, never a
/// provider key or hako credential, `GH_TOKEN` only for main groups.
pub fn select_env(
    allowlist: &[String],
    host: &BTreeMap<String, String>,
    trust: Trust,
) -> Result<BTreeMap<String, String>, EnvFileError> {
    let mut out = BTreeMap::new();
    for name in allowlist {
        let valid = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .enumerate()
                .all(|(i, b)| b == b'_' || b.is_ascii_uppercase() || (i > 0 && b.is_ascii_digit()));
        if !valid {
            return Err(EnvFileError::BadName(name.clone()));
        }
        let upper_key =
            name.ends_with("_API_KEY") || name.ends_with("_SECRET") || name.contains("PASSWORD");
        if upper_key || NEVER_PASSED.iter().any(|p| name.starts_with(p)) {
            return Err(EnvFileError::Forbidden(name.clone()));
        }
        if name == "GH_TOKEN" && trust != Trust::Main {
            return Err(EnvFileError::GhTokenUntrusted);
        }
        if let Some(v) = host.get(name) {
            out.insert(name.clone(), v.clone());
        }
    }
    Ok(out)
}

/// Renders an env file: one `NAME='value'` line each, single-quoted for `sh`.
pub fn render_env_file(vars: &BTreeMap<String, String>) -> String {
    let mut s = String::from("# Written by runed before each run; read-only in the container.\n");
    for (k, v) in vars {
        s.push_str(k);
        s.push_str("='");
        s.push_str(&v.replace('\'', "'\\''"));
        s.push_str("'\n");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn settings_has_mcp_entries_and_no_symlink_follow() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SafeDir::create_root(&tmp.path().join("s")).unwrap();
        let claude = root.ensure_subdir(".claude", 0o755, None).unwrap();
        symlink(
            tmp.path().join("victim"),
            claude.path().join("settings.json"),
        )
        .unwrap();
        let sc = SidecarSpec {
            name: "fs".into(),
            image: "i".into(),
            command: vec![],
            memory: None,
            cpus: None,
        };
        let env = BTreeMap::from([("ARIZUKO_FOLDER".to_owned(), "a".to_owned())]);
        write_settings(&claude, &env, &[sc], None).unwrap();
        assert!(!tmp.path().join("victim").exists());
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(claude.path().join("settings.json")).unwrap())
                .unwrap();
        assert_eq!(
            v["mcpServers"]["arizuko"]["args"][1],
            "UNIX-CONNECT:/var/run/pub/arizuko/mcp.sock"
        );
        assert_eq!(
            v["mcpServers"]["fs"]["args"][1],
            "UNIX-CONNECT:/var/run/pub/arizuko/sidecars/fs.sock"
        );
        assert_eq!(v["env"]["ARIZUKO_FOLDER"], "a");
    }

    fn bundle(dir: &Path, version: u32) {
        std::fs::create_dir_all(dir.join("hako")).unwrap();
        std::fs::create_dir_all(dir.join("migrations")).unwrap();
        std::fs::write(dir.join("MIGRATION_VERSION"), format!("{version}\n")).unwrap();
        std::fs::write(dir.join("hako/SKILL.md"), format!("v{version}")).unwrap();
        std::fs::write(dir.join("hako/notes.md"), format!("notes v{version}")).unwrap();
        std::fs::write(
            dir.join("migrations/002-refresh-skill.md"),
            "Refresh.\n<!-- overwrite: hako/SKILL.md -->\n",
        )
        .unwrap();
    }

    #[test]
    fn skills_copy_once_then_migrate_only_named_files() {
        let tmp = tempfile::tempdir().unwrap();
        let b = tmp.path().join("bundle");
        bundle(&b, 1);
        let root = SafeDir::create_root(&tmp.path().join("home")).unwrap();
        let claude = root.ensure_subdir(".claude", 0o755, None).unwrap();
        let r = seed_skills(&b, &claude, None).unwrap();
        assert_eq!(r.copied, 4);
        let installed = claude.path().join("skills");
        // The operator edits a file; a reseed at the same version changes nothing.
        std::fs::write(installed.join("hako/notes.md"), "mine").unwrap();
        assert_eq!(
            seed_skills(&b, &claude, None).unwrap(),
            SkillsReport::default()
        );
        // A new bundle at version 2 applies migration 002: SKILL.md replaced, notes kept.
        bundle(&b, 2);
        let r = seed_skills(&b, &claude, None).unwrap();
        assert_eq!(r.migrations, vec![2]);
        assert_eq!(
            std::fs::read_to_string(installed.join("hako/SKILL.md")).unwrap(),
            "v2"
        );
        assert_eq!(
            std::fs::read_to_string(installed.join("hako/notes.md")).unwrap(),
            "mine"
        );
        assert_eq!(
            std::fs::read_to_string(installed.join("MIGRATION_VERSION"))
                .unwrap()
                .trim(),
            "2"
        );
    }

    #[test]
    fn skills_never_follow_planted_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let b = tmp.path().join("bundle");
        bundle(&b, 1);
        let victim = tmp.path().join("victim");
        std::fs::create_dir_all(&victim).unwrap();
        let root = SafeDir::create_root(&tmp.path().join("home")).unwrap();
        let claude = root.ensure_subdir(".claude", 0o755, None).unwrap();
        std::fs::create_dir_all(claude.path().join("skills")).unwrap();
        symlink(&victim, claude.path().join("skills/hako")).unwrap();
        // The planted link is replaced by a real directory, never followed.
        assert_eq!(seed_skills(&b, &claude, None).unwrap().copied, 4);
        assert!(
            std::fs::read_dir(&victim).unwrap().next().is_none(),
            "nothing written through it"
        );
        assert!(
            claude
                .path()
                .join("skills/hako")
                .symlink_metadata()
                .unwrap()
                .is_dir()
        );
        // A symlinked skills dir itself: the same.
        std::fs::remove_dir_all(claude.path().join("skills")).unwrap();
        symlink(&victim, claude.path().join("skills")).unwrap();
        assert_eq!(seed_skills(&b, &claude, None).unwrap().copied, 4);
        assert!(std::fs::read_dir(&victim).unwrap().next().is_none());
    }

    #[test]
    fn claude_json_seeded_once_and_stable() {
        let tmp = tempfile::tempdir().unwrap();
        let root = SafeDir::create_root(tmp.path()).unwrap();
        let f = GroupFolder::new("acme").unwrap();
        assert!(seed_claude_json(&root, &f, None).unwrap());
        std::fs::write(tmp.path().join(".claude.json"), "{\"mine\":1}").unwrap();
        assert!(!seed_claude_json(&root, &f, None).unwrap());
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(".claude.json")).unwrap(),
            "{\"mine\":1}"
        );
    }

    #[test]
    fn env_selection_rules() {
        let host = BTreeMap::from([
            ("GIT_AUTHOR_NAME".to_owned(), "Ann O'Neil".to_owned()),
            ("GH_TOKEN".to_owned(), "ghp_x".to_owned()),
            ("ANTHROPIC_API_KEY".to_owned(), "sk".to_owned()),
        ]);
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let sel = select_env(&names(&["GIT_AUTHOR_NAME", "TZ"]), &host, Trust::Untrusted).unwrap();
        assert_eq!(sel.len(), 1, "unset host vars are skipped");
        assert_eq!(
            render_env_file(&sel).lines().nth(1),
            Some("GIT_AUTHOR_NAME='Ann O'\\''Neil'")
        );
        assert_eq!(
            select_env(&names(&["GH_TOKEN"]), &host, Trust::Untrusted),
            Err(EnvFileError::GhTokenUntrusted)
        );
        assert!(
            select_env(&names(&["GH_TOKEN"]), &host, Trust::Main)
                .unwrap()
                .contains_key("GH_TOKEN")
        );
        for bad in [
            "ANTHROPIC_API_KEY",
            "OPENAI_BASE_URL",
            "AUTHD_SERVICE_KEY",
            "MY_API_KEY",
            "DB_PASSWORD",
        ] {
            assert!(
                matches!(
                    select_env(&names(&[bad]), &host, Trust::Main),
                    Err(EnvFileError::Forbidden(_))
                ),
                "{bad}"
            );
        }
        for bad in ["lower", "1X", "A-B", "", "A=B"] {
            assert!(
                matches!(
                    select_env(&names(&[bad]), &host, Trust::Main),
                    Err(EnvFileError::BadName(_))
                ),
                "{bad:?}"
            );
        }
    }
}
