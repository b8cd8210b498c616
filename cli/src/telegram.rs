//! `hako telegram`: the chats the Telegram adapter lets in beside `--telegram-chat`
//! (`specs/channels.md`, Pairing). A chat not on the list is refused once with a code;
//! `hako telegram pair CODE` lets it in at once, `unpair` lets it out again.

use std::time::Duration;

use anyhow::Context as _;
use hako_client::{Client, Daemon, telegram};

use crate::daemons::call_at;
use crate::ops::{OpsArgs, telegram_url};

/// `hako telegram …`.
#[derive(Debug, clap::Args)]
pub struct TelegramArgs {
    #[command(subcommand)]
    pub command: TelegramCommand,
    #[command(flatten)]
    pub ops: OpsArgs,
    /// The Telegram adapter's URL (default: the stack's on loopback, when it has one).
    #[arg(long, env = "HAKO_TELEGRAM_URL")]
    pub telegram_url: Option<String>,
}

/// What to do.
#[derive(Debug, clap::Subcommand)]
pub enum TelegramCommand {
    /// Let in the chat that was given this pairing code (the bot's refusal names it).
    Pair {
        /// The code, `XXXX-XXXX`.
        code: String,
    },
    /// The codes given and not accepted, and the chats paired.
    Pairings,
    /// Let a paired chat out again: its next message is refused, with a new code.
    Unpair {
        /// The Telegram chat id.
        #[arg(allow_hyphen_values = true)]
        chat: i64,
    },
}

/// Runs `hako telegram …`.
pub async fn run(args: TelegramArgs) -> anyhow::Result<bool> {
    let url = telegram_url(&args.ops, args.telegram_url.as_deref()).context(
        "this stack runs no Telegram adapter (`hako up --telegram-token-file …`); or give \
         --telegram-url",
    )?;
    let d = args.ops.daemons()?;
    let token = d.operator_token().await?;
    let adapter = Client::new(Daemon::Telegram, &url, Duration::from_secs(10))?;
    let op = match &args.command {
        TelegramCommand::Pair { code } => telegram::pair(code.trim()),
        TelegramCommand::Pairings => telegram::pairings(),
        TelegramCommand::Unpair { chat } => telegram::unpair(*chat),
    };
    let body = call_at(&adapter, op, &token).await?;
    if args.ops.json {
        println!("{body}");
        return Ok(true);
    }
    match &args.command {
        TelegramCommand::Pair { .. } => println!(
            "paired: chat {} may reach the agent now; route it to a group with \
             `hako routes add {} <folder>` unless a route takes it already",
            body["chat_id"],
            body["chat_jid"].as_str().unwrap_or_default()
        ),
        TelegramCommand::Pairings => {
            let rows = |k: &str| body[k].as_array().cloned().unwrap_or_default();
            println!("waiting for a pairing:");
            for p in rows("pending") {
                println!(
                    "  {}  chat {}",
                    p["code"].as_str().unwrap_or_default(),
                    p["chat_id"]
                );
            }
            println!("paired:");
            for p in rows("paired") {
                println!(
                    "  chat {}  by {}",
                    p["chat_id"],
                    p["by"].as_str().unwrap_or_default()
                );
            }
        }
        TelegramCommand::Unpair { chat } => println!("chat {chat} is let out"),
    }
    Ok(true)
}
