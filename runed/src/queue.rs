//! The run queue: a global cap on live containers, one live run (or hold) per folder, FIFO
//! within a folder, round-robin across folders (the folder served longest ago goes first),
//! and fair between tenants: a tenant (a folder's first segment, its world: `acme` of
//! `acme/support`) holds at most its cap of containers, and a free slot goes to the tenant
//! with the fewest live ones, so that one tenant's many sub-groups never take every slot.
//! Pure bookkeeping; the daemon holds it under one lock.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use hako_shared::ids::RunId;
use hako_shared::runs::SpawnKind;

/// One waiting item.
#[derive(Debug, Clone)]
pub struct Entry {
    /// The run id.
    pub run_id: RunId,
    /// Run or hold.
    pub kind: SpawnKind,
    /// When it was queued.
    pub since: Instant,
}

/// The queue.
#[derive(Debug)]
pub struct FairQueue {
    cap: usize,
    /// Live containers one tenant may hold.
    tenant_cap: usize,
    active: usize,
    /// Live containers per tenant.
    active_per: HashMap<String, usize>,
    queues: HashMap<String, VecDeque<Entry>>,
    /// Folders with waiting items, least recently served first.
    order: VecDeque<String>,
    busy: HashSet<String>,
    len: usize,
}

impl FairQueue {
    /// An empty queue allowing `cap` live containers, at most `tenant_cap` of one tenant.
    pub fn new(cap: usize, tenant_cap: usize) -> Self {
        Self {
            cap,
            tenant_cap: tenant_cap.max(1),
            active: 0,
            active_per: HashMap::new(),
            queues: HashMap::new(),
            order: VecDeque::new(),
            busy: HashSet::new(),
            len: 0,
        }
    }

    /// Appends an item to its folder's queue.
    pub fn push(&mut self, folder: &str, e: Entry) {
        self.insert(folder, e, false);
    }

    /// Puts an item back at the head of its folder's queue (a start that must be retried).
    pub fn push_front(&mut self, folder: &str, e: Entry) {
        self.insert(folder, e, true);
    }

    fn insert(&mut self, folder: &str, e: Entry, front: bool) {
        let q = self.queues.entry(folder.to_owned()).or_default();
        if q.is_empty() && !self.order.iter().any(|f| f == folder) {
            if front {
                self.order.push_front(folder.to_owned());
            } else {
                self.order.push_back(folder.to_owned());
            }
        }
        if front {
            q.push_front(e);
        } else {
            q.push_back(e);
        }
        self.len += 1;
    }

    /// The items waiting in `folder`'s queue, oldest first.
    pub fn waiting<'a>(&'a self, folder: &str) -> impl Iterator<Item = &'a Entry> + 'a {
        self.queues.get(folder).into_iter().flatten()
    }

    /// Removes a waiting item; `false` if it was not waiting.
    pub fn remove(&mut self, folder: &str, run_id: &RunId) -> bool {
        let Some(q) = self.queues.get_mut(folder) else {
            return false;
        };
        let Some(pos) = q.iter().position(|e| e.run_id == *run_id) else {
            return false;
        };
        q.remove(pos);
        self.len -= 1;
        if q.is_empty() {
            self.queues.remove(folder);
            self.order.retain(|f| f != folder);
        }
        true
    }

    /// The next item allowed to start, marking its folder busy and taking a container slot
    /// for a run.
    pub fn next_ready(&mut self) -> Option<(String, Entry)> {
        let full = self.active >= self.cap;
        // Among the folders that may start, the one whose tenant has the fewest live
        // containers; the order (least recently served first) breaks ties.
        let idx = self
            .order
            .iter()
            .enumerate()
            .filter(|(_, f)| {
                !self.busy.contains(*f)
                    && self
                        .queues
                        .get(*f)
                        .and_then(|q| q.front())
                        .is_some_and(|e| {
                            e.kind == SpawnKind::Hold
                                || (!full && self.tenant_active(f) < self.tenant_cap)
                        })
            })
            .min_by_key(|(i, f)| {
                let run = self
                    .queues
                    .get(*f)
                    .and_then(|q| q.front())
                    .is_some_and(|e| e.kind == SpawnKind::Run);
                (if run { self.tenant_active(f) } else { 0 }, *i)
            })
            .map(|(i, _)| i)?;
        let folder = self.order.remove(idx)?;
        let q = self.queues.get_mut(&folder)?;
        let e = q.pop_front()?;
        self.len -= 1;
        if q.is_empty() {
            self.queues.remove(&folder);
        } else {
            self.order.push_back(folder.clone());
        }
        self.claim(&folder, e.kind);
        Some((folder, e))
    }

    /// Marks a folder busy (and a container slot taken for a run) outside of [`Self::next_ready`],
    /// for runs re-adopted at start.
    pub fn claim(&mut self, folder: &str, kind: SpawnKind) {
        self.busy.insert(folder.to_owned());
        if kind == SpawnKind::Run {
            self.active += 1;
            *self
                .active_per
                .entry(tenant(folder).to_owned())
                .or_default() += 1;
        }
    }

    /// Frees a folder's slot (and the container slot of a run).
    pub fn release(&mut self, folder: &str, kind: SpawnKind) {
        self.busy.remove(folder);
        if kind == SpawnKind::Run {
            self.active = self.active.saturating_sub(1);
            let t = tenant(folder);
            if let Some(n) = self.active_per.get_mut(t) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.active_per.remove(t);
                }
            }
        }
    }

    /// Live containers of `folder`'s tenant.
    fn tenant_active(&self, folder: &str) -> usize {
        self.active_per.get(tenant(folder)).copied().unwrap_or(0)
    }

    /// Items waiting.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Items waiting for `folder`.
    pub fn folder_len(&self, folder: &str) -> usize {
        self.queues.get(folder).map_or(0, VecDeque::len)
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `folder`'s slot is taken (a run, a hold, or a box being made for it).
    pub fn is_busy(&self, folder: &str) -> bool {
        self.busy.contains(folder)
    }

    /// Live containers.
    pub fn active(&self) -> usize {
        self.active
    }

    /// How long the oldest waiting item has waited.
    pub fn oldest_age(&self, now: Instant) -> Duration {
        self.queues
            .values()
            .filter_map(|q| q.front())
            .map(|e| now.saturating_duration_since(e.since))
            .max()
            .unwrap_or_default()
    }
}

