//! `routd.db`: the message log (inbound and outbound, with their states), chats, groups and
//! their sessions, routes, turns, webhooks and delivery attempts, and the audit log.
//!
//! The log is append-only: a message's `seq` is its place, the cursor of history pages and the
//! id of its server-sent event, so a client that reconnects gets exactly what it missed from
//! the log. A message's state moves forward only (an inbound message: `pending` →
//! `answered` | `failed`; an outbound one: `delivering` → `delivered` | `undeliverable`).
//! Every multi-row change is one transaction.

use std::path::Path;

mod approvals;
pub use approvals::{ApprovalRow, Decided};

use hako_shared::chat::{ChatSession, Direction, MessageKind, MessageView, TurnView};
use hako_shared::db::{Db, DbError, Migration};
use rusqlite::{OptionalExtension, params};
use serde::Serialize;

/// The schema, in order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "messages, chats, groups, sessions, routes, turns, webhooks, deliveries, audit",
        sql: r#"
CREATE TABLE messages (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    chat_jid    TEXT NOT NULL,
    direction   TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    kind        TEXT NOT NULL CHECK (kind IN ('message', 'command', 'notice')),
    sender      TEXT NOT NULL,
    sender_name TEXT,
    content     TEXT NOT NULL,
    timestamp   INTEGER NOT NULL,
    reply_to    TEXT,
    turn_id     TEXT,
    state       TEXT NOT NULL,
    body_hash   TEXT NOT NULL DEFAULT '',
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try_at INTEGER,
    created_at  INTEGER NOT NULL
);
CREATE INDEX messages_chat ON messages (chat_jid, seq);
CREATE INDEX messages_pending ON messages (state, chat_jid) WHERE direction = 'in';
CREATE INDEX messages_delivering ON messages (next_try_at) WHERE state = 'delivering';
CREATE TABLE chats (
    jid        TEXT PRIMARY KEY,
    cursor     INTEGER NOT NULL DEFAULT 0,
    pending    INTEGER NOT NULL DEFAULT 0,
    updated_at INTEGER NOT NULL
);
CREATE INDEX chats_pending ON chats (jid) WHERE pending > 0;
CREATE TABLE groups (
    folder        TEXT PRIMARY KEY,
    name          TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    grants        TEXT NOT NULL DEFAULT '[]',
    spec          TEXT NOT NULL DEFAULT '{}',
    updated_at    INTEGER NOT NULL
);
CREATE TABLE sessions (
    folder     TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    updated_at INTEGER NOT NULL
);
CREATE TABLE routes (
    id         INTEGER PRIMARY KEY,
    position   INTEGER NOT NULL,
    pattern    TEXT NOT NULL,
    folder     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE turns (
    turn_id     TEXT PRIMARY KEY,
    folder      TEXT NOT NULL,
    chat_jid    TEXT NOT NULL,
    state       TEXT NOT NULL,
    attempt     INTEGER NOT NULL DEFAULT 0,
    run_id      TEXT,
    outcome     TEXT,
    error       TEXT,
    replies     INTEGER NOT NULL DEFAULT 0,
    next_try_at INTEGER,
    first_in_at INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    ended_at    INTEGER
);
CREATE INDEX turns_live ON turns (state) WHERE state IN ('starting', 'running', 'waiting');
CREATE INDEX turns_folder ON turns (folder, created_at);
CREATE TABLE webhooks (
    id         INTEGER PRIMARY KEY,
    prefix     TEXT NOT NULL UNIQUE,
    url        TEXT NOT NULL,
    secret     TEXT NOT NULL,
    created_at INTEGER NOT NULL
);
CREATE TABLE deliveries (
    id          INTEGER PRIMARY KEY,
    message_seq INTEGER NOT NULL,
    webhook_id  INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    status      INTEGER,
    outcome     TEXT NOT NULL,
    detail      TEXT NOT NULL DEFAULT ''
);
CREATE INDEX deliveries_message ON deliveries (message_seq);
CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    folder  TEXT,
    outcome TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);
