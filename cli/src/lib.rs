//! The `hako` command.
//!
//! - `hako up` / `hako down`: the compose stack (images, keys, the daemons, a demo turn).
//! - `hako status`, `hako send`: the operator's view and voice, over the daemons' HTTP APIs.
//! - `hako chat [group-folder]`: talk to an agent without any daemon: each message is one
//!   turn, run in one fresh, locked-down container through the container runner (the same
//!   library runed uses), with the session carried from turn to turn.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod chat;
pub mod daemons;
pub mod ops;
pub mod secrets;
pub mod stack;
pub mod telegram;
pub mod web;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "hako",
    version,
    about = "Run AI agents in throwaway containers",
    after_help = "Exit codes: 0 done; 1 a daemon refused or did not answer, a turn failed, or a \
                  daemon is not ready (status); 2 bad arguments; 130 interrupted.\n\n\
                  Examples:\n  hako up\n  hako send web:demo 'hello'\n  hako status\n  \
                  hako chat team/dev\n  hako runs list --state running"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Build the images and bring the stack up (authd, runed, routd), then say hello.
    Up(stack::UpArgs),
    /// Stop the stack (`--purge` also removes its data and keys).
    Down(stack::DownArgs),
    /// Each daemon's readiness, what runs and what waits.
    Status(ops::StatusArgs),
    /// Send a message to a chat and print the replies as they arrive.
    Send(ops::SendArgs),
    /// Runs on runed: list, show, kill, logs.
    Runs(ops::RunsArgs),
    /// Groups on routd: list, show, set, rm.
    Groups(ops::GroupsArgs),
    /// Routes on routd: list, add, rm.
    Routes(ops::RoutesArgs),
    /// Scheduled tasks on routd: list, cancel.
    Tasks(ops::TasksArgs),
    /// Held tool calls waiting for a person: list, approve, deny.
    Approvals(ops::ApprovalsArgs),
    /// Tokens from authd: service, mint, revoke.
    Token(ops::TokenArgs),
    /// Brokered secrets (runed): set (from stdin or a file), list, rm. Boxes get placeholders;
    /// the egress proxy puts the values on the wire to the hosts a group lends them for.
    Secrets(secrets::SecretsArgs),
    /// Talk to a group's agent: one line of stdin is one turn in a fresh container.
    Chat(chat::ChatArgs),
    /// A one-time link that signs a browser in to hako's web page.
    Web(web::WebArgs),
    /// The Telegram adapter's chats: pair (a code the bot gave a chat), pairings, unpair.
    Telegram(telegram::TelegramArgs),
}

/// Runs the command; the exit code says whether every turn succeeded.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let ok = |b: bool| {
        if b {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    };
    match cli.command {
        Command::Up(args) => stack::up_command(args).await.map(|()| ExitCode::SUCCESS),
        Command::Down(args) => stack::down_command(args).await.map(|()| ExitCode::SUCCESS),
        Command::Status(args) => ops::status(args).await.map(ok),
        Command::Send(args) => ops::send(args).await.map(ok),
        Command::Runs(args) => ops::runs(args).await.map(ok),
        Command::Groups(args) => ops::groups(args).await.map(ok),
        Command::Routes(args) => ops::routes(args).await.map(ok),
        Command::Tasks(args) => ops::tasks(args).await.map(ok),
        Command::Approvals(args) => ops::approvals(args).await.map(ok),
        Command::Token(args) => ops::token(args).await.map(ok),
        Command::Secrets(args) => secrets::secrets(args).await,
        Command::Chat(args) => chat::chat(args).await,
        Command::Web(args) => web::web(args).await.map(ok),
        Command::Telegram(args) => telegram::run(args).await.map(ok),
    }
}

/// Agent text made safe for a terminal: every control character but newline and tab (ESC
/// sequences that would move the cursor, rewrite the title or the clipboard, BEL, CR,
/// backspace, the C1 controls) is shown as `\u{…}` instead of acting on the person's
/// terminal. An agent's words are untrusted input.
pub fn terminal_safe(text: &str) -> std::borrow::Cow<'_, str> {
    let bad = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(bad) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if bad(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod safe_text_tests {
    use super::terminal_safe;

    #[test]
    fn escapes_cannot_reach_the_terminal() {
        assert_eq!(terminal_safe("plain\ttext\nline 2"), "plain\ttext\nline 2");
        let evil = "ok\u{1b}]0;pwned\u{7}\u{1b}[2Jgone\rfake\u{9b}31m";
        let safe = terminal_safe(evil);
        assert!(
            !safe.chars().any(|c| c.is_control() && c != '\n'),
            "{safe:?}"
        );
        assert_eq!(
            safe,
            "ok\\u{1b}]0;pwned\\u{7}\\u{1b}[2Jgone\\u{d}fake\\u{9b}31m"
        );
    }
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    #[test]
    fn a_token_id_may_start_with_a_dash() {
        let cli = Cli::try_parse_from(["hako", "token", "revoke", "-Pq3_x"]).unwrap();
        match cli.command {
            Command::Token(t) => match t.command {
                ops::TokenCommand::Revoke { jti } => assert_eq!(jti, "-Pq3_x"),
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    }
}
