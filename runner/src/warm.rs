//! Warm boxes: a folder's next agent container, started after its last run ended and blocked
//! before its input, so that the folder's next turn skips the container's create, attach and
//! start (most of a cold turn's cost).
//!
//! - **The same box a cold start would make.** A warm box is created from the very
//!   [`ContainerSpec`] the folder's run would ask for (image, user, env, mounts, network,
//!   limits, runtime; the security profile is the engine's, the same for every box), plus
//!   `HAKO_WARM=1`. Only images that say they understand that variable (the `io.hako.warm`
//!   label) are warmed: their agent waits for the stdin line without a deadline and counts
//!   the one the line carries from its arrival, so the run's ceiling holds.
//! - **No token, no secret.** They travel in the stdin line, written only when a run takes
//!   the box; until then the box holds nothing a cold box would not.
//! - **Taken only if equal.** A run takes its folder's box only when the spec it would create
//!   equals the box's, the image behind the tag is the box's, the box still runs, and its
//!   folder's directories were not replaced since (preparing the run put nothing aside).
//!   Otherwise the box is removed and the run starts cold; the miss says why.
//! - **One run per box.** A taken box leaves the pool: it is that run's container, removed
//!   with it. Boxes live at most `warm_ttl`, at most `warm_max` per install; one per folder.
//! - **Never outlives its holder.** The box's stdin is held by this process's attach: if the
//!   process dies the box reads end-of-input and exits, and a restart finds it as a container
//!   of no run and removes it. A box that a run took is recorded as that run's (the caller's
//!   [`super::BindHook`]) before the input is written, so a restart re-adopts it as the run.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use hako_shared::ids::RunId;
use tokio::io::AsyncWrite;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use hako_shared::GroupFolder;
use hako_shared::contract::{WARM_ENV, WARM_LABEL};
use hako_shared::runs::Network;

use super::engine::{ContainerSpec, EngineError, FrameStream, Listed, labels};
use super::{RunError, RunSpec, Runner};

/// Why a run did not get a warm box.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WarmMiss {
    /// The folder had none (its first run, expired, or the pool was full).
    Empty,
    /// The group's spec changed: the box was made for another image, env, mounts or limits.
    Spec,
    /// The image behind the tag changed since the box was made.
    Image,
    /// The box stopped while it waited.
    Gone,
    /// Preparing the run replaced something in the folder the box had mounted.
    Dirty,
}

// The metric's labels.
hako_shared::wire_names!(WarmMiss {
    Empty => "empty",
    Spec => "spec",
    Image => "image",
    Gone => "gone",
    Dirty => "dirty",
});

/// How a run's container came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// Created for the run; with the reason when a warm box was looked for and not used.
    Cold(Option<WarmMiss>),
    /// A warm box, made before the run was asked for.
    Warm {
        /// What its create, attach and start took when it was made: the time the run saved.
        saved: Duration,
    },
}

/// Why a folder gets no warm box after its run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotWarmed {
    /// Warming is off (`RUNED_WARM_MAX=0`) or the group opted out (`warm: false`).
    #[error("warming is off")]
    Off,
    /// The group has sidecars or an egress allowlist: those are made per run.
    #[error("the group has sidecars or an egress allowlist")]
    PerRun,
    /// The image does not carry the `io.hako.warm` label.
    #[error("image {0} does not say it reads its deadline from stdin (label io.hako.warm)")]
    Image(String),
    /// `warm_max` boxes exist already.
    #[error("{0} warm boxes exist already (RUNED_WARM_MAX)")]
    Full(usize),
    /// Making it failed.
    #[error("{0}")]
    Failed(String),
}

impl From<RunError> for NotWarmed {
    fn from(e: RunError) -> Self {
        NotWarmed::Failed(e.to_string())
    }
}

impl From<EngineError> for NotWarmed {
    fn from(e: EngineError) -> Self {
        NotWarmed::Failed(e.to_string())
    }
}

/// A started box waiting for its run.
pub(super) struct WarmBox {
    /// Its container.
    pub container: String,
    /// The spec a run must ask for to take it (its name and labels aside: they are the box's).
    spec: ContainerSpec,
    /// The image id it runs.
    image_id: String,
    /// Its stdin, open until the run's line is written.
    pub stdin: Pin<Box<dyn AsyncWrite + Send>>,
    /// Its output, attached before it started.
    pub output: FrameStream,
    /// What making it took.
    pub saved: Duration,
    /// Cancels its expiry when it leaves the pool.
    _expiry: DropGuard,
}