"#,
    },
    Migration {
        version: 2,
        name: "status and task messages with versions; scheduled tasks",
        // SQLite cannot change a CHECK: the log is rebuilt, every row and seq kept.
        sql: r#"
CREATE TABLE messages_v2 (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    chat_jid    TEXT NOT NULL,
    direction   TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    kind        TEXT NOT NULL CHECK (kind IN ('message', 'command', 'notice', 'status', 'task')),
    sender      TEXT NOT NULL,
    sender_name TEXT,
    content     TEXT NOT NULL,
    timestamp   INTEGER NOT NULL,
    reply_to    TEXT,
    turn_id     TEXT,
    state       TEXT NOT NULL,
    body_hash   TEXT NOT NULL DEFAULT '',
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try_at INTEGER,
    created_at  INTEGER NOT NULL,
    version     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO messages_v2 (seq, id, chat_jid, direction, kind, sender, sender_name, content,
    timestamp, reply_to, turn_id, state, body_hash, attempts, next_try_at, created_at)
    SELECT seq, id, chat_jid, direction, kind, sender, sender_name, content, timestamp,
    reply_to, turn_id, state, body_hash, attempts, next_try_at, created_at FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v2 RENAME TO messages;
CREATE INDEX messages_chat ON messages (chat_jid, seq);
CREATE INDEX messages_pending ON messages (state, chat_jid) WHERE direction = 'in';
CREATE INDEX messages_delivering ON messages (next_try_at) WHERE state = 'delivering';
CREATE TABLE tasks (
    id            TEXT PRIMARY KEY,
    folder        TEXT NOT NULL,
    chat_jid      TEXT NOT NULL,
    prompt        TEXT NOT NULL,
    cron          TEXT,
    next_at       INTEGER,
    state         TEXT NOT NULL CHECK (state IN ('active', 'done', 'cancelled')),
    fired         INTEGER NOT NULL DEFAULT 0,
    last_fired_at INTEGER,
    created_by    TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
);
CREATE INDEX tasks_due ON tasks (next_at) WHERE state = 'active';
CREATE INDEX tasks_folder ON tasks (folder, state);
"#,
    },
    Migration {
        version: 3,
        name: "LLM usage through the gateway, per group, day, turn and model",
        sql: r#"
CREATE TABLE llm_usage (
    folder        TEXT NOT NULL,
    day           TEXT NOT NULL,
    turn_id       TEXT NOT NULL,
    api           TEXT NOT NULL,
    model         TEXT NOT NULL,
    calls         INTEGER NOT NULL DEFAULT 0,
    input_tokens  INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (folder, day, turn_id, api, model)
);
CREATE INDEX llm_usage_day ON llm_usage (day, folder);
"#,
    },
    Migration {
        version: 4,
        name: "messages being steered into a live run: answered only once the agent took them",
        sql: r#"
ALTER TABLE messages ADD COLUMN steering INTEGER NOT NULL DEFAULT 0;
"#,
    },
    // `steering`: 0 no, 1 handed to runed without an answer yet, 2 placed in the run.
    // `steer_id` names the follow-up at runed, which answers a repeat with the same one.
    Migration {
        version: 5,
        name: "the follow-up a steered message went out in",
        sql: r#"
ALTER TABLE messages ADD COLUMN steer_id TEXT;
"#,
    },
    // The agent's session is per chat: a group serving many chats (a glob route) kept one
    // session for all, so one customer's words were in another's model context. The old
    // per-folder sessions mixed chats and are not carried over: each chat starts afresh.
    Migration {
        version: 6,
        name: "agent sessions per group and chat",
        sql: r#"
CREATE TABLE chat_sessions (
    folder     TEXT NOT NULL,
    chat_jid   TEXT NOT NULL,
    session_id TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (folder, chat_jid)
);
DROP TABLE sessions;
"#,
    },
    Migration {
        version: 7,
        name: "what each group's turns wrote per UTC day (bounded)",
        sql: r#"
CREATE TABLE group_writes (
    folder   TEXT NOT NULL,
    day      TEXT NOT NULL,
    messages INTEGER NOT NULL DEFAULT 0,
    bytes    INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (folder, day)
);
"#,
    },
    // Approval requests are messages of their own kind: the log is rebuilt (SQLite cannot
    // change a CHECK), every row and seq kept.
    Migration {
        version: 8,
        name: "human approval of held tool calls: requests, verdicts, each group's policy",
        sql: r#"
CREATE TABLE messages_v8 (
    seq         INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    chat_jid    TEXT NOT NULL,
    direction   TEXT NOT NULL CHECK (direction IN ('in', 'out')),
    kind        TEXT NOT NULL CHECK (kind IN ('message', 'command', 'notice', 'status', 'task', 'approval')),
    sender      TEXT NOT NULL,
    sender_name TEXT,
    content     TEXT NOT NULL,
    timestamp   INTEGER NOT NULL,
    reply_to    TEXT,
    turn_id     TEXT,
    state       TEXT NOT NULL,
    body_hash   TEXT NOT NULL DEFAULT '',
    attempts    INTEGER NOT NULL DEFAULT 0,
    next_try_at INTEGER,
    created_at  INTEGER NOT NULL,
    version     INTEGER NOT NULL DEFAULT 0,
    steering    INTEGER NOT NULL DEFAULT 0,
    steer_id    TEXT
);
INSERT INTO messages_v8 (seq, id, chat_jid, direction, kind, sender, sender_name, content,
    timestamp, reply_to, turn_id, state, body_hash, attempts, next_try_at, created_at, version,
    steering, steer_id)
    SELECT seq, id, chat_jid, direction, kind, sender, sender_name, content, timestamp,
    reply_to, turn_id, state, body_hash, attempts, next_try_at, created_at, version, steering,
    steer_id FROM messages;
DROP TABLE messages;
ALTER TABLE messages_v8 RENAME TO messages;
CREATE INDEX messages_chat ON messages (chat_jid, seq);
CREATE INDEX messages_pending ON messages (state, chat_jid) WHERE direction = 'in';
CREATE INDEX messages_delivering ON messages (next_try_at) WHERE state = 'delivering';
ALTER TABLE groups ADD COLUMN approvals TEXT NOT NULL DEFAULT '{}';
CREATE TABLE approvals (
    id           TEXT PRIMARY KEY,
    turn_id      TEXT NOT NULL,
    folder       TEXT NOT NULL,
    chat_jid     TEXT NOT NULL,
    tool         TEXT NOT NULL,
    target       TEXT,
    arguments    TEXT NOT NULL,
    state        TEXT NOT NULL CHECK (state IN ('pending', 'approved', 'denied', 'timed_out', 'turn_ended', 'abandoned')),
    decided_by   TEXT,
    requested_at INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL,
    decided_at   INTEGER
);
CREATE INDEX approvals_pending ON approvals (turn_id) WHERE state = 'pending';
CREATE INDEX approvals_folder ON approvals (folder, requested_at);
"#,
    },
];

/// LLM usage: one group's calls of one turn, day, wire format and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct UsageRow {
    /// The group.
    pub folder: String,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// The turn.
    pub turn_id: String,
    /// `anthropic` or `openai`.
    pub api: String,
    /// The model the agent asked for.
    pub model: String,
    /// Calls forwarded.
    pub calls: u64,
    /// Input tokens the provider reported.
    pub input_tokens: u64,
    /// Output tokens the provider reported.
    pub output_tokens: u64,
}

/// Task states.
pub mod task {
    /// Waiting for its next firing.
    pub const ACTIVE: &str = "active";
    /// A one-off that fired.
    pub const DONE: &str = "done";
    /// Cancelled before it was done.
    pub const CANCELLED: &str = "cancelled";
}

/// Inbound states.
pub mod inbound {
    /// Not answered yet.
    pub const PENDING: &str = "pending";
    /// A turn answered it (or ended without retry: stopped, an error reply).
    pub const ANSWERED: &str = "answered";
    /// Every try of its turn failed.
    pub const FAILED: &str = "failed";
    /// A command routd handled.
    pub const HANDLED: &str = "handled";
}

/// Outbound states.
pub mod outbound {
    /// No webhook for the chat: it is in the log (and on SSE), nothing more to do.
    pub const SENT: &str = "sent";
    /// Waiting for (another) webhook attempt.
    pub const DELIVERING: &str = "delivering";
    /// The webhook took it.
    pub const DELIVERED: &str = "delivered";
    /// Every attempt failed, or the message grew too old.
    pub const UNDELIVERABLE: &str = "undeliverable";
}

