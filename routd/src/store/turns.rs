//! The `turns` table: one row per turn, moved between states only through
//! [`Store::advance`].

use hako_shared::chat::{MessageState, TurnState, TurnView};
use hako_shared::db::DbError;
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::Outcome;
use hako_shared::{ChatJid, GroupFolder};
use rusqlite::{OptionalExtension, params};

use super::Store;

/// A turn row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRow {
    /// Id.
    pub turn_id: TurnId,
    /// Folder.
    pub folder: GroupFolder,
    /// Chat.
    pub chat_jid: ChatJid,
    /// Where it stands.
    pub state: TurnState,
    /// Tries started (1 for the first run).
    pub attempt: i64,
    /// The current try's run (`None` until runed took it).
    pub run_id: Option<RunId>,
    /// The last try's outcome.
    pub outcome: Option<Outcome>,
    /// The last try's error.
    pub error: Option<String>,
    /// Replies delivered (blocks of the current try turned into messages).
    pub replies: i64,
    /// When a waiting turn retries (Unix ms).
    pub next_try_at: Option<i64>,
    /// The first covered message's arrival (Unix ms), for the turn latency.
    pub first_in_at: i64,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub ended_at: Option<i64>,
}

/// What moves a turn from one state to the next: the only way a stored turn changes state
/// ([`TurnRow::after`] says where each step leads, [`Store::advance`] persists it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `starting` → `running`: runed took the try's run.
    Started {
        /// The run.
        run_id: RunId,
    },
    /// `starting` | `running` → `waiting`: the try gave the chat nothing; the next one
    /// starts at `retry_at` (Unix ms).
    TryFailed {
        /// The try's outcome.
        outcome: Option<Outcome>,
        /// Why it failed.
        error: String,
        /// When the next try starts.
        retry_at: i64,
    },
    /// `waiting` → `starting`: the next try (a new run, no replies yet).
    Retry,
    /// Any live state → `done`, `failed` or `killed`. Its messages become `answered` (`failed`
    /// for a failed turn), and the chat's cursor moves past every message no longer pending.
    End {
        /// `done`, `failed` or `killed`.
        state: TurnState,
        /// The last try's outcome.
        outcome: Option<Outcome>,
        /// What went wrong.
        error: Option<String>,
    },
}

impl TurnRow {
    /// The turn after `step` at `now` (Unix ms), or `None` when the step does not apply to
    /// its state (a step from elsewhere, an end into a live state).
    pub fn after(&self, step: &Step, now: i64) -> Option<TurnRow> {
        use TurnState::{Running, Starting, Waiting};
        let mut t = self.clone();
        match (self.state, step) {
            (Starting, Step::Started { run_id }) => {
                t.state = Running;
                t.run_id = Some(run_id.clone());
            }
            (
                Starting | Running,
                Step::TryFailed {
                    outcome,
                    error,
                    retry_at,
                },
            ) => {
                t.state = Waiting;
                t.outcome = *outcome;
                t.error = Some(error.clone());
                t.next_try_at = Some(*retry_at);
            }
            (Waiting, Step::Retry) => {
                t.state = Starting;
                t.attempt += 1;
                t.run_id = None;
                t.replies = 0;
                t.next_try_at = None;
            }
            (
                Starting | Running | Waiting,
                Step::End {
                    state,
                    outcome,
                    error,
                },
            ) if state.is_over() => {
                t.state = *state;
                t.outcome = *outcome;
                t.error.clone_from(error);
                t.next_try_at = None;
                t.ended_at = Some(now);
            }
            _ => return None,
        }
        Some(t)
    }
}

/// `('starting', 'running', 'waiting')`: the live states as SQL (as the `turns_live` index
/// names them, so that the index serves the query).
fn live_states() -> String {
    let names: Vec<String> = TurnState::LIVE
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    format!("({})", names.join(", "))
}

const TURN_COLS: &str = "turn_id, folder, chat_jid, state, attempt, run_id, outcome, error, \
                         replies, next_try_at, first_in_at, created_at, ended_at";

fn turn_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<TurnRow> {
    Ok(TurnRow {
        turn_id: r.get("turn_id")?,
        folder: r.get("folder")?,
        chat_jid: r.get("chat_jid")?,
        state: r.get("state")?,
        attempt: r.get("attempt")?,
        run_id: r.get("run_id")?,
        outcome: r.get("outcome")?,
        error: r.get("error")?,
        replies: r.get("replies")?,
        next_try_at: r.get("next_try_at")?,
        first_in_at: r.get("first_in_at")?,
        created_at: r.get("created_at")?,
        ended_at: r.get("ended_at")?,
    })
}

