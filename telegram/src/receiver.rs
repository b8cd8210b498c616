//! routd's signed webhook deliveries in (`POST /v1/deliveries`), and `/health`, `/ready`.
//!
//! A delivery is checked (the `v1=` HMAC-SHA256 of `<timestamp>.<body>` with the webhook's
//! secret, a timestamp within five minutes), taken once per `Idempotency-Key`, turned into
//! Bot API calls and recorded in the outbox in one transaction, and only then answered 200:
//! routd's retry of a delivery whose answer it lost is a duplicate, not a second message.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hako_shared::chat::{Direction, MessageKind, MessageView, WebhookDelivery};
use serde_json::json;
use subtle::ConstantTimeEq as _;

use crate::outbox::{REFUSAL, VERDICT, call};
use crate::store::Outgoing;
use crate::text::{LIMIT, split};
use crate::{Shared, chat_id, now_ms};

/// How far a delivery's timestamp may be from now.
const SKEW_SECS: i64 = 300;

pub(crate) fn router(sh: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/deliveries", post(delivery))
        .route("/v1/pairings", get(crate::pairing::list))
        .route("/v1/pairings/{code}", post(crate::pairing::accept))
        .route(
            "/v1/paired/{chat}",
            axum::routing::delete(crate::pairing::remove),
        )
        .route("/health", get(health))
        .route("/ready", get(ready))
        .layer(axum::extract::DefaultBodyLimit::max(1 << 20))
        .with_state(sh)
}

/// hako's error envelope (`{"error": "<code>", "message": "…"}`), the code from the status.
fn refuse(status: StatusCode, why: &str) -> Response {
    let code = match status {
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::BAD_REQUEST => "invalid_request",
        StatusCode::UNPROCESSABLE_ENTITY => "not_served",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        _ => "refused",
    };
    (status, axum::Json(json!({"error": code, "message": why}))).into_response()
}

async fn delivery(State(sh): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let (Some(ts), Some(sig), Some(key)) = (
        header("x-hako-timestamp"),
        header("x-hako-signature"),
        header("idempotency-key"),
    ) else {
        return refuse(StatusCode::UNAUTHORIZED, "a delivery is signed and keyed");
    };
    let Ok(ts) = ts.parse::<i64>() else {
        return refuse(StatusCode::UNAUTHORIZED, "bad timestamp");
    };
    if (now_ms() / 1000 - ts).abs() > SKEW_SECS {
        return refuse(StatusCode::UNAUTHORIZED, "stale timestamp");
    }
    let expected = signature(sh.cfg.webhook_secret.0.as_bytes(), ts, &body);
    if !bool::from(expected.as_bytes().ct_eq(sig.as_bytes())) {
        return refuse(StatusCode::UNAUTHORIZED, "bad signature");
    }
    let Ok(WebhookDelivery { message: m }) = serde_json::from_slice::<WebhookDelivery>(&body)
    else {
        return refuse(StatusCode::BAD_REQUEST, "not a delivery");
    };
    let Some(chat) = chat_id(&m.chat_jid) else {
        // Not a Telegram chat: routd's webhook prefix is wrong. routd retries, then marks it
        // undeliverable, visible in the chat's history.
        return refuse(StatusCode::UNPROCESSABLE_ENTITY, "not a tg: chat");
    };
    let calls = calls_for(key, chat, &m);
    match sh
        .store
        .enqueue(Some(key.to_owned()), calls, now_ms())
        .await
    {
        Ok(_) => {
            sh.send.notify_one();
            StatusCode::OK.into_response()
        }
        Err(e) => {
            tracing::error!(error = %e, "recording a delivery failed");
            refuse(
                StatusCode::SERVICE_UNAVAILABLE,
                "not recorded; deliver it again",
            )
        }
    }
}

