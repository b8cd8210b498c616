//! Turns: when a chat's messages go to its group's agent, and what the run's result does to
//! the chat.
//!
//! - **Scheduling** is event driven: an ingest (or a turn's end, a new route) wakes the
//!   scheduler at once; a one-second tick only catches what a wake could miss. For each chat
//!   with messages no turn covers, the route gives the folder; one turn is live per folder.
//!   The batch (the chat's uncovered messages, oldest first, at most `ROUTD_BATCH_MAX`) names
//!   the turn: its id is derived from the batch, so the same batch always is the same turn,
//!   and try `n` of a turn asks runed for the run of turn `<turn>.<n>` (runed is idempotent
//!   on it: a restart asks again and gets the same run).
//! - A message for a folder whose live turn is its chat's is **steered** into the run (on a
//!   task of its own, one per turn at a time): it is covered by the turn first, marked as
//!   being steered, so it is never delivered twice; the agent taking it makes it the turn's,
//!   runed saying it did not uncovers it for the next turn. The turn's end waits for a steer
//!   under way, and answers only what the agent took: a message handed over as the run ends
//!   is never lost. A steer cut short by a stop is uncovered at the next start.
//! - Each turn has one **driver** task: start the run (waiting, not failing, while runed or
//!   authd does not answer), follow its events (reconnecting; runed replays the stored blocks
//!   and each reply has a stable id, so nothing is appended twice), then settle: `ok` and
//!   `error` answer the batch; `timed_out` or `fatal` after a reply is a success (nothing that
//!   reached the chat is rolled back); with no reply the turn waits a backoff and tries again,
//!   for real (a new run), up to `ROUTD_MAX_TURN_RETRIES` times, then its messages fail and
//!   the chat gets a notice; `killed` ends it with a notice, never retried.
//! - At start every turn that was live is driven again from its stored state.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use hako_shared::GroupFolder;
use hako_shared::chat::{MessageKind, MessageView, TurnState};
use hako_shared::contract::{BlockStatus, Message, OutputBlock};
use hako_shared::db::DbError;
use hako_shared::ids::{RunId, TurnId, TurnTry};
use hako_shared::runs::{Outcome, RunRequest, RunState, RunStatus, RunStreamEvent, SteerState};

use crate::live::LiveTurn;
use crate::runed::RunedError;
use crate::state::{Shared, now_ms};
use crate::store::{Step, TurnRow};

/// The turn id of a batch: `t-` and 24 hex digits of the SHA-256 of the chat and the first
/// and last message ids.
pub(crate) fn turn_id_for(chat: &str, first: &str, last: &str) -> TurnId {
    let hex = crate::store::digest_hex(&[
        chat.as_bytes(),
        &[0],
        first.as_bytes(),
        &[0],
        last.as_bytes(),
        &[0],
    ]);
    TurnId::new(format!("t-{hex}")).expect("t- and hex digits are in the grammar")
}

/// The scheduler: starts turns and steers messages, whenever something changes.
pub(crate) async fn scheduler(sh: Arc<Shared>) {
    loop {
        tokio::select! {
            () = sh.turns.wake.notified() => {}
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
            () = sh.stopping.cancelled() => return,
        }
        if let Err(e) = schedule(&sh).await {
            tracing::warn!(error = %e, "scheduling turns failed; tried again shortly");
        }
    }
}

async fn schedule(sh: &Arc<Shared>) -> Result<(), DbError> {
    for chat in sh.store.chats_with_pending().await? {
        let Some(folder) = sh.routing.resolve(&chat) else {
            continue;
        };
        if let Some(live) = sh.store.folder_busy(&folder).await? {
            if live.chat_jid == chat && live.state == TurnState::Running && live.run_id.is_some() {
                spawn_steer(sh, live);
            }
            continue;
        }
        let batch = sh.store.pending_of(&chat, sh.cfg.batch_max).await?;
        let (Some((first, first_at)), Some((last, _))) = (batch.first(), batch.last()) else {
            continue;
        };
        let now = now_ms();
        let row = TurnRow {
            turn_id: turn_id_for(&chat, &first.id, &last.id),
            folder,
            chat_jid: chat.clone(),
            state: TurnState::Starting,
            attempt: 1,
            run_id: None,
            outcome: None,
            error: None,
            replies: 0,
            next_try_at: None,
            first_in_at: *first_at,
            created_at: now,
            ended_at: None,
        };
        let id = row.turn_id.clone();
        let seqs = batch.iter().map(|(m, _)| m.seq).collect();
        if sh.store.create_turn(row, seqs).await? {
            tracing::info!(turn = %id, chat = %chat, messages = batch.len(), "turn created");
            spawn_driver(sh, id);
        }
    }
    Ok(())
}

