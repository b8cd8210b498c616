//! `authd.db`: signing keys, issued tokens (metadata only, never the token), revocations and
//! the audit log.
//!
//! Mints and service-token exchanges are the hot path. Their rows (one `issued_tokens` row and
//! one `audit_log` row each) go through a group-commit writer: requests queue their rows, the
//! writer yields once to the scheduler (so requests already running queue theirs too), then
//! drains whatever is queued into one transaction, and every request of the batch is
//! answered once that transaction commits. Under load the batches grow, so a commit is shared
//! by many requests instead of costing one each; with one request in flight nothing waits for
//! a timer.

use std::sync::LazyLock;
use std::time::Duration;

use hako_shared::auth::wire::{AuditEntry, AuditList, RevokedEntry};
use hako_shared::db::{CALL_TIMEOUT, Db, DbError, Migration};
use hako_shared::metrics::Histogram;
use rusqlite::{OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

/// authd's schema.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "keys, issued tokens, revocations, audit log",
        sql: r#"
CREATE TABLE keys (
    kid        TEXT PRIMARY KEY,
    secret     BLOB NOT NULL,
    created_at INTEGER NOT NULL,
    retired_at INTEGER,
    drop_after INTEGER
);
CREATE TABLE issued_tokens (
    jti        TEXT PRIMARY KEY,
    sub        TEXT NOT NULL,
    typ        TEXT NOT NULL,
    parent_jti TEXT,
    folder     TEXT,
    exp        INTEGER NOT NULL,
    issued_at  INTEGER NOT NULL
);
CREATE INDEX issued_tokens_parent ON issued_tokens (parent_jti);
CREATE INDEX issued_tokens_exp ON issued_tokens (exp);
CREATE TABLE revoked (
    jti        TEXT PRIMARY KEY,
    exp        INTEGER NOT NULL,
    revoked_at INTEGER NOT NULL
);
CREATE INDEX revoked_exp ON revoked (exp);
-- No AUTOINCREMENT (it costs a write to sqlite_sequence per row): ids still increase,
-- because pruning only ever deletes the oldest rows.
CREATE TABLE audit_log (
    id        INTEGER PRIMARY KEY,
    at        INTEGER NOT NULL,
    actor     TEXT NOT NULL,
    actor_jti TEXT,
    action    TEXT NOT NULL,
    outcome   TEXT NOT NULL,
    detail    TEXT NOT NULL DEFAULT ''
);
CREATE INDEX audit_log_at ON audit_log (at);
"#,
    },
    Migration {
        version: 2,
        name: "issued_tokens keyed by jti alone; no time indexes",
        // jtis are time-ordered (`crate::jti`), so keying the table by jti makes every mint an
        // append to one B-tree instead of a row plus a random entry in a separate jti index.
        // A mint writes three B-trees (token, parent index, audit row) instead of six.
        sql: r#"
CREATE TABLE issued_tokens_v2 (
    jti        TEXT PRIMARY KEY,
    sub        TEXT NOT NULL,
    typ        TEXT NOT NULL,
    parent_jti TEXT,
    folder     TEXT,
    exp        INTEGER NOT NULL,
    issued_at  INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO issued_tokens_v2 (jti, sub, typ, parent_jti, folder, exp, issued_at)
    SELECT jti, sub, typ, parent_jti, folder, exp, issued_at FROM issued_tokens;
DROP TABLE issued_tokens;
ALTER TABLE issued_tokens_v2 RENAME TO issued_tokens;
CREATE INDEX issued_tokens_parent ON issued_tokens (parent_jti);
-- Pruning walks the time order that jtis and audit ids already have (`Store::prune`), so
-- these two indexes cost every mint a B-tree insert for nothing.
DROP INDEX audit_log_at;
"#,
    },
    Migration {
        version: 3,
        name: "audit rows keyed by request",
        sql: "ALTER TABLE audit_log ADD COLUMN request_id TEXT;",
    },
];

/// Deepest chain of downscopes [`Store::ancestors`] walks.
pub const MAX_CHAIN: i64 = 64;
/// Most rows one group commit takes.
const MAX_BATCH_ROWS: usize = 4096;

/// A store failure.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbError),
    /// A group commit failed (the cause is logged once by the writer).
    #[error("commit failed: {0}")]
    Commit(String),
    /// Stored data is not what authd wrote.
    #[error("corrupt store: {0}")]
    Corrupt(String),
}

