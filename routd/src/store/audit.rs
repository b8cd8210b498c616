//! The audit log of changes callers made.

use hako_shared::db::DbError;
use rusqlite::params;
use serde::Serialize;

use super::Store;

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
    /// The request it was written for (the `x-request-id` routd answered): runed's and
    /// authd's rows of the same request carry it too.
    pub request_id: Option<String>,
    /// The turn whose agent acted (its tools, its held calls).
    pub turn_id: Option<String>,
}

impl Store {
    /// Appends an audit row.
    pub async fn audit(&self, a: AuditRow) -> Result<(), DbError> {
        self.db
            .call(move |c| {
                c.execute(
                    "INSERT INTO audit_log \
                     (at, actor, action, folder, outcome, detail, request_id, turn_id) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                    params![
                        a.at,
                        a.actor,
                        a.action,
                        a.folder,
                        a.outcome,
                        a.detail,
                        a.request_id,
                        a.turn_id
                    ],
                )?;
                Ok(())
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
                    "SELECT id, at, actor, action, folder, outcome, detail, request_id, turn_id \
                     FROM audit_log \
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
                            request_id: r.get(7)?,
                            turn_id: r.get(8)?,
                        })
                    })?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }
}
