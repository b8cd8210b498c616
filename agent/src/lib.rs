//! hako-agent: the reference in-container agent.
//!
//! It speaks the full container contract (`specs/runner.md`): one JSON line on stdin, output
//! blocks between markers on stdout, log lines on stderr, follow-up files in the input
//! directory (poll, SIGUSR1 wake, exactly-once claim, `_close`), the query deadline and
//! SIGTERM. Its default brain is the deterministic script brain (`specs/agent-script.md`), so
//! tests and demos need no LLM; [`brain::Brain`] is the seam for an LLM brain.
//!
//! It also serves a tiny echo MCP server (`hako-agent serve-mcp --socket PATH`), used as the
//! reference MCP sidecar image in tests.

#![warn(missing_docs)]

pub mod agent;
pub mod brain;
pub mod cli;
pub mod config;
pub mod followup;
pub mod input;
pub mod mcp;
pub mod output;
pub mod probe;
