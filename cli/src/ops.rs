//! The operator's commands over the daemons' HTTP APIs (never their databases): `hako status`
//! and `hako send`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use hako_shared::approvals::{ApprovalList, ApprovalView};
use hako_shared::auth::wire::{MintRequest, MintResponse, RevokeResponse, ServiceTokenResponse};
use hako_shared::chat::{
    Direction, GroupConfig, GroupList, GroupView, MessageKind, MessagePage, MessageState, Posted,
    RouteList, RouteView, TaskList, TaskView, TurnList,
};
use hako_shared::contract::{BlockStatus, OutputBlock};
use hako_shared::runs::LlmSpec;
use hako_shared::runs::{RunList, RunStatus, RunStreamEvent, Trust};
use hako_shared::web::WebSessionView;
use reqwest::Method;
use serde_json::{Value, json};

use crate::daemons::{Daemon, Daemons, encode};
use crate::stack::StackArgs;

/// Arguments shared by the operator commands.
#[derive(Debug, clap::Args)]
pub struct OpsArgs {
    #[command(flatten)]
    pub stack: StackArgs,
    /// authd's URL (default: the stack's, on loopback).
    #[arg(long, env = "HAKO_AUTHD_URL")]
    pub authd_url: Option<String>,
    /// runed's URL (default: the stack's, on loopback).
    #[arg(long, env = "HAKO_RUNED_URL")]
    pub runed_url: Option<String>,
    /// routd's URL (default: the stack's).
    #[arg(long, env = "HAKO_ROUTD_URL")]
    pub routd_url: Option<String>,
    /// The operator's key file (default: the stack's `secrets/operator.key`).
    #[arg(long, env = "HAKO_OPERATOR_KEY_FILE")]
    pub operator_key_file: Option<std::path::PathBuf>,
    /// Print JSON for scripts instead of text for people.
    #[arg(long, global = true)]
    pub json: bool,
}

impl OpsArgs {
    /// Clients of the daemons these arguments point at.
    pub fn daemons(&self) -> anyhow::Result<Daemons> {
        let mut ep = self.stack.endpoints()?;
        if let Some(u) = &self.authd_url {
            ep.authd = u.trim_end_matches('/').to_owned();
        }
        if let Some(u) = &self.runed_url {
            ep.runed = u.trim_end_matches('/').to_owned();
        }
        if let Some(u) = &self.routd_url {
            ep.routd = u.trim_end_matches('/').to_owned();
        }
        if let Some(k) = &self.operator_key_file {
            ep.operator_key = k.clone();
        }
        Daemons::new(&ep)
    }
}

/// Arguments of `hako send`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  hako send web:demo 'hello'\n  hako send tg:1234 'summarise today' --wait 10m --json"
)]
pub struct SendArgs {
    /// The chat (a JID; `web:<folder>` reaches a group directly).
    pub chat: String,
    /// The message.
    pub text: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "5m", value_parser = hako_shared::config::parse_duration)]
    pub wait: Duration,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// `hako send`: posts a message and prints the replies as they arrive (server-sent events),