/// A folder's tenant: its world, the first segment.
fn tenant(folder: &str) -> &str {
    folder.split('/').next().unwrap_or(folder)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(id: &str) -> Entry {
        Entry {
            run_id: RunId::new(id).unwrap(),
            kind: SpawnKind::Run,
            since: Instant::now(),
        }
    }

    #[test]
    fn cap_exclusivity_fifo_and_fairness() {
        let mut q = FairQueue::new(2, 2);
        for i in 0..3 {
            q.push("a", e(&format!("a{i}")));
        }
        q.push("b", e("b0"));
        q.push("c", e("c0"));
        let (f1, e1) = q.next_ready().unwrap();
        let (f2, e2) = q.next_ready().unwrap();
        assert_eq!((f1.as_str(), e1.run_id.as_str()), ("a", "a0"));
        assert_eq!((f2.as_str(), e2.run_id.as_str()), ("b", "b0"));
        assert!(q.next_ready().is_none(), "cap of 2 reached");
        q.release("a", SpawnKind::Run);
        // c has waited since before a's second item was served: fairness picks c.
        assert_eq!(q.next_ready().unwrap().1.run_id, "c0");
        assert!(q.next_ready().is_none());
        q.release("b", SpawnKind::Run);
        assert_eq!(
            q.next_ready().unwrap().1.run_id,
            "a1",
            "FIFO within a folder"
        );
        // A hold needs no container slot, only its folder's.
        q.push(
            "d",
            Entry {
                run_id: RunId::new("h").unwrap(),
                kind: SpawnKind::Hold,
                since: Instant::now(),
            },
        );
        assert_eq!(q.next_ready().unwrap().1.run_id, "h");
        assert_eq!(q.active(), 2);
        assert_eq!(q.folder_len("a"), 1);
        assert!(q.remove("a", &RunId::new("a2").unwrap()));
        assert!(q.is_empty());
        assert_eq!(q.folder_len("a"), 0);
    }

    /// One tenant's many sub-groups cannot take every slot: it holds at most its cap, and a
    /// freed slot goes to the tenant with the fewest live containers, whatever the order.
    #[test]
    fn tenants_share_the_slots() {
        let mut q = FairQueue::new(4, 2);
        for i in 0..6 {
            q.push(&format!("acme/g{i}"), e(&format!("acme{i}")));
        }
        let started: Vec<String> =
            std::iter::from_fn(|| q.next_ready().map(|(_, e)| e.run_id.into_string())).collect();
        assert_eq!(started, ["acme0", "acme1"], "acme's cap of 2");
        assert_eq!(q.active(), 2);
        // Another tenant arrives last, and starts at once.
        q.push("beta", e("beta0"));
        q.push("beta/x", e("beta1"));
        assert_eq!(q.next_ready().unwrap().1.run_id, "beta0");
        assert_eq!(q.next_ready().unwrap().1.run_id, "beta1");
        assert!(q.next_ready().is_none(), "the global cap");
        // acme frees a slot: acme (2 live → 1) and beta (2) — acme has the fewest.
        q.release("acme/g0", SpawnKind::Run);
        q.push("gamma", e("gamma0"));
        // gamma (0 live) goes before acme (1 live), though acme waited longer.
        assert_eq!(q.next_ready().unwrap().1.run_id, "gamma0");
    }
}
