//! Re-adoption at start. runed leaves containers running when it stops; when it starts it
//! finds them by their install label: running ones are re-attached and finish normally, ones
//! that ended meanwhile have their output read back from the logs and their run finalized.
//! A run that was starting or running but has no container is decided from what it stored:
//! an answer on disk stands (its container was removed after the end was recorded, or was
//! lost after answering), and with none it fails as `fatal` (the caller retries the turn)
//! rather than run twice. Queued runs go back into the queue, unless their request carried
//! secrets (never stored): those fail as `fatal` too. Every way a run ends here revokes its
//! spawn tokens, and revocations that failed earlier are retried.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use hako_shared::GroupFolder;
use hako_shared::ids::RunId;
use hako_shared::runs::{Outcome, RunRequest, RunState, SpawnKind};
use hako_shared::time::unix_millis;
use tokio_util::sync::CancellationToken;

use crate::record::{
    end_without_container, finalize, forward, remove_containers, retry_revocations,
};
use crate::state::{HoldInfo, Live, Pending, Shared};
use crate::store::SpawnRow;
use hako_runner::outcome::{Ending, decide};
use hako_runner::{Adoption, LiveRun, RunControl, RunEnd};

async fn fail(sh: &Shared, row: &SpawnRow, why: &str) {
    end_without_container(
        sh,
        &row.run_id,
        RunState::Error,
        Outcome::Fatal,
        Some(why.to_owned()),
    )
    .await;
}

/// A starting or running run whose container is gone after a restart: what it stored
/// decides. An answer on disk stands and is never retried; with none the turn is retried.
async fn decide_from_stored(sh: &Shared, row: &SpawnRow) {
    let stored = sh.store.outputs(&row.run_id).await.unwrap_or_default();
    let statuses: Vec<_> = stored.iter().map(|b| b.status).collect();
    let why = if stored.is_empty() {
        "runed restarted and the run has no container: it never ran, or ended unrecorded; retry the turn"
    } else {
        "runed restarted after the run's container was gone; its stored output stands"
    };
    let v = decide(
        &Ending::Failed {
            error: why.into(),
            terminal: false,
        },
        &statuses,
    );
    end_without_container(sh, &row.run_id, v.state, v.outcome, Some(why.into())).await;
}

/// Restores the queue and re-adopts containers. Runs once, when Docker first answers.
pub(crate) async fn adopt_all(sh: &Arc<Shared>) {
    let rows = match sh.store.unfinished().await {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "reading unfinished runs failed; will retry");
            return;
        }
    };
    let Ok(runner) = sh.runner() else {
        return;
    };
    let containers = match runner.list_agents().await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "listing containers failed; will retry");
            return;
        }
    };
    let by_run: HashMap<String, String> = containers
        .iter()
        .filter(|c| !hako_runner::warm::is_warm(c))
        .filter_map(|c| c.run_id().map(|r| (r.to_owned(), c.id.clone())))
        .collect();
    // A run that took a warm box is found by the box its row names (the box's labels were
    // written before the run existed, and name no run).
    let warm_ids: HashSet<&str> = containers
        .iter()
        .filter(|c| hako_runner::warm::is_warm(c))
        .map(|c| c.id.as_str())
        .collect();
    let mut keep = HashSet::new();
    for row in rows {
        let folder = match GroupFolder::new(&row.folder) {
            Ok(f) => f,
            Err(_) => {
                fail(sh, &row, "invalid folder").await;
                continue;
            }
        };
        match (row.kind, row.state) {
            (SpawnKind::Hold, RunState::Queued | RunState::Running) => {
                let ttl = row
                    .request
                    .as_deref()
                    .and_then(|r| serde_json::from_str::<HoldInfo>(r).ok())
                    .map_or(sh.cfg.runner.run_timeout, |h| {
                        Duration::from_millis(h.ttl_ms)
                    });
                if row.state == RunState::Running {
                    // Give the released-or-expired logic a fresh start.
                    let _ = sh
                        .store
                        .transition(&row.run_id, &[RunState::Running], RunState::Queued)
                        .await;
                }
                sh.enqueue(
                    &row.run_id,
                    &row.folder,
                    SpawnKind::Hold,
                    Pending {
                        hold_ttl: ttl,
                        ..Pending::default()
                    },
                );
            }
            (_, RunState::Queued) => {
                let req = row
                    .request
                    .as_deref()
                    .and_then(|r| serde_json::from_str::<RunRequest>(r).ok());
                match req {
                    Some(_) if !row.had_secrets => sh.enqueue(
                        &row.run_id,
                        &row.folder,
                        SpawnKind::Run,
                        Pending::default(),
                    ),
                    Some(_) => {
                        fail(sh, &row, "runed restarted before the run started; its secrets are never stored, so it cannot start").await
                    }
                    None => fail(sh, &row, "the stored request is unreadable").await,
                }
            }
            (_, _) => {
                let warm = row
                    .container_id
                    .as_deref()
                    .filter(|cid| warm_ids.contains(cid));
                let cid = match (by_run.get(row.run_id.as_str()), warm) {
                    (Some(cid), _) => cid.clone(),
                    (None, Some(cid)) => {
                        keep.insert(cid.to_owned());
                        cid.to_owned()
                    }
                    (None, None) => {
                        decide_from_stored(sh, &row).await;
                        continue;
                    }
                };
                keep.insert(row.run_id.to_string());
                adopt_one(sh, row, cid, folder).await;
            }
        }
    }
    // Containers of this install with no unfinished run: leftovers, removed.
    match runner.cleanup_orphans(&keep).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(removed = n, "removed orphaned containers"),
        Err(e) => tracing::warn!(error = %e, "removing orphaned containers failed"),
    }
    let revoked = retry_revocations(sh).await;
    if revoked > 0 {
        tracing::info!(
            revoked,
            "revoked spawn tokens left over from before the restart"
        );
    }
    sh.adopted.store(true, Ordering::SeqCst);
    sh.wake.notify_one();
}