/// Steers a chat's new messages into its live turn on a task of their own (the agent may
/// take a while to pick them up; other folders' turns do not wait for it). One steer per
/// turn at a time: what arrives meanwhile is looked at when it ends.
///
/// A live turn's chat counts its own messages as pending until the turn ends, so the
/// scheduler comes here on every wake while a turn runs: a steer that found nothing to do
/// wakes nobody (it woke the scheduler after every steer, and each live turn kept routd
/// busy on a core until it ended). A steer that made progress, or one asked for while it
/// ran, wakes the scheduler; one runed did not answer is tried again at the next tick.
fn spawn_steer(sh: &Arc<Shared>, live: TurnRow) {
    // Only into a run whose container started (runed refuses before): until then the
    // messages wait, and the run's start wakes the scheduler.
    let Some(mem) = sh.turns.live.get(&live.turn_id).filter(|m| m.run_started()) else {
        return;
    };
    let Ok(guard) = mem.steer.clone().try_lock_owned() else {
        mem.ask_steer_again();
        return;
    };
    let tasks = sh.turns.tasks.clone();
    let sh = sh.clone();
    tasks.spawn(async move {
        let progress = match steer(&sh, &mem, &live).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(turn = %live.turn_id, error = %e, "steering failed; tried again shortly");
                false
            }
        };
        drop(guard);
        if progress | mem.take_steer_again() {
            sh.turns.wake.notify_one();
        }
    });
}

/// Steers a chat's uncovered messages into its live turn's run, and asks runed again about
/// follow-ups whose answer was lost (the same id never places twice). Answers whether it
/// made progress (something was handed over, or its messages changed hands).
///
/// A follow-up's fate is runed's to decide, once, when the run ends: the messages stay
/// covered (`steering`) until then, and the turn's end ([`resolve_steers`]) makes those the
/// agent took the turn's and hands the rest back. Nothing here guesses: a call that fails or
/// times out leaves its messages waiting for the next ask or the run's end.
async fn steer(sh: &Arc<Shared>, mem: &LiveTurn, live: &TurnRow) -> Result<bool, DbError> {
    let Some(run_id) = live.run_id.as_ref() else {
        return Ok(false);
    };
    let mut progress = false;
    for (steer_id, msgs) in sh.store.steers_unanswered(&live.turn_id).await? {
        let texts = msgs.iter().map(|m| m.content.clone()).collect();
        if !hand_over(sh, mem, live, run_id, &steer_id, texts).await? {
            return Ok(progress);
        }
        progress = true;
    }
    let pending: Vec<MessageView> = sh
        .store
        .pending_of(&live.chat_jid, sh.cfg.batch_max)
        .await?
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| !mem.refused(m.seq))
        .collect();
    let Some(first) = pending.first() else {
        return Ok(progress);
    };
    let steer_id = format!("{}.s{}", live.turn_id, first.seq);
    let seqs: Vec<i64> = pending.iter().map(|m| m.seq).collect();
    // Covered (as being steered) before the steer: a message is never handed to the agent
    // twice, and the turn's end does not answer it before the agent took it.
    let covered = sh
        .store
        .cover(&live.turn_id, &steer_id, seqs.clone())
        .await?;
    if covered != seqs.len() {
        // Another took some meanwhile: the next tick looks again.
        sh.store.uncover(&live.turn_id, seqs).await?;
        return Ok(progress);
    }
    let texts = pending.iter().map(|m| m.content.clone()).collect();
    Ok(hand_over(sh, mem, live, run_id, &steer_id, texts).await? | progress)
}

