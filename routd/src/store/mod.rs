//! `routd.db`: the message log (inbound and outbound, with their states), chats, groups and
//! their sessions, routes, turns, webhooks and delivery attempts, and the audit log.
//!
//! The log is append-only: a message's `seq` is its place, the cursor of history pages and the
//! id of its server-sent event, so a client that reconnects gets exactly what it missed from
//! the log. A message's state moves forward only (an inbound message: `pending` →
//! `answered` | `failed`; an outbound one: `delivering` → `delivered` | `undeliverable`).
//! Every multi-row change is one transaction.

use std::path::Path;

mod approvals;
mod audit;
mod groups;
mod messages;
mod routes;
mod schema;
mod tasks;
mod turns;
mod usage;
mod web;
mod webhooks;

pub use approvals::{ApprovalRow, Decided};
pub use audit::AuditRow;
pub use groups::{GroupRow, SetBy};
pub(crate) use messages::keyed_message_id;

/// 24 hex digits of the SHA-256 of `parts` fed in order: the digest part of the ids routd
/// derives (turn ids, keyed message ids), short enough for the id grammar.
pub(crate) fn digest_hex(parts: &[&[u8]]) -> String {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for p in parts {
        h.update(p);
    }
    h.finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect()
}
pub use messages::{Backlog, Ingested, NewInbound, NewOutbound};
pub use routes::RouteRow;
pub use schema::MIGRATIONS;
pub use tasks::{TaskRow, TaskState};
pub use turns::{Step, TurnRow};
pub use usage::UsageRow;
pub use web::WebSession;
pub use webhooks::WebhookRow;

use hako_shared::db::{Db, DbError};

/// routd's database. Cheap to clone.
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
}

/// A JSON column, parsed: one that does not parse is an error, never a default.
pub(super) fn json_column<T: serde::de::DeserializeOwned>(
    r: &rusqlite::Row<'_>,
    table: &str,
    name: &str,
) -> rusqlite::Result<T> {
    let text: String = r.get(name)?;
    serde_json::from_str(&text).map_err(|e| {
        let at = r.as_ref().column_index(name).unwrap_or_default();
        rusqlite::Error::FromSqlConversionFailure(
            at,
            rusqlite::types::Type::Text,
            format!("{table}.{name}: {e}").into(),
        )
    })
}

