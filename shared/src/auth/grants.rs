//! The one table of service grants, and the scope names of every route.
//!
//! authd hands a daemon exactly the scopes listed here when it exchanges its service key, and
//! every test gets its tokens the same way, so production and tests cannot drift apart (a
//! lesson from the systems hako replaces: their tests minted grants production never had).

/// Scope names checked by hako's routes. Use these constants instead of string literals.
pub mod scopes {
    /// runed: start, steer and hold runs.
    pub const RUNS_RUN: &str = "runs:run";
    /// runed: read run status, long-poll and events.
    pub const RUNS_READ: &str = "runs:read";
    /// runed: stop runs.
    pub const RUNS_KILL: &str = "runs:kill";
    /// runed: session history.
    pub const SESSIONS_READ: &str = "sessions:read";
    /// authd and runed: read audit rows.
    pub const AUDIT_READ: &str = "audit:read";
    /// authd: rotate the signing key.
    pub const KEYS_ROTATE: &str = "keys:rotate";
    /// authd: revoke any token.
    pub const TOKENS_REVOKE: &str = "tokens:revoke";
    /// routd: inbound messages.
    pub const MESSAGES_WRITE: &str = "messages:write";
    /// routd: read chats.
    pub const CHATS_READ: &str = "chats:read";
    /// routd: read the group registry.
    pub const GROUPS_READ: &str = "groups:read";
    /// routd: change the group registry.
    pub const GROUPS_WRITE: &str = "groups:write";
    /// routd: read turns.
    pub const TURNS_READ: &str = "turns:read";
    /// routd: read webhook registrations.
    pub const WEBHOOKS_READ: &str = "webhooks:read";
    /// routd: register and remove webhooks.
    pub const WEBHOOKS_WRITE: &str = "webhooks:write";
    /// routd: the agent's tool faces for its own turn.
    pub const TURNS_ACT: &str = "turns:act";
    /// routd: the LLM gateway.
    pub const LLM_CALL: &str = "llm:call";
    /// The egress proxy: connect to the hosts in the token's `egress` claim.
    pub const EGRESS_CONNECT: &str = "egress:connect";
    /// routd: list and read approval requests.
    pub const APPROVALS_READ: &str = "approvals:read";
    /// routd: approve or deny a held tool call.
    pub const APPROVALS_WRITE: &str = "approvals:write";
    /// runed: list the operator's brokered secrets (names and times, never values).
    pub const SECRETS_READ: &str = "secrets:read";
    /// runed: set and remove brokered secrets.
    pub const SECRETS_WRITE: &str = "secrets:write";
    /// runed: save a file into a folder's media directory (what a chat sent its agent).
    pub const MEDIA_WRITE: &str = "media:write";
}

/// The scopes a per-spawn token carries: what an agent container may do, and nothing more.
pub const AGENT_SCOPES: &[&str] = &[scopes::TURNS_ACT, scopes::LLM_CALL, scopes::EGRESS_CONNECT];

/// Daemon name → the fixed scopes of its service token.
///
/// - `runed` holds the agent scopes only so that it can delegate them to per-spawn tokens;
///   it calls nobody else with authority.
/// - `routd` drives runs on runed.
/// - `channel` is a chat adapter (a web chat, a messenger bridge): it posts inbound messages
///   and reads its chats.
/// - `operator` is the human's CLI: key rotation, audit, revocation, all runs, groups, chats,
///   turns, webhooks and brokered secrets.
pub const SERVICE_GRANTS: &[(&str, &[&str])] = &[
    ("runed", AGENT_SCOPES),
    (
        "routd",
        &[
            scopes::RUNS_RUN,
            scopes::RUNS_READ,
            scopes::RUNS_KILL,
            scopes::SESSIONS_READ,
            scopes::MEDIA_WRITE,
        ],
    ),
    ("channel", &[scopes::MESSAGES_WRITE, scopes::CHATS_READ]),
    (
        "operator",
        &[
            scopes::KEYS_ROTATE,
            scopes::AUDIT_READ,
            scopes::TOKENS_REVOKE,
            "runs:*",
            scopes::SESSIONS_READ,
            "groups:*",
            "messages:*",
            "chats:*",
            scopes::TURNS_READ,
            "webhooks:*",
            "approvals:*",
            "secrets:*",
            "media:*",
        ],
    ),
];

/// The fixed scopes of `daemon`'s service token, or `None` for a name not in the table.
pub fn service_grants(daemon: &str) -> Option<&'static [&'static str]> {
    SERVICE_GRANTS
        .iter()
        .find(|(name, _)| *name == daemon)
        .map(|(_, s)| *s)
}

/// The daemon names of the table, for error messages.
pub fn service_names() -> impl Iterator<Item = &'static str> {
    SERVICE_GRANTS.iter().map(|(n, _)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scope;

    #[test]
    fn every_grant_is_a_valid_scope() {
        for (name, grants) in SERVICE_GRANTS {
            assert!(!grants.is_empty(), "{name} has no grants");
            for g in *grants {
                scope::validate(g).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
        for s in AGENT_SCOPES {
            scope::validate(s).unwrap();
        }
    }

    #[test]
    fn lookup() {
        assert_eq!(service_grants("runed"), Some(AGENT_SCOPES));
        assert!(service_grants("nobody").is_none());
        let routd = service_grants("routd").unwrap();
        for s in [
            scopes::RUNS_RUN,
            scopes::RUNS_READ,
            scopes::RUNS_KILL,
            scopes::SESSIONS_READ,
        ] {
            assert!(scope::any_covers(routd, s), "routd must hold {s}");
        }
        let op = service_grants("operator").unwrap();
        assert!(scope::any_covers(op, scopes::GROUPS_WRITE));
        assert!(scope::any_covers(op, scopes::RUNS_KILL));
        assert!(!scope::any_covers(op, scopes::LLM_CALL));
        assert!(scope::any_covers(op, scopes::SECRETS_WRITE));
        // Only the operator lends secrets: no daemon holds the scope.
        for (name, grants) in SERVICE_GRANTS.iter().filter(|(n, _)| *n != "operator") {
            assert!(!scope::any_covers(grants, scopes::SECRETS_READ), "{name}");
        }
    }
}