/// One follow-up to runed. Answers whether runed answered (`false`: try later).
async fn hand_over(
    sh: &Arc<Shared>,
    mem: &LiveTurn,
    live: &TurnRow,
    run_id: &RunId,
    steer_id: &str,
    texts: Vec<String>,
) -> Result<bool, DbError> {
    match sh.runed.steer(run_id, steer_id, texts).await {
        Ok(r) => {
            sh.store.steer_placed(&live.turn_id, steer_id).await?;
            tracing::info!(turn = %live.turn_id, steer = steer_id, state = r.state.as_str(), "follow-up placed in the live run");
            Ok(true)
        }
        Err(RunedError::Refused { status: 409, .. }) => {
            // The run is over (nothing was placed): the messages wait for the next turn.
            let seqs = sh
                .store
                .steers_unanswered(&live.turn_id)
                .await?
                .into_iter()
                .filter(|(s, _)| s == steer_id)
                .flat_map(|(_, ms)| ms.into_iter().map(|m| m.seq))
                .collect::<Vec<_>>();
            sh.store.uncover(&live.turn_id, seqs.clone()).await?;
            tracing::info!(turn = %live.turn_id, steer = steer_id, "the run is over; the follow-up waits for the next turn");
            mem.refuse(seqs);
            Ok(true)
        }
        Err(e) => {
            tracing::info!(turn = %live.turn_id, steer = steer_id, error = %e, "no answer to a follow-up; asked again by its id");
            Ok(false)
        }
    }
}

/// The run ended: what its agent took of the follow-ups is the turn's, the rest waits for
/// the next turn. `status` is `None` when runed no longer knows the run: nothing can be
/// known, so everything goes back (answered again rather than never).
async fn resolve_steers(
    sh: &Shared,
    turn_id: &TurnId,
    status: Option<&RunStatus>,
) -> Result<(), DbError> {
    let taken = status
        .map(|s| {
            s.steers
                .iter()
                .filter(|f| f.state == SteerState::Taken)
                .map(|f| f.steer_id.clone())
                .collect()
        })
        .unwrap_or_default();
    let (took, back) = sh.store.resolve_steers(turn_id, taken).await?;
    if took + back > 0 {
        tracing::info!(
            taken = took,
            returned = back,
            "follow-ups settled with the run"
        );
    }
    Ok(())
}

/// Drives the turns that were live when routd stopped.
pub(crate) async fn resume(sh: &Arc<Shared>) {
    match sh.store.live_turns().await {
        Ok(turns) => {
            for t in turns {
                tracing::info!(turn = %t.turn_id, state = %t.state, "resuming a turn");
                spawn_driver(sh, t.turn_id);
            }
        }
        Err(e) => tracing::error!(error = %e, "reading live turns failed"),
    }
    sh.turns.wake.notify_one();
}

/// Starts the one driver of a turn (a second call for the same turn does nothing).
pub(crate) fn spawn_driver(sh: &Arc<Shared>, turn_id: TurnId) {
    let Some(driving) = sh.turns.live.claim(&turn_id) else {
        return;
    };
    let sh = sh.clone();
    let span = tracing::info_span!("turn", turn = %turn_id);
    sh.turns.tasks.clone().spawn(tracing::Instrument::instrument(
        async move {
            // The turn's sockets exist before its run starts and go with the driver: a
            // restarted routd binds them again when it resumes the turn.
            let _sockets = match crate::turn_io::open(&sh, &turn_id).await {
                Ok(()) => Some(SocketsGuard(&sh.turns.sockets, &turn_id)),
                Err(e) => {
                    tracing::error!(error = %e, "the turn's sockets could not be bound; its tools are unavailable");
                    None
                }
            };
            if let Err(e) = drive(&sh, driving.live(), &turn_id).await {
                tracing::warn!(error = %e, "driving the turn failed; resumed at the next start or wake");
            }
            drop(_sockets);
            drop(driving);
            sh.turns.wake.notify_one();
        },
        span,
    ));
}

/// Closes a turn's sockets when its driver ends, however it ends.
struct SocketsGuard<'a>(&'a crate::sockets::TurnSockets, &'a TurnId);

impl Drop for SocketsGuard<'_> {
    fn drop(&mut self) {
        self.0.close(self.1);
    }
}

/// Backoff for outages: 0.5 s doubling to 30 s.
struct Outage(Duration);

impl Outage {
    fn next(&mut self) -> Duration {
        let d = self.0;
        self.0 = (self.0 * 2).min(Duration::from_secs(30));
        d
    }
}

/// Sleeps `d` unless routd stops first (then `false`).
async fn pause(sh: &Shared, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = sh.stopping.cancelled() => false,
    }
}

