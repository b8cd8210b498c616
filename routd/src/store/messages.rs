//! The message log and each chat's cursor: inbound and outbound messages, their states,
//! which turn covers them, and the follow-ups steered into a live run.

use hako_shared::ChatJid;
use hako_shared::chat::{MessageKind, MessageState, MessageView};
use hako_shared::db::DbError;
use hako_shared::ids::TurnId;
use rusqlite::{OptionalExtension, params};

use super::Store;

/// The id of a message routd writes for a caller's `key` (a command message's id, an
/// agent's idempotency key): `<prefix><key><suffix>` when that is in the id grammar, else
/// `<prefix>k-<digest of key><suffix>`. The same key always gives the same id (a replay
/// appends nothing), and no key, however long or strange, gives a message id the log
/// cannot serve back.
pub(crate) fn keyed_message_id(prefix: &str, key: &str, suffix: &str) -> String {
    let plain = format!("{prefix}{key}{suffix}");
    if hako_shared::ids::is_valid_id(&plain) {
        return plain;
    }
    let hex = super::digest_hex(&[key.as_bytes()]);
    format!("{prefix}k-{hex}{suffix}")
}

/// A new inbound message.
#[derive(Debug, Clone)]
pub struct NewInbound {
    /// Message id.
    pub id: String,
    /// Chat.
    pub chat_jid: ChatJid,
    /// `message` or `command`.
    pub kind: MessageKind,
    /// Sender.
    pub sender: String,
    /// Display name.
    pub sender_name: Option<String>,
    /// Text.
    pub content: String,
    /// Unix ms.
    pub timestamp: i64,
    /// Answered message.
    pub reply_to: Option<String>,
    /// Hash of the posted body (a reused id with another body is refused).
    pub body_hash: String,
    /// Unix ms.
    pub now: i64,
}

/// What became of an inbound message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ingested {
    /// Appended at `seq`.
    New(i64),
    /// The same id and body were posted before, at `seq`.
    Duplicate(i64),
    /// The id exists with another body.
    Conflict,
}

/// A new outbound message (a reply or a notice).
#[derive(Debug, Clone)]
pub struct NewOutbound {
    /// A stable id: a reply's is `<turn>.<attempt>.<block>`, so a replay never appends twice.
    pub id: String,
    /// Chat.
    pub chat_jid: ChatJid,
    /// `message` or `notice`.
    pub kind: MessageKind,
    /// Text.
    pub content: String,
    /// The turn that produced it.
    pub turn_id: Option<String>,
    /// The message it answers.
    pub reply_to: Option<String>,
    /// Whether a webhook takes the chat (then it starts `delivering`).
    pub webhook: bool,
    /// Unix ms.
    pub now: i64,
}

/// The columns [`message`] reads (by name: a query may add its own after them).
pub(super) const MSG_COLS: &str = "seq, id, chat_jid, direction, kind, sender, sender_name, content, \
                        timestamp, reply_to, turn_id, state, version";

pub(super) fn message(r: &rusqlite::Row<'_>) -> rusqlite::Result<MessageView> {
    Ok(MessageView {
        seq: r.get("seq")?,
        id: r.get("id")?,
        chat_jid: r.get("chat_jid")?,
        direction: r.get("direction")?,
        kind: r.get("kind")?,
        sender: r.get("sender")?,
        sender_name: r.get("sender_name")?,
        content: r.get("content")?,
        timestamp: r.get("timestamp")?,
        reply_to: r.get("reply_to")?,
        turn_id: r.get("turn_id")?,
        state: r.get("state")?,
        version: r.get("version")?,
    })
}

