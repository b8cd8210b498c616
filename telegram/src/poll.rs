//! Inbound: long polling `getUpdates`. Each update is handled (posted to routd, or refused,
//! or ignored) before the persisted offset moves past it, so a restart neither loses an
//! update (the offset is behind it) nor makes a second turn of one (its message id is
//! derived from Telegram's, and routd answers a repeat as a duplicate).

use std::sync::Arc;
use std::time::Duration;

use frankenstein::methods::GetUpdatesParams;
use frankenstein::types::{
    AllowedUpdate, CallbackQuery, ChatType, MaybeInaccessibleMessage, Message, User,
};
use frankenstein::updates::{Update, UpdateContent};
use hako_shared::chat::PostMessage;
use serde_json::json;

use crate::botapi::BotError;
use crate::media;
use crate::routd::PostError;
use crate::store::Outgoing;
use crate::{Me, Shared, chat_jid, now_ms};

/// The polling loop: `getMe` once, then `getUpdates` until the adapter stops.
pub(crate) async fn run(sh: Arc<Shared>) {
    let mut pause = sh.cfg.retry_base;
    let me = loop {
        match sh.bot.call::<_, User>("getMe", &json!({}), None).await {
            Ok(u) => {
                break Me {
                    id: u.id,
                    username: u.username.unwrap_or_default(),
                };
            }
            Err(e) => {
                tracing::warn!(error = %e, "getMe failed");
                sh.poll.lock().unwrap().last_poll_error = Some(format!("getMe: {e}"));
                if wait(&sh, backoff(&e, &mut pause)).await {
                    return;
                }
            }
        }
    };
    tracing::info!(bot = %me.username, "polling Telegram");
    let _ = sh.me.set(me);
    pause = sh.cfg.retry_base;
    loop {
        if sh.stopping.is_cancelled() {
            return;
        }
        let offset = match sh.store.offset().await {
            Ok(o) => o,
            Err(e) => {
                tracing::error!(error = %e, "reading the offset failed");
                if wait(&sh, Duration::from_secs(1)).await {
                    return;
                }
                continue;
            }
        };
        let params = GetUpdatesParams::builder()
            .offset(offset)
            .timeout(sh.cfg.poll_timeout.as_secs() as u32)
            .allowed_updates(vec![AllowedUpdate::Message, AllowedUpdate::CallbackQuery])
            .build();
        let got = tokio::select! {
            r = sh.bot.call::<_, Vec<Update>>("getUpdates", &params, None) => r,
            () = sh.stopping.cancelled() => return,
        };
        let mut updates = match got {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(error = %e, "getUpdates failed");
                sh.poll.lock().unwrap().last_poll_error = Some(e.to_string());
                if wait(&sh, backoff(&e, &mut pause)).await {
                    return;
                }
                continue;
            }
        };
        pause = sh.cfg.retry_base;
        {
            let mut h = sh.poll.lock().unwrap();
            h.last_poll_ms = Some(now_ms());
            h.last_poll_error = None;
        }
        updates.sort_by_key(|u| u.update_id);
        for u in updates {
            let id = i64::from(u.update_id);
            // Telegram sends what is at or after the offset; a server that replays more is
            // not trusted to.
            if id < offset {
                continue;
            }
            loop {
                match handle(&sh, &u).await {
                    Ok(()) => break,
                    Err(e) => {
                        // routd is away: the same update again (the offset stays behind it).
                        tracing::warn!(error = %e, update = id, "an update waits for routd");
                        sh.poll.lock().unwrap().last_poll_error = Some(e.to_string());
                        if wait(&sh, backoff_routd(&mut pause)).await {
                            return;
                        }
                    }
                }
            }
            pause = sh.cfg.retry_base;
            sh.poll.lock().unwrap().updates += 1;
            if let Err(e) = sh.store.set_offset(id + 1).await {
                tracing::error!(error = %e, "recording the offset failed");
            }
        }
    }
}

/// Sleeps `d` unless the adapter stops first (`true`: it stops).
async fn wait(sh: &Shared, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => false,
        () = sh.stopping.cancelled() => true,
    }
}

fn backoff(e: &BotError, pause: &mut Duration) -> Duration {
    if let BotError::RetryAfter(d) = e {
        return *d;
    }
    backoff_routd(pause)
}

fn backoff_routd(pause: &mut Duration) -> Duration {
    let d = *pause;
    *pause = (*pause * 2).min(Duration::from_secs(60));
    d
}

/// Handles one update; `Err`: routd did not take it and it must be handled again.
async fn handle(sh: &Shared, u: &Update) -> Result<(), PostError> {
    match &u.content {
        UpdateContent::Message(m) => message(sh, m).await,
        UpdateContent::CallbackQuery(q) => callback(sh, q).await,
        _ => Ok(()),
    }
}

