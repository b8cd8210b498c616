//! What a group's agent may do with its turn's tools: the grant grammar and its one evaluator,
//! used by the MCP server and by the same actions over HTTP.
//!
//! ```text
//! grant  = ["!" | "?"] tool [":" target]
//! tool   = "*" | a tool name (lowercase letters and "_")
//! target = a glob (`*`, `?`) over what the tool acts on: the chat JID of `send_message`,
//!          the folder of `register_group` / `spawn_group`, the agent's own tool for
//!          `agent_tool` (`?agent_tool:Bash` asks before Claude Code runs a command)
//! ```
//!
//! A group with no grants gets [`DEFAULT_GRANTS`]. A call is allowed when an allow rule
//! matches the tool (and its target, if the rule has one) and no deny rule (`!…`) does:
//! deny wins. An ask rule (`?…`) that matches makes the call wait for a person's verdict
//! ([`Gate::Ask`]): deny wins, then ask, then allow; an ask rule alone is enough to offer
//! the tool (approved, it runs). Some tools need more than a grant: [`Tool::needs_main`] tools run only for a
//! `main` group, whatever its grants say. What a tool may reach at all (a chat the group owns,
//! a sub-folder of the group's own) is the caller's check on top of this one.

use serde::{Deserialize, Serialize};

use crate::glob::glob;
use crate::runs::Trust;

/// The turn's tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    /// Append and deliver a message to a chat of the group.
    SendMessage,
    /// Read the turn's chat history.
    GetHistory,
    /// Set the turn's one progress message.
    SetStatus,
    /// Schedule a prompt into the group.
    ScheduleTask,
    /// List the group's scheduled tasks.
    ListTasks,
    /// Cancel a scheduled task.
    CancelTask,
    /// Start a fresh agent session at the next turn.
    ResetSession,
    /// Create or update a group in a sub-folder.
    RegisterGroup,
    /// Start a turn in a sub-folder's group.
    SpawnGroup,
    /// Whether the agent program may use one of its own tools (Claude Code's permission
    /// prompt: Bash, Write, WebFetch, …); the target is that tool's name.
    AgentTool,
}

impl Tool {
    /// Every tool, in the order they are listed to an agent.
    pub const ALL: [Tool; 10] = [
        Tool::SendMessage,
        Tool::GetHistory,
        Tool::SetStatus,
        Tool::ScheduleTask,
        Tool::ListTasks,
        Tool::CancelTask,
        Tool::ResetSession,
        Tool::RegisterGroup,
        Tool::SpawnGroup,
        Tool::AgentTool,
    ];

    /// The tool's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Tool::SendMessage => "send_message",
            Tool::GetHistory => "get_history",
            Tool::SetStatus => "set_status",
            Tool::ScheduleTask => "schedule_task",
            Tool::ListTasks => "list_tasks",
            Tool::CancelTask => "cancel_task",
            Tool::ResetSession => "reset_session",
            Tool::RegisterGroup => "register_group",
            Tool::SpawnGroup => "spawn_group",
            Tool::AgentTool => "agent_tool",
        }
    }

    /// The tool named `name`.
    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Tools that create or drive other groups: only a `main` group's agent may use them.
    pub fn needs_main(self) -> bool {
        matches!(self, Tool::RegisterGroup | Tool::SpawnGroup)
    }
}

/// What a group with no grants may do: every tool (the `main`-only ones still need `main`).
pub const DEFAULT_GRANTS: &[&str] = &["*"];

/// The most grant rules a group may have.
pub const MAX_GRANTS: usize = 64;

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    Allow,
    Ask,
    Deny,
}

/// One parsed rule.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    effect: Effect,
    /// `None`: every tool.
    tool: Option<Tool>,
    /// `None`: every target.
    target: Option<String>,
}

/// A grant rule that cannot be used, with why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("grant {rule:?}: {reason}")]
pub struct BadGrant {
    /// The rule as written.
    pub rule: String,
    /// What is wrong with it.
    pub reason: String,
}

/// A group's grants, parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grants {
    rules: Vec<Rule>,
    trust: Trust,
}

/// What an allowed call needs before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Nothing more: it runs.
    Open,
    /// A person's verdict (an ask rule matched).
    Ask,
}