impl Store {
    /// Appends an inbound message, unless its id exists (same body: duplicate; else conflict).
    pub async fn ingest(&self, m: NewInbound) -> Result<Ingested, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let existing: Option<(i64, String)> = tx
                    .query_row(
                        "SELECT seq, body_hash FROM messages WHERE id = ?1",
                        [&m.id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )
                    .optional()?;
                if let Some((seq, hash)) = existing {
                    return Ok(if hash == m.body_hash {
                        Ingested::Duplicate(seq)
                    } else {
                        Ingested::Conflict
                    });
                }
                let state = match m.kind {
                    MessageKind::Command => MessageState::Handled,
                    _ => MessageState::Pending,
                };
                tx.execute(
                    "INSERT INTO messages (id, chat_jid, direction, kind, sender, sender_name, content, \
                     timestamp, reply_to, state, body_hash, created_at) \
                     VALUES (?1, ?2, 'in', ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    params![
                        m.id,
                        m.chat_jid,
                        m.kind.as_str(),
                        m.sender,
                        m.sender_name,
                        m.content,
                        m.timestamp,
                        m.reply_to,
                        state.as_str(),
                        m.body_hash,
                        m.now
                    ],
                )?;
                let seq = tx.last_insert_rowid();
                let pending = i64::from(state == MessageState::Pending);
                tx.execute(
                    "INSERT INTO chats (jid, cursor, pending, updated_at) VALUES (?1, 0, ?3, ?2) \
                     ON CONFLICT (jid) DO UPDATE SET updated_at = ?2, pending = pending + ?3",
                    params![m.chat_jid, m.now, pending],
                )?;
                tx.commit()?;
                hako_shared::failpoint::hit("routd.message.ingested");
                Ok(Ingested::New(seq))
            })
            .await
    }

    /// Appends an outbound message unless its id exists; `Some(seq)` when it was appended.
    pub async fn append_outbound(&self, o: NewOutbound) -> Result<Option<i64>, DbError> {
        self.db
            .call(move |c| {
                let state = if o.webhook {
                    MessageState::Delivering
                } else {
                    MessageState::Sent
                };
                let n = c.execute(
                    "INSERT OR IGNORE INTO messages (id, chat_jid, direction, kind, sender, content, \
                     timestamp, reply_to, turn_id, state, next_try_at, created_at) \
                     VALUES (?1, ?2, 'out', ?3, 'hako', ?4, ?5, ?6, ?7, ?8, ?9, ?5)",
                    params![
                        o.id,
                        o.chat_jid,
                        o.kind.as_str(),
                        o.content,
                        o.now,
                        o.reply_to,
                        o.turn_id,
                        state.as_str(),
                        o.webhook.then_some(o.now)
                    ],
                )?;
                if n == 1 {
                    hako_shared::failpoint::hit("routd.block.appended");
                }
                Ok((n == 1).then(|| c.last_insert_rowid()))
            })
            .await
    }

    /// A chat's messages in log order: below `before`, above `after`, at most `limit` (the
    /// newest of the range when only `before` or neither is given).
    pub async fn messages(
        &self,
        chat: &str,
        before: Option<i64>,
        after: Option<i64>,
        limit: usize,
    ) -> Result<Vec<MessageView>, DbError> {
        let chat = chat.to_owned();
        self.db
            .call(move |c| {
                let rows = if after.is_some() && before.is_none() {
                    let mut st = c.prepare_cached(&format!(
                        "SELECT {MSG_COLS} FROM messages WHERE chat_jid = ?1 AND seq > ?2 \
                         ORDER BY seq LIMIT ?3"
                    ))?;
                    st.query_map(params![chat, after, limit as i64], message)?
                        .collect::<Result<Vec<_>, _>>()?
                } else {
                    let mut st = c.prepare_cached(&format!(
                        "SELECT {MSG_COLS} FROM messages WHERE chat_jid = ?1 \
                         AND (?2 IS NULL OR seq < ?2) AND (?3 IS NULL OR seq > ?3) \
                         ORDER BY seq DESC LIMIT ?4"
                    ))?;
                    let mut v = st
                        .query_map(params![chat, before, after, limit as i64], message)?
                        .collect::<Result<Vec<_>, _>>()?;
                    v.reverse();
                    v
                };
                Ok(rows)
            })
            .await
    }

    /// One message by seq.
    pub async fn message(&self, seq: i64) -> Result<Option<MessageView>, DbError> {
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {MSG_COLS} FROM messages WHERE seq = ?1"),
                    [seq],
                    message,
                )
                .optional()?)
            })
            .await
    }

    /// Chats with inbound messages not answered yet, least recently changed first (the
    /// scheduler then looks for the ones no turn covers). A per-chat count keeps this small
    /// however many messages wait (an unrouted chat's backlog, say).
    pub async fn chats_with_pending(&self) -> Result<Vec<ChatJid>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(
                    "SELECT jid FROM chats WHERE pending > 0 ORDER BY updated_at",
                )?;
                let rows = st
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<ChatJid>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// A chat's pending, uncovered inbound messages, oldest first, at most `limit`, each
    /// with its arrival (Unix ms).
    pub async fn pending_of(
        &self,
        chat: &str,
        limit: usize,
    ) -> Result<Vec<(MessageView, i64)>, DbError> {
        let chat = chat.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {MSG_COLS}, created_at FROM messages WHERE chat_jid = ?1 AND direction = 'in' \
                     AND state = 'pending' AND turn_id IS NULL ORDER BY seq LIMIT ?2"
                ))?;
                let rows = st
                    .query_map(params![chat, limit as i64], |r| Ok((message(r)?, r.get("created_at")?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Takes messages back from a turn (a steer runed did not deliver): they wait for the
    /// next turn.
    pub async fn uncover(&self, turn_id: &TurnId, seqs: Vec<i64>) -> Result<(), DbError> {
        self.per_seq(
            "UPDATE messages SET turn_id = NULL, steering = 0, steer_id = NULL WHERE seq = ?1 \
             AND turn_id = ?2 AND state = 'pending'",
            turn_id,
            seqs,
        )
        .await
    }

    /// Runs `sql` (`?1` a seq, `?2` the turn) for each of `seqs`, in one transaction.
    async fn per_seq(
        &self,
        sql: &'static str,
        turn_id: &TurnId,
        seqs: Vec<i64>,
    ) -> Result<(), DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                for s in seqs {
                    tx.execute(sql, params![s, t])?;
                }
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// The messages a turn covers, in order.
    pub async fn covered_by(&self, turn_id: &TurnId) -> Result<Vec<MessageView>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {MSG_COLS} FROM messages WHERE turn_id = ?1 AND direction = 'in' \
                     ORDER BY seq"
                ))?;
                let rows = st
                    .query_map([&t], message)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Adds pending messages to a running turn, marked as being steered into its run: its
    /// end does not answer them until [`Store::steered`] says the agent took them. Only
    /// messages still uncovered move, and only while the turn runs; answers how many did.
    pub async fn cover(
        &self,
        turn_id: &TurnId,
        steer_id: &str,
        seqs: Vec<i64>,
    ) -> Result<usize, DbError> {
        let t = turn_id.to_owned();
        let sid = steer_id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let running: bool = tx
                    .query_row(
                        "SELECT 1 FROM turns WHERE turn_id = ?1 AND state = 'running'",
                        [&t],
                        |_| Ok(true),
                    )
                    .optional()?
                    .unwrap_or(false);
                if !running {
                    return Ok(0);
                }
                let mut n = 0;
                for s in seqs {
                    n += tx.execute(
                        "UPDATE messages SET turn_id = ?1, steering = 1, steer_id = ?3 WHERE seq = ?2 \
                         AND turn_id IS NULL AND state = 'pending'",
                        params![t, s, sid],
                    )?;
                }
                tx.commit()?;
                if n > 0 {
                    hako_shared::failpoint::hit("routd.followup.staged");
                }
                Ok(n)
            })
            .await
    }

    /// runed placed a follow-up in the run: its messages wait there for the run's end to
    /// say whether the agent took them.
    pub async fn steer_placed(&self, turn_id: &TurnId, steer_id: &str) -> Result<(), DbError> {
        let (t, s) = (turn_id.to_owned(), steer_id.to_owned());
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE messages SET steering = 2 WHERE turn_id = ?1 AND steer_id = ?2 \
                     AND steering = 1",
                    params![t, s],
                )?;
                hako_shared::failpoint::hit("routd.followup.placed");
                Ok(())
            })
            .await
    }

    /// A turn's follow-ups handed to runed without an answer (the call failed, or routd
    /// stopped): each steer id with its messages, oldest first. Asking runed again with the
    /// same id is safe: it never places one twice.
    pub async fn steers_unanswered(
        &self,
        turn_id: &TurnId,
    ) -> Result<Vec<(String, Vec<MessageView>)>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {MSG_COLS}, steer_id FROM messages WHERE turn_id = ?1 \
                     AND direction = 'in' AND state = 'pending' AND steering = 1 ORDER BY seq"
                ))?;
                let mut out: Vec<(String, Vec<MessageView>)> = Vec::new();
                let rows = st.query_map([&t], |r| {
                    Ok((r.get::<_, Option<String>>("steer_id")?, message(r)?))
                })?;
                for row in rows {
                    let (sid, m) = row?;
                    let sid = sid.unwrap_or_default();
                    match out.iter_mut().find(|(s, _)| *s == sid) {
                        Some((_, ms)) => ms.push(m),
                        None => out.push((sid, vec![m])),
                    }
                }
                Ok(out)
            })
            .await
    }

    /// The run ended: its follow-ups' fates are final. The messages of the steers the agent
    /// took belong to the turn like its first ones; the rest (returned, or never placed)
    /// wait for the next turn. One transaction; answers (taken, returned) message counts.
    pub async fn resolve_steers(
        &self,
        turn_id: &TurnId,
        taken: Vec<String>,
    ) -> Result<(usize, usize), DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let mut took = 0;
                for sid in &taken {
                    took += tx.execute(
                        "UPDATE messages SET steering = 0 WHERE turn_id = ?1 AND steer_id = ?2 \
                         AND steering != 0",
                        params![t, sid],
                    )?;
                }
                let back = tx.execute(
                    "UPDATE messages SET turn_id = NULL, steering = 0, steer_id = NULL \
                     WHERE turn_id = ?1 AND steering != 0 AND state = 'pending'",
                    [&t],
                )?;
                tx.commit()?;
                if took + back > 0 {
                    hako_shared::failpoint::hit("routd.followup.resolved");
                }
                Ok((took, back))
            })
            .await
    }

    /// At start: messages left steering by a turn that is over wait for a turn again (a
    /// live turn's are settled by its run's end). Answers how many.
    pub async fn release_steering(&self) -> Result<usize, DbError> {
        self.db
            .call(|c| {
                Ok(c.execute(
                    "UPDATE messages SET turn_id = NULL, steering = 0, steer_id = NULL \
                     WHERE steering != 0 AND state = 'pending' AND NOT EXISTS ( \
                       SELECT 1 FROM turns t WHERE t.turn_id = messages.turn_id \
                       AND t.state IN ('starting', 'running', 'waiting'))",
                    [],
                )?)
            })
            .await
    }

    /// The oldest pending inbound message's arrival per folder of a live or queued turn:
    /// (chat, created_at) of every chat's oldest pending message.
    pub async fn oldest_pending(&self) -> Result<Vec<(ChatJid, i64)>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(
                    "SELECT chat_jid, min(created_at) FROM messages WHERE direction = 'in' \
                     AND state = 'pending' GROUP BY chat_jid",
                )?;
                let rows = st
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// A chat's cursor.
    pub async fn cursor(&self, chat: &str) -> Result<i64, DbError> {
        let chat = chat.to_owned();
        self.db
            .call(move |c| {
                Ok(
                    c.query_row("SELECT cursor FROM chats WHERE jid = ?1", [&chat], |r| {
                        r.get(0)
                    })
                    .optional()?
                    .unwrap_or(0),
                )
            })
            .await
    }

    /// Sets the turn's progress note: the first call appends it (id `<turn>.status`), later
    /// ones change its text in place: the same id, the next version, moved to the end of the
    /// log so that every reader after a seq (SSE, history) sees the edit. Returns its seq.
    pub async fn set_status(
        &self,
        turn_id: &TurnId,
        chat: &str,
        text: String,
        webhook: bool,
        now: i64,
    ) -> Result<i64, DbError> {
        let (turn, chat) = (turn_id.to_owned(), chat.to_owned());
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let id = format!("{turn}.status");
                let state = if webhook {
                    MessageState::Delivering
                } else {
                    MessageState::Sent
                };
                let next: i64 =
                    tx.query_row("SELECT coalesce(max(seq), 0) + 1 FROM messages", [], |r| {
                        r.get(0)
                    })?;
                let moved = tx.execute(
                    "UPDATE messages SET seq = ?2, content = ?3, version = version + 1, \
                     timestamp = ?4, state = ?5, attempts = 0, next_try_at = ?6 WHERE id = ?1",
                    params![id, next, text, now, state.as_str(), webhook.then_some(now)],
                )?;
                if moved == 0 {
                    tx.execute(
                        "INSERT INTO messages (seq, id, chat_jid, direction, kind, sender, content, \
                         timestamp, turn_id, state, next_try_at, created_at) \
                         VALUES (?1, ?2, ?3, 'out', 'status', 'hako', ?4, ?5, ?6, ?7, ?8, ?5)",
                        params![next, id, chat, text, now, turn, state.as_str(), webhook.then_some(now)],
                    )?;
                }
                tx.commit()?;
                Ok(next)
            })
            .await
    }
}

/// A chat's inbound messages that wait for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backlog {
    /// The chat.
    pub chat_jid: ChatJid,
    /// How many wait.
    pub waiting: u64,
    /// When the oldest arrived (Unix ms).
    pub oldest_at: i64,
}

impl Store {
    /// Every chat with inbound messages waiting for an answer.
    pub async fn backlog(&self) -> Result<Vec<Backlog>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(
                    "SELECT chat_jid, COUNT(*) AS waiting, MIN(created_at) AS oldest_at \
                     FROM messages WHERE direction = 'in' AND state = 'pending' \
                     GROUP BY chat_jid",
                )?;
                let rows = st
                    .query_map([], |r| {
                        Ok(Backlog {
                            chat_jid: r.get("chat_jid")?,
                            waiting: r.get::<_, i64>("waiting")? as u64,
                            oldest_at: r.get("oldest_at")?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }
}
