//! `hako send`: a message in, the replies out as they come.

use std::time::{Duration, Instant};

use hako_client::routd;
use hako_shared::chat::{Direction, MessageKind, MessageState, PostMessage};

use super::{OpsArgs, print_json};
use crate::daemons::Daemons;

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
    let message = PostMessage {
        id: None,
        chat_jid: args.chat.clone(),
        sender: "operator".into(),
        sender_name: None,
        content: args.text.clone(),
        timestamp: None,
        reply_to: None,
    };
    let posted = d.call(routd::post_message(&message), &token).await?;
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
    let op = routd::chat_messages(chat)
        .query("after", seq - 1)
        .query("limit", 1);
    let page = d.call(op, token).await?;
    Ok(page
        .messages
        .into_iter()
        .find(|m| m.id == id)
        .map_or(MessageState::Pending, |m| m.state))
}