/// The boxes of this runner, one per folder at most.
#[derive(Default)]
pub(super) struct WarmPool {
    boxes: Mutex<HashMap<GroupFolder, WarmBox>>,
    /// Per folder, how often it was retired: a box being made while its folder was retired
    /// was made over the old directory, and is never kept.
    retired: Mutex<HashMap<GroupFolder, u64>>,
    /// Boxes created and not yet in `boxes` (an orphan sweep must not take them).
    making: Mutex<std::collections::HashSet<String>>,
    /// Set at shutdown: no box is made or kept from then on.
    closed: std::sync::atomic::AtomicBool,
    /// `prestart` calls under way, and the wake of [`Runner::drain_warm`] when one ends: a
    /// box whose create Docker finishes after the drain would outlive this process.
    in_flight: std::sync::atomic::AtomicUsize,
    settled: tokio::sync::Notify,
}

/// A `prestart` under way, counted until dropped.
struct InFlight<'a>(&'a WarmPool);

impl<'a> InFlight<'a> {
    fn enter(pool: &'a WarmPool) -> Self {
        pool.in_flight
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        InFlight(pool)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .in_flight
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.0.settled.notify_waiters();
    }
}

impl WarmPool {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<GroupFolder, WarmBox>> {
        self.boxes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many boxes wait.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether `container` is a box of this pool (waiting, or being made).
    pub fn holds(&self, container: &str) -> bool {
        self.lock().values().any(|b| b.container == container)
            || self
                .making
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(container)
    }

    fn generation(&self, folder: &GroupFolder) -> u64 {
        let r = self.retired.lock().unwrap_or_else(|p| p.into_inner());
        r.get(folder).copied().unwrap_or(0)
    }

    /// The folder is being retired: its box (if any) is handed back, and none being made now
    /// is kept.
    fn retire(&self, folder: &GroupFolder) -> Option<WarmBox> {
        *self
            .retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(folder.clone())
            .or_insert(0) += 1;
        self.take(folder)
    }

    fn take(&self, folder: &GroupFolder) -> Option<WarmBox> {
        self.lock().remove(folder)
    }

    /// The folder's box, if it is `container` (an expiry must not take a newer box).
    fn take_if(&self, folder: &GroupFolder, container: &str) -> Option<WarmBox> {
        let mut boxes = self.lock();
        match boxes.get(folder) {
            Some(b) if b.container == container => boxes.remove(folder),
            _ => None,
        }
    }

    /// Keeps `b` as `folder`'s box, unless `max` boxes wait already (then it is handed back).
    #[allow(clippy::result_large_err)]
    fn put(
        &self,
        folder: GroupFolder,
        b: WarmBox,
        max: usize,
        generation: u64,
    ) -> Result<(), WarmBox> {
        let mut boxes = self.lock();
        if boxes.len() >= max
            || self.generation(&folder) != generation
            || self.closed.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(b);
        }
        boxes.insert(folder, b);
        Ok(())
    }

    fn drain(&self) -> Vec<WarmBox> {
        self.lock().drain().map(|(_, b)| b).collect()
    }
}

/// A box being made: in the pool's `making` set until dropped.
struct Making<'a> {
    pool: &'a WarmPool,
    container: String,
}

impl<'a> Making<'a> {
    fn new(pool: &'a WarmPool, container: &str) -> Self {
        pool.making
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(container.to_owned());
        Making {
            pool,
            container: container.to_owned(),
        }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.pool
            .making
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.container);
    }
}

/// The spec with what differs between any two boxes (name, labels) left out, and the program
/// copies under `programs` (`programs.rs`): a box made before its image's copy was ready reads
/// the same bytes from its image, so it serves a run that would bind the copy.
fn same_box(a: &ContainerSpec, b: &ContainerSpec, programs: &std::path::Path) -> bool {
    let strip = |s: &ContainerSpec| ContainerSpec {
        name: String::new(),
        labels: HashMap::new(),
        mounts: s
            .mounts
            .iter()
            .filter(|m| !m.source.starts_with(programs))
            .cloned()
            .collect(),
        ..s.clone()
    };
    strip(a) == strip(b)
}

impl Runner {
    /// Warm boxes waiting now.
    pub fn warm_boxes(&self) -> usize {
        self.warm.len()
    }

    /// Whether a group's runs get boxes at all: the install keeps them, the group does not opt
    /// out (`Off`), and nothing of its runs is made per run (`PerRun`: sidecars, its network).
    pub fn warms(&self, g: &hako_shared::runs::GroupSpec) -> Result<(), NotWarmed> {
        if self.cfg.warm_max == 0 || g.warm == Some(false) {
            return Err(NotWarmed::Off);
        }
        if !g.sidecars.is_empty() || g.network == Network::Allowlist {
            return Err(NotWarmed::PerRun);
        }
        Ok(())
    }