/// Why a call is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The tool needs a `main` group.
    #[error("{0} is only for the operator's main group")]
    NeedsMain(&'static str),
    /// No rule allows it, or a deny rule matches.
    #[error("the group's grants do not allow {tool}{}", target.as_ref().map(|t| format!(" on {t:?}")).unwrap_or_default())]
    NotGranted {
        /// The tool.
        tool: &'static str,
        /// What it acted on.
        target: Option<String>,
    },
}

impl Grants {
    /// Parses a group's rules (none: [`DEFAULT_GRANTS`]); every rule must parse.
    pub fn parse(rules: &[String], trust: Trust) -> Result<Self, BadGrant> {
        if rules.len() > MAX_GRANTS {
            return Err(BadGrant {
                rule: format!("{} rules", rules.len()),
                reason: format!("at most {MAX_GRANTS} rules"),
            });
        }
        let parsed = if rules.is_empty() {
            DEFAULT_GRANTS.iter().map(|r| parse_rule(r)).collect()
        } else {
            rules
                .iter()
                .map(|r| parse_rule(r))
                .collect::<Result<_, _>>()
        }?;
        Ok(Grants {
            rules: parsed,
            trust,
        })
    }

    /// No tool at all: what a group gets whose stored grants no longer parse.
    pub fn none(trust: Trust) -> Self {
        Grants {
            rules: Vec::new(),
            trust,
        }
    }

    /// Whether `tool` may act (on `target`, when the tool has one), and whether it must ask.
    pub fn check(&self, tool: Tool, target: Option<&str>) -> Result<Gate, Refused> {
        if tool.needs_main() && self.trust != Trust::Main {
            return Err(Refused::NeedsMain(tool.name()));
        }
        let hits = |r: &Rule| {
            r.tool.is_none_or(|t| t == tool)
                && match (&r.target, target) {
                    (None, _) => true,
                    (Some(p), Some(t)) => glob(p, t),
                    // A rule about targets says nothing of a call without one.
                    (Some(_), None) => false,
                }
        };
        let any = |e: Effect| self.rules.iter().any(|r| r.effect == e && hits(r));
        self.gate(
            tool,
            target,
            any(Effect::Deny),
            any(Effect::Ask),
            any(Effect::Allow),
        )
    }

    fn gate(
        &self,
        tool: Tool,
        target: Option<&str>,
        denied: bool,
        asked: bool,
        allowed: bool,
    ) -> Result<Gate, Refused> {
        match (denied, asked, allowed) {
            (true, ..) | (false, false, false) => Err(Refused::NotGranted {
                tool: tool.name(),
                target: target.map(str::to_owned),
            }),
            (false, true, _) => Ok(Gate::Ask),
            (false, false, true) => Ok(Gate::Open),
        }
    }

    /// Whether `tool` may act on `target`, a chat other than the turn's own. Reaching past
    /// the turn's chat needs a rule that names it: an allow rule whose target matches
    /// (`send_message:tg:42`, `schedule_task:web:ops*`); a rule without a target (`*`,
    /// `send_message`) covers the turn's own chat only. A group serving many chats thus
    /// never lets one chat's turn write into, or schedule work in, another's unless the
    /// operator said so. Deny still wins.
    pub fn check_beyond(&self, tool: Tool, target: &str) -> Result<Gate, Refused> {
        if tool.needs_main() && self.trust != Trust::Main {
            return Err(Refused::NeedsMain(tool.name()));
        }
        let about = |r: &&Rule| r.tool.is_none_or(|t| t == tool);
        // Deny and ask rules without a target reach every chat; a permit needs one naming it.
        let covers = |r: &Rule| r.target.as_deref().is_none_or(|p| glob(p, target));
        let names = |r: &Rule| r.target.as_deref().is_some_and(|p| glob(p, target));
        let rules = || self.rules.iter().filter(about);
        let denied = rules().any(|r| r.effect == Effect::Deny && covers(r));
        let asked = rules().any(|r| r.effect == Effect::Ask && covers(r));
        let named = rules().any(|r| r.effect != Effect::Deny && names(r));
        if !named {
            return Err(Refused::NotGranted {
                tool: tool.name(),
                target: Some(target.to_owned()),
            });
        }
        self.gate(tool, Some(target), denied, asked, true)
    }

