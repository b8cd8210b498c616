//! The `hako` command.
//!
//! `hako chat [group-folder]` talks to an agent: each message is one turn, run in one fresh,
//! locked-down container through the container runner (the same library runed uses), with the
//! session carried from turn to turn. At this stage the CLI drives the runner directly; when
//! routd lands it will go through the daemons instead.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod chat;

/// Command-line arguments.
#[derive(Debug, Parser)]
#[command(
    name = "hako",
    version,
    about = "Run AI agents in throwaway containers"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Talk to a group's agent: one line of stdin is one turn in a fresh container.
    Chat(chat::ChatArgs),
}

/// Runs the command; the exit code says whether every turn succeeded.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Chat(args) => chat::chat(args).await,
    }
}
