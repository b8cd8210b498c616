//! Groups, the agent's session per group and chat, and what each group's turns wrote per
//! day.

use hako_shared::GroupFolder;
use hako_shared::approvals::ApprovalPolicy;
use hako_shared::chat::ChatSession;
use hako_shared::db::DbError;
use hako_shared::runs::GroupSpec;
use rusqlite::{OptionalExtension, params};

use super::{Store, json_column, json_text};

/// A group row.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow {
    /// Folder.
    pub folder: GroupFolder,
    /// Name.
    pub name: String,
    /// System prompt.
    pub system_prompt: String,
    /// Its tool grants (empty: every tool).
    pub grants: Vec<String>,
    /// Its container settings.
    pub spec: GroupSpec,
    /// Who approves its held calls, and how long they wait.
    pub approvals: ApprovalPolicy,
    /// Unix ms.
    pub updated_at: i64,
    /// Who set its settings last.
    pub set_by: SetBy,
}

/// Who set a group's settings: it decides who may delete the group and who may change it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetBy {
    /// An unbound caller: the group is the operator's policy. A tenant can rename it, never
    /// delete it (re-making it by name would shed that policy), and a main group's
    /// `register_group` cannot replace it.
    Operator,
    /// A folder-bound caller made it below its folder (from its nearest ancestor's settings).
    Tenant,
    /// A main group's agent made it (`register_group`).
    Agent,
}

hako_shared::wire_names!(SetBy {
    Operator => "operator",
    Tenant => "tenant",
    Agent => "agent",
});
hako_shared::wire_sql!(SetBy);

/// The columns [`group_row`] reads, by name.
pub(super) const GROUP_COLUMNS: &str =
    "folder, name, system_prompt, grants, spec, approvals, updated_at, set_by";

/// A group, its JSON columns parsed here and nowhere else. A column that does not parse is
/// an error, never a default: unreadable grants read as `[]` would grant every tool.
pub(super) fn group_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GroupRow> {
    Ok(GroupRow {
        folder: r.get("folder")?,
        name: r.get("name")?,
        system_prompt: r.get("system_prompt")?,
        grants: json_column(r, "groups", "grants")?,
        spec: json_column(r, "groups", "spec")?,
        approvals: json_column(r, "groups", "approvals")?,
        updated_at: r.get("updated_at")?,
        set_by: r.get("set_by")?,
    })
}