/// Drives a turn through its states until it is over (or routd stops): each cycle works
/// out the next [`Step`] from what runed says, and [`advance`] makes it the turn's.
async fn drive(sh: &Arc<Shared>, mem: &LiveTurn, turn_id: &TurnId) -> Result<(), DbError> {
    let Some(mut t) = sh.store.turn(turn_id).await? else {
        return Ok(());
    };
    let mut outage = Outage(Duration::from_millis(500));
    loop {
        if sh.stopping.is_cancelled() {
            return Ok(());
        }
        let next = match t.state {
            TurnState::Done | TurnState::Failed | TurnState::Killed => return Ok(()),
            TurnState::Starting => match start_run(sh, &t).await? {
                Ok(run_id) => {
                    sh.metrics.runed_down.set(0);
                    outage = Outage(Duration::from_millis(500));
                    tracing::info!(run = %run_id, attempt = t.attempt, "run started");
                    Next::step(Step::Started { run_id })
                }
                Err(RunedError::Unavailable(why)) => {
                    sh.metrics.runed_down.set(1);
                    tracing::warn!(%why, "cannot start the run yet; the turn waits");
                    Next::Pause(outage.next())
                }
                Err(e @ RunedError::Busy { .. }) => {
                    // runed's queue is full: the run is asked for again, backing off, as in
                    // an outage (failing the turn on a transient 429 lost the user's message).
                    tracing::info!(error = %e, "runed is busy; the turn waits");
                    sh.metrics.runed_busy();
                    Next::Pause(outage.next())
                }
                Err(e @ RunedError::Refused { .. }) => Next::Step(
                    Step::End {
                        state: TurnState::Failed,
                        outcome: None,
                        error: Some(format!("could not start: {e}")),
                    },
                    Some((
                        Notice::Failed,
                        format!("The agent could not be started ({e})."),
                    )),
                ),
            },
            TurnState::Running => {
                let followed = match t.run_id.clone() {
                    Some(run_id) => follow(sh, mem, &mut t, &run_id).await,
                    // `Step::Started` records the run with the state: a running turn without
                    // one names a run runed cannot know.
                    None => Err(RunedError::Refused {
                        status: 404,
                        code: "not_found".into(),
                        message: "the turn records no run".into(),
                    }),
                };
                match followed {
                    Ok(status) => {
                        sh.metrics.runed_down.set(0);
                        // A steer under way finishes first; then the run's own record says
                        // which follow-ups its agent took.
                        let _steers = mem.steer.lock().await;
                        mem.set_run_started(false);
                        resolve_steers(sh, turn_id, Some(&status)).await?;
                        settle(sh, mem, &t, status)
                    }
                    Err(RunedError::Refused { status: 404, .. }) => {
                        let _steers = mem.steer.lock().await;
                        mem.set_run_started(false);
                        resolve_steers(sh, turn_id, None).await?;
                        // runed has no such run (its database was reset): a try without output.
                        failed_try(sh, &t, None, "runed no longer knows the run".into())
                    }
                    Err(e) => {
                        if matches!(e, RunedError::Unavailable(_)) {
                            sh.metrics.runed_down.set(1);
                        }
                        tracing::warn!(error = %e, "lost the run's events; following again shortly");
                        Next::Pause(outage.next())
                    }
                }
            }
            TurnState::Waiting => {
                let wait = t.next_try_at.map_or(0, |at| (at - now_ms()).max(0)) as u64;
                if !pause(sh, Duration::from_millis(wait)).await {
                    return Ok(());
                }
                tracing::info!(attempt = t.attempt + 1, "trying the turn again");
                Next::step(Step::Retry)
            }
        };
        match next {
            Next::Pause(d) => {
                if !pause(sh, d).await {
                    return Ok(());
                }
            }
            Next::Step(step, notice) => {
                let Some(moved) = advance(sh, &t, step).await? else {
                    return Ok(());
                };
                t = moved;
                if let Some((what, text)) = notice {
                    say_notice(sh, &t, what, text).await?;
                }
            }
        }
    }
}

/// What a driver's cycle comes to.
enum Next {
    /// Nothing changes yet: ask again after a while (runed or authd did not answer).
    Pause(Duration),
    /// The turn moves, and the chat may be told why (a notice's kind and text).
    Step(Step, Option<(Notice, String)>),
}

impl Next {
    fn step(step: Step) -> Next {
        Next::Step(step, None)
    }
}

