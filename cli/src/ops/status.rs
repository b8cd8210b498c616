//! `hako status`: each daemon's readiness, what runs, what waits.

use std::time::Duration;

use hako_client::{Client, Daemon, routd};
use serde_json::{Value, json};

use super::{OpsArgs, or_dash};

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
    let got = match Client::new(Daemon::Telegram, &url, Duration::from_secs(5)) {
        Ok(c) => c.call(hako_client::telegram::health(), None).await,
        Err(e) => Err(e),
    };
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
    let metrics = d
        .text(hako_client::runed::metrics())
        .await
        .unwrap_or_default();
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
            if let Ok(list) = d.call(routd::groups(), &token).await {
                values_in_box = list
                    .groups
                    .iter()
                    .filter(|g| !g.values_in_box.is_empty())
                    .map(|g| json!({"folder": g.folder, "names": g.values_in_box}))
                    .collect();
            }
            match d.call(routd::approvals().query("limit", 100), &token).await {
                Ok(list) => approvals = list.approvals,
                Err(e) => turns_error = Some(e.to_string()),
            }
            for state in ["running", "starting", "waiting"] {
                let op = routd::turns().query("state", state).query("limit", 100);
                match d.call(op, &token).await {
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
        super::approvals::print_approval(a, now);
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
