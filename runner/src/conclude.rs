//! A run's end: the outcome decided, the log rendered, written and put in the report. The
//! containers are removed afterwards, by the caller, once it has recorded the report.

use std::time::{Duration, SystemTime};

use super::engine::labels;
use super::outcome::{Ending, decide};
use super::output::RunOutput;
use super::{LiveRun, RunEnd, RunReport, Runner, runlog};

impl Runner {
    /// Ends a run's supervision and reports it. The containers are left for
    /// [`Runner::remove_containers`], which the caller runs *after* it has recorded the
    /// report: a process killed between the two finds the run ended (and removes the
    /// leftover as an orphan), never an answered run without its container.
    pub(super) async fn conclude(
        &self,
        mut st: RunOutput,
        ending: Ending,
        live: &LiveRun,
    ) -> RunEnd {
        let run_id = &st.run_id.clone();
        live.ended.cancel();
        // Wait for in-flight steers to settle, then refuse new ones.
        *live.gate.write().await = false;
        let exit_code = match &ending {
            Ending::Exited(c) => Some(*c),
            Ending::TimedOut(c) | Ending::Killed(c) => *c,
            Ending::Failed { .. } => None,
        };
        let verdict = decide(&ending, &st.statuses());
        let ended_at = SystemTime::now();
        let log = st.render_log(&verdict, exit_code, ended_at);
        let log_file = match st.logs_dir(self.storage.root()) {
            Some(dir) => {
                let (stamp, run, text, keep) = (
                    hako_shared::time::compact(ended_at),
                    run_id.to_owned(),
                    log.clone(),
                    self.cfg.log_files,
                );
                tokio::task::spawn_blocking(move || {
                    runlog::write_file(&dir, &stamp, &run, &text, keep)
                })
                .await
                .ok()
                .and_then(|r| {
                    r.map_err(|e| tracing::warn!(run = %run_id, error = %e, "writing the run log"))
                        .ok()
                })
            }
            None => None,
        };
        if st.container_id.is_none() {
            st.container_id = live.container_id();
        }
        RunEnd::Finished(Box::new(RunReport {
            run_id: run_id.to_owned(),
            state: verdict.state,
            outcome: verdict.outcome,
            terminal: verdict.terminal,
            blocks: std::mem::take(&mut st.blocks),
            truncated: st.truncated,
            exit_code,
            error: verdict.error,
            log,
            log_file,
            container_id: st.container_id.take(),
            sidecars: st.sidecars,
            started_at: st.started_at,
            ended_at,
        }))
    }

    /// Removes a finished run's containers, its sidecars and its agent, together, and checks
    /// they are gone. Returns what could not be removed (a later orphan cleanup retries).
    pub async fn remove_containers(&self, report: &RunReport) -> Vec<String> {
        let t = self.cfg.docker_timeout;
        let run_id = &report.run_id;
        let sidecars = async {
            let mut errors = Vec::new();
            if !report.sidecars {
                return errors;
            }
            match self
                .engine
                .list(labels::INSTALL, Some(&self.cfg.install_id), t)
                .await
            {
                Ok(list) => {
                    let removals = list
                        .iter()
                        .filter(|c| {
                            c.run_id() == Some(run_id)
                                && c.labels.get(labels::ROLE).map(String::as_str) == Some("sidecar")
                        })
                        .map(|c| async move {
                            self.engine
                                .remove(&c.id, Some(Duration::from_secs(2)), t)
                                .await
                                .map_err(|e| format!("sidecar {}: {e}", c.id))
                        });
                    for r in futures_util::future::join_all(removals).await {
                        errors.extend(r.err());
                    }
                }
                Err(e) => errors.push(format!("listing sidecars: {e}")),
            }
            errors
        };
        let agent = async {
            match &report.container_id {
                Some(id) => self
                    .engine
                    .remove(id, None, t)
                    .await
                    .map_err(|e| format!("container {id}: {e}"))
                    .err(),
                None => None,
            }
        };
        let (mut errors, agent_error) = tokio::join!(sidecars, agent);
        errors.extend(agent_error);
        // The run's egress network, once its agent is gone (a network in use cannot go).
        if let Some(e) = &self.egress
            && let Err(err) = e.detach_run(run_id).await
        {
            errors.push(format!("egress network: {err}"));
        }
        for e in &errors {
            tracing::error!(run = %run_id, "cleanup: {e}");
        }
        errors
    }
}