/// Moves the driver's turn by `step`: the store's transition, and what an end does beside
/// it (the count, the calls it held for approval denied, the scheduler woken: the folder is
/// free). `None` when the turn is gone.
async fn advance(sh: &Shared, t: &TurnRow, step: Step) -> Result<Option<TurnRow>, DbError> {
    let ending = matches!(step, Step::End { .. });
    let next = match sh.store.advance(t, step, now_ms()).await? {
        Some(next) => {
            if next.state.is_over() {
                hako_shared::failpoint::hit("routd.turn.settled");
                sh.metrics.turn_ended(next.state.as_str());
                tracing::info!(state = %next.state, "turn ended");
            } else if next.state == TurnState::Waiting {
                sh.metrics.turn_retried();
            }
            Some(next)
        }
        // The stored turn moved meanwhile (there is one driver per turn, so it should not):
        // the driver goes on from what is stored.
        None => sh.store.turn(&t.turn_id).await?,
    };
    if ending {
        crate::approvals::end_of_turn(sh, &t.turn_id).await?;
        sh.turns.wake.notify_one();
    }
    Ok(next)
}

/// Asks runed for try `attempt`'s run. The outer error is routd's own (its database).
async fn start_run(sh: &Shared, t: &TurnRow) -> Result<Result<RunId, RunedError>, DbError> {
    let refused = |message: String| RunedError::Refused {
        status: 400,
        code: "invalid_turn".into(),
        message,
    };
    let group = match sh.store.group(&t.folder).await {
        Ok(Some(g)) => g,
        Ok(None) => {
            return Ok(Err(refused(format!(
                "the group {} no longer exists",
                t.folder
            ))));
        }
        // Settings this build cannot read (a newer hako's, a hand edit): the turn fails
        // with a notice instead of running with defaults (empty grants would grant all).
        Err(DbError::Sqlite(rusqlite::Error::FromSqlConversionFailure(_, _, e))) => {
            return Ok(Err(refused(format!(
                "the group's stored settings do not read: {e}"
            ))));
        }
        Err(e) => return Err(e),
    };
    let try_of = |turn| TurnTry::new(turn, u32::try_from(t.attempt).ok()?).ok();
    let (Ok(folder), Some(turn_id)) = (GroupFolder::new(&t.folder), try_of(t.turn_id.clone()))
    else {
        return Ok(Err(refused("the turn's folder or id is invalid".into())));
    };
    let covered = sh.store.covered_by(&t.turn_id).await?;
    let messages = covered
        .iter()
        .map(|m| {
            let mut msg = Message::user(m.content.clone());
            msg.extra.insert("id".into(), m.id.as_str().into());
            msg.extra.insert("sender".into(), m.sender.clone().into());
            if let Some(n) = &m.sender_name {
                msg.extra.insert("sender_name".into(), n.clone().into());
            }
            msg.extra.insert("timestamp".into(), m.timestamp.into());
            msg
        })
        .collect();
    let req = RunRequest {
        folder,
        turn_id: turn_id.runed_turn(),
        session_id: sh
            .store
            .session(&t.folder, &t.chat_jid)
            .await?
            .unwrap_or_default(),
        messages,
        system_prompt: group.system_prompt,
        grants: group.grants,
        sender_jid: covered
            .first()
            .map(|m| m.sender.clone())
            .unwrap_or_default(),
        secrets: Default::default(),
        group: group.spec,
    };
    let created = sh.runed.create_run(&req).await.map(|c| c.run_id);
    if created.is_ok() {
        hako_shared::failpoint::hit("routd.run.requested");
    }
    Ok(created)
}

/// Follows a run to its end: every block becomes what it means for the chat as it arrives.
/// Returns the run's final status.
async fn follow(
    sh: &Shared,
    mem: &LiveTurn,
    t: &mut TurnRow,
    run_id: &RunId,
) -> Result<RunStatus, RunedError> {
    let mut events = sh.runed.events(run_id).await?;
    loop {
        let next = tokio::select! {
            e = events.next() => e?,
            () = sh.stopping.cancelled() => return Err(RunedError::Unavailable("routd is stopping".into())),
        };
        match next {
            Some(RunStreamEvent::Output {
                index,
                block: Some(block),
                ..
            }) => {
                on_block(sh, mem, t, index, &block)
                    .await
                    .map_err(|e| RunedError::Unavailable(format!("routd.db: {e}")))?;
            }
            Some(RunStreamEvent::State {
                state: RunState::Running,
                ..
            }) => {
                // Follow-ups that waited for the container go in now.
                mem.set_run_started(true);
                sh.turns.wake.notify_one();
            }
            Some(RunStreamEvent::State { state, .. }) if state.is_terminal() => break,
            Some(_) => {}
            None => break,
        }
    }
    let status = sh.runed.run(run_id, Duration::ZERO).await?;
    if !status.state.is_terminal() {
        return Err(RunedError::Unavailable(
            "the event stream ended before the run".into(),
        ));
    }
    // Whatever the stream may have missed: replies have stable ids, nothing goes out twice.
    for (index, block) in status.outputs.iter().enumerate() {
        on_block(sh, mem, t, index, block)
            .await
            .map_err(|e| RunedError::Unavailable(format!("routd.db: {e}")))?;
    }
    Ok(status)
}

