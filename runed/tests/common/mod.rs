//! Shared rig for the runner's real-container tests: a temp data dir, a random install id, the
//! `hako-agent` image, and helpers that look at what happened from outside (Docker inspect,
//! host files). Every container a rig's install made is removed when the rig drops.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use bollard::models::ContainerInspectResponse;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
};
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use hako_runner::engine::labels;
use hako_runner::{
    CloseWhen, LiveRun, RunControl, RunEnd, RunEvent, RunReport, RunSpec, Runner, RunnerConfig,
};
use hako_shared::GroupFolder;
use hako_shared::contract::{ContainerInput, Message, Redacted, Secrets};
use hako_shared::ids::{RunId, TurnId};
use hako_shared::runs::GroupSpec;

/// Upper bound on any one run in these tests.
pub const RUN_LIMIT: Duration = Duration::from_secs(90);

/// A random lowercase hex id.
pub fn rand_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    getrandom::fill(&mut b).expect("rng");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The agent image, built once per process.
pub async fn agent_image() -> String {
    hako_deploy::ensure_agent_image()
        .await
        .expect("building the hako-agent image")
}

/// A test's runner over its own data dir and install id.
pub struct Rig {
    /// Holds the data dir (and anything else the test puts beside it).
    pub tmp: tempfile::TempDir,
    /// The runner.
    pub runner: Runner,
    /// A Docker client for looking from outside.
    pub docker: Docker,
    /// The agent image tag.
    pub image: String,
    /// The install id (the `io.hako.install` label).
    pub install: String,
}

impl Rig {
    /// A rig with test defaults (short graces).
    pub async fn new() -> Rig {
        Self::with(|_, _| {}).await
    }

    /// A rig whose config `f` adjusts (given the temp dir, outside the data dir).
    pub async fn with(f: impl FnOnce(&mut RunnerConfig, &Path)) -> Rig {
        let image = agent_image().await;
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut cfg = RunnerConfig::new(tmp.path().join("data"));
        cfg.install_id = format!("t{}", rand_hex(6));
        cfg.default_image = image.clone();
        cfg.run_timeout = Duration::from_secs(60);
        cfg.stop_grace = Duration::from_secs(2);
        cfg.kill_grace = Duration::from_secs(2);
        cfg.docker_timeout = Duration::from_secs(20);
        cfg.home = Some(tmp.path().to_owned());
        f(&mut cfg, tmp.path());
        let install = cfg.install_id.clone();
        let engine = hako_runner::docker::DockerEngine::connect_default().expect("docker client");
        let docker = engine.client().clone();
        let runner = Runner::on_docker(engine, cfg).expect("runner");
        Rig {
            tmp,
            runner,
            docker,
            image,
            install,
        }
    }

    /// The data dir.
    pub fn data(&self) -> PathBuf {
        self.runner.layout().data_dir.clone()
    }

    /// A spec for `folder` whose one user message is `prompt`; closes when idle.
    pub fn spec(&self, folder: &str, prompt: &str) -> RunSpec {
        RunSpec {
            run_id: RunId::new(format!("run-{}", rand_hex(6))).unwrap(),
            turn_id: Some(TurnId::new(format!("turn-{}", rand_hex(4))).unwrap()),
            folder: GroupFolder::new(folder).expect("folder"),
            input: input(prompt),
            group: GroupSpec::default(),
            close: CloseWhen::Idle(Duration::ZERO),
            bind: None,
            brokered: Vec::new(),
        }
    }

    /// Starts a run in the background.
    pub fn start(&self, spec: RunSpec) -> RunUnderTest {
        let (tx, rx) = mpsc::channel(1024);
        let control = RunControl::default();
        let live = LiveRun::new(spec.run_id.clone(), spec.folder.clone());
        let runner = self.runner.clone();
        let (c, l) = (control.clone(), live.clone());
        let task = tokio::spawn({
            let runner = runner.clone();
            async move { runner.run(spec, tx, c, l).await }
        });
        RunUnderTest {
            task,
            events: rx,
            control,
            live,
            runner,
        }
    }

    /// Runs to the end; returns the report and every event.
    pub async fn run(&self, spec: RunSpec) -> (RunReport, Vec<RunEvent>) {
        self.start(spec).end().await
    }

    /// This install's containers (any state).
    pub async fn containers(&self) -> Vec<bollard::models::ContainerSummary> {
        containers_of(&self.docker, &self.install).await
    }

    /// Inspects a container.
    pub async fn inspect(&self, id: &str) -> ContainerInspectResponse {
        self.docker
            .inspect_container(id, None)
            .await
            .expect("inspect")
    }

    /// Whether a container no longer exists.
    pub async fn gone(&self, id: &str) -> bool {
        matches!(
            self.docker.inspect_container(id, None).await,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })
        )
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        // Best effort, also when a test failed: remove everything of this install.
        let install = self.install.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(docker) = hako_runner::docker::DockerEngine::connect_default()
                    .map(|d| d.client().clone())
                else {
                    return;
                };
                for c in containers_of(&docker, &install).await {
                    if let Some(id) = c.id {
                        let opts = RemoveContainerOptionsBuilder::new().force(true).build();
                        let _ = docker.remove_container(&id, Some(opts)).await;
                    }
                }
            });
        })
        .join();
    }
}

