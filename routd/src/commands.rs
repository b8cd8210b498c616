//! Slash commands routd answers itself; they never reach the agent. A message whose text is
//! one of them (alone on its line, case-insensitive) is stored as a `command`, handled at once,
//! and answered with a notice:
//!
//! - `/ping`: `pong`;
//! - `/chatid`: the chat's JID and the folder it routes to;
//! - `/new`: the group's next turn starts a fresh agent session;
//! - `/stop`: kills the folder's live run through runed (the turn ends `killed`, never
//!   retried);
//! - `/approve ID`, `/deny ID`: a verdict on a held tool call asked in this chat, from a
//!   sender the group's approval settings admit (`crate::approvals`).

use hako_shared::chat::MessageKind;
use hako_shared::{ChatJid, GroupFolder};

use crate::state::Shared;

/// A command routd handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Command {
    Ping,
    ChatId,
    New,
    Stop,
    /// A verdict on approval request `id`.
    Verdict {
        id: String,
        approve: bool,
    },
}

/// The command a message's text is, if it is one.
pub(crate) fn parse(content: &str) -> Option<Command> {
    let mut words = content.split_whitespace();
    let (first, arg, rest) = (words.next()?, words.next(), words.next());
    if rest.is_some() {
        return None;
    }
    Some(match (first.to_ascii_lowercase().as_str(), arg) {
        ("/ping", None) => Command::Ping,
        ("/chatid", None) => Command::ChatId,
        ("/new", None) => Command::New,
        ("/stop", None) => Command::Stop,
        (verb @ ("/approve" | "/deny"), Some(id)) if id.starts_with("ap-") && id.len() <= 64 => {
            Command::Verdict {
                id: id.to_owned(),
                approve: verb == "/approve",
            }
        }
        _ => return None,
    })
}

/// Handles `cmd` from `sender` in `chat` (message `id`) and appends its answer.
pub(crate) async fn handle(
    sh: &Shared,
    cmd: Command,
    chat: &ChatJid,
    sender: &str,
    vouched: bool,
    id: &str,
) -> Result<(), hako_shared::db::DbError> {
    let folder = sh.routing.resolve(chat);
    let text = match (cmd, folder.as_deref()) {
        (
            Command::Verdict {
                id: request,
                approve,
            },
            _,
        ) => {
            let judge = crate::approvals::Judge::Chat {
                chat,
                sender,
                vouched,
            };
            match crate::approvals::decide(sh, &request, approve, judge).await? {
                // The verdict's own notice tells the chat.
                Ok(_) => return Ok(()),
                Err(refused) => refused.to_string(),
            }
        }
        (Command::Ping, _) => "pong".to_owned(),
        (Command::ChatId, Some(f)) => format!("chat id: {chat} (group {f})"),
        (Command::ChatId, None) => format!("chat id: {chat} (no group: no route takes this chat)"),
        (Command::New | Command::Stop, None) => {
            "This chat routes to no group: there is nothing to reset or stop.".to_owned()
        }
        (Command::New, Some(f)) => {
            sh.store
                .set_session(f, chat, None, crate::state::now_ms())
                .await?;
            "New session: the next message starts a fresh conversation.".to_owned()
        }
        (Command::Stop, Some(f)) => match GroupFolder::new(f) {
            Ok(g) => match sh.runed.stop(&g, false).await {
                Ok(r) if r.killed.is_empty() => "Nothing is running.".to_owned(),
                Ok(_) => "Stopped.".to_owned(),
                Err(e) => format!("Could not stop the agent: {e}"),
            },
            Err(_) => "This chat's group folder is invalid.".to_owned(),
        },
    };
    sh.say(
        crate::store::keyed_message_id("", id, ".answer"),
        chat,
        MessageKind::Notice,
        text,
        None,
        Some(id.to_owned()),
    )
    .await
    .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_whole_words() {
        assert_eq!(parse("/ping"), Some(Command::Ping));
        assert_eq!(parse("  /STOP \n"), Some(Command::Stop));
        assert_eq!(parse("/new"), Some(Command::New));
        assert_eq!(parse("/chatid"), Some(Command::ChatId));
        assert_eq!(parse("/ping please"), None);
        assert_eq!(
            parse("/echo-input"),
            None,
            "the agent's own commands pass through"
        );
        assert_eq!(parse("ping"), None);
        assert_eq!(
            parse(" /APPROVE ap-12ab "),
            Some(Command::Verdict {
                id: "ap-12ab".into(),
                approve: true
            })
        );
        assert_eq!(
            parse("/deny ap-1"),
            Some(Command::Verdict {
                id: "ap-1".into(),
                approve: false
            })
        );
        assert_eq!(parse("/approve"), None);
        assert_eq!(parse("/approve ap-1 now"), None);
        assert_eq!(parse("/approve m-1"), None);
        assert_eq!(parse("/stop now"), None);
    }
}
