//! A simulated container engine: the same [`Engine`] as Docker, with boxes that are scripts
//! instead of processes, as omicron's simulated sled agent stands behind the real one's API.
//! The runner's and runed's logic tests run on it with no Docker daemon at all; what only
//! Docker can show (mounts, the security profile, gVisor, egress, isolation) keeps its
//! real-Docker tests.
//!
//! - **Images** are registered with a [`Script`] (what a box of the image does) and labels.
//!   Creating a box of an image not registered is [`EngineError::ImageMissing`], as on a
//!   machine that never pulls.
//! - **A box** runs its script when started: the script reads the box's stdin (the run's one
//!   line, from the attach), writes stdout and stderr frames, receives the signals it traps,
//!   and returns its exit code. Everything it writes is kept (the engine's log, for
//!   `logs`), and followers see it as it comes.
//! - **Signals** as Docker's init forwards them: `SIGKILL` ends the box at once (137); an
//!   untrapped `SIGTERM` or `SIGUSR1` ends it by the signal's default action (143, 138); a
//!   trapped one reaches the script. `stop` is SIGTERM, the grace, then SIGKILL.
//! - **Time** is tokio's, so tests may run on paused time.
//! - **Faults**: [`SimEngine::fail`] makes the next calls of an operation fail as told.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use tokio::io::{AsyncBufReadExt, BufReader, DuplexStream};
use tokio::sync::{Notify, mpsc, watch};

use hako_shared::contract::{Markers, OutputBlock};

use crate::engine::{
    Attached, BoxControl, ContainerSpec, Engine, EngineError, Frame, FrameStream, ImageInfo,
    Inspected, Listed, ListedNetwork, NetworkSpec, ProcessState,
};

/// What a box of an image does, given its I/O; returns its exit code.
pub type Script = Arc<dyn Fn(BoxIo) -> BoxFuture<'static, i64> + Send + Sync>;

/// Makes a [`Script`] of an async closure.
pub fn script<F, Fut>(f: F) -> Script
where
    F: Fn(BoxIo) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = i64> + Send + 'static,
{
    Arc::new(move |io| Box::pin(f(io)))
}

/// A signal a script may trap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `SIGTERM` (a stop).
    Term,
    /// `SIGUSR1` (hako's wake-up: a follow-up or the close is waiting).
    Usr1,
}

impl Signal {
    fn parse(name: &str) -> Option<Signal> {
        match name {
            "SIGTERM" | "TERM" | "15" => Some(Signal::Term),
            "SIGUSR1" | "USR1" | "10" => Some(Signal::Usr1),
            _ => None,
        }
    }

    /// The exit code of a box this signal ended (its default action).
    fn exit_code(self) -> i64 {
        match self {
            Signal::Term => 143,
            Signal::Usr1 => 138,
        }
    }
}

/// A box's side of its I/O, as its script sees it.
pub struct BoxIo {
    /// What the box was created from (env, labels, mounts, …).
    pub spec: ContainerSpec,
    stdin: Option<BufReader<DuplexStream>>,
    out: Arc<Log>,
    signals: mpsc::UnboundedReceiver<Signal>,
    trapped: Arc<Mutex<HashSet<Signal>>>,
}

impl BoxIo {
    /// The next line of stdin, without its newline; `None` at the end of input.
    pub async fn read_line(&mut self) -> Option<String> {
        let stdin = self.stdin.as_mut()?;
        let mut line = String::new();
        match stdin.read_line(&mut line).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(line.trim_end_matches('\n').to_owned()),
        }
    }

    /// The run's input line, parsed (`None`: no line, or not the contract's JSON).
    pub async fn read_input(&mut self) -> Option<hako_shared::contract::ContainerInput> {
        serde_json::from_str(&self.read_line().await?).ok()
    }

    /// Writes to stdout.
    pub fn stdout(&self, bytes: impl Into<Bytes>) {
        self.out.push(Frame::Stdout(bytes.into()));
    }

    /// Writes to stderr.
    pub fn stderr(&self, bytes: impl Into<Bytes>) {
        self.out.push(Frame::Stderr(bytes.into()));
    }

    /// Writes an output block between the box's markers (those of its env, else the
    /// defaults), as an agent does.
    pub fn block(&self, block: &OutputBlock) {
        let env = |k: &str| {
            self.spec
                .env
                .iter()
                .find_map(|e| e.strip_prefix(k)?.strip_prefix('=').map(str::to_owned))
        };
        let d = Markers::default();
        let start = env(hako_shared::contract::MARKER_START_ENV).unwrap_or(d.start);
        let end = env(hako_shared::contract::MARKER_END_ENV).unwrap_or(d.end);
        let json = serde_json::to_string(block).unwrap_or_default();
        self.stdout(format!("{start}\n{json}\n{end}\n"));
    }

    /// Takes the box's stdin (the script reads it itself from then on).
    pub fn take_stdin(&mut self) -> Option<BufReader<DuplexStream>> {
        self.stdin.take()
    }

    /// A handle that writes the box's output, for tasks of the script.
    pub fn outlet(&self) -> Outlet {
        Outlet(self.out.clone())
    }

    /// From now on `signal` reaches [`BoxIo::signal`] instead of ending the box.
    pub fn trap(&self, signal: Signal) {
        self.trapped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(signal);
    }

    /// The next trapped signal (pending forever once the engine dropped the box).
    pub async fn signal(&mut self) -> Signal {
        match self.signals.recv().await {
            Some(s) => s,
            None => std::future::pending().await,
        }
    }
}