/// Every container labelled with `install`.
pub async fn containers_of(
    docker: &Docker,
    install: &str,
) -> Vec<bollard::models::ContainerSummary> {
    let filters = HashMap::from([(
        "label".to_owned(),
        vec![format!("{}={install}", labels::INSTALL)],
    )]);
    let opts = ListContainersOptionsBuilder::new()
        .all(true)
        .filters(&filters)
        .build();
    docker.list_containers(Some(opts)).await.expect("list")
}

/// A run in progress.
pub struct RunUnderTest {
    /// The run task.
    pub task: JoinHandle<RunEnd>,
    /// Its events.
    pub events: mpsc::Receiver<RunEvent>,
    /// Kill / detach.
    pub control: RunControl,
    /// Steering state.
    pub live: Arc<LiveRun>,
    /// The runner, to remove the run's containers once it is over.
    pub runner: Runner,
}

impl RunUnderTest {
    /// The next event, within the run limit.
    pub async fn next(&mut self) -> Option<RunEvent> {
        tokio::time::timeout(RUN_LIMIT, self.events.recv())
            .await
            .expect("an event within the run limit")
    }

    /// Waits for the `Started` event; returns the container id.
    pub async fn started(&mut self) -> String {
        match self.next().await {
            Some(RunEvent::Started { container_id, .. }) => container_id,
            other => panic!("expected Started, got {other:?}"),
        }
    }

    /// Waits for the next block event; returns (index, result).
    pub async fn block(&mut self) -> (usize, String) {
        loop {
            match self.next().await {
                Some(RunEvent::Block { index, block }) => {
                    return (index, block.result.unwrap_or_default());
                }
                Some(RunEvent::Started { .. }) => continue,
                None => panic!("run ended before the expected block"),
            }
        }
    }

    /// Waits for the end, removes the containers (as runed does once the end is recorded);
    /// returns the report and the remaining events.
    pub async fn end(mut self) -> (RunReport, Vec<RunEvent>) {
        let end = tokio::time::timeout(RUN_LIMIT, &mut self.task)
            .await
            .expect("run ends within the limit")
            .expect("run task");
        let mut events = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            events.push(e);
        }
        let report = end.report().expect("finished, not detached");
        let leftovers = self.runner.remove_containers(&report).await;
        assert!(leftovers.is_empty(), "{leftovers:?}");
        (report, events)
    }
}

/// The input of a turn whose one user message is `prompt`.
pub fn input(prompt: &str) -> ContainerInput {
    ContainerInput {
        messages: vec![Message {
            role: "user".into(),
            content: prompt.into(),
            extra: Default::default(),
        }],
        ..Default::default()
    }
}

/// Input carrying a token and secrets.
pub fn input_with_secrets(prompt: &str, token: &str, secrets: &[(&str, &str)]) -> ContainerInput {
    let mut i = input(prompt);
    i.token = Redacted(token.into());
    i.secrets = Secrets(
        secrets
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    i
}

/// Block results of a report.
pub fn results(r: &RunReport) -> Vec<String> {
    r.blocks
        .iter()
        .map(|b| b.result.clone().unwrap_or_default())
        .collect()
}

/// The reply line of a run that starts with `prefix`.
pub fn line<'a>(r: &'a RunReport, prefix: &str) -> &'a str {
    r.blocks
        .iter()
        .filter_map(|b| b.result.as_deref())
        .flat_map(str::lines)
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no reply line starting {prefix:?} in {:?}", r.blocks))
}

/// Builds (once per tag) a tiny image `FROM base` with `dockerfile_tail` appended.
pub async fn derived_image(docker: &Docker, base: &str, name: &str, tail: &str) -> String {
    let tag = format!(
        "hako-test-{name}:{}",
        base.rsplit(':').next().unwrap_or("x")
    );
    if docker.inspect_image(&tag).await.is_ok() {
        return tag;
    }
    let df = format!("FROM {base}\n{tail}\n");
    let mut ar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(df.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    ar.append_data(&mut h, "Dockerfile", df.as_bytes())
        .expect("tar");
    let ctx = ar.into_inner().expect("tar");
    let opts = BuildImageOptionsBuilder::new()
        .dockerfile("Dockerfile")
        .t(&tag)
        .rm(true)
        .build();
    let mut s = docker.build_image(opts, None, Some(bollard::body_full(ctx.into())));
    while let Some(item) = s.next().await {
        let info = item.expect("build");
        if let Some(e) = info.error_detail.and_then(|d| d.message) {
            panic!("building {tag}: {e}");
        }
    }
    tag
}

/// What a search of files read and found.
#[derive(Debug, Default)]
pub struct Search {
    /// Every regular file read, whole.
    pub read: Vec<PathBuf>,
    /// How many bytes that was.
    pub bytes: u64,
    /// The files whose bytes contain the needle.
    pub hits: Vec<PathBuf>,
}

/// Reads every regular file under `dir` (no symlink followed: a link is not a file of the
/// tree) and reports those whose bytes contain `needle`, with what was read. A directory or
/// file that cannot be read fails the test: a search that skipped it could pass having
/// looked at nothing.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Search {
    assert!(!needle.is_empty(), "an empty needle is in every file");
    let mut found = Search::default();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display()));
        for e in rd {
            let e = e.unwrap_or_else(|e| panic!("listing {}: {e}", d.display()));
            let path = e.path();
            let ft = e
                .file_type()
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            if ft.is_dir() {
                stack.push(path);
            } else if ft.is_file() {
                let bytes = std::fs::read(&path)
                    .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
                found.bytes += bytes.len() as u64;
                if memchr::memmem::find(&bytes, needle).is_some() {
                    found.hits.push(path.clone());
                }
                found.read.push(path);
            }
        }
    }
    found
}

