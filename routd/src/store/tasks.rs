//! Scheduled tasks.

use hako_shared::db::DbError;
use hako_shared::{ChatJid, GroupFolder};
use rusqlite::{OptionalExtension, params};

use super::Store;

/// Where a task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskState {
    /// Waiting for its next firing.
    Active,
    /// A one-off that fired.
    Done,
    /// Cancelled before it was done.
    Cancelled,
}

// The column's values.
hako_shared::wire_names!(TaskState {
    Active => "active",
    Done => "done",
    Cancelled => "cancelled",
});
hako_shared::wire_sql!(TaskState);

/// A scheduled task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// `task-<hex>`.
    pub id: hako_shared::ids::TaskId,
    /// The group it belongs to.
    pub folder: GroupFolder,
    /// The chat its prompt arrives in.
    pub chat_jid: ChatJid,
    /// The prompt.
    pub prompt: String,
    /// Its cron schedule; `None` for a one-off.
    pub cron: Option<String>,
    /// Unix ms of its next firing; `None` once it is over.
    pub next_at: Option<i64>,
    /// Where it stands.
    pub state: TaskState,
    /// How many times it fired.
    pub fired: i64,
    /// Unix ms of its last firing.
    pub last_fired_at: Option<i64>,
    /// The turn that scheduled it (or the operator).
    pub created_by: String,
    /// Unix ms.
    pub created_at: i64,
}

pub(super) const TASK_COLS: &str = "id, folder, chat_jid, prompt, cron, next_at, state, fired, last_fired_at, \
                         created_by, created_at";

pub(super) fn task_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
    Ok(TaskRow {
        id: r.get("id")?,
        folder: r.get("folder")?,
        chat_jid: r.get("chat_jid")?,
        prompt: r.get("prompt")?,
        cron: r.get("cron")?,
        next_at: r.get("next_at")?,
        state: r.get("state")?,
        fired: r.get("fired")?,
        last_fired_at: r.get("last_fired_at")?,
        created_by: r.get("created_by")?,
        created_at: r.get("created_at")?,
    })
}

impl Store {
    /// Adds a task.
    pub async fn add_task(&self, t: TaskRow) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO tasks (id, folder, chat_jid, prompt, cron, next_at, state, fired, \
                     last_fired_at, created_by, created_at, updated_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 0, NULL, ?8, ?9, ?9)",
                    params![
                        t.id,
                        t.folder,
                        t.chat_jid,
                        t.prompt,
                        t.cron,
                        t.next_at,
                        TaskState::Active.as_str(),
                        t.created_by,
                        t.created_at
                    ],
                )?;
                Ok(())
            })
            .await
    }

    /// A folder's tasks (only the active ones unless `all`), soonest first.
    pub async fn tasks(&self, folder: &str, all: bool) -> Result<Vec<TaskRow>, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TASK_COLS} FROM tasks WHERE folder = ?1 AND (?2 OR state = 'active') \
                     ORDER BY next_at IS NULL, next_at, id LIMIT 1000"
                ))?;
                let rows = st
                    .query_map(params![f, all], task_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// How many active tasks a folder has.
    pub async fn active_tasks(&self, folder: &str) -> Result<i64, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT count(*) FROM tasks WHERE folder = ?1 AND state = 'active'",
                    [f],
                    |r| r.get(0),
                )?)
            })
            .await
    }

    /// Cancels a folder's active task; `false` when it has none by that id.
    pub async fn cancel_task(&self, folder: &str, id: &str, now: i64) -> Result<bool, DbError> {
        let (f, id) = (folder.to_owned(), id.to_owned());
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE tasks SET state = 'cancelled', next_at = NULL, updated_at = ?3 \
                     WHERE id = ?1 AND folder = ?2 AND state = 'active'",
                    params![id, f, now],
                )? == 1)
            })
            .await
    }

    /// When the next active task is due.
    pub async fn next_task_at(&self) -> Result<Option<i64>, DbError> {
        self.db
            .call(|c| {
                Ok(c.query_row(
                    "SELECT min(next_at) FROM tasks WHERE state = 'active'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
    }

    /// Active tasks due at `now`, soonest first, at most 100.
    pub async fn due_tasks(&self, now: i64) -> Result<Vec<TaskRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TASK_COLS} FROM tasks WHERE state = 'active' AND next_at <= ?1 \
                     ORDER BY next_at LIMIT 100"
                ))?;
                let rows = st
                    .query_map([now], task_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Fires one due task in one transaction with its prompt's arrival: the prompt becomes an
    /// inbound `task` message (id `task:<id>:<due>`, so a firing is never appended twice),
    /// then a one-off is done and a cron task moves to its next firing after `now` (firings
    /// missed while routd was down fire once, not once each). Answers whether a prompt
    /// arrived. Without `append` the firing is skipped: the task only moves on.
    pub async fn fire_task(&self, t: TaskRow, now: i64, append: bool) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let due_at = t.next_at.unwrap_or(now);
                let id = format!("task:{}:{due_at}", t.id);
                let added = if !append {
                    0
                } else {
                    tx.execute(
                    "INSERT OR IGNORE INTO messages (id, chat_jid, direction, kind, sender, \
                     sender_name, content, timestamp, state, created_at) \
                     VALUES (?1, ?2, 'in', 'task', ?3, 'scheduled task', ?4, ?5, 'pending', ?5)",
                    params![id, t.chat_jid, format!("task:{}", t.id), t.prompt, now],
                    )?
                };
                if added == 1 {
                    tx.execute(
                        "INSERT INTO chats (jid, cursor, pending, updated_at) VALUES (?1, 0, 1, ?2) \
                         ON CONFLICT (jid) DO UPDATE SET updated_at = ?2, pending = pending + 1",
                        params![t.chat_jid, now],
                    )?;
                }
                let next = t
                    .cron
                    .as_deref()
                    .and_then(|expr| hako_shared::cron::Cron::parse(expr).ok())
                    .and_then(|cron| cron.next_after(now.max(due_at)));
                let state = if next.is_some() {
                    TaskState::Active
                } else {
                    TaskState::Done
                }
                .as_str();
                tx.execute(
                    "UPDATE tasks SET next_at = ?2, state = ?3, fired = fired + ?4, \
                     last_fired_at = ?5, updated_at = ?5 WHERE id = ?1 AND state = 'active'",
                    params![t.id, next, state, added as i64, now],
                )?;
                tx.commit()?;
                Ok(added == 1)
            })
            .await
    }

    /// One task by id.
    pub async fn task(&self, id: &str) -> Result<Option<TaskRow>, DbError> {
        let id = id.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {TASK_COLS} FROM tasks WHERE id = ?1"),
                    [&id],
                    task_row,
                )
                .optional()?)
            })
            .await
    }

    /// Tasks at or below `folder` (every folder when `None`), active ones only unless `all`,
    /// soonest first, at most 1000.
    pub async fn tasks_under(
        &self,
        folder: Option<String>,
        all: bool,
    ) -> Result<Vec<TaskRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TASK_COLS} FROM tasks WHERE (?1 IS NULL OR folder = ?1 \
                       OR substr(folder, 1, length(?1) + 1) = ?1 || '/') \
                     AND (?2 OR state = 'active') \
                     ORDER BY next_at IS NULL, next_at, id LIMIT 1000"
                ))?;
                let rows = st
                    .query_map(params![folder, all], task_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }
}
