//! The approval mapping: an agent program's "may I?" asked of the group's grants.
//!
//! The turn's `agent_tool` (routd, `specs/routd.md`, "The turn's tools") decides with the
//! program's tool as the target: `*` allows, `!agent_tool:Bash` denies, `?agent_tool:Bash`
//! holds the call until a person answers in the chat, the CLI or the web page. Claude Code
//! calls `agent_tool` itself (its permission prompt tool); a program that asks its client
//! instead (Codex's approval requests) is answered through [`Approver`], which asks the same
//! tool over the turn's MCP socket. Either way the answer is the tool's: `{"behavior":
//! "allow", …}` or `{"behavior": "deny", "message": …}`.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;

use serde_json::{Map, Value, json};

use crate::mcp::Client;
use crate::output::log;

/// The name of the turn's tool that decides.
pub const TOOL: &str = "agent_tool";

/// What the grants said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Do not; why (the model reads it).
    Deny(String),
}

/// Reads `agent_tool`'s answer; anything but an allow is a denial (fail closed).
pub fn verdict(text: &str, is_error: bool) -> Verdict {
    if is_error {
        return Verdict::Deny(text.to_owned());
    }
    let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    match v["behavior"].as_str() {
        Some("allow") => Verdict::Allow,
        _ => Verdict::Deny(
            v["message"]
                .as_str()
                .map_or_else(|| text.to_owned(), str::to_owned),
        ),
    }
}

/// Asks the turn's `agent_tool` over its MCP socket, connecting at the first question (in a
/// warm box the socket is the turn's only once the turn began) and once more if the
/// connection broke (a routd restart).
pub struct Approver {
    socket: PathBuf,
    client: RefCell<Option<Rc<Client>>>,
}

impl Approver {
    /// An approver for the turn's socket.
    pub fn new(socket: PathBuf) -> Rc<Approver> {
        Rc::new(Approver {
            socket,
            client: RefCell::new(None),
        })
    }

    /// Whether the program's tool `tool` may run with `input` (`id`: the program's id of the
    /// call). Waits as long as a person takes, if the grants say to ask one.
    pub async fn ask(self: Rc<Self>, tool: &str, input: Value, id: Option<&str>) -> Verdict {
        let mut args = Map::new();
        args.insert("tool_name".into(), json!(tool));
        args.insert("input".into(), input);
        if let Some(id) = id {
            args.insert("tool_use_id".into(), json!(id));
        }
        // One name for the question however often it is asked: across a routd restart the
        // same held request is waited on, never asked twice.
        let key = crate::mcp::new_call_key();
        // When the connection broke: from then on the socket is waited for (routd
        // restarting); a socket not there at all is a denial at once.
        let mut broke: Option<tokio::time::Instant> = None;
        let mut last = String::new();
        while broke.is_none_or(|at| at.elapsed() < crate::mcp::RECONNECT_WAIT) {
            let client = match self.client().await {
                Ok(c) => c,
                Err(e) if broke.is_some() => {
                    last = e;
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    continue;
                }
                Err(e) => {
                    last = e;
                    break;
                }
            };
            match client.call(TOOL, args.clone(), Some(&key)).await {
                Ok(r) => {
                    let v = verdict(&r.text, r.is_error);
                    log(format_args!(
                        "{tool}: {}",
                        if v == Verdict::Allow {
                            "allowed"
                        } else {
                            "denied"
                        }
                    ));
                    return v;
                }
                Err(e @ crate::mcp::McpError::Broken { .. }) => {
                    last = e.to_string();
                    broke.get_or_insert_with(tokio::time::Instant::now);
                    self.client.borrow_mut().take();
                }
                Err(e) => {
                    last = e.to_string();
                    break;
                }
            }
        }
        log(format_args!(
            "{tool}: cannot ask the grants ({last}): denied"
        ));
        Verdict::Deny(format!("hako could not ask whether {tool} may run: {last}"))
    }

    async fn client(&self) -> Result<Rc<Client>, String> {
        if let Some(c) = self.client.borrow().as_ref() {
            return Ok(c.clone());
        }
        let c = Rc::new(
            Client::connect(&self.socket)
                .await
                .map_err(|e| e.to_string())?,
        );
        *self.client.borrow_mut() = Some(c.clone());
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_allow_allows() {
        assert_eq!(
            verdict(r#"{"behavior": "allow", "updatedInput": {}}"#, false),
            Verdict::Allow
        );
        assert_eq!(
            verdict(
                r#"{"behavior": "deny", "message": "a person denied it"}"#,
                false
            ),
            Verdict::Deny("a person denied it".into())
        );
        assert_eq!(
            verdict(r#"{"behavior": "allow"}"#, true),
            Verdict::Deny(r#"{"behavior": "allow"}"#.into()),
            "a tool error never allows"
        );
        assert!(matches!(verdict("garbage", false), Verdict::Deny(_)));
    }
}
