//! Which group a chat goes to: the ordered route rules (an exact JID or a glob), first match
//! wins, then direct addressing (`web:<folder>` goes to that folder). A route counts only
//! when its group exists: a chat whose rule names a missing group is unrouted, and its
//! messages wait, stored, until the group or another route appears.
//!
//! The table lives in memory (ingest reads it for every message) and is reloaded from the
//! store whenever a route or a group changes.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use hako_shared::GroupFolder;
pub use hako_shared::glob::glob;

use crate::store::{RouteRow, Store};

/// The longest pattern or chat JID accepted.
pub const MAX_JID: usize = 256;

/// Checks a chat JID or pattern: 1-256 characters, none of them a control character.
pub fn check_jid(what: &str, jid: &str) -> Result<(), String> {
    if jid.is_empty() || jid.chars().count() > MAX_JID {
        return Err(format!("{what} must be 1-{MAX_JID} characters"));
    }
    if jid.chars().any(char::is_control) {
        return Err(format!("{what} holds a control character"));
    }
    Ok(())
}

#[derive(Debug, Default)]
struct Table {
    routes: Vec<RouteRow>,
    groups: BTreeSet<String>,
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
    pub fn resolve(&self, chat: &str) -> Option<String> {
        let t = self.table.read().unwrap_or_else(|p| p.into_inner());
        for r in &t.routes {
            if glob(&r.pattern, chat) {
                return t.groups.contains(&r.folder).then(|| r.folder.clone());
            }
        }
        let folder = chat.strip_prefix("web:")?;
        let folder = GroupFolder::new(folder).ok()?;
        t.groups
            .contains(folder.as_str())
            .then(|| folder.to_string())
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
                    folder: "missing".into(),
                },
                RouteRow {
                    id: 2,
                    position: 20,
                    pattern: "tg:*".into(),
                    folder: "acme".into(),
                },
            ],
            groups: ["acme".to_owned(), "acme/support".to_owned()].into(),
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