/// A field of `/proc/self/status`, in KiB.
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// The process's resident memory now (`VmRSS`), in KiB.
pub fn vm_rss_kib() -> u64 {
    status_kib("VmRSS:")
}

/// Memory growth of this process around an operation: the resident set when it starts, and
/// the highest it reached since. The peak is the kernel's high-water mark reset to the
/// current RSS at the start (`/proc/self/clear_refs`, Linux 4.0), so growth before the
/// operation (other tests, the image build, the rig) cannot hide growth during it. Where the
/// reset is not allowed, a thread samples `VmRSS` every millisecond instead.
pub struct MemWatch {
    start: u64,
    sampler: Option<(
        Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<u64>,
    )>,
}

impl MemWatch {
    /// Starts watching.
    pub fn start() -> MemWatch {
        let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        let start = vm_rss_kib();
        let sampler = (!reset).then(|| {
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let s = stop.clone();
            let h = std::thread::spawn(move || {
                let mut peak = 0;
                while !s.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(vm_rss_kib());
                    std::thread::sleep(Duration::from_millis(1));
                }
                peak
            });
            (stop, h)
        });
        MemWatch { start, sampler }
    }

    /// (growth of the peak over the start, growth of the current RSS over the start), KiB.
    pub fn growth(self) -> (u64, u64) {
        let now = vm_rss_kib();
        let peak = match self.sampler {
            Some((stop, h)) => {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                h.join().expect("sampler").max(now)
            }
            None => status_kib("VmHWM:"),
        };
        (
            peak.saturating_sub(self.start),
            now.saturating_sub(self.start),
        )
    }
}

/// The hostile agent of `tests/fixtures/hostile.rs`, compiled with rustc into a static
/// binary and put alone into a `FROM scratch` image tagged by the source's hash (built once;
/// later calls and processes find it).
pub async fn hostile_image(docker: &Docker) -> String {
    static TAG: tokio::sync::OnceCell<String> = tokio::sync::OnceCell::const_new();
    TAG.get_or_init(|| async {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hostile.rs");
        let text = std::fs::read(&src).expect("fixture source");
        let hash = {
            use sha2::Digest;
            let d = sha2::Sha256::digest(&text);
            d.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
        };
        let tag = format!("hako-test-hostile:{hash}");
        if docker.inspect_image(&tag).await.is_ok() {
            return tag;
        }
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hostile-{hash}"));
        if !out.exists() {
            // Test processes may compile at once: each in a directory of its own (rustc
            // names its intermediate files after the crate, not the output).
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
            let tmp = dir.path().join("hostile");
            let status = std::process::Command::new(std::env::var("RUSTC").unwrap_or("rustc".into()))
                .args(["--edition", "2024", "-O", "-C", "target-feature=+crt-static"])
                .args(["--target", "x86_64-unknown-linux-gnu", "-o"])
                .arg(&tmp)
                .arg(&src)
                .status()
                .expect("running rustc");
            assert!(status.success(), "compiling the hostile fixture");
            std::fs::rename(&tmp, &out).expect("rename");
        }
        let bin = std::fs::read(&out).expect("binary");
        let df = "FROM scratch\nCOPY hostile /hostile\nUSER 1000:1000\nWORKDIR /workspace\nENTRYPOINT [\"/hostile\"]\n";
        let mut ar = tar::Builder::new(Vec::new());
        for (name, data, mode) in [("Dockerfile", df.as_bytes(), 0o644), ("hostile", &bin[..], 0o755)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(mode);
            h.set_cksum();
            ar.append_data(&mut h, name, data).expect("tar");
        }
        let ctx = ar.into_inner().expect("tar");
        let opts = BuildImageOptionsBuilder::new()
            .dockerfile("Dockerfile")
            .t(&tag)
            .rm(true)
            .build();
        let mut s = docker.build_image(opts, None, Some(bollard::body_full(ctx.into())));
        while let Some(item) = s.next().await {
            let info = item.expect("build");
            if let Some(e) = info.error_detail.and_then(|d| d.message) {
                panic!("building {tag}: {e}");
            }
        }
        tag
    })
    .await
    .clone()
}
