//! Which group a chat goes to: the ordered route rules (an exact JID or a glob), first match
//! wins, then direct addressing (`web:<folder>` goes to that folder). A route counts only
//! when its group exists: a chat whose rule names a missing group is unrouted, and its
//! messages wait, stored, until the group or another route appears.
//!
//! The table lives in memory (ingest reads it for every message) and is reloaded from the
//! store whenever a route or a group changes.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

pub use hako_shared::glob::glob;
use hako_shared::{ChatJid, GroupFolder};

use crate::store::{RouteRow, Store};

pub use hako_shared::jid::MAX_JID;

/// Checks a chat JID or pattern: 1-256 characters, none of them a control character.
pub fn check_jid(what: &str, jid: &str) -> Result<(), String> {
    hako_shared::jid::check(jid).map_err(|e| format!("{what} {e}"))
}

/// A chat JID from a caller, checked ([`check_jid`]'s message names it `what`).
pub fn parse_jid(what: &str, jid: &str) -> Result<ChatJid, String> {
    ChatJid::new(jid).map_err(|e| format!("{what} {e}"))
}

#[derive(Debug, Default)]
struct Table {
    routes: Vec<RouteRow>,
    groups: BTreeSet<GroupFolder>,
}

/// The routing table, shared.
#[derive(Clone, Debug, Default)]
pub struct Routing {
    table: Arc<RwLock<Table>>,
}

impl Routing {
    /// Reads routes and groups from the store.
    pub async fn reload(&self, store: &Store) -> Result<(), hako_shared::db::DbError> {
        let routes = store.routes().await?;
        let groups = store
            .groups()
            .await?
            .into_iter()
            .map(|g| g.folder)
            .collect();
        *self.table.write().unwrap_or_else(|p| p.into_inner()) = Table { routes, groups };
        Ok(())
    }

    /// The folder `chat` goes to, if any.
    pub fn resolve(&self, chat: &str) -> Option<GroupFolder> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        for r in &t.routes {
            if glob(&r.pattern, chat) {
                return t.groups.contains(&r.folder).then(|| r.folder.clone());
            }
        }
        let folder = chat.strip_prefix("web:")?;
        let folder = GroupFolder::new(folder).ok()?;
        t.groups.contains(folder.as_str()).then_some(folder)
    }

    /// Whether `chat` reaches its group through a route shared with other chats (a glob that
    /// is not the chat's own JID): the group then serves many chats, not this one alone.
    pub fn is_shared(&self, chat: &str) -> bool {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        t.routes
            .iter()
            .find(|r| glob(&r.pattern, chat))
            .is_some_and(|r| r.pattern != chat)
    }

    /// Whether a group exists.
    pub fn has_group(&self, folder: &str) -> bool {
        self.table
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .groups
            .contains(folder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_rule_wins_and_needs_its_group() {
        let r = Routing::default();
        *r.table.write().unwrap() = Table {
            routes: vec![
                RouteRow {
                    id: 1,
                    position: 10,
                    pattern: "tg:1".into(),
                    folder: GroupFolder::new("missing").unwrap(),
                },
                RouteRow {
                    id: 2,
                    position: 20,
                    pattern: "tg:*".into(),
                    folder: GroupFolder::new("acme").unwrap(),
                },
            ],
            groups: ["acme", "acme/support"]
                .map(|f| GroupFolder::new(f).unwrap())
                .into(),
        };
        assert_eq!(r.resolve("tg:1"), None, "its group is missing");
        assert_eq!(r.resolve("tg:2").as_deref(), Some("acme"));
        assert_eq!(
            r.resolve("web:acme/support").as_deref(),
            Some("acme/support")
        );
        assert_eq!(r.resolve("web:../etc"), None);
        assert_eq!(r.resolve("web:nope"), None);
        assert_eq!(r.resolve("wa:1"), None);
    }

    #[test]
    fn jids_are_checked() {
        assert!(check_jid("chat_jid", "tg:1").is_ok());
        assert!(check_jid("chat_jid", "").is_err());
        assert!(check_jid("chat_jid", &"x".repeat(257)).is_err());
        assert!(check_jid("chat_jid", "a\nb").is_err());
    }
}
