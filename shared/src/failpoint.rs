//! Failpoints: the places right after a durable step (a row committed, a container made, a
//! request answered by the next daemon) where a test can end the process abruptly, to prove
//! that a restart from exactly there loses and doubles nothing (`routd/tests/sweep.rs`).
//!
//! [`hit`] compiles to nothing unless the `failpoints` feature is on, which only the test
//! builds turn on (a dev-dependency feature): release images carry none of this. With the
//! feature, `HAKO_FAILPOINT=<name>` (or `<name>@<n>`, the n-th time it is reached) makes the
//! process note the name in `HAKO_FAILPOINT_LOG` (a file, appended and synced) and SIGKILL
//! itself there: no destructor, no flush, no graceful anything, as a power cut would.

/// Every failpoint, by daemon and step. A name passed to [`hit`] must be here (the feature's
/// build checks it), and the sweep runs one conversation per name.
pub const ALL: &[&str] = &[
    // routd
    "routd.message.ingested",
    "routd.turn.created",
    "routd.run.requested",
    "routd.block.appended",
    "routd.webhook.delivered",
    "routd.turn.settled",
    "routd.followup.staged",
    "routd.followup.placed",
    "routd.followup.resolved",
    "routd.approval.requested",
    "routd.approval.decided",
    // runed
    "runed.run.queued",
    "runed.token.minted",
    "runed.container.created",
    "runed.container.started",
    "runed.output.recorded",
    "runed.run.ended",
    "runed.container.removed",
    "runed.warm.recorded",
    "runed.warm.taken",
    // authd
    "authd.token.minted",
    "authd.token.revoked",
];

/// The process reached the durable step `name`: with the `failpoints` feature and
/// `HAKO_FAILPOINT` naming it, the process dies here; otherwise nothing happens.
#[inline(always)]
pub fn hit(name: &'static str) {
    #[cfg(feature = "failpoints")]
    armed::hit(name);
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::io::Write;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// The armed failpoint: its name and the hit that kills.
    fn armed() -> Option<&'static (String, u32)> {
        static ARMED: OnceLock<Option<(String, u32)>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let v = std::env::var("HAKO_FAILPOINT").ok()?;
                let (name, nth) = match v.split_once('@') {
                    Some((n, k)) => (n.to_owned(), k.parse().ok()?),
                    None => (v, 1),
                };
                Some((name, nth))
            })
            .as_ref()
    }

    pub(super) fn hit(name: &'static str) {
        assert!(
            super::ALL.contains(&name),
            "failpoint {name} is not in hako_shared::failpoint::ALL"
        );
        let Some((armed, nth)) = armed() else { return };
        if armed != name {
            return;
        }
        static HITS: AtomicU32 = AtomicU32::new(0);
        if HITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
            return;
        }
        if let Ok(path) = std::env::var("HAKO_FAILPOINT_LOG")
            && let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
        {
            let _ = writeln!(f, "{name}");
            let _ = f.sync_all();
        }
        eprintln!("[failpoint] {name}: killing the process");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}

#[cfg(test)]
mod tests {
    /// Each failpoint named once, and every name in the source is in [`super::ALL`] (the
    /// sweep runs what `ALL` lists; a name missing from it would never be swept).
    #[test]
    fn every_failpoint_in_the_tree_is_listed_once() {
        let mut seen = std::collections::HashSet::new();
        for n in super::ALL {
            assert!(seen.insert(*n), "{n} listed twice");
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut used = std::collections::HashSet::new();
        for krate in ["routd", "runed", "runner", "authd"] {
            let mut stack = vec![root.join(krate).join("src")];
            while let Some(d) = stack.pop() {
                for e in std::fs::read_dir(&d).unwrap() {
                    let p = e.unwrap().path();
                    if p.is_dir() {
                        stack.push(p);
                    } else if p.extension().is_some_and(|x| x == "rs") {
                        let text = std::fs::read_to_string(&p).unwrap();
                        for part in text.split("failpoint::hit(\"").skip(1) {
                            let name = part.split('"').next().unwrap().to_owned();
                            assert!(
                                super::ALL.contains(&name.as_str()),
                                "{name} ({}) is not in ALL",
                                p.display()
                            );
                            used.insert(name);
                        }
                    }
                }
            }
        }
        for n in super::ALL {
            assert!(used.contains(*n), "{n} is listed but no code reaches it");
        }
    }
}
