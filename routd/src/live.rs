//! What routd holds in memory for a turn while its driver runs: one [`LiveTurn`] per turn,
//! in one map, put there when the driver starts and taken out when it ends (by a guard, on
//! every way out). Everything else about a turn is in `routd.db`.

use hako_shared::ids::TurnId;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// One live turn's memory.
#[derive(Debug, Default)]
pub struct LiveTurn {
    /// Held while follow-ups are handed to runed; the turn's end waits for it, so that a
    /// follow-up handed over as the run ends is settled with the run, never beside it.
    pub steer: Arc<tokio::sync::Mutex<()>>,
    /// The scheduler found work for a steer while one was under way: it looks again when it
    /// ends.
    steer_again: AtomicBool,
    /// The current run's container has started: follow-ups can be placed. Before that they
    /// wait in the log (runed would refuse them) and go in once it starts.
    run_started: AtomicBool,
    /// The agent reset its session: this turn's own `newSessionId` is not kept.
    session_reset: AtomicBool,
    /// Messages runed would not take (the run was over): they wait for the next turn, not
    /// another steer.
    steer_refused: Mutex<HashSet<i64>>,
    /// Why the turn cannot reach its model at all (the provider refused routd's key, no key,
    /// the day's budget spent), from the gateway's first such refusal: later calls get the
    /// same answer without reaching the provider, and the turn ends with a notice naming the
    /// cause instead of being tried again.
    cut_off: Mutex<Option<CutOff>>,
    /// What the turn's tools wrote so far (`ROUTD_TURN_MAX_*`).
    writes: Mutex<Writes>,
    /// Cancelled when the driver lets the turn go: calls held for approval stop waiting.
    ended: tokio_util::sync::CancellationToken,
}

/// What a turn's tools wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Writes {
    /// `send_message` calls.
    pub messages: u64,
    /// Bytes of their text.
    pub bytes: u64,
    /// `set_status` edits.
    pub status: u64,
}

/// A refusal of the turn's model calls that no retry can fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CutOff {
    /// The HTTP status the gateway answered.
    pub status: u16,
    /// Its error code.
    pub code: &'static str,
    /// What the operator (or the group's owner) must do, in words.
    pub message: String,
}

impl LiveTurn {
    /// Whether follow-ups can be placed in the current run.
    pub fn run_started(&self) -> bool {
        self.run_started.load(Ordering::Acquire)
    }

    /// The current run's container started (or not yet, for a new try).
    pub fn set_run_started(&self, started: bool) {
        self.run_started.store(started, Ordering::Release);
    }

    /// A steer was asked for while one was under way.
    pub fn ask_steer_again(&self) {
        self.steer_again.store(true, Ordering::Release);
    }

    /// Whether a steer was asked for since the last call (and clears it).
    pub fn take_steer_again(&self) -> bool {
        self.steer_again.swap(false, Ordering::AcqRel)
    }

    /// Cancelled when the turn's driver ends.
    pub fn ended(&self) -> tokio_util::sync::CancellationToken {
        self.ended.clone()
    }

    /// Whether the agent reset its session.
    pub fn session_reset(&self) -> bool {
        self.session_reset.load(Ordering::Acquire)
    }

    /// The agent reset its session.
    pub fn reset_session(&self) {
        self.session_reset.store(true, Ordering::Release);
    }

    /// Whether runed refused to take message `seq` into this turn.
    pub fn refused(&self, seq: i64) -> bool {
        lock(&self.steer_refused).contains(&seq)
    }

    /// Counts a write if `fits` the turn's writes with it added; answers whether it did.
    pub fn write(&self, add: Writes, fits: impl FnOnce(&Writes) -> bool) -> bool {
        let mut w = lock(&self.writes);
        let next = Writes {
            messages: w.messages + add.messages,
            bytes: w.bytes + add.bytes,
            status: w.status + add.status,
        };
        if !fits(&next) {
            return false;
        }
        *w = next;
        true
    }

    /// The first refusal no retry can fix (later ones do not replace it).
    pub fn cut_off(&self, c: CutOff) {
        lock(&self.cut_off).get_or_insert(c);
    }

    /// Why the turn cannot reach its model, if it cannot.
    pub fn cut_off_reason(&self) -> Option<CutOff> {
        lock(&self.cut_off).clone()
    }