/// Turn states.
pub mod turn {
    /// About to ask runed for its run (the run id is not known yet).
    pub const STARTING: &str = "starting";
    /// Its run is live on runed.
    pub const RUNNING: &str = "running";
    /// Waiting for a retry's backoff.
    pub const WAITING: &str = "waiting";
    /// Answered.
    pub const DONE: &str = "done";
    /// Every try failed.
    pub const FAILED: &str = "failed";
    /// Stopped on request.
    pub const KILLED: &str = "killed";
}

/// A new inbound message.
#[derive(Debug, Clone)]
pub struct NewInbound {
    /// Message id.
    pub id: String,
    /// Chat.
    pub chat_jid: String,
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
    pub chat_jid: String,
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

/// A turn row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRow {
    /// Id.
    pub turn_id: String,
    /// Folder.
    pub folder: String,
    /// Chat.
    pub chat_jid: String,
    /// State.
    pub state: String,
    /// Attempts started.
    pub attempt: i64,
    /// Current run.
    pub run_id: Option<String>,
    /// Last outcome.
    pub outcome: Option<String>,
    /// Last error.
    pub error: Option<String>,
    /// Replies delivered (blocks of the current attempt turned into messages).
    pub replies: i64,
    /// When a waiting turn retries (Unix ms).
    pub next_try_at: Option<i64>,
    /// The first covered message's arrival (Unix ms), for the turn latency.
    pub first_in_at: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub ended_at: Option<i64>,
}

/// A group row.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupRow {
    /// Folder.
    pub folder: String,
    /// Name.
    pub name: String,
    /// System prompt.
    pub system_prompt: String,
    /// Grants (JSON array text).
    pub grants: String,
    /// GroupSpec (JSON text).
    pub spec: String,
    /// ApprovalPolicy (JSON text).
    pub approvals: String,
    /// Unix ms.
    pub updated_at: i64,
}

/// A route row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRow {
    /// Id.
    pub id: i64,
    /// Position.
    pub position: i64,
    /// Pattern.
    pub pattern: String,
    /// Folder.
    pub folder: String,
}

/// A webhook row (the secret included: only the delivery worker reads it).
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookRow {
    /// Id.
    pub id: i64,
    /// JID prefix.
    pub prefix: String,
    /// URL.
    pub url: String,
    /// HMAC key.
    pub secret: String,
}

impl std::fmt::Debug for WebhookRow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookRow")
            .field("id", &self.id)
            .field("prefix", &self.prefix)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// An audit row.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct AuditRow {
    /// Row id.
    pub id: i64,
    /// Unix ms.
    pub at: i64,
    /// Token subject.
    pub actor: String,
    /// `group.put`, `route.add`, `webhook.add`, …
    pub action: String,
    /// The folder, when one is concerned.
    pub folder: Option<String>,
    /// `ok` or an error code.
    pub outcome: String,
    /// Short facts (never a secret).
    pub detail: String,
}

const MSG_COLS: &str = "seq, id, chat_jid, direction, kind, sender, sender_name, content, \
                        timestamp, reply_to, turn_id, state, version";
/// How many columns [`MSG_COLS`] names: a query selecting `{MSG_COLS}, x` reads `x` here.
const MSG_NCOLS: usize = 13;

/// The columns [`group_row`] reads, by name.
const GROUP_COLUMNS: &str = "folder, name, system_prompt, grants, spec, approvals, updated_at";

fn group_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<GroupRow> {
    Ok(GroupRow {
        folder: r.get("folder")?,
        name: r.get("name")?,
        system_prompt: r.get("system_prompt")?,
        grants: r.get("grants")?,
        spec: r.get("spec")?,
        approvals: r.get("approvals")?,
        updated_at: r.get("updated_at")?,
    })
}

fn message(r: &rusqlite::Row<'_>) -> rusqlite::Result<MessageView> {
    let direction: String = r.get(3)?;
    let kind: String = r.get(4)?;
    Ok(MessageView {
        seq: r.get(0)?,
        id: r.get(1)?,
        chat_jid: r.get(2)?,
        direction: if direction == "in" {
            Direction::In
        } else {
            Direction::Out
        },
        kind: match kind.as_str() {
            "command" => MessageKind::Command,
            "notice" => MessageKind::Notice,
            "status" => MessageKind::Status,
            "task" => MessageKind::Task,
            "approval" => MessageKind::Approval,
            _ => MessageKind::Message,
        },
        sender: r.get(5)?,
        sender_name: r.get(6)?,
        content: r.get(7)?,
        timestamp: r.get(8)?,
        reply_to: r.get(9)?,
        turn_id: r.get(10)?,
        state: r.get(11)?,
        version: r.get(12)?,
    })
}

/// A scheduled task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskRow {
    /// `task-<hex>`.
    pub id: String,
    /// The group it belongs to.
    pub folder: String,
    /// The chat its prompt arrives in.
    pub chat_jid: String,
    /// The prompt.
    pub prompt: String,
    /// Its cron schedule; `None` for a one-off.
    pub cron: Option<String>,
    /// Unix ms of its next firing; `None` once it is over.
    pub next_at: Option<i64>,
    /// `active`, `done` or `cancelled`.
    pub state: String,
    /// How many times it fired.
    pub fired: i64,
    /// Unix ms of its last firing.
    pub last_fired_at: Option<i64>,
    /// The turn that scheduled it (or the operator).
    pub created_by: String,
    /// Unix ms.
    pub created_at: i64,
}

const TASK_COLS: &str = "id, folder, chat_jid, prompt, cron, next_at, state, fired, last_fired_at, \
                         created_by, created_at";

fn task_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TaskRow> {
    Ok(TaskRow {
        id: r.get(0)?,
        folder: r.get(1)?,
        chat_jid: r.get(2)?,
        prompt: r.get(3)?,
        cron: r.get(4)?,
        next_at: r.get(5)?,
        state: r.get(6)?,
        fired: r.get(7)?,
        last_fired_at: r.get(8)?,
        created_by: r.get(9)?,
        created_at: r.get(10)?,
    })
}

const TURN_COLS: &str = "turn_id, folder, chat_jid, state, attempt, run_id, outcome, error, \
                         replies, next_try_at, first_in_at, created_at, ended_at";

