//! Outbound: the one sender of the outbox. Calls go out in the order they were recorded,
//! each marked `sending` before it is made:
//!
//! - an answer: `sent`;
//! - 429: made again after its `retry_after` (everything behind it waits: Telegram limits
//!   the bot, not one chat);
//! - 5xx, or no connection: made again with backoff (the retry base doubling to a minute)
//!   until `TELEGRAM_SEND_MAX_AGE`, then `failed`;
//! - any other refusal: `failed` at once;
//! - the answer lost (a timeout or a reset after the request went out), or a crash while the
//!   call was in flight: `unconfirmed`, never made again. Telegram has no idempotency key, so
//!   the adapter cannot know whether it arrived; it reports it instead of risking a second
//!   copy.
//!
//! `failed` and `unconfirmed` calls are counted in `/health` (and so in `hako status`).

use std::sync::Arc;
use std::time::Duration;

use frankenstein::types::Message;
use serde_json::{Value, json};

use crate::botapi::BotError;
use crate::store::{Outgoing, Row, SendState};
use crate::{Shared, now_ms};

/// Pseudo-methods the sender resolves when their turn comes (they depend on what was sent
/// before them): a verdict edits the approval message; a refusal answers a pressed button.
pub(crate) const VERDICT: &str = "hako.verdict";
pub(crate) const REFUSAL: &str = "hako.refusal";

pub(crate) async fn run(sh: Arc<Shared>) {
    loop {
        let (row, next) = match sh.store.next_due(now_ms()).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "reading the outbox failed");
                (None, Some(now_ms() + 1000))
            }
        };
        if let Some(row) = row {
            send(&sh, row).await;
            continue;
        }
        let wait = next.map_or(Duration::from_secs(60), |at| {
            Duration::from_millis((at - now_ms()).clamp(0, 60_000) as u64)
        });
        tokio::select! {
            () = sh.send.notified() => {}
            () = tokio::time::sleep(wait) => {}
            () = sh.stopping.cancelled() => return,
        }
    }
}

async fn send(sh: &Shared, row: Row) {
    if let Err(e) = sh.store.mark(row.id, SendState::Sending, None, None).await {
        tracing::error!(error = %e, "recording a send failed: not sending");
        return;
    }
    let result = match row.method.as_str() {
        VERDICT => verdict(sh, &row).await,
        REFUSAL => refusal(sh, &row).await,
        m => {
            sh.bot
                .call::<_, Value>(m, &row.params, Some(Duration::from_secs(30)))
                .await
        }
    };
    let (state, next, error) = match result {
        Ok(answer) => {
            if let (Some(ap), "sendMessage") = (&row.approval, row.method.as_str())
                && let Ok(m) = serde_json::from_value::<Message>(answer)
            {
                let text = row.params["text"].as_str().unwrap_or_default().to_owned();
                if let Err(e) = sh
                    .store
                    .set_approval_message(ap.clone(), row.chat_id, i64::from(m.message_id), text)
                    .await
                {
                    tracing::error!(error = %e, "keeping an approval message failed");
                }
            }
            (SendState::Sent, None, None)
        }
        Err(BotError::RetryAfter(d)) => {
            tracing::info!(key = %row.key, after = ?d, "Telegram asks to wait");
            (
                SendState::Pending,
                Some(now_ms() + d.as_millis() as i64),
                Some(format!("429: retry after {d:?}")),
            )
        }
        Err(e @ (BotError::Server { .. } | BotError::Connect(_))) => {
            let age = Duration::from_millis((now_ms() - row.created_at).max(0) as u64);
            if age >= sh.cfg.send_max_age {
                (
                    SendState::Failed,
                    None,
                    Some(format!("gave up after {age:?}: {e}")),
                )
            } else {
                let exp = 2u32.saturating_pow(u32::try_from(row.attempts).unwrap_or(16).min(16));
                let pause = sh
                    .cfg
                    .retry_base
                    .saturating_mul(exp)
                    .min(Duration::from_secs(60));
                tracing::warn!(key = %row.key, error = %e, ?pause, "a send is retried");
                (
                    SendState::Pending,
                    Some(now_ms() + pause.as_millis() as i64),
                    Some(e.to_string()),
                )
            }
        }
        Err(e @ BotError::Refused { .. }) => (SendState::Failed, None, Some(e.to_string())),
        Err(e @ BotError::Lost(_)) => (SendState::Unconfirmed, None, Some(e.to_string())),
    };
    match state {
        SendState::Failed | SendState::Unconfirmed => tracing::warn!(
            key = %row.key, chat = row.chat_id, error = error.as_deref().unwrap_or_default(),
            "a delivery to Telegram did not go through"
        ),
        _ => tracing::debug!(key = %row.key, "sent"),
    }
    if let Err(e) = sh.store.mark(row.id, state, next, error).await {
        tracing::error!(error = %e, "recording a send's outcome failed");
    }
    if row.method == "sendMessage" {
        sh.typing.lock().unwrap().remove(&row.chat_id);
    }
}

