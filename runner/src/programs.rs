//! Programs served from the host's page cache. An agent image names, in its label
//! [`LABEL_PRELOAD`], the large files its boxes run (Codex's and Claude Code's binaries). The
//! runner copies each out of the image once per image id, into `DATA_DIR/programs/<image>/`,
//! and binds it read-only over the same path in every later box of that image.
//!
//! Why: on a storage driver whose page cache belongs to each container's own mount
//! (fuse-overlayfs), every new box read the program again through FUSE, about 100 ms of each
//! cold Codex turn; a bind mount is read from the host's page cache, which every box shares.
//! The bytes are the image's own and the mount is read-only. Until a copy is there (it is
//! made in the background, at the first box of an image), or where it cannot be made, boxes
//! read the program from their image as before: a copy changes speed, never behaviour.
//!
//! Copies are written whole (synced, then renamed into place), so a file there is complete
//! and another process (a second `hako chat` on the same data root) may replace it with the
//! same bytes at any time; a copy whose image is gone is removed when the next copy is made.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;
use std::sync::Mutex;

use futures_util::StreamExt as _;

use super::engine::{ContainerSpec, Engine, EngineError, Limits};
use super::mounts::MountEntry;
use super::{Runner, RunnerConfig};

/// Image label: the absolute paths, comma-separated, of the regular files to serve from the
/// host (at most [`MAX_PATHS`]).
pub const LABEL_PRELOAD: &str = "io.hako.preload";
/// Label of the short-lived box a copy is taken from (created, never started, removed): the
/// install it copies for. Not `io.hako.install`: the box is none of the install's runs, and
/// nothing that counts or sweeps those must see it. One name per install and image, so a
/// box a crash left is removed by the next copy.
pub const LABEL_COPY_FOR: &str = "io.hako.program-copy-for";
/// The directory under the data root.
pub const DIR: &str = "programs";
const MAX_PATHS: usize = 4;
/// The largest file copied (Claude Code's binary is about 230 MB).
const MAX_SIZE: u64 = 1 << 30;

/// The copies, by image id, and the boxes copies are being taken from.
#[derive(Default)]
pub(super) struct Programs {
    copies: Mutex<HashMap<String, Copy>>,
    /// The names of the copy boxes that exist now (or are being created).
    boxes: Mutex<Boxes>,
}

#[derive(Default)]
struct Boxes {
    names: Vec<String>,
    /// The runner drained: no copy starts after that, and a box created meanwhile removes
    /// itself.
    drained: bool,
}

#[derive(Clone)]
enum Copy {
    /// Being made.
    Making,
    /// Made: the mounts every box of the image gets.
    Ready(Vec<MountEntry>),
    /// Could not be made (logged): the image's own files serve.
    Failed,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Programs {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Copy>> {
        lock(&self.copies)
    }

    /// Registers a copy box about to be created; `false` once the runner drained.
    pub(super) fn enter(&self, name: &str) -> bool {
        let mut b = lock(&self.boxes);
        if !b.drained {
            b.names.push(name.to_owned());
        }
        !b.drained
    }

    /// The copy box is removed: `false` when the runner drained meanwhile (the caller
    /// removes it again, in case it was created after the drain looked).
    fn leave(&self, name: &str) -> bool {
        let mut b = lock(&self.boxes);
        b.names.retain(|n| n != name);
        !b.drained
    }

    /// No copy starts from now on; the names of the copy boxes that may exist.
    fn drain(&self) -> Vec<String> {
        let mut b = lock(&self.boxes);
        b.drained = true;
        std::mem::take(&mut b.names)
    }
}

impl Runner {
    /// At shutdown: removes the boxes copies are being taken from (their copies fail, and are
    /// made again by the next process); none is created after this.
    pub(super) async fn drain_copies(&self) {
        let names = self.programs.drain();
        let t = self.cfg.docker_timeout;
        futures_util::future::join_all(
            names
                .iter()
                .map(|n| self.engine.remove(n, Some(std::time::Duration::ZERO), t)),
        )
        .await;
    }
}

impl Runner {
    /// Removes the copy boxes of this install that no copy of this process is taking (a
    /// killed process's, whose image may since have changed, so no later copy of the same
    /// name would meet them). Failures are logged: the next sweep tries again.
    pub(super) async fn remove_stale_copy_boxes(&self) {
        let t = self.cfg.docker_timeout;
        let listed = match self
            .engine
            .list(LABEL_COPY_FOR, Some(&self.cfg.install_id), t)
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "listing program copy boxes failed");
                return;
            }
        };
        let stale: Vec<_> = {
            let b = lock(&self.programs.boxes);
            listed
                .into_iter()
                .filter(|c| !b.names.contains(&c.name))
                .collect()
        };
        for c in stale {
            tracing::info!(container = %c.id, name = %c.name, "removing a stale program copy box");
            if let Err(e) = self
                .engine
                .remove(&c.id, Some(std::time::Duration::ZERO), t)
                .await
            {
                tracing::warn!(container = %c.id, error = %e, "removing a program copy box failed");
            }
        }
    }
}

