//! Talking to a live agent: follow-ups (`steer`) and the request to close (`close`). Both go
//! through the folder's follow-up drop (`input/`) and SIGUSR1.
//!
//! A follow-up's fate is decided by one atomic file operation, never by who is still
//! listening: it is written under a temp name (`.<name>.tmp`, which agents skip), renamed to
//! `<name>` (now the agent may take it, by unlinking it), and when the run ends the host
//! renames what is left to `.<name>.back`. Exactly one of the agent's unlink and the host's
//! rename succeeds. Settling looks only at the files, so it can be done again after a crash
//! and gives the same answer: the temp name still there → never shown (returned); `<name>`
//! there → taken back now; `.<name>.back` there → taken back earlier; nothing there → the
//! agent took it. The `.back` files stay until the folder's next run empties `input/`, so
//! the answer holds until the caller has recorded it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::sync::RwLockReadGuard;
use tokio::time::Instant;

use hako_shared::GroupFolder;
use hako_shared::contract::{CLOSE_FILE, FollowUp};
use hako_shared::layout::{self, FolderDir};

use super::engine::EngineError;
use super::safefs::SafeDir;
use super::{LiveRun, RunError, Runner, SteerReport};

static STEER_SEQ: AtomicU64 = AtomicU64::new(0);

/// What became of a follow-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowUpFate {
    /// The agent took it (its unlink won).
    Taken,
    /// The agent never saw it, or the host took it back before the agent did.
    Returned,
}

/// A follow-up written under its temp name, invisible to the agent until
/// [`StagedFollowUp::publish`]. It holds the run's gate: the run cannot finish (and settle
/// its follow-ups) between staging and publishing, so a caller can record the name durably
/// in between.
pub struct StagedFollowUp<'a> {
    _gate: RwLockReadGuard<'a, bool>,
    live: &'a LiveRun,
    input: SafeDir,
    name: String,
}

impl StagedFollowUp<'_> {
    /// The name the agent will see.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Shows it to the agent (the rename) and wakes the agent. An agent that has not written
    /// anything yet may not handle the signal: it finds the file by polling.
    pub async fn publish(self, runner: &Runner) -> Result<(), RunError> {
        self.input.rename(&tmp_name(&self.name), &self.name)?;
        if self.live.has_spoken()
            && let Some(id) = self.live.container_id()
        {
            match runner
                .engine
                .signal(&id, "SIGUSR1", runner.cfg.docker_timeout)
                .await
            {
                // The poll finds it; a run that ended settles it.
                Ok(()) | Err(EngineError::NotRunning(_) | EngineError::NotFound(_)) => {}
                Err(e) => {
                    tracing::warn!(run = %self.live.run_id, error = %e, "could not wake the agent for a follow-up; its polling finds it")
                }
            }
        }
        Ok(())
    }

    /// Drops it unseen (another caller placed the same follow-up first).
    pub fn discard(self) {
        let _ = self.input.remove(&tmp_name(&self.name));
    }
}

fn tmp_name(name: &str) -> String {
    format!(".{name}.tmp")
}

fn back_name(name: &str) -> String {
    format!(".{name}.back")
}

impl Runner {
    /// Writes follow-up `messages` for a live run under a temp name. Fails with
    /// [`RunError::NotLive`] unless the run has started and not ended.
    pub async fn stage_followup<'a>(
        &self,
        live: &'a LiveRun,
        messages: &[String],
    ) -> Result<StagedFollowUp<'a>, RunError> {
        let gate = live.gate.read().await;
        if !*gate || live.ended.is_cancelled() || live.container_id().is_none() {
            return Err(RunError::NotLive(live.run_id.to_string()));
        }
        let input = self.input_dir(&live.folder)?;
        let ms = hako_shared::time::unix_millis(SystemTime::now());
        let name = format!(
            "{ms:013}-{:06}.json",
            STEER_SEQ.fetch_add(1, Ordering::Relaxed) % 1_000_000
        );
        let body = serde_json::to_vec(&FollowUp {
            content: messages.join("\n\n"),
        })
        .map_err(|e| RunError::Invalid(e.to_string()))?;
        input.create_new(&tmp_name(&name), &body, 0o644, None)?;
        Ok(StagedFollowUp {
            _gate: gate,
            live,
            input,
            name,
        })
    }

    /// Decides a follow-up's fate from the files alone (see the module's note): idempotent,
    /// so it is safe after a crash at any step. Call it once the agent can no longer be
    /// trusted to take it (its run ended) or to take it back early.
    pub fn settle_followup(
        &self,
        folder: &GroupFolder,
        name: &str,
    ) -> Result<FollowUpFate, RunError> {
        let input = match self.input_dir(folder) {
            Ok(d) => d,
            // No drop at all: nothing was ever shown there.
            Err(RunError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(FollowUpFate::Returned);
            }
            Err(e) => return Err(e),
        };
        if input.remove(&tmp_name(name))? {
            return Ok(FollowUpFate::Returned);
        }
        match input.rename(name, &back_name(name)) {
            Ok(()) => return Ok(FollowUpFate::Returned),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        if input.kind(&back_name(name))?.is_some() {
            Ok(FollowUpFate::Returned)
        } else {
            Ok(FollowUpFate::Taken)
        }
    }

    /// Sends follow-up `messages` to a live run and waits (at most `steer_wait`) for the
    /// agent to take them; what it did not take is taken back. For a caller that keeps no
    /// record (`hako chat`): runed places follow-ups and settles them when the run ends.
    pub async fn steer(
        &self,
        live: &LiveRun,
        messages: &[String],
    ) -> Result<SteerReport, RunError> {
        let staged = self.stage_followup(live, messages).await?;
        let name = staged.name().to_owned();
        let published = staged.publish(self).await;
        let input = self.input_dir(&live.folder)?;
        let mut reason = published
            .err()
            .map(|e| format!("could not place the follow-up: {e}"));
        if reason.is_none() {
            let deadline = Instant::now() + self.cfg.steer_wait;
            loop {
                if input.kind(&name)?.is_none() {
                    break;
                }
                if live.ended.is_cancelled() {
                    reason = Some("the run ended before the agent took the follow-up".into());
                    break;
                }
                if Instant::now() >= deadline {
                    reason = Some(format!(
                        "the agent did not take the follow-up within {:?}",
                        self.cfg.steer_wait
                    ));
                    break;
                }
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    () = live.ended.cancelled() => {}
                }
            }
        }
        Ok(match self.settle_followup(&live.folder, &name)? {
            FollowUpFate::Taken => SteerReport {
                delivered: true,
                reason: None,
            },
            FollowUpFate::Returned => SteerReport {
                delivered: false,
                reason,
            },
        })
    }

    /// Asks the agent to close: drops `_close` and wakes it.
    pub async fn close(&self, live: &LiveRun) -> Result<(), RunError> {
        if live.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        let input = self.input_dir(&live.folder)?;
        input.write_atomic(CLOSE_FILE, b"", 0o644, None)?;
        if let Some(id) = live.container_id()
            && !live.ended.is_cancelled()
            && live.has_spoken()
        {
            match self
                .engine
                .signal(&id, "SIGUSR1", self.cfg.docker_timeout)
                .await
            {
                // It ended meanwhile: nothing left to close.
                Ok(()) | Err(EngineError::NotRunning(_) | EngineError::NotFound(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// The folder's follow-up drop.
    fn input_dir(&self, folder: &GroupFolder) -> Result<SafeDir, RunError> {
        Ok(self
            .storage
            .root()
            .subdir(&layout::dir_rel(folder, FolderDir::Input))?)
    }
}