    /// Whether `tool` is usable at all (for some target): what the agent is offered.
    pub fn offers(&self, tool: Tool) -> bool {
        if tool.needs_main() && self.trust != Trust::Main {
            return false;
        }
        let about = |r: &&Rule| r.tool.is_none_or(|t| t == tool);
        let whole_deny = self
            .rules
            .iter()
            .filter(about)
            .any(|r| r.effect == Effect::Deny && r.target.is_none());
        !whole_deny
            && self
                .rules
                .iter()
                .filter(about)
                .any(|r| r.effect != Effect::Deny)
    }
}

fn parse_rule(raw: &str) -> Result<Rule, BadGrant> {
    let bad = |reason: &str| BadGrant {
        rule: raw.to_owned(),
        reason: reason.to_owned(),
    };
    if raw.is_empty() || raw.len() > 256 {
        return Err(bad("1-256 characters"));
    }
    if raw.chars().any(char::is_control) {
        return Err(bad("no control characters"));
    }
    let (effect, rest) = if let Some(r) = raw.strip_prefix('!') {
        (Effect::Deny, r)
    } else if let Some(r) = raw.strip_prefix('?') {
        (Effect::Ask, r)
    } else {
        (Effect::Allow, raw)
    };
    let (tool, target) = match rest.split_once(':') {
        Some((t, "")) => return Err(bad(&format!("empty target after \"{t}:\""))),
        Some((t, p)) => (t, Some(p.to_owned())),
        None => (rest, None),
    };
    let tool = match tool {
        "*" => None,
        name => Some(Tool::from_name(name).ok_or_else(|| {
            bad(&format!(
                "unknown tool {name:?}; tools: *, {}",
                Tool::ALL.map(Tool::name).join(", ")
            ))
        })?),
    };
    Ok(Rule {
        effect,
        tool,
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(rules: &[&str], trust: Trust) -> Grants {
        let rules: Vec<String> = rules.iter().map(|r| (*r).to_owned()).collect();
        Grants::parse(&rules, trust).unwrap()
    }

    #[test]
    fn no_grants_means_every_tool_but_the_main_only_ones() {
        let u = g(&[], Trust::Untrusted);
        for t in Tool::ALL {
            assert_eq!(u.check(t, None).is_ok(), !t.needs_main(), "{t:?}");
            assert_eq!(u.offers(t), !t.needs_main(), "{t:?}");
        }
        let m = g(&[], Trust::Main);
        assert!(Tool::ALL.iter().all(|t| m.check(*t, None).is_ok()));
    }

    #[test]
    fn main_only_tools_ignore_grants_of_other_groups() {
        let u = g(&["register_group", "spawn_group:*"], Trust::Untrusted);
        assert_eq!(
            u.check(Tool::RegisterGroup, Some("a/b")),
            Err(Refused::NeedsMain("register_group"))
        );
        assert!(!u.offers(Tool::SpawnGroup));
    }

    #[test]
    fn targets_deny_and_order() {
        let r = g(
            &[
                "send_message:web:*",
                "get_history",
                "!send_message:web:secret*",
            ],
            Trust::Untrusted,
        );
        assert!(r.check(Tool::SendMessage, Some("web:a")).is_ok());
        assert!(r.check(Tool::SendMessage, Some("tg:1")).is_err());
        assert!(r.check(Tool::SendMessage, Some("web:secret-room")).is_err());
        // A targeted rule does not allow a call without a target.
        assert!(r.check(Tool::SendMessage, None).is_err());
        assert!(r.check(Tool::GetHistory, None).is_ok());
        assert!(r.check(Tool::ScheduleTask, None).is_err());
        assert!(r.offers(Tool::SendMessage));
        assert!(!r.offers(Tool::ScheduleTask));
        let d = g(&["*", "!schedule_task"], Trust::Main);
        assert!(d.check(Tool::ScheduleTask, None).is_err());
        assert!(!d.offers(Tool::ScheduleTask));
        assert!(d.check(Tool::SpawnGroup, Some("x/y")).is_ok());
    }

    #[test]
    fn another_chat_needs_a_rule_that_names_it() {
        // The default (`*`) reaches the turn's own chat only.
        let d = g(&[], Trust::Untrusted);
        assert!(d.check(Tool::SendMessage, Some("tg:alice")).is_ok());
        assert!(d.check_beyond(Tool::SendMessage, "tg:bob").is_err());
        assert!(d.check_beyond(Tool::ScheduleTask, "tg:bob").is_err());
        let whole = g(&["send_message", "schedule_task"], Trust::Main);
        assert!(whole.check_beyond(Tool::SendMessage, "tg:bob").is_err());
        // A named chat, or a glob of them.
        let n = g(
            &[
                "*",
                "send_message:web:ops",
                "schedule_task:tg:team-*",
                "!*:tg:team-secret",
            ],
            Trust::Untrusted,
        );
        assert!(n.check_beyond(Tool::SendMessage, "web:ops").is_ok());
        assert!(n.check_beyond(Tool::SendMessage, "web:other").is_err());
        assert!(n.check_beyond(Tool::ScheduleTask, "tg:team-a").is_ok());
        assert!(n.check_beyond(Tool::SendMessage, "tg:team-a").is_err());
        assert!(
            n.check_beyond(Tool::ScheduleTask, "tg:team-secret")
                .is_err()
        );
        let denied = g(&["send_message:*", "!send_message"], Trust::Untrusted);
        assert!(denied.check_beyond(Tool::SendMessage, "web:x").is_err());
    }

    #[test]
    fn deny_wins_then_ask_then_allow() {
        let r = g(
            &[
                "*",
                "?send_message",
                "?schedule_task:tg:*",
                "!send_message:web:never",
            ],
            Trust::Untrusted,
        );
        assert_eq!(r.check(Tool::GetHistory, None), Ok(Gate::Open));
        assert_eq!(r.check(Tool::SendMessage, Some("web:a")), Ok(Gate::Ask));
        assert!(r.check(Tool::SendMessage, Some("web:never")).is_err());
        assert_eq!(r.check(Tool::ScheduleTask, Some("tg:1")), Ok(Gate::Ask));
        assert_eq!(r.check(Tool::ScheduleTask, Some("web:a")), Ok(Gate::Open));
        // An ask rule alone offers the tool; approved, it runs.
        let only = g(&["?set_status"], Trust::Untrusted);
        assert!(only.offers(Tool::SetStatus));
        assert!(!only.offers(Tool::SendMessage));
        assert_eq!(only.check(Tool::SetStatus, None), Ok(Gate::Ask));
        // Past the turn's chat: a named permit, and an untargeted ask still asks.
        let b = g(
            &["*", "send_message:web:ops", "?send_message"],
            Trust::Untrusted,
        );
        assert_eq!(b.check_beyond(Tool::SendMessage, "web:ops"), Ok(Gate::Ask));
        let named_ask = g(&["*", "?send_message:web:ops"], Trust::Untrusted);
        assert_eq!(
            named_ask.check_beyond(Tool::SendMessage, "web:ops"),
            Ok(Gate::Ask)
        );
        assert!(named_ask.check_beyond(Tool::SendMessage, "web:x").is_err());
        // The main-only tools still need main.
        let m = g(&["?spawn_group"], Trust::Untrusted);
        assert_eq!(
            m.check(Tool::SpawnGroup, Some("a/b")),
            Err(Refused::NeedsMain("spawn_group"))
        );
    }

    #[test]
    fn bad_rules_are_named() {
        for (rule, says) in [
            ("", "1-256"),
            ("send_mesage", "unknown tool \"send_mesage\""),
            ("send_message:", "empty target"),
            ("a\u{7}", "control"),
            ("?", "unknown tool \"\""),
            ("?!send_message", "unknown tool"),
        ] {
            let e = Grants::parse(&[rule.to_owned()], Trust::Main).unwrap_err();
            assert!(e.to_string().contains(says), "{rule:?}: {e}");
        }
        let many: Vec<String> = (0..65).map(|_| "*".to_owned()).collect();
        assert!(Grants::parse(&many, Trust::Main).is_err());
    }

    #[test]
    fn names_round_trip() {
        for t in Tool::ALL {
            assert_eq!(Tool::from_name(t.name()), Some(t));
            assert_eq!(
                serde_json::to_value(t).unwrap(),
                serde_json::Value::from(t.name())
            );
        }
    }
}
