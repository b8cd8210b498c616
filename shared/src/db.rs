//! SQLite helpers: one connection per database, owned by a dedicated thread so that no
//! blocking call ever runs on the async runtime; WAL, busy timeout and foreign keys on every
//! connection; ordered embedded migrations tracked in `PRAGMA user_version`.
//!
//! A database whose version is higher than the code's newest migration is refused: running an
//! old binary against a newer schema would corrupt it silently.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::{mpsc, oneshot};

/// One schema step. Versions start at 1 and increase by one.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// The schema version this step produces.
    pub version: u32,
    /// A short description, for logs.
    pub name: &'static str,
    /// The SQL to run (may hold several statements).
    pub sql: &'static str,
}

/// Database failures.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// SQLite said no.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Could not create the file or its directory.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The database was written by a newer hako.
    #[error(
        "database {path} is at schema version {found}, newer than this build's {supported}; run a newer hako or restore a backup"
    )]
    TooNew {
        /// The database.
        path: PathBuf,
        /// Its version.
        found: u32,
        /// The newest this code knows.
        supported: u32,
    },
    /// The migration list is malformed (a programming error caught at start).
    #[error("migration list is invalid: {0}")]
    BadMigrations(String),
    /// The database thread is gone.
    #[error("database thread stopped")]
    Closed,
    /// The database thread did not answer in time (a stalled disk, a runaway query).
    #[error("the database did not answer within {0:?}")]
    Timeout(Duration),
}

/// How long [`Db::call`] waits for the database thread. A job that misses it still runs
/// later: only its caller stops waiting, so a write may land after its request failed.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(feature = "server")]
impl From<DbError> for crate::http::ApiError {
    /// A database that is gone or stalled is 503 (retry later); any other failure is 500.
    fn from(e: DbError) -> Self {
        match e {
            DbError::Closed | DbError::Timeout(_) => {
                tracing::error!(error = %e, "database unavailable");
                crate::http::ApiError::unavailable("the database is not answering; retry later")
            }
            e => crate::http::ApiError::internal(e),
        }
    }
}

/// Opens (creating if needed, mode 0600) and configures a connection, then migrates it.
pub fn open(path: &Path, migrations: &[Migration]) -> Result<Connection, DbError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| DbError::Io {
            path: dir.to_owned(),
            source,
        })?;
    }
    create_private(path)?;
    let mut conn = Connection::open(path)?;
    configure(&conn)?;
    migrate(&mut conn, path, migrations)?;
    Ok(conn)
}

#[cfg(unix)]
fn create_private(path: &Path) -> Result<(), DbError> {
    use std::os::unix::fs::OpenOptionsExt;
    // SQLite gives its -wal and -shm files the database file's mode, so this covers them too.
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map(drop)
        .map_err(|source| DbError::Io {
            path: path.to_owned(),
            source,
        })
}

#[cfg(not(unix))]
fn create_private(_: &Path) -> Result<(), DbError> {
    Ok(())
}

fn configure(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.busy_timeout(Duration::from_secs(5))?;
    // Room for every statement a daemon runs, so hot ones are never evicted and re-parsed.
    conn.set_prepared_statement_cache_capacity(64);
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(())
}

/// Applies every migration newer than the database's version, each in its own transaction.
pub fn migrate(
    conn: &mut Connection,
    path: &Path,
    migrations: &[Migration],
) -> Result<(), DbError> {
    for (i, m) in migrations.iter().enumerate() {
        if m.version as usize != i + 1 {
            return Err(DbError::BadMigrations(format!(
                "migration {:?} has version {}, expected {}",
                m.name,
                m.version,
                i + 1
            )));
        }
    }
    let supported = migrations.len() as u32;
    let found: u32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if found > supported {
        return Err(DbError::TooNew {
            path: path.to_owned(),
            found,
            supported,
        });
    }
    for m in &migrations[found as usize..] {
        let tx = conn.transaction()?;
        tx.execute_batch(m.sql)?;
        tx.pragma_update(None, "user_version", m.version)?;
        tx.commit()?;
        tracing::info!(db = %path.display(), version = m.version, name = m.name, "migrated");
    }
    Ok(())
}

type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// An async handle to a database owned by a dedicated thread. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    tx: mpsc::Sender<Job>,
    path: PathBuf,
}

