//! `telegram.db`: the poll offset, the deliveries routd made, the outbox of Bot API calls
//! (recorded before they are made), the approval messages and the buttons pressed.

use hako_shared::db::{Db, DbError, Migration};
use rusqlite::{OptionalExtension as _, params};

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "telegram adapter",
        sql: "
        CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
        CREATE TABLE received (key TEXT PRIMARY KEY, at INTEGER NOT NULL);
        CREATE TABLE outbox (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            key TEXT NOT NULL UNIQUE,
            chat_id INTEGER NOT NULL,
            method TEXT NOT NULL,
            params TEXT NOT NULL,
            approval TEXT,
            state TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            next_at INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            error TEXT
        );
        CREATE INDEX outbox_due ON outbox (state, id);
        CREATE TABLE approvals (
            id TEXT PRIMARY KEY,
            chat_id INTEGER NOT NULL,
            message_id INTEGER NOT NULL,
            text TEXT NOT NULL
        );
        CREATE TABLE callbacks (
            id TEXT PRIMARY KEY,
            approval TEXT NOT NULL,
            chat_id INTEGER NOT NULL,
            sender TEXT NOT NULL,
            name TEXT NOT NULL,
            answered INTEGER NOT NULL DEFAULT 0
        );
        CREATE TABLE refused (chat_id INTEGER PRIMARY KEY, at INTEGER NOT NULL);
    ",
    },
    Migration {
        version: 2,
        name: "pairing codes",
        sql: "
        CREATE TABLE pairing (
            chat_id INTEGER PRIMARY KEY,
            code TEXT NOT NULL UNIQUE,
            at INTEGER NOT NULL
        );
        CREATE TABLE paired (
            chat_id INTEGER PRIMARY KEY,
            at INTEGER NOT NULL,
            by TEXT NOT NULL
        );
    ",
    },
];

/// Where a recorded call stands. `sending` is written before the call is made: a row found
/// `sending` at start was cut off by a crash with its answer unknown, and becomes
/// `unconfirmed` (never made again: at most once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendState {
    Pending,
    Sending,
    Sent,
    Failed,
    Unconfirmed,
}

impl SendState {
    fn as_str(self) -> &'static str {
        match self {
            SendState::Pending => "pending",
            SendState::Sending => "sending",
            SendState::Sent => "sent",
            SendState::Failed => "failed",
            SendState::Unconfirmed => "unconfirmed",
        }
    }
}

/// A Bot API call to make.
#[derive(Debug, Clone)]
pub struct Outgoing {
    /// Unique: the delivery's Idempotency-Key and the part, or the adapter's own key.
    pub key: String,
    pub chat_id: i64,
    pub method: &'static str,
    pub params: serde_json::Value,
    /// The approval request a `sendMessage` asks for (its message id is kept).
    pub approval: Option<String>,
}

/// A recorded call, due.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: i64,
    pub key: String,
    pub chat_id: i64,
    pub method: String,
    pub params: serde_json::Value,
    pub approval: Option<String>,
    pub attempts: i64,
    pub created_at: i64,
}

/// The counts `/health` shows.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Counts {
    pub backlog: i64,
    pub sent: i64,
    pub failed: i64,
    pub unconfirmed: i64,
    pub last_error: Option<String>,
}

/// A pressed button whose verdict is not answered yet.
#[derive(Debug, Clone)]
pub struct Press {
    pub id: String,
    pub sender: String,
    pub name: String,
}

#[derive(Clone)]
pub struct Store {
    db: Db,
}

impl Store {
    pub async fn open(path: &std::path::Path) -> Result<Store, DbError> {
        let db = Db::open(path, MIGRATIONS).await?;
        let store = Store { db };
        // A call cut off by a crash: its answer is unknown, it is not made again.
        store
            .db
            .call(|c| {
                c.execute(
                    "UPDATE outbox SET state = 'unconfirmed',
                       error = 'the adapter stopped while this call was in flight: it may or may not have arrived'
                     WHERE state = 'sending'",
                    [],
                )
                .map_err(DbError::from)
            })
            .await?;
        Ok(store)
    }