/// until the turn that answers it is over. Exit code 1 if it failed or nothing came.
pub async fn send(args: SendArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let posted: Posted = d
        .post_message(
            &token,
            &json!({"chat_jid": args.chat, "sender": "operator", "content": args.text}),
        )
        .await?;
    if !posted.routed {
        eprintln!(
            "hako send: no route takes {} yet; the message is kept and answered once one does \
             (`web:<folder>` reaches a group directly)",
            args.chat
        );
        return Ok(false);
    }
    let (seq, id) = (posted.seq, posted.id);
    let deadline = Instant::now() + args.wait;
    let mut after = seq;
    let mut replies = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            anyhow::bail!("no end of the turn within {:?}", args.wait);
        }
        // Replies as they come; every second without one, whether the turn is over.
        match d
            .follow(
                &args.chat,
                after,
                &token,
                left.min(Duration::from_secs(1)),
                |m| m.direction == Direction::Out,
            )
            .await
        {
            Ok(m) => {
                after = m.seq;
                replies += 1;
                if args.ops.json {
                    print_json(&m);
                } else {
                    let who = if m.kind == MessageKind::Notice {
                        "hako"
                    } else {
                        "agent"
                    };
                    println!("{who}> {}", crate::terminal_safe(&m.content));
                }
            }
            Err(e) if e.to_string().starts_with("no answer in") => {
                let state = message_state(&d, &args.chat, seq, &id, &token).await?;
                if state != MessageState::Pending {
                    return Ok(state == MessageState::Answered && replies > 0);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// The state of the inbound message `id` at `seq` (`pending`, `answered`, `failed`).
async fn message_state(
    d: &Daemons,
    chat: &str,
    seq: i64,
    id: &str,
    token: &str,
) -> anyhow::Result<MessageState> {
    let page: MessagePage = d
        .call(
            Daemon::Routd,
            Method::GET,
            &format!(
                "/v1/chats/{}/messages?after={}&limit=1",
                encode(chat),
                seq - 1
            ),
            token,
            None,
        )
        .await?;
    Ok(page
        .messages
        .into_iter()
        .find(|m| m.id == id)
        .map_or(MessageState::Pending, |m| m.state))
}

/// Arguments of `hako status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The Telegram adapter's URL (default: the stack's on loopback, when it has one).
    #[arg(long, env = "HAKO_TELEGRAM_URL")]
    pub telegram_url: Option<String>,
}

/// The channel adapters' health (`GET /health`, specs/channels.md): the Telegram adapter's
/// when the stack has one (or a URL was given); `None` otherwise.
async fn channel_health(args: &StatusArgs) -> Option<Value> {
    let url = telegram_url(&args.ops, args.telegram_url.as_deref())?;
    let got = async {
        reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(5))
            .build()?
            .get(format!("{url}/health"))
            .send()
            .await?
            .error_for_status()?
            .json::<Value>()
            .await
    }
    .await;
    Some(match got {
        Ok(h) => json!({"telegram": h}),
        Err(e) => {
            json!({"telegram": {"status": "unreachable", "error": e.to_string(), "url": url}})
        }
    })
}

/// The Telegram adapter's URL: `explicit`, or the stack's on loopback when it runs one.
pub(crate) fn telegram_url(ops: &OpsArgs, explicit: Option<&str>) -> Option<String> {
    if let Some(u) = explicit {
        return Some(u.trim_end_matches('/').to_owned());
    }
    let home = ops.stack.home().ok()?;
    let env = std::fs::read_to_string(home.join("compose.env")).ok()?;
    if !env.lines().any(|l| l == "HAKO_TELEGRAM=1") {
        return None;
    }
    let port = env
        .lines()
        .find_map(|l| l.strip_prefix("HAKO_TELEGRAM_PORT="))
        .unwrap_or("8190");
    Some(format!("http://127.0.0.1:{port}"))
}

/// A Prometheus sample's value (first series of `name`), from a text exposition.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `hako status`: each daemon's readiness, what runs, what waits and for how long. Exit code
/// 1 when a daemon is not ready.
pub async fn status(args: StatusArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let ready = d.ready_all().await;
    let all_ready = ready.iter().all(|(_, r)| r.is_ok());
    let metrics = match reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()?
        .get(format!("{}/metrics", d.ep.runed))
        .send()
        .await
    {
        Ok(r) => r.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    };
    // Which box untrusted groups get (runed_runtime_info{trust="untrusted",runtime=…}).
    let untrusted_runtime = metrics
        .lines()
        .find(|l| l.starts_with("runed_runtime_info{") && l.contains("trust=\"untrusted\""))
        .and_then(|l| l.split("runtime=\"").nth(1))
        .and_then(|r| r.split('"').next())
        .map(str::to_owned);
    let runed = json!({
        "untrusted_runtime": untrusted_runtime,
        "active_containers": sample(&metrics, "runed_active_containers"),
        "queue_length": sample(&metrics, "runed_queue_length"),
        "oldest_queued_seconds": sample(&metrics, "runed_oldest_queued_seconds"),
    });
    let mut turns = Vec::new();
    let mut turns_error = None;
    let mut approvals = Vec::new();
    // Groups whose boxes still get values as they are (env_allowlist).
    let mut values_in_box: Vec<Value> = Vec::new();
    match d.operator_token().await {
        Ok(token) => {
            if let Ok(list) = d
                .get::<GroupList>(Daemon::Routd, "/v1/groups", &token)
                .await
            {
                values_in_box = list
                    .groups
                    .iter()
                    .filter(|g| !g.values_in_box.is_empty())
                    .map(|g| json!({"folder": g.folder, "names": g.values_in_box}))
                    .collect();
            }
            match d
                .call::<ApprovalList>(
                    Daemon::Routd,
                    Method::GET,
                    "/v1/approvals?limit=100",
                    &token,
                    None,
                )
                .await
            {
                Ok(list) => approvals = list.approvals,
                Err(e) => turns_error = Some(e.to_string()),
            }
            for state in ["running", "starting", "waiting"] {
                match d
                    .call::<TurnList>(
                        Daemon::Routd,
                        Method::GET,
                        &format!("/v1/turns?state={state}&limit=100"),
                        &token,
                        None,
                    )
                    .await
                {
                    Ok(list) => turns.extend(list.turns),
                    Err(e) => turns_error = Some(e.to_string()),
                }
            }
        }
        Err(e) => turns_error = Some(e.to_string()),
    }
    let channels = channel_health(&args).await;
    if args.ops.json {
        let daemons: serde_json::Map<String, Value> = ready
            .iter()
            .map(|(name, r)| {
                (
                    name.name().to_owned(),
                    match r {
                        Ok(()) => json!({"ready": true}),
                        Err(e) => json!({"ready": false, "error": e}),
                    },
                )
            })
            .collect();
        println!(
            "{}",
            json!({"daemons": daemons, "runed": runed, "turns": turns, "turns_error": turns_error, "approvals": approvals, "values_in_box": values_in_box, "channels": channels})
        );
        return Ok(all_ready);
    }
    println!("daemons");
    for (name, r) in &ready {
        match r {
            Ok(()) => println!("  {name:<6} ready"),
            Err(e) => println!("  {name:<6} NOT READY: {e}"),
        }
    }
    let n = |k: &str| runed[k].as_f64().map_or("?".to_owned(), |v| format!("{v}"));
    println!(
        "runed\n  containers live {}   queued {}   oldest queued {}s",
        n("active_containers"),
        n("queue_length"),
        n("oldest_queued_seconds")
    );
    match runed["untrusted_runtime"].as_str() {
        Some("default") => println!("  untrusted groups under Docker's default runtime (runc)"),
        Some(r) => println!("  untrusted groups under {r} (gVisor when runsc); main under runc"),
        None => {}
    }
    if let Some(c) = &channels {
        println!("channels");
        let t = &c["telegram"];
        if t["status"] == "ok" {
            let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
            let poll = t["last_poll_ms"].as_i64().map_or("never".to_owned(), |p| {
                format!("{}s ago", (now - p).max(0) / 1000)
            });
            let n = |k: &str| t[k].as_i64().unwrap_or(0);
            println!(
                "  telegram  last poll {poll}   backlog {}   failed deliveries {}   unconfirmed {}",
                n("backlog"),
                n("failed"),
                n("unconfirmed")
            );
            if let Some(e) = t["last_poll_error"].as_str() {
                println!("    polling: {e}");
            }
            if let Some(e) = t["last_error"].as_str() {
                println!("    last failed delivery: {e}");
            }
        } else {
            println!(
                "  telegram  NOT REACHABLE at {}: {}",
                t["url"].as_str().unwrap_or("?"),
                t["error"].as_str().unwrap_or("?")
            );
        }
    }
    println!("turns");
    if let Some(e) = &turns_error {
        println!("  (cannot list: {e})");
    } else if turns.is_empty() {
        println!("  none live");
    }
    let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
    for t in &turns {
        let age = (now - t.created_at).max(0) / 1000;
        println!(
            "  {:<8} {:<24} folder {:<16} chat {:<20} try {} run {} age {age}s",
            t.state.as_str(),
            t.turn_id,
            t.folder,
            t.chat_jid,
            t.attempt,
            or_dash(t.run_id.as_ref()),
        );
    }
    println!("approvals");
    if approvals.is_empty() && turns_error.is_none() {
        println!("  none waiting");
    }
    for a in &approvals {
        print_approval(a, now);
    }
    if !values_in_box.is_empty() {
        println!(
            "groups handing values to the box (env_allowlist; brokered secrets keep them out: hako secrets)"
        );
        for g in &values_in_box {
            let names: Vec<&str> = g["names"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            println!(
                "  {:<24} {}",
                g["folder"].as_str().unwrap_or("?"),
                names.join(", ")
            );
        }
    }
    Ok(all_ready)
}

/// The most characters of a call's arguments a list line shows; `hako approvals show` prints
/// the whole call.
const LIST_ARGS: usize = 80;

fn print_approval(a: &ApprovalView, now: i64) {
    let age = (now - a.requested_at).max(0) / 1000;
    let args = a.arguments.to_string();
    let n = args.chars().count();
    let shown: String = args.chars().take(LIST_ARGS).collect();
    let more = if n > LIST_ARGS {
        format!(
            "… (cut: `hako approvals show {}` prints all {n} characters)",
            a.id
        )
    } else {
        String::new()
    };
    println!(
        "  {:<16} {:<10} {:<14} folder {:<16} chat {:<20} age {age}s  {}{more}",
        a.id,
        a.state.as_str(),
        a.tool,
        a.folder,
        a.chat_jid,
        crate::terminal_safe(&shown),
    );
}

/// `hako approvals …`.
#[derive(Debug, clap::Args)]
pub struct ApprovalsArgs {
    #[command(subcommand)]
    pub command: ApprovalsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Held tool calls waiting for a person (routd).
#[derive(Debug, clap::Subcommand)]
pub enum ApprovalsCommand {
    /// The requests waiting for a verdict, newest first.
    #[command(after_help = "Examples:\n  hako approvals list\n  hako approvals list --all")]
    List {
        /// Also the decided ones.
        #[arg(long)]
        all: bool,
    },
    /// One request whole: every argument of the call, uncut, as it will run.
    #[command(after_help = "Examples:\n  hako approvals show ap-1a2b3c")]
    Show {
        /// The request's id.
        id: String,
    },
    /// Approve a held call: it runs.
    Approve {
        /// The request's id (`ap-…`, from `hako approvals list` or the chat).
        id: String,
    },
    /// Deny a held call: the agent gets an error.
    Deny {
        /// The request's id.
        id: String,
    },
}

/// `hako approvals`: a verdict someone else gave first is an error (exit 1) naming it.
pub async fn approvals(args: ApprovalsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    let (id, approve) = match args.command {
        ApprovalsCommand::List { all } => {
            let list: ApprovalList = d
                .get(Daemon::Routd, &format!("/v1/approvals?all={all}"), &token)
                .await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
            if list.approvals.is_empty() {
                println!("no approval requests{}", if all { "" } else { " waiting" });
            }
            for a in &list.approvals {
                print_approval(a, now);
            }
            return Ok(true);
        }
        ApprovalsCommand::Show { id } => {
            let a: ApprovalView = d
                .get(
                    Daemon::Routd,
                    &format!("/v1/approvals/{}", encode(&id)),
                    &token,
                )
                .await?;
            if json {
                print_json(&a);
                return Ok(true);
            }
            println!("id        {}", a.id);
            println!("state     {}", a.state.as_str());
            println!(
                "call      {}{}",
                a.tool,
                a.target
                    .as_deref()
                    .map(|t| format!(" on {}", crate::terminal_safe(t)))
                    .unwrap_or_default()
            );
            println!("folder    {}", a.folder);
            println!("chat      {}", crate::terminal_safe(&a.chat_jid));
            if let Some(by) = &a.decided_by {
                println!("decided   by {}", crate::terminal_safe(by));
            }
            println!("arguments (whole, as the call runs):");
            let pretty = serde_json::to_string_pretty(&a.arguments)?;
            println!("{}", crate::terminal_safe(&pretty));
            return Ok(true);
        }
        ApprovalsCommand::Approve { id } => (id, true),
        ApprovalsCommand::Deny { id } => (id, false),
    };
    let a: ApprovalView = d
        .send(
            Daemon::Routd,
            Method::POST,
            &format!("/v1/approvals/{}", encode(&id)),
            &token,
            &json!({ "approve": approve }),
        )
        .await?;
    if json {
        print_json(&a);
    } else {
        println!("{id}: {} ({} {})", a.state.as_str(), a.tool, a.folder);
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    #[test]
    fn group_settings_are_read_as_routd_reads_them() {
        use super::{SetFlags, group_config};
        let none = || SetFlags {
            name: None,
            prompt: None,
            model: None,
            api: None,
            daily_tokens: None,
        };
        let c = group_config("team/dev", None, none()).unwrap();
        assert_eq!(c.name, "team/dev");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("g.json");
        std::fs::write(
            &f,
            r#"{"name": "Dev", "group": {"llm": {"model": "m1", "api": "openai"}}}"#,
        )
        .unwrap();
        let c = group_config(
            "team/dev",
            Some(&f),
            SetFlags {
                daily_tokens: Some(9),
                ..none()
            },
        )
        .unwrap();
        let llm = c.group.llm.unwrap();
        assert_eq!((c.name.as_str(), llm.model.as_str()), ("Dev", "m1"));
        assert_eq!((llm.api.as_str(), llm.daily_tokens), ("openai", Some(9)));
        // A misspelt field is named before any call; so are flags that cannot stand alone.
        std::fs::write(&f, r#"{"grnats": ["*"]}"#).unwrap();
        let e = group_config("x", Some(&f), none()).unwrap_err();
        assert!(format!("{e:#}").contains("grnats"), "{e:#}");
        let e = group_config(
            "x",
            None,
            SetFlags {
                api: Some("openai".into()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("--model"), "{e}");
        let e = group_config(
            "x",
            None,
            SetFlags {
                api: Some("gopher".into()),
                ..none()
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("anthropic or openai"), "{e}");
        std::fs::write(&f, "[1]").unwrap();
        assert!(group_config("x", Some(&f), none()).is_err());
    }

    #[test]
    fn samples() {
        let t = "# HELP x\nrunend_x 9\nrunend 3\nrunend{a=\"b\"} 4\nrunend_y 1\n";
        assert_eq!(super::sample(t, "runend"), Some(3.0));
        assert_eq!(super::sample(t, "runend_y"), Some(1.0));
        assert_eq!(super::sample(t, "nope"), None);
    }
}

// ---------------------------------------------------------------------------------------------
// runs, groups, routes, tokens

/// Prints `v` as JSON (`--json`) or calls `human`.
fn emit<T: serde::Serialize>(json: bool, v: &T, human: impl FnOnce(&T)) {
    if json {
        print_json(v);
    } else {
        human(v);
    }
}

/// `hako runs …`.
#[derive(Debug, clap::Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: RunsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with runs (runed).
#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// Runs, newest first.
    #[command(
        after_help = "Examples:\n  hako runs list\n  hako runs list --folder team --state running --json"
    )]
    List {
        /// Only this folder and those below it.
        #[arg(long)]
        folder: Option<String>,
        /// Only runs in this state (queued, starting, running, exited, error, killed, timed_out).
        #[arg(long)]
        state: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// One run: state, outcome, its output.
    Show {
        /// The run id.
        run: String,
    },
    /// Stop a run (stop, kill, remove its container); a kill is never retried.
    Kill {
        /// The run id.
        run: String,
    },
    /// A run's output blocks; `--follow` streams them until the run ends.
    Logs {
        /// The run id.
        run: String,
        /// Keep printing blocks as they come until the run is over.
        #[arg(long)]
        follow: bool,
    },
}

fn print_block(b: &OutputBlock) {
    match b.status {
        BlockStatus::Ok => println!("{}", b.result.as_deref().unwrap_or("")),
        st => println!("[{}] {}", st.as_str(), b.error.as_deref().unwrap_or("")),
    }
}

/// An optional field as the tables show it.
fn or_dash(v: Option<impl std::fmt::Display>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Prints `v` as one line of JSON.
fn print_json(v: &impl serde::Serialize) {
    match serde_json::to_string(v) {
        Ok(line) => println!("{line}"),
        Err(e) => eprintln!("hako: cannot print as JSON: {e}"),
    }
}

/// `hako runs`.
pub async fn runs(args: RunsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    let get = Method::GET;
    match args.command {
        RunsCommand::List {
            folder,
            state,
            limit,
        } => {
            let mut q = format!("/v1/runs?limit={}", limit.clamp(1, 1000));
            if let Some(f) = folder {
                q.push_str(&format!("&folder={}", encode(&f)));
            }
            if let Some(st) = state {
                q.push_str(&format!("&state={}", encode(&st)));
            }
            let list: RunList = d.call(Daemon::Runed, get, &q, &token, None).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!(
                "{:<24} {:<16} {:<9} {:<9} {:<24} created",
                "run", "folder", "state", "outcome", "turn"
            );
            for r in &list.runs {
                println!(
                    "{:<24} {:<16} {:<9} {:<9} {:<24} {}",
                    r.run_id,
                    r.folder,
                    r.state,
                    or_dash(r.outcome),
                    r.turn_id,
                    r.created_at
                );
            }
        }
        RunsCommand::Show { run } => {
            let path = format!("/v1/runs/{}", encode(&run));
            let r: RunStatus = d.call(Daemon::Runed, get, &path, &token, None).await?;
            if json {
                print_json(&r);
                return Ok(true);
            }
            for (k, v) in [
                ("run_id", r.run_id.to_string()),
                ("folder", r.folder),
                ("turn_id", r.turn_id.into_string()),
                ("state", r.state.to_string()),
                ("outcome", or_dash(r.outcome)),
                ("error", or_dash(r.error)),
                ("exit_code", or_dash(r.exit_code)),
                ("created_at", r.created_at),
                ("started_at", or_dash(r.started_at)),
                ("ended_at", or_dash(r.ended_at)),
            ] {
                println!("{k:<11} {v}");
            }
            println!("output:");
            r.outputs.iter().for_each(print_block);
        }
        RunsCommand::Kill { run } => {
            let path = format!("/v1/runs/{}", encode(&run));
            let r: RunStatus = d
                .call(Daemon::Runed, Method::DELETE, &path, &token, None)
                .await?;
            if json {
                print_json(&r);
            } else {
                println!("{}: {} ({})", r.run_id, r.state, or_dash(r.outcome));
            }
        }
        RunsCommand::Logs { run, follow } => {
            if !follow {
                let path = format!("/v1/runs/{}", encode(&run));
                let r: RunStatus = d.call(Daemon::Runed, get, &path, &token, None).await?;
                for b in &r.outputs {
                    if json {
                        print_json(b);
                    } else {
                        print_block(b);
                    }
                }
                return Ok(true);
            }
            let ok = d
                .run_events(&run, &token, |ev| match ev {
                    _ if json => print_json(ev),
                    RunStreamEvent::Output { block, .. } => block.iter().for_each(print_block),
                    RunStreamEvent::State { state, .. } => eprintln!("({state})"),
                })
                .await?;
            return Ok(ok);
        }
    }
    Ok(true)
}

/// `hako groups …`.
#[derive(Debug, clap::Args)]
pub struct GroupsArgs {
    #[command(subcommand)]
    pub command: GroupsCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with groups (routd).
#[derive(Debug, clap::Subcommand)]
pub enum GroupsCommand {
    /// Every group.
    List,
    /// One group's settings.
    Show {
        /// The folder.
        folder: String,
    },
    /// Create or replace a group; settings from a JSON file (the body of
    /// `PUT /v1/groups/{folder}`), flags on top. routd checks them and names what is wrong.
    #[command(
        after_help = "Examples:\n  hako groups set team/dev --name 'Dev team'\n  \
        hako groups set team/dev --file team-dev.json\n  \
        hako groups set team/dev --model claude-sonnet-4-5 --daily-tokens 500000\n\n\
        The file: {\"name\", \"system_prompt\", \"grants\": [..], \"group\": {\"network\", \"llm\", ...}}"
    )]
    Set {
        /// The folder.
        folder: String,
        /// The settings file (JSON).
        #[arg(long)]
        file: Option<std::path::PathBuf>,
        /// Its name.
        #[arg(long)]
        name: Option<String>,
        /// Its system prompt.
        #[arg(long)]
        prompt: Option<String>,
        /// The model its agent calls through routd's gateway.
        #[arg(long)]
        model: Option<String>,
        /// The model's wire format (anthropic, openai).
        #[arg(long)]
        api: Option<String>,
        /// Tokens per UTC day.
        #[arg(long)]
        daily_tokens: Option<u64>,
    },
    /// Remove a group (its folder's files stay).
    Rm {
        /// The folder.
        folder: String,
    },
}

/// `hako groups`.
pub async fn groups(args: GroupsArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        GroupsCommand::List => {
            let list: GroupList = d.get(Daemon::Routd, "/v1/groups", &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!("{:<24} {:<24} {:<10} sessions", "folder", "name", "trust");
            for g in &list.groups {
                let trust = match g.group.trust {
                    Trust::Untrusted => "untrusted",
                    Trust::Main => "main",
                };
                println!(
                    "{:<24} {:<24} {:<10} {}",
                    g.folder.as_str(),
                    g.name,
                    trust,
                    g.sessions.len()
                );
            }
        }
        GroupsCommand::Show { folder } => {
            let g: GroupView = d
                .get(
                    Daemon::Routd,
                    &format!("/v1/groups/{}", encode(&folder)),
                    &token,
                )
                .await?;
            emit(json, &g, |g| {
                println!("{}", serde_json::to_string_pretty(g).unwrap_or_default());
                if !g.values_in_box.is_empty() {
                    println!(
                        "note: env_allowlist hands these values to the box as they are: {}; \
                         a secret among them is better lent as a brokered secret (hako secrets)",
                        g.values_in_box.join(", ")
                    );
                }
            });
        }
        GroupsCommand::Set {
            folder,
            file,
            name,
            prompt,
            model,
            api,
            daily_tokens,
        } => {
            let cfg = group_config(
                &folder,
                file.as_deref(),
                SetFlags {
                    name,
                    prompt,
                    model,
                    api,
                    daily_tokens,
                },
            )?;
            let g: GroupView = d
                .send(
                    Daemon::Routd,
                    Method::PUT,
                    &format!("/v1/groups/{}", encode(&folder)),
                    &token,
                    &cfg,
                )
                .await?;
            emit(json, &g, |g| println!("group {} set", g.folder));
        }
        GroupsCommand::Rm { folder } => {
            let () = d
                .call(
                    Daemon::Routd,
                    Method::DELETE,
                    &format!("/v1/groups/{}", encode(&folder)),
                    &token,
                    None,
                )
                .await?;
            let removed = json!({"folder": folder, "removed": true});
            emit(json, &removed, |_| println!("group {folder} removed"));
        }
    }
    Ok(true)
}

/// The flags of `hako groups set`, over its settings file.
struct SetFlags {
    name: Option<String>,
    prompt: Option<String>,
    model: Option<String>,
    api: Option<String>,
    daily_tokens: Option<u64>,
}

/// The group's settings: `file` (a JSON object, its name defaulting to the folder) with the
/// flags over it. Read here as routd reads it, so a wrong field is named before any call.
fn group_config(
    folder: &str,
    file: Option<&std::path::Path>,
    flags: SetFlags,
) -> anyhow::Result<GroupConfig> {
    let mut body = match file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read {}", f.display()))?;
            serde_json::from_str::<Value>(&text)
                .with_context(|| format!("{} is not JSON", f.display()))?
        }
        None => json!({}),
    };
    let Some(obj) = body.as_object_mut() else {
        anyhow::bail!("the settings file must hold a JSON object");
    };
    obj.entry("name").or_insert_with(|| json!(folder));
    let what = file.map_or_else(|| "the flags".to_owned(), |f| f.display().to_string());
    let mut cfg: GroupConfig =
        serde_json::from_value(body).with_context(|| format!("{what}: not a group's settings"))?;
    if let Some(n) = flags.name {
        cfg.name = n;
    }
    if let Some(p) = flags.prompt {
        cfg.system_prompt = p;
    }
    let api = flags
        .api
        .map(|a| {
            serde_json::from_value(json!(a))
                .map_err(|_| anyhow::anyhow!("--api {a}: anthropic or openai"))
        })
        .transpose()?;
    if flags.model.is_some() || api.is_some() || flags.daily_tokens.is_some() {
        let llm = match (cfg.group.llm.take(), flags.model) {
            (Some(mut l), m) => {
                if let Some(m) = m {
                    l.model = m;
                }
                l
            }
            (None, Some(model)) => LlmSpec {
                model,
                api: Default::default(),
                daily_tokens: None,
            },
            (None, None) => anyhow::bail!(
                "--api and --daily-tokens set the group's model: name it with --model"
            ),
        };
        cfg.group.llm = Some(LlmSpec {
            api: api.unwrap_or(llm.api),
            daily_tokens: flags.daily_tokens.or(llm.daily_tokens),
            ..llm
        });
    }
    Ok(cfg)
}

/// `hako routes …`.
#[derive(Debug, clap::Args)]
pub struct RoutesArgs {
    #[command(subcommand)]
    pub command: RoutesCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with routes (routd).
#[derive(Debug, clap::Subcommand)]
pub enum RoutesCommand {
    /// The rules, in order.
    List,
    /// A rule: chats whose JID matches `pattern` (exact or glob) go to `folder`.
    #[command(
        after_help = "Examples:\n  hako routes add 'tg:-100*' team/dev\n  hako routes add web:lobby lobby --position 0"
    )]
    Add {
        /// A JID or a glob (`*`, `?`).
        pattern: String,
        /// The group folder.
        folder: String,
        /// Its place in the order (default: last).
        #[arg(long)]
        position: Option<i64>,
    },
    /// Remove a rule by id.
    Rm {
        /// The rule's id (`hako routes list`).
        id: i64,
    },
}

/// `hako routes`.
pub async fn routes(args: RoutesArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        RoutesCommand::List => {
            let list: RouteList = d.get(Daemon::Routd, "/v1/routes", &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!("{:<6} {:<9} {:<28} folder", "id", "position", "pattern");
            for r in &list.routes {
                println!(
                    "{:<6} {:<9} {:<28} {}",
                    r.id, r.position, r.pattern, r.folder
                );
            }
        }
        RoutesCommand::Add {
            pattern,
            folder,
            position,
        } => {
            let mut body = json!({"pattern": pattern, "folder": folder});
            if let Some(p) = position {
                body["position"] = json!(p);
            }
            let r: RouteView = d
                .send(Daemon::Routd, Method::POST, "/v1/routes", &token, &body)
                .await?;
            if json {
                print_json(&r);
            } else {
                println!("route {}: {} -> {}", r.id, r.pattern, r.folder);
            }
        }
        RoutesCommand::Rm { id } => {
            let r: RouteView = d
                .call(
                    Daemon::Routd,
                    Method::DELETE,
                    &format!("/v1/routes/{id}"),
                    &token,
                    None,
                )
                .await?;
            emit(json, &r, |r| {
                println!("route {id} removed: {} -> {}", r.pattern, r.folder);
            });
        }
    }
    Ok(true)
}

/// `hako tasks …`.
#[derive(Debug, clap::Args)]
pub struct TasksArgs {
    #[command(subcommand)]
    pub command: TasksCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// What to do with scheduled tasks (routd).
#[derive(Debug, clap::Subcommand)]
pub enum TasksCommand {
    /// The active tasks, soonest first.
    #[command(
        after_help = "Examples:\n  hako tasks list\n  hako tasks list --folder team/dev --all"
    )]
    List {
        /// Only this group and the groups below it.
        #[arg(long)]
        folder: Option<String>,
        /// Also the tasks that are done or cancelled.
        #[arg(long)]
        all: bool,
    },
    /// Cancel a task by id.
    Cancel {
        /// The task's id (`hako tasks list`).
        id: String,
    },
}

/// `hako tasks`.
pub async fn tasks(args: TasksArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let json = args.ops.json;
    match args.command {
        TasksCommand::List { folder, all } => {
            let mut path = format!("/v1/tasks?all={all}");
            if let Some(f) = folder {
                path.push_str(&format!("&folder={}", encode(&f)));
            }
            let list: TaskList = d.get(Daemon::Routd, &path, &token).await?;
            if json {
                print_json(&list);
                return Ok(true);
            }
            println!(
                "{:<22} {:<16} {:<22} {:<10} {:<21} prompt",
                "id", "folder", "chat", "state", "next"
            );
            for t in &list.tasks {
                println!(
                    "{:<22} {:<16} {:<22} {:<10} {:<21} {}",
                    t.id,
                    t.folder,
                    t.chat_jid,
                    t.state,
                    or_dash(t.next_at.as_ref()),
                    t.prompt.chars().take(60).collect::<String>()
                );
            }
        }
        TasksCommand::Cancel { id } => {
            let t: TaskView = d
                .call(
                    Daemon::Routd,
                    Method::DELETE,
                    &format!("/v1/tasks/{}", encode(&id)),
                    &token,
                    None,
                )
                .await?;
            emit(json, &t, |t| println!("task {id}: {}", t.state));
        }
    }
    Ok(true)
}

/// `hako token …`.
#[derive(Debug, clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// Tokens from authd.
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// A service token: the operator's (default), or another identity's from its key file in
    /// the stack's `secrets/` (e.g. `channel` for a chat adapter).
    #[command(after_help = "Examples:\n  hako token service\n  hako token service channel")]
    Service {
        /// The identity (operator, channel, routd, runed).
        #[arg(default_value = "operator")]
        daemon: String,
    },
    /// A token downscoped from the operator's: fewer scopes, one folder, a shorter life.
    #[command(
        after_help = "Examples:\n  hako token mint --scope chats:read --scope messages:write --folder team --ttl 1h"
    )]
    Mint {
        /// A scope (`resource:verb`); repeat for more.
        #[arg(long = "scope", required = true)]
        scopes: Vec<String>,
        /// The folder it is bound to (and those below it).
        #[arg(long)]
        folder: Option<String>,
        /// Its life (at most the operator token's).
        #[arg(long, default_value = "1h", value_parser = hako_shared::config::parse_duration)]
        ttl: Duration,
    },
    /// Revokes a token (and every token minted from it) by its id: a web session opened
    /// with that link ends too.
    #[command(after_help = "Examples:\n  hako token revoke j-0123abcd")]
    Revoke {
        /// The token's id (`jti`), as `hako web` or `hako token mint --json` print it (an id
        /// may start with `-`).
        #[arg(allow_hyphen_values = true)]
        jti: String,
    },
}

