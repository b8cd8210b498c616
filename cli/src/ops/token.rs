//! `hako token`: tokens from authd.

use std::time::Duration;

use anyhow::Context as _;
use hako_client::{CallError, authd, routd};
use hako_shared::auth::wire::{MintRequest, ServiceTokenResponse};
use serde_json::json;

use super::{OpsArgs, emit};

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
                let client = hako_client::authd::AuthdClient::new(&d.ep.authd)
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
            let t = d.call(authd::mint(&ask), &token).await?;
            emit(json, &t, |t| println!("{}", t.token));
        }
        TokenCommand::Revoke { jti } => {
            let token = d.operator_token().await?;
            let not_found = |e: &anyhow::Error| {
                e.downcast_ref::<CallError>()
                    .is_some_and(|r| r.status() == Some(404))
            };
            // authd revokes the token while it lives; routd ends the web session it opened,
            // which outlives it.
            let at_authd = match d.call(authd::revoke(&jti), &token).await {
                Ok(v) => Some(v),
                Err(e) if not_found(&e) => None,
                Err(e) => return Err(e),
            };
            let session = match d.call(routd::end_web_session(&jti), &token).await {
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
