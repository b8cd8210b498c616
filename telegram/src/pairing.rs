//! Pairing (`specs/channels.md`, Pairing): a chat not on the allowlist is refused once, with
//! a code; the operator accepts it (`hako telegram pair CODE`, which calls
//! `POST /v1/pairings/{code}` here with the operator's token) and the chat is allowed from
//! then on, without a restart. `GET /v1/pairings` lists the codes given and the chats paired;
//! `DELETE /v1/paired/{chat}` lets a chat out again. Only an unbound token with
//! `groups:write` (the operator's: who may route chats to groups) reaches these routes.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use hako_shared::auth::{Principal, scopes};
use serde_json::json;

use crate::store::Outgoing;
use crate::{Shared, chat_jid, now_ms};

/// The code's letters: no 0/O, 1/I/L to misread.
const ALPHABET: &[u8] = b"ABCDEFGHJKMNPQRSTUVWXYZ23456789";

/// A fresh code, `XXXX-XXXX` (about 39 bits), from the OS's entropy source.
pub(crate) fn new_code() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b)?;
    let mut s = String::with_capacity(9);
    for (i, x) in b.iter().enumerate() {
        if i == 4 {
            s.push('-');
        }
        s.push(ALPHABET[usize::from(*x) % ALPHABET.len()] as char);
    }
    Ok(s)
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

/// The operator, or the refusal to answer.
async fn operator(sh: &Shared, headers: &HeaderMap) -> Result<Principal, Response> {
    let who = Principal::from_headers(&sh.verifier, headers)
        .await
        .map_err(|e| error(StatusCode::UNAUTHORIZED, "unauthorized", e.to_string()))?;
    if !who.has_scope(scopes::GROUPS_WRITE) || !who.is_unbound() {
        return Err(error(
            StatusCode::FORBIDDEN,
            "insufficient_scope",
            "pairing a chat takes the operator's token (unbound, groups:write)",
        ));
    }
    Ok(who)
}

fn db(e: impl std::fmt::Display) -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("database: {e}"),
    )
}

/// `POST /v1/pairings/{code}`: accepts a code; its chat is allowed at once and told so.
pub(crate) async fn accept(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(code): Path<String>,
) -> Response {
    let who = match operator(&sh, &headers).await {
        Ok(w) => w,
        Err(r) => return r,
    };
    let code = code.trim().to_ascii_uppercase();
    let chat = match sh.store.pair(code, who.actor(), now_ms()).await {
        Ok(Some(chat)) => chat,
        Ok(None) => {
            return error(
                StatusCode::NOT_FOUND,
                "not_found",
                "no chat was given this code (or it was accepted already)",
            );
        }
        Err(e) => return db(e),
    };
    sh.paired.lock().unwrap().insert(chat);
    tracing::info!(chat, by = %who.actor(), "a chat paired");
    let call = Outgoing {
        key: format!("paired:{chat}:{}", now_ms()),
        chat_id: chat,
        method: "sendMessage",
        params: json!({"chat_id": chat, "text": "This chat is now allowed to reach the agent."}),
        approval: None,
    };
    if let Err(e) = sh.store.enqueue(None, vec![call], now_ms()).await {
        tracing::warn!(error = %e, "telling a paired chat failed");
    }
    sh.send.notify_one();
    Json(json!({"chat_id": chat, "chat_jid": chat_jid(chat)})).into_response()
}

/// `GET /v1/pairings`: the codes given and the chats paired.
pub(crate) async fn list(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    if let Err(r) = operator(&sh, &headers).await {
        return r;
    }
    match (sh.store.pairings().await, sh.store.paired().await) {
        (Ok(pending), Ok(paired)) => {
            Json(json!({"pending": pending, "paired": paired})).into_response()
        }
        (Err(e), _) | (_, Err(e)) => db(e),
    }
}

/// `DELETE /v1/paired/{chat}`: the chat is refused again from its next message (once, with a
/// new code).
pub(crate) async fn remove(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    Path(chat): Path<String>,
) -> Response {
    if let Err(r) = operator(&sh, &headers).await {
        return r;
    }
    let Ok(chat) = chat.parse::<i64>() else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "a chat id is an integer",
        );
    };
    match sh.store.unpair(chat).await {
        Ok(true) => {
            sh.paired.lock().unwrap().remove(&chat);
            tracing::info!(chat, "a chat unpaired");
            StatusCode::NO_CONTENT.into_response()
        }
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("chat {chat} is not paired (chats of TELEGRAM_CHATS are let out there)"),
        ),
        Err(e) => db(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_read_unambiguously() {
        let a = new_code().unwrap();
        assert_eq!(a.len(), 9);
        assert_eq!(&a[4..5], "-");
        assert!(
            a.chars()
                .filter(|c| *c != '-')
                .all(|c| ALPHABET.contains(&(c as u8))),
            "{a}"
        );
        assert_ne!(a, new_code().unwrap());
    }
}