impl From<StoreError> for hako_shared::http::ApiError {
    /// The one mapping of store failures to the envelope: unavailable or stalled is 503.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Db(e) => e.into(),
            e => hako_shared::http::ApiError::internal(e),
        }
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Db(DbError::Sqlite(e))
    }
}

/// One audit row. Never holds a token or a secret.
#[derive(Debug, Clone)]
pub struct AuditRow {
    /// Unix milliseconds.
    pub at_ms: i64,
    /// Who acted.
    pub actor: String,
    /// The acting token's jti.
    pub actor_jti: Option<String>,
    /// What was attempted.
    pub action: hako_shared::audit::AuditAction,
    /// `ok` or the denial's error code.
    pub outcome: String,
    /// Short facts.
    pub detail: String,
    /// The request it was written for (the `x-request-id` authd answered).
    pub request_id: Option<String>,
}

/// Metadata of an issued token (never the token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedRow {
    /// Token id.
    pub jti: String,
    /// Subject.
    pub sub: String,
    /// `service` / `user` / `spawn`.
    pub typ: String,
    /// The parent's jti.
    pub parent_jti: Option<String>,
    /// Bound folder.
    pub folder: Option<String>,
    /// Expiry, Unix seconds.
    pub exp: i64,
    /// Issue time, Unix seconds.
    pub issued_at: i64,
}

/// A row for the group-commit writer.
#[derive(Debug)]
pub enum Row {
    /// A token was issued.
    Issued(IssuedRow),
    /// Something happened.
    Audit(AuditRow),
}

/// What a batch reports back to each request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Rows are durable.
    Ok,
    /// Rows are durable, but the issued token's parent was revoked before the token was
    /// recorded, so the token was revoked with it.
    ParentRevoked,
}

type Job = (Vec<Row>, oneshot::Sender<Result<Committed, String>>);

/// A stored signing key.
pub struct StoredKey {
    /// Key id.
    pub kid: String,
    /// The Ed25519 secret.
    pub secret: [u8; 32],
    /// `None` for the active key.
    pub drop_after: Option<i64>,
}

/// authd's database handle. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    db: Db,
    writer: mpsc::Sender<Job>,
}

impl Store {
    /// Opens and migrates `path`, and starts the group-commit writer.
    pub async fn open(path: &std::path::Path, batch_sizes: Histogram) -> Result<Self, StoreError> {
        let db = Db::open(path, MIGRATIONS).await?;
        let (writer, rx) = mpsc::channel(8192);
        tokio::spawn(write_loop(db.clone(), rx, batch_sizes));
        Ok(Self { db, writer })
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), StoreError> {
        Ok(self.db.ping().await?)
    }

    /// Queues `rows` for the next group commit and waits until it is durable.
    /// Waits at most [`CALL_TIMEOUT`]; rows still queued then are written later.
    pub async fn write(&self, rows: Vec<Row>) -> Result<Committed, StoreError> {
        let (tx, rx) = oneshot::channel();
        let wait = async {
            self.writer
                .send((rows, tx))
                .await
                .map_err(|_| StoreError::Db(DbError::Closed))?;
            rx.await
                .map_err(|_| StoreError::Db(DbError::Closed))?
                .map_err(StoreError::Commit)
        };
        tokio::time::timeout(CALL_TIMEOUT, wait)
            .await
            .unwrap_or(Err(StoreError::Db(DbError::Timeout(CALL_TIMEOUT))))
    }