/// Whether `path` is at or under the target of one of `run`'s mounts.
fn covered(run: &[MountEntry], path: &str) -> bool {
    run.iter().any(|m| {
        path.strip_prefix(m.target.trim_end_matches('/'))
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    })
}

/// The paths a label names: absolute, normal (no `.`, `..` or empty part), a few.
fn parse(label: &str) -> Result<Vec<String>, String> {
    let paths: Vec<String> = label
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    if paths.len() > MAX_PATHS {
        return Err(format!("more than {MAX_PATHS} paths"));
    }
    for p in &paths {
        let normal = p.starts_with('/')
            && p[1..]
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !normal {
            return Err(format!("{p:?} is not a normal absolute path"));
        }
    }
    Ok(paths)
}

impl Runner {
    /// The read-only mounts that serve image `image`'s programs from the host, once copied
    /// (the first box of an image starts the copy and gets none), but for a path at or under
    /// one of the run's own mounts `run`: an image never covers what hako mounts.
    pub(super) async fn program_mounts(&self, image: &str, run: &[MountEntry]) -> Vec<MountEntry> {
        let mut mounts = self.copied_programs(image).await;
        mounts.retain(|m| !covered(run, &m.target));
        mounts
    }

    async fn copied_programs(&self, image: &str) -> Vec<MountEntry> {
        if !self.cfg.program_copies {
            return Vec::new();
        }
        let Ok(info) = self.engine.image(image, self.cfg.docker_timeout).await else {
            return Vec::new();
        };
        let Some(label) = info.labels.get(LABEL_PRELOAD) else {
            return Vec::new();
        };
        let key: String = info
            .id
            .trim_start_matches("sha256:")
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(64)
            .collect();
        if key.is_empty() {
            return Vec::new();
        }
        {
            let mut copies = self.programs.lock();
            match copies.get(&key) {
                Some(Copy::Ready(m)) => return m.clone(),
                Some(Copy::Making | Copy::Failed) => return Vec::new(),
                None => {
                    copies.insert(key.clone(), Copy::Making);
                }
            }
        }
        if let Some(m) = already_copied(&self.cfg, &key, label) {
            self.programs.lock().insert(key, Copy::Ready(m.clone()));
            return m;
        }
        let paths = match parse(label) {
            Ok(p) => p,
            Err(why) => {
                tracing::warn!(image, label = LABEL_PRELOAD, error = %why, "the image's program list is refused");
                self.programs.lock().insert(key, Copy::Failed);
                return Vec::new();
            }
        };
        let (engine, cfg, programs) =
            (self.engine.clone(), self.cfg.clone(), self.programs.clone());
        let id = info.id.clone();
        tokio::spawn(async move {
            let done = match copy(engine.as_ref(), &cfg, &programs, &id, &key, &paths).await {
                Ok(m) => {
                    tracing::info!(image = %id, files = m.len(), "programs served from the host");
                    Copy::Ready(m)
                }
                Err(e) => {
                    tracing::warn!(image = %id, error = %e, "copying the image's programs failed; its boxes read them from the image");
                    Copy::Failed
                }
            };
            programs.lock().insert(key, done);
        });
        Vec::new()
    }
}

