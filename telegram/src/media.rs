//! Inbound media (`specs/channels.md`, Media): a photo, voice note, audio, video or document
//! in a message the agent is to answer is fetched from Telegram (`getFile`, then the file
//! itself, at most `TELEGRAM_MEDIA_MAX`), uploaded to routd for the folder the chat routes to,
//! and named in the message's text by where the agent finds it:
//! `[photo: /workspace/media/tg111_1001.jpg (image/jpeg, 48213 bytes)]`.
//!
//! The file is named after the chat and message ids, so a replayed update uploads onto
//! itself and posts the same text (routd answers that as a duplicate). A file that cannot be
//! had (too large, refused by Telegram, the folder's media directory full) is named as such
//! in the text instead, and the message still reaches the agent; one that could be had later
//! (Telegram or routd unavailable) leaves the update to be handled again.

use frankenstein::types::{File, Message};
use hako_shared::media::sanitize_name;
use serde_json::json;

use crate::Shared;
use crate::botapi::BotError;
use crate::routd::PostError;

/// A file a message carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attachment<'a> {
    /// `photo`, `voice`, `audio`, `video` or `document`.
    pub kind: &'static str,
    pub file_id: &'a str,
    /// Its size, when Telegram says.
    pub size: Option<u64>,
    /// The name it is saved under.
    pub name: String,
    pub mime: String,
}

/// The file `m` carries, if any. Of a photo's sizes, the largest that fits `max`.
pub(crate) fn attachment(m: &Message, max: u64) -> Option<Attachment<'_>> {
    let base = format!("tg{}_{}", m.chat.id, m.message_id);
    let named = |original: Option<&String>, ext: &str| {
        let wanted = match original {
            Some(n) => format!("{base}_{n}"),
            None => format!("{base}{ext}"),
        };
        sanitize_name(&wanted).unwrap_or_else(|| format!("{base}{ext}"))
    };
    let mime = |m: Option<&String>, default: &str| m.cloned().unwrap_or_else(|| default.into());
    if let Some(sizes) = &m.photo {
        let area = |p: &&frankenstein::types::PhotoSize| u64::from(p.width) * u64::from(p.height);
        let p = sizes
            .iter()
            .filter(|p| p.file_size.is_none_or(|s| s <= max))
            .max_by_key(area)
            .or_else(|| sizes.iter().max_by_key(area))?;
        return Some(Attachment {
            kind: "photo",
            file_id: &p.file_id,
            size: p.file_size,
            name: format!("{base}.jpg"),
            mime: "image/jpeg".into(),
        });
    }
    if let Some(v) = &m.voice {
        return Some(Attachment {
            kind: "voice",
            file_id: &v.file_id,
            size: v.file_size,
            name: format!("{base}.ogg"),
            mime: mime(v.mime_type.as_ref(), "audio/ogg"),
        });
    }
    if let Some(a) = &m.audio {
        return Some(Attachment {
            kind: "audio",
            file_id: &a.file_id,
            size: a.file_size,
            name: named(a.file_name.as_ref(), ".mp3"),
            mime: mime(a.mime_type.as_ref(), "audio/mpeg"),
        });
    }
    if let Some(v) = &m.video {
        return Some(Attachment {
            kind: "video",
            file_id: &v.file_id,
            size: v.file_size,
            name: named(v.file_name.as_ref(), ".mp4"),
            mime: mime(v.mime_type.as_ref(), "video/mp4"),
        });
    }
    if let Some(d) = &m.document {
        return Some(Attachment {
            kind: "document",
            file_id: &d.file_id,
            size: d.file_size,
            name: named(d.file_name.as_ref(), ".bin"),
            mime: mime(d.mime_type.as_ref(), "application/octet-stream"),
        });
    }
    None
}

/// Fetches `a` and saves it for the agent of `chat`; answers the line the message carries
/// for it. `Err`: Telegram or routd is unavailable, and the update is handled again later.
pub(crate) async fn receive(
    sh: &Shared,
    chat: &str,
    a: &Attachment<'_>,
) -> Result<String, PostError> {
    let max = sh.cfg.media_max;
    let not = |why: String| Ok(format!("[{} not received: {why}]", a.kind));
    if let Some(size) = a.size.filter(|&s| s > max) {
        return not(format!(
            "{size} bytes, more than the {max} bytes this bot fetches"
        ));
    }
    let transient = |e: BotError| PostError::Unavailable(format!("Telegram: {e}"));
    let file = match sh
        .bot
        .call::<_, File>("getFile", &json!({"file_id": a.file_id}), None)
        .await
    {
        Ok(f) => f,
        Err(e @ BotError::Refused { .. }) => return not(format!("Telegram: {e}")),
        Err(e) => return Err(transient(e)),
    };
    let Some(path) = file.file_path else {
        return not("Telegram gave no file path".into());
    };
    let data = match sh.bot.download(&path, max).await {
        Ok(d) => d,
        Err(e @ BotError::Refused { .. }) => return not(format!("Telegram: {e}")),
        Err(e) => return Err(transient(e)),
    };
    match sh.routd.put_media(chat, &a.name, data).await {
        Ok(saved) => Ok(format!(
            "[{}: {} ({}, {} bytes)]",
            a.kind, saved.path, a.mime, saved.bytes
        )),
        Err(PostError::Refused { status, body }) => {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let why = v["message"].as_str().map_or(body.clone(), str::to_owned);
            tracing::warn!(chat, status, %why, "routd refused a file");
            Ok(format!("[{} not saved: {why}]", a.kind))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(extra: serde_json::Value) -> Message {
        let mut m = json!({
            "message_id": 1001, "date": 1,
            "chat": {"id": -100200, "type": "supergroup"},
        });
        m.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(m).unwrap()
    }

    #[test]
    fn each_kind_is_named_after_the_chat_and_message() {
        let m = message(json!({"photo": [
            {"file_id": "small", "file_unique_id": "u1", "width": 90, "height": 90, "file_size": 1000},
            {"file_id": "big", "file_unique_id": "u2", "width": 1280, "height": 1280, "file_size": 900000},
            {"file_id": "huge", "file_unique_id": "u3", "width": 4000, "height": 4000, "file_size": 30000000},
        ]}));
        let a = attachment(&m, 20 << 20).unwrap();
        assert_eq!(
            (a.kind, a.file_id, a.name.as_str()),
            ("photo", "big", "tg-100200_1001.jpg"),
            "the largest size that fits"
        );
        let a = attachment(&m, 100).unwrap();
        assert_eq!(
            a.file_id, "huge",
            "none fits: the largest, to be named too large"
        );

        let m = message(json!({"document": {"file_id": "d", "file_unique_id": "u",
            "file_name": "../../etc/My Report.pdf", "mime_type": "application/pdf"}}));
        let a = attachment(&m, 1 << 20).unwrap();
        assert_eq!(a.name, "tg-100200_1001_.._.._etc_My_Report.pdf");
        hako_shared::media::check_name(&a.name).unwrap();
        assert_eq!(a.mime, "application/pdf");

        let m = message(json!({"voice": {"file_id": "v", "file_unique_id": "u", "duration": 3}}));
        let a = attachment(&m, 1 << 20).unwrap();
        assert_eq!(
            (a.kind, a.name.as_str(), a.mime.as_str()),
            ("voice", "tg-100200_1001.ogg", "audio/ogg")
        );

        assert!(attachment(&message(json!({"text": "hi"})), 1 << 20).is_none());
    }
}