    /// Keys that still verify at `now` (the active one has `drop_after: None`). Keys past
    /// their drop time are deleted: a private key that verifies nothing has no reason to exist.
    pub async fn load_keys(&self, now: i64) -> Result<Vec<StoredKey>, StoreError> {
        self.db
            .call(move |c| {
                c.execute(
                    "DELETE FROM keys WHERE drop_after IS NOT NULL AND drop_after <= ?1",
                    [now],
                )?;
                let mut st = c.prepare(
                    "SELECT kid, secret, drop_after FROM keys ORDER BY created_at DESC, rowid DESC",
                )?;
                let rows = st.query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, Option<i64>>(2)?,
                    ))
                })?;
                let mut out = Vec::new();
                for row in rows {
                    let (kid, secret, drop_after) = row?;
                    let secret: [u8; 32] = secret
                        .try_into()
                        .map_err(|_| StoreError::Corrupt(format!("key {kid} is not 32 bytes")))?;
                    out.push(StoredKey {
                        kid,
                        secret,
                        drop_after,
                    });
                }
                Ok(out)
            })
            .await
    }

    /// Stores a new active key (first start).
    pub async fn insert_active_key(
        &self,
        kid: String,
        secret: [u8; 32],
        now: i64,
        audit: AuditRow,
    ) -> Result<(), StoreError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                tx.execute(
                    "INSERT INTO keys (kid, secret, created_at) VALUES (?1, ?2, ?3)",
                    params![kid, &secret[..], now],
                )?;
                insert_audit(&tx, &audit)?;
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// Retires `old_kid` (it keeps verifying until `drop_after`) and makes `kid` active.
    pub async fn rotate(
        &self,
        old_kid: String,
        kid: String,
        secret: [u8; 32],
        now: i64,
        drop_after: i64,
        audit: AuditRow,
    ) -> Result<(), StoreError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                tx.execute(
                    "UPDATE keys SET retired_at = ?2, drop_after = ?3 WHERE kid = ?1",
                    params![old_kid, now, drop_after],
                )?;
                tx.execute(
                    "INSERT INTO keys (kid, secret, created_at) VALUES (?1, ?2, ?3)",
                    params![kid, &secret[..], now],
                )?;
                insert_audit(&tx, &audit)?;
                tx.commit()?;
                Ok(())
            })
            .await
    }

    /// The issued token `jti`, if recorded.
    pub async fn issued(&self, jti: String) -> Result<Option<IssuedRow>, StoreError> {
        self.db
            .call(move |c| {
                c.query_row(
                    "SELECT jti, sub, typ, parent_jti, folder, exp, issued_at
                     FROM issued_tokens WHERE jti = ?1",
                    [jti],
                    |r| {
                        Ok(IssuedRow {
                            jti: r.get(0)?,
                            sub: r.get(1)?,
                            typ: r.get(2)?,
                            parent_jti: r.get(3)?,
                            folder: r.get(4)?,
                            exp: r.get(5)?,
                            issued_at: r.get(6)?,
                        })
                    },
                )
                .optional()
                .map_err(StoreError::from)
            })
            .await
    }

    /// The jtis `jti` was minted from: its parent, the parent's parent, … (at most
    /// [`MAX_CHAIN`] steps).
    pub async fn ancestors(&self, jti: String) -> Result<Vec<String>, StoreError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "WITH RECURSIVE up(jti, depth) AS (
                         SELECT parent_jti, 1 FROM issued_tokens WHERE jti = ?1
                         UNION ALL
                         SELECT i.parent_jti, up.depth + 1 FROM issued_tokens i
                         JOIN up ON i.jti = up.jti
                         WHERE up.depth < ?2
                     )
                     SELECT jti FROM up WHERE jti IS NOT NULL",
                )?;
                let rows = st.query_map(params![jti, MAX_CHAIN], |r| r.get::<_, String>(0))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
    }

    /// Revokes `jti` and every not-yet-expired token minted from it, directly or through
    /// children, in one transaction with its audit row. Returns what was revoked.
    pub async fn revoke_tree(
        &self,
        jti: String,
        now: i64,
        audit: AuditRow,
    ) -> Result<Vec<RevokedEntry>, StoreError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let found = {
                    let mut st = tx.prepare(
                        "WITH RECURSIVE tree(jti) AS (
                             SELECT ?1
                             UNION
                             SELECT i.jti FROM issued_tokens i JOIN tree t ON i.parent_jti = t.jti
                         )
                         SELECT i.jti, i.exp FROM issued_tokens i JOIN tree USING (jti)
                         WHERE i.exp > ?2",
                    )?;
                    let rows = st.query_map(params![jti, now], |r| {
                        Ok(RevokedEntry {
                            jti: r.get(0)?,
                            exp: r.get(1)?,
                        })
                    })?;
                    rows.collect::<Result<Vec<_>, _>>()?
                };
                for e in &found {
                    tx.execute(
                        "INSERT OR IGNORE INTO revoked (jti, exp, revoked_at) VALUES (?1, ?2, ?3)",
                        params![e.jti, e.exp, now],
                    )?;
                }
                let mut audit = audit;
                audit.detail = format!("{} revoked={}", audit.detail, found.len());
                insert_audit(&tx, &audit)?;
                tx.commit()?;
                Ok(found)
            })
            .await
    }

    /// Revoked tokens not yet expired at `now`.
    pub async fn revoked(&self, now: i64) -> Result<Vec<RevokedEntry>, StoreError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT jti, exp FROM revoked WHERE exp > ?1 ORDER BY revoked_at, jti",
                )?;
                let rows = st.query_map([now], |r| {
                    Ok(RevokedEntry {
                        jti: r.get(0)?,
                        exp: r.get(1)?,
                    })
                })?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
    }

    /// A page of the audit log, newest first.
    pub async fn audit(&self, limit: u32, before: Option<i64>) -> Result<AuditList, StoreError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id, at, actor, actor_jti, action, outcome, detail, request_id FROM audit_log
                     WHERE id < ?1 ORDER BY id DESC LIMIT ?2",
                )?;
                let rows = st.query_map(params![before.unwrap_or(i64::MAX), limit], |r| {
                    Ok(AuditEntry {
                        id: r.get(0)?,
                        at: r.get(1)?,
                        actor: r.get(2)?,
                        actor_jti: r.get(3)?,
                        action: r.get(4)?,
                        outcome: r.get(5)?,
                        detail: r.get(6)?,
                        request_id: r.get(7)?,
                    })
                })?;
                let entries = rows.collect::<Result<Vec<_>, _>>()?;
                let next_before = if entries.len() as u32 == limit {
                    entries.last().map(|e| e.id)
                } else {
                    None
                };
                Ok(AuditList {
                    entries,
                    next_before,
                })
            })
            .await
    }

    /// Deletes what no longer matters: expired token rows and revocations, keys past their
    /// drop time, audit rows older than `audit_retention`.
    ///
    /// There is no index on expiry or on audit time: each mint would pay for one. Both tables
    /// are in time order already (jtis begin with their issue time; audit ids grow), so a
    /// prune walks from the oldest row and stops at the first that must stay.
    pub async fn prune(
        &self,
        now: i64,
        skew: Duration,
        audit_retention: Duration,
        scan: IssuedScan,
    ) -> Result<(), StoreError> {
        let skew = skew.as_secs() as i64;
        let expired_before = now - skew - 60;
        let audit_cutoff_ms = (now - audit_retention.as_secs() as i64).saturating_mul(1000);
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                match scan {
                    IssuedScan::All => {
                        tx.execute("DELETE FROM issued_tokens WHERE exp < ?1", [expired_before])?
                    }
                    IssuedScan::OlderThan(life) => {
                        let issued_before = now
                            .saturating_sub(life.as_secs() as i64)
                            .saturating_mul(1000);
                        tx.execute(
                            "DELETE FROM issued_tokens WHERE jti < ?1 AND exp < ?2",
                            params![crate::jti::floor(issued_before), expired_before],
                        )?
                    }
                };
                tx.execute("DELETE FROM revoked WHERE exp < ?1", [expired_before])?;
                tx.execute(
                    "DELETE FROM keys WHERE drop_after IS NOT NULL AND drop_after <= ?1",
                    [now],
                )?;
                // Up to the first row young enough to keep (or all, if none is).
                tx.execute(
                    "DELETE FROM audit_log WHERE id < COALESCE(
                         (SELECT id FROM audit_log WHERE at >= ?1 ORDER BY id LIMIT 1),
                         (SELECT COALESCE(MAX(id), 0) + 1 FROM audit_log))",
                    [audit_cutoff_ms],
                )?;
                tx.commit()?;
                Ok(())
            })
            .await
    }
}