async fn adopt_one(sh: &Arc<Shared>, row: SpawnRow, container_id: String, folder: GroupFolder) {
    let control = RunControl {
        kill: CancellationToken::new(),
        detach: sh.stopping.child_token(),
    };
    adopt_with(sh, row, container_id, folder, control, true).await;
}

/// Re-attaches a run whose container runed lost sight of because Docker went away mid-run
/// (the run still holds its folder's slot, and keeps its `control`, so a kill asked for
/// during the outage applies as soon as it is re-attached). Waits until Docker answers
/// again; at shutdown it gives up and leaves the run to the next start's re-adoption.
pub(crate) async fn readopt_after_outage(
    sh: Arc<Shared>,
    run_id: RunId,
    container_id: String,
    control: RunControl,
) {
    loop {
        tokio::select! {
            () = sh.stopping.cancelled() => break,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if sh.probe_docker().await.is_ok() {
            break;
        }
    }
    let row = match sh.store.unfinished().await {
        Ok(rows) => rows.into_iter().find(|r| r.run_id == run_id),
        Err(e) => {
            tracing::error!(run = %run_id, error = %e, "reading the run to re-attach failed");
            None
        }
    };
    let folder = row.as_ref().and_then(|r| GroupFolder::new(&r.folder).ok());
    match (row, folder) {
        (Some(row), Some(folder)) if !sh.stopping.is_cancelled() => {
            adopt_with(&sh, row, container_id, folder, control, false).await;
        }
        // Stopping: the row stays unfinished and the next start re-adopts it.
        _ => sh.release(&run_id),
    }
}

/// Supervises `container_id` as `row`'s run to its end. `claim`: take the folder's slot
/// (at start); otherwise the run holds it already.
async fn adopt_with(
    sh: &Arc<Shared>,
    row: SpawnRow,
    container_id: String,
    folder: GroupFolder,
    control: RunControl,
    claim: bool,
) {
    let prior = sh.store.outputs(&row.run_id).await.unwrap_or_default();
    let live = LiveRun::new(row.run_id.clone(), folder.clone());
    {
        let mut s = sh.sched();
        if claim {
            s.queue.claim(&row.folder, SpawnKind::Run);
        }
        s.live.insert(
            row.run_id.clone(),
            Live {
                folder: row.folder.clone(),
                kind: SpawnKind::Run,
                control: control.clone(),
                run: live.clone(),
            },
        );
    }
    sh.metrics.adopted.inc();
    tracing::info!(run = %row.run_id, container = %container_id, "re-adopting");
    let a = Adoption {
        container_id,
        run_id: row.run_id.clone(),
        folder,
        prior,
        deadline_ms: row.deadline_at,
        close: match sh.cfg.runner.idle_timeout {
            Some(d) => hako_runner::CloseWhen::Idle(d),
            None => hako_runner::CloseWhen::Manual,
        },
    };
    let sh = sh.clone();
    tokio::spawn(async move {
        if row.state == RunState::Starting {
            // The container exists, so it started: record that before supervising.
            let _ = sh
                .store
                .mark_running(&row.run_id, &a.container_id, unix_millis(SystemTime::now()))
                .await;
        }
        let (tx, fwd) = forward(sh.clone(), row.run_id.clone());
        // Adoption only runs once the runner exists, and it is never dropped.
        let Ok(runner) = sh.runner() else {
            return;
        };
        let end = runner.adopt(a, tx, control, live).await;
        let _ = fwd.await;
        if let RunEnd::Finished(report) = end {
            finalize(&sh, &row.folder, &row.turn_id, &row.session_id, &report).await;
            remove_containers(&sh, &report).await;
        }
        sh.release(&row.run_id);
    });
}
