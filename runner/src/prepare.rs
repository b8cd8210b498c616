//! Preparing a run on the host, before any container exists: check what the group asks for,
//! create every bind source and mount point, hand the follow-up drop and the sidecar socket
//! directory over empty, seed the session (`settings.json`, `.claude.json`, skills) and write
//! the env file. It runs on a blocking thread.
//!
//! Everything here that touches a directory the agent can write goes through [`SafeDir`]
//! (no link followed) and never walks what the agent made: a failure is a terminal error of
//! this run that says what broke, never a crash and never a retry loop.

use std::collections::BTreeMap;

use hako_shared::layout::{self, FolderDir};
use hako_shared::runs::Network;

use super::mounts::{MountEntry, MountPlan};
use super::safefs::SafeDir;
use super::{RunError, RunSpec, Runner, mountsec, seed};

/// What preparation produced for the launch: mounts with host paths.
pub(super) struct Prepared {
    /// The agent's mounts.
    pub mounts: Vec<MountEntry>,
    /// Each sidecar's mounts.
    pub sidecar_mounts: Vec<MountEntry>,
    /// Something the agent left was put aside (a used follow-up drop or socket directory, a
    /// directory where the settings go): a box made before this had those mounted.
    pub replaced: bool,
}

impl Runner {
    pub(super) async fn prepare(&self, spec: &RunSpec) -> Result<Prepared, RunError> {
        let this = self.clone();
        let spec = spec.clone();
        tokio::task::spawn_blocking(move || this.prepare_blocking(&spec))
            .await
            .map_err(|e| RunError::Prepare(std::io::Error::other(e)))?
    }

    fn prepare_blocking(&self, spec: &RunSpec) -> Result<Prepared, RunError> {
        let cfg = &self.cfg;
        let g = &spec.group;
        g.validate()
            .map_err(|e| RunError::Invalid(format!("group: {e}")))?;
        if g.network == Network::Allowlist && self.egress.is_none() {
            // Fail closed: without the egress proxy an allowlist cannot be enforced.
            return Err(RunError::Invalid(
                "network \"allowlist\" needs the egress proxy, which is not configured (RUNED_EGRESS_IMAGE); use \"none\" or \"open\"".into(),
            ));
        }
        if !spec.brokered.is_empty() && g.network != Network::Allowlist {
            // Placeholders only mean something where the proxy sees the traffic.
            return Err(RunError::Invalid(
                "brokered secrets need network \"allowlist\"".into(),
            ));
        }
        for s in &g.sidecars {
            mountsec::validate_name(&s.name)
                .map_err(|r| RunError::Invalid(format!("sidecar {:?}: {r}", s.name)))?;
        }
        let extra = mountsec::validate_all(
            cfg.allowlist.as_ref(),
            &g.mounts,
            g.trust,
            cfg.home.as_deref(),
        )?;
        let extra: Vec<_> = extra
            .into_iter()
            .map(|m| (m.source, m.name, m.readonly))
            .collect();
        let vars = seed::select_env(&g.env_allowlist, &cfg.host_env, g.trust)?;
        let plan = MountPlan {
            layout: &cfg.layout,
            folder: &spec.folder,
            trust: g.trust,
            skills_dir: cfg.skills_dir.as_deref(),
            project_dir: cfg.project_dir.as_deref(),
            web_dir: cfg.web_dir.as_deref(),
            extra: &extra,
            ca_bundle: !spec.brokered.is_empty(),
        };
        let replaced = self
            .prepare_dirs(spec, &plan, &vars)
            .map_err(RunError::Prepare)?;
        let host = |v: Vec<MountEntry>| -> Vec<MountEntry> {
            v.into_iter()
                .map(|m| MountEntry {
                    source: cfg.layout.host_path(&m.source),
                    ..m
                })
                .collect()
        };
        Ok(Prepared {
            mounts: host(plan.mounts()),
            sidecar_mounts: host(plan.sidecar_mounts()),
            replaced,
        })
    }

    /// The host side of a run's directories. Every error here is the run's, terminal.
    /// Returns whether something the agent left was put aside.
    fn prepare_dirs(
        &self,
        spec: &RunSpec,
        plan: &MountPlan<'_>,
        vars: &BTreeMap<String, String>,
    ) -> std::io::Result<bool> {
        let cfg = &self.cfg;
        let g = &spec.group;
        let f = &spec.folder;
        let root = self.storage.root();
        let owner = self.owner();
        for d in plan.prep_dirs() {
            root.ensure_subdir_replacing(&d.rel, 0o755, if d.agent_owned { owner } else { None })?;
        }
        // Stale follow-ups, a `_close` and sockets of an earlier run must not reach this one;
        // whatever the agent left there goes to the trash whole.
        let mut discarded = false;
        for d in [FolderDir::Input, FolderDir::Sidecars] {
            let rel = layout::dir_rel(f, d);
            let before = root.subdir(&rel)?.is_empty()?;
            self.storage.fresh_dir(&rel, owner)?;
            discarded |= !before;
        }
        let home = root.subdir(&layout::dir_rel(f, FolderDir::Home))?;
        let claude = home.ensure_subdir_replacing(".claude", 0o755, owner)?;
        let settings_env = BTreeMap::from([
            ("ARIZUKO_FOLDER".to_owned(), f.to_string()),
            ("ARIZUKO_TURN_ID".to_owned(), spec.turn_text()),
            ("ARIZUKO_RUN_ID".to_owned(), spec.run_id.to_string()),
        ]);
        // A directory the agent put where the host writes its settings goes to the trash.
        if claude.kind(seed::SETTINGS)? == Some(rustix::fs::FileType::Directory) {
            self.storage.discard(&claude, seed::SETTINGS)?;
            discarded = true;
        }
        seed::write_settings(&claude, &settings_env, &g.sidecars, owner)?;
        seed::seed_claude_json(&home, f, owner)?;
        if let Some(bundle) = &cfg.skills_dir {
            let r = seed::seed_skills(bundle, &claude, owner)?;
            if r.copied > 0 || !r.migrations.is_empty() {
                tracing::info!(folder = %f, copied = r.copied, migrations = ?r.migrations, "skills seeded");
            }
        }
        let env_dir: SafeDir = root.subdir(&layout::dir_rel(f, FolderDir::Env))?;
        // Only the agent user (and root) can read it: it may hold a main group's GH_TOKEN.
        env_dir.write_atomic(
            seed::ENV_FILE,
            seed::render_env_file(vars).as_bytes(),
            0o600,
            owner,
        )?;
        if discarded {
            self.storage.schedule_reap();
        }
        Ok(discarded)
    }
}