/// What a message of routd's becomes in Telegram.
fn calls_for(key: &str, chat: i64, m: &MessageView) -> Vec<Outgoing> {
    if m.direction != Direction::Out {
        return Vec::new();
    }
    // A verdict's notice (`<turn>.approval.<id>.verdict`) edits the request's message.
    if let Some(approval) = approval_of(&m.id, Some("verdict")) {
        return vec![call(
            format!("{key}#verdict"),
            chat,
            VERDICT,
            json!({"approval": approval, "text": m.content}),
        )];
    }
    // routd's answer to a pressed button (a refusal, "decided already") goes to the presser.
    if let Some(cb) = m.reply_to.as_deref().and_then(|r| r.strip_prefix("tg:cb:"))
        && m.kind == MessageKind::Notice
    {
        return vec![call(
            format!("{key}#refusal"),
            chat,
            REFUSAL,
            json!({"callback_query_id": cb, "text": m.content}),
        )];
    }
    match m.kind {
        // The progress note is edited in place many times: "typing…" stands for it.
        MessageKind::Status => Vec::new(),
        MessageKind::Approval => {
            let Some(approval) = approval_of(&m.id, None) else {
                return texts(key, chat, &m.content);
            };
            let text: String = m.content.chars().take(LIMIT - 64).collect();
            let keyboard = json!({"inline_keyboard": [[
                {"text": "Approve", "callback_data": format!("hako:approve:{approval}")},
                {"text": "Deny", "callback_data": format!("hako:deny:{approval}")},
            ]]});
            vec![Outgoing {
                key: format!("{key}#0"),
                chat_id: chat,
                method: "sendMessage",
                params: json!({"chat_id": chat, "text": text, "reply_markup": keyboard}),
                approval: Some(approval),
            }]
        }
        _ => texts(key, chat, &m.content),
    }
}

/// One `sendMessage` per part, as plain text: no `parse_mode`, so the agent's markup is
/// shown as written, never interpreted.
fn texts(key: &str, chat: i64, text: &str) -> Vec<Outgoing> {
    split(text, LIMIT)
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .enumerate()
        .map(|(i, part)| {
            call(
                format!("{key}#{i}"),
                chat,
                "sendMessage",
                json!({"chat_id": chat, "text": part}),
            )
        })
        .collect()
}

/// The approval id in an approval message's id (`<turn>.approval.<id>`, documented in
/// `MessageKind::Approval`), or in its notice's (`<turn>.approval.<id>.<what>`).
fn approval_of(id: &str, what: Option<&str>) -> Option<String> {
    let (_, rest) = id.split_once(".approval.")?;
    let ap = match what {
        None if !rest.contains('.') => rest,
        Some(w) => rest.strip_suffix(&format!(".{w}"))?,
        None => return None,
    };
    ap.starts_with("ap-").then(|| ap.to_owned())
}

/// `v1=` and hex HMAC-SHA256 of `<timestamp>.<body>` (routd's `delivery::signature`).
fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    let mut ctx = aws_lc_rs::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let hex: String = ctx
        .sign()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("v1={hex}")
}

/// The adapter's health, as `hako status` shows it.
#[derive(Debug, serde::Serialize)]
pub struct Health {
    pub status: &'static str,
    pub bot: Option<String>,
    #[serde(flatten)]
    pub poll: crate::PollHealth,
    #[serde(flatten)]
    pub outbox: crate::store::Counts,
}

async fn health(State(sh): State<Arc<Shared>>) -> Response {
    let poll = sh.poll.lock().unwrap().clone();
    let outbox = match sh.store.counts().await {
        Ok(c) => c,
        Err(e) => {
            return refuse(StatusCode::SERVICE_UNAVAILABLE, &format!("database: {e}"));
        }
    };
    axum::Json(Health {
        status: "ok",
        bot: sh.me.get().map(|m| m.username.clone()),
        poll,
        outbox,
    })
    .into_response()
}

/// Ready while polling works: the last `getUpdates` answered within two poll timeouts.
async fn ready(State(sh): State<Arc<Shared>>) -> Response {
    let last = sh.poll.lock().unwrap().last_poll_ms;
    let fresh = 2 * sh.cfg.poll_timeout.as_millis() as i64 + 30_000;
    match last {
        Some(t) if now_ms() - t <= fresh => axum::Json(json!({"status": "ready"})).into_response(),
        _ => refuse(StatusCode::SERVICE_UNAVAILABLE, "not polling Telegram"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_ids() {
        assert_eq!(
            approval_of("t-ab.approval.ap-0123", None).as_deref(),
            Some("ap-0123")
        );
        assert_eq!(
            approval_of("t-ab.approval.ap-0123.verdict", Some("verdict")).as_deref(),
            Some("ap-0123")
        );
        assert_eq!(approval_of("t-ab.approval.ap-0123.verdict", None), None);
        assert_eq!(approval_of("t-ab.1.0", None), None);
    }
}
