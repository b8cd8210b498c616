//! Scheduled tasks fire here: at each due time the task's prompt arrives in its chat as an
//! inbound `task` message (which starts a turn like any message). The firing and the task's
//! next time are one transaction, keyed by the due time, so a task never fires twice, and a
//! cron task that missed firings while routd was down fires once at start, then keeps its
//! schedule.

use std::sync::Arc;
use std::time::Duration;

use crate::state::{Shared, now_ms};

/// The longest sleep without looking at the tasks (a clock jump is caught within it).
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Fires the tasks due now; answers whether there were any. A task fires only while its
/// group exists and its chat still routes to that group: one that outlived either is
/// cancelled, never delivered to whoever owns the folder or the chat next.
async fn fire_due(sh: &Shared) -> Result<bool, hako_shared::db::DbError> {
    let now = now_ms();
    let due = sh.store.due_tasks(now).await?;
    let any = !due.is_empty();
    for t in due {
        let owned = sh.store.group(&t.folder).await?.is_some()
            && sh.routing.resolve(&t.chat_jid).as_deref() == Some(t.folder.as_str());
        if !owned {
            tracing::warn!(
                task = %t.id,
                folder = %t.folder,
                chat = %t.chat_jid,
                "a task whose group or chat is no longer its own: cancelled"
            );
            sh.store.cancel_task(&t.folder, &t.id, now).await?;
            continue;
        }
        let chat = t.chat_jid.clone();
        // A firing writes its prompt into the log: it counts against the group's bytes of the
        // day like the group's tools' writes, and past that bound it is skipped (the task
        // keeps its schedule), never written.
        let day = crate::gateway::utc_day(now);
        let fits = sh
            .store
            .add_group_write(
                &t.folder,
                &day,
                t.prompt.len() as u64,
                sh.cfg.group_bytes_per_day,
            )
            .await?;
        if !fits {
            tracing::warn!(
                task = %t.id,
                folder = %t.folder,
                "a task's firing skipped: its group wrote its bytes of the day (ROUTD_GROUP_MAX_BYTES_PER_DAY)"
            );
        }
        if sh.store.fire_task(t, now, fits).await? {
            tracing::info!(%chat, "a scheduled task fired");
            sh.metrics.task_fired();
            sh.chats.told(&chat, false);
        }
    }
    if any {
        sh.turns.wake.notify_one();
    }
    Ok(any)
}

/// Fires due tasks until routd stops.
pub(crate) async fn run(sh: Arc<Shared>) {
    loop {
        match fire_due(&sh).await {
            // More may be due (a batch is at most 100).
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "firing scheduled tasks failed; trying again"),
        }
        let wait = match sh.store.next_task_at().await {
            Ok(Some(at)) => Duration::from_millis((at - now_ms()).max(0) as u64).min(MAX_SLEEP),
            Ok(None) => MAX_SLEEP,
            Err(_) => Duration::from_secs(1),
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = sh.tasks_changed.notified() => {}
            () = sh.stopping.cancelled() => return,
        }
    }
}
