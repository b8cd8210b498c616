//! The operator's commands over the daemons' HTTP APIs (never their databases): `hako status`
//! and `hako send`.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::daemons::{Daemons, encode};
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
    let posted = d
        .routd_json(
            reqwest::Method::POST,
            "/v1/messages",
            &token,
            Some(json!({"chat_jid": args.chat, "sender": "operator", "content": args.text})),
        )
        .await?;
    if posted["routed"] == false {
        eprintln!(
            "hako send: no route takes {} yet; the message is kept and answered once one does \
             (`web:<folder>` reaches a group directly)",
            args.chat
        );
        return Ok(false);
    }
    let seq = posted["seq"]
        .as_i64()
        .context("routd's answer has no seq")?;
    let id = posted["id"].as_str().unwrap_or_default().to_owned();
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
                |m| m["direction"] == "out",
            )
            .await
        {
            Ok(m) => {
                after = m["seq"].as_i64().unwrap_or(after);
                replies += 1;
                if args.ops.json {
                    println!("{m}");
                } else {
                    let who = if m["kind"] == "notice" {
                        "hako"
                    } else {
                        "agent"
                    };
                    println!("{who}> {}", m["content"].as_str().unwrap_or(""));
                }
            }
            Err(e) if e.to_string().starts_with("no answer in") => {
                let state = message_state(&d, &args.chat, seq, &id, &token).await?;
                if state != "pending" {
                    return Ok(state == "answered" && replies > 0);
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
) -> anyhow::Result<String> {
    let page = d
        .routd_json(
            reqwest::Method::GET,
            &format!(
                "/v1/chats/{}/messages?after={}&limit=1",
                encode(chat),
                seq - 1
            ),
            token,
            None,
        )
        .await?;
    Ok(page["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["id"] == id))
        .and_then(|m| m["state"].as_str())
        .unwrap_or("pending")
        .to_owned())
}

/// Arguments of `hako status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub ops: OpsArgs,
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
    let runed = json!({
        "active_containers": sample(&metrics, "runed_active_containers"),
        "queue_length": sample(&metrics, "runed_queue_length"),
        "oldest_queued_seconds": sample(&metrics, "runed_oldest_queued_seconds"),
    });
    let mut turns = Vec::new();
    let mut turns_error = None;
    match d.operator_token().await {
        Ok(token) => {
            for state in ["running", "starting", "waiting"] {
                match d
                    .routd_json(
                        reqwest::Method::GET,
                        &format!("/v1/turns?state={state}&limit=100"),
                        &token,
                        None,
                    )
                    .await
                {
                    Ok(v) => turns.extend(v["turns"].as_array().cloned().unwrap_or_default()),
                    Err(e) => turns_error = Some(e.to_string()),
                }
            }
        }
        Err(e) => turns_error = Some(e.to_string()),
    }
    if args.ops.json {
        let daemons: serde_json::Map<String, Value> = ready
            .iter()
            .map(|(name, r)| {
                (
                    (*name).to_owned(),
                    match r {
                        Ok(()) => json!({"ready": true}),
                        Err(e) => json!({"ready": false, "error": e}),
                    },
                )
            })
            .collect();
        println!(
            "{}",
            json!({"daemons": daemons, "runed": runed, "turns": turns, "turns_error": turns_error})
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
    println!("turns");
    if let Some(e) = &turns_error {
        println!("  (cannot list: {e})");
    } else if turns.is_empty() {
        println!("  none live");
    }
    let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
    for t in &turns {
        let age = t["created_at"]
            .as_i64()
            .map_or("?".into(), |c| format!("{}s", (now - c).max(0) / 1000));
        println!(
            "  {:<8} {:<24} folder {:<16} chat {:<20} try {} run {} age {age}",
            t["state"].as_str().unwrap_or("?"),
            t["turn_id"].as_str().unwrap_or("?"),
            t["folder"].as_str().unwrap_or("?"),
            t["chat_jid"].as_str().unwrap_or("?"),
            t["attempt"],
            t["run_id"].as_str().unwrap_or("-"),
        );
    }
    Ok(all_ready)
}

#[cfg(test)]
mod tests {
    #[test]
    fn samples() {
        let t = "# HELP x\nrunend_x 9\nrunend 3\nrunend{a=\"b\"} 4\nrunend_y 1\n";
        assert_eq!(super::sample(t, "runend"), Some(3.0));
        assert_eq!(super::sample(t, "runend_y"), Some(1.0));
        assert_eq!(super::sample(t, "nope"), None);
    }
}
