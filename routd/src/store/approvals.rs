//! The `approvals` table: one row per held tool call, leaving `pending` once (a conditional
//! update: the first verdict wins, every later one sees the row decided).

use hako_shared::approvals::{ApprovalState, ApprovalView};
use hako_shared::db::DbError;
use hako_shared::ids::TurnId;
use hako_shared::{ChatJid, GroupFolder};
use rusqlite::{OptionalExtension, params};

use super::Store;

/// A request, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalRow {
    /// `ap-…`.
    pub id: hako_shared::ids::ApprovalId,
    /// The turn whose call is held.
    pub turn_id: TurnId,
    /// The group.
    pub folder: GroupFolder,
    /// The turn's chat.
    pub chat_jid: ChatJid,
    /// The tool's name.
    pub tool: String,
    /// What the call acts on.
    pub target: Option<String>,
    /// The arguments as shown to people.
    pub arguments: serde_json::Value,
    /// Where it stands.
    pub state: ApprovalState,
    /// Who gave the verdict.
    pub decided_by: Option<String>,
    /// Unix ms.
    pub requested_at: i64,
    /// Unix ms.
    pub expires_at: i64,
    /// Unix ms.
    pub decided_at: Option<i64>,
    /// The client's name for the held call (`_meta.hako/call`, an `Idempotency-Key`): the
    /// same call asked again is this request.
    pub call_key: Option<String>,
}

impl From<ApprovalRow> for ApprovalView {
    fn from(r: ApprovalRow) -> Self {
        ApprovalView {
            id: r.id,
            turn_id: r.turn_id,
            folder: r.folder.into_string(),
            chat_jid: r.chat_jid.into_string(),
            tool: r.tool,
            target: r.target,
            arguments: r.arguments,
            state: r.state,
            decided_by: r.decided_by,
            requested_at: r.requested_at,
            expires_at: r.expires_at,
            decided_at: r.decided_at,
        }
    }
}

const COLUMNS: &str = "id, turn_id, folder, chat_jid, tool, target, arguments, state, \
                       decided_by, requested_at, expires_at, decided_at, call_key";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRow> {
    let bad = |i: usize, what: String| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, what.into())
    };
    let arguments: String = r.get("arguments")?;
    Ok(ApprovalRow {
        id: r.get("id")?,
        turn_id: r.get("turn_id")?,
        folder: r.get("folder")?,
        chat_jid: r.get("chat_jid")?,
        tool: r.get("tool")?,
        target: r.get("target")?,
        arguments: serde_json::from_str(&arguments)
            .map_err(|e| bad(6, format!("approval arguments: {e}")))?,
        state: r.get("state")?,
        decided_by: r.get("decided_by")?,
        requested_at: r.get("requested_at")?,
        expires_at: r.get("expires_at")?,
        decided_at: r.get("decided_at")?,
        call_key: r.get("call_key")?,
    })
}

/// What a verdict did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decided {
    /// It was the first: the row as it is now.
    Now(ApprovalRow),
    /// The request was decided before: the row as it is.
    Before(ApprovalRow),
    /// No such request.
    Missing,
}

impl Store {
    /// Records a new pending request, unless its turn already has `max_pending` pending:
    /// answers whether it was recorded. One statement, so calls racing on one turn never
    /// hold more than the bound between them.
    pub async fn add_approval(&self, a: ApprovalRow, max_pending: usize) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                // OR IGNORE: the same call asked twice at once (its key) is one request.
                let added = c.execute(
                    &format!(
                        "INSERT OR IGNORE INTO approvals ({COLUMNS}) SELECT ?1, ?2, ?3, ?4, ?5, \
                         ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?14 WHERE (SELECT count(*) FROM \
                         approvals WHERE turn_id = ?2 AND state = 'pending') < ?13"
                    ),
                    params![
                        a.id,
                        a.turn_id,
                        a.folder,
                        a.chat_jid,
                        a.tool,
                        a.target,
                        a.arguments.to_string(),
                        a.state.as_str(),
                        a.decided_by,
                        a.requested_at,
                        a.expires_at,
                        a.decided_at,
                        max_pending as i64,
                        a.call_key
                    ],
                )?;
                if added == 1 {
                    hako_shared::failpoint::hit("routd.approval.requested");
                }
                Ok(added == 1)
            })
            .await
    }

    /// The request a turn's call of this name made, if it made one.
    pub async fn approval_of_call(
        &self,
        turn_id: &TurnId,
        key: &str,
    ) -> Result<Option<ApprovalRow>, DbError> {
        let (turn, key) = (turn_id.clone(), key.to_owned());
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!(
                        "SELECT {COLUMNS} FROM approvals WHERE turn_id = ?1 AND call_key = ?2"
                    ),
                    params![turn, key],
                    row,
                )
                .optional()?)
            })
            .await
    }

    /// One request.
    pub async fn approval(&self, id: &str) -> Result<Option<ApprovalRow>, DbError> {
        let id = id.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                    [&id],
                    row,
                )
                .optional()?)
            })
            .await
    }

    /// Moves a pending request to `state` (never `pending`): only the first verdict changes
    /// anything.
    pub async fn decide_approval(
        &self,
        id: &str,
        state: ApprovalState,
        by: Option<String>,
        now: i64,
    ) -> Result<Decided, DbError> {
        debug_assert!(state != ApprovalState::Pending);
        let id = id.to_owned();
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let changed = tx.execute(
                    "UPDATE approvals SET state = ?2, decided_by = ?3, decided_at = ?4 \
                     WHERE id = ?1 AND state = 'pending'",
                    params![id, state.as_str(), by, now],
                )?;
                let now_row = tx
                    .query_row(
                        &format!("SELECT {COLUMNS} FROM approvals WHERE id = ?1"),
                        [&id],
                        row,
                    )
                    .optional()?;
                tx.commit()?;
                if changed == 1 {
                    hako_shared::failpoint::hit("routd.approval.decided");
                }
                Ok(match (changed, now_row) {
                    (_, None) => Decided::Missing,
                    (1, Some(r)) => Decided::Now(r),
                    (_, Some(r)) => Decided::Before(r),
                })
            })
            .await
    }

    /// The pending requests, of one turn or of all.
    pub async fn pending_approvals(
        &self,
        turn_id: Option<&TurnId>,
    ) -> Result<Vec<ApprovalRow>, DbError> {
        let turn = turn_id.cloned();
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM approvals WHERE state = 'pending' \
                     AND (?1 IS NULL OR turn_id = ?1) ORDER BY requested_at"
                ))?;
                let rows = st.query_map([turn], row)?.collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// The newest requests first, pending only or all, of `under` and the folders below it
    /// (every folder when `None`), at most `limit`.
    pub async fn approvals(
        &self,
        pending_only: bool,
        under: Option<&str>,
        limit: usize,
    ) -> Result<Vec<ApprovalRow>, DbError> {
        let under = under.map(str::to_owned);
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM approvals WHERE (?1 = 0 OR state = 'pending') \
                     AND (?2 IS NULL OR folder = ?2 OR substr(folder, 1, length(?2) + 1) = ?2 || '/') \
                     ORDER BY requested_at DESC, id LIMIT ?3"
                ))?;
                let rows = st
                    .query_map(params![pending_only, under, limit as i64], row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// How many requests wait, and since when the oldest (Unix ms).
    pub async fn approval_backlog(&self) -> Result<(i64, Option<i64>), DbError> {
        self.db
            .call(|c| {
                Ok(c.query_row(
                    "SELECT count(*), min(requested_at) FROM approvals WHERE state = 'pending'",
                    [],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )?)
            })
            .await
    }
}