/// `hako token`.
pub async fn token(args: TokenArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let json = args.ops.json;
    match args.command {
        TokenCommand::Service { daemon } => {
            if daemon == "operator" {
                // The operator's token may be `HAKO_TOKEN` as it is: nothing more is known.
                let t = json!({"token": d.operator_token().await?, "daemon": "operator"});
                emit(json, &t, |t| {
                    println!("{}", t["token"].as_str().unwrap_or(""))
                });
            } else {
                let file =
                    d.ep.operator_key
                        .parent()
                        .map(|p| p.join(format!("{daemon}.key")))
                        .context("no key directory")?;
                let key = std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {daemon}'s key {}", file.display()))?;
                let client = hako_shared::auth::AuthdClient::new(&d.ep.authd)
                    .map_err(|e| anyhow::anyhow!("authd at {}: {e}", d.ep.authd))?;
                let t: ServiceTokenResponse = client
                    .service_token(&daemon, key.trim())
                    .await
                    .map_err(|e| anyhow::anyhow!("authd at {}: {e}", d.ep.authd))?;
                emit(json, &t, |t| println!("{}", t.token));
            }
        }
        TokenCommand::Mint {
            scopes,
            folder,
            ttl,
        } => {
            let token = d.operator_token().await?;
            let ask = MintRequest {
                scope: scopes,
                folder,
                ttl_seconds: Some(ttl.as_secs()),
                ..MintRequest::default()
            };
            let t: MintResponse = d
                .send(Daemon::Authd, Method::POST, "/v1/tokens", &token, &ask)
                .await?;
            emit(json, &t, |t| println!("{}", t.token));
        }
        TokenCommand::Revoke { jti } => {
            let token = d.operator_token().await?;
            let not_found = |e: &anyhow::Error| {
                e.downcast_ref::<crate::daemons::Refused>()
                    .is_some_and(|r| r.status == 404)
            };
            // authd revokes the token while it lives; routd ends the web session it opened,
            // which outlives it.
            let path = format!("/v1/tokens/{}", encode(&jti));
            let at_authd = match d
                .call::<RevokeResponse>(Daemon::Authd, Method::DELETE, &path, &token, None)
                .await
            {
                Ok(v) => Some(v),
                Err(e) if not_found(&e) => None,
                Err(e) => return Err(e),
            };
            let path = format!("/v1/web-sessions/{}", encode(&jti));
            let session = match d
                .call::<WebSessionView>(Daemon::Routd, Method::DELETE, &path, &token, None)
                .await
            {
                Ok(v) => Some(v),
                Err(e) if not_found(&e) => None,
                Err(e) => return Err(e),
            };
            if at_authd.is_none() && session.is_none() {
                anyhow::bail!(
                    "no live token {jti} at authd and no web session of it at routd (expired, ended, or never was)"
                );
            }
            let v = json!({"jti": jti, "token": at_authd, "web_session": session});
            emit(json, &v, |_| {
                if let Some(r) = &at_authd {
                    println!(
                        "revoked {jti} at authd ({} token{} with the ones minted from it)",
                        r.revoked.len(),
                        if r.revoked.len() == 1 { "" } else { "s" }
                    );
                }
                if session.is_some() {
                    println!("ended the web session of {jti}");
                }
            });
        }
    }
    Ok(true)
}
