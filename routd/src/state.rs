//! What routd's tasks share: its configuration, store and clients, and a handle per
//! subsystem (turns, chats, held calls, web sessions) with the registries of what is live in
//! this process and the bells between them. Below every module that uses it: it names only
//! the leaf modules its fields come from (config, store, routing, runed, metrics, live,
//! chats, waiters), none of which uses it.

use std::sync::Arc;
use std::time::SystemTime;

use hako_shared::ChatJid;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Verifier, now_secs};
use hako_shared::chat::MessageKind;
use hako_shared::time::unix_millis;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::chats::Chats;
use crate::config::Config;
use crate::metrics::RoutdMetrics;
use crate::routing::Routing;
use crate::runed::Runs;
use crate::store::{self, NewOutbound, Store};
use crate::{live, waiters};

/// Everything the daemon's tasks share: what every part needs (configuration, store,
/// routing, runed, the verifier, metrics, the stopping token) and one handle per subsystem
/// (turns, chats, held calls, web sessions), which the modules of that subsystem take alone
/// where they need nothing else.
pub(crate) struct Shared {
    pub cfg: Config,
    pub store: Store,
    pub routing: Routing,
    /// runed, as routd asks it (the HTTP client, or a test's scripted runed).
    pub runed: Arc<dyn Runs>,
    pub verifier: Verifier,
    pub metrics: RoutdMetrics,
    /// Cancelled at shutdown.
    pub stopping: CancellationToken,
    /// The turns: the scheduler's bell, the live turns, their sockets and tasks.
    pub turns: live::Turns,
    /// The chats: appended messages' bell, event streams, webhooks.
    pub chats: Chats,
    /// Tool calls held for a person's verdict, woken when it comes.
    pub approvals: waiters::Waiters,
    /// Browser sessions signed out while this routd runs (their streams end).
    pub signed_out: SignedOut,
    /// Wakes the task loop (a task was scheduled or cancelled).
    pub tasks_changed: Notify,
    /// The client the LLM gateway forwards through (TLS; no overall timeout: streams are
    /// bounded by the gateway's own idle and size limits).
    pub llm_http: reqwest::Client,
}

/// The current time in Unix milliseconds.
pub(crate) fn now_ms() -> i64 {
    unix_millis(SystemTime::now())
}

impl Shared {
    /// Appends a row to the audit log, keyed by the request being served; a failure to write
    /// it is logged, never the caller's.
    pub async fn audit(
        &self,
        actor: &str,
        action: hako_shared::audit::AuditAction,
        folder: Option<&str>,
        outcome: AuditOutcome<'_>,
        detail: String,
    ) {
        self.audit_turn(actor, action, folder, None, outcome, detail)
            .await;
    }

    /// [`Shared::audit`] of what a turn's agent did.
    pub async fn audit_turn(
        &self,
        actor: &str,
        action: hako_shared::audit::AuditAction,
        folder: Option<&str>,
        turn: Option<&str>,
        outcome: AuditOutcome<'_>,
        detail: String,
    ) {
        let r = store::AuditRow::new(actor, action, folder, outcome, detail).turn(turn);
        if let Err(e) = self.store.audit(r).await {
            tracing::error!(error = %e, "writing the audit log failed");
        }
    }

    /// Appends an outbound message (once per id: a replay appends nothing), tells the chat's
    /// streams and the webhook worker. Returns the seq when it was appended now.
    pub async fn say(
        &self,
        id: String,
        chat: &ChatJid,
        kind: MessageKind,
        content: String,
        turn_id: Option<String>,
        reply_to: Option<String>,
    ) -> Result<Option<i64>, hako_shared::db::DbError> {
        let webhook = self.chats.webhook_for(chat).is_some();
        let seq = self
            .store
            .append_outbound(NewOutbound {
                id,
                chat_jid: chat.clone(),
                kind,
                content,
                turn_id,
                reply_to,
                webhook,
                now: now_ms(),
            })
            .await?;
        if seq.is_some() {
            self.metrics.message_out(kind.as_str());
            self.chats.told(chat, webhook);
        }
        Ok(seq)
    }
}

/// Sessions signed out while this routd runs, by their link's token id, until they would
/// have expired: open chat streams end on them as on a revocation.
#[derive(Debug, Default)]
pub(crate) struct SignedOut(Mutex<HashMap<String, i64>>);

impl SignedOut {
    pub(crate) fn add(&self, jti: &str, exp_secs: i64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = now_secs();
        m.retain(|_, exp| *exp > now);
        m.insert(jti.to_owned(), exp_secs);
    }

    /// Whether the session of this link's token was signed out.
    pub(crate) fn contains(&self, jti: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(jti)
    }
}
