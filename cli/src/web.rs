//! `hako web`: a one-time link that signs a browser in to the page routd serves at `/web/`.

use std::time::Duration;

use anyhow::bail;
use hako_client::{authd, routd};
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{TokenType, scopes};
use serde_json::json;

use crate::ops::OpsArgs;

/// The scopes a page session needs: read and write chats, read groups and turns, see and
/// decide approvals.
pub const WEB_SCOPES: &[&str] = &[
    scopes::CHATS_READ,
    scopes::MESSAGES_WRITE,
    scopes::GROUPS_READ,
    scopes::TURNS_READ,
    scopes::APPROVALS_READ,
    scopes::APPROVALS_WRITE,
];

/// The longest life routd accepts for a link's token (`ROUTD_WEB_LINK_MAX_TTL`'s default).
const MAX_TTL: Duration = Duration::from_secs(15 * 60);

/// Arguments of `hako web`.
#[derive(Debug, clap::Args)]
#[command(
    after_help = "Examples:\n  hako web                  a link for the operator (every group)\n  \
                        hako web --folder acme    a tenant's link: only acme and the folders below it\n\n\
                        The link works once, within --ttl; the browser session it opens lasts \
                        ROUTD_WEB_SESSION_TTL (12h). Revoke the printed token id \
                        (`hako token revoke ID`) to end the session early."
)]
pub struct WebArgs {
    /// Bind the session to this folder (and those below it): a tenant's link.
    #[arg(long)]
    pub folder: Option<String>,
    /// List the live browser sessions instead (who, folder, the link id that ends them).
    #[arg(long, conflicts_with_all = ["folder"])]
    pub list: bool,
    /// How long the link may wait to be opened (at most 15m).
    #[arg(long, default_value = "10m", value_parser = hako_shared::config::parse_duration)]
    pub ttl: Duration,
    #[command(flatten)]
    pub ops: OpsArgs,
}

/// `hako web`.
pub async fn web(args: WebArgs) -> anyhow::Result<bool> {
    if args.list {
        return list(&args).await;
    }
    if args.ttl.is_zero() || args.ttl > MAX_TTL {
        bail!("--ttl must be above 0 and at most 15m: a sign-in link is short-lived");
    }
    if let Some(f) = &args.folder {
        hako_shared::GroupFolder::new(f.as_str())
            .map_err(|e| anyhow::anyhow!("--folder {f:?}: {e}"))?;
    }
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let ask = MintRequest {
        scope: WEB_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
        folder: args.folder.clone(),
        ttl_seconds: Some(args.ttl.as_secs()),
        typ: Some(TokenType::User),
        ..MintRequest::default()
    };
    let t = d.call(authd::mint(&ask), &token).await?;
    let link = format!(
        "{}/web/signin#{}",
        d.ep.routd.trim_end_matches('/'),
        t.token
    );
    let jti = &t.jti;
    if args.ops.json {
        println!(
            "{}",
            json!({"url": link, "jti": jti, "expires_at": t.expires_at, "folder": args.folder})
        );
    } else {
        println!("{link}");
        eprintln!(
            "Open it in a browser within {} s; it signs one browser in, once{}. \
             End the session early: hako token revoke {jti}",
            args.ttl.as_secs(),
            args.folder
                .as_deref()
                .map(|f| format!(", to {f} and the folders below it"))
                .unwrap_or_default()
        );
    }
    Ok(true)
}

/// `hako web --list`.
async fn list(args: &WebArgs) -> anyhow::Result<bool> {
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let list = d.call(routd::web_sessions(), &token).await?;
    if args.ops.json {
        println!("{}", serde_json::to_string(&list)?);
        return Ok(true);
    }
    let sessions = list.sessions;
    if sessions.is_empty() {
        println!("no live web session");
    }
    let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
    for s in &sessions {
        let left = (s.expires_at - now).max(0) / 60_000;
        println!(
            "{:<28} {:<10} folder {:<16} {left} min left",
            s.link_jti,
            s.subject,
            s.folder.as_deref().unwrap_or("(all)"),
        );
    }
    if !sessions.is_empty() {
        eprintln!("End one: hako token revoke ID");
    }
    Ok(true)
}
