//! The Telegram adapter's operator routes (`specs/channels.md`): pairing chats.

use reqwest::Method;
use serde_json::Value;

use crate::op::{Daemon, Op, seg};

const D: Daemon = Daemon::Telegram;

/// `POST /v1/pairings/{code}`: accepts a chat's pairing code.
pub fn pair(code: &str) -> Op<Value> {
    Op::new(D, Method::POST, format!("/v1/pairings/{}", seg(code)))
}

/// `GET /v1/pairings`: codes waiting, and chats paired.
pub fn pairings() -> Op<Value> {
    Op::get(D, "/v1/pairings".into())
}

/// `DELETE /v1/paired/{chat}`: lets a paired chat out.
pub fn unpair(chat: i64) -> Op<Value> {
    Op::new(D, Method::DELETE, format!("/v1/paired/{chat}"))
}

/// `GET /health`: polling and delivery state.
pub fn health() -> Op<Value> {
    Op::get(D, "/health".into())
}