    /// runed refused to take these messages into this turn.
    pub fn refuse(&self, seqs: impl IntoIterator<Item = i64>) {
        lock(&self.steer_refused).extend(seqs);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live turns: those a driver task runs now (one driver per turn).
#[derive(Debug, Default)]
pub struct LiveTurns(Mutex<HashMap<TurnId, Arc<LiveTurn>>>);

impl LiveTurns {
    /// Claims a turn for a new driver: `None` when one already drives it.
    pub fn claim(self: &Arc<Self>, turn: &TurnId) -> Option<Driving> {
        let mut m = lock(&self.0);
        if m.contains_key(turn) {
            return None;
        }
        let live = Arc::new(LiveTurn::default());
        m.insert(turn.clone(), live.clone());
        Some(Driving {
            turns: self.clone(),
            turn: turn.clone(),
            live,
        })
    }

    /// A live turn's memory.
    pub fn get(&self, turn: &TurnId) -> Option<Arc<LiveTurn>> {
        lock(&self.0).get(turn).cloned()
    }

    /// How many turns are driven now.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// Whether no turn is driven.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A driver's hold on its turn: the turn leaves the live map when this is dropped.
#[derive(Debug)]
pub struct Driving {
    turns: Arc<LiveTurns>,
    turn: TurnId,
    live: Arc<LiveTurn>,
}

impl Driving {
    /// The turn's memory.
    pub fn live(&self) -> &Arc<LiveTurn> {
        &self.live
    }
}

impl Drop for Driving {
    fn drop(&mut self) {
        lock(&self.turns.0).remove(&self.turn);
        self.live.ended.cancel();
    }
}

/// The turns' side of what routd keeps in memory: the scheduler's bell, the turns driven now,
/// their sockets and their tasks.
pub(crate) struct Turns {
    /// Wakes the turn scheduler (a message came in, a turn ended, a route appeared).
    pub wake: tokio::sync::Notify,
    /// Turns a task is driving now (one driver per turn), with their memory.
    pub live: Arc<LiveTurns>,
    /// The live turns' sockets (`mcp.sock`, `api.sock`).
    pub sockets: crate::sockets::TurnSockets,
    /// Their tasks, drained at shutdown.
    pub tasks: Arc<TurnTasks>,
}

impl Default for Turns {
    fn default() -> Self {
        Turns {
            wake: tokio::sync::Notify::new(),
            live: Arc::default(),
            sockets: crate::sockets::TurnSockets::default(),
            tasks: Arc::default(),
        }
    }
}

/// The tasks of live turns (drivers, steers, the turns' socket servers), tracked so that
/// shutdown can wait for them: each finishes the step it is in (a run runed is starting is
/// recorded, a reply appended) instead of being cut mid-way and done again by the next routd.
/// What is still busy after the grace is cut off (its future dropped, its guards run), so
/// that once [`TurnTasks::drain`] returns no task of this routd touches a turn again: a routd
/// started after it, in this process or another, is the only one driving.
#[derive(Debug, Default)]
pub struct TurnTasks {
    tracker: tokio_util::task::TaskTracker,
    cut: tokio_util::sync::CancellationToken,
}

impl TurnTasks {
    /// Runs `work` as a turn's task.
    pub fn spawn(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let cut = self.cut.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                biased;
                () = cut.cancelled() => {}
                () = work => {}
            }
        });
    }

    /// Waits up to `grace` for the tasks to end (routd's stopping token tells them to), then
    /// cuts off the rest; answers how many were cut off.
    pub async fn drain(&self, grace: std::time::Duration) -> usize {
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_ok()
        {
            return 0;
        }
        let cut = self.tracker.len();
        self.cut.cancel();
        self.tracker.wait().await;
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_driver_per_turn_and_gone_with_it() {
        let turns = Arc::new(LiveTurns::default());
        let t1 = TurnId::new("t-1").unwrap();
        let d = turns.claim(&t1).unwrap();
        assert!(turns.claim(&t1).is_none(), "a second driver");
        d.live().refuse([4]);
        assert!(turns.get(&t1).unwrap().refused(4));
        let ended = d.live().ended();
        assert!(!ended.is_cancelled());
        drop(d);
        assert!(turns.get(&t1).is_none());
        assert!(ended.is_cancelled(), "what waits on the turn stops waiting");
        let again = turns.claim(&t1).unwrap();
        assert!(!again.live().refused(4), "a new driver starts afresh");
    }
}