fn turn_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TurnRow> {
    Ok(TurnRow {
        turn_id: r.get(0)?,
        folder: r.get(1)?,
        chat_jid: r.get(2)?,
        state: r.get(3)?,
        attempt: r.get(4)?,
        run_id: r.get(5)?,
        outcome: r.get(6)?,
        error: r.get(7)?,
        replies: r.get(8)?,
        next_try_at: r.get(9)?,
        first_in_at: r.get(10)?,
        created_at: r.get(11)?,
        ended_at: r.get(12)?,
    })
}

/// routd's database. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
}

impl Store {
    /// Opens (creating and migrating) the database.
    pub async fn open(path: &Path) -> Result<Store, DbError> {
        Ok(Store {
            db: Db::open(path, MIGRATIONS).await?,
        })
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), DbError> {
        self.db.ping().await
    }

    // ---- messages ----

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
                    MessageKind::Command => inbound::HANDLED,
                    _ => inbound::PENDING,
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
                        state,
                        m.body_hash,
                        m.now
                    ],
                )?;
                let seq = tx.last_insert_rowid();
                let pending = i64::from(state == inbound::PENDING);
                tx.execute(
                    "INSERT INTO chats (jid, cursor, pending, updated_at) VALUES (?1, 0, ?3, ?2) \
                     ON CONFLICT (jid) DO UPDATE SET updated_at = ?2, pending = pending + ?3",
                    params![m.chat_jid, m.now, pending],
                )?;
                tx.commit()?;
                Ok(Ingested::New(seq))
            })
            .await
    }

    /// Appends an outbound message unless its id exists; `Some(seq)` when it was appended.
    pub async fn append_outbound(&self, o: NewOutbound) -> Result<Option<i64>, DbError> {
        self.db
            .call(move |c| {
                let state = if o.webhook {
                    outbound::DELIVERING
                } else {
                    outbound::SENT
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
                        state,
                        o.webhook.then_some(o.now)
                    ],
                )?;
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
    pub async fn chats_with_pending(&self) -> Result<Vec<String>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(
                    "SELECT jid FROM chats WHERE pending > 0 ORDER BY updated_at",
                )?;
                let rows = st
                    .query_map([], |r| r.get(0))?
                    .collect::<Result<Vec<String>, _>>()?;
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
                    .query_map(params![chat, limit as i64], |r| Ok((message(r)?, r.get(MSG_NCOLS)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Takes messages back from a turn (a steer runed did not deliver): they wait for the
    /// next turn.
    pub async fn uncover(&self, turn_id: &str, seqs: Vec<i64>) -> Result<(), DbError> {
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
        turn_id: &str,
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

    /// Counts one more reply of a turn; answers the new count.
    pub async fn add_reply(&self, turn_id: &str) -> Result<i64, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE turns SET replies = replies + 1 WHERE turn_id = ?1",
                    [&t],
                )?;
                Ok(
                    c.query_row("SELECT replies FROM turns WHERE turn_id = ?1", [&t], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await
    }

    /// The messages a turn covers, in order.
    pub async fn covered_by(&self, turn_id: &str) -> Result<Vec<MessageView>, DbError> {
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
        turn_id: &str,
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
                Ok(n)
            })
            .await
    }

    /// runed placed a follow-up in the run: its messages wait there for the run's end to
    /// say whether the agent took them.
    pub async fn steer_placed(&self, turn_id: &str, steer_id: &str) -> Result<(), DbError> {
        let (t, s) = (turn_id.to_owned(), steer_id.to_owned());
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE messages SET steering = 2 WHERE turn_id = ?1 AND steer_id = ?2 \
                     AND steering = 1",
                    params![t, s],
                )?;
                Ok(())
            })
            .await
    }

    /// A turn's follow-ups handed to runed without an answer (the call failed, or routd
    /// stopped): each steer id with its messages, oldest first. Asking runed again with the
    /// same id is safe: it never places one twice.
    pub async fn steers_unanswered(
        &self,
        turn_id: &str,
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
                    Ok((r.get::<_, Option<String>>(MSG_NCOLS)?, message(r)?))
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
        turn_id: &str,
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

    // ---- turns ----

    /// Creates a turn covering `seqs` (all must still be uncovered, else nothing changes and
    /// `false` comes back).
    pub async fn create_turn(&self, t: TurnRow, seqs: Vec<i64>) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let exists: bool = tx
                    .query_row("SELECT 1 FROM turns WHERE turn_id = ?1", [&t.turn_id], |_| {
                        Ok(true)
                    })
                    .optional()?
                    .unwrap_or(false);
                if exists {
                    return Ok(false);
                }
                tx.execute(
                    &format!("INSERT INTO turns ({TURN_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)"),
                    params![
                        t.turn_id, t.folder, t.chat_jid, t.state, t.attempt, t.run_id, t.outcome,
                        t.error, t.replies, t.next_try_at, t.first_in_at, t.created_at, t.ended_at
                    ],
                )?;
                for s in &seqs {
                    let n = tx.execute(
                        "UPDATE messages SET turn_id = ?1 WHERE seq = ?2 AND turn_id IS NULL \
                         AND state = 'pending'",
                        params![t.turn_id, s],
                    )?;
                    if n != 1 {
                        return Ok(false);
                    }
                }
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    /// One turn.
    pub async fn turn(&self, turn_id: &str) -> Result<Option<TurnRow>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {TURN_COLS} FROM turns WHERE turn_id = ?1"),
                    [&t],
                    turn_row,
                )
                .optional()?)
            })
            .await
    }

    /// Turns not over (starting, running, waiting), oldest first.
    pub async fn live_turns(&self) -> Result<Vec<TurnRow>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TURN_COLS} FROM turns WHERE state IN ('starting', 'running', 'waiting') \
                     ORDER BY created_at"
                ))?;
                let rows = st
                    .query_map([], turn_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Moves a turn between states (guarded: only from one of `from`); sets what is given.
    #[allow(clippy::too_many_arguments)]
    pub async fn update_turn(
        &self,
        turn_id: &str,
        from: &'static [&'static str],
        to: &'static str,
        attempt: Option<i64>,
        run_id: Option<Option<String>>,
        replies: Option<i64>,
        next_try_at: Option<Option<i64>>,
    ) -> Result<bool, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let list = from
                    .iter()
                    .map(|s| format!("'{s}'"))
                    .collect::<Vec<_>>()
                    .join(",");
                let sql = format!(
                    "UPDATE turns SET state = ?2, \
                     attempt = COALESCE(?3, attempt), \
                     run_id = CASE WHEN ?4 THEN ?5 ELSE run_id END, \
                     replies = COALESCE(?6, replies), \
                     next_try_at = CASE WHEN ?7 THEN ?8 ELSE next_try_at END \
                     WHERE turn_id = ?1 AND state IN ({list})"
                );
                let n = c.execute(
                    &sql,
                    params![
                        t,
                        to,
                        attempt,
                        run_id.is_some(),
                        run_id.flatten(),
                        replies,
                        next_try_at.is_some(),
                        next_try_at.flatten()
                    ],
                )?;
                Ok(n == 1)
            })
            .await
    }

    /// Ends a turn: its state, outcome and error, its messages `message_state`, and the chat's
    /// cursor moved past every message no longer pending. One transaction.
    pub async fn end_turn(
        &self,
        turn_id: &str,
        state: &'static str,
        outcome: Option<String>,
        error: Option<String>,
        message_state: &'static str,
        now: i64,
    ) -> Result<bool, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let n = tx.execute(
                    "UPDATE turns SET state = ?2, outcome = ?3, error = ?4, ended_at = ?5, \
                     next_try_at = NULL WHERE turn_id = ?1 AND state IN ('starting', 'running', 'waiting')",
                    params![t, state, outcome, error, now],
                )?;
                if n != 1 {
                    return Ok(false);
                }
                let ended = tx.execute(
                    "UPDATE messages SET state = ?2 WHERE turn_id = ?1 AND direction = 'in' \
                     AND state = 'pending' AND steering = 0",
                    params![t, message_state],
                )?;
                tx.execute(
                    "UPDATE chats SET pending = max(0, pending - ?2) \
                     WHERE jid = (SELECT chat_jid FROM turns WHERE turn_id = ?1)",
                    params![t, ended as i64],
                )?;
                // The cursor: the last inbound message before the first one still pending.
                tx.execute(
                    "UPDATE chats SET cursor = COALESCE( \
                       (SELECT max(seq) FROM messages m WHERE m.chat_jid = chats.jid AND m.direction = 'in' \
                        AND m.seq < COALESCE((SELECT min(seq) FROM messages p WHERE p.chat_jid = chats.jid \
                          AND p.direction = 'in' AND p.state = 'pending'), 9223372036854775807)), cursor), \
                     updated_at = ?2 \
                     WHERE jid = (SELECT chat_jid FROM turns WHERE turn_id = ?1)",
                    params![t, now],
                )?;
                tx.commit()?;
                Ok(true)
            })
            .await
    }

    /// Records a failed try: the outcome and error, kept while the turn waits.
    pub async fn note_try(
        &self,
        turn_id: &str,
        outcome: Option<String>,
        error: Option<String>,
    ) -> Result<(), DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE turns SET outcome = ?2, error = ?3 WHERE turn_id = ?1",
                    params![t, outcome, error],
                )?;
                Ok(())
            })
            .await
    }

    /// Whether a folder has a turn that is not over.
    pub async fn folder_busy(&self, folder: &str) -> Result<Option<TurnRow>, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!(
                        "SELECT {TURN_COLS} FROM turns WHERE folder = ?1 \
                         AND state IN ('starting', 'running', 'waiting') ORDER BY created_at LIMIT 1"
                    ),
                    [&f],
                    turn_row,
                )
                .optional()?)
            })
            .await
    }

    /// Turns, newest first, filtered by folder (and those below it) and state.
    pub async fn turns(
        &self,
        folder: Option<String>,
        state: Option<String>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<TurnRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TURN_COLS} FROM turns WHERE \
                     (?1 IS NULL OR folder = ?1 OR substr(folder, 1, length(?1) + 1) = ?1 || '/') \
                     AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR rowid < ?3) \
                     ORDER BY rowid DESC LIMIT ?4"
                ))?;
                let rows = st
                    .query_map(params![folder, state, before, limit as i64], turn_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// The rowid of a turn (the cursor of turn pages).
    pub async fn turn_rowid(&self, turn_id: &str) -> Result<Option<i64>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                Ok(
                    c.query_row("SELECT rowid FROM turns WHERE turn_id = ?1", [&t], |r| {
                        r.get(0)
                    })
                    .optional()?,
                )
            })
            .await
    }

    /// A turn as the API shows it.
    pub async fn turn_view(&self, t: TurnRow) -> Result<TurnView, DbError> {
        let covered = self.covered_by(&t.turn_id).await?;
        Ok(TurnView {
            turn_id: t.turn_id,
            folder: t.folder,
            chat_jid: t.chat_jid,
            state: t.state,
            attempt: t.attempt,
            run_id: t.run_id,
            outcome: t.outcome,
            error: t.error,
            replies: t.replies,
            messages: covered.into_iter().map(|m| m.id).collect(),
            created_at: t.created_at,
            ended_at: t.ended_at,
        })
    }

    /// The oldest pending inbound message's arrival per folder of a live or queued turn:
    /// (chat, created_at) of every chat's oldest pending message.
    pub async fn oldest_pending(&self) -> Result<Vec<(String, i64)>, DbError> {
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

    // ---- groups and sessions ----

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
                     updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (folder) DO \
                     UPDATE SET name = ?2, system_prompt = ?3, grants = ?4, spec = ?5, \
                     approvals = ?6, updated_at = ?7",
                    params![
                        g.folder,
                        g.name,
                        g.system_prompt,
                        g.grants,
                        g.spec,
                        g.approvals,
                        g.updated_at
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

    // ---- routes ----

    /// Adds a route at `position` (after the last when `None`).
    pub async fn add_route(
        &self,
        pattern: String,
        folder: String,
        position: Option<i64>,
        now: i64,
    ) -> Result<RouteRow, DbError> {
        self.db
            .call(move |c| {
                // The sum in Rust, saturating: SQLite turns an overflowing integer sum into a
                // REAL, which then fails to read back.
                let position = match position {
                    Some(p) => p,
                    None => c
                        .query_row("SELECT max(position) FROM routes", [], |r| {
                            r.get::<_, Option<i64>>(0)
                        })?
                        .unwrap_or(0)
                        .saturating_add(10),
                };
                c.execute(
                    "INSERT INTO routes (position, pattern, folder, created_at) VALUES (?1, ?2, ?3, ?4)",
                    params![position, pattern, folder, now],
                )?;
                Ok(RouteRow {
                    id: c.last_insert_rowid(),
                    position,
                    pattern,
                    folder,
                })
            })
            .await
    }

    /// Every route, in the order they are tried.
    pub async fn routes(&self) -> Result<Vec<RouteRow>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(
                    "SELECT id, position, pattern, folder FROM routes ORDER BY position, id",
                )?;
                let rows = st
                    .query_map([], |r| {
                        Ok(RouteRow {
                            id: r.get(0)?,
                            position: r.get(1)?,
                            pattern: r.get(2)?,
                            folder: r.get(3)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Removes a route; the removed row, if there was one.
    pub async fn delete_route(&self, id: i64) -> Result<Option<RouteRow>, DbError> {
        self.db
            .call(move |c| {
                let row = c
                    .query_row(
                        "SELECT id, position, pattern, folder FROM routes WHERE id = ?1",
                        [id],
                        |r| {
                            Ok(RouteRow {
                                id: r.get(0)?,
                                position: r.get(1)?,
                                pattern: r.get(2)?,
                                folder: r.get(3)?,
                            })
                        },
                    )
                    .optional()?;
                c.execute("DELETE FROM routes WHERE id = ?1", [id])?;
                Ok(row)
            })
            .await
    }

    // ---- webhooks and deliveries ----

    /// Adds a webhook; `None` when the prefix has one already.
    pub async fn add_webhook(
        &self,
        prefix: String,
        url: String,
        secret: String,
        now: i64,
    ) -> Result<Option<WebhookRow>, DbError> {
        self.db
            .call(move |c| {
                let n = c.execute(
                    "INSERT OR IGNORE INTO webhooks (prefix, url, secret, created_at) VALUES (?1, ?2, ?3, ?4)",
                    params![prefix, url, secret, now],
                )?;
                Ok((n == 1).then(|| WebhookRow {
                    id: c.last_insert_rowid(),
                    prefix,
                    url,
                    secret,
                }))
            })
            .await
    }

    /// Every webhook.
    pub async fn webhooks(&self) -> Result<Vec<WebhookRow>, DbError> {
        self.db
            .call(|c| {
                let mut st =
                    c.prepare_cached("SELECT id, prefix, url, secret FROM webhooks ORDER BY id")?;
                let rows = st
                    .query_map([], |r| {
                        Ok(WebhookRow {
                            id: r.get(0)?,
                            prefix: r.get(1)?,
                            url: r.get(2)?,
                            secret: r.get(3)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Removes a webhook; whether there was one.
    pub async fn delete_webhook(&self, id: i64) -> Result<bool, DbError> {
        self.db
            .call(move |c| Ok(c.execute("DELETE FROM webhooks WHERE id = ?1", [id])? == 1))
            .await
    }

    /// Outbound messages whose next webhook attempt is due, oldest first.
    pub async fn due_deliveries(
        &self,
        now: i64,
        limit: usize,
    ) -> Result<Vec<(MessageView, i64)>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {MSG_COLS}, attempts FROM messages WHERE state = 'delivering' \
                     AND next_try_at <= ?1 ORDER BY next_try_at, seq LIMIT ?2"
                ))?;
                let rows = st
                    .query_map(params![now, limit as i64], |r| {
                        Ok((message(r)?, r.get(MSG_NCOLS)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// The soonest next webhook attempt, if any message is delivering.
    pub async fn next_delivery_at(&self) -> Result<Option<i64>, DbError> {
        self.db
            .call(|c| {
                Ok(c.query_row(
                    "SELECT min(next_try_at) FROM messages WHERE state = 'delivering'",
                    [],
                    |r| r.get(0),
                )?)
            })
            .await
    }

    /// Records one delivery attempt and moves the message on: `delivered`, another try at
    /// `next` (`Some`), or `undeliverable` (`None` after a failure).
    #[allow(clippy::too_many_arguments)]
    pub async fn record_delivery(
        &self,
        seq: i64,
        webhook_id: i64,
        attempt: i64,
        status: Option<u16>,
        ok: bool,
        detail: String,
        next: Option<i64>,
        now: i64,
    ) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                tx.execute(
                    "INSERT INTO deliveries (message_seq, webhook_id, attempt, at, status, outcome, detail) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![
                        seq,
                        webhook_id,
                        attempt,
                        now,
                        status,
                        if ok { "ok" } else { "failed" },
                        detail
                    ],
                )?;
                let (state, next_at) = match (ok, next) {
                    (true, _) => (outbound::DELIVERED, None),
                    (false, Some(at)) => (outbound::DELIVERING, Some(at)),
                    (false, None) => (outbound::UNDELIVERABLE, None),
                };
                tx.execute(
                    "UPDATE messages SET state = ?2, attempts = ?3, next_try_at = ?4 \
                     WHERE seq = ?1 AND state = 'delivering'",
                    params![seq, state, attempt, next_at],
                )?;
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// Delivery attempts of a message: (attempt, status, outcome, detail).
    pub async fn deliveries(
        &self,
        seq: i64,
    ) -> Result<Vec<(i64, Option<u16>, String, String)>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT attempt, status, outcome, detail FROM deliveries WHERE message_seq = ?1 ORDER BY id",
                )?;
                let rows = st
                    .query_map([seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    // ---- audit ----

    /// Appends an audit row.
    pub async fn audit(&self, a: AuditRow) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO audit_log (at, actor, action, folder, outcome, detail) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![a.at, a.actor, a.action, a.folder, a.outcome, a.detail],
                )?;
                Ok(())
            })
            .await
    }

    /// Adds one answer's usage to its row.
    pub async fn add_llm_usage(&self, u: UsageRow) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.prepare_cached(
                    "INSERT INTO llm_usage (folder, day, turn_id, api, model, calls, input_tokens, output_tokens) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
                     ON CONFLICT (folder, day, turn_id, api, model) DO UPDATE SET \
                     calls = calls + excluded.calls, \
                     input_tokens = input_tokens + excluded.input_tokens, \
                     output_tokens = output_tokens + excluded.output_tokens",
                )?
                .execute(params![
                    u.folder,
                    u.day,
                    u.turn_id,
                    u.api,
                    u.model,
                    u.calls as i64,
                    u.input_tokens.min(i64::MAX as u64) as i64,
                    u.output_tokens.min(i64::MAX as u64) as i64,
                ])?;
                Ok(())
            })
            .await
    }

    /// Tokens (input and output) a group used on a day.
    pub async fn llm_used(&self, folder: &str, day: &str) -> Result<u64, DbError> {
        let (f, d) = (folder.to_owned(), day.to_owned());
        self.db
            .call(move |c| {
                // The folder and every folder below it (`a` covers `a/b`, never `ab`; no
                // LIKE: `_` is a wildcard there and a letter of folder names).
                let n: i64 = c
                    .prepare_cached(
                        "SELECT COALESCE(SUM(input_tokens + output_tokens), 0) FROM llm_usage \
                         WHERE day = ?2 AND (folder = ?1 \
                           OR substr(folder, 1, length(?1) + 1) = ?1 || '/')",
                    )?
                    .query_row(params![f, d], |r| r.get(0))?;
                Ok(n.max(0) as u64)
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

    /// Usage rows, filtered, newest day first, at most `limit`.
    pub async fn llm_usage(
        &self,
        folder: Option<String>,
        day: Option<String>,
        turn_id: Option<String>,
        limit: usize,
    ) -> Result<Vec<UsageRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT folder, day, turn_id, api, model, calls, input_tokens, output_tokens \
                     FROM llm_usage WHERE (?1 IS NULL OR folder = ?1) AND (?2 IS NULL OR day = ?2) \
                     AND (?3 IS NULL OR turn_id = ?3) \
                     ORDER BY day DESC, folder, turn_id, api, model LIMIT ?4",
                )?;
                let rows = st
                    .query_map(params![folder, day, turn_id, limit as i64], |r| {
                        Ok(UsageRow {
                            folder: r.get(0)?,
                            day: r.get(1)?,
                            turn_id: r.get(2)?,
                            api: r.get(3)?,
                            model: r.get(4)?,
                            calls: r.get::<_, i64>(5)?.max(0) as u64,
                            input_tokens: r.get::<_, i64>(6)?.max(0) as u64,
                            output_tokens: r.get::<_, i64>(7)?.max(0) as u64,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Audit rows, newest first, ids below `before`.
    pub async fn audit_rows(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, at, actor, action, folder, outcome, detail FROM audit_log \
                     WHERE (?1 IS NULL OR id < ?1) ORDER BY id DESC LIMIT ?2",
                )?;
                let rows = st
                    .query_map(params![before, limit as i64], |r| {
                        Ok(AuditRow {
                            id: r.get(0)?,
                            at: r.get(1)?,
                            actor: r.get(2)?,
                            action: r.get(3)?,
                            folder: r.get(4)?,
                            outcome: r.get(5)?,
                            detail: r.get(6)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    // ---- status ----

    /// Sets the turn's progress note: the first call appends it (id `<turn>.status`), later
    /// ones change its text in place: the same id, the next version, moved to the end of the
    /// log so that every reader after a seq (SSE, history) sees the edit. Returns its seq.
    pub async fn set_status(
        &self,
        turn_id: &str,
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
                    outbound::DELIVERING
                } else {
                    outbound::SENT
                };
                let next: i64 =
                    tx.query_row("SELECT coalesce(max(seq), 0) + 1 FROM messages", [], |r| {
                        r.get(0)
                    })?;
                let moved = tx.execute(
                    "UPDATE messages SET seq = ?2, content = ?3, version = version + 1, \
                     timestamp = ?4, state = ?5, attempts = 0, next_try_at = ?6 WHERE id = ?1",
                    params![id, next, text, now, state, webhook.then_some(now)],
                )?;
                if moved == 0 {
                    tx.execute(
                        "INSERT INTO messages (seq, id, chat_jid, direction, kind, sender, content, \
                         timestamp, turn_id, state, next_try_at, created_at) \
                         VALUES (?1, ?2, ?3, 'out', 'status', 'hako', ?4, ?5, ?6, ?7, ?8, ?5)",
                        params![next, id, chat, text, now, turn, state, webhook.then_some(now)],
                    )?;
                }
                tx.commit()?;
                Ok(next)
            })
            .await
    }

    // ---- tasks ----

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
                        task::ACTIVE,
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
    /// arrived.
    pub async fn fire_task(&self, t: TaskRow, now: i64) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let due_at = t.next_at.unwrap_or(now);
                let id = format!("task:{}:{due_at}", t.id);
                let added = tx.execute(
                    "INSERT OR IGNORE INTO messages (id, chat_jid, direction, kind, sender, \
                     sender_name, content, timestamp, state, created_at) \
                     VALUES (?1, ?2, 'in', 'task', ?3, 'scheduled task', ?4, ?5, 'pending', ?5)",
                    params![id, t.chat_jid, format!("task:{}", t.id), t.prompt, now],
                )?;
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
                let state = if next.is_some() { task::ACTIVE } else { task::DONE };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn inbound(id: &str, now: i64) -> NewInbound {
        NewInbound {
            id: id.into(),
            chat_jid: "tg:1".into(),
            kind: MessageKind::Message,
            sender: "alice".into(),
            sender_name: None,
            content: id.into(),
            timestamp: now,
            reply_to: None,
            body_hash: id.into(),
            now,
        }
    }

    async fn running_turn(store: &Store, seq: i64) -> String {
        let row = TurnRow {
            turn_id: "t-1".into(),
            folder: "f".into(),
            chat_jid: "tg:1".into(),
            state: turn::STARTING.into(),
            attempt: 1,
            run_id: None,
            outcome: None,
            error: None,
            replies: 0,
            next_try_at: None,
            first_in_at: 1,
            created_at: 1,
            ended_at: None,
        };
        assert!(store.create_turn(row, vec![seq]).await.unwrap());
        assert!(
            store
                .update_turn(
                    "t-1",
                    &[turn::STARTING],
                    turn::RUNNING,
                    None,
                    Some(Some("run-1".into())),
                    None,
                    None
                )
                .await
                .unwrap()
        );
        "t-1".into()
    }

    async fn state_of(store: &Store, seq: i64) -> (String, Option<String>) {
        let m = store.message(seq).await.unwrap().unwrap();
        (m.state, m.turn_id)
    }

    #[test]
    fn msg_ncols_counts_msg_cols() {
        assert_eq!(MSG_COLS.split(',').count(), MSG_NCOLS);
    }

    /// The column after the message's own is the one asked for: a webhook delivery's
    /// attempts grow (they were read from `version`, always 0, so a failing receiver was
    /// retried every second for a day, never backing off, never given up on), and a pending
    /// message's arrival time is its own (the turn latency metric read 0 and reported ~56
    /// years).
    #[tokio::test]
    async fn deliveries_count_their_attempts_and_pending_messages_their_arrival() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        store.ingest(inbound("m-1", 1_000)).await.unwrap();
        let pending = store.pending_of("tg:1", 10).await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].1, 1_000, "arrived at 1,000 ms");
        store
            .append_outbound(NewOutbound {
                id: "out-1".into(),
                chat_jid: "tg:1".into(),
                kind: MessageKind::Message,
                content: "hi".into(),
                turn_id: None,
                reply_to: None,
                webhook: true,
                now: 2_000,
            })
            .await
            .unwrap();
        for n in 1..=3 {
            let due = store.due_deliveries(i64::MAX, 10).await.unwrap();
            assert_eq!(due.len(), 1);
            let (m, attempts) = &due[0];
            assert_eq!(*attempts, n - 1, "attempts before try {n}");
            store
                .record_delivery(
                    m.seq,
                    1,
                    n,
                    Some(503),
                    false,
                    "no".into(),
                    Some(3_000),
                    3_000,
                )
                .await
                .unwrap();
        }
    }

    /// A route at the largest position (stored by an older routd, which took any) does not
    /// make every later route fail: SQLite turned the overflowing `max + 10` into a REAL
    /// (found by schemathesis as a 500 on `POST /v1/routes`).
    #[tokio::test]
    async fn a_route_at_the_largest_position_still_lets_the_next_one_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let first = store
            .add_route("a".into(), "f".into(), None, 1)
            .await
            .unwrap();
        assert_eq!(first.position, 10);
        store
            .add_route("b".into(), "f".into(), Some(i64::MAX - 3), 2)
            .await
            .unwrap();
        let next = store
            .add_route("c".into(), "f".into(), None, 3)
            .await
            .unwrap();
        assert_eq!(next.position, i64::MAX);
    }

    /// The turn's end answers what the agent took, never a follow-up the agent did not take:
    /// those wait for the next turn. Follow-ups whose answer from runed was lost are asked
    /// again by their id; a restart keeps a live turn's follow-ups for its run's end to
    /// decide, and hands back only those of a turn that is over.
    #[tokio::test]
    async fn a_turn_answers_exactly_the_follow_ups_its_agent_took() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let seq = |i: Ingested| match i {
            Ingested::New(s) => s,
            other => panic!("{other:?}"),
        };
        let first = seq(store.ingest(inbound("m-1", 1)).await.unwrap());
        let took = seq(store.ingest(inbound("m-2", 2)).await.unwrap());
        let back = seq(store.ingest(inbound("m-3", 3)).await.unwrap());
        let lost = seq(store.ingest(inbound("m-4", 4)).await.unwrap());
        let t = running_turn(&store, first).await;
        assert_eq!(store.cover(&t, "s-1", vec![took]).await.unwrap(), 1);
        store.steer_placed(&t, "s-1").await.unwrap();
        assert_eq!(store.cover(&t, "s-2", vec![back]).await.unwrap(), 1);
        store.steer_placed(&t, "s-2").await.unwrap();
        // runed's answer to this one was lost: it is asked for again, by the same id.
        assert_eq!(store.cover(&t, "s-3", vec![lost]).await.unwrap(), 1);
        let unanswered = store.steers_unanswered(&t).await.unwrap();
        assert_eq!(unanswered.len(), 1);
        assert_eq!(unanswered[0].0, "s-3");
        assert_eq!(unanswered[0].1[0].seq, lost);
        // A restart now keeps them all: the turn is live, its run's end decides.
        assert_eq!(store.release_steering().await.unwrap(), 0);
        // The run ends: the agent took s-1 (and s-3, placed by a repeat); s-2 came back.
        let (took_n, back_n) = store
            .resolve_steers(&t, vec!["s-1".into(), "s-3".into()])
            .await
            .unwrap();
        assert_eq!((took_n, back_n), (2, 1));
        assert!(
            store
                .end_turn(&t, turn::DONE, None, None, inbound::ANSWERED, 10)
                .await
                .unwrap()
        );
        assert_eq!(state_of(&store, first).await.0, "answered");
        assert_eq!(state_of(&store, took).await.0, "answered");
        assert_eq!(state_of(&store, lost).await.0, "answered");
        assert_eq!(state_of(&store, back).await, ("pending".into(), None));
        let pending: Vec<i64> = store
            .pending_of("tg:1", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|(m, _)| m.seq)
            .collect();
        assert_eq!(pending, [back]);
        // A turn that no longer runs takes no steer.
        assert_eq!(store.cover(&t, "s-4", vec![back]).await.unwrap(), 0);
    }

    /// A message left steering by a turn that is over (an older routd) waits for a turn again.
    #[tokio::test]
    async fn a_restart_hands_back_what_an_ended_turn_left_steering() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let seq = |i: Ingested| match i {
            Ingested::New(s) => s,
            other => panic!("{other:?}"),
        };
        let first = seq(store.ingest(inbound("m-1", 1)).await.unwrap());
        let cut = seq(store.ingest(inbound("m-2", 2)).await.unwrap());
        let t = running_turn(&store, first).await;
        assert_eq!(store.cover(&t, "s-1", vec![cut]).await.unwrap(), 1);
        assert!(
            store
                .end_turn(&t, turn::DONE, None, None, inbound::ANSWERED, 10)
                .await
                .unwrap()
        );
        assert_eq!(state_of(&store, cut).await, ("pending".into(), Some(t)));
        assert_eq!(store.release_steering().await.unwrap(), 1);
        assert_eq!(state_of(&store, cut).await, ("pending".into(), None));
    }
}
