//! One typed client of hako's daemons' HTTP APIs. Each operation is written once, in the
//! module of the daemon that serves it ([`authd`], [`runed`], [`routd`], and the Telegram
//! adapter's operator routes, [`telegram`]): its method, its path with every segment encoded,
//! its query, its body and the type of its answer, as an [`Op`]. One [`Client`] per daemon
//! sends them: bounded answers, the request id carried, refusals read from the error envelope
//! once ([`CallError`]), event streams parsed into the answer's type ([`EventStream`]).
//!
//! routd (of runed), the CLI (of all three) and the tests call the daemons through it: no
//! other crate writes an API path.

mod call;
mod op;

pub mod authd;
pub mod routd;
pub mod runed;
pub mod telegram;
#[cfg(feature = "testing")]
pub mod testing;

pub use call::{CallError, Client, EventStream};
pub use op::{Body, Daemon, Events, Op, Text};
