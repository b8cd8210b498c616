//! The bells of held tool calls (`approvals.rs`): who in this process waits on which
//! request, woken when its row changes; and which requests nobody waits on, since when.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The held calls waiting in this process, by request id: woken when their row changes.
/// A request may have several waiters (the same call asked again while its first asking
/// still waits), and none for a while (its agent's connection broke, or routd restarted):
/// then it is an orphan since a time, and the sweeper denies it if no one comes back.
#[derive(Debug, Default)]
pub(crate) struct Waiters(Mutex<WaitersInner>);

#[derive(Debug, Default)]
struct WaitersInner {
    /// The request's bell and how many wait on it.
    waiting: HashMap<String, (Arc<Notify>, usize)>,
    /// Requests nobody here waits on, since when.
    orphans: HashMap<String, tokio::time::Instant>,
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, WaitersInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn wake(&self, id: &str) {
        if let Some((n, _)) = self.lock().waiting.get(id) {
            n.notify_waiters();
        }
    }

    /// Marks a pending request nobody waits on yet (routd started with it pending).
    pub(crate) fn orphan(&self, id: &str) {
        let mut w = self.lock();
        if !w.waiting.contains_key(id) {
            w.orphans
                .entry(id.to_owned())
                .or_insert_with(tokio::time::Instant::now);
        }
    }

    /// Whether nobody has waited on `id` for at least `grace`.
    pub(crate) fn orphaned_for(&self, id: &str, grace: std::time::Duration) -> bool {
        self.lock()
            .orphans
            .get(id)
            .is_some_and(|since| since.elapsed() >= grace)
    }

    pub(crate) fn forget(&self, id: &str) {
        self.lock().orphans.remove(id);
    }
}

/// A waiter's place in [`Waiters`], given back however the wait ends (an asking whose
/// connection broke leaves its request an orphan until it is asked again).
pub(crate) struct Waiting<'a> {
    waiters: &'a Waiters,
    id: String,
    pub(crate) notify: Arc<Notify>,
}

impl<'a> Waiting<'a> {
    pub(crate) fn new(waiters: &'a Waiters, id: &str) -> Self {
        let mut w = waiters.lock();
        w.orphans.remove(id);
        let (notify, n) = w
            .waiting
            .entry(id.to_owned())
            .or_insert_with(|| (Arc::new(Notify::new()), 0));
        *n += 1;
        let notify = notify.clone();
        drop(w);
        Waiting {
            waiters,
            id: id.to_owned(),
            notify,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut w = self.waiters.lock();
        let last = match w.waiting.get_mut(&self.id) {
            Some((_, n)) => {
                *n -= 1;
                *n == 0
            }
            None => false,
        };
        if last {
            w.waiting.remove(&self.id);
            w.orphans
                .insert(self.id.clone(), tokio::time::Instant::now());
        }
    }
}