/// A value as a JSON column.
pub(super) fn json_text<T: serde::Serialize>(v: &T) -> rusqlite::Result<String> {
    serde_json::to_string(v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(e.into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::GroupFolder;
    use hako_shared::chat::{MessageKind, MessageState, TurnState};

    fn inbound(id: &str, now: i64) -> NewInbound {
        NewInbound {
            id: id.into(),
            chat_jid: hako_shared::ChatJid::new("tg:1").unwrap(),
            kind: MessageKind::Message,
            sender: "alice".into(),
            sender_name: None,
            content: id.into(),
            timestamp: now,
            reply_to: None,
            body_hash: id.into(),
            now,
        }
    }

    /// A key of any text gives a message id in the grammar, the same one each time, and a
    /// plain key keeps its readable id.
    #[test]
    fn keyed_message_ids_fit_the_grammar_and_are_stable() {
        assert_eq!(keyed_message_id("t-1.send.", "k1", ""), "t-1.send.k1");
        assert_eq!(keyed_message_id("", "tg:1:2", ".answer"), "tg:1:2.answer");
        assert_eq!(
            keyed_message_id("t-1.send.", "with space", ""),
            "t-1.send.k-b8b8f25a5fc711caea1cfebf"
        );
        for key in [
            "with space",
            "ünïcode",
            "a/b",
            &"x".repeat(128),
            "\u{202e}rtl",
        ] {
            let id = keyed_message_id("t-1.send.", key, "");
            assert!(hako_shared::ids::is_valid_id(&id), "{key:?} -> {id}");
            assert_eq!(id, keyed_message_id("t-1.send.", key, ""), "stable");
        }
        assert_ne!(
            keyed_message_id("", "a b", ""),
            keyed_message_id("", "a c", "")
        );
    }

    /// A chat an earlier routd stored with a JID past 256 characters (a spawned group's
    /// `web:` chat of a very long folder) has its pending work ended by the upgrade: the
    /// scheduler's and the backlog's reads, which read JIDs through the grammar, still work.
    #[tokio::test]
    async fn the_upgrade_ends_the_pending_work_of_overlong_chats() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routd.db");
        let ending = MIGRATIONS.iter().position(|m| m.version == 15).unwrap();
        let c = hako_shared::db::open(&path, &MIGRATIONS[..ending]).unwrap();
        let long = format!("web:{}", vec!["a".repeat(64); 8].join("/"));
        for (seq, jid) in [(1, long.as_str()), (2, "tg:1")] {
            c.execute(
                "INSERT INTO messages (seq, id, chat_jid, direction, kind, sender, content, \
                 timestamp, state, created_at) \
                 VALUES (?1, ?2, ?3, 'in', 'message', 'alice', 'x', 1, 'pending', 1)",
                rusqlite::params![seq, format!("m-{seq}"), jid],
            )
            .unwrap();
            c.execute(
                "INSERT INTO chats (jid, pending, updated_at) VALUES (?1, 1, 1)",
                [jid],
            )
            .unwrap();
        }
        drop(c);
        let store = Store::open(&path).await.unwrap();
        assert_eq!(store.chats_with_pending().await.unwrap(), ["tg:1"]);
        let oldest = store.oldest_pending().await.unwrap();
        assert_eq!(oldest.len(), 1, "the short chat's message only");
    }

    /// A message an earlier routd stored under an id outside the grammar (an agent's key
    /// with a space) is served after the upgrade under an id made from its seq; the chat's
    /// history reads, and the other messages keep their ids.
    #[tokio::test]
    async fn the_upgrade_renames_message_ids_outside_the_grammar() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("routd.db");
        let renaming = MIGRATIONS.iter().position(|m| m.version == 13).unwrap();
        let before = &MIGRATIONS[..renaming];
        let c = hako_shared::db::open(&path, before).unwrap();
        for (seq, id) in [(1, "tg:1:1"), (2, "t-1.send.a b"), (3, "tg:1:3")] {
            c.execute(
                "INSERT INTO messages (seq, id, chat_jid, direction, kind, sender, content, \
                 timestamp, state, created_at) \
                 VALUES (?1, ?2, 'tg:1', 'in', 'message', 'alice', 'x', 1, 'pending', 1)",
                rusqlite::params![seq, id],
            )
            .unwrap();
        }
        drop(c);
        let store = Store::open(&path).await.unwrap();
        let ids: Vec<String> = store
            .messages("tg:1", None, None, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|m| m.id.into_string())
            .collect();
        assert_eq!(ids, ["tg:1:1", "m-legacy-2", "tg:1:3"]);
    }

    async fn running_turn(store: &Store, seq: i64) -> TurnRow {
        let row = TurnRow {
            turn_id: hako_shared::ids::TurnId::new("t-1").unwrap(),
            folder: hako_shared::GroupFolder::new("f").unwrap(),
            chat_jid: hako_shared::ChatJid::new("tg:1").unwrap(),
            state: TurnState::Starting,
            attempt: 1,
            run_id: None,
            outcome: None,
            error: None,
            replies: 0,
            next_try_at: None,
            first_in_at: 1,
            created_at: 1,
            ended_at: None,
        };
        assert!(store.create_turn(row.clone(), vec![seq]).await.unwrap());
        let started = Step::Started {
            run_id: hako_shared::ids::RunId::new("run-1").unwrap(),
        };
        let running = store.advance(&row, started.clone(), 2).await.unwrap();
        let running = running.expect("starting → running");
        assert_eq!(running.state, TurnState::Running);
        assert_eq!(
            store.advance(&row, started, 3).await.unwrap(),
            None,
            "a step from a state the turn has left changes nothing"
        );
        assert_eq!(
            store.turn(&row.turn_id).await.unwrap(),
            Some(running.clone())
        );
        running
    }

    fn done() -> Step {
        Step::End {
            state: TurnState::Done,
            outcome: None,
            error: None,
        }
    }

    async fn state_of(store: &Store, seq: i64) -> (MessageState, Option<String>) {
        let m = store.message(seq).await.unwrap().unwrap();
        (m.state, m.turn_id)
    }

    /// Each column is read by its name: a webhook delivery's
    /// attempts grow (they were read from `version`, always 0, so a failing receiver was
    /// retried every second for a day, never backing off, never given up on), and a pending
    /// message's arrival time is its own (the turn latency metric read 0 and reported ~56
    /// years).
    #[tokio::test]
    async fn deliveries_count_their_attempts_and_pending_messages_their_arrival() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        store.ingest(inbound("m-1", 1_000)).await.unwrap();
        let pending = store.pending_of("tg:1", 10).await.unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].1, 1_000, "arrived at 1,000 ms");
        store
            .append_outbound(NewOutbound {
                id: "out-1".into(),
                chat_jid: hako_shared::ChatJid::new("tg:1").unwrap(),
                kind: MessageKind::Message,
                content: "hi".into(),
                turn_id: None,
                reply_to: None,
                webhook: true,
                now: 2_000,
            })
            .await
            .unwrap();
        for n in 1..=3 {
            let due = store.due_deliveries(i64::MAX, 10).await.unwrap();
            assert_eq!(due.len(), 1);
            let (m, attempts) = &due[0];
            assert_eq!(*attempts, n - 1, "attempts before try {n}");
            store
                .record_delivery(
                    m.seq,
                    1,
                    n,
                    Some(503),
                    false,
                    "no".into(),
                    Some(3_000),
                    3_000,
                )
                .await
                .unwrap();
        }
    }

    /// A route at the largest position (stored by an older routd, which took any) does not
    /// make every later route fail: SQLite turned the overflowing `max + 10` into a REAL
    /// (found by schemathesis as a 500 on `POST /v1/routes`).
    #[tokio::test]
    async fn a_route_at_the_largest_position_still_lets_the_next_one_in() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let first = store
            .add_route("a".into(), GroupFolder::new("f").unwrap(), None, 1)
            .await
            .unwrap();
        assert_eq!(first.position, 10);
        store
            .add_route(
                "b".into(),
                GroupFolder::new("f").unwrap(),
                Some(i64::MAX - 3),
                2,
            )
            .await
            .unwrap();
        let next = store
            .add_route("c".into(), GroupFolder::new("f").unwrap(), None, 3)
            .await
            .unwrap();
        assert_eq!(next.position, i64::MAX);
    }

    /// The turn's end answers what the agent took, never a follow-up the agent did not take:
    /// those wait for the next turn. Follow-ups whose answer from runed was lost are asked
    /// again by their id; a restart keeps a live turn's follow-ups for its run's end to
    /// decide, and hands back only those of a turn that is over.
    #[tokio::test]
    async fn a_turn_answers_exactly_the_follow_ups_its_agent_took() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let seq = |i: Ingested| match i {
            Ingested::New(s) => s,
            other => panic!("{other:?}"),
        };
        let first = seq(store.ingest(inbound("m-1", 1)).await.unwrap());
        let took = seq(store.ingest(inbound("m-2", 2)).await.unwrap());
        let back = seq(store.ingest(inbound("m-3", 3)).await.unwrap());
        let lost = seq(store.ingest(inbound("m-4", 4)).await.unwrap());
        let row = running_turn(&store, first).await;
        let t = row.turn_id.clone();
        assert_eq!(store.cover(&t, "s-1", vec![took]).await.unwrap(), 1);
        store.steer_placed(&t, "s-1").await.unwrap();
        assert_eq!(store.cover(&t, "s-2", vec![back]).await.unwrap(), 1);
        store.steer_placed(&t, "s-2").await.unwrap();
        // runed's answer to this one was lost: it is asked for again, by the same id.
        assert_eq!(store.cover(&t, "s-3", vec![lost]).await.unwrap(), 1);
        let unanswered = store.steers_unanswered(&t).await.unwrap();
        assert_eq!(unanswered.len(), 1);
        assert_eq!(unanswered[0].0, "s-3");
        assert_eq!(unanswered[0].1[0].seq, lost);
        // A restart now keeps them all: the turn is live, its run's end decides.
        assert_eq!(store.release_steering().await.unwrap(), 0);
        // The run ends: the agent took s-1 (and s-3, placed by a repeat); s-2 came back.
        let (took_n, back_n) = store
            .resolve_steers(&t, vec!["s-1".into(), "s-3".into()])
            .await
            .unwrap();
        assert_eq!((took_n, back_n), (2, 1));
        assert!(store.advance(&row, done(), 10).await.unwrap().is_some());
        assert_eq!(state_of(&store, first).await.0, MessageState::Answered);
        assert_eq!(state_of(&store, took).await.0, MessageState::Answered);
        assert_eq!(state_of(&store, lost).await.0, MessageState::Answered);
        assert_eq!(state_of(&store, back).await, (MessageState::Pending, None));
        let pending: Vec<i64> = store
            .pending_of("tg:1", 10)
            .await
            .unwrap()
            .into_iter()
            .map(|(m, _)| m.seq)
            .collect();
        assert_eq!(pending, [back]);
        // A turn that no longer runs takes no steer.
        assert_eq!(store.cover(&t, "s-4", vec![back]).await.unwrap(), 0);
    }

    /// A message left steering by a turn that is over (an older routd) waits for a turn again.
    #[tokio::test]
    async fn a_restart_hands_back_what_an_ended_turn_left_steering() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("routd.db")).await.unwrap();
        let seq = |i: Ingested| match i {
            Ingested::New(s) => s,
            other => panic!("{other:?}"),
        };
        let first = seq(store.ingest(inbound("m-1", 1)).await.unwrap());
        let cut = seq(store.ingest(inbound("m-2", 2)).await.unwrap());
        let row = running_turn(&store, first).await;
        let t = row.turn_id.clone();
        assert_eq!(store.cover(&t, "s-1", vec![cut]).await.unwrap(), 1);
        assert!(store.advance(&row, done(), 10).await.unwrap().is_some());
        assert_eq!(
            state_of(&store, cut).await,
            (MessageState::Pending, Some(t.to_string()))
        );
        assert_eq!(store.release_steering().await.unwrap(), 1);
        assert_eq!(state_of(&store, cut).await, (MessageState::Pending, None));
    }
}