impl Store {
    /// Creates or replaces a group.
    pub async fn put_group(&self, g: GroupRow) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let existed: bool = c
                    .query_row(
                        "SELECT 1 FROM groups WHERE folder = ?1",
                        [&g.folder],
                        |_| Ok(true),
                    )
                    .optional()?
                    .unwrap_or(false);
                c.execute(
                    "INSERT INTO groups (folder, name, system_prompt, grants, spec, approvals, \
                     updated_at, set_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) ON CONFLICT \
                     (folder) DO UPDATE SET name = ?2, system_prompt = ?3, grants = ?4, \
                     spec = ?5, approvals = ?6, updated_at = ?7, set_by = ?8",
                    params![
                        g.folder,
                        g.name,
                        g.system_prompt,
                        json_text(&g.grants)?,
                        json_text(&g.spec)?,
                        json_text(&g.approvals)?,
                        g.updated_at,
                        g.set_by.as_str(),
                    ],
                )?;
                Ok(!existed)
            })
            .await
    }

    /// One group.
    pub async fn group(&self, folder: &str) -> Result<Option<GroupRow>, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {GROUP_COLUMNS} FROM groups WHERE folder = ?1"),
                    [&f],
                    group_row,
                )
                .optional()?)
            })
            .await
    }

    /// Every group, by folder.
    pub async fn groups(&self) -> Result<Vec<GroupRow>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {GROUP_COLUMNS} FROM groups ORDER BY folder"
                ))?;
                let rows = st
                    .query_map([], group_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Removes a group (and its session and routes); `false` if there was none.
    pub async fn delete_group(&self, folder: &str) -> Result<bool, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let n = tx.execute("DELETE FROM groups WHERE folder = ?1", [&f])?;
                tx.execute("DELETE FROM chat_sessions WHERE folder = ?1", [&f])?;
                // A group's tasks go with it: they must never fire into whoever owns the
                // folder or the chat next.
                tx.execute(
                    "UPDATE tasks SET state = 'cancelled', next_at = NULL \
                     WHERE folder = ?1 AND state = 'active'",
                    [&f],
                )?;
                tx.execute("DELETE FROM routes WHERE folder = ?1", [&f])?;
                tx.commit()?;
                Ok(n == 1)
            })
            .await
    }

    /// The agent session of a chat in a folder (sessions are never shared between chats).
    pub async fn session(&self, folder: &str, chat: &str) -> Result<Option<String>, DbError> {
        let (f, ch) = (folder.to_owned(), chat.to_owned());
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT session_id FROM chat_sessions WHERE folder = ?1 AND chat_jid = ?2",
                    [&f, &ch],
                    |r| r.get(0),
                )
                .optional()?)
            })
            .await
    }

    /// Sets (`Some`) or clears (`None`, `/new`) a chat's agent session in a folder.
    pub async fn set_session(
        &self,
        folder: &str,
        chat: &str,
        session: Option<String>,
        now: i64,
    ) -> Result<(), DbError> {
        let (f, ch) = (folder.to_owned(), chat.to_owned());
        self.db
            .call(move |c| {
                match session {
                    Some(s) => c.execute(
                        "INSERT INTO chat_sessions (folder, chat_jid, session_id, updated_at) \
                         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (folder, chat_jid) \
                         DO UPDATE SET session_id = ?3, updated_at = ?4",
                        params![f, ch, s, now],
                    )?,
                    None => c.execute(
                        "DELETE FROM chat_sessions WHERE folder = ?1 AND chat_jid = ?2",
                        [&f, &ch],
                    )?,
                };
                Ok(())
            })
            .await
    }

    /// A folder's chat sessions, the most recently used first, at most `limit`.
    pub async fn sessions_of(
        &self,
        folder: &str,
        limit: usize,
    ) -> Result<Vec<ChatSession>, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT chat_jid, session_id, updated_at FROM chat_sessions \
                     WHERE folder = ?1 ORDER BY updated_at DESC, chat_jid LIMIT ?2",
                )?;
                let rows = st
                    .query_map(params![f, limit as i64], |r| {
                        Ok(ChatSession {
                            chat_jid: r.get("chat_jid")?,
                            session_id: r.get("session_id")?,
                            updated_at: r.get("updated_at")?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Counts `bytes` more written by a group's turns on `day` if that stays within `limit`;
    /// answers whether it did (one transaction: concurrent turns cannot both slip under).
    pub async fn add_group_write(
        &self,
        folder: &str,
        day: &str,
        bytes: u64,
        limit: u64,
    ) -> Result<bool, DbError> {
        let (f, d) = (folder.to_owned(), day.to_owned());
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let used: i64 = tx
                    .query_row(
                        "SELECT bytes FROM group_writes WHERE folder = ?1 AND day = ?2",
                        [&f, &d],
                        |r| r.get(0),
                    )
                    .optional()?
                    .unwrap_or(0);
                if (used.max(0) as u64).saturating_add(bytes) > limit {
                    return Ok(false);
                }
                tx.execute(
                    "INSERT INTO group_writes (folder, day, messages, bytes) VALUES (?1, ?2, 1, ?3) \
                     ON CONFLICT (folder, day) DO UPDATE SET messages = messages + 1, \
                     bytes = bytes + ?3",
                    params![f, d, bytes as i64],
                )?;
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    /// How many groups are at or below `folder`.
    pub async fn groups_under(&self, folder: &str) -> Result<usize, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                let n: i64 = c.query_row(
                    "SELECT count(*) FROM groups WHERE folder = ?1 \
                     OR substr(folder, 1, length(?1) + 1) = ?1 || '/'",
                    [&f],
                    |r| r.get(0),
                )?;
                Ok(n.max(0) as usize)
            })
            .await
    }

    /// Changes only a group's name and system prompt (what a folder-bound caller may set):
    /// its grants and settings stay as the operator left them. `false` without the group.
    pub async fn rename_group(
        &self,
        folder: &str,
        name: String,
        system_prompt: String,
        now: i64,
    ) -> Result<bool, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE groups SET name = ?2, system_prompt = ?3, updated_at = ?4 \
                     WHERE folder = ?1",
                    params![f, name, system_prompt, now],
                )? == 1)
            })
            .await
    }
}
