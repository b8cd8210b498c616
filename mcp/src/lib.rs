//! The tools of a turn, as an agent sees them: their definitions and argument types
//! ([`tools`]), the one path every call takes (parse, grants, turn live, [`tools::Backend`]),
//! and the MCP server of a turn's unix socket ([`server`], on rmcp, the official SDK).
//!
//! routd wires the real backend (its message log, tasks and groups); `hako chat` wires one
//! whose `send_message` and `spawn_group` answer `not_available`. The same calls reach routd
//! over HTTP too, through [`tools::dispatch`].

#![warn(missing_docs)]

pub mod server;
pub mod tools;

pub use server::{ServeOptions, bind_socket, serve};
pub use tools::{
    Backend, CALL_KEY_META, Call, CallKey, Scope, ToolCode, ToolDef, ToolError, dispatch,
};
