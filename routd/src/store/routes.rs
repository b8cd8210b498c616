//! Routes: which group a chat's messages go to, in order.

use hako_shared::GroupFolder;
use hako_shared::db::DbError;
use rusqlite::{OptionalExtension, params};

use super::Store;

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
    pub folder: GroupFolder,
}

impl Store {
    /// Adds a route at `position` (after the last when `None`).
    pub async fn add_route(
        &self,
        pattern: String,
        folder: GroupFolder,
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
}