/// Where the copies are: `DATA_DIR/programs` (a mount from under it is a copy).
pub(super) fn root(cfg: &RunnerConfig) -> std::path::PathBuf {
    cfg.layout.data_dir.join(DIR)
}

/// The copies an earlier process (or another one on this data root) made of image `key`'s
/// programs, when every one is there: whole by construction (synced, then renamed).
fn already_copied(cfg: &RunnerConfig, key: &str, label: &str) -> Option<Vec<MountEntry>> {
    let paths = parse(label).ok()?;
    let dir = root(cfg).join(key);
    paths
        .into_iter()
        .enumerate()
        .map(|(i, target)| {
            let source = dir.join(i.to_string());
            let meta = std::fs::symlink_metadata(&source).ok()?;
            meta.is_file().then_some(MountEntry {
                source,
                target,
                readonly: true,
            })
        })
        .collect()
}

/// Copies `paths` out of image `id` into `programs/<key>/` through a box that is created,
/// never started, and removed.
async fn copy(
    engine: &dyn Engine,
    cfg: &RunnerConfig,
    programs: &Programs,
    id: &str,
    key: &str,
    paths: &[String],
) -> Result<Vec<MountEntry>, EngineError> {
    let t = cfg.docker_timeout;
    let dir = root(cfg).join(key);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(|e| EngineError::api(format!("{}: {e}", dir.display())))?;
    let spec = ContainerSpec {
        name: format!(
            "hako-{}-program-{}",
            cfg.install_id,
            &key[..key.len().min(12)]
        ),
        image: id.to_owned(),
        user: format!("{}:{}", cfg.agent_user.uid, cfg.agent_user.gid),
        env: Vec::new(),
        cmd: None,
        mounts: Vec::new(),
        network: "none".into(),
        limits: Limits {
            memory: 64 << 20,
            cpus: 0.1,
            pids: 16,
        },
        labels: HashMap::from([(LABEL_COPY_FOR.to_owned(), cfg.install_id.clone())]),
        stdin: false,
        runtime: None,
        kind: crate::engine::BoxKind::Agent,
    };
    if !programs.enter(&spec.name) {
        return Err(EngineError::api("the runner is shutting down"));
    }
    let created = match engine.create(&spec, t).await {
        // A box of the same name: left by a crash (or another process's copy, which then
        // fails and is made again at its next box).
        Err(e) if e.is_status(409) => {
            match engine
                .remove(&spec.name, Some(std::time::Duration::ZERO), t)
                .await
            {
                Ok(()) => engine.create(&spec, t).await,
                Err(e) => Err(e),
            }
        }
        r => r,
    };
    let boxed = match created {
        Ok(b) => b,
        Err(e) => {
            programs.leave(&spec.name);
            return Err(e);
        }
    };
    let mut mounts = Vec::new();
    let mut result = Ok(());
    for (i, path) in paths.iter().enumerate() {
        let file = dir.join(i.to_string());
        match extract(engine, &boxed, path, &file).await {
            Ok(()) => mounts.push(MountEntry {
                source: file,
                target: path.clone(),
                readonly: true,
            }),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if let Err(e) = engine
        .remove(&boxed, Some(std::time::Duration::ZERO), t)
        .await
    {
        tracing::warn!(container = %boxed, error = %e, "removing the program copy's box failed");
    }
    if !programs.leave(&spec.name) {
        // Drained meanwhile: whatever the drain found, this box goes (again).
        let _ = engine
            .remove(&boxed, Some(std::time::Duration::ZERO), t)
            .await;
    }
    result?;
    forget_gone(engine, cfg, key).await;
    Ok(mounts)
}

/// Removes the copies of images the engine no longer has (a rebuilt image's old id).
async fn forget_gone(engine: &dyn Engine, cfg: &RunnerConfig, keep: &str) {
    let root = root(cfg);
    let Ok(dirs) = std::fs::read_dir(&root) else {
        return;
    };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().into_owned();
        if name == keep || !name.bytes().all(|b| b.is_ascii_hexdigit()) {
            continue;
        }
        if let Err(EngineError::ImageMissing(_)) = engine
            .image(&format!("sha256:{name}"), cfg.docker_timeout)
            .await
        {
            let _ = std::fs::remove_dir_all(d.path());
        }
    }
}

/// Writes the one regular file of the tar archive of `path` to `to` (0755, written whole,
/// then renamed into place).
async fn extract(
    engine: &dyn Engine,
    boxed: &str,
    path: &str,
    to: &Path,
) -> Result<(), EngineError> {
    let io = |e: std::io::Error| EngineError::api(format!("{}: {e}", to.display()));
    // Per process: two runners on one data root never write the same partial file.
    let tmp = to.with_extension(format!("part.{}", std::process::id()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&tmp)
        .map_err(io)?;
    let mut tar = Untar::default();
    let mut stream = engine.archive(boxed, path);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if tar.feed(&chunk, &mut out).map_err(io)? {
            break;
        }
    }
    if !tar.done() {
        return Err(EngineError::api(format!(
            "{path}: the image's archive holds no whole regular file"
        )));
    }
    // Synced before it is renamed into place: a file there is whole, whoever finds it.
    out.sync_all().map_err(io)?;
    drop(out);
    std::fs::rename(&tmp, to).map_err(io)
}

/// A tar reader for one regular file, fed as the archive streams: extension headers (pax,
/// GNU long names) are skipped; a link, directory or device is refused.
#[derive(Default)]
struct Untar {
    /// Bytes of a header (or of what is skipped) not complete yet.
    pending: Vec<u8>,
    state: TarState,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum TarState {
    /// Reading a 512-byte header.
    #[default]
    Header,
    /// Skipping this many bytes (an extension header's body, padded).
    Skip(u64),
    /// Writing this many more bytes of the file.
    File(u64),
    /// The file is written.
    Done,
    /// Not one regular file.
    Refused,
}

impl Untar {
    fn done(&self) -> bool {
        self.state == TarState::Done
    }

    /// Takes the next bytes; `Ok(true)` once the file is whole (or refused).
    fn feed(&mut self, mut data: &[u8], out: &mut impl std::io::Write) -> std::io::Result<bool> {
        while !data.is_empty() {
            match self.state {
                TarState::Done | TarState::Refused => return Ok(true),
                TarState::Skip(n) => {
                    let k = (n as usize).min(data.len());
                    data = &data[k..];
                    let left = n - k as u64;
                    self.state = if left == 0 {
                        TarState::Header
                    } else {
                        TarState::Skip(left)
                    };
                }
                TarState::File(n) => {
                    let k = (n as usize).min(data.len());
                    out.write_all(&data[..k])?;
                    data = &data[k..];
                    let left = n - k as u64;
                    if left == 0 {
                        self.state = TarState::Done;
                    } else {
                        self.state = TarState::File(left);
                    }
                }
                TarState::Header => {
                    let need = 512 - self.pending.len();
                    let k = need.min(data.len());
                    self.pending.extend_from_slice(&data[..k]);
                    data = &data[k..];
                    if self.pending.len() < 512 {
                        continue;
                    }
                    let h = std::mem::take(&mut self.pending);
                    self.state = header(&h);
                    if self.state == TarState::File(0) {
                        self.state = TarState::Done;
                    }
                }
            }
        }
        Ok(matches!(self.state, TarState::Done | TarState::Refused))
    }
}

/// What a 512-byte tar header leads to.
fn header(h: &[u8]) -> TarState {
    let Some(size) = octal(&h[124..136]) else {
        return TarState::Refused;
    };
    match h[156] {
        // A regular file.
        b'0' | 0 if size <= MAX_SIZE => TarState::File(size),
        // pax and GNU long-name headers: their body, padded to 512, then the real header.
        b'x' | b'g' | b'L' | b'K' => TarState::Skip(size.div_ceil(512) * 512),
        _ => TarState::Refused,
    }
}

/// A tar number field: octal digits, spaces and NULs around them.
fn octal(field: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(field).ok()?;
    let s = s.trim_matches(|c: char| c == '\0' || c == ' ');
    if s.is_empty() {
        return None;
    }
    u64::from_str_radix(s, 8).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tar_header(name: &str, size: u64, kind: u8) -> Vec<u8> {
        let mut h = vec![0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        let sz = format!("{size:011o}\0");
        h[124..136].copy_from_slice(sz.as_bytes());
        h[156] = kind;
        h
    }

    fn archive(parts: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
        let mut a = Vec::new();
        for (h, body) in parts {
            a.extend_from_slice(h);
            a.extend_from_slice(body);
            a.resize(a.len().div_ceil(512) * 512, 0);
        }
        a.extend_from_slice(&[0u8; 1024]);
        a
    }

    #[test]
    fn one_regular_file_is_written_however_the_archive_is_cut() {
        let body: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8).collect();
        let pax = b"30 path=usr/local/bin/codex\n".to_vec();
        let a = archive(&[
            (tar_header("PaxHeaders/codex", pax.len() as u64, b'x'), pax),
            (tar_header("codex", body.len() as u64, b'0'), body.clone()),
        ]);
        for cut in [1, 7, 511, 512, 513, 4096, a.len()] {
            let mut t = Untar::default();
            let mut out = Vec::new();
            for c in a.chunks(cut) {
                if t.feed(c, &mut out).unwrap() {
                    break;
                }
            }
            assert!(t.done(), "cut {cut}");
            assert_eq!(out, body, "cut {cut}");
        }
    }

    #[test]
    fn links_directories_and_garbage_are_refused() {
        for kind in [b'1', b'2', b'5', b'3'] {
            let a = archive(&[(tar_header("codex", 0, kind), Vec::new())]);
            let mut t = Untar::default();
            let mut out = Vec::new();
            t.feed(&a, &mut out).unwrap();
            assert!(!t.done(), "kind {}", kind as char);
            assert!(out.is_empty());
        }
        let mut t = Untar::default();
        t.feed(&[b'z'; 600], &mut Vec::new()).unwrap();
        assert!(!t.done());
    }

    #[test]
    fn a_program_never_covers_what_hako_mounts() {
        let run: Vec<MountEntry> = ["/workspace", "/home/agent/.claude/", "/run/hako/mcp.sock"]
            .into_iter()
            .map(|t| MountEntry {
                source: "/x".into(),
                target: t.into(),
                readonly: false,
            })
            .collect();
        for path in [
            "/workspace",
            "/workspace/bin/tool",
            "/home/agent/.claude/settings.json",
            "/run/hako/mcp.sock",
        ] {
            assert!(covered(&run, path), "{path}");
        }
        for path in ["/usr/local/bin/codex", "/workspaces", "/run/hako/mcp.sock2"] {
            assert!(!covered(&run, path), "{path}");
        }
    }

    #[test]
    fn only_normal_absolute_paths_are_taken() {
        assert_eq!(
            parse("/usr/local/bin/codex, /usr/local/bin/claude").unwrap(),
            ["/usr/local/bin/codex", "/usr/local/bin/claude"]
        );
        for bad in [
            "usr/bin/x",
            "/usr/../etc/shadow",
            "/a//b",
            "/a/./b",
            "/a,/b,/c,/d,/e",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
