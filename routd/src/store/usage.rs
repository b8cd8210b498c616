//! LLM usage through the gateway, per group, day, turn and model.

use hako_shared::GroupFolder;
use hako_shared::db::DbError;
use hako_shared::ids::TurnId;
use rusqlite::params;
use serde::Serialize;

use super::Store;

/// LLM usage: one group's calls of one turn, day, wire format and model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct UsageRow {
    /// The group.
    pub folder: GroupFolder,
    /// The UTC day, `YYYY-MM-DD`.
    pub day: String,
    /// The turn.
    pub turn_id: TurnId,
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

impl Store {
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

    /// Usage rows, filtered, newest day first, at most `limit`.
    pub async fn llm_usage(
        &self,
        folder: Option<String>,
        day: Option<String>,
        turn_id: Option<TurnId>,
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
}
