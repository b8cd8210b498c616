//! `runed.db`: runs (`spawns`) and their output, logs, sessions, spawn tokens and the audit
//! log. Every state change is a guarded `UPDATE … WHERE state IN (…)`, so a transition that
//! lost a race (a kill against a start) changes nothing and says so.
//!
//! Secrets never reach this database: a run's request is stored without them.

use std::path::Path;

use hako_shared::contract::OutputBlock;
use hako_shared::db::{Db, DbError, Migration};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::{Outcome, RunState, SessionEntry, SpawnKind, SteerState};
use rusqlite::{OptionalExtension, params};

/// The schema, in order.
pub static MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "runs, outputs, logs, sessions, tokens, audit",
        sql: r#"
CREATE TABLE spawns (
    run_id       TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('run', 'hold')),
    folder       TEXT NOT NULL,
    turn_id      TEXT NOT NULL,
    session_id   TEXT NOT NULL DEFAULT '',
    state        TEXT NOT NULL,
    outcome      TEXT,
    exit_code    INTEGER,
    error        TEXT,
    truncated    INTEGER NOT NULL DEFAULT 0,
    container_id TEXT,
    request      TEXT,
    had_secrets  INTEGER NOT NULL DEFAULT 0,
    actor        TEXT NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    started_at   INTEGER,
    ended_at     INTEGER
);
CREATE UNIQUE INDEX spawns_turn ON spawns (turn_id) WHERE kind = 'run';
CREATE INDEX spawns_state ON spawns (state);
CREATE INDEX spawns_ended ON spawns (ended_at);
CREATE TABLE spawn_outputs (
    run_id TEXT NOT NULL REFERENCES spawns (run_id) ON DELETE CASCADE,
    idx    INTEGER NOT NULL,
    block  TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE spawn_logs (
    run_id TEXT PRIMARY KEY REFERENCES spawns (run_id) ON DELETE CASCADE,
    at     INTEGER NOT NULL,
    log    TEXT NOT NULL
);
CREATE TABLE session_log (
    id             INTEGER PRIMARY KEY,
    folder         TEXT NOT NULL,
    session_id     TEXT NOT NULL,
    new_session_id TEXT,
    run_id         TEXT NOT NULL,
    turn_id        TEXT NOT NULL,
    outcome        TEXT NOT NULL,
    at             INTEGER NOT NULL
);
CREATE INDEX session_log_folder ON session_log (folder, id);
CREATE TABLE mcp_tokens (
    jti        TEXT PRIMARY KEY,
    run_id     TEXT NOT NULL,
    folder     TEXT NOT NULL,
    expires_at INTEGER NOT NULL,
    revoked_at INTEGER
);
CREATE INDEX mcp_tokens_run ON mcp_tokens (run_id);
CREATE TABLE audit_log (
    id      INTEGER PRIMARY KEY,
    at      INTEGER NOT NULL,
    actor   TEXT NOT NULL,
    action  TEXT NOT NULL,
    run_id  TEXT,
    folder  TEXT,
    outcome TEXT NOT NULL,
    detail  TEXT NOT NULL DEFAULT ''
);
"#,
    },
    // A turn id is unique within its folder only: across folders, a tenant could learn that
    // another tenant's turn id exists (409), or claim it first.
    Migration {
        version: 2,
        name: "turn ids unique per folder",
        sql: r#"
DROP INDEX spawns_turn;
CREATE UNIQUE INDEX spawns_turn ON spawns (folder, turn_id) WHERE kind = 'run';
"#,
    },
    // A follow-up's fate outlives the call that placed it: the caller asks again by its id,
    // and a restarted runed settles what a dead one placed.
    Migration {
        version: 3,
        name: "follow-ups placed into runs",
        sql: r#"
CREATE TABLE steers (
    run_id     TEXT NOT NULL REFERENCES spawns (run_id) ON DELETE CASCADE,
    steer_id   TEXT NOT NULL,
    file       TEXT NOT NULL,
    state      TEXT NOT NULL CHECK (state IN ('placed', 'taken', 'returned')),
    created_at INTEGER NOT NULL,
    decided_at INTEGER,
    PRIMARY KEY (run_id, steer_id)
);
CREATE INDEX steers_placed ON steers (run_id) WHERE state = 'placed';
"#,
    },
    // A run that took a warm box: the box's labels were written before the run existed, so
    // its deadline (and, in `container_id`, the box) is recorded here for re-adoption.
    Migration {
        version: 4,
        name: "a run's deadline, for runs in warm boxes",
        sql: "ALTER TABLE spawns ADD COLUMN deadline_at INTEGER;",
    },
    // The request an audit row was written for: routd's rows of the same request (a group
    // deleted there, its folder retired here) carry the same id.
    Migration {
        version: 5,
        name: "audit rows keyed by request",
        sql: "ALTER TABLE audit_log ADD COLUMN request_id TEXT;",
    },
    // runed's and routd's audit logs are one table shape (`hako_shared::audit::table`).
    Migration {
        version: 6,
        name: "audit rows keyed by turn",
        sql: "ALTER TABLE audit_log ADD COLUMN turn_id TEXT;",
    },
];

