//! The schema of `routd.db`, migration by migration (each applied once, in order).

use hako_shared::db::Migration;

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
    Migration {
        version: 9,
        name: "web sessions",
        sql: r#"
CREATE TABLE web_sessions (
    id_hash    TEXT PRIMARY KEY,
    link_jti   TEXT NOT NULL UNIQUE,
    csrf       TEXT NOT NULL,
    claims     TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    ended_at   INTEGER
);
"#,
    },
    Migration {
        version: 10,
        name: "who set each group",
        // Groups from before are the operator's: the value that gives tenants least.
        sql: r#"
ALTER TABLE groups ADD COLUMN set_by TEXT NOT NULL DEFAULT 'operator'
    CHECK (set_by IN ('operator', 'tenant', 'agent'));
"#,
    },
    Migration {
        version: 11,
        name: "approvals named by their call",
        sql: r#"
ALTER TABLE approvals ADD COLUMN call_key TEXT;
CREATE UNIQUE INDEX approvals_call ON approvals (turn_id, call_key) WHERE call_key IS NOT NULL;
"#,
    },
    Migration {
        version: 12,
        name: "audit rows keyed by request and turn",
        sql: r#"
ALTER TABLE audit_log ADD COLUMN request_id TEXT;
ALTER TABLE audit_log ADD COLUMN turn_id TEXT;
"#,
    },
    // Message ids are read back through the id grammar now. An agent's idempotency key or a
    // long command id could make an outbound id outside it before; such a message keeps its
    // place and text under an id made from its seq (a replay of its key would append anew).
    Migration {
        version: 13,
        name: "message ids in the id grammar",
        sql: r#"
UPDATE messages SET id = 'm-legacy-' || seq
    WHERE length(id) NOT BETWEEN 1 AND 128 OR id GLOB '*[^A-Za-z0-9._:-]*';
"#,
    },
    // runed's and routd's audit logs are one table shape (`hako_shared::audit::table`).
    Migration {
        version: 14,
        name: "audit rows as runed's: the run",
        sql: "ALTER TABLE audit_log ADD COLUMN run_id TEXT;",
    },
    // Rows read chat JIDs through the grammar now (1-256 characters). An earlier routd could
    // store a longer one: `spawn_group`'s `web:<folder>` of a folder over 252 characters. Such
    // a chat's work in flight ends, so that no scheduler pass or start-up reads it; its ended
    // rows stay (the API refuses the JID, as it always did).
    Migration {
        version: 15,
        name: "work of chats outside the JID grammar ended",
        sql: r#"
UPDATE messages SET state = 'failed'
    WHERE direction = 'in' AND state = 'pending' AND length(chat_jid) > 256;
UPDATE messages SET state = 'undeliverable'
    WHERE direction = 'out' AND state = 'delivering' AND length(chat_jid) > 256;
UPDATE chats SET pending = 0 WHERE length(jid) > 256;
UPDATE turns SET state = 'failed', error = 'its chat JID is longer than 256 characters',
    ended_at = CAST(strftime('%s', 'now') AS INTEGER) * 1000
    WHERE state IN ('starting', 'running', 'waiting') AND length(chat_jid) > 256;
UPDATE tasks SET state = 'cancelled' WHERE state = 'active' AND length(chat_jid) > 256;
UPDATE approvals SET state = 'abandoned'
    WHERE state = 'pending' AND length(chat_jid) > 256;
"#,
    },
];
