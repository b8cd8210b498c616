//! Webhooks and each delivery attempt of an outbound message.

use hako_shared::chat::{MessageState, MessageView};
use hako_shared::db::DbError;
use rusqlite::params;

use super::Store;
use super::messages::{MSG_COLS, message};

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

impl Store {
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
                        Ok((message(r)?, r.get("attempts")?))
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
                    (true, _) => (MessageState::Delivered, None),
                    (false, Some(at)) => (MessageState::Delivering, Some(at)),
                    (false, None) => (MessageState::Undeliverable, None),
                };
                tx.execute(
                    "UPDATE messages SET state = ?2, attempts = ?3, next_try_at = ?4 \
                     WHERE seq = ?1 AND state = 'delivering'",
                    params![seq, state.as_str(), attempt, next_at],
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
}