    /// Starts `spec.folder`'s next box, the one `spec` would get, and keeps it for the
    /// folder's next run (at most `warm_ttl`). `spec`'s ids and input are not used: the box
    /// has its own id and gets its input from the run that takes it. Call it while no run of
    /// the folder is live (it prepares the folder's directories). A box the folder had is
    /// replaced.
    pub async fn prestart(&self, spec: &RunSpec) -> Result<(), NotWarmed> {
        let cfg = &self.cfg;
        let g = &spec.group;
        self.warms(g)?;
        // Counted before the check: a drain that closes the pool after it waits for this one.
        let _flight = InFlight::enter(&self.warm);
        if self.warm.closed.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(NotWarmed::Off);
        }
        let generation = self.warm.generation(&spec.folder);
        if let Some(old) = self.warm.take(&spec.folder) {
            self.discard(old, "replaced").await;
        }
        if self.warm.len() >= cfg.warm_max {
            return Err(NotWarmed::Full(cfg.warm_max));
        }
        let t0 = Instant::now();
        // The image first: a folder whose image cannot wait is not even prepared.
        let image_ref = self.image_for(g);
        let image = self.engine.image(&image_ref, cfg.docker_timeout).await?;
        let warm_capable = image.labels.get(WARM_LABEL).is_some_and(|v| v == "1");
        if !warm_capable {
            return Err(NotWarmed::Image(image_ref));
        }
        let id = RunId::random("warm-", 12);
        let spec = RunSpec {
            run_id: id.clone(),
            turn_id: None,
            ..spec.clone()
        };
        let prepared = self.prepare(&spec).await?;
        let ceiling = cfg.ceiling(g.timeout.map(|t| t.0));
        let key = self.agent_spec(&spec, &prepared, ceiling, None).await?;
        let mut boxed = key.clone();
        boxed.env.push(format!("{WARM_ENV}=1"));
        boxed.labels = self.base_labels(&id, &spec.folder, "agent");
        boxed
            .labels
            .insert(labels::WARM_BOX.to_owned(), "1".to_owned());
        boxed.name = self.container_name(&id, "");
        let t = cfg.docker_timeout;
        let container = self.create_box(&boxed).await?;
        let _making = Making::new(&self.warm, &container);
        let made = self.attach_and_start(&container).await;
        let attached = match made {
            Ok(a) => a,
            Err(e) => {
                let _ = self.engine.remove(&container, None, t).await;
                return Err(e.into());
            }
        };
        let expiry = CancellationToken::new();
        let b = WarmBox {
            container: container.clone(),
            spec: key,
            image_id: image.id,
            stdin: attached.stdin,
            output: attached.output,
            saved: t0.elapsed(),
            _expiry: expiry.clone().drop_guard(),
        };
        let folder = spec.folder.clone();
        if let Err(b) = self.warm.put(folder.clone(), b, cfg.warm_max, generation) {
            self.discard(b, "the pool filled or the folder was retired meanwhile")
                .await;
            return Err(NotWarmed::Full(cfg.warm_max));
        }
        tracing::info!(folder = %folder, container = %container, took = ?t0.elapsed(), "warm box ready");
        let this = self.clone();
        let ttl = cfg.warm_ttl;
        tokio::spawn(async move {
            tokio::select! {
                () = expiry.cancelled() => {}
                () = tokio::time::sleep(ttl) => {
                    if let Some(b) = this.warm.take_if(&folder, &container) {
                        this.discard(b, "expired").await;
                    }
                }
            }
        });
        Ok(())
    }

    /// The folder's warm box for a run that would create `want`, if it may take it; any box
    /// it may not take is removed. `dirty`: preparing the run replaced something the box had
    /// mounted.
    pub(super) async fn take_warm(
        &self,
        folder: &GroupFolder,
        want: &ContainerSpec,
        dirty: bool,
    ) -> Result<WarmBox, WarmMiss> {
        let b = self.warm.take(folder).ok_or(WarmMiss::Empty)?;
        let miss = if dirty {
            Some(WarmMiss::Dirty)
        } else if !same_box(&b.spec, want, &crate::programs::root(&self.cfg)) {
            Some(WarmMiss::Spec)
        } else {
            let t = self.cfg.docker_timeout;
            let (c, i) = tokio::join!(
                self.engine.state(&b.container, t),
                self.engine.image(&want.image, t),
            );
            if !c.is_ok_and(|c| c.running) {
                Some(WarmMiss::Gone)
            } else if i.ok().map(|i| i.id).as_deref() != Some(b.image_id.as_str()) {
                Some(WarmMiss::Image)
            } else {
                None
            }
        };
        match miss {
            None => Ok(b),
            Some(m) => {
                // Removed beside the cold start, not before it.
                let this = self.clone();
                tokio::spawn(async move { this.discard(b, m.as_str()).await });
                Err(m)
            }
        }
    }

    /// Retires a folder whose group was deleted: its warm box is removed (and one being made
    /// now is never kept), and its directory goes to the trash, so that nothing of it (files,
    /// transcripts, settings an agent planted, the next launch it left) reaches a group made
    /// in the folder later. Call it while no run of the folder is live. Answers whether the
    /// folder had a directory.
    pub async fn retire_folder(&self, folder: &GroupFolder) -> Result<bool, RunError> {
        if let Some(b) = self.warm.retire(folder) {
            self.discard(b, "its group was deleted").await;
        }
        let storage = self.storage.clone();
        let f = folder.clone();
        tokio::task::spawn_blocking(move || storage.retire_folder(&f))
            .await
            .map_err(|e| RunError::Io(std::io::Error::other(e)))?
            .map_err(RunError::Io)
    }

    /// Removes every warm box (shutdown), once the boxes being made are made (and removed):
    /// none is made or kept after this. Returns how many there were.
    pub async fn drain_warm(&self) -> usize {
        use std::sync::atomic::Ordering;
        self.warm.closed.store(true, Ordering::SeqCst);
        loop {
            let settled = self.warm.settled.notified();
            tokio::pin!(settled);
            // Registered before the check: a prestart ending in between still wakes it.
            settled.as_mut().enable();
            if self.warm.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            settled.await;
        }
        let boxes = self.warm.drain();
        let n = boxes.len();
        futures_util::future::join_all(boxes.into_iter().map(|b| self.discard(b, "shutdown")))
            .await;
        self.drain_copies().await;
        n
    }

    /// Removes a box that no run will take.
    async fn discard(&self, b: WarmBox, why: &str) {
        tracing::info!(container = %b.container, why, "removing a warm box");
        let id = b.container.clone();
        // Its stdin closes first: the agent reads end-of-input and exits by itself.
        drop(b);
        if let Err(e) = self.engine.remove(&id, None, self.cfg.docker_timeout).await {
            // It holds no token; the next start's orphan sweep removes it.
            tracing::warn!(container = %id, error = %e, "removing a warm box failed");
        }
    }
}

