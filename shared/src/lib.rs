//! hako's shared library: the wire types of the container contract, the HTTP error envelope
//! and ops routes, typed configuration, telemetry, SQLite helpers, group-folder rules and
//! metrics. Every daemon, the CLI and the agent build on it; nothing here is defined twice.
//!
//! The agent (a static binary in a `FROM scratch` image) uses only the always-on modules
//! (`config`, `contract`, `folder`, `egress`); the daemons enable the `server`, `db` and `telemetry`
//! features.

#![warn(missing_docs)]

pub mod allowlist;
pub mod approvals;
pub mod audit;
#[cfg(feature = "auth")]
pub mod auth;
pub mod chat;
pub mod config;
pub mod contract;
pub mod cron;
#[cfg(feature = "db")]
pub mod db;
pub mod failpoint;
pub mod folder;
pub mod glob;
pub mod grants;
#[cfg(feature = "server")]
pub mod http;
pub mod ids;
pub mod jid;
#[cfg(feature = "layout")]
pub mod layout;
pub mod media;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "openapi")]
pub mod openapi;
pub mod runs;
pub mod secrets;
pub mod sse;
#[cfg(feature = "telemetry")]
pub mod telemetry;
#[cfg(feature = "testing")]
pub mod testing;
pub mod time;
#[cfg(feature = "server")]
pub mod watchers;
pub mod web;
pub mod wire;

pub use folder::GroupFolder;
pub use jid::ChatJid;

/// An error and its causes, one line joined by `: ` (hyper's and reqwest's own text hides the
/// cause, e.g. "connection refused").
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}

/// `s` percent-encoded as one URL path segment (a chat JID, a folder with its `/`, a file
/// name): what the servers' `{param}` decodes back to `s`.
pub fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~:".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The daemons' allocator (feature `mimalloc`): one definition, so every binary that links a
/// daemon's library (its `main`, its tests, its benches) allocates the same way.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