/// Which `issued_tokens` rows a prune examines.
#[derive(Debug, Clone, Copy)]
pub enum IssuedScan {
    /// Every row. Used once at start: rows written before jtis were time-ordered can sort
    /// anywhere, and the configured lifetimes may have been longer before the restart.
    All,
    /// Rows issued more than this long ago (the longest token life): nothing younger can
    /// have expired, so the walk stops there.
    OlderThan(Duration),
}

fn insert_audit(c: &rusqlite::Connection, a: &AuditRow) -> rusqlite::Result<()> {
    AUDIT.write(c, &[a], bind_audit)
}

/// Rows one multi-row `INSERT` writes. A statement's fixed cost (cursors opened and closed,
/// the program started and halted) is paid once per this many rows; smaller remainders go
/// one row per statement, so only two statements per table are ever prepared.
const ROWS_PER_INSERT: usize = 16;

/// A table the group commit appends to, as a multi-row `INSERT`. The statement texts are
/// built once, not per batch.
struct Append {
    cols: usize,
    /// The statement for one row.
    one: LazyLock<String>,
    /// The statement for [`ROWS_PER_INSERT`] rows.
    many: LazyLock<String>,
}

const ISSUED_HEAD: &str =
    "INSERT INTO issued_tokens (jti, sub, typ, parent_jti, folder, exp, issued_at) VALUES ";
