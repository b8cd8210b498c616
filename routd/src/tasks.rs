//! Scheduled tasks fire here: at each due time the task's prompt arrives in its chat as an
//! inbound `task` message (which starts a turn like any message). The firing and the task's
//! next time are one transaction, keyed by the due time, so a task never fires twice, and a
//! cron task that missed firings while routd was down fires once at start, then keeps its
//! schedule.

use std::sync::Arc;
use std::time::Duration;

use crate::{Appended, Shared, now_ms};

/// The longest sleep without looking at the tasks (a clock jump is caught within it).
const MAX_SLEEP: Duration = Duration::from_secs(60);

/// Fires due tasks until routd stops.
pub(crate) async fn run(sh: Arc<Shared>) {
    loop {
        match sh.store.fire_due_tasks(now_ms()).await {
            Ok(chats) => {
                for chat in &chats {
                    tracing::info!(%chat, "a scheduled task fired");
                    sh.metrics.task_fired();
                    let _ = sh.appended.send(Appended {
                        chat: chat.as_str().into(),
                    });
                }
                if !chats.is_empty() {
                    sh.wake.notify_one();
                    // More may be due (a batch is at most 100).
                    continue;
                }
            }
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