/// One row of `steers`: a follow-up placed into a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SteerRow {
    /// The caller's id.
    pub steer_id: String,
    /// Its file name in the folder's follow-up drop.
    pub file: String,
    /// Where it is.
    pub state: SteerState,
}

fn steer_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SteerRow> {
    Ok(SteerRow {
        steer_id: r.get("steer_id")?,
        file: r.get("file")?,
        state: r.get("state")?,
    })
}

/// One row of `spawns`.
#[derive(Debug, Clone, PartialEq)]
pub struct SpawnRow {
    /// The run.
    pub run_id: RunId,
    /// A run or a hold.
    pub kind: SpawnKind,
    /// Its folder.
    pub folder: String,
    /// Its turn (a hold's is `hold:<run id>`).
    pub turn_id: TurnId,
    /// Session resumed.
    pub session_id: String,
    /// State.
    pub state: RunState,
    /// Outcome, once terminal.
    pub outcome: Option<Outcome>,
    /// Exit code.
    pub exit_code: Option<i64>,
    /// Error text.
    pub error: Option<String>,
    /// Whether output was cut.
    pub truncated: bool,
    /// The container.
    pub container_id: Option<String>,
    /// The request without its secrets (JSON).
    pub request: Option<String>,
    /// Whether the request carried secrets (which were not stored).
    pub had_secrets: bool,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub started_at: Option<i64>,
    /// Unix ms.
    pub ended_at: Option<i64>,
    /// Unix ms of the run's ceiling, when its container's labels cannot say it (a warm box).
    pub deadline_at: Option<i64>,
}

/// How a terminal transition is recorded.
#[derive(Debug, Clone)]
pub struct EndRow {
    /// Final state.
    pub state: RunState,
    /// Outcome.
    pub outcome: Outcome,
    /// Exit code.
    pub exit_code: Option<i64>,
    /// Error text.
    pub error: Option<String>,
    /// Output cut.
    pub truncated: bool,
    /// Container id.
    pub container_id: Option<String>,
    /// Unix ms of the container start.
    pub started_at: Option<i64>,
    /// Unix ms.
    pub ended_at: i64,
}

pub use hako_shared::audit::AuditRow;

/// The result of inserting a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Inserted {
    /// A new row.
    New,
    /// The turn already had this run.
    Existing(Box<SpawnRow>),
}

const COLS: &str = "run_id, kind, folder, turn_id, session_id, state, outcome, exit_code, error, \
                    truncated, container_id, request, had_secrets, created_at, started_at, ended_at, \
                    deadline_at";

