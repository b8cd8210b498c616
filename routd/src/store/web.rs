//! The web page's browser sessions. The cookie's value is never stored: a row is keyed by its
//! SHA-256, so a copy of `routd.db` signs nobody in. A sign-in link's token id is kept with the
//! session it opened, and is unique: a link signs in once.

use hako_shared::auth::Claims;
use hako_shared::db::DbError;
use rusqlite::{OptionalExtension, params};

use super::{Store, json_column, json_text};

/// A browser session.
#[derive(Debug, Clone)]
pub struct WebSession {
    /// SHA-256 of the cookie's value, hex.
    pub id_hash: String,
    /// The id of the sign-in link's token (its revocation ends the session).
    pub link_jti: String,
    /// The token every state change must carry in `x-hako-csrf`.
    pub csrf: String,
    /// Who the session acts as: the link's claims, with the session's expiry.
    pub claims: Claims,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub expires_at: i64,
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<WebSession> {
    Ok(WebSession {
        id_hash: r.get("id_hash")?,
        link_jti: r.get("link_jti")?,
        csrf: r.get("csrf")?,
        claims: json_column(r, "web_sessions", "claims")?,
        created_at: r.get("created_at")?,
        expires_at: r.get("expires_at")?,
    })
}

impl Store {
    /// Opens a session; `false` when the link already opened one (a link signs in once).
    /// Sessions ended or expired a day ago are dropped on the way.
    pub async fn open_web_session(&self, s: WebSession) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let claims = json_text(&s.claims)?;
                let tx = c.transaction()?;
                tx.execute(
                    "DELETE FROM web_sessions WHERE expires_at < ?1 \
                     OR (ended_at IS NOT NULL AND ended_at < ?1)",
                    params![s.created_at - 86_400_000],
                )?;
                let n = tx.execute(
                    "INSERT INTO web_sessions (id_hash, link_jti, csrf, claims, created_at, \
                     expires_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT DO NOTHING",
                    params![
                        s.id_hash,
                        s.link_jti,
                        s.csrf,
                        claims,
                        s.created_at,
                        s.expires_at
                    ],
                )?;
                tx.commit()?;
                Ok(n == 1)
            })
            .await
    }

    /// The live session with this cookie hash (not ended, not expired at `now`).
    pub async fn web_session(
        &self,
        id_hash: &str,
        now: i64,
    ) -> Result<Option<WebSession>, DbError> {
        let id_hash = id_hash.to_owned();
        self.db
            .call(move |c| {
                let row = c
                    .prepare_cached(
                        "SELECT id_hash, link_jti, csrf, claims, created_at, expires_at \
                         FROM web_sessions WHERE id_hash = ?1 AND ended_at IS NULL \
                         AND expires_at > ?2",
                    )?
                    .query_row(params![id_hash, now], row)
                    .optional()?;
                Ok(row)
            })
            .await
    }

    /// The live sessions at `now`, newest first.
    pub async fn web_sessions(&self, now: i64) -> Result<Vec<WebSession>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(
                    "SELECT id_hash, link_jti, csrf, claims, created_at, expires_at \
                     FROM web_sessions WHERE ended_at IS NULL AND expires_at > ?1 \
                     ORDER BY created_at DESC LIMIT 1000",
                )?;
                let rows = st
                    .query_map(params![now], row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Ends the live session a link opened (the operator's revocation, which outlives the
    /// link's own token); the session it ended.
    pub async fn end_web_session_of_link(
        &self,
        link_jti: &str,
        now: i64,
    ) -> Result<Option<WebSession>, DbError> {
        let link_jti = link_jti.to_owned();
        self.db
            .call(move |c| {
                let s = c
                    .prepare_cached(
                        "UPDATE web_sessions SET ended_at = ?2 WHERE link_jti = ?1 \
                         AND ended_at IS NULL AND expires_at > ?2 \
                         RETURNING id_hash, link_jti, csrf, claims, created_at, expires_at",
                    )?
                    .query_row(params![link_jti, now], row)
                    .optional()?;
                Ok(s)
            })
            .await
    }

    /// Ends a session (sign-out); `false` when none was live.
    pub async fn end_web_session(&self, id_hash: &str, now: i64) -> Result<bool, DbError> {
        let id_hash = id_hash.to_owned();
        self.db
            .call(move |c| {
                Ok(c.execute(
                    "UPDATE web_sessions SET ended_at = ?2 WHERE id_hash = ?1 \
                     AND ended_at IS NULL",
                    params![id_hash, now],
                )? == 1)
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::auth::TokenType;

    fn session(id: &str, jti: &str, now: i64) -> WebSession {
        WebSession {
            id_hash: id.into(),
            link_jti: jti.into(),
            csrf: "c".into(),
            claims: Claims {
                iss: "hako-authd".into(),
                sub: "operator".into(),
                typ: TokenType::User,
                scope: vec!["chats:read".into()],
                folder: Some("acme".into()),
                jti: jti.into(),
                iat: now / 1000,
                nbf: now / 1000,
                exp: now / 1000 + 60,
                run_id: None,
                turn_id: None,
                parent_jti: None,
                egress: vec![],
                secrets: vec![],
            },
            created_at: now,
            expires_at: now + 60_000,
        }
    }

    #[tokio::test]
    async fn a_session_lives_until_it_expires_or_ends_and_a_link_opens_one_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let now = 1_000_000_000;
        assert!(
            store
                .open_web_session(session("h1", "j1", now))
                .await
                .unwrap()
        );
        // The same link again, even for another cookie: refused.
        assert!(
            !store
                .open_web_session(session("h2", "j1", now))
                .await
                .unwrap()
        );
        let s = store.web_session("h1", now + 1).await.unwrap().unwrap();
        assert_eq!(s.claims.folder.as_deref(), Some("acme"));
        assert!(store.web_session("h2", now + 1).await.unwrap().is_none());
        // Expired: gone for lookups.
        assert!(
            store
                .web_session("h1", now + 60_000)
                .await
                .unwrap()
                .is_none()
        );
        // Ended: gone, and the link stays used.
        assert!(store.end_web_session("h1", now + 2).await.unwrap());
        assert!(!store.end_web_session("h1", now + 3).await.unwrap());
        assert!(store.web_session("h1", now + 4).await.unwrap().is_none());
        assert!(
            !store
                .open_web_session(session("h3", "j1", now + 5))
                .await
                .unwrap()
        );
    }
}
