//! Slash commands routd answers itself; they never reach the agent. A message whose text is
//! one of them (alone on its line, case-insensitive) is stored as a `command`, handled at once,
//! and answered with a notice:
//!
//! - `/ping`: `pong`;
//! - `/chatid`: the chat's JID and the folder it routes to;
//! - `/new`: the group's next turn starts a fresh agent session;
//! - `/stop`: kills the folder's live run through runed (the turn ends `killed`, never
//!   retried).

use hako_shared::GroupFolder;
use hako_shared::chat::MessageKind;

use crate::Shared;

/// A command routd handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Command {
    Ping,
    ChatId,
    New,
    Stop,
}

/// The command a message's text is, if it is one.
pub(crate) fn parse(content: &str) -> Option<Command> {
    let word = content.trim();
    if word.contains(char::is_whitespace) {
        return None;
    }
    Some(match word.to_ascii_lowercase().as_str() {
        "/ping" => Command::Ping,
        "/chatid" => Command::ChatId,
        "/new" => Command::New,
        "/stop" => Command::Stop,
        _ => return None,
    })
}

/// Handles `cmd` from `chat` (message `id`) and appends its answer.
pub(crate) async fn handle(
    sh: &Shared,
    cmd: Command,
    chat: &str,
    id: &str,
) -> Result<(), hako_shared::db::DbError> {
    let folder = sh.routing.resolve(chat);
    let text = match (cmd, folder.as_deref()) {
        (Command::Ping, _) => "pong".to_owned(),
        (Command::ChatId, Some(f)) => format!("chat id: {chat} (group {f})"),
        (Command::ChatId, None) => format!("chat id: {chat} (no group: no route takes this chat)"),
        (Command::New | Command::Stop, None) => {
            "This chat routes to no group: there is nothing to reset or stop.".to_owned()
        }
        (Command::New, Some(f)) => {
            sh.store.set_session(f, chat, None, crate::now_ms()).await?;
            "New session: the next message starts a fresh conversation.".to_owned()
        }
        (Command::Stop, Some(f)) => match GroupFolder::new(f) {
            Ok(g) => match sh.runed.stop(&g).await {
                Ok(r) if r.killed.is_empty() => "Nothing is running.".to_owned(),
                Ok(_) => "Stopped.".to_owned(),
                Err(e) => format!("Could not stop the agent: {e}"),
            },
            Err(_) => "This chat's group folder is invalid.".to_owned(),
        },
    };
    sh.say(
        format!("{id}.answer"),
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
    }
}
