//! Webhook delivery: each outbound message of a chat whose JID starts with a webhook's prefix
//! is POSTed there, signed, and retried until the receiver takes it.
//!
//! The body is `{"message": <MessageView>}`; headers:
//! - `X-Hako-Timestamp`: Unix seconds of the attempt;
//! - `X-Hako-Signature`: `v1=` and the hex HMAC-SHA256, keyed with the webhook's secret, of
//!   `<timestamp>.<body>` (a receiver recomputes it, and refuses stale timestamps);
//! - `Idempotency-Key`: the message id, the same on every attempt, so a receiver drops repeats
//!   (`<id>.v<version>` for the edits of a `status` message: each edit is news).
//!
//! A 2xx answer delivers the message. Anything else (or no answer within
//! `ROUTD_WEBHOOK_TIMEOUT`) is retried with exponential backoff and jitter (1 s doubling, at
//! most 5 minutes) up to `ROUTD_WEBHOOK_ATTEMPTS` attempts or `ROUTD_WEBHOOK_MAX_AGE`, then
//! the message is `undeliverable` (visible in the history). Every attempt is recorded.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use hako_shared::chat::{MessageView, WebhookDelivery};

use crate::state::{Shared, now_ms};
use crate::store::WebhookRow;

/// The worker: delivers what is due, then sleeps until the next attempt or a wake.
pub(crate) async fn worker(sh: Arc<Shared>) {
    loop {
        let due = match sh.store.due_deliveries(now_ms(), 64).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "reading due deliveries failed");
                Vec::new()
            }
        };
        if !due.is_empty() {
            // A few at once: one slow receiver does not hold up the others.
            futures_util::stream::iter(due)
                .for_each_concurrent(8, |(m, attempts)| {
                    let sh = sh.clone();
                    async move { attempt(&sh, m, attempts).await }
                })
                .await;
            continue;
        }
        let next = sh.store.next_delivery_at().await.ok().flatten();
        let wait = next.map_or(Duration::from_secs(60), |at| {
            Duration::from_millis((at - now_ms()).clamp(0, 60_000) as u64)
        });
        tokio::select! {
            () = sh.chats.deliver.notified() => {}
            () = tokio::time::sleep(wait) => {}
            () = sh.stopping.cancelled() => return,
        }
    }
}

/// The signature of `body` at `timestamp` with `secret`: `v1=` and hex HMAC-SHA256 of
/// `<timestamp>.<body>`.
pub fn signature(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret);
    let mut ctx = aws_lc_rs::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("v1={hex}")
}

async fn attempt(sh: &Shared, m: MessageView, attempts: i64) {
    let n = attempts + 1;
    let now = now_ms();
    let Some(hook) = sh.chats.webhook_for(&m.chat_jid) else {
        // The webhook was removed: nothing will ever take it.
        record(
            sh,
            &m,
            0,
            n,
            None,
            false,
            "no webhook for the chat any more".into(),
            None,
        )
        .await;
        return;
    };
    let (status, ok, detail) = post(sh, &hook, &m).await;
    let age = Duration::from_millis((now - m.timestamp).max(0) as u64);
    let next = if ok || n >= i64::from(sh.cfg.webhook_attempts) || age >= sh.cfg.webhook_max_age {
        None
    } else {
        let exp = 2u32.saturating_pow(u32::try_from(n - 1).unwrap_or(u32::MAX));
        let base = sh
            .cfg
            .webhook_retry_base
            .saturating_mul(exp)
            .min(Duration::from_secs(300));
        let mut b = [0u8; 2];
        let _ = getrandom::fill(&mut b);
        let jitter = base.as_millis() as i64 * i64::from(u16::from_le_bytes(b) % 250) / 1000;
        Some(now + base.as_millis() as i64 + jitter)
    };
    record(sh, &m, hook.id, n, status, ok, detail, next).await;
}

#[allow(clippy::too_many_arguments)]
async fn record(
    sh: &Shared,
    m: &MessageView,
    hook: i64,
    n: i64,
    status: Option<u16>,
    ok: bool,
    detail: String,
    next: Option<i64>,
) {
    let result = match (ok, next) {
        (true, _) => "delivered",
        (false, Some(_)) => "failed",
        (false, None) => "undeliverable",
    };
    if ok {
        // Delivered, not yet recorded: a restart from here delivers it again, same key.
        hako_shared::failpoint::hit("routd.webhook.delivered");
    }
    sh.metrics.delivery(result);
    if !ok {
        tracing::info!(message = %m.id, attempt = n, status, %detail, result, "webhook delivery failed");
    }
    if let Err(e) = sh
        .store
        .record_delivery(m.seq, hook, n, status, ok, detail, next, now_ms())
        .await
    {
        tracing::warn!(error = %e, "recording a delivery failed");
    }
}

/// A message's id, and its version once it was edited.
fn idempotency_key(m: &MessageView) -> String {
    if m.version == 0 {
        m.id.to_string()
    } else {
        format!("{}.v{}", m.id, m.version)
    }
}

async fn post(sh: &Shared, hook: &WebhookRow, m: &MessageView) -> (Option<u16>, bool, String) {
    let body = match serde_json::to_vec(&WebhookDelivery { message: m.clone() }) {
        Ok(b) => b,
        Err(e) => return (None, false, format!("encoding: {e}")),
    };
    let ts = now_ms() / 1000;
    let sig = signature(hook.secret.as_bytes(), ts, &body);
    let resp = sh
        .chats
        .webhook_http
        .post(&hook.url)
        .header("content-type", "application/json")
        .header("x-hako-timestamp", ts.to_string())
        .header("x-hako-signature", sig)
        .header("idempotency-key", idempotency_key(m))
        .body(body)
        .send()
        .await;
    match resp {
        Ok(r) => {
            let s = r.status().as_u16();
            (Some(s), r.status().is_success(), format!("answered {s}"))
        }
        Err(e) => (None, false, e.without_url().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231 test case 2, through the signature's construction.
    #[test]
    fn hmac_is_hmac_sha256() {
        let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, b"Jefe");
        let tag = aws_lc_rs::hmac::sign(&key, b"what do ya want for nothing?");
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        let a = signature(b"k", 1, b"body");
        assert!(a.starts_with("v1=") && a.len() == 67);
        assert_ne!(a, signature(b"k", 2, b"body"), "the timestamp is signed");
    }
}
