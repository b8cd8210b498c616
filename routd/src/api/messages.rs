//! `POST /v1/messages`: a chat's message in, checked, stored once, answered by a turn.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use hako_shared::GroupFolder;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{MessageKind, PostMessage, Posted};
use hako_shared::http::{ApiJson, NoToken};
use hako_shared::ids::is_valid_id;
use sha2::{Digest, Sha256};

use super::{AppState, MAX_FIELD, check_text, is_channel, new_message_id};
use crate::commands;
use crate::error as e;
use crate::error::ApiFailure;
use crate::routing::parse_jid;
use crate::state::now_ms;
use crate::store::{Ingested, NewInbound};
use hako_shared::http as h;

hako_shared::error_responses!(PostMessageErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`messages:write`"], h::FOLDER_FORBIDDEN, e::ID_CONFLICT, h::BODY_TOO_LARGE });

/// Append an inbound chat message. A message for a chat no route takes is stored all the
/// same (`routed: false`) and answered once a route appears.
#[utoipa::path(post, path = "/v1/messages", tag = "messages", security(("bearer" = [])),
    request_body = PostMessage,
    responses(
        (status = 201, description = "Appended", body = Posted),
        (status = 200, description = "This id was posted before with the same body (`duplicate: true`)", body = Posted),
        PostMessageErrors,
        NoToken,
    ))]
pub(super) async fn post_message(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(mut m): ApiJson<PostMessage>,
) -> Result<(StatusCode, Json<Posted>), ApiFailure> {
    who.require(scopes::MESSAGES_WRITE)?;
    if let Some(id) = &m.id
        && !is_valid_id(id)
    {
        return Err(ApiFailure::Invalid(format!(
            "id: {}",
            hako_shared::ids::ID_GRAMMAR
        )));
    }
    let jid = parse_jid("chat_jid", &m.chat_jid).map_err(ApiFailure::Invalid)?;
    check_text("sender", &m.sender, 1, MAX_FIELD)?;
    if let Some(n) = &m.sender_name {
        check_text("sender_name", n, 0, MAX_FIELD)?;
    }
    if let Some(r) = &m.reply_to {
        check_text("reply_to", r, 1, 128)?;
    }
    if m.content.is_empty() || m.content.len() > sh.cfg.max_content {
        return Err(ApiFailure::Invalid(format!(
            "content must be 1-{} bytes, not {}",
            sh.cfg.max_content,
            m.content.len()
        )));
    }
    if m.timestamp.is_some_and(|t| t < 0) {
        return Err(ApiFailure::Invalid(
            "timestamp: Unix milliseconds, not negative".into(),
        ));
    }
    let folder = sh.routing.resolve(&m.chat_jid);
    if is_channel(&who) && !sh.cfg.channel_reaches(&m.chat_jid) {
        return Err(ApiFailure::FolderForbidden(format!(
            "the channel identity does not serve chat {} (ROUTD_CHANNEL_CHATS; a folder's web: \
             chats are for the callers of that folder)",
            m.chat_jid
        )));
    }
    if !who.is_unbound() && !folder.as_deref().is_some_and(|f| who.covers_folder(f)) {
        return Err(ApiFailure::FolderForbidden(format!(
            "chat {} does not route to a folder this token covers",
            m.chat_jid
        )));
    }
    let id = m.id.clone().unwrap_or_else(new_message_id);
    m.id = Some(id.clone());
    let hash = Sha256::digest(serde_json::to_vec(&m).map_err(ApiFailure::internal)?);
    let hash: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let command = commands::parse(&m.content);
    let sender = m.sender.clone();
    let now = now_ms();
    let ingested = sh
        .store
        .ingest(NewInbound {
            id: id.clone(),
            chat_jid: jid.clone(),
            kind: if command.is_some() {
                MessageKind::Command
            } else {
                MessageKind::Message
            },
            sender: m.sender,
            sender_name: m.sender_name,
            content: m.content,
            timestamp: m.timestamp.unwrap_or(now),
            reply_to: m.reply_to,
            body_hash: hash,
            now,
        })
        .await?;
    let posted = |seq, duplicate| Posted {
        id: id.clone(),
        seq,
        chat_jid: m.chat_jid.clone(),
        routed: folder.is_some(),
        folder: folder.clone().map(GroupFolder::into_string),
        duplicate,
    };
    match ingested {
        Ingested::New(seq) => {
            sh.metrics.messages_in.inc();
            sh.chats.told(&jid, false);
            match command {
                // A chat adapter (or the operator) says who wrote; anyone else's
                // `sender` is only a claim (it names no approver).
                Some(c) => {
                    let vouched = is_channel(&who) || who.is_unbound();
                    commands::handle(&sh, c, &jid, &sender, vouched, &id).await?
                }
                None => sh.turns.wake.notify_one(),
            }
            Ok((StatusCode::CREATED, Json(posted(seq, false))))
        }
        Ingested::Duplicate(seq) => {
            sh.metrics.duplicates.inc();
            Ok((StatusCode::OK, Json(posted(seq, true))))
        }
        Ingested::Conflict => Err(ApiFailure::IdConflict(id)),
    }
}