/// A spawn row, read by column name (queries select [`COLS`], perhaps among others).
fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SpawnRow> {
    Ok(SpawnRow {
        run_id: r.get("run_id")?,
        kind: r.get("kind")?,
        folder: r.get("folder")?,
        turn_id: r.get("turn_id")?,
        session_id: r.get("session_id")?,
        state: r.get("state")?,
        outcome: r.get("outcome")?,
        exit_code: r.get("exit_code")?,
        error: r.get("error")?,
        truncated: r.get::<_, i64>("truncated")? != 0,
        container_id: r.get("container_id")?,
        request: r.get("request")?,
        had_secrets: r.get::<_, i64>("had_secrets")? != 0,
        created_at: r.get("created_at")?,
        started_at: r.get("started_at")?,
        ended_at: r.get("ended_at")?,
        deadline_at: r.get("deadline_at")?,
    })
}

fn states(list: &[RunState]) -> String {
    list.iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(",")
}

/// runed's database. Cheap to clone.
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

    /// Inserts a new run, or returns the run its turn (in its folder) already has.
    pub async fn insert(&self, new: SpawnRow) -> Result<Inserted, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                if new.kind == SpawnKind::Run {
                    let sql = format!(
                        "SELECT {COLS} FROM spawns WHERE folder = ?1 AND turn_id = ?2 AND kind = 'run'"
                    );
                    if let Some(existing) = tx
                        .query_row(&sql, params![new.folder, new.turn_id], row)
                        .optional()?
                    {
                        return Ok(Inserted::Existing(Box::new(existing)));
                    }
                }
                tx.execute(
                    &format!(
                        "INSERT INTO spawns ({COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17)"
                    ),
                    params![
                        new.run_id,
                        new.kind.as_str(),
                        new.folder,
                        new.turn_id,
                        new.session_id,
                        new.state.as_str(),
                        new.outcome.map(|o| o.as_str()),
                        new.exit_code,
                        new.error,
                        new.truncated as i64,
                        new.container_id,
                        new.request,
                        new.had_secrets as i64,
                        new.created_at,
                        new.started_at,
                        new.ended_at,
                        new.deadline_at
                    ],
                )?;
                tx.commit()?;
                Ok(Inserted::New)
            })
            .await
    }

    /// One run.
    pub async fn get(&self, run_id: &RunId) -> Result<Option<SpawnRow>, DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                let sql = format!("SELECT {COLS} FROM spawns WHERE run_id = ?1");
                Ok(c.query_row(&sql, [&id], row).optional()?)
            })
            .await
    }

    /// The run a folder's turn has, if any.
    pub async fn run_of_turn(
        &self,
        folder: &str,
        turn_id: &TurnId,
    ) -> Result<Option<SpawnRow>, DbError> {
        let (f, t) = (folder.to_owned(), turn_id.clone());
        self.db
            .call(move |c| {
                let sql = format!(
                    "SELECT {COLS} FROM spawns WHERE folder = ?1 AND turn_id = ?2 AND kind = 'run'"
                );
                Ok(c.query_row(&sql, params![f, t], row).optional()?)
            })
            .await
    }

    /// Runs and holds, newest first: of `folder` and the folders below it, in `state`, with a
    /// rowid below `before` (the previous page's last); each with its rowid.
    pub async fn list(
        &self,
        folder: Option<String>,
        state: Option<RunState>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<(i64, SpawnRow)>, DbError> {
        let state = state.map(|s| s.as_str().to_owned());
        self.db
            .call(move |c| {
                // A prefix test that takes the folder as it is (LIKE would read `_` as a
                // wildcard).
                let sql = format!(
                    "SELECT rowid, {COLS} FROM spawns \
                     WHERE (?1 IS NULL OR folder = ?1 OR substr(folder, 1, length(?1) + 1) = ?1 || '/') \
                     AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR rowid < ?3) \
                     ORDER BY rowid DESC LIMIT ?4"
                );
                let mut st = c.prepare_cached(&sql)?;
                let rows = st
                    .query_map(rusqlite::params![folder, state, before, limit as i64], |r| {
                        let id: i64 = r.get("rowid")?;
                        Ok((id, row(r)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Runs not yet terminal, oldest first.
    pub async fn unfinished(&self) -> Result<Vec<SpawnRow>, DbError> {
        self.db
            .call(|c| {
                let sql = format!(
                    "SELECT {COLS} FROM spawns WHERE state IN ({}) ORDER BY created_at, rowid",
                    states(&[RunState::Queued, RunState::Starting, RunState::Running])
                );
                let mut st = c.prepare(&sql)?;
                let rows = st.query_map([], row)?.collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Moves a run from one of `from` to `to`; `false` when it was in none of them.
    pub async fn transition(
        &self,
        run_id: &RunId,
        from: &[RunState],
        to: RunState,
    ) -> Result<bool, DbError> {
        let id = run_id.to_owned();
        let sql = format!(
            "UPDATE spawns SET state = ?2 WHERE run_id = ?1 AND state IN ({})",
            states(from)
        );
        self.db
            .call(move |c| Ok(c.execute(&sql, params![id, to.as_str()])? == 1))
            .await
    }

    /// `starting → running`, with the container.
    pub async fn mark_running(
        &self,
        run_id: &RunId,
        container_id: &str,
        at: i64,
    ) -> Result<bool, DbError> {
        let (id, cid) = (run_id.to_owned(), container_id.to_owned());
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE spawns SET state = 'running', container_id = ?2, started_at = ?3 \
                     WHERE run_id = ?1 AND state IN ('starting', 'queued')",
                    params![id, cid, at],
                )? == 1)
            })
            .await
    }

    /// `starting → running` in a warm box: the box and the run's deadline, which the box's
    /// labels (written before the run existed) cannot say.
    pub async fn bind_warm(
        &self,
        run_id: &RunId,
        container_id: &str,
        at: i64,
        deadline_at: i64,
    ) -> Result<bool, DbError> {
        let (id, cid) = (run_id.to_owned(), container_id.to_owned());
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE spawns SET state = 'running', container_id = ?2, started_at = ?3, \
                     deadline_at = ?4 WHERE run_id = ?1 AND state IN ('starting', 'queued')",
                    params![id, cid, at, deadline_at],
                )? == 1)
            })
            .await
    }

    /// Ends a run that is in one of `from`; `false` when it already ended (or never started
    /// and `from` excludes `queued`).
    pub async fn end_run(
        &self,
        run_id: &RunId,
        from: &[RunState],
        f: EndRow,
    ) -> Result<bool, DbError> {
        let id = run_id.to_owned();
        let sql = format!(
            "UPDATE spawns SET state = ?2, outcome = ?3, exit_code = ?4, error = ?5, truncated = ?6, \
             container_id = COALESCE(?7, container_id), started_at = COALESCE(?8, started_at), \
             ended_at = ?9, request = NULL WHERE run_id = ?1 AND state IN ({})",
            states(from)
        );
        self.db
            .call(move |c| {
                Ok(c.execute(
                    &sql,
                    params![
                        id,
                        f.state.as_str(),
                        f.outcome.as_str(),
                        f.exit_code,
                        f.error,
                        f.truncated as i64,
                        f.container_id,
                        f.started_at,
                        f.ended_at
                    ],
                )? == 1)
            })
            .await
    }

    /// Records a run's end in one transaction: the blocks the event stream may have missed,
    /// the guarded terminal transition, and (only if that transition happened) the run log
    /// and the session row. `false`: the run had already ended (or was not in `from`).
    pub async fn record_end(
        &self,
        run_id: &RunId,
        from: &[RunState],
        f: EndRow,
        blocks: Vec<OutputBlock>,
        log: String,
        session: SessionEntry,
    ) -> Result<bool, DbError> {
        let id = run_id.to_owned();
        let sql = format!(
            "UPDATE spawns SET state = ?2, outcome = ?3, exit_code = ?4, error = ?5, truncated = ?6, \
             container_id = COALESCE(?7, container_id), started_at = COALESCE(?8, started_at), \
             ended_at = ?9, request = NULL WHERE run_id = ?1 AND state IN ({})",
            states(from)
        );
        let texts: Vec<String> = blocks
            .iter()
            .map(|b| serde_json::to_string(b).unwrap_or_else(|_| "{}".into()))
            .collect();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                {
                    let mut add = tx.prepare_cached(
                        "INSERT OR IGNORE INTO spawn_outputs (run_id, idx, block) VALUES (?1, ?2, ?3)",
                    )?;
                    for (i, t) in texts.iter().enumerate() {
                        add.execute(params![id, i as i64, t])?;
                    }
                }
                let ended = tx.execute(
                    &sql,
                    params![
                        id,
                        f.state.as_str(),
                        f.outcome.as_str(),
                        f.exit_code,
                        f.error,
                        f.truncated as i64,
                        f.container_id,
                        f.started_at,
                        f.ended_at
                    ],
                )? == 1;
                if ended {
                    tx.execute(
                        "INSERT OR REPLACE INTO spawn_logs (run_id, at, log) VALUES (?1, ?2, ?3)",
                        params![id, f.ended_at, log],
                    )?;
                    tx.execute(
                        "INSERT INTO session_log (folder, session_id, new_session_id, run_id, turn_id, outcome, at) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                        params![
                            session.folder,
                            session.session_id,
                            session.new_session_id,
                            session.run_id,
                            session.turn_id,
                            session.outcome.as_str(),
                            session.at
                        ],
                    )?;
                }
                tx.commit()?;
                Ok(ended)
            })
            .await
    }

    // ---- follow-ups ----

    /// Records a follow-up placed (about to be shown) in a run: `false` when the run already
    /// has one of that id (a repeat of the same call).
    pub async fn add_steer(
        &self,
        run_id: &RunId,
        steer_id: &str,
        file: &str,
        at: i64,
    ) -> Result<bool, DbError> {
        let (r, s, f) = (run_id.to_owned(), steer_id.to_owned(), file.to_owned());
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "INSERT OR IGNORE INTO steers (run_id, steer_id, file, state, created_at) \
                     VALUES (?1, ?2, ?3, 'placed', ?4)",
                    params![r, s, f, at],
                )? == 1)
            })
            .await
    }

    /// One follow-up of a run.
    pub async fn steer(&self, run_id: &RunId, steer_id: &str) -> Result<Option<SteerRow>, DbError> {
        let (r, s) = (run_id.to_owned(), steer_id.to_owned());
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT steer_id, file, state FROM steers WHERE run_id = ?1 AND steer_id = ?2",
                    params![r, s],
                    steer_row,
                )
                .optional()?)
            })
            .await
    }

    /// A run's follow-ups, oldest first.
    pub async fn steers(&self, run_id: &RunId) -> Result<Vec<SteerRow>, DbError> {
        let r = run_id.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT steer_id, file, state FROM steers WHERE run_id = ?1 \
                     ORDER BY created_at, rowid",
                )?;
                let rows = st
                    .query_map([&r], steer_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Records what became of a run's placed follow-ups (each moves once).
    pub async fn decide_steers(
        &self,
        run_id: &RunId,
        fates: Vec<(String, SteerState)>,
        at: i64,
    ) -> Result<(), DbError> {
        let r = run_id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                for (id, state) in fates {
                    tx.execute(
                        "UPDATE steers SET state = ?3, decided_at = ?4 \
                         WHERE run_id = ?1 AND steer_id = ?2 AND state = 'placed'",
                        params![r, id, state.as_str(), at],
                    )?;
                }
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// Records output block `idx` (a re-delivered index is ignored).
    pub async fn add_output(
        &self,
        run_id: &RunId,
        idx: usize,
        block: &OutputBlock,
    ) -> Result<(), DbError> {
        let id = run_id.to_owned();
        let text = serde_json::to_string(block).unwrap_or_else(|_| "{}".into());
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR IGNORE INTO spawn_outputs (run_id, idx, block) VALUES (?1, ?2, ?3)",
                    params![id, idx as i64, text],
                )?;
                Ok(())
            })
            .await
    }

    /// A run's output blocks, in order.
    pub async fn outputs(&self, run_id: &RunId) -> Result<Vec<OutputBlock>, DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                let mut st =
                    c.prepare("SELECT block FROM spawn_outputs WHERE run_id = ?1 ORDER BY idx")?;
                let rows = st
                    .query_map([&id], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows
                    .iter()
                    .filter_map(|t| serde_json::from_str(t).ok())
                    .collect())
            })
            .await
    }

    /// A run's output blocks from index `from` on, with their indexes.
    pub async fn outputs_from(
        &self,
        run_id: &RunId,
        from: usize,
    ) -> Result<Vec<(usize, OutputBlock)>, DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT idx, block FROM spawn_outputs WHERE run_id = ?1 AND idx >= ?2 ORDER BY idx",
                )?;
                let rows = st
                    .query_map(params![id, from as i64], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows
                    .into_iter()
                    .filter_map(|(i, t)| Some((i as usize, serde_json::from_str(&t).ok()?)))
                    .collect())
            })
            .await
    }

    /// Stores a run's log.
    pub async fn put_log(&self, run_id: &RunId, at: i64, log: String) -> Result<(), DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR REPLACE INTO spawn_logs (run_id, at, log) VALUES (?1, ?2, ?3)",
                    params![id, at, log],
                )?;
                Ok(())
            })
            .await
    }

    /// A run's log.
    pub async fn log(&self, run_id: &RunId) -> Result<Option<String>, DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                Ok(
                    c.query_row("SELECT log FROM spawn_logs WHERE run_id = ?1", [&id], |r| {
                        r.get(0)
                    })
                    .optional()?,
                )
            })
            .await
    }

    /// Appends to the session history.
    pub async fn add_session(&self, s: SessionEntry) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO session_log (folder, session_id, new_session_id, run_id, turn_id, outcome, at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                    params![s.folder, s.session_id, s.new_session_id, s.run_id, s.turn_id, s.outcome.as_str(), s.at],
                )?;
                Ok(())
            })
            .await
    }

    /// Session history, newest first, optionally only folders matching `folder` (the folder
    /// itself and those below it), ids below `before`.
    pub async fn sessions(
        &self,
        folder: Option<String>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<SessionEntry>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare(
                    "SELECT id, folder, session_id, new_session_id, run_id, turn_id, outcome, at \
                     FROM session_log WHERE (?1 IS NULL OR folder = ?1 OR substr(folder, 1, length(?1) + 1) = ?1 || '/') \
                     AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3",
                )?;
                let rows = st
                    .query_map(params![folder, before, limit as i64], |r| {
                        Ok(SessionEntry {
                            id: r.get("id")?,
                            folder: r.get("folder")?,
                            session_id: r.get("session_id")?,
                            new_session_id: r.get("new_session_id")?,
                            run_id: r.get("run_id")?,
                            turn_id: r.get("turn_id")?,
                            outcome: r.get("outcome")?,
                            at: r.get("at")?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Records a spawn token.
    pub async fn add_token(
        &self,
        jti: &str,
        run_id: &RunId,
        folder: &str,
        expires_at: i64,
    ) -> Result<(), DbError> {
        let (j, r, f) = (jti.to_owned(), run_id.to_owned(), folder.to_owned());
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT OR IGNORE INTO mcp_tokens (jti, run_id, folder, expires_at) VALUES (?1, ?2, ?3, ?4)",
                    params![j, r, f, expires_at],
                )?;
                Ok(())
            })
            .await
    }

    /// The unrevoked spawn tokens of a run.
    pub async fn live_tokens(&self, run_id: &RunId) -> Result<Vec<String>, DbError> {
        let id = run_id.to_owned();
        self.db
            .call(move |c| {
                let mut st = c.prepare(
                    "SELECT jti FROM mcp_tokens WHERE run_id = ?1 AND revoked_at IS NULL",
                )?;
                let rows = st
                    .query_map([&id], |r| r.get(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Spawn tokens still to revoke: unrevoked, unexpired, and their run is over (or gone).
    /// Revocation that failed at a run's end is retried from here. `(jti, run_id)`.
    pub async fn tokens_to_revoke(&self, now_secs: i64) -> Result<Vec<(String, String)>, DbError> {
        let sql = format!(
            "SELECT t.jti, t.run_id FROM mcp_tokens t LEFT JOIN spawns s ON s.run_id = t.run_id \
             WHERE t.revoked_at IS NULL AND t.expires_at >= ?1 \
             AND (s.run_id IS NULL OR s.state IN ({})) LIMIT 1000",
            states(&[
                RunState::Exited,
                RunState::Error,
                RunState::Killed,
                RunState::TimedOut
            ])
        );
        self.db
            .call(move |c| {
                let mut st = c.prepare(&sql)?;
                let rows = st
                    .query_map([now_secs], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Marks a spawn token revoked.
    pub async fn token_revoked(&self, jti: &str, at: i64) -> Result<(), DbError> {
        let j = jti.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE mcp_tokens SET revoked_at = ?2 WHERE jti = ?1",
                    params![j, at],
                )?;
                Ok(())
            })
            .await
    }

    /// Appends an audit row.
    pub async fn audit(&self, a: AuditRow) -> Result<(), DbError> {
        self.db
            .call(move |c| Ok(hako_shared::audit::table::insert(c, &a)?))
            .await
    }

    /// Audit rows, newest first, ids below `before`.
    pub async fn audit_rows(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<AuditRow>, DbError> {
        self.db
            .call(move |c| Ok(hako_shared::audit::table::page(c, before, limit)?))
            .await
    }

    /// Prunes finished runs (with their output and logs), sessions, audit rows and tokens
    /// older than `cutoff` (Unix ms); expired tokens go when `now` passes them.
    pub async fn prune(&self, cutoff: i64, now_secs: i64) -> Result<usize, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let mut n = tx.execute(
                    &format!(
                        "DELETE FROM spawns WHERE ended_at IS NOT NULL AND ended_at < ?1 AND state IN ({})",
                        states(&[RunState::Exited, RunState::Error, RunState::Killed, RunState::TimedOut])
                    ),
                    [cutoff],
                )?;
                n += tx.execute("DELETE FROM session_log WHERE at < ?1", [cutoff])?;
                n += tx.execute("DELETE FROM audit_log WHERE at < ?1", [cutoff])?;
                n += tx.execute("DELETE FROM mcp_tokens WHERE expires_at < ?1", [now_secs])?;
                tx.commit()?;
                Ok(n)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rid(id: &str) -> RunId {
        RunId::new(id).unwrap()
    }

    fn new_row(id: &str, turn: &str) -> SpawnRow {
        SpawnRow {
            run_id: rid(id),
            kind: SpawnKind::Run,
            folder: "a".into(),
            turn_id: TurnId::new(turn).unwrap(),
            session_id: String::new(),
            state: RunState::Queued,
            outcome: None,
            exit_code: None,
            error: None,
            truncated: false,
            container_id: None,
            request: Some("{}".into()),
            had_secrets: false,
            created_at: 1,
            started_at: None,
            ended_at: None,
            deadline_at: None,
        }
    }

    #[tokio::test]
    async fn transitions_are_guarded_and_turns_unique() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("runed.db")).await.unwrap();
        assert_eq!(s.insert(new_row("r1", "t1")).await.unwrap(), Inserted::New);
        match s.insert(new_row("r2", "t1")).await.unwrap() {
            Inserted::Existing(r) => assert_eq!(r.run_id, "r1"),
            other => panic!("{other:?}"),
        }
        // A token of an ended run that was never revoked is found again (and only it).
        s.add_token("j1", &rid("r1"), "a", 100).await.unwrap();
        s.add_token("j3", &rid("r3"), "b", 100).await.unwrap();
        s.add_token("j9", &rid("gone"), "a", 100).await.unwrap();
        // The same turn id in another folder is another turn.
        let mut other = new_row("r3", "t1");
        other.folder = "b".into();
        assert_eq!(s.insert(other).await.unwrap(), Inserted::New);
        // A kill of a queued run wins; the start that comes after it changes nothing.
        let killed = EndRow {
            state: RunState::Killed,
            outcome: Outcome::Killed,
            exit_code: None,
            error: None,
            truncated: false,
            container_id: None,
            started_at: None,
            ended_at: 5,
        };
        assert!(
            s.end_run(&rid("r1"), &[RunState::Queued], killed.clone())
                .await
                .unwrap()
        );
        assert!(
            !s.transition(&rid("r1"), &[RunState::Queued], RunState::Starting)
                .await
                .unwrap()
        );
        assert!(
            !s.end_run(&rid("r1"), &[RunState::Queued], killed)
                .await
                .unwrap()
        );
        let r = s.get(&rid("r1")).await.unwrap().unwrap();
        assert_eq!(
            (r.state, r.outcome),
            (RunState::Killed, Some(Outcome::Killed))
        );
        let mut due = s.tokens_to_revoke(50).await.unwrap();
        due.sort();
        assert_eq!(
            due,
            [("j1".into(), "r1".into()), ("j9".into(), "gone".into())]
        );
        s.token_revoked("j1", 60).await.unwrap();
        assert_eq!(s.tokens_to_revoke(50).await.unwrap().len(), 1);
        assert!(
            s.tokens_to_revoke(101).await.unwrap().is_empty(),
            "expired ones need nothing"
        );
        assert_eq!(r.request, None, "the request is dropped once the run ends");
        assert_eq!(s.prune(10, 0).await.unwrap(), 1);
        assert!(s.get(&rid("r1")).await.unwrap().is_none());
    }

    #[tokio::test]
    async fn a_row_this_build_cannot_read_is_an_error_not_a_guess() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(&dir.path().join("runed.db")).await.unwrap();
        s.insert(new_row("r1", "t1")).await.unwrap();
        let row = s.get(&rid("r1")).await.unwrap().unwrap();
        assert_eq!((row.kind, row.state), (SpawnKind::Run, RunState::Queued));
        assert_eq!(row.turn_id, "t1");
        for (col, bad) in [
            // (`kind` has a CHECK: the database itself refuses another.)
            ("state", "paused"),
            ("outcome", "maybe"),
            ("turn_id", "t/1"),
        ] {
            let fix = format!("UPDATE spawns SET {col} = ?1 WHERE run_id = 'r1'");
            let good: String =
                s.db.call(move |c| {
                    let sql = format!("SELECT coalesce({col}, 'ok') FROM spawns");
                    let was: String = c.query_row(&sql, [], |r| r.get(0))?;
                    c.execute(&fix, [bad])?;
                    Ok::<_, DbError>(was)
                })
                .await
                .unwrap();
            assert!(s.get(&rid("r1")).await.is_err(), "{col} = {bad:?} was read");
            assert!(
                s.list(None, None, None, 10).await.is_err(),
                "{col} = {bad:?} was listed"
            );
            // Put it back (a null outcome stays null).
            s.db.call(move |c| {
                let sql = format!("UPDATE spawns SET {col} = nullif(?1, 'ok') WHERE run_id = 'r1'");
                c.execute(&sql, [good])?;
                Ok::<_, DbError>(())
            })
            .await
            .unwrap();
            assert!(s.get(&rid("r1")).await.unwrap().is_some());
        }
    }
}
