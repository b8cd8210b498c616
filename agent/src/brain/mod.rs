//! The brain seam: what answers a query.
//!
//! The agent loop owns the container contract (stdin, follow-ups, signals, deadline, blocks);
//! a brain only turns a query into a reply. The loop may drop a brain's future at any await
//! point (deadline, SIGTERM), so a brain keeps what it has produced so far in itself and
//! reports it through [`Brain::partial`] for the timeout summary.
//!
//! The brains: [`script`] (deterministic, for tests and demos; the default), [`llm`] (a
//! tool-use loop against routd's gateway), and the CLI agents, a third party's agent program
//! as a child process through the same gateway: [`claude`] (Claude Code) and [`codex`]
//! (Codex), two adapters of one [`harness`]. Adding a brain: implement [`Brain`] (or, for
//! another agent program, [`harness::Adapter`]), add a [`crate::config::BrainKind`] variant
//! and a match arm in [`crate::agent::run`].

pub mod claude;
pub mod codex;
pub mod harness;
pub mod llm;
pub mod script;

use std::cell::Cell;
use std::future::Future;
use std::path::PathBuf;
use std::rc::Rc;

use hako_shared::contract::{ContainerInput, Message};
use thiserror::Error;

use crate::output::Output;

/// One query: the initial messages of the run, or one follow-up.
#[derive(Debug, Clone, Copy)]
pub struct Query<'a> {
    /// The whole stdin input (folder, session, grants, token, secrets …).
    pub input: &'a ContainerInput,
    /// The messages to answer.
    pub messages: &'a [Message],
    /// Whether this query is a follow-up (not the initial messages).
    pub follow_up: bool,
}

impl Query<'_> {
    /// The query's user text: its user messages, joined by a blank line (what a model brain
    /// sends as one user turn). Empty when there is nothing to answer.
    pub fn user_text(&self) -> String {
        self.messages
            .iter()
            .filter(|m| m.role == "user")
            .map(|m| m.content.as_str())
            .collect::<Vec<_>>()
            .join("\n\n")
    }
}

/// A brain's answer to a query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The reply text (the `result` of the `ok` block).
    pub text: String,
    /// The session to resume next time, if it changed.
    pub new_session_id: Option<String>,
}

/// How a query ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Emit the reply as an `ok` block and carry on.
    Reply(Reply),
    /// Exit the process now with this code, emitting nothing more.
    Exit(i32),
}

/// A query that failed.
#[derive(Debug, Error)]
pub enum BrainError {
    /// Failed, with output the user should see: an `error` block (the cursor advances).
    #[error("{0}")]
    Failed(String),
    /// Failed with no usable output: a `fatal` block (the turn is retried).
    #[error("{0}")]
    Fatal(String),
}

/// What the agent offers a brain while it answers: the output stream and a few switches.
#[derive(Clone)]
pub struct Io {
    /// Output blocks and noise.
    pub out: Output,
    /// The MCP socket for tool calls.
    pub mcp_socket: PathBuf,
    /// The follow-up directory (looked at, never claimed from: the agent loop claims).
    pub input_dir: PathBuf,
    ignore_sigterm: Rc<Cell<bool>>,
}

impl Io {
    /// A new handle; `ignore_sigterm` is shared with the agent loop.
    pub fn new(
        out: Output,
        mcp_socket: PathBuf,
        input_dir: PathBuf,
        ignore_sigterm: Rc<Cell<bool>>,
    ) -> Self {
        Self {
            out,
            mcp_socket,
            input_dir,
            ignore_sigterm,
        }
    }

    /// From now on, SIGTERM (and SIGINT) no longer stop the agent.
    pub fn ignore_sigterm(&self) {
        self.ignore_sigterm.set(true);
    }
}

/// Something that answers queries.
///
/// Futures need not be `Send`: the agent runs on a current-thread runtime.
pub trait Brain {
    /// Answers one query. May emit extra blocks through `io.out` while it works (streamed
    /// partial replies); the agent emits the returned reply as the query's `ok` block.
    fn respond<'a>(
        &'a mut self,
        query: Query<'a>,
        io: &'a Io,
    ) -> impl Future<Output = Result<Outcome, BrainError>> + 'a;

    /// What the current (or last) query has produced so far, for the timeout summary.
    fn partial(&self) -> String;
}