const ISSUED_COLS: usize = 7;
static ISSUED: Append = Append {
    cols: ISSUED_COLS,
    one: LazyLock::new(|| values(ISSUED_HEAD, ISSUED_COLS, 1)),
    many: LazyLock::new(|| values(ISSUED_HEAD, ISSUED_COLS, ROWS_PER_INSERT)),
};

const AUDIT_HEAD: &str =
    "INSERT INTO audit_log (at, actor, actor_jti, action, outcome, detail, request_id) VALUES ";
const AUDIT_COLS: usize = 7;
static AUDIT: Append = Append {
    cols: AUDIT_COLS,
    one: LazyLock::new(|| values(AUDIT_HEAD, AUDIT_COLS, 1)),
    many: LazyLock::new(|| values(AUDIT_HEAD, AUDIT_COLS, ROWS_PER_INSERT)),
};

/// `head` followed by `rows` groups of `cols` placeholders.
fn values(head: &str, cols: usize, rows: usize) -> String {
    let one = format!("({})", vec!["?"; cols].join(","));
    format!("{head}{}", vec![one; rows].join(","))
}

impl Append {
    /// Inserts every row, binding each through `bind(statement, first parameter, row)`.
    fn write<R>(
        &self,
        c: &rusqlite::Connection,
        rows: &[&R],
        bind: impl Fn(&mut rusqlite::CachedStatement<'_>, usize, &R) -> rusqlite::Result<()>,
    ) -> rusqlite::Result<()> {
        let mut chunks = rows.chunks_exact(ROWS_PER_INSERT);
        if chunks.len() > 0 {
            let mut st = c.prepare_cached(&self.many)?;
            for chunk in &mut chunks {
                for (i, r) in chunk.iter().enumerate() {
                    bind(&mut st, 1 + i * self.cols, r)?;
                }
                st.raw_execute()?;
            }
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut st = c.prepare_cached(&self.one)?;
            for r in rest {
                bind(&mut st, 1, r)?;
                st.raw_execute()?;
            }
        }
        Ok(())
    }
}

fn bind_issued(
    st: &mut rusqlite::CachedStatement<'_>,
    at: usize,
    r: &IssuedRow,
) -> rusqlite::Result<()> {
    st.raw_bind_parameter(at, &r.jti)?;
    st.raw_bind_parameter(at + 1, &r.sub)?;
    st.raw_bind_parameter(at + 2, &r.typ)?;
    st.raw_bind_parameter(at + 3, &r.parent_jti)?;
    st.raw_bind_parameter(at + 4, &r.folder)?;
    st.raw_bind_parameter(at + 5, r.exp)?;
    st.raw_bind_parameter(at + 6, r.issued_at)
}

fn bind_audit(
    st: &mut rusqlite::CachedStatement<'_>,
    at: usize,
    a: &AuditRow,
) -> rusqlite::Result<()> {
    st.raw_bind_parameter(at, a.at_ms)?;
    st.raw_bind_parameter(at + 1, &a.actor)?;
    st.raw_bind_parameter(at + 2, &a.actor_jti)?;
    st.raw_bind_parameter(at + 3, a.action.as_str())?;
    st.raw_bind_parameter(at + 4, &a.outcome)?;
    st.raw_bind_parameter(at + 5, &a.detail)?;
    st.raw_bind_parameter(at + 6, &a.request_id)
}

/// Writes one batch in one transaction; returns each job's outcome in order.
fn commit_batch(
    c: &mut rusqlite::Connection,
    jobs: &[Vec<Row>],
) -> rusqlite::Result<Vec<Committed>> {
    // Cached statements rather than `Connection::transaction`, which parses BEGIN and COMMIT
    // again for every batch.
    c.prepare_cached("BEGIN")?.execute([])?;
    let result = write_batch(c, jobs).and_then(|out| {
        c.prepare_cached("COMMIT")?.execute([])?;
        Ok(out)
    });
    if result.is_err() && !c.is_autocommit() {
        // The error is what the caller reports; a failed rollback leaves nothing to add.
        let _ = c.execute_batch("ROLLBACK");
    }
    result
}

fn write_batch(c: &rusqlite::Connection, jobs: &[Vec<Row>]) -> rusqlite::Result<Vec<Committed>> {
    let mut out = vec![Committed::Ok; jobs.len()];
    let mut issued: Vec<&IssuedRow> = Vec::with_capacity(jobs.len());
    let mut owner: Vec<usize> = Vec::with_capacity(jobs.len());
    let mut audit: Vec<&AuditRow> = Vec::with_capacity(jobs.len());
    for (j, job) in jobs.iter().enumerate() {
        for row in job {
            match row {
                Row::Issued(r) => {
                    issued.push(r);
                    owner.push(j);
                }
                Row::Audit(a) => audit.push(a),
            }
        }
    }
    ISSUED.write(c, &issued, bind_issued)?;
    // Checked inside the same serial order as revocations: either the revocation's tree walk
    // ran first (then the parent is in `revoked` here) or this batch did (then the tree walk
    // finds the children). No child of a revoked token can slip between the two. A batch has
    // few distinct parents (runed's service token mints most spawn tokens), so each is
    // looked up once.
    let mut parents: Vec<&str> = issued
        .iter()
        .filter_map(|r| r.parent_jti.as_deref())
        .collect();
    parents.sort_unstable();
    parents.dedup();
    let mut is_revoked = c.prepare_cached("SELECT 1 FROM revoked WHERE jti = ?1")?;
    let mut revoked_parents = Vec::new();
    for p in parents {
        if is_revoked.exists([p])? {
            revoked_parents.push(p);
        }
    }
    if !revoked_parents.is_empty() {
        let mut revoke = c.prepare_cached(
            "INSERT OR IGNORE INTO revoked (jti, exp, revoked_at) VALUES (?1, ?2, ?3)",
        )?;
        for (r, &j) in issued.iter().zip(&owner) {
            if r.parent_jti
                .as_deref()
                .is_some_and(|p| revoked_parents.contains(&p))
            {
                revoke.execute(params![r.jti, r.exp, r.issued_at])?;
                out[j] = Committed::ParentRevoked;
            }
        }
    }
    // Audit ids keep the order the requests were queued in.
    AUDIT.write(c, &audit, bind_audit)?;
    Ok(out)
}

async fn write_loop(db: Db, mut rx: mpsc::Receiver<Job>, batch_sizes: Histogram) {
    while let Some(first) = rx.recv().await {
        // Let the requests already running on this thread queue their rows first: no timer,
        // just one turn of the scheduler, and the batch is shared by more of them.
        tokio::task::yield_now().await;
        let mut rows_n = first.0.len();
        let mut jobs = vec![first];
        // Take whatever queued up while the previous batch was committing.
        while rows_n < MAX_BATCH_ROWS {
            match rx.try_recv() {
                Ok(job) => {
                    rows_n += job.0.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        batch_sizes.observe(jobs.len() as f64);
        let (rows, waiters): (Vec<Vec<Row>>, Vec<_>) = jobs.into_iter().unzip();
        let result = db
            .call(move |c| commit_batch(c, &rows).map_err(DbError::from))
            .await;
        match result {
            Ok(outcomes) => {
                for (w, o) in waiters.into_iter().zip(outcomes) {
                    let _ = w.send(Ok(o));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, jobs = waiters.len(), "group commit failed");
                let msg = e.to_string();
                for w in waiters {
                    let _ = w.send(Err(msg.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::metrics::Metrics;

    fn sizes() -> Histogram {
        Metrics::default().histogram("t", "t", &[], &[1.0])
    }

    fn issued(jti: &str, parent: Option<&str>) -> IssuedRow {
        IssuedRow {
            jti: jti.into(),
            sub: "runed".into(),
            typ: "spawn".into(),
            parent_jti: parent.map(Into::into),
            folder: Some("acme".into()),
            exp: i64::MAX / 2,
            issued_at: 1,
        }
    }

    /// One group commit of many mints (full multi-row statements and a remainder) records
    /// every token and audit row, in queue order, and revokes exactly the children of a
    /// parent that was revoked before the batch.
    #[tokio::test]
    async fn a_large_batch_keeps_every_row_and_catches_revoked_parents() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("authd.db"), sizes())
            .await
            .unwrap();
        store
            .db
            .call(|c| {
                c.execute(
                    "INSERT INTO revoked (jti, exp, revoked_at) VALUES ('gone', ?1, 1)",
                    [i64::MAX / 2],
                )
                .map_err(DbError::from)
            })
            .await
            .unwrap();
        let n = 2 * ROWS_PER_INSERT + 5;
        let jobs: Vec<Vec<Row>> = (0..n)
            .map(|i| {
                let parent = if i % 7 == 3 { "gone" } else { "live" };
                vec![
                    Row::Issued(issued(&format!("t{i:03}"), Some(parent))),
                    Row::Audit(AuditRow {
                        at_ms: i as i64,
                        actor: "runed".into(),
                        actor_jti: Some(parent.into()),
                        action: hako_shared::audit::AuditAction::TokenMint,
                        outcome: "ok".into(),
                        detail: format!("jti=t{i:03}"),
                        request_id: None,
                    }),
                ]
            })
            .collect();
        let outcomes = store
            .db
            .call(move |c| commit_batch(c, &jobs).map_err(DbError::from))
            .await
            .unwrap();
        for (i, o) in outcomes.iter().enumerate() {
            let want = if i % 7 == 3 {
                Committed::ParentRevoked
            } else {
                Committed::Ok
            };
            assert_eq!(*o, want, "job {i}");
        }
        let (tokens, details, revoked) = store
            .db
            .call(|c| {
                let tokens: i64 =
                    c.query_row("SELECT count(*) FROM issued_tokens", [], |r| r.get(0))?;
                let mut st = c.prepare("SELECT detail FROM audit_log ORDER BY id")?;
                let details = st
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                let mut st =
                    c.prepare("SELECT jti FROM revoked WHERE jti != 'gone' ORDER BY jti")?;
                let revoked = st
                    .query_map([], |r| r.get::<_, String>(0))?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok::<_, DbError>((tokens, details, revoked))
            })
            .await
            .unwrap();
        assert_eq!(tokens, n as i64);
        let want: Vec<String> = (0..n).map(|i| format!("jti=t{i:03}")).collect();
        assert_eq!(details, want);
        let want: Vec<String> = (0..n)
            .filter(|i| i % 7 == 3)
            .map(|i| format!("t{i:03}"))
            .collect();
        assert_eq!(revoked, want);
        assert_eq!(
            store.issued("t010".into()).await.unwrap(),
            Some(issued("t010", Some("gone")))
        );
    }

    /// A batch that fails part-way leaves nothing behind, and the next batch commits.
    #[tokio::test]
    async fn a_failed_batch_rolls_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("authd.db"), sizes())
            .await
            .unwrap();
        // The second job repeats the first one's jti: the primary key refuses it.
        let jobs = vec![
            vec![Row::Issued(issued("dup", None))],
            vec![Row::Issued(issued("dup", None))],
        ];
        let err = store
            .db
            .call(move |c| commit_batch(c, &jobs).map_err(DbError::from))
            .await;
        assert!(err.is_err());
        assert_eq!(store.issued("dup".into()).await.unwrap(), None);
        store
            .write(vec![Row::Issued(issued("next", None))])
            .await
            .unwrap();
        assert!(store.issued("next".into()).await.unwrap().is_some());
    }

    /// A database written by the first schema keeps its tokens, and their revocation trees,
    /// through the move of `issued_tokens` to a jti-keyed table.
    #[tokio::test]
    async fn v1_tokens_survive_the_migration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("authd.db");
        {
            const V1: &[Migration] = MIGRATIONS.split_at(1).0;
            let db = Db::open(&path, V1).await.unwrap();
            db.call(|c| {
                for (jti, parent) in [("p", None), ("c1", Some("p")), ("c2", Some("c1"))] {
                    c.execute(
                        "INSERT INTO issued_tokens (jti, sub, typ, parent_jti, folder, exp, issued_at)
                         VALUES (?1, 'runed', 'spawn', ?2, 'acme', ?3, 1)",
                        params![jti, parent, i64::MAX / 2],
                    )?;
                }
                Ok::<_, DbError>(())
            })
            .await
            .unwrap();
        }
        let store = Store::open(&path, sizes()).await.unwrap();
        assert_eq!(
            store.issued("c1".into()).await.unwrap(),
            Some(issued("c1", Some("p")))
        );
        assert_eq!(store.ancestors("c2".into()).await.unwrap(), ["c1", "p"]);
        // New rows go in beside the old ones, and a revocation still walks the whole tree.
        store
            .write(vec![Row::Issued(issued("c3", Some("c2")))])
            .await
            .unwrap();
        let audit = AuditRow {
            at_ms: 1,
            actor: "t".into(),
            actor_jti: None,
            action: hako_shared::audit::AuditAction::TokenRevoke,
            outcome: "ok".into(),
            detail: String::new(),
            request_id: None,
        };
        let mut gone: Vec<String> = store
            .revoke_tree("p".into(), 2, audit)
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.jti)
            .collect();
        gone.sort();
        assert_eq!(gone, ["c1", "c2", "c3", "p"]);
        let without_rowid: String = store
            .db
            .call(|c| {
                c.query_row(
                    "SELECT sql FROM sqlite_master WHERE name = 'issued_tokens'",
                    [],
                    |r| r.get(0),
                )
                .map_err(DbError::from)
            })
            .await
            .unwrap();
        assert!(without_rowid.contains("WITHOUT ROWID"), "{without_rowid}");
    }

    /// Prune removes expired tokens, revocations and old audit rows and keeps the rest,
    /// walking the time order of jtis and audit ids instead of indexes.
    #[tokio::test]
    async fn prune_walks_time_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("authd.db"), sizes())
            .await
            .unwrap();
        let now = 1_763_900_000i64;
        let hour = 3600;
        let row = |jti: String, issued_at: i64, exp: i64| IssuedRow {
            jti,
            issued_at,
            exp,
            ..issued("x", None)
        };
        let jti_at = |secs: i64| crate::jti::new(secs * 1000).unwrap();
        let old_expired = jti_at(now - 2 * hour);
        // Issued long ago under a longer configured life: still valid, must stay.
        let old_valid = jti_at(now - 2 * hour);
        let young_expired = jti_at(now - 600);
        let young_valid = jti_at(now - 60);
        // A jti from before time order: random, sorts anywhere.
        let legacy = "zzzzzzzzzzzzzzzzzzzzzz".to_owned();
        let audit = |at_s: i64| {
            Row::Audit(AuditRow {
                at_ms: at_s * 1000,
                actor: "t".into(),
                actor_jti: None,
                action: hako_shared::audit::AuditAction::TokenMint,
                outcome: "ok".into(),
                detail: String::new(),
                request_id: None,
            })
        };
        store
            .write(vec![
                Row::Issued(row(old_expired.clone(), now - 2 * hour, now - hour)),
                Row::Issued(row(old_valid.clone(), now - 2 * hour, now + hour)),
                Row::Issued(row(young_expired.clone(), now - 600, now - 300)),
                Row::Issued(row(young_valid.clone(), now - 60, now + 60)),
                Row::Issued(row(legacy.clone(), now - 2 * hour, now - hour)),
                audit(now - 3 * 86_400),
                audit(now - 2 * 86_400),
                audit(now - 60),
            ])
            .await
            .unwrap();
        let left = |store: Store| async move {
            store
                .db
                .call(|c| {
                    let mut st = c.prepare("SELECT jti FROM issued_tokens ORDER BY jti")?;
                    let jtis = st
                        .query_map([], |r| r.get::<_, String>(0))?
                        .collect::<Result<Vec<_>, _>>()?;
                    let audits: i64 =
                        c.query_row("SELECT count(*) FROM audit_log", [], |r| r.get(0))?;
                    Ok::<_, DbError>((jtis, audits))
                })
                .await
                .unwrap()
        };
        let skew = Duration::from_secs(30);
        let day = Duration::from_secs(86_400);
        // The periodic prune: longest life one hour. Only the old expired row goes (the
        // young expired one is left for a later walk; the legacy one sorts past the floor).
        store
            .prune(
                now,
                skew,
                day,
                IssuedScan::OlderThan(Duration::from_secs(3600)),
            )
            .await
            .unwrap();
        let (jtis, audits) = left(store.clone()).await;
        let mut want = vec![
            old_valid.clone(),
            young_expired.clone(),
            young_valid.clone(),
            legacy.clone(),
        ];
        want.sort();
        assert_eq!(jtis, want);
        assert_eq!(audits, 1, "audit rows older than the retention go");
        // The start-up prune looks at every row.
        store.prune(now, skew, day, IssuedScan::All).await.unwrap();
        let (jtis, _) = left(store.clone()).await;
        let mut want = vec![old_valid, young_valid];
        want.sort();
        assert_eq!(jtis, want);
        // An audit log with nothing young enough to keep is emptied.
        store
            .prune(now + 2 * 86_400, skew, day, IssuedScan::All)
            .await
            .unwrap();
        assert_eq!(left(store).await.1, 0);
    }
}
