//! `hako up` / `hako down`: the compose stack (`deploy/compose.yaml`) as one command.
//!
//! `up` builds the images (skipped by content hash), makes `$HAKO_HOME` (data, authd's
//! database, the keys), writes `compose.env` (paths, ports, uids, image tags: nothing secret),
//! runs the compose tool, waits until every daemon is ready, and (unless `--no-demo`) creates
//! the `demo` group, sends it one message over HTTP and prints the agent's reply. Running it
//! again is safe: the images and keys are kept, compose leaves a running stack as it is.
//!
//! hako's daemons talk to Docker only through the Engine API; this command drives the
//! operator's own compose tool (`docker compose`, else `docker-compose`), as a person would.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use hako_client::routd;
use hako_deploy::progress::Progress;
use hako_deploy::{AGENT, AUTHD, EGRESS, Pipeline, ROUTD, RUNED};
use hako_runner::engine::Engine as _;
use hako_shared::chat::{GroupConfig, NewWebhook, PostMessage};

use crate::daemons::{Daemons, Endpoints};

/// The daemons that get a service key, and who uses it.
const KEYED: &[&str] = &["runed", "routd", "operator", "channel"];
/// How long `up` waits for the stack to be ready.
const READY_WAIT: Duration = Duration::from_secs(180);
/// How long the demo waits for the agent's reply.
const REPLY_WAIT: Duration = Duration::from_secs(120);

/// Where a stack lives and how it is reached.
#[derive(Debug, Clone, clap::Args)]
pub struct StackArgs {
    /// The stack's home: data, authd's database, keys (default `~/.local/share/hako`).
    #[arg(long, env = "HAKO_HOME")]
    pub home: Option<PathBuf>,
    /// The compose project name (and runed's install id).
    #[arg(long, env = "HAKO_PROJECT", default_value = "hako")]
    pub project: String,
    /// routd's port on the host.
    #[arg(long, env = "HAKO_ROUTD_PORT", default_value_t = 8183)]
    pub routd_port: u16,
    /// authd's port on the host (loopback only).
    #[arg(long, env = "HAKO_AUTHD_PORT", default_value_t = 8181)]
    pub authd_port: u16,
    /// runed's port on the host (loopback only).
    #[arg(long, env = "HAKO_RUNED_PORT", default_value_t = 8182)]
    pub runed_port: u16,
    /// The host address routd's API is published on.
    #[arg(long, env = "HAKO_BIND", default_value = "127.0.0.1")]
    pub bind: String,
}

/// Arguments of `hako up`.
#[derive(Debug, clap::Args)]
pub struct UpArgs {
    #[command(flatten)]
    pub stack: StackArgs,
    /// Do not create the demo group nor send it a message.
    #[arg(long)]
    pub no_demo: bool,
    /// Also build the Claude Code image (hako-claude), for groups with `"agent": "claude"`:
    /// about a minute and 380 MB the first time.
    #[arg(long)]
    pub with_claude: bool,
    /// Also build the Codex image (hako-codex), for groups with `"agent": "codex"`: about a
    /// minute and 270 MB the first time.
    #[arg(long)]
    pub with_codex: bool,
    #[command(flatten)]
    pub telegram: TelegramArgs,
}

/// The Telegram channel adapter of `hako up` (specs/channels.md).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TelegramArgs {
    /// Put hako on Telegram: a file holding the bot token from @BotFather (copied into the
    /// stack's secrets, 0600; never printed).
    #[arg(long, value_name = "FILE")]
    pub telegram_token_file: Option<PathBuf>,
    /// A Telegram chat id the bot answers (repeatable; others get one polite refusal).
    #[arg(long = "telegram-chat", value_name = "ID", allow_hyphen_values = true)]
    pub telegram_chats: Vec<i64>,
}

/// Arguments of `hako down`.
#[derive(Debug, clap::Args)]
pub struct DownArgs {
    #[command(flatten)]
    pub stack: StackArgs,
    /// Also remove the data, the keys and the agents' folders (everything under the home).
    #[arg(long)]
    pub purge: bool,
}