fn display_name(u: &User) -> String {
    match (&u.last_name, &u.username) {
        (Some(l), _) => format!("{} {l}", u.first_name),
        (None, Some(n)) if u.first_name.is_empty() => n.clone(),
        _ => u.first_name.clone(),
    }
}

async fn message(sh: &Shared, m: &Message) -> Result<(), PostError> {
    let chat = m.chat.id;
    if !sh.allowed(chat) {
        refuse(sh, chat).await;
        return Ok(());
    }
    let Some(me) = sh.me.get() else {
        return Ok(());
    };
    let Some(from) = m.from.as_deref() else {
        return Ok(());
    };
    if from.is_bot {
        return Ok(());
    }
    let file = media::attachment(m, sh.cfg.media_max);
    let text = m.text.as_deref().or(m.caption.as_deref()).unwrap_or("");
    if text.is_empty() && file.is_none() {
        tracing::debug!(chat, "a message with neither text nor a file: ignored");
        return Ok(());
    }
    let text = match m.chat.type_field {
        ChatType::Private => text.to_owned(),
        ChatType::Group | ChatType::Supergroup => {
            let replied = m
                .reply_to_message
                .as_deref()
                .and_then(|r| r.from.as_deref())
                .is_some_and(|f| f.id == me.id);
            match strip_mention(text, &me.username) {
                Some(t) => t,
                None if replied => text.to_owned(),
                None => return Ok(()),
            }
        }
        ChatType::Channel => return Ok(()),
    };
    let mut content = normalize_command(&text, &me.username);
    if content.trim().is_empty() && file.is_none() {
        return Ok(());
    }
    // Fetched once the message is known to be for the agent; the text names the file.
    if let Some(f) = &file {
        let line = media::receive(sh, &chat_jid(chat), f).await?;
        content = if content.trim().is_empty() {
            line
        } else {
            format!("{content}\n{line}")
        };
    }
    let post = PostMessage {
        id: Some(format!("tg:{chat}:{}", m.message_id)),
        chat_jid: chat_jid(chat),
        sender: format!("tg:{}", from.id),
        sender_name: Some(display_name(from)),
        content,
        timestamp: Some(i64::try_from(m.date).unwrap_or(0).saturating_mul(1000)),
        reply_to: None,
    };
    match sh.routd.post(&post).await {
        Ok(p) => {
            // Until the first message back (a command's notice included) or the cap.
            if !p.duplicate && p.routed {
                let until = tokio::time::Instant::now() + sh.cfg.typing_max;
                sh.typing.lock().unwrap().insert(chat, until);
                // At once, then every few seconds from `outbox::typing` (best effort).
                let bot = sh.bot.clone();
                tokio::spawn(async move {
                    let _ = bot
                        .call::<_, serde_json::Value>(
                            "sendChatAction",
                            &json!({"chat_id": chat, "action": "typing"}),
                            Some(Duration::from_secs(10)),
                        )
                        .await;
                });
            }
            Ok(())
        }
        Err(PostError::Refused { status, body }) => {
            tracing::warn!(chat, status, %body, "routd refused a message: skipped");
            sh.poll.lock().unwrap().refused_by_routd += 1;
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// A chat not on the allowlist: one polite refusal, ever, with a pairing code the operator
/// can accept (`hako telegram pair CODE`), and no turn.
async fn refuse(sh: &Shared, chat: i64) {
    match sh.store.refuse_once(chat, now_ms()).await {
        Ok(true) => {
            tracing::info!(chat, "a chat not on the allowlist: refused");
            let code = match crate::pairing::new_code() {
                Ok(code) => match sh.store.offer_pairing(chat, code, now_ms()).await {
                    Ok(stored) => stored,
                    Err(e) => {
                        tracing::error!(error = %e, "recording a pairing code failed");
                        None
                    }
                },
                Err(e) => {
                    tracing::error!(error = %e, "no entropy for a pairing code");
                    None
                }
            };
            let text = match code {
                Some(code) => format!(
                    "Sorry, this bot only answers the chats its operator allows. To let this \
                     chat in, the operator runs: hako telegram pair {code}"
                ),
                None => format!(
                    "Sorry, this bot only answers the chats its operator allows. To use it \
                     here, ask the operator to add chat id {chat} to the allowlist."
                ),
            };
            let call = Outgoing {
                key: format!("refusal:{chat}:{}", now_ms()),
                chat_id: chat,
                method: "sendMessage",
                params: json!({"chat_id": chat, "text": text}),
                approval: None,
            };
            if let Err(e) = sh.store.enqueue(None, vec![call], now_ms()).await {
                tracing::error!(error = %e, "recording a refusal failed");
            }
            sh.send.notify_one();
        }
        Ok(false) => tracing::debug!(chat, "a refused chat again: ignored"),
        Err(e) => tracing::error!(error = %e, "recording a refusal failed"),
    }
}

/// `text` without the bot's `@username` mention, if it holds one.
fn strip_mention(text: &str, username: &str) -> Option<String> {
    if username.is_empty() {
        return None;
    }
    let at = format!("@{username}");
    let lower = text.to_lowercase();
    let i = lower.find(&at.to_lowercase())?;
    // The mention ends at a word boundary (`@hakobot2` is another bot).
    let end = i + at.len();
    if text[end..]
        .chars()
        .next()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
    {
        return None;
    }
    let out = format!("{}{}", &text[..i], &text[end..]);
    Some(out.trim().to_owned())
}

/// `/new@botname` → `/new`: Telegram's form of a command addressed to this bot.
fn normalize_command(text: &str, username: &str) -> String {
    let suffix = format!("@{username}");
    let first = text.split_whitespace().next().unwrap_or_default();
    if first.starts_with('/')
        && !username.is_empty()
        && first.to_lowercase().ends_with(&suffix.to_lowercase())
    {
        let i = text.find(first).unwrap_or(0);
        let cmd = &first[..first.len() - suffix.len()];
        return format!("{}{}{}", &text[..i], cmd, &text[i + first.len()..]);
    }
    text.to_owned()
}

/// A pressed Approve or Deny button: the press becomes `/approve ID` or `/deny ID` from the
/// person who pressed it; routd decides whether they may, and its answer (the verdict, or a
/// refusal replying to the press) comes back as a delivery.
async fn callback(sh: &Shared, q: &CallbackQuery) -> Result<(), PostError> {
    let Some(MaybeInaccessibleMessage::Message(m)) = &q.message else {
        return Ok(());
    };
    let chat = m.chat.id;
    let parsed = q.data.as_deref().and_then(parse_button);
    let answer = |text: &str| Outgoing {
        key: format!("cb:{}", q.id),
        chat_id: chat,
        method: "answerCallbackQuery",
        params: json!({"callback_query_id": q.id, "text": text, "show_alert": true}),
        approval: None,
    };
    let Some((approve, approval)) = parsed.filter(|_| sh.cfg.chats.contains(&chat)) else {
        let _ = sh
            .store
            .enqueue(
                None,
                vec![answer(
                    "This button is not hako's, or this chat is not allowed.",
                )],
                now_ms(),
            )
            .await;
        sh.send.notify_one();
        return Ok(());
    };
    let sender = format!("tg:{}", q.from.id);
    match sh
        .store
        .add_press(
            q.id.clone(),
            approval.clone(),
            chat,
            sender.clone(),
            display_name(&q.from),
        )
        .await
    {
        Ok(true) => {}
        Ok(false) => return Ok(()),
        Err(e) => return Err(PostError::Unavailable(e.to_string())),
    }
    let verb = if approve { "/approve" } else { "/deny" };
    let post = PostMessage {
        id: Some(format!("tg:cb:{}", q.id)),
        chat_jid: chat_jid(chat),
        sender,
        sender_name: Some(display_name(&q.from)),
        content: format!("{verb} {approval}"),
        timestamp: Some(now_ms()),
        reply_to: None,
    };
    match sh.routd.post(&post).await {
        Ok(_) => Ok(()),
        Err(PostError::Refused { status, body }) => {
            tracing::warn!(chat, status, %body, "routd refused a verdict");
            let _ = sh.store.take_press(q.id.clone()).await;
            let _ = sh
                .store
                .enqueue(
                    None,
                    vec![answer("hako could not take this verdict.")],
                    now_ms(),
                )
                .await;
            sh.send.notify_one();
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The callback data of hako's buttons: `hako:approve:<id>` or `hako:deny:<id>`.
pub(crate) fn parse_button(data: &str) -> Option<(bool, String)> {
    let rest = data.strip_prefix("hako:")?;
    let (verb, id) = rest.split_once(':')?;
    let ok = id.starts_with("ap-")
        && id.len() <= 64
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    match verb {
        "approve" if ok => Some((true, id.to_owned())),
        "deny" if ok => Some((false, id.to_owned())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mentions_and_commands() {
        assert_eq!(
            strip_mention("@HakoBot hello", "hakobot").as_deref(),
            Some("hello")
        );
        assert_eq!(strip_mention("hi @hakobot2", "hakobot"), None);
        assert_eq!(strip_mention("hello", "hakobot"), None);
        assert_eq!(normalize_command("/new@hakobot", "hakobot"), "/new");
        assert_eq!(
            normalize_command("/approve@hakobot ap-1", "hakobot"),
            "/approve ap-1"
        );
        assert_eq!(normalize_command("/new", "hakobot"), "/new");
        assert_eq!(
            parse_button("hako:approve:ap-0123"),
            Some((true, "ap-0123".into()))
        );
        assert_eq!(parse_button("hako:deny:ap-1"), Some((false, "ap-1".into())));
        assert_eq!(parse_button("hako:deny:x"), None);
    }
}
