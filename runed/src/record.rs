//! What runed records of a run: its events as they come (into the store and out to
//! subscribers), and its end, whichever way it ends: the end recorded, then its spawn tokens
//! revoked, then its containers removed. The scheduler's runs (`daemon`) and re-adopted runs
//! (`recover`) end through here.

use std::sync::Arc;
use std::time::SystemTime;

use hako_shared::GroupFolder;
use hako_shared::auth::now_secs;
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::{Outcome, RunState, SessionEntry, SteerState};
use hako_shared::time::unix_millis;
use tokio::sync::mpsc;

use crate::state::{Event, INLINE_BLOCK, Shared};
use crate::store::EndRow;
use hako_runner::{FollowUpFate, RunEvent, RunReport};

/// Moves a run's events into the store and out to subscribers.
pub(crate) fn forward(
    sh: Arc<Shared>,
    run_id: RunId,
) -> (mpsc::Sender<RunEvent>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<RunEvent>(64);
    let h = tokio::spawn(async move {
        while let Some(ev) = rx.recv().await {
            match ev {
                RunEvent::Started {
                    container_id,
                    start,
                } => {
                    sh.metrics.started(start);
                    let now = unix_millis(SystemTime::now());
                    match sh.store.mark_running(&run_id, &container_id, now).await {
                        Ok(true) => {
                            hako_shared::failpoint::hit("runed.container.started");
                            sh.emit(Event::State {
                                run_id: run_id.clone(),
                                state: RunState::Running,
                            })
                        }
                        Ok(false) => {}
                        Err(e) => {
                            tracing::error!(run = %run_id, error = %e, "recording a start failed")
                        }
                    }
                }
                RunEvent::Block { index, block } => {
                    match sh.store.add_output(&run_id, index, &block).await {
                        Ok(()) => hako_shared::failpoint::hit("runed.output.recorded"),
                        Err(e) => {
                            tracing::error!(run = %run_id, error = %e, "storing output failed")
                        }
                    }
                    let small = [&block.result, &block.error, &block.new_session_id]
                        .iter()
                        .map(|f| f.as_ref().map_or(0, String::len))
                        .sum::<usize>()
                        <= INLINE_BLOCK;
                    sh.emit(Event::Output {
                        run_id: run_id.clone(),
                        index,
                        block: small.then_some(block),
                    });
                }
            }
        }
    });
    (tx, h)
}

/// Records a finished run in one transaction (its blocks, state and outcome, log and session),
/// then revokes its spawn tokens. Runs before its containers are removed.
pub(crate) async fn finalize(
    sh: &Shared,
    folder: &str,
    turn_id: &TurnId,
    session_id: &str,
    r: &RunReport,
) {
    let run_id = &r.run_id;
    let ended = unix_millis(r.ended_at);
    let started = r.started_at.map(unix_millis);
    if let Some(s) = r.started_at
        && let Ok(d) = r.ended_at.duration_since(s)
    {
        sh.metrics.duration.observe(d.as_secs_f64());
    }
    let f = EndRow {
        state: r.state,
        outcome: r.outcome,
        exit_code: r.exit_code,
        error: r.error.clone(),
        truncated: r.truncated,
        container_id: r.container_id.clone(),
        started_at: started,
        ended_at: ended,
    };
    let session = SessionEntry {
        id: 0,
        folder: folder.to_owned(),
        session_id: session_id.to_owned(),
        new_session_id: r.blocks.iter().rev().find_map(|b| b.new_session_id.clone()),
        run_id: run_id.to_owned(),
        turn_id: turn_id.clone(),
        outcome: r.outcome,
        at: ended,
    };
    settle_steers(sh, run_id, folder).await;
    let from = [RunState::Starting, RunState::Running];
    match sh
        .store
        .record_end(run_id, &from, f, r.blocks.clone(), r.log.clone(), session)
        .await
    {
        Ok(true) => {
            hako_shared::failpoint::hit("runed.run.ended");
            sh.metrics.ended(r.outcome);
            sh.emit(Event::State {
                run_id: run_id.to_owned(),
                state: r.state,
            });
        }
        Ok(false) => {}
        Err(e) => tracing::error!(run = %run_id, error = %e, "recording the end of a run failed"),
    }
    revoke_tokens(sh, run_id).await;
}

/// Removes a finished run's containers, once its end is on disk (a leftover after a crash
/// is an orphan that the next cleanup removes).
pub(crate) async fn remove_containers(sh: &Shared, report: &RunReport) {
    if let Ok(runner) = sh.runner() {
        runner.remove_containers(report).await;
    }
}