/// Writes a box's output from anywhere in its script.
#[derive(Clone)]
pub struct Outlet(Arc<Log>);

impl Outlet {
    /// Writes to stdout.
    pub fn stdout(&self, bytes: impl Into<Bytes>) {
        self.0.push(Frame::Stdout(bytes.into()));
    }

    /// Writes to stderr.
    pub fn stderr(&self, bytes: impl Into<Bytes>) {
        self.0.push(Frame::Stderr(bytes.into()));
    }
}

/// Everything a box wrote, in order, and a wake for its followers.
#[derive(Default)]
struct Log {
    frames: Mutex<Vec<Frame>>,
    /// Set once the box has exited: followers end after the last frame.
    closed: std::sync::atomic::AtomicBool,
    grew: Notify,
}

impl Log {
    fn push(&self, f: Frame) {
        self.frames
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(f);
        self.grew.notify_waiters();
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.grew.notify_waiters();
    }

    fn len(&self) -> usize {
        self.frames.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Frames from `from` on; with `follow`, until the box exits.
    fn stream(self: &Arc<Self>, from: usize, follow: bool) -> FrameStream {
        let log = self.clone();
        futures_util::stream::unfold(from, move |i| {
            let log = log.clone();
            async move {
                loop {
                    let grew = log.grew.notified();
                    tokio::pin!(grew);
                    grew.as_mut().enable();
                    if let Some(f) = log
                        .frames
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .get(i)
                        .cloned()
                    {
                        return Some((Ok(f), i + 1));
                    }
                    if !follow || log.closed.load(Ordering::SeqCst) {
                        return None;
                    }
                    grew.await;
                }
            }
        })
        .boxed()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Created,
    Running,
    Exited(i64),
}

struct SimBox {
    spec: ContainerSpec,
    labels: HashMap<String, String>,
    status: Status,
    log: Arc<Log>,
    /// The script's end of stdin, until it starts.
    stdin: Option<DuplexStream>,
    /// Set when the box exits.
    exit: watch::Sender<Option<i64>>,
    signals: Option<mpsc::UnboundedSender<Signal>>,
    trapped: Arc<Mutex<HashSet<Signal>>>,
    task: Option<tokio::task::AbortHandle>,
}

/// An image the engine has.
#[derive(Clone)]
struct SimImage {
    info: ImageInfo,
    script: Script,
}

/// An operation [`SimEngine::fail`] can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `create`.
    Create,
    /// `start`.
    Start,
    /// `remove`.
    Remove,
    /// `list`.
    List,
    /// `version`.
    Version,
}

#[derive(Default)]
struct State {
    boxes: HashMap<String, SimBox>,
    images: HashMap<String, SimImage>,
    /// Failures to answer: (operation, the box it is for or any, the error), first first.
    faults: Vec<(Op, Option<String>, EngineError)>,
    /// Every removal asked for: (id, the stop's grace).
    removals: Vec<(String, Option<Duration>)>,
    /// Every box ever created (the count of creates, for tests).
    created: u64,
    /// Networks by name: their spec and the boxes on them (by id, with their alias).
    networks: HashMap<String, (NetworkSpec, HashMap<String, Option<String>>)>,
}

/// A box on a network: its id, and the alias it is known by there.
pub type Member = (String, Option<String>);

/// The simulated engine. Cheap to clone: clones share their boxes.
#[derive(Clone, Default)]
pub struct SimEngine {
    state: Arc<Mutex<State>>,
    ids: Arc<AtomicU64>,
}

impl SimEngine {
    /// An engine with no images and no boxes.
    pub fn new() -> SimEngine {
        SimEngine::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers (or replaces: a new id, as a rebuilt tag) `reference` with `labels`; its
    /// boxes run `script`.
    pub fn image(&self, reference: &str, labels: &[(&str, &str)], script: Script) {
        let n = self.ids.fetch_add(1, Ordering::Relaxed);
        let info = ImageInfo {
            id: format!("sha256:sim{n:016x}"),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        self.lock()
            .images
            .insert(reference.to_owned(), SimImage { info, script });
    }

    /// The next call of `op` (on box `id`, or on any) fails with `error`. Each call queued
    /// answers once, in the order queued.
    pub fn fail(&self, op: Op, id: Option<&str>, error: EngineError) {
        self.lock().faults.push((op, id.map(str::to_owned), error));
    }

    fn fault(&self, op: Op, id: Option<&str>) -> Result<(), EngineError> {
        let mut st = self.lock();
        let hit = st
            .faults
            .iter()
            .position(|(o, target, _)| *o == op && (target.is_none() || target.as_deref() == id));
        match hit {
            Some(i) => Err(st.faults.remove(i).2),
            None => Ok(()),
        }
    }

    /// Puts a box there as if an earlier process had made it: `labels`, running or exited
    /// (it runs nothing). Returns its id.
    pub fn plant(&self, labels: &[(&str, &str)], running: bool) -> String {
        let id = self.next_id();
        let (exit, _) = watch::channel((!running).then_some(0));
        let log = Arc::new(Log::default());
        if !running {
            log.close();
        }
        let labels: HashMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let spec = ContainerSpec {
            name: id.clone(),
            image: String::new(),
            user: String::new(),
            env: Vec::new(),
            cmd: None,
            mounts: Vec::new(),
            network: "none".into(),
            limits: crate::engine::Limits {
                memory: 0,
                cpus: 0.0,
                pids: 0,
            },
            labels: labels.clone(),
            stdin: false,
            runtime: None,
            kind: crate::engine::BoxKind::Agent,
        };
        self.lock().boxes.insert(
            id.clone(),
            SimBox {
                spec,
                labels,
                status: if running {
                    Status::Running
                } else {
                    Status::Exited(0)
                },
                log,
                stdin: None,
                exit,
                signals: None,
                trapped: Arc::default(),
                task: None,
            },
        );
        id
    }

    /// The boxes that exist now (any state).
    pub fn boxes(&self) -> Vec<String> {
        let mut v: Vec<String> = self.lock().boxes.keys().cloned().collect();
        v.sort();
        v
    }

    /// The boxes that exist now and run.
    pub fn running(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .lock()
            .boxes
            .iter()
            .filter(|(_, b)| b.status == Status::Running)
            .map(|(k, _)| k.clone())
            .collect();
        v.sort();
        v
    }

    /// The spec a box was created from.
    pub fn spec(&self, id: &str) -> Option<ContainerSpec> {
        self.lock().boxes.get(id).map(|b| b.spec.clone())
    }

    /// Every removal asked for so far: (id, the stop's grace), sorted.
    pub fn removals(&self) -> Vec<(String, Option<Duration>)> {
        let mut v = self.lock().removals.clone();
        v.sort();
        v
    }

    /// How many boxes were created so far.
    pub fn created(&self) -> u64 {
        self.lock().created
    }

    /// The networks that exist now: each spec, and the boxes on it (by id) with their alias,
    /// sorted.
    pub fn networks(&self) -> Vec<(NetworkSpec, Vec<Member>)> {
        let mut v: Vec<_> = self
            .lock()
            .networks
            .values()
            .map(|(n, m)| {
                let mut m: Vec<_> = m.iter().map(|(k, a)| (k.clone(), a.clone())).collect();
                m.sort();
                (n.clone(), m)
            })
            .collect();
        v.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        v
    }

    /// A box's id from its id or its name, as Docker takes either.
    fn resolve(st: &State, id_or_name: &str) -> String {
        if st.boxes.contains_key(id_or_name) {
            return id_or_name.to_owned();
        }
        st.boxes
            .iter()
            .find(|(_, b)| b.spec.name == id_or_name)
            .map_or_else(|| id_or_name.to_owned(), |(id, _)| id.clone())
    }

    fn next_id(&self) -> String {
        format!("sim{:012x}", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Ends a running box with `code` (its script is dropped).
    fn end(st: &mut State, id: &str, code: i64) {
        if let Some(b) = st.boxes.get_mut(id)
            && b.status == Status::Running
        {
            if let Some(t) = b.task.take() {
                t.abort();
            }
            b.status = Status::Exited(code);
            b.signals = None;
            b.log.close();
            // Stored even when nobody waits yet (`send` would drop it).
            b.exit.send_replace(Some(code));
        }
    }

    /// Delivers `sig` as Docker's init would.
    fn deliver(&self, id: &str, sig: &str) -> Result<(), EngineError> {
        let mut st = self.lock();
        let b = st
            .boxes
            .get(id)
            .ok_or_else(|| EngineError::NotFound(id.to_owned()))?;
        if b.status != Status::Running {
            return Err(EngineError::NotRunning(id.to_owned()));
        }
        if sig == "SIGKILL" || sig == "KILL" || sig == "9" {
            Self::end(&mut st, id, 137);
            return Ok(());
        }
        let Some(s) = Signal::parse(sig) else {
            return Err(EngineError::Api {
                status: Some(400),
                message: format!("invalid signal: {sig}"),
            });
        };
        let trapped = b
            .trapped
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&s);
        if trapped {
            if let Some(tx) = &b.signals {
                let _ = tx.send(s);
            }
        } else {
            Self::end(&mut st, id, s.exit_code());
        }
        Ok(())
    }

    fn exit_rx(&self, id: &str) -> Result<watch::Receiver<Option<i64>>, EngineError> {
        self.lock()
            .boxes
            .get(id)
            .map(|b| b.exit.subscribe())
            .ok_or_else(|| EngineError::NotFound(id.to_owned()))
    }

    async fn stop_box(&self, id: &str, grace: Duration) -> Result<(), EngineError> {
        let mut rx = self.exit_rx(id)?;
        match self.deliver(id, "SIGTERM") {
            Ok(()) => {}
            Err(EngineError::NotRunning(_)) => return Ok(()),
            Err(e) => return Err(e),
        }
        let exited = tokio::time::timeout(grace, rx.wait_for(Option::is_some)).await;
        if exited.is_err() {
            Self::end(&mut self.lock(), id, 137);
        }
        Ok(())
    }
}

impl BoxControl for SimEngine {
    fn wait(&self, id: &str) -> BoxFuture<'static, Result<i64, EngineError>> {
        let rx = self.exit_rx(id);
        Box::pin(async move {
            let mut rx = rx?;
            let code = rx
                .wait_for(Option::is_some)
                .await
                .map_err(|_| EngineError::api("the box was removed while waited for"))?;
            Ok(code.unwrap_or_default())
        })
    }

    fn stop(
        &self,
        id: &str,
        grace: Duration,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let this = self.clone();
        let id = id.to_owned();
        Box::pin(async move { this.stop_box(&id, grace).await })
    }

    fn signal(
        &self,
        id: &str,
        signal: &'static str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let r = self.deliver(id, signal);
        Box::pin(async move { r })
    }

    fn state(
        &self,
        id: &str,
        limit: Duration,
    ) -> BoxFuture<'static, Result<ProcessState, EngineError>> {
        let i = self.inspect(id, limit);
        Box::pin(async move { Ok(i.await?.state) })
    }

    fn list(
        &self,
        label: &'static str,
        value: Option<&str>,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<Listed>, EngineError>> {
        let r = self.fault(Op::List, None).map(|()| {
            let st = self.lock();
            let mut v: Vec<Listed> = st
                .boxes
                .iter()
                .filter(|(_, b)| {
                    b.labels
                        .get(label)
                        .is_some_and(|v| value.is_none_or(|want| v == want))
                })
                .map(|(id, b)| Listed {
                    id: id.clone(),
                    name: b.spec.name.clone(),
                    labels: b.labels.clone(),
                    state: match b.status {
                        Status::Created => "created",
                        Status::Running => "running",
                        Status::Exited(_) => "exited",
                    }
                    .to_owned(),
                })
                .collect();
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v
        });
        Box::pin(async move { r })
    }

    fn remove(
        &self,
        id: &str,
        stop: Option<Duration>,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        self.lock().removals.push((id.to_owned(), stop));
        let this = self.clone();
        let id = Self::resolve(&self.lock(), id);
        Box::pin(async move {
            this.fault(Op::Remove, Some(&id))?;
            if let Some(grace) = stop
                && this.lock().boxes.contains_key(&id)
            {
                this.stop_box(&id, grace).await?;
            }
            let mut st = this.lock();
            Self::end(&mut st, &id, 137);
            // Gone already is done; a box removed leaves its networks.
            st.boxes.remove(&id);
            for (_, members) in st.networks.values_mut() {
                members.remove(&id);
            }
            Ok(())
        })
    }
}

impl Engine for SimEngine {
    fn create(
        &self,
        spec: &ContainerSpec,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<String, EngineError>> {
        let r = self.fault(Op::Create, None).and_then(|()| {
            let id = self.next_id();
            let mut st = self.lock();
            let image = st
                .images
                .get(&spec.image)
                .ok_or_else(|| EngineError::ImageMissing(spec.image.clone()))?;
            if st.boxes.values().any(|b| b.spec.name == spec.name) {
                return Err(EngineError::Api {
                    status: Some(409),
                    message: format!("Conflict. The container name {:?} is in use", spec.name),
                });
            }
            // A box carries its image's labels, its own over them.
            let mut labels = image.info.labels.clone();
            labels.extend(spec.labels.clone());
            let (exit, _) = watch::channel(None);
            st.created += 1;
            st.boxes.insert(
                id.clone(),
                SimBox {
                    spec: spec.clone(),
                    labels,
                    status: Status::Created,
                    log: Arc::default(),
                    stdin: None,
                    exit,
                    signals: None,
                    trapped: Arc::default(),
                    task: None,
                },
            );
            Ok(id)
        });
        Box::pin(async move { r })
    }

    fn attach(
        &self,
        id: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<Attached, EngineError>> {
        let r = (|| {
            let mut st = self.lock();
            let b = st
                .boxes
                .get_mut(id)
                .ok_or_else(|| EngineError::NotFound(id.to_owned()))?;
            let (ours, theirs) = tokio::io::duplex(64 << 10);
            let stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>> = if b.spec.stdin {
                b.stdin = Some(theirs);
                Box::pin(ours)
            } else {
                Box::pin(tokio::io::sink())
            };
            let from = b.log.len();
            Ok(Attached {
                stdin,
                output: b.log.stream(from, true),
            })
        })();
        Box::pin(async move { r })
    }

    fn start(&self, id: &str, _limit: Duration) -> BoxFuture<'static, Result<(), EngineError>> {
        let r = self.fault(Op::Start, Some(id)).and_then(|()| {
            let mut st = self.lock();
            let State { boxes, images, .. } = &mut *st;
            let b = boxes
                .get_mut(id)
                .ok_or_else(|| EngineError::NotFound(id.to_owned()))?;
            if b.status != Status::Created {
                return Ok(());
            }
            let script = images
                .get(&b.spec.image)
                .map(|i| i.script.clone())
                .ok_or_else(|| EngineError::ImageMissing(b.spec.image.clone()))?;
            let (tx, rx) = mpsc::unbounded_channel();
            let io = BoxIo {
                spec: b.spec.clone(),
                stdin: b.stdin.take().map(BufReader::new),
                out: b.log.clone(),
                signals: rx,
                trapped: b.trapped.clone(),
            };
            b.signals = Some(tx);
            b.status = Status::Running;
            let this = self.clone();
            let box_id = id.to_owned();
            let task = tokio::spawn(async move {
                let code = script(io).await;
                Self::end(&mut this.lock(), &box_id, code);
            });
            b.task = Some(task.abort_handle());
            Ok(())
        });
        Box::pin(async move { r })
    }

    fn inspect(
        &self,
        id: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<Inspected, EngineError>> {
        let st = self.lock();
        let r = st
            .boxes
            .get(&Self::resolve(&st, id))
            .map(|b| Inspected {
                state: ProcessState {
                    running: b.status == Status::Running,
                    exit_code: match b.status {
                        Status::Exited(c) => Some(c),
                        _ => None,
                    },
                },
                labels: b.labels.clone(),
                image: b.spec.image.clone(),
                // Scripted boxes have no addresses: nothing listens in them.
                addresses: HashMap::new(),
            })
            .ok_or_else(|| EngineError::NotFound(id.to_owned()));
        Box::pin(async move { r })
    }

    fn logs(&self, id: &str, follow: bool) -> FrameStream {
        match self.lock().boxes.get(id) {
            Some(b) => b.log.stream(0, follow),
            None => {
                let e = EngineError::NotFound(id.to_owned());
                futures_util::stream::once(async move { Err(e) }).boxed()
            }
        }
    }

    fn image(
        &self,
        reference: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<ImageInfo, EngineError>> {
        let r = self
            .lock()
            .images
            .get(reference)
            .map(|i| i.info.clone())
            .ok_or_else(|| EngineError::ImageMissing(reference.to_owned()));
        Box::pin(async move { r })
    }

    fn runtimes(&self, _limit: Duration) -> BoxFuture<'static, Result<Vec<String>, EngineError>> {
        Box::pin(async { Ok(vec!["runc".to_owned()]) })
    }

    fn archive(&self, id: &str, _path: &str) -> BoxStream<'static, Result<Bytes, EngineError>> {
        // Boxes are scripts: their images hold no files.
        let e = EngineError::NotFound(id.to_owned());
        futures_util::stream::once(async move { Err(e) }).boxed()
    }

    fn version(&self, _limit: Duration) -> BoxFuture<'static, Result<String, EngineError>> {
        let r = self.fault(Op::Version, None).map(|()| "sim".to_owned());
        Box::pin(async move { r })
    }

    fn create_network(
        &self,
        spec: &NetworkSpec,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        self.lock()
            .networks
            .entry(spec.name.clone())
            .or_insert_with(|| (spec.clone(), HashMap::new()));
        Box::pin(async { Ok(()) })
    }

    fn connect(
        &self,
        network: &str,
        id: &str,
        alias: Option<&str>,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let mut st = self.lock();
        let id = Self::resolve(&st, id);
        let known = st.boxes.contains_key(&id);
        let r = match st.networks.get_mut(network) {
            Some((_, members)) if known => {
                members.insert(id.clone(), alias.map(str::to_owned));
                Ok(())
            }
            Some(_) => Err(EngineError::NotFound(id.to_owned())),
            None => Err(EngineError::NotFound(network.to_owned())),
        };
        Box::pin(async move { r })
    }

    fn disconnect(
        &self,
        network: &str,
        id: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let mut st = self.lock();
        let id = Self::resolve(&st, id);
        if let Some((_, members)) = st.networks.get_mut(network) {
            members.remove(&id);
        }
        Box::pin(async { Ok(()) })
    }

    fn remove_network(
        &self,
        name: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<(), EngineError>> {
        let mut st = self.lock();
        // As Docker: a network with a box still on it stays.
        let r = match st.networks.get(name) {
            Some((_, members)) if !members.is_empty() => Err(EngineError::Api {
                status: Some(403),
                message: format!("network {name} has active endpoints"),
            }),
            _ => {
                st.networks.remove(name);
                Ok(())
            }
        };
        Box::pin(async move { r })
    }

    fn networks(
        &self,
        label: &'static str,
        value: &str,
        _limit: Duration,
    ) -> BoxFuture<'static, Result<Vec<ListedNetwork>, EngineError>> {
        let mut v: Vec<ListedNetwork> = self
            .lock()
            .networks
            .values()
            .filter(|(n, _)| n.labels.get(label).map(String::as_str) == Some(value))
            .map(|(n, _)| ListedNetwork {
                name: n.name.clone(),
                labels: n.labels.clone(),
            })
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Box::pin(async move { Ok(v) })
    }
}

/// Where a path of the box is on the host: under the mount that holds it (the longest).
pub fn host_path(spec: &ContainerSpec, path: &str) -> Option<std::path::PathBuf> {
    spec.mounts
        .iter()
        .filter_map(|m| {
            let rest = path.strip_prefix(m.target.as_str())?;
            (rest.is_empty() || rest.starts_with('/'))
                .then(|| (m.target.len(), m.source.join(rest.trim_start_matches('/'))))
        })
        .max_by_key(|(n, _)| *n)
        .map(|(_, p)| p)
}

/// A box that is a host process: `program` (a real agent binary, hako-agent) runs with the
/// box's environment and nothing of the host's, its container paths (the input directory,
/// the turn's sockets, `$HOME`, the working directory) mapped onto their mounts' host
/// sources. Its stdin, stdout, stderr, exit code and the signals the engine forwards
/// (SIGTERM, SIGUSR1) are the box's. It runs as this process's user (the box's user could
/// not reach a data root under a private temporary directory: a bind mount does not walk
/// the path) and has none of a container's isolation: only for logic tests of the agent
/// hako wrote, with scripts that touch nothing outside the box's own directories.
pub fn process(program: std::path::PathBuf) -> Script {
    use hako_shared::contract::{API_SOCKET, INPUT_DIR, MCP_SOCKET};
    use tokio::io::AsyncReadExt;
    script(move |mut io| {
        let program = program.clone();
        async move {
            io.trap(Signal::Term);
            io.trap(Signal::Usr1);
            let spec = io.spec.clone();
            let mut cmd = tokio::process::Command::new(&program);
            cmd.env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .kill_on_drop(true);
            for e in &spec.env {
                if let Some((k, v)) = e.split_once('=') {
                    cmd.env(k, v);
                }
            }
            for (var, path) in [
                ("HAKO_INPUT_DIR", INPUT_DIR),
                ("HAKO_MCP_SOCKET", MCP_SOCKET),
                ("HAKO_API_SOCKET", API_SOCKET),
                ("HOME", crate::mounts::HOME),
            ] {
                if let Some(p) = host_path(&spec, path) {
                    cmd.env(var, p);
                }
            }
            if let Some(dir) = host_path(&spec, crate::mounts::WORKSPACE) {
                cmd.current_dir(dir);
            }
            let mut child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => {
                    io.stderr(format!("{}: {e}\n", program.display()));
                    return 127;
                }
            };
            let pid = child
                .id()
                .and_then(|p| rustix::process::Pid::from_raw(p as i32));
            let mut stdin = child.stdin.take();
            let feed = io.take_stdin().map(|mut from| {
                tokio::spawn(async move {
                    if let Some(to) = stdin.as_mut() {
                        let _ = tokio::io::copy(&mut from, to).await;
                    }
                    // End of input reaches the agent as it would in a box.
                    drop(stdin);
                })
            });
            let pump = |r: Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>, err: bool| {
                let out = io.outlet();
                tokio::spawn(async move {
                    let Some(mut r) = r else { return };
                    let mut buf = vec![0u8; 16 << 10];
                    while let Ok(n) = r.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        let chunk = Bytes::copy_from_slice(&buf[..n]);
                        if err {
                            out.stderr(chunk);
                        } else {
                            out.stdout(chunk);
                        }
                    }
                })
            };
            let stdout = pump(
                child
                    .stdout
                    .take()
                    .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                false,
            );
            let stderr = pump(
                child
                    .stderr
                    .take()
                    .map(|s| Box::new(s) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
                true,
            );
            let status = loop {
                tokio::select! {
                    s = child.wait() => break s,
                    sig = io.signal() => {
                        let sig = match sig {
                            Signal::Term => rustix::process::Signal::TERM,
                            Signal::Usr1 => rustix::process::Signal::USR1,
                        };
                        if let Some(pid) = pid {
                            let _ = rustix::process::kill_process(pid, sig);
                        }
                    }
                }
            };
            // Everything it wrote is the box's output before the box ends.
            let _ = tokio::join!(stdout, stderr);
            if let Some(f) = feed {
                f.abort();
            }
            match status {
                Ok(s) => {
                    use std::os::unix::process::ExitStatusExt;
                    s.code()
                        .map(i64::from)
                        .or_else(|| s.signal().map(|n| 128 + i64::from(n)))
                        .unwrap_or(1)
                }
                Err(_) => 1,
            }
        }
    })
}

/// Scripts of boxes that behave as agents do.
pub mod agents {
    use super::*;

