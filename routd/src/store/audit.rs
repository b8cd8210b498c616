//! The audit log of changes callers made: the table runed's log shares
//! (`hako_shared::audit::table`).

use hako_shared::db::DbError;

pub use hako_shared::audit::AuditRow;

use super::Store;

impl Store {
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
}