impl Store {
    /// Creates a turn covering `seqs` (all must still be uncovered, else nothing changes and
    /// `false` comes back).
    pub async fn create_turn(&self, t: TurnRow, seqs: Vec<i64>) -> Result<bool, DbError> {
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let exists: bool = tx
                    .query_row("SELECT 1 FROM turns WHERE turn_id = ?1", [&t.turn_id], |_| {
                        Ok(true)
                    })
                    .optional()?
                    .unwrap_or(false);
                if exists {
                    return Ok(false);
                }
                tx.execute(
                    &format!("INSERT INTO turns ({TURN_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13)"),
                    params![
                        t.turn_id, t.folder, t.chat_jid, t.state.as_str(), t.attempt, t.run_id, t.outcome,
                        t.error, t.replies, t.next_try_at, t.first_in_at, t.created_at, t.ended_at
                    ],
                )?;
                for s in &seqs {
                    let n = tx.execute(
                        "UPDATE messages SET turn_id = ?1 WHERE seq = ?2 AND turn_id IS NULL \
                         AND state = 'pending'",
                        params![t.turn_id, s],
                    )?;
                    if n != 1 {
                        return Ok(false);
                    }
                }
                tx.commit()?;
                hako_shared::failpoint::hit("routd.turn.created");
                Ok(true)
            })
            .await
    }

    /// One turn.
    pub async fn turn(&self, turn_id: &TurnId) -> Result<Option<TurnRow>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!("SELECT {TURN_COLS} FROM turns WHERE turn_id = ?1"),
                    [&t],
                    turn_row,
                )
                .optional()?)
            })
            .await
    }

    /// Turns not over (starting, running, waiting), oldest first.
    pub async fn live_turns(&self) -> Result<Vec<TurnRow>, DbError> {
        self.db
            .call(|c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TURN_COLS} FROM turns WHERE state IN ('starting', 'running', 'waiting') \
                     ORDER BY created_at"
                ))?;
                let rows = st
                    .query_map([], turn_row)?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// Moves a turn by `step` from the state `t` holds (guarded: the stored turn must still
    /// be in that state and try), in one transaction with what the step does to its
    /// messages and chat. The turn after the step, or `None` when the step does not apply or
    /// the stored turn moved meanwhile.
    pub async fn advance(
        &self,
        t: &TurnRow,
        step: Step,
        now: i64,
    ) -> Result<Option<TurnRow>, DbError> {
        let Some(next) = t.after(&step, now) else {
            return Ok(None);
        };
        let (from, attempt) = (t.state, t.attempt);
        self.db
            .call(move |c| {
                let tx = c.transaction()?;
                let n = tx.execute(
                    "UPDATE turns SET state = ?2, attempt = ?3, run_id = ?4, outcome = ?5, \
                     error = ?6, replies = CASE WHEN ?7 THEN 0 ELSE replies END, \
                     next_try_at = ?8, ended_at = ?9 \
                     WHERE turn_id = ?1 AND state = ?10 AND attempt = ?11",
                    params![
                        next.turn_id,
                        next.state.as_str(),
                        next.attempt,
                        next.run_id,
                        next.outcome,
                        next.error,
                        step == Step::Retry,
                        next.next_try_at,
                        next.ended_at,
                        from.as_str(),
                        attempt
                    ],
                )?;
                if n != 1 {
                    return Ok(None);
                }
                if let Step::End { state, .. } = step {
                    let messages = if state == TurnState::Failed {
                        MessageState::Failed
                    } else {
                        MessageState::Answered
                    };
                    end_messages(&tx, &next.turn_id, messages, now)?;
                }
                tx.commit()?;
                Ok(Some(next))
            })
            .await
    }

    /// Whether a folder has a turn that is not over.
    pub async fn folder_busy(&self, folder: &str) -> Result<Option<TurnRow>, DbError> {
        let f = folder.to_owned();
        self.db
            .call(move |c| {
                Ok(c.query_row(
                    &format!(
                        "SELECT {TURN_COLS} FROM turns WHERE folder = ?1 \
                         AND state IN {} ORDER BY created_at LIMIT 1",
                        live_states()
                    ),
                    [&f],
                    turn_row,
                )
                .optional()?)
            })
            .await
    }

    /// Turns, newest first, filtered by folder (and those below it) and state.
    pub async fn turns(
        &self,
        folder: Option<String>,
        state: Option<TurnState>,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<TurnRow>, DbError> {
        self.db
            .call(move |c| {
                let mut st = c.prepare_cached(&format!(
                    "SELECT {TURN_COLS} FROM turns WHERE \
                     (?1 IS NULL OR folder = ?1 OR substr(folder, 1, length(?1) + 1) = ?1 || '/') \
                     AND (?2 IS NULL OR state = ?2) AND (?3 IS NULL OR rowid < ?3) \
                     ORDER BY rowid DESC LIMIT ?4"
                ))?;
                let rows = st
                    .query_map(
                        params![folder, state.map(TurnState::as_str), before, limit as i64],
                        turn_row,
                    )?
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(rows)
            })
            .await
    }

    /// The rowid of a turn (the cursor of turn pages).
    pub async fn turn_rowid(&self, turn_id: &TurnId) -> Result<Option<i64>, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                Ok(
                    c.query_row("SELECT rowid FROM turns WHERE turn_id = ?1", [&t], |r| {
                        r.get(0)
                    })
                    .optional()?,
                )
            })
            .await
    }

    /// A turn as the API shows it.
    pub async fn turn_view(&self, t: TurnRow) -> Result<TurnView, DbError> {
        let covered = self.covered_by(&t.turn_id).await?;
        Ok(TurnView {
            turn_id: t.turn_id,
            folder: t.folder.into_string(),
            chat_jid: t.chat_jid.into_string(),
            state: t.state,
            attempt: t.attempt,
            run_id: t.run_id,
            outcome: t.outcome,
            error: t.error,
            replies: t.replies,
            messages: covered.into_iter().map(|m| m.id).collect(),
            created_at: t.created_at,
            ended_at: t.ended_at,
        })
    }

    /// Counts one more reply of a turn; answers the new count.
    pub async fn add_reply(&self, turn_id: &TurnId) -> Result<i64, DbError> {
        let t = turn_id.to_owned();
        self.db
            .call(move |c| {
                c.execute(
                    "UPDATE turns SET replies = replies + 1 WHERE turn_id = ?1",
                    [&t],
                )?;
                Ok(
                    c.query_row("SELECT replies FROM turns WHERE turn_id = ?1", [&t], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await
    }
}

/// An ended turn's messages: those still pending and not being steered become
/// `message_state`, and the chat's cursor moves past every message no longer pending.
fn end_messages(
    tx: &rusqlite::Transaction<'_>,
    turn_id: &str,
    message_state: MessageState,
    now: i64,
) -> rusqlite::Result<()> {
    let ended = tx.execute(
        "UPDATE messages SET state = ?2 WHERE turn_id = ?1 AND direction = 'in' \
         AND state = 'pending' AND steering = 0",
        params![turn_id, message_state.as_str()],
    )?;
    tx.execute(
        "UPDATE chats SET pending = max(0, pending - ?2) \
         WHERE jid = (SELECT chat_jid FROM turns WHERE turn_id = ?1)",
        params![turn_id, ended as i64],
    )?;
    // The cursor: the last inbound message before the first one still pending.
    tx.execute(
        "UPDATE chats SET cursor = COALESCE( \
           (SELECT max(seq) FROM messages m WHERE m.chat_jid = chats.jid AND m.direction = 'in' \
            AND m.seq < COALESCE((SELECT min(seq) FROM messages p WHERE p.chat_jid = chats.jid \
              AND p.direction = 'in' AND p.state = 'pending'), 9223372036854775807)), cursor), \
         updated_at = ?2 \
         WHERE jid = (SELECT chat_jid FROM turns WHERE turn_id = ?1)",
        params![turn_id, now],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(state: TurnState) -> TurnRow {
        TurnRow {
            turn_id: TurnId::new("t-1").unwrap(),
            folder: GroupFolder::new("f").unwrap(),
            chat_jid: ChatJid::new("tg:1").unwrap(),
            state,
            attempt: 2,
            run_id: Some(RunId::new("run-2").unwrap()),
            outcome: Some(Outcome::Fatal),
            error: Some("before".into()),
            replies: 1,
            next_try_at: None,
            first_in_at: 1,
            created_at: 1,
            ended_at: None,
        }
    }

    /// Every step from every state: exactly the moves the turn's life allows, and what each
    /// one sets.
    #[test]
    fn a_turn_moves_only_as_its_life_allows() {
        use TurnState::*;
        let end = |state| Step::End {
            state,
            outcome: Some(Outcome::Ok),
            error: None,
        };
        let steps = [
            Step::Started {
                run_id: RunId::new("run-3").unwrap(),
            },
            Step::TryFailed {
                outcome: None,
                error: "no reply".into(),
                retry_at: 50,
            },
            Step::Retry,
            end(Done),
            end(Failed),
            end(Killed),
            end(Running),
        ];
        let mut allowed = Vec::new();
        for from in TurnState::ALL {
            for (i, step) in steps.iter().enumerate() {
                if let Some(next) = row(from).after(step, 99) {
                    allowed.push((from, i, next.state));
                }
            }
        }
        assert_eq!(
            allowed,
            [
                (Starting, 0, Running),
                (Starting, 1, Waiting),
                (Starting, 3, Done),
                (Starting, 4, Failed),
                (Starting, 5, Killed),
                (Running, 1, Waiting),
                (Running, 3, Done),
                (Running, 4, Failed),
                (Running, 5, Killed),
                (Waiting, 2, Starting),
                (Waiting, 3, Done),
                (Waiting, 4, Failed),
                (Waiting, 5, Killed),
            ]
        );
        let retried = row(Waiting).after(&Step::Retry, 99).unwrap();
        assert_eq!(
            (retried.attempt, retried.run_id, retried.replies),
            (3, None, 0),
            "a retry is a new try: a new run, no replies yet"
        );
        let ended = row(Running).after(&end(Done), 99).unwrap();
        assert_eq!((ended.ended_at, ended.error), (Some(99), None));
        let waiting = row(Running).after(&steps[1], 99).unwrap();
        assert_eq!(
            (waiting.next_try_at, waiting.error.as_deref()),
            (Some(50), Some("no reply"))
        );
    }
}