/// One output block: a reply for the chat (`ok` and `error` with text), and the session.
async fn on_block(
    sh: &Shared,
    mem: &LiveTurn,
    t: &mut TurnRow,
    index: usize,
    b: &OutputBlock,
) -> Result<(), DbError> {
    let reset = mem.session_reset();
    // A turn whose agent called `reset_session` does not bring its session back.
    if let Some(sid) = b
        .new_session_id
        .as_deref()
        .filter(|s| !s.is_empty() && !reset)
    {
        sh.store
            .set_session(&t.folder, &t.chat_jid, Some(sid.to_owned()), now_ms())
            .await?;
    }
    let text = match b.status {
        BlockStatus::Ok => b.result.clone(),
        BlockStatus::Error => b
            .result
            .clone()
            .filter(|r| !r.trim().is_empty())
            .or_else(|| b.error.as_ref().map(|e| format!("Error: {e}"))),
        BlockStatus::Fatal => None,
    };
    let Some(text) = text.filter(|x| !x.trim().is_empty()) else {
        return Ok(());
    };
    let reply_to = sh
        .store
        .covered_by(&t.turn_id)
        .await?
        .last()
        .map(|m| m.id.to_string());
    let id = format!("{}.{}.{}", t.turn_id, t.attempt, index);
    let said = sh
        .say(
            id,
            &t.chat_jid,
            MessageKind::Message,
            text,
            Some(t.turn_id.to_string()),
            reply_to,
        )
        .await?;
    if said.is_none() {
        return Ok(());
    }
    t.replies = sh.store.add_reply(&t.turn_id).await?;
    if t.replies == 1 {
        let latency = (now_ms() - t.first_in_at).max(0) as f64 / 1000.0;
        sh.metrics.turn_latency.observe(latency);
    }
    Ok(())
}

/// What the run's end does to the turn and its chat.
fn settle(sh: &Shared, mem: &LiveTurn, t: &TurnRow, status: RunStatus) -> Next {
    let answered = t.replies > 0;
    let outcome = status.outcome;
    let end = |state, error| Step::End {
        state,
        outcome,
        error,
    };
    // The model refused in a way no retry can fix (its key, no key, the budget): the turn
    // ends now, once, and the chat is told what the operator must do. Another try would only
    // ask the provider again and wait out the backoffs.
    if let Some(cut) = mem.cut_off_reason()
        && status.outcome != Some(Outcome::Killed)
    {
        let state = if answered {
            TurnState::Done
        } else {
            TurnState::Failed
        };
        let text = format!("The agent could not reach its model: {}", cut.message);
        return Next::Step(end(state, Some(cut.message)), Some((Notice::Model, text)));
    }
    match status.outcome {
        Some(Outcome::Ok) => Next::step(end(TurnState::Done, None)),
        Some(Outcome::Error) => {
            let notice = (!answered).then(|| {
                let why = status.error.as_deref().unwrap_or("no detail");
                (Notice::Error, format!("The agent could not answer: {why}"))
            });
            Next::Step(end(TurnState::Done, status.error.clone()), notice)
        }
        Some(Outcome::Killed) => Next::Step(
            end(TurnState::Killed, status.error.clone()),
            Some((Notice::Killed, "The agent was stopped.".into())),
        ),
        // A timeout or a fatal end after a reply: the reply stands, nothing is rolled back.
        Some(Outcome::TimedOut | Outcome::Fatal) | None if answered => {
            Next::step(end(TurnState::Done, status.error.clone()))
        }
        _ => {
            let why = status.error.clone().unwrap_or_else(|| {
                format!(
                    "the run ended {}",
                    outcome.map_or("without an outcome", Outcome::as_str)
                )
            });
            failed_try(sh, t, outcome, why)
        }
    }
}