    /// The next `getUpdates` offset (0 at first).
    pub async fn offset(&self) -> Result<i64, DbError> {
        self.db
            .call(|c| {
                c.query_row("SELECT value FROM meta WHERE key = 'offset'", [], |r| {
                    r.get(0)
                })
                .optional()
                .map(|v| v.unwrap_or(0))
                .map_err(DbError::from)
            })
            .await
    }

    /// Records that every update below `offset` is handled.
    pub async fn set_offset(&self, offset: i64) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO meta (key, value) VALUES ('offset', ?1)
                     ON CONFLICT (key) DO UPDATE SET value = max(value, excluded.value)",
                    [offset],
                )
                .map(drop)
                .map_err(DbError::from)
            })
            .await
    }

    /// Records calls to make, all or none; `received`: the delivery they answer, which is
    /// taken once (`false`: it was taken before, nothing is recorded).
    pub async fn enqueue(
        &self,
        received: Option<String>,
        calls: Vec<Outgoing>,
        now: i64,
    ) -> Result<bool, DbError> {
        self.db
            .call(move |c| -> Result<bool, DbError> {
                let tx = c.transaction()?;
                if let Some(key) = &received {
                    let n = tx.execute(
                        "INSERT OR IGNORE INTO received (key, at) VALUES (?1, ?2)",
                        params![key, now],
                    )?;
                    if n == 0 {
                        return Ok(false);
                    }
                }
                for o in &calls {
                    tx.execute(
                        "INSERT OR IGNORE INTO outbox
                           (key, chat_id, method, params, approval, state, next_at, created_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?6)",
                        params![
                            o.key,
                            o.chat_id,
                            o.method,
                            o.params.to_string(),
                            o.approval,
                            now
                        ],
                    )?;
                }
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    /// The oldest recorded call still to make, if one is due by `now`; and when the next one
    /// is due otherwise.
    pub async fn next_due(&self, now: i64) -> Result<(Option<Row>, Option<i64>), DbError> {
        self.db
            .call(move |c| -> Result<(Option<Row>, Option<i64>), DbError> {
                // In order: a later part of a reply never overtakes an earlier one.
                let row = c
                    .query_row(
                        "SELECT id, key, chat_id, method, params, approval, attempts, created_at, next_at
                         FROM outbox WHERE state = 'pending' ORDER BY id LIMIT 1",
                        [],
                        |r| {
                            Ok((
                                Row {
                                    id: r.get("id")?,
                                    key: r.get("key")?,
                                    chat_id: r.get("chat_id")?,
                                    method: r.get("method")?,
                                    params: serde_json::from_str(&r.get::<_, String>("params")?)
                                        .unwrap_or(serde_json::Value::Null),
                                    approval: r.get("approval")?,
                                    attempts: r.get("attempts")?,
                                    created_at: r.get("created_at")?,
                                },
                                r.get::<_, i64>("next_at")?,
                            ))
                        },
                    )
                    .optional()?;
                Ok(match row {
                    Some((row, at)) if at <= now => (Some(row), None),
                    Some((_, at)) => (None, Some(at)),
                    None => (None, None),
                })
            })
            .await
    }

    /// Moves call `id` to `state` (`next_at` for a retry, `error` for the record).
    pub async fn mark(
        &self,
        id: i64,
        state: SendState,
        next_at: Option<i64>,
        error: Option<String>,
    ) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                let bump = i64::from(state == SendState::Sending);
                c.execute(
                    "UPDATE outbox SET state = ?2, attempts = attempts + ?3,
                       next_at = coalesce(?4, next_at), error = coalesce(?5, error)
                     WHERE id = ?1",
                    params![id, state.as_str(), bump, next_at, error],
                )
                .map(drop)
                .map_err(DbError::from)
            })
            .await
    }

    pub async fn counts(&self) -> Result<Counts, DbError> {
        self.db
            .call(|c| -> Result<Counts, DbError> {
                let mut counts = Counts::default();
                let mut st = c.prepare("SELECT state, count(*) FROM outbox GROUP BY state")?;
                let rows =
                    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                for row in rows {
                    let (s, n) = row?;
                    match s.as_str() {
                        "pending" | "sending" => counts.backlog += n,
                        "sent" => counts.sent += n,
                        "failed" => counts.failed += n,
                        "unconfirmed" => counts.unconfirmed += n,
                        _ => {}
                    }
                }
                counts.last_error = c
                    .query_row(
                        "SELECT error FROM outbox WHERE state IN ('failed', 'unconfirmed')
                         ORDER BY id DESC LIMIT 1",
                        [],
                        |r| r.get(0),
                    )
                    .optional()?
                    .flatten();
                Ok(counts)
            })
            .await
    }

    /// Keeps the Telegram message that asks for approval `id`.
    pub async fn set_approval_message(
        &self,
        id: String,
        chat_id: i64,
        message_id: i64,
        text: String,
    ) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO approvals (id, chat_id, message_id, text)
                     VALUES (?1, ?2, ?3, ?4)",
                    params![id, chat_id, message_id, text],
                )
                .map(drop)
                .map_err(DbError::from)
            })
            .await
    }

    /// The Telegram message (chat, message id, text) that asks for approval `id`.
    pub async fn approval_message(
        &self,
        id: String,
    ) -> Result<Option<(i64, i64, String)>, DbError> {
        self.db
            .call(move |c| {
                c.query_row(
                    "SELECT chat_id, message_id, text FROM approvals WHERE id = ?1",
                    [id],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                )
                .optional()
                .map_err(DbError::from)
            })
            .await
    }

    /// Records a press of an approval button (`false`: this press was recorded before).
    pub async fn add_press(
        &self,
        id: String,
        approval: String,
        chat_id: i64,
        sender: String,
        name: String,
    ) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR IGNORE INTO callbacks (id, approval, chat_id, sender, name)
                     VALUES (?1, ?2, ?3, ?4, ?5)",
                    params![id, approval, chat_id, sender, name],
                )
                .map(|n| n == 1)
                .map_err(DbError::from)
            })
            .await
    }

    /// Takes the unanswered presses of approval `approval` (each is answered once).
    pub async fn take_presses(&self, approval: String) -> Result<Vec<Press>, DbError> {
        self.db
            .call(move |c| -> Result<Vec<Press>, DbError> {
                let tx = c.transaction()?;
                let presses = {
                    let mut st = tx.prepare(
                        "SELECT id, sender, name FROM callbacks WHERE approval = ?1 AND answered = 0",
                    )?;
                    st.query_map([&approval], |r| {
                        Ok(Press {
                            id: r.get(0)?,
                            sender: r.get(1)?,
                            name: r.get(2)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?
                };
                tx.execute(
                    "UPDATE callbacks SET answered = 1 WHERE approval = ?1",
                    [&approval],
                )?;
                tx.commit()?;
                Ok(presses)
            })
            .await
    }

    /// Takes press `id` for an answer of its own (`false`: answered already, or unknown).
    pub async fn take_press(&self, id: String) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE callbacks SET answered = 1 WHERE id = ?1 AND answered = 0",
                    [id],
                )
                .map(|n| n == 1)
                .map_err(DbError::from)
            })
            .await
    }

    /// Records that chat `chat_id` was refused (`false`: it was before).
    pub async fn refuse_once(&self, chat_id: i64, now: i64) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR IGNORE INTO refused (chat_id, at) VALUES (?1, ?2)",
                    params![chat_id, now],
                )
                .map(|n| n == 1)
                .map_err(DbError::from)
            })
            .await
    }

    /// Chat `chat_id`'s pairing code: `code` if it had none, else the one it was given
    /// before; `None` once it is paired.
    pub async fn offer_pairing(
        &self,
        chat_id: i64,
        code: String,
        now: i64,
    ) -> Result<Option<String>, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let paired: bool = tx
                    .query_row("SELECT 1 FROM paired WHERE chat_id = ?1", [chat_id], |_| {
                        Ok(true)
                    })
                    .optional()?
                    .unwrap_or(false);
                if paired {
                    return Ok(None);
                }
                tx.execute(
                    "INSERT OR IGNORE INTO pairing (chat_id, code, at) VALUES (?1, ?2, ?3)",
                    params![chat_id, code, now],
                )?;
                let code: String = tx.query_row(
                    "SELECT code FROM pairing WHERE chat_id = ?1",
                    [chat_id],
                    |r| r.get(0),
                )?;
                tx.commit()?;
                Ok(Some(code))
            })
            .await
    }

    /// Accepts the pairing `code`: its chat is allowed from now on. Answers the chat, or
    /// `None` for a code nobody was given (or one used already).
    pub async fn pair(&self, code: String, by: String, now: i64) -> Result<Option<i64>, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let chat: Option<i64> = tx
                    .query_row(
                        "SELECT chat_id FROM pairing WHERE code = ?1",
                        [&code],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(chat) = chat {
                    tx.execute("DELETE FROM pairing WHERE chat_id = ?1", [chat])?;
                    tx.execute(
                        "INSERT OR REPLACE INTO paired (chat_id, at, by) VALUES (?1, ?2, ?3)",
                        params![chat, now, by],
                    )?;
                    // Refused before it was paired: unpaired later, it is refused once more.
                    tx.execute("DELETE FROM refused WHERE chat_id = ?1", [chat])?;
                }
                tx.commit()?;
                Ok(chat)
            })
            .await
    }

    /// Ends a pairing (`false`: the chat was not paired).
    pub async fn unpair(&self, chat_id: i64) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                c.execute("DELETE FROM paired WHERE chat_id = ?1", [chat_id])
                    .map(|n| n == 1)
                    .map_err(DbError::from)
            })
            .await
    }

    /// The paired chats.
    pub async fn paired(&self) -> Result<Vec<Paired>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare("SELECT chat_id, at, by FROM paired ORDER BY at")?;
                let rows = st
                    .query_map([], |r| {
                        Ok(Paired {
                            chat_id: r.get(0)?,
                            at: r.get(1)?,
                            by: r.get(2)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// The codes given and not yet accepted.
    pub async fn pairings(&self) -> Result<Vec<Pairing>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare("SELECT chat_id, code, at FROM pairing ORDER BY at")?;
                let rows = st
                    .query_map([], |r| {
                        Ok(Pairing {
                            chat_id: r.get(0)?,
                            code: r.get(1)?,
                            at: r.get(2)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }
}

/// A chat the operator let in with its pairing code.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Paired {
    pub chat_id: i64,
    /// Unix ms.
    pub at: i64,
    /// Who accepted it (the token's subject).
    pub by: String,
}

/// A pairing code given to a chat not on the allowlist.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Pairing {
    pub chat_id: i64,
    pub code: String,
    /// Unix ms.
    pub at: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chat keeps the code it was told until it is paired; a code is spent once; a chat let
    /// out is refused again, with a new code.
    #[tokio::test]
    async fn a_chat_is_told_the_code_it_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("t.db")).await.unwrap();
        let first = s.offer_pairing(9, "AAAA-AAAA".into(), 1).await.unwrap();
        assert_eq!(first.as_deref(), Some("AAAA-AAAA"));
        let again = s.offer_pairing(9, "BBBB-BBBB".into(), 2).await.unwrap();
        assert_eq!(again, first, "the code it was told, not a new one");
        assert!(s.refuse_once(9, 1).await.unwrap());
        assert_eq!(
            s.pair("BBBB-BBBB".into(), "x".into(), 3).await.unwrap(),
            None
        );
        assert_eq!(
            s.pair("AAAA-AAAA".into(), "operator".into(), 3)
                .await
                .unwrap(),
            Some(9)
        );
        assert_eq!(
            s.pair("AAAA-AAAA".into(), "operator".into(), 4)
                .await
                .unwrap(),
            None
        );
        assert_eq!(
            s.offer_pairing(9, "CCCC-CCCC".into(), 5).await.unwrap(),
            None
        );
        assert_eq!(s.paired().await.unwrap()[0].by, "operator");
        assert!(s.unpair(9).await.unwrap());
        assert!(
            s.refuse_once(9, 6).await.unwrap(),
            "refused again once let out"
        );
        assert_eq!(
            s.offer_pairing(9, "CCCC-CCCC".into(), 7)
                .await
                .unwrap()
                .as_deref(),
            Some("CCCC-CCCC")
        );
    }
}