/// Whether a listed container is a warm box (made before any run: never adopted as one).
pub fn is_warm(c: &Listed) -> bool {
    c.labels.get(labels::WARM_BOX).is_some_and(|v| v == "1")
        && c.labels.get(labels::ROLE).map(String::as_str) == Some("agent")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mounts::MountEntry;
    use hako_shared::runs::Limits;

    fn spec() -> ContainerSpec {
        ContainerSpec {
            name: "hako-i-run1".into(),
            image: "hako-agent:latest".into(),
            user: "1000:1000".into(),
            env: vec![
                "HOME=/home/agent".into(),
                "ARIZUKO_QUERY_TIMEOUT_MS=5000".into(),
            ],
            cmd: None,
            mounts: Vec::new(),
            network: "none".into(),
            limits: Limits {
                memory: 1 << 30,
                cpus: 2.0,
                pids: 512,
            },
            labels: HashMap::from([("io.hako.run".to_owned(), "run1".to_owned())]),
            stdin: true,
            runtime: None,
            kind: crate::engine::BoxKind::Agent,
        }
    }

    #[test]
    fn a_box_matches_only_the_same_container() {
        let a = spec();
        let mut b = spec();
        b.name = "hako-i-warm-x".into();
        b.labels.insert("io.hako.run".into(), "warm-x".into());
        let programs = std::path::Path::new("/data/programs");
        assert!(
            same_box(&a, &b, programs),
            "name and labels are the box's own"
        );
        // The copy of the image's program, ready for this run but not when the box was made.
        b.mounts.push(MountEntry {
            source: programs.join("ab12/0"),
            target: "/usr/local/bin/codex".into(),
            readonly: true,
        });
        assert!(
            same_box(&a, &b, programs),
            "a program copy changes no behaviour"
        );
        for change in [
            (|s: &mut ContainerSpec| s.image = "other:latest".into()) as fn(&mut ContainerSpec),
            |s| s.env.push("TZ=UTC".into()),
            |s| s.network = "bridge".into(),
            |s| s.limits.memory = 512 << 20,
            |s| s.runtime = Some("runsc".into()),
            |s| s.user = "0:0".into(),
            |s| {
                s.mounts.push(MountEntry {
                    source: "/data/groups/g/extra".into(),
                    target: "/workspace/extra".into(),
                    readonly: true,
                });
            },
        ] {
            let mut c = spec();
            change(&mut c);
            assert!(!same_box(&a, &c, programs), "{c:?}");
        }
    }
}
