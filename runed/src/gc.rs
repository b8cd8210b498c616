//! Garbage collection on a schedule: finished runs with their output and logs, sessions,
//! audit rows and expired token records older than the retention are pruned; containers of
//! this install that belong to no unfinished run are removed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;

use hako_shared::auth::now_secs;
use hako_shared::time::unix_millis;

use crate::state::Shared;

/// One pass. Returns the rows pruned and containers removed.
pub(crate) async fn collect(sh: &Shared) -> (usize, usize) {
    let cutoff = unix_millis(SystemTime::now()) - sh.cfg.retention.as_millis() as i64;
    let rows = match sh.store.prune(cutoff, now_secs()).await {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "pruning runed.db failed");
            0
        }
    };
    let revoked = crate::record::retry_revocations(sh).await;
    if revoked > 0 {
        tracing::info!(revoked, "revoked spawn tokens whose revocation had failed");
    }
    // Only once re-adoption has run: before that, every container may still be someone's.
    if !sh.adopted.load(std::sync::atomic::Ordering::SeqCst) {
        return (rows, 0);
    }
    // Runs by id, and runs in warm boxes by their box (whose labels name no run).
    let keep: HashSet<String> = match sh.store.unfinished().await {
        Ok(r) => r
            .into_iter()
            .flat_map(|r| [Some(r.run_id.into_string()), r.container_id])
            .flatten()
            .collect(),
        Err(_) => return (rows, 0),
    };
    let Ok(runner) = sh.runner() else {
        return (rows, 0);
    };
    let removed = runner.cleanup_orphans(&keep).await.unwrap_or_else(|e| {
        tracing::warn!(error = %e, "removing orphaned containers failed");
        0
    });
    (rows, removed)
}

/// Runs [`collect`] every `gc_interval` until shutdown.
pub(crate) async fn gc_loop(sh: Arc<Shared>) {
    let mut tick = tokio::time::interval(sh.cfg.gc_interval);
    tick.tick().await;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = sh.stopping.cancelled() => return,
        }
        let (rows, removed) = collect(&sh).await;
        if rows + removed > 0 {
            tracing::info!(rows, removed, "gc");
        }
    }
}