impl Db {
    /// Opens and migrates the database on a new thread.
    pub async fn open(
        path: impl Into<PathBuf>,
        migrations: &'static [Migration],
    ) -> Result<Db, DbError> {
        let path = path.into();
        let (tx, mut rx) = mpsc::channel::<Job>(1024);
        let (ready_tx, ready_rx) = oneshot::channel();
        let thread_path = path.clone();
        std::thread::Builder::new()
            .name("sqlite".into())
            .spawn(move || {
                let mut conn = match open(&thread_path, migrations) {
                    Ok(c) => {
                        let _ = ready_tx.send(Ok(()));
                        c
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Some(job) = rx.blocking_recv() {
                    job(&mut conn);
                }
            })
            .map_err(|source| DbError::Io {
                path: path.clone(),
                source,
            })?;
        ready_rx.await.map_err(|_| DbError::Closed)??;
        Ok(Db { tx, path })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `f` on the database thread and returns its result, waiting at most
    /// [`CALL_TIMEOUT`].
    pub async fn call<T, E>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        self.call_within(CALL_TIMEOUT, f).await
    }

    /// [`Db::call`] with its own limit on the wait.
    pub async fn call_within<T, E>(
        &self,
        limit: Duration,
        f: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<DbError> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = tx.send(f(conn));
        });
        let wait = async {
            self.tx
                .send(job)
                .await
                .map_err(|_| E::from(DbError::Closed))?;
            rx.await.map_err(|_| E::from(DbError::Closed))?
        };
        tokio::time::timeout(limit, wait)
            .await
            .unwrap_or_else(|_| Err(E::from(DbError::Timeout(limit))))
    }

    /// Whether the database answers a trivial query.
    pub async fn ping(&self) -> Result<(), DbError> {
        self.call(|c| {
            c.query_row("SELECT 1", [], |_| Ok(()))
                .map_err(DbError::from)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &[Migration] = &[Migration {
        version: 1,
        name: "create t",
        sql: "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL);",
    }];
    const V2: &[Migration] = &[
        V1[0],
        Migration {
            version: 2,
            name: "add w",
            sql: "ALTER TABLE t ADD COLUMN w TEXT;",
        },
    ];

    #[test]
    fn migrates_in_order_and_keeps_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/x.db");
        {
            let conn = open(&path, V1).unwrap();
            conn.execute("INSERT INTO t (v) VALUES ('a')", []).unwrap();
        }
        let conn = open(&path, V2).unwrap();
        let v: u32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 2);
        let n: i64 = conn
            .query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 1);
        let mode: String = conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let fk: i64 = conn
            .pragma_query_value(None, "foreign_keys", |r| r.get(0))
            .unwrap();
        assert_eq!(fk, 1);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "database must not be readable by others");
        }
    }

    #[test]
    fn refuses_a_newer_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        drop(open(&path, V2).unwrap());
        let err = open(&path, V1).unwrap_err();
        assert!(
            matches!(
                err,
                DbError::TooNew {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("newer than this build"));
    }

    #[test]
    fn rejects_a_gap_in_versions() {
        let dir = tempfile::tempdir().unwrap();
        let bad = [Migration {
            version: 2,
            name: "x",
            sql: "",
        }];
        assert!(matches!(
            open(&dir.path().join("x.db"), &bad),
            Err(DbError::BadMigrations(_))
        ));
    }

    #[test]
    fn failed_migration_rolls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.db");
        let bad = [
            V1[0],
            Migration {
                version: 2,
                name: "broken",
                sql: "ALTER TABLE t ADD COLUMN w TEXT; NOT SQL;",
            },
        ];
        assert!(open(&path, &bad).is_err());
        let conn = open(&path, V1).unwrap();
        let v: u32 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, 1);
    }

    #[tokio::test]
    async fn async_handle_runs_on_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("x.db"), V1).await.unwrap();
        db.ping().await.unwrap();
        let id = db
            .call(|c| {
                c.execute("INSERT INTO t (v) VALUES ('x')", [])?;
                Ok::<_, DbError>(c.last_insert_rowid())
            })
            .await
            .unwrap();
        assert_eq!(id, 1);
    }

    /// A stalled database thread costs its callers a bounded wait and a clear error (503 over
    /// HTTP), not a hung request; the late job still runs, and the handle works afterwards.
    #[tokio::test]
    async fn a_stalled_database_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path().join("x.db"), V1).await.unwrap();
        let stall = db.call_within(Duration::from_millis(50), |c| {
            std::thread::sleep(Duration::from_millis(400));
            c.execute("INSERT INTO t (v) VALUES ('late')", [])?;
            Ok::<_, DbError>(())
        });
        let err = stall.await.unwrap_err();
        assert!(matches!(err, DbError::Timeout(d) if d == Duration::from_millis(50)));
        assert!(err.to_string().contains("did not answer"), "{err}");
        #[cfg(feature = "server")]
        {
            let api: crate::http::ApiError = err.into();
            assert_eq!(api.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(api.body.error, "unavailable");
        }
        let n: i64 = db
            .call(|c| {
                c.query_row("SELECT count(*) FROM t WHERE v = 'late'", [], |r| r.get(0))
                    .map_err(DbError::from)
            })
            .await
            .unwrap();
        assert_eq!(n, 1);
    }
}