/// routd's verdict on an approval: the approval message edited to say who decided (its
/// buttons gone), every press waiting for it answered.
async fn verdict(sh: &Shared, row: &Row) -> Result<Value, BotError> {
    let approval = row.params["approval"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let notice = row.params["text"].as_str().unwrap_or_default().to_owned();
    let approved = notice.starts_with(&format!("{approval} approved"));
    let presses = sh
        .store
        .take_presses(approval.clone())
        .await
        .unwrap_or_default();
    // routd names the sender that decided (`… by chat:tg:-100:tg:42: …`).
    let winner = presses.iter().find(|p| {
        notice.contains(&format!(":{}:", p.sender)) || notice.contains(&format!(":{} ", p.sender))
    });
    let line = match winner {
        Some(p) if approved => format!("✅ Approved by {}", p.name),
        Some(p) => format!("❌ Denied by {}", p.name),
        None => notice.clone(),
    };
    for p in &presses {
        let text = if winner.is_some_and(|w| w.id == p.id) {
            line.clone()
        } else {
            format!("Already decided: {line}")
        };
        let _ = sh
            .bot
            .call::<_, Value>(
                "answerCallbackQuery",
                &json!({"callback_query_id": p.id, "text": text}),
                Some(Duration::from_secs(10)),
            )
            .await;
    }
    match sh.store.approval_message(approval).await.ok().flatten() {
        Some((chat, message_id, text)) => {
            sh.bot
                .call(
                    "editMessageText",
                    &json!({"chat_id": chat, "message_id": message_id,
                            "text": format!("{text}\n\n{line}")}),
                    Some(Duration::from_secs(30)),
                )
                .await
        }
        // The request's message never made it: the verdict is a message of its own.
        None => {
            sh.bot
                .call(
                    "sendMessage",
                    &json!({"chat_id": row.chat_id, "text": notice}),
                    Some(Duration::from_secs(30)),
                )
                .await
        }
    }
}

/// routd refused a pressed button's verdict (not allowed, decided already): the presser sees
/// why, as an alert.
async fn refusal(sh: &Shared, row: &Row) -> Result<Value, BotError> {
    let id = row.params["callback_query_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let text = row.params["text"].as_str().unwrap_or_default();
    if !sh.store.take_press(id.clone()).await.unwrap_or(false) {
        return Ok(Value::Null);
    }
    // An alert holds at most 200 characters.
    let short: String = text.chars().take(200).collect();
    sh.bot
        .call(
            "answerCallbackQuery",
            &json!({"callback_query_id": id, "text": short, "show_alert": true}),
            Some(Duration::from_secs(10)),
        )
        .await
}

/// "typing…" in every chat waiting for a reply, every 4 seconds (Telegram shows it for 5),
/// best effort: a failure is only logged.
pub(crate) async fn typing(sh: Arc<Shared>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(Duration::from_secs(4)) => {}
            () = sh.stopping.cancelled() => return,
        }
        let now = tokio::time::Instant::now();
        let chats: Vec<i64> = {
            let mut t = sh.typing.lock().unwrap();
            t.retain(|_, until| *until > now);
            t.keys().copied().collect()
        };
        for chat in chats {
            if let Err(e) = sh
                .bot
                .call::<_, Value>(
                    "sendChatAction",
                    &json!({"chat_id": chat, "action": "typing"}),
                    Some(Duration::from_secs(10)),
                )
                .await
            {
                tracing::debug!(chat, error = %e, "typing… not shown");
            }
        }
    }
}

/// A call to record for the outbox.
pub(crate) fn call(key: String, chat_id: i64, method: &'static str, params: Value) -> Outgoing {
    Outgoing {
        key,
        chat_id,
        method,
        params,
        approval: None,
    }
}
