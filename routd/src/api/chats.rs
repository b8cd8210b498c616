//! `/v1/chats/{jid}`: a chat's history, paged by seq, and its live stream (server-sent events, resumed with `Last-Event-ID`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::Stream;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{MessagePage, MessageView};
use hako_shared::http::{ApiQuery, NoToken};
use serde::Deserialize;
use tokio::sync::broadcast;

use super::{AppState, chat_folder};
use crate::chats::Appended;
use crate::error::ApiFailure;
use crate::routing::check_jid;
use crate::state::Shared;
use hako_shared::http as h;

/// History paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryQuery {
    /// Messages with seq below this (older).
    before: Option<i64>,
    /// Messages with seq above this (newer), oldest first.
    after: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

hako_shared::error_responses!(ChatMessagesErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`chats:read`"], h::NOT_FOUND });

/// A chat's messages, in log order (inbound, replies and notices).
#[utoipa::path(get, path = "/v1/chats/{jid}/messages", tag = "chats", security(("bearer" = [])),
    params(("jid" = String, Path, description = "The chat (percent-encoded; 1-256 characters, no control character)", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"), HistoryQuery),
    responses(
        (status = 200, description = "A page of the history", body = MessagePage),
        ChatMessagesErrors,
        NoToken,
    ))]
pub(super) async fn chat_messages(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(jid): Path<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> Result<Json<MessagePage>, ApiFailure> {
    who.require(scopes::CHATS_READ)?;
    check_jid("jid", &jid).map_err(ApiFailure::Invalid)?;
    chat_folder(&sh, &who, &jid)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let messages = sh.store.messages(&jid, q.before, q.after, limit).await?;
    let next_before = (messages.len() == limit)
        .then(|| messages.first().map(|m| m.seq))
        .flatten();
    Ok(Json(MessagePage {
        messages,
        next_before,
    }))
}

/// Where a chat stream starts.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct EventsQuery {
    /// Start after this seq (what `Last-Event-ID` says, for clients that cannot set headers);
    /// without either, the stream starts with the next message.
    after: Option<i64>,
}

/// One chat's stream: the log from where the client stands, then each new message.
pub(super) struct ChatStream {
    sh: Arc<Shared>,
    rx: broadcast::Receiver<Appended>,
    chat: String,
    last: i64,
    pending: VecDeque<MessageView>,
    /// Who opened the stream: it ends when their token expires or is revoked, or the chat
    /// stops routing to a folder they cover.
    who: Principal,
    _pass: hako_shared::watchers::Pass,
}

/// How often an open stream looks at its token again (revocations arrive every
/// `AUTHD_REVOKED_POLL`).
pub(super) const STREAM_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl ChatStream {
    /// Whether the stream's caller may still read it: its token not expired or revoked, its
    /// browser session not ended, and the chat still routed to a folder it covers (a chat
    /// re-routed to another tenant's group is no longer this caller's).
    fn token_holds(&self) -> bool {
        if let Some(c) = self.who.claims() {
            let now = hako_shared::auth::now_secs();
            if c.exp <= now
                || self.sh.verifier.is_revoked(&c.jti)
                || self.sh.signed_out.contains(&c.jti)
            {
                return false;
            }
        }
        chat_folder(&self.sh, &self.who, &self.chat).is_ok()
    }

    async fn next(&mut self) -> Option<MessageView> {
        loop {
            if !self.token_holds() {
                tracing::info!(chat = %self.chat, "a chat stream's token expired or was revoked, or the chat left its folders: the stream ends");
                return None;
            }
            if let Some(m) = self.pending.pop_front() {
                self.last = m.seq;
                return Some(m);
            }
            // Always from the log: a reconnecting client, or one that fell behind, gets
            // exactly what it missed, in order.
            match self
                .sh
                .store
                .messages(&self.chat, None, Some(self.last), 500)
                .await
            {
                Ok(batch) if !batch.is_empty() => {
                    self.pending.extend(batch);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "reading a chat stream failed");
                    return None;
                }
            }
            loop {
                if !self.token_holds() {
                    tracing::info!(chat = %self.chat, "a chat stream's token expired or was revoked, or the chat left its folders: the stream ends");
                    return None;
                }
                let got = tokio::select! {
                    r = self.rx.recv() => r,
                    () = tokio::time::sleep(STREAM_RECHECK) => continue,
                    () = self.sh.stopping.cancelled() => return None,
                };
                match got {
                    Ok(a) if *a.chat == *self.chat => break,
                    Ok(_) => continue,
                    Err(broadcast::error::RecvError::Lagged(_)) => break,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        }
    }
}

hako_shared::error_responses!(ChatEventsErrors { h::INVALID_REQUEST, h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`chats:read`"], h::NOT_FOUND, h::TOO_MANY_STREAMS });

/// Server-sent events of a chat: every new message (inbound, the agent's replies, notices),
/// event name `message`, id its seq, data the message. A client reconnecting with
/// `Last-Event-ID` gets exactly what it missed, replayed from the log.
#[utoipa::path(get, path = "/v1/chats/{jid}/events", tag = "chats", security(("bearer" = [])),
    params(
        ("jid" = String, Path, description = "The chat (percent-encoded; 1-256 characters, no control character)", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"),
        ("Last-Event-ID" = Option<i64>, Header, description = "The last seq the client has"),
        EventsQuery,
    ),
    responses(
        (status = 200, description = "`message` events, each `data` one message", content_type = "text/event-stream", body = MessageView),
        ChatEventsErrors,
        NoToken,
    ))]
pub(super) async fn chat_events(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(jid): Path<String>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiFailure> {
    who.require(scopes::CHATS_READ)?;
    check_jid("jid", &jid).map_err(ApiFailure::Invalid)?;
    chat_folder(&sh, &who, &jid)?;
    let from_header = match headers.get("last-event-id") {
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                .ok_or_else(|| ApiFailure::Invalid("Last-Event-ID: a message seq".into()))?,
        ),
        None => None,
    };
    let pass = sh
        .chats
        .watchers
        .enter(&who.bound_key(), !who.is_unbound())?;
    // Subscribed before the first read, so nothing appended in between is missed.
    let rx = sh.chats.appended.subscribe();
    let last = match from_header.or(q.after) {
        Some(seq) => seq,
        None => sh
            .store
            .messages(&jid, None, None, 1)
            .await?
            .last()
            .map_or(0, |m| m.seq),
    };
    let st = ChatStream {
        sh: sh.clone(),
        rx,
        chat: jid,
        last,
        pending: VecDeque::new(),
        who,
        _pass: pass,
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        let m = st.next().await?;
        let ev = SseEvent::default()
            .id(m.seq.to_string())
            .event("message")
            .data(serde_json::to_string(&m).unwrap_or_default());
        Some((Ok(ev), st))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}
