//! The operator's commands over the daemons' HTTP APIs (never their databases), one module
//! per command; each call is an operation of `hako_client`.

mod approvals;
mod groups;
mod routes;
mod runs;
mod send;
mod status;
mod tasks;
mod token;

pub use approvals::{ApprovalsArgs, ApprovalsCommand, approvals};
pub use groups::{GroupsArgs, GroupsCommand, groups};
pub use routes::{RoutesArgs, RoutesCommand, routes};
pub use runs::{RunsArgs, RunsCommand, runs};
pub use send::{SendArgs, send};
pub(crate) use status::telegram_url;
pub use status::{StatusArgs, status};
pub use tasks::{TasksArgs, TasksCommand, tasks};
pub use token::{TokenArgs, TokenCommand, token};

use crate::daemons::Daemons;
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

/// Prints `v` as JSON (`--json`) or calls `human`.
fn emit<T: serde::Serialize>(json: bool, v: &T, human: impl FnOnce(&T)) {
    if json {
        print_json(v);
    } else {
        human(v);
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
