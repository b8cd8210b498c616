//! Talking to a live agent: a follow-up delivered exactly once (`steer`), and the request to
//! finish (`close`). Both go through the folder's follow-up drop (`input/`) and SIGUSR1.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use hako_shared::GroupFolder;
use hako_shared::contract::{CLOSE_FILE, FollowUp};
use hako_shared::layout::{self, FolderDir};

use super::docker::{self, DockerError};
use super::safefs::SafeDir;
use super::{LiveRun, RunError, Runner, SteerReport};

static STEER_SEQ: AtomicU64 = AtomicU64::new(0);

impl Runner {
    /// Sends follow-up `messages` to a live run, exactly once: the file is written under a
    /// temp name and renamed, the agent is woken with SIGUSR1, and the follow-up counts as
    /// delivered only if the agent takes (unlinks) the file. Otherwise the runner takes it
    /// back (its own unlink), reports it as not delivered, and no file is left behind. The
    /// one unlink that succeeds decides, so there is no double delivery and no loss.
    pub async fn steer(
        &self,
        live: &LiveRun,
        messages: &[String],
    ) -> Result<SteerReport, RunError> {
        let gate = live.gate.read().await;
        if !*gate || live.ended.is_cancelled() {
            return Err(RunError::NotLive(live.run_id.clone()));
        }
        let id = live
            .container_id()
            .ok_or_else(|| RunError::NotLive(live.run_id.clone()))?;
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
        let tmp = format!(".{name}.tmp");
        input.create_new(&tmp, &body, 0o644, None)?;
        input.rename(&tmp, &name)?;
        let reason;
        // An agent that has not written anything yet may not handle the signal: it finds the
        // file by polling.
        let woken = if live.has_spoken() {
            docker::signal(&self.docker, &id, "SIGUSR1", self.cfg.docker_timeout).await
        } else {
            Ok(())
        };
        if let Err(e) = woken {
            reason = Some(format!("could not signal the agent: {e}"));
        } else {
            let deadline = Instant::now() + self.cfg.steer_wait;
            loop {
                if input.kind(&name)?.is_none() {
                    return Ok(SteerReport {
                        delivered: true,
                        reason: None,
                    });
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
        drop(gate);
        // Take it back; if the agent won the race, it was delivered after all.
        if input.remove(&name)? {
            Ok(SteerReport {
                delivered: false,
                reason,
            })
        } else {
            Ok(SteerReport {
                delivered: true,
                reason: None,
            })
        }
    }

    /// Tells the agent to finish: drops `_close` and wakes it.
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
            match docker::signal(&self.docker, &id, "SIGUSR1", self.cfg.docker_timeout).await {
                // It ended meanwhile: nothing left to close.
                Ok(()) | Err(DockerError::NotRunning(_) | DockerError::NotFound(_)) => {}
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
