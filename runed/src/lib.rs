//! runed: hako's execution daemon. Its library holds the container runner (the seam shared
//! with the `hako` CLI) and the daemon: run API, durable queue, per-spawn tokens, re-adoption.

#![warn(missing_docs)]

pub mod runner;