/// Ends a run that has no container to supervise (never started, lost its request, a hold,
/// gone after a restart), from any unfinished state, and revokes its spawn tokens.
pub(crate) async fn end_without_container(
    sh: &Shared,
    run_id: &RunId,
    state: RunState,
    outcome: Outcome,
    error: Option<String>,
) {
    let f = EndRow {
        state,
        outcome,
        exit_code: None,
        error,
        truncated: false,
        container_id: None,
        started_at: None,
        ended_at: unix_millis(SystemTime::now()),
    };
    if let Ok(Some(row)) = sh.store.get(run_id).await {
        settle_steers(sh, run_id, &row.folder).await;
    }
    let from = [RunState::Queued, RunState::Starting, RunState::Running];
    match sh.store.end_run(run_id, &from, f).await {
        Ok(true) => {
            sh.metrics.ended(outcome);
            sh.emit(Event::State {
                run_id: run_id.to_owned(),
                state,
            });
        }
        Ok(false) => {}
        Err(e) => tracing::error!(run = %run_id, error = %e, "recording the end of a run failed"),
    }
    revoke_tokens(sh, run_id).await;
}

/// Decides the fate of a run's follow-ups still placed, before its end is recorded: the run's
/// status never shows a terminal state with a follow-up undecided. Its agent is gone (or its
/// gate is shut), so what it has not taken by now is taken back. Idempotent (the files
/// decide), so a runed killed half-way settles the same way when it ends the run again.
pub(crate) async fn settle_steers(sh: &Shared, run_id: &RunId, folder: &str) {
    let placed: Vec<_> = match sh.store.steers(run_id).await {
        Ok(rows) => rows
            .into_iter()
            .filter(|r| r.state == SteerState::Placed)
            .collect(),
        Err(e) => {
            tracing::error!(run = %run_id, error = %e, "reading the run's follow-ups failed");
            return;
        }
    };
    if placed.is_empty() {
        return;
    }
    let (Ok(runner), Ok(folder)) = (sh.runner(), GroupFolder::new(folder)) else {
        tracing::error!(
            run = %run_id,
            "the run's follow-ups cannot be settled now (no runner); they are at the next start"
        );
        return;
    };
    let mut fates = Vec::with_capacity(placed.len());
    for r in placed {
        match runner.settle_followup(&folder, &r.file) {
            Ok(f) => fates.push((
                r.steer_id,
                match f {
                    FollowUpFate::Taken => SteerState::Taken,
                    FollowUpFate::Returned => SteerState::Returned,
                },
            )),
            Err(e) => {
                tracing::error!(run = %run_id, steer = r.steer_id, error = %e, "settling a follow-up failed")
            }
        }
    }
    let taken = fates
        .iter()
        .filter(|(_, s)| *s == SteerState::Taken)
        .count();
    tracing::info!(
        run = %run_id,
        taken,
        returned = fates.len() - taken,
        "follow-ups settled"
    );
    if let Err(e) = sh
        .store
        .decide_steers(run_id, fates, unix_millis(SystemTime::now()))
        .await
    {
        tracing::error!(run = %run_id, error = %e, "recording the follow-ups' fates failed");
    }
}

/// Revokes a run's spawn tokens; one that fails is retried by [`retry_revocations`].
pub(crate) async fn revoke_tokens(sh: &Shared, run_id: &RunId) {
    let jtis = match sh.store.live_tokens(run_id).await {
        Ok(j) => j,
        Err(e) => {
            tracing::error!(run = %run_id, error = %e, "listing spawn tokens failed");
            return;
        }
    };
    for jti in jtis {
        match sh.broker.revoke(&jti).await {
            Ok(()) => {
                let _ = sh.store.token_revoked(&jti, now_secs()).await;
            }
            // Retried by `retry_revocations` (GC, start) until it expires.
            Err(e) => {
                tracing::warn!(run = %run_id, jti, error = %e, "revoking a spawn token failed; retried later")
            }
        }
    }
}

/// Revokes spawn tokens whose revocation failed before (authd away, runed killed): every
/// unexpired, unrevoked token of a run that is over. Returns how many were revoked.
pub(crate) async fn retry_revocations(sh: &Shared) -> usize {
    let due = match sh.store.tokens_to_revoke(now_secs()).await {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "listing spawn tokens to revoke failed");
            return 0;
        }
    };
    let mut n = 0;
    for (jti, run_id) in due {
        match sh.broker.revoke(&jti).await {
            Ok(()) => {
                let _ = sh.store.token_revoked(&jti, now_secs()).await;
                n += 1;
            }
            Err(e) => {
                tracing::warn!(run = %run_id, jti, error = %e, "revoking a spawn token failed; retried later");
                break;
            }
        }
    }
    n
}