impl StackArgs {
    /// The home directory.
    pub fn home(&self) -> anyhow::Result<PathBuf> {
        if let Some(h) = &self.home {
            return Ok(std::path::absolute(h)?);
        }
        let base = std::env::var_os("XDG_DATA_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
            .context("neither HAKO_HOME nor HOME is set: pass --home")?;
        Ok(base.join("hako"))
    }

    /// Where the daemons answer on this host.
    pub fn endpoints(&self) -> anyhow::Result<Endpoints> {
        let host = if self.bind == "0.0.0.0" {
            "127.0.0.1"
        } else {
            &self.bind
        };
        Ok(Endpoints {
            authd: format!("http://127.0.0.1:{}", self.authd_port),
            runed: format!("http://127.0.0.1:{}", self.runed_port),
            routd: format!("http://{host}:{}", self.routd_port),
            operator_key: self.home()?.join("secrets/operator.key"),
        })
    }
}

/// The compose tool: `docker compose` (v2) if it answers, else `docker-compose` (v1).
fn compose_tool() -> anyhow::Result<Vec<String>> {
    let works = |cmd: &[&str]| {
        std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .arg("version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works(&["docker", "compose"]) {
        Ok(vec!["docker".into(), "compose".into()])
    } else if works(&["docker-compose"]) {
        Ok(vec!["docker-compose".into()])
    } else {
        bail!(
            "neither `docker compose` nor `docker-compose` works here: install Docker Compose \
             (Debian: apt-get install docker-compose)"
        )
    }
}

/// The compose command line for this stack, up to the subcommand.
pub fn compose_command(s: &StackArgs) -> anyhow::Result<Vec<String>> {
    let home = s.home()?;
    let file = hako_deploy::workspace_root().join("deploy/compose.yaml");
    let mut cmd = compose_tool()?;
    cmd.extend([
        "-p".into(),
        s.project.clone(),
        "--env-file".into(),
        home.join("compose.env").display().to_string(),
        "-f".into(),
        file.display().to_string(),
    ]);
    // The adapter's service is in a profile: `up`, `stop` and `down` name it when this stack
    // has it.
    let env = std::fs::read_to_string(home.join("compose.env")).unwrap_or_default();
    if env.lines().any(|l| l == "HAKO_TELEGRAM=1") {
        cmd.extend(["--profile".into(), "telegram".into()]);
    }
    Ok(cmd)
}

fn shell_words(cmd: &[String]) -> String {
    cmd.iter()
        .map(|w| {
            if w.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@".contains(&b))
            {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn run_compose(cmd: &[String], args: &[&str]) -> anyhow::Result<()> {
    let status = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .args(args)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("cannot run {}", cmd[0]))?;
    if !status.success() {
        bail!(
            "`{} {}` failed ({status}); see its output above",
            shell_words(cmd),
            args.join(" ")
        );
    }
    Ok(())
}

fn mkdir(path: &Path, mode: u32) -> anyhow::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set the mode of {}", path.display()))
}

/// Writes `data` to `path` with mode 0600, atomically (a temp file, then rename).
fn write_secret(path: &Path, data: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(data.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}

fn new_key() -> anyhow::Result<String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| anyhow::anyhow!("no randomness for a key: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// The service keys: made once (32 random bytes each, files 0600 in a 0700 directory, never
/// printed), then reused. A key file that is empty, or that disagrees with authd's list,
/// stops `up` with what to do.
pub fn ensure_keys(secrets: &Path) -> anyhow::Result<bool> {
    mkdir(secrets, 0o700)?;
    mkdir(&secrets.join("providers"), 0o700)?;
    let all = secrets.join("authd-service-keys");
    let restart = "delete the directory to make new keys (the daemons then get new tokens)";
    if !all.exists() {
        let mut pairs = Vec::new();
        for name in KEYED {
            let k = new_key()?;
            write_secret(&secrets.join(format!("{name}.key")), &k)?;
            pairs.push(format!("{name}={k}"));
        }
        write_secret(&all, &pairs.join(","))?;
        return Ok(true);
    }
    let listed =
        std::fs::read_to_string(&all).with_context(|| format!("cannot read {}", all.display()))?;
    for name in KEYED {
        let path = secrets.join(format!("{name}.key"));
        let key = std::fs::read_to_string(&path)
            .with_context(|| format!("{} is missing: {restart}", path.display()))?;
        let key = key.trim();
        if key.is_empty() {
            bail!("{} is empty: {restart}", path.display());
        }
        if !listed
            .split(',')
            .any(|p| p.trim() == format!("{name}={key}"))
        {
            bail!(
                "{} does not match authd's list in {}: {restart}",
                path.display(),
                all.display()
            );
        }
    }
    Ok(false)
}

/// Copies provider keys from `up`'s environment into the stack's key files (routd reads them
/// there; they never enter a container's environment).
fn provider_keys(secrets: &Path) -> anyhow::Result<Vec<&'static str>> {
    let mut found = Vec::new();
    for (var, file) in [
        ("ANTHROPIC_API_KEY", "anthropic.key"),
        ("OPENAI_API_KEY", "openai.key"),
    ] {
        if let Some(k) = std::env::var(var).ok().filter(|k| !k.trim().is_empty()) {
            write_secret(&secrets.join("providers").join(file), k.trim())?;
            found.push(var);
        }
    }
    Ok(found)
}

/// Builds (or finds) the stack's images; their hashed tags in the order agent, authd, runed,
/// routd, egress.
pub async fn images() -> anyhow::Result<[String; 5]> {
    let docker = hako_deploy::connect_docker()
        .context("cannot reach the Docker daemon (is it running? is DOCKER_HOST right?)")?;
    let pipeline = Pipeline::new(docker);
    let progress = Progress::stderr();
    let mut tags = Vec::new();
    for spec in [AGENT, AUTHD, RUNED, ROUTD, EGRESS] {
        let tag = pipeline
            .ensure_with(&spec, &|step| progress.report(spec.name, step))
            .await
            .with_context(|| format!("building {}", spec.name))?;
        tags.push(tag);
    }
    tags.try_into()
        .map_err(|_| anyhow::anyhow!("five images, five tags"))
}

/// `runsc` when the Docker daemon lists it (gVisor), else `None`.
async fn untrusted_runtime() -> Option<String> {
    let engine = hako_runner::docker::DockerEngine::connect_default().ok()?;
    let names = engine.runtimes(Duration::from_secs(10)).await.ok()?;
    names
        .iter()
        .any(|n| n == "runsc")
        .then(|| "runsc".to_owned())
}

/// Prepares the home and brings the stack up; answers once every daemon is ready.
pub async fn up(s: &StackArgs) -> anyhow::Result<Endpoints> {
    up_with(s, &TelegramArgs::default()).await
}

/// The Telegram adapter's part of the home: the token copied (0600), the webhook's secret
/// made once, its data directory; answers the adapter's image tag.
async fn telegram_home(home: &Path, t: &TelegramArgs, token_file: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(token_file)
        .with_context(|| format!("cannot read the bot token file {}", token_file.display()))?;
    let token = token.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        bail!("{} does not hold one bot token", token_file.display());
    }
    let secrets = home.join("secrets");
    write_secret(&secrets.join("telegram-token"), token)?;
    let secret = secrets.join("telegram-webhook.secret");
    if !secret.exists() {
        write_secret(&secret, &new_key()?)?;
    }
    mkdir(&home.join("telegram"), 0o700)?;
    if t.telegram_chats.is_empty() {
        eprintln!(
            "  telegram: no --telegram-chat given: every chat gets a refusal with a pairing \
             code; let one in with `hako telegram pair CODE`"
        );
    }
    let docker = hako_deploy::connect_docker()
        .context("cannot reach the Docker daemon (is it running? is DOCKER_HOST right?)")?;
    let progress = Progress::stderr();
    let spec = hako_deploy::TELEGRAM;
    Pipeline::new(docker)
        .ensure_with(&spec, &|step| progress.report(spec.name, step))
        .await
        .with_context(|| format!("building {}", spec.name))
}

/// routd's webhook for `tg:` chats to the adapter, made once (the operator's step of the
/// contract).
async fn telegram_webhook(ep: &Endpoints, home: &Path) -> anyhow::Result<()> {
    let d = Daemons::new(ep)?;
    let token = d.operator_token().await?;
    let list = d
        .call(routd::webhooks(), &token)
        .await
        .context("listing routd's webhooks")?;
    if list.webhooks.iter().any(|h| h.prefix == "tg:") {
        return Ok(());
    }
    let secret = std::fs::read_to_string(home.join("secrets/telegram-webhook.secret"))?;
    let hook = NewWebhook {
        prefix: "tg:".into(),
        url: "http://telegram:8190/v1/deliveries".into(),
        secret: secret.trim().to_owned(),
    };
    d.call(routd::add_webhook(&hook), &token)
        .await
        .context("registering routd's webhook for tg: chats")?;
    eprintln!("  telegram: routd delivers tg: chats to the adapter");
    Ok(())
}

/// [`up`], with the Telegram adapter when `t` names a token file.
pub async fn up_with(s: &StackArgs, t: &TelegramArgs) -> anyhow::Result<Endpoints> {
    let home = s.home()?;
    eprintln!("hako up: images (skipped when their content hash exists)");
    let [agent, authd, runed, routd, egress] = images().await?;
    eprintln!("hako up: home {}", home.display());
    // Closed to the host's other accounts: the tenants' files and the live turns' sockets
    // are below (the daemons reach them as root or as this user; containers through their
    // bind mounts).
    mkdir(&home, 0o700)?;
    mkdir(&home.join("data"), 0o700)?;
    mkdir(&home.join("authd"), 0o700)?;
    let secrets = home.join("secrets");
    let made = ensure_keys(&secrets)?;
    eprintln!(
        "  service keys in {} ({}; 0600, never printed)",
        secrets.display(),
        if made { "made now" } else { "kept" }
    );
    let providers = provider_keys(&secrets)?;
    if providers.is_empty() {
        eprintln!(
            "  no model provider key (ANTHROPIC_API_KEY / OPENAI_API_KEY unset): groups run the script agent"
        );
    } else {
        eprintln!(
            "  provider keys for routd's gateway: {}",
            providers.join(", ")
        );
    }
    // gVisor for untrusted groups when the host has it registered with Docker (runsc):
    // their code then meets gVisor's kernel, not the host's.
    let untrusted_runtime = untrusted_runtime().await;
    match &untrusted_runtime {
        Some(r) => eprintln!("  untrusted groups run under gVisor ({r}); main groups under runc"),
        None => eprintln!(
            "  untrusted groups run under runc (the host kernel): register gVisor's runsc with \
             Docker for a stronger box (README, \"A stronger box\")"
        ),
    }
    let telegram = match &t.telegram_token_file {
        Some(f) => Some(telegram_home(&home, t, f).await?),
        None => None,
    };
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let chats: Vec<String> = t.telegram_chats.iter().map(i64::to_string).collect();
    let on = telegram.is_some();
    let telegram_env = [
        ("HAKO_TELEGRAM", if on { "1" } else { "0" }.to_owned()),
        ("HAKO_TELEGRAM_IMAGE", telegram.unwrap_or_default()),
        ("HAKO_TELEGRAM_CHATS", chats.join(",")),
        (
            "HAKO_CHANNEL_CHATS",
            if on { "tg:*" } else { "*" }.to_owned(),
        ),
        (
            "HAKO_WEBHOOK_ALLOW_PRIVATE",
            if on { "1" } else { "0" }.to_owned(),
        ),
    ];
    let env = [
        (
            "HAKO_UNTRUSTED_RUNTIME",
            untrusted_runtime.unwrap_or_default(),
        ),
        ("HAKO_HOME", home.display().to_string()),
        ("HAKO_PROJECT", s.project.clone()),
        ("HAKO_INSTALL_ID", s.project.clone()),
        ("HAKO_UID", uid.to_string()),
        ("HAKO_GID", gid.to_string()),
        ("HAKO_AGENT_IMAGE", agent),
        ("HAKO_AUTHD_IMAGE", authd),
        ("HAKO_RUNED_IMAGE", runed),
        ("HAKO_ROUTD_IMAGE", routd),
        ("HAKO_EGRESS_IMAGE", egress),
        ("HAKO_AUTHD_PORT", s.authd_port.to_string()),
        ("HAKO_RUNED_PORT", s.runed_port.to_string()),
        ("HAKO_ROUTD_PORT", s.routd_port.to_string()),
        ("HAKO_BIND", s.bind.clone()),
    ];
    let text: String = env
        .iter()
        .chain(&telegram_env)
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect();
    std::fs::write(home.join("compose.env"), text).context("cannot write compose.env")?;

    let cmd = compose_command(s)?;
    eprintln!("hako up: {} up -d", shell_words(&cmd));
    run_compose(&cmd, &["up", "-d"])?;

    let ep = s.endpoints()?;
    let daemons = Daemons::new(&ep)?;
    eprint!("hako up: waiting for authd, runed and routd to be ready");
    let started = Instant::now();
    loop {
        let states = daemons.ready_all().await;
        if states.iter().all(|(_, r)| r.is_ok()) {
            eprintln!(" — ready in {:.1}s", started.elapsed().as_secs_f64());
            break;
        }
        if started.elapsed() > READY_WAIT {
            eprintln!();
            let why: Vec<String> = states
                .iter()
                .filter_map(|(d, r)| r.as_ref().err().map(|e| format!("{d}: {e}")))
                .collect();
            bail!(
                "the stack is not ready after {}s: {}\nsee `{} logs`",
                READY_WAIT.as_secs(),
                why.join("; "),
                shell_words(&cmd)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    if on {
        telegram_webhook(&ep, &home).await?;
    }
    Ok(ep)
}

/// Creates the demo group, sends it `text` over HTTP and answers the agent's reply.
pub async fn demo(ep: &Endpoints, text: &str) -> anyhow::Result<String> {
    let d = Daemons::new(ep)?;
    let token = d.operator_token().await?;
    let demo = GroupConfig {
        name: "demo".into(),
        system_prompt: "The demo group of `hako up`.".into(),
        grants: Vec::new(),
        group: Default::default(),
        approvals: Default::default(),
    };
    d.call(routd::put_group("demo", &demo), &token).await?;
    let message = PostMessage {
        id: None,
        chat_jid: "web:demo".into(),
        sender: "hako-up".into(),
        sender_name: None,
        content: text.to_owned(),
        timestamp: None,
        reply_to: None,
    };
    let posted = d.call(routd::post_message(&message), &token).await?;
    let reply = d
        .first_reply("web:demo", posted.seq, &token, REPLY_WAIT)
        .await?;
    Ok(reply.content)
}

/// `hako up`.
pub async fn up_command(args: UpArgs) -> anyhow::Result<()> {
    let agents = [
        (
            args.with_claude,
            hako_deploy::CLAUDE,
            "Claude Code",
            "claude",
        ),
        (args.with_codex, hako_deploy::CODEX, "Codex", "codex"),
    ];
    for (_, spec, program, agent) in agents.into_iter().filter(|a| a.0) {
        eprintln!("hako up: the {program} image (for groups with \"agent\": \"{agent}\")");
        let docker = hako_deploy::connect_docker()
            .context("cannot reach the Docker daemon (is it running? is DOCKER_HOST right?)")?;
        let progress = Progress::stderr();
        Pipeline::new(docker)
            .ensure_with(&spec, &|step| progress.report(spec.name, step))
            .await
            .with_context(|| format!("building {}", spec.name))?;
    }
    let ep = up_with(&args.stack, &args.telegram).await?;
    let cmd = compose_command(&args.stack)?;
    if !args.no_demo {
        let text = "hello, hako";
        eprintln!("hako up: sending {text:?} to the demo group (chat web:demo)");
        let reply = demo(&ep, text).await?;
        println!("demo agent> {reply}");
    }
    let hako = self_command();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "\nhako is up: routd's API at {}.\nNext:\n  \
         {hako} web                                a link that opens the chat page in a browser\n  \
         {hako} send web:demo 'what can you do?'   talk to the demo group's agent\n  \
         {hako} status                             what runs, what waits\n  \
         {hako} down                               stop the stack (or: {} down)",
        ep.routd,
        shell_words(&cmd)
    )?;
    Ok(())
}

/// How the user runs this command again: `hako` when installed, the `cargo run` line when it
/// runs from the workspace's target directory.
fn self_command() -> String {
    match std::env::current_exe() {
        Ok(p) if p.components().any(|c| c.as_os_str() == "target") => {
            "cargo run -q -p hako-cli --bin hako --".into()
        }
        _ => "hako".into(),
    }
}

/// `hako down`.
pub async fn down_command(args: DownArgs) -> anyhow::Result<()> {
    let home = args.stack.home()?;
    if !home.join("compose.env").exists() {
        bail!(
            "no stack at {} (no compose.env): nothing to stop; pass --home if it lives elsewhere",
            home.display()
        );
    }
    down(&args.stack).await?;
    if args.purge {
        std::fs::remove_dir_all(&home)
            .with_context(|| format!("cannot remove {}", home.display()))?;
        eprintln!("hako down: removed {}", home.display());
    }
    Ok(())
}

/// Stops the stack: the daemons first (so runed starts nothing more), then what runed made
/// (agents, sidecars, the egress proxy, which sits on the daemons' network), then the rest.
pub async fn down(s: &StackArgs) -> anyhow::Result<()> {
    let cmd = compose_command(s)?;
    run_compose(&cmd, &["stop"])?;
    let n = remove_agents(&s.project).await?;
    if n > 0 {
        eprintln!("hako down: removed {n} container(s) runed had started");
    }
    run_compose(&cmd, &["down", "--volumes", "--remove-orphans"])
}

/// Removes agent and sidecar containers runed left behind for this install (runed detaches
/// from live runs when it stops; without it nobody would reap them).
pub async fn remove_agents(install: &str) -> anyhow::Result<usize> {
    use hako_runner::engine::{BoxControl, labels};
    const LIMIT: Duration = Duration::from_secs(30);
    let engine = hako_runner::docker::DockerEngine::connect_default()?;
    let mut n = 0;
    for c in engine.list(labels::INSTALL, Some(install), LIMIT).await? {
        if engine.remove(&c.id, None, LIMIT).await.is_ok() {
            n += 1;
        }
    }
    Ok(n)
}