    /// Reads its input and answers `echo: <prompt>` in one block, then exits 0.
    pub fn echo() -> Script {
        script(|mut io| async move {
            let Some(input) = io.read_input().await else {
                return 2;
            };
            io.block(&OutputBlock::ok(format!("echo: {}", last(&input))));
            0
        })
    }

    /// The input's last message.
    pub fn last(input: &hako_shared::contract::ContainerInput) -> &str {
        input.messages.last().map_or("", |m| m.content.as_str())
    }

    /// Reads its input and then runs until it is stopped or killed (SIGTERM ends it).
    pub fn hang() -> Script {
        script(|mut io| async move {
            let _ = io.read_input().await;
            std::future::pending::<()>().await;
            0
        })
    }

    /// Reads its input, writes `stderr` there, and exits with `code` without a block.
    pub fn die(code: i64, stderr: &'static str) -> Script {
        script(move |mut io| async move {
            let _ = io.read_input().await;
            io.stderr(stderr);
            code
        })
    }

    /// hako-agent's script brain, in part (`specs/agent-script.md`): each line of each user
    /// message is echoed, except the commands `/sleep S`, `/exit C`, `/blocks N`,
    /// `/error M`, `/fatal M` and `/ignore-sigterm`, which do what the real agent does; the
    /// reply is one `ok` block. Then, as the real agent, it takes follow-ups from the
    /// folder's input directory (woken by SIGUSR1, or every 50 ms) until `_close`.
    pub fn script_agent() -> Script {
        script(|mut io| async move {
            io.trap(Signal::Usr1);
            let Some(input) = io.read_input().await else {
                return 2;
            };
            let text = input
                .messages
                .iter()
                .filter(|m| m.role == "user")
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join("\n\n");
            if let Some(code) = answer(&io, &text).await {
                return code;
            }
            let Some(dir) = input_dir(&io.spec) else {
                return 0;
            };
            loop {
                match take_follow_ups(&dir) {
                    Taken::Close => return 0,
                    Taken::Texts(texts) => {
                        for t in texts {
                            if let Some(code) = answer(&io, &t).await {
                                return code;
                            }
                        }
                    }
                }
                tokio::select! {
                    _ = io.signal() => {}
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
        })
    }

    /// Runs one query's lines; `Some(code)`: exit now.
    async fn answer(io: &BoxIo, text: &str) -> Option<i64> {
        use hako_shared::contract::BlockStatus;
        let mut lines = Vec::new();
        for line in text.lines() {
            let (cmd, rest) = line.split_once(' ').unwrap_or((line, ""));
            let out = match cmd {
                "/sleep" => {
                    let secs: f64 = rest.trim().parse().unwrap_or(0.0);
                    tokio::time::sleep(Duration::from_secs_f64(secs.max(0.0))).await;
                    format!("slept {secs} s")
                }
                "/exit" => return Some(rest.trim().parse().unwrap_or(1)),
                "/blocks" => {
                    let n: u32 = rest.trim().parse().unwrap_or(0);
                    for i in 1..=n {
                        io.block(&OutputBlock::ok(format!("block {i}/{n}")));
                    }
                    format!("emitted {n} blocks")
                }
                "/error" => {
                    io.block(&OutputBlock::failure(BlockStatus::Error, rest));
                    "emitted an error block".into()
                }
                "/fatal" => {
                    io.block(&OutputBlock::failure(BlockStatus::Fatal, rest));
                    "emitted a fatal block".into()
                }
                "/ignore-sigterm" => {
                    io.trap(Signal::Term);
                    "ignoring SIGTERM".into()
                }
                _ => line.to_owned(),
            };
            lines.push(out);
        }
        io.block(&OutputBlock::ok(lines.join("\n")));
        None
    }

    /// Where the folder's input directory is on the host.
    fn input_dir(spec: &ContainerSpec) -> Option<std::path::PathBuf> {
        host_path(spec, hako_shared::contract::INPUT_DIR)
    }

    enum Taken {
        Close,
        Texts(Vec<String>),
    }

    /// Claims the follow-ups waiting, in name order, as the agent does (read, then unlink;
    /// only ours if the unlink succeeded); `_close` once those before it are taken.
    fn take_follow_ups(dir: &std::path::Path) -> Taken {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.') && !n.ends_with(".tmp"))
            .collect();
        names.sort();
        let mut texts = Vec::new();
        for n in names {
            if n == hako_shared::contract::CLOSE_FILE {
                return if texts.is_empty() {
                    Taken::Close
                } else {
                    Taken::Texts(texts)
                };
            }
            let path = dir.join(&n);
            let Ok(body) = std::fs::read(&path) else {
                continue;
            };
            if std::fs::remove_file(&path).is_err() {
                continue;
            }
            if let Ok(f) = serde_json::from_slice::<hako_shared::contract::FollowUp>(&body) {
                texts.push(f.content);
            }
        }
        Taken::Texts(texts)
    }
}