/// A try that gave the chat nothing: wait and try again (a new run), or, after the last try,
/// fail the turn's messages and tell the chat.
fn failed_try(sh: &Shared, t: &TurnRow, outcome: Option<Outcome>, why: String) -> Next {
    let tries = i64::from(sh.cfg.max_turn_retries) + 1;
    if t.attempt < tries {
        let exp = 2u32.saturating_pow(u32::try_from(t.attempt - 1).unwrap_or(u32::MAX));
        let base = sh.cfg.retry_base.saturating_mul(exp).min(sh.cfg.retry_max);
        let delay = base + jitter(base / 4);
        tracing::info!(attempt = t.attempt, ?delay, %why, "no reply; the turn is tried again");
        Next::step(Step::TryFailed {
            outcome,
            error: why,
            retry_at: now_ms() + delay.as_millis() as i64,
        })
    } else {
        let text = format!("The agent could not answer after {tries} tries ({why}).");
        Next::Step(
            Step::End {
                state: TurnState::Failed,
                outcome,
                error: Some(why),
            },
            Some((Notice::Failed, text)),
        )
    }
}

/// Up to `max` of random delay.
fn jitter(max: Duration) -> Duration {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    let ms = max.as_millis() as u64;
    if ms == 0 {
        return Duration::ZERO;
    }
    Duration::from_millis(u64::from(u32::from_le_bytes(b)) % ms)
}

/// Why routd tells a turn's chat something itself. The kind is part of the notice's message
/// id (`<turn>.notice.<kind>`): each is said once per turn, however often a driver gets there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// The turn failed: its run could not start, or its last try gave nothing.
    Failed,
    /// The model refused in a way no retry fixes (its key, the budget).
    Model,
    /// The run ended `error` without a reply.
    Error,
    /// The run was stopped.
    Killed,
}

hako_shared::wire_names!(Notice {
    Failed => "failed",
    Model => "model",
    Error => "error",
    Killed => "killed",
});

/// A notice from routd to the turn's chat (once per turn and kind).
async fn say_notice(sh: &Shared, t: &TurnRow, what: Notice, text: String) -> Result<(), DbError> {
    sh.say(
        format!("{}.notice.{what}", t.turn_id),
        &t.chat_jid,
        MessageKind::Notice,
        text,
        Some(t.turn_id.to_string()),
        None,
    )
    .await
    .map(drop)
}

/// Every few seconds: the age of the oldest unanswered message per folder (the red flag).
pub(crate) async fn watch_backlog(sh: Arc<Shared>) {
    let mut seen: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(5)) => {}
            () = sh.stopping.cancelled() => return,
        }
        let Ok(rows) = sh.store.oldest_pending().await else {
            continue;
        };
        let now = now_ms();
        let mut by_folder: HashMap<String, i64> = HashMap::new();
        for (chat, at) in rows {
            let folder = sh
                .routing
                .resolve(&chat)
                .map_or_else(|| "(unrouted)".to_owned(), GroupFolder::into_string);
            let age = (now - at).max(0) / 1000;
            let e = by_folder.entry(folder).or_insert(0);
            *e = (*e).max(age);
        }
        for f in seen.difference(&by_folder.keys().cloned().collect()) {
            sh.metrics.oldest_unanswered(f, 0);
        }
        for (f, age) in &by_folder {
            sh.metrics.oldest_unanswered(f, *age);
        }
        seen = by_folder.into_keys().collect();
        crate::approvals::gauges(&sh).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_names_its_turn() {
        let a = turn_id_for("tg:1", "m1", "m3");
        assert_eq!(a, turn_id_for("tg:1", "m1", "m3"));
        assert_ne!(a, turn_id_for("tg:1", "m1", "m4"));
        assert_ne!(a, turn_id_for("tg:2", "m1", "m3"));
        // Parts cannot run into one another.
        assert_ne!(turn_id_for("a", "bc", "d"), turn_id_for("ab", "c", "d"));
        // The same id as every earlier routd gave the batch (a resumed turn keeps its id).
        assert_eq!(
            turn_id_for("tg:1", "m-1", "m-2").as_str(),
            "t-48d230679b766d95f53dbc0c"
        );
        let packed = TurnTry::new(a, 4).unwrap().runed_turn();
        assert!(packed.ends_with(".4"), "{packed}");
    }
}
