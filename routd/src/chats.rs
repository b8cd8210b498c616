//! The chats' side of what routd keeps in memory: who is told of a chat's new messages (its
//! open event streams, the webhook worker) and where a chat's replies are delivered. A leaf
//! below `state`: the API's streams, the delivery worker and the turn tools take it alone.

use std::sync::{Arc, RwLock};

use hako_shared::db::DbError;
use tokio::sync::{Notify, broadcast};

use crate::store::{Store, WebhookRow};

/// A message was appended to this chat: its streams read the log from their last seq.
#[derive(Debug, Clone)]
pub(crate) struct Appended {
    pub chat: Arc<str>,
}

/// The chats' bells, streams and webhooks.
pub(crate) struct Chats {
    /// A message was appended to a chat.
    pub appended: broadcast::Sender<Appended>,
    /// Wakes the webhook worker.
    pub deliver: Notify,
    /// The client webhook deliveries go through.
    pub webhook_http: reqwest::Client,
    /// Open chat streams, bounded.
    pub watchers: Arc<hako_shared::watchers::Gate>,
    /// The webhooks, cached (the delivery decision is made for every outbound message).
    webhooks: RwLock<Vec<WebhookRow>>,
}

impl Chats {
    pub(crate) fn new(
        webhook_http: reqwest::Client,
        watchers: Arc<hako_shared::watchers::Gate>,
    ) -> Self {
        Chats {
            appended: broadcast::channel(1024).0,
            deliver: Notify::new(),
            webhook_http,
            watchers,
            webhooks: RwLock::new(Vec::new()),
        }
    }

    /// The webhook for a chat: the longest prefix that matches.
    pub fn webhook_for(&self, chat: &str) -> Option<WebhookRow> {
        self.webhooks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|w| chat.starts_with(&w.prefix))
            .max_by_key(|w| w.prefix.len())
            .cloned()
    }

    /// Re-reads the webhooks from the store.
    pub async fn reload_webhooks(&self, store: &Store) -> Result<(), DbError> {
        let all = store.webhooks().await?;
        *self.webhooks.write().unwrap_or_else(|p| p.into_inner()) = all;
        Ok(())
    }

    /// Tells a chat's streams, and the webhook worker when the message goes to a webhook,
    /// that a message was appended.
    pub fn told(&self, chat: &str, webhook: bool) {
        let _ = self.appended.send(Appended { chat: chat.into() });
        if webhook {
            self.deliver.notify_one();
        }
    }
}
