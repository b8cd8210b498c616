//! The HTTP API (`specs/routd.md`, `routd/openapi.json`). Every route checks its scope; a
//! folder-bound caller reaches only chats that route to its folders, and its groups and turns
//! (others answer 404, or 403 where it asks to write). JIDs and folders in a path are
//! percent-encoded (`web:acme%2Fsupport`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::{FromRef, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use futures_util::stream::Stream;
use hako_shared::GroupFolder;
use hako_shared::approvals::ApprovalPolicy;
use hako_shared::auth::{Principal, Verifier, scopes};
use hako_shared::chat::{
    GroupConfig, GroupList, GroupView, MessageKind, MessagePage, MessageView, NewRoute, NewWebhook,
    PostMessage, Posted, RouteList, RouteView, TurnList, TurnState, TurnView, WebhookList,
    WebhookView,
};
use hako_shared::http::{ApiInfo, ApiJson, ApiQuery, ErrorBody, api_router};
use hako_shared::ids::is_valid_id;
use hako_shared::runs::GroupSpec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::broadcast;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod approvals;

use crate::commands;
use crate::error::ApiFailure;
use crate::routing::check_jid;
use crate::store::{AuditRow, GroupRow, Ingested, NewInbound};
use crate::turns::routd_turn;
use crate::{Appended, Shared, now_ms};

/// What routd's document says of it.
pub(crate) const INFO: ApiInfo = ApiInfo {
    name: "routd",
    version: env!("CARGO_PKG_VERSION"),
    description: "hako's routing daemon: the message log, groups and routes, turns, and the delivery of the agent's replies.",
};

/// The router's state.
#[derive(Clone)]
pub(crate) struct AppState(pub Arc<Shared>);

impl FromRef<AppState> for Verifier {
    fn from_ref(s: &AppState) -> Verifier {
        s.0.verifier.clone()
    }
}

/// The API routes, each documented from its handler. Routes are only ever added here,
/// through `routes!`, so nothing is served that the document does not list.
pub(crate) fn documented() -> OpenApiRouter<AppState> {
    api_router::<AppState>(INFO)
        .routes(routes!(post_message))
        .routes(routes!(chat_messages))
        .routes(routes!(chat_events))
        .routes(routes!(put_group, get_group, delete_group))
        .routes(routes!(list_groups))
        .routes(routes!(add_route, list_routes))
        .routes(routes!(delete_route))
        .routes(routes!(add_webhook, list_webhooks))
        .routes(routes!(delete_webhook))
        .routes(routes!(get_turn))
        .routes(routes!(list_turns))
        .routes(routes!(turn_tool))
        .routes(routes!(turn_send))
        .routes(routes!(usage))
        .routes(routes!(list_tasks))
        .routes(routes!(cancel_task))
        .routes(routes!(audit))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::get_approval, approvals::decide_approval))
}

/// The longest sender, display name or reply-to accepted.
const MAX_FIELD: usize = 256;
/// The largest route position accepted, either way (JSON-safe, and far from overflow).
const MAX_POSITION: i64 = hako_shared::chat::MAX_ROUTE_POSITION;

fn check_text(field: &str, value: &str, min: usize, max: usize) -> Result<(), ApiFailure> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(ApiFailure::Invalid(format!(
            "{field} must be {min}-{max} characters, not {n}"
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(ApiFailure::Invalid(format!(
            "{field} holds a control character"
        )));
    }
    Ok(())
}

fn new_message_id() -> String {
    hako_shared::ids::random_id("m-", 12)
}

async fn audit_row(
    sh: &Shared,
    who: &Principal,
    action: &str,
    folder: Option<&str>,
    outcome: &str,
    detail: String,
) {
    let r = AuditRow {
        id: 0,
        at: now_ms(),
        actor: who.subject().to_owned(),
        action: action.to_owned(),
        folder: folder.map(str::to_owned),
        outcome: outcome.to_owned(),
        detail,
    };
    if let Err(e) = sh.store.audit(r).await {
        tracing::error!(error = %e, "writing the audit log failed");
    }
}

/// Whether a webhook URL names a target inside the host or its network: a special address
/// (loopback, link-local, private, …) or a `localhost` name.
fn private_target(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return true;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => hako_shared::egress::is_special(ip) || hako_shared::egress::never(ip),
        Err(_) => {
            let d = bare.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
    }
}

/// Whether `who` is the `channel` service identity (a chat adapter): unbound, yet it reaches
/// only the chats `ROUTD_CHANNEL_CHATS` names, never a folder's `web:` chats.
fn is_channel(who: &Principal) -> bool {
    who.claims()
        .is_some_and(|c| c.typ == hako_shared::auth::TokenType::Service && c.sub == "channel")
}

/// The folder a chat routes to, when the caller may see the chat.
fn chat_folder(sh: &Shared, who: &Principal, chat: &str) -> Result<Option<String>, ApiFailure> {
    let folder = sh.routing.resolve(chat);
    if is_channel(who) && !sh.cfg.channel_reaches(chat) {
        return Err(ApiFailure::NotFound(format!("no chat {chat}")));
    }
    if who.is_unbound() {
        return Ok(folder);
    }
    match folder {
        Some(f) if who.covers_folder(&f) => Ok(Some(f)),
        _ => Err(ApiFailure::NotFound(format!("no chat {chat}"))),
    }
}

/// Append an inbound chat message. A message for a chat no route takes is stored all the
/// same (`routed: false`) and answered once a route appears.
#[utoipa::path(post, path = "/v1/messages", tag = "messages", security(("bearer" = [])),
    request_body = PostMessage,
    responses(
        (status = 201, description = "Appended", body = Posted),
        (status = 200, description = "This id was posted before with the same body (`duplicate: true`)", body = Posted),
        (status = 400, description = "`invalid_json` (unknown fields too), `invalid_request` (names the field: sizes, characters, the id's grammar)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`messages:write`), `folder_forbidden` (a folder-bound caller posting to a chat outside its folders)", body = ErrorBody),
        (status = 409, description = "`id_conflict`: the id exists with another body", body = ErrorBody),
        (status = 413, description = "`body_too_large`", body = ErrorBody),
    ))]
async fn post_message(
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
    check_jid("chat_jid", &m.chat_jid).map_err(ApiFailure::Invalid)?;
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
            chat_jid: m.chat_jid.clone(),
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
        folder: folder.clone(),
        duplicate,
    };
    match ingested {
        Ingested::New(seq) => {
            sh.metrics.messages_in.inc();
            let _ = sh.appended.send(Appended {
                chat: m.chat_jid.as_str().into(),
            });
            match command {
                Some(c) => commands::handle(&sh, c, &m.chat_jid, &sender, &id).await?,
                None => sh.wake.notify_one(),
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

/// History paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    /// Messages with seq below this (older).
    before: Option<i64>,
    /// Messages with seq above this (newer), oldest first.
    after: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// A chat's messages, in log order (inbound, replies and notices).
#[utoipa::path(get, path = "/v1/chats/{jid}/messages", tag = "chats", security(("bearer" = [])),
    params(("jid" = String, Path, description = "The chat (percent-encoded; 1-256 characters, no control character)", min_length = 1, max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"), HistoryQuery),
    responses(
        (status = 200, description = "A page of the history", body = MessagePage),
        (status = 400, description = "`invalid_query`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`chats:read`)", body = ErrorBody),
        (status = 404, description = "A chat the caller does not cover", body = ErrorBody),
    ))]
async fn chat_messages(
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
struct EventsQuery {
    /// Start after this seq (what `Last-Event-ID` says, for clients that cannot set headers);
    /// without either, the stream starts with the next message.
    after: Option<i64>,
}

/// One chat's stream: the log from where the client stands, then each new message.
struct ChatStream {
    sh: Arc<Shared>,
    rx: broadcast::Receiver<Appended>,
    chat: String,
    last: i64,
    pending: VecDeque<MessageView>,
    /// The token the stream was opened with: it ends when that expires or is revoked.
    claims: Option<Arc<hako_shared::auth::Claims>>,
    _pass: hako_shared::watchers::Pass,
}

/// How often an open stream looks at its token again (revocations arrive every
/// `AUTHD_REVOKED_POLL`).
const STREAM_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl ChatStream {
    /// Whether the stream's token still holds (not expired, not revoked).
    fn token_holds(&self) -> bool {
        let Some(c) = &self.claims else {
            return true;
        };
        let now = hako_shared::auth::now_secs();
        c.exp > now && !self.sh.verifier.is_revoked(&c.jti)
    }

    async fn next(&mut self) -> Option<MessageView> {
        loop {
            if !self.token_holds() {
                tracing::info!(chat = %self.chat, "a chat stream's token expired or was revoked: the stream ends");
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
                    tracing::info!(chat = %self.chat, "a chat stream's token expired or was revoked: the stream ends");
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
        (status = 400, description = "`invalid_request`, `invalid_query`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`chats:read`)", body = ErrorBody),
        (status = 404, description = "A chat the caller does not cover", body = ErrorBody),
        (status = 429, description = "`too_many_streams`", body = ErrorBody),
    ))]
async fn chat_events(
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
    let pass = sh.watchers.enter(&who.bound_key())?;
    // Subscribed before the first read, so nothing appended in between is missed.
    let rx = sh.appended.subscribe();
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
        claims: who.claims().cloned().map(Arc::new),
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

/// The most chat sessions a group's view lists.
const VIEW_SESSIONS: usize = 20;

async fn group_view(sh: &Shared, g: GroupRow) -> Result<GroupView, ApiFailure> {
    let sessions = sh.store.sessions_of(&g.folder, VIEW_SESSIONS).await?;
    Ok(GroupView {
        folder: GroupFolder::new(&g.folder).map_err(ApiFailure::internal)?,
        name: g.name,
        system_prompt: g.system_prompt,
        grants: g.grants,
        group: g.spec,
        approvals: g.approvals,
        sessions,
        updated_at: g.updated_at,
    })
}

fn parse_folder(raw: &str) -> Result<GroupFolder, ApiFailure> {
    GroupFolder::new(raw).map_err(|e| ApiFailure::Invalid(format!("folder: {e}")))
}

/// Create or replace a group. Its container settings are checked as runed checks them; a
/// folder-bound caller may set the name and the system prompt of its own groups only (routd
/// runs the group with its own authority, so grants and any container setting stay with an
/// unbound caller).
#[utoipa::path(put, path = "/v1/groups/{folder}", tag = "groups", security(("bearer" = [])),
    params(("folder" = GroupFolder, Path, description = "The group folder (percent-encoded)")),
    request_body = GroupConfig,
    responses(
        (status = 201, description = "Created", body = GroupView),
        (status = 200, description = "Replaced", body = GroupView),
        (status = 400, description = "`invalid_json`, `invalid_request` (names the field), `invalid_group` (names the setting)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:write`), `folder_forbidden`", body = ErrorBody),
    ))]
async fn put_group(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(folder): Path<String>,
    ApiJson(cfg): ApiJson<GroupConfig>,
) -> Result<(StatusCode, Json<GroupView>), ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    let folder = parse_folder(&folder)?;
    who.require_folder(folder.as_str())?;
    check_text("name", &cfg.name, 1, 128)?;
    if cfg.system_prompt.len() > 64 << 10 {
        return Err(ApiFailure::Invalid("system_prompt: at most 64 KiB".into()));
    }
    // The grammar's one parser (hako_shared::grants): a bad rule is named, never stored.
    hako_shared::grants::Grants::parse(&cfg.grants, cfg.group.trust)
        .map_err(|e| ApiFailure::Invalid(format!("grants: {e}")))?;
    cfg.group.validate()?;
    cfg.approvals.validate().map_err(ApiFailure::Invalid)?;
    if !who.is_unbound()
        && (cfg.group != GroupSpec::default()
            || !cfg.grants.is_empty()
            || cfg.approvals != ApprovalPolicy::default())
    {
        let refused = "a folder-bound caller can set a group's name and system prompt only";
        audit_row(
            &sh,
            &who,
            "group.put",
            Some(folder.as_str()),
            "folder_forbidden",
            String::new(),
        )
        .await;
        return Err(ApiFailure::FolderForbidden(refused.into()));
    }
    let (row, created) = if who.is_unbound() {
        let row = GroupRow {
            folder: folder.to_string(),
            name: cfg.name,
            system_prompt: cfg.system_prompt,
            grants: cfg.grants,
            spec: cfg.group,
            approvals: cfg.approvals,
            updated_at: now_ms(),
        };
        let created = sh.store.put_group(row.clone()).await?;
        (row, created)
    } else {
        tenant_put(&sh, &who, &folder, cfg.name, cfg.system_prompt).await?
    };
    sh.routing.reload(&sh.store).await?;
    sh.wake.notify_one();
    audit_row(
        &sh,
        &who,
        "group.put",
        Some(folder.as_str()),
        "ok",
        String::new(),
    )
    .await;
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(group_view(&sh, row).await?),
    ))
}

/// A folder-bound caller's `PUT`: the name and the prompt of a group it covers, and nothing
/// else. An existing group keeps what the operator set (grants, model, budget, limits); a new
/// one starts from its nearest ancestor group's settings (never main, never wider), counts
/// against that ancestor's budget (the gateway meters subtrees) and against
/// `ROUTD_MAX_TENANT_GROUPS` under the caller's folder.
async fn tenant_put(
    sh: &Shared,
    who: &Principal,
    folder: &GroupFolder,
    name: String,
    system_prompt: String,
) -> Result<(GroupRow, bool), ApiFailure> {
    let now = now_ms();
    if sh
        .store
        .rename_group(folder.as_str(), name.clone(), system_prompt.clone(), now)
        .await?
    {
        let row = sh
            .store
            .group(folder.as_str())
            .await?
            .ok_or_else(|| ApiFailure::NotFound(format!("no group {folder}")))?;
        return Ok((row, false));
    }
    let root = who.folder().unwrap_or(folder.as_str());
    let max = sh.cfg.max_tenant_groups;
    if sh.store.groups_under(root).await? >= max {
        return Err(ApiFailure::TooManyGroups(format!(
            "{root} has {max} groups, the most a tenant may make (ROUTD_MAX_TENANT_GROUPS)"
        )));
    }
    let segments: Vec<&str> = folder.segments().collect();
    let mut parent = None;
    for n in (1..segments.len()).rev() {
        if let Some(g) = sh.store.group(&segments[..n].join("/")).await? {
            parent = Some(g);
            break;
        }
    }
    let (grants, spec, approvals) = match parent {
        Some(p) => {
            let mut spec = p.spec;
            if spec.trust == hako_shared::runs::Trust::Main {
                spec.trust = hako_shared::runs::Trust::Untrusted;
            }
            // Its ask rules keep their approvers: a sub-group is no way around them.
            (p.grants, spec, p.approvals)
        }
        None => Default::default(),
    };
    let row = GroupRow {
        folder: folder.to_string(),
        name,
        system_prompt,
        grants,
        spec,
        approvals,
        updated_at: now,
    };
    let created = sh.store.put_group(row.clone()).await?;
    Ok((row, created))
}

/// One group.
#[utoipa::path(get, path = "/v1/groups/{folder}", tag = "groups", security(("bearer" = [])),
    params(("folder" = GroupFolder, Path, description = "The group folder (percent-encoded)")),
    responses(
        (status = 200, description = "The group", body = GroupView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:read`)", body = ErrorBody),
        (status = 404, description = "No such group, or not the caller's", body = ErrorBody),
    ))]
async fn get_group(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(folder): Path<String>,
) -> Result<Json<GroupView>, ApiFailure> {
    who.require(scopes::GROUPS_READ)?;
    let missing = || ApiFailure::NotFound(format!("no group {folder}"));
    let Ok(f) = GroupFolder::new(&folder) else {
        return Err(missing());
    };
    if !who.covers_folder(f.as_str()) {
        return Err(missing());
    }
    let g = sh.store.group(f.as_str()).await?.ok_or_else(missing)?;
    Ok(Json(group_view(&sh, g).await?))
}

/// Remove a group, with its routes and session (its history stays in the log).
#[utoipa::path(delete, path = "/v1/groups/{folder}", tag = "groups", security(("bearer" = [])),
    params(("folder" = GroupFolder, Path, description = "The group folder (percent-encoded)")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:write`), `folder_forbidden`", body = ErrorBody),
        (status = 404, description = "No such group", body = ErrorBody),
    ))]
async fn delete_group(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(folder): Path<String>,
) -> Result<StatusCode, ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    let f = parse_folder(&folder)?;
    who.require_folder(f.as_str())?;
    if !sh.store.delete_group(f.as_str()).await? {
        return Err(ApiFailure::NotFound(format!("no group {f}")));
    }
    sh.routing.reload(&sh.store).await?;
    audit_row(
        &sh,
        &who,
        "group.delete",
        Some(f.as_str()),
        "ok",
        String::new(),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

/// The groups the caller covers.
#[utoipa::path(get, path = "/v1/groups", tag = "groups", security(("bearer" = [])),
    responses(
        (status = 200, description = "The groups, by folder", body = GroupList),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:read`)", body = ErrorBody),
    ))]
async fn list_groups(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<GroupList>, ApiFailure> {
    who.require(scopes::GROUPS_READ)?;
    let mut groups = Vec::new();
    for g in sh.store.groups().await? {
        if who.covers_folder(&g.folder) {
            groups.push(group_view(&sh, g).await?);
        }
    }
    Ok(Json(GroupList { groups }))
}

/// Add a route rule (unbound callers: a route decides where any chat goes).
#[utoipa::path(post, path = "/v1/routes", tag = "routes", security(("bearer" = [])),
    request_body = NewRoute,
    responses(
        (status = 201, description = "Added", body = RouteView),
        (status = 400, description = "`invalid_json`, `invalid_request`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:write`), `folder_forbidden` (a folder-bound caller)", body = ErrorBody),
    ))]
async fn add_route(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(r): ApiJson<NewRoute>,
) -> Result<(StatusCode, Json<RouteView>), ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "routes decide where any chat goes: only an unbound caller adds them".into(),
        ));
    }
    check_jid("pattern", &r.pattern).map_err(ApiFailure::Invalid)?;
    if r.position.is_some_and(|p| p.abs() > MAX_POSITION) {
        return Err(ApiFailure::Invalid(format!(
            "position must be between -{MAX_POSITION} and {MAX_POSITION}"
        )));
    }
    let row = sh
        .store
        .add_route(r.pattern, r.folder.to_string(), r.position, now_ms())
        .await?;
    sh.routing.reload(&sh.store).await?;
    sh.wake.notify_one();
    audit_row(
        &sh,
        &who,
        "route.add",
        Some(&row.folder),
        "ok",
        row.pattern.clone(),
    )
    .await;
    Ok((
        StatusCode::CREATED,
        Json(RouteView {
            id: row.id,
            pattern: row.pattern,
            folder: row.folder,
            position: row.position,
        }),
    ))
}

/// The route rules, in the order they are tried (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/routes", tag = "routes", security(("bearer" = [])),
    responses(
        (status = 200, description = "The rules", body = RouteList),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:read`)", body = ErrorBody),
    ))]
async fn list_routes(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<RouteList>, ApiFailure> {
    who.require(scopes::GROUPS_READ)?;
    let routes = sh
        .store
        .routes()
        .await?
        .into_iter()
        .filter(|r| who.covers_folder(&r.folder))
        .map(|r| RouteView {
            id: r.id,
            pattern: r.pattern,
            folder: r.folder,
            position: r.position,
        })
        .collect();
    Ok(Json(RouteList { routes }))
}

/// Remove a route rule.
#[utoipa::path(delete, path = "/v1/routes/{id}", tag = "routes", security(("bearer" = [])),
    params(("id" = i64, Path, description = "The rule")),
    responses(
        (status = 200, description = "The rule removed", body = RouteView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:write`), `folder_forbidden`", body = ErrorBody),
        (status = 404, description = "No such rule", body = ErrorBody),
    ))]
async fn delete_route(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<RouteView>, ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "only an unbound caller removes routes".into(),
        ));
    }
    let missing = || ApiFailure::NotFound(format!("no route {id}"));
    let n: i64 = id.parse().map_err(|_| missing())?;
    let row = sh.store.delete_route(n).await?.ok_or_else(missing)?;
    sh.routing.reload(&sh.store).await?;
    audit_row(
        &sh,
        &who,
        "route.delete",
        Some(&row.folder),
        "ok",
        row.pattern.clone(),
    )
    .await;
    Ok(Json(RouteView {
        id: row.id,
        pattern: row.pattern,
        folder: row.folder,
        position: row.position,
    }))
}

/// Register a channel's webhook (unbound callers). The secret is never shown again.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    request_body = NewWebhook,
    responses(
        (status = 201, description = "Registered", body = WebhookView),
        (status = 400, description = "`invalid_json`, `invalid_request` (prefix, URL, secret length)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`webhooks:write`), `folder_forbidden`", body = ErrorBody),
        (status = 409, description = "`webhook_exists`: the prefix has one", body = ErrorBody),
    ))]
async fn add_webhook(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(w): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Json<WebhookView>), ApiFailure> {
    who.require(scopes::WEBHOOKS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "webhooks serve whole channels: only an unbound caller registers them".into(),
        ));
    }
    check_text("prefix", &w.prefix, 1, 64)?;
    let url = reqwest::Url::parse(&w.url).map_err(|e| ApiFailure::Invalid(format!("url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ApiFailure::Invalid(
            "url: an http:// or https:// URL".into(),
        ));
    }
    if !sh.cfg.webhook_allow_private && private_target(&url) {
        return Err(ApiFailure::Invalid(format!(
            "url: {} is a loopback, link-local or private address (the daemons, the cloud's \
             metadata, the LAN); set ROUTD_WEBHOOK_ALLOW_PRIVATE=1 to allow it",
            url.host_str().unwrap_or("")
        )));
    }
    if !(16..=256).contains(&w.secret.len()) {
        return Err(ApiFailure::Invalid("secret: 16-256 bytes".into()));
    }
    let row = sh
        .store
        .add_webhook(w.prefix.clone(), w.url, w.secret, now_ms())
        .await?
        .ok_or(ApiFailure::WebhookExists(w.prefix))?;
    sh.reload_webhooks().await?;
    audit_row(
        &sh,
        &who,
        "webhook.add",
        None,
        "ok",
        format!("{} -> {}", row.prefix, url.host_str().unwrap_or("")),
    )
    .await;
    Ok((
        StatusCode::CREATED,
        Json(WebhookView {
            id: row.id,
            prefix: row.prefix,
            url: row.url,
        }),
    ))
}

/// The webhooks (never their secrets).
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    responses(
        (status = 200, description = "The webhooks", body = WebhookList),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`webhooks:read`), `folder_forbidden`", body = ErrorBody),
    ))]
async fn list_webhooks(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<WebhookList>, ApiFailure> {
    who.require(scopes::WEBHOOKS_READ)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "webhooks serve whole channels: only an unbound caller lists them".into(),
        ));
    }
    let webhooks = sh
        .store
        .webhooks()
        .await?
        .into_iter()
        .map(|w| WebhookView {
            id: w.id,
            prefix: w.prefix,
            url: w.url,
        })
        .collect();
    Ok(Json(WebhookList { webhooks }))
}

/// Remove a webhook (messages still delivering to it become undeliverable).
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = [])),
    params(("id" = i64, Path, description = "The webhook")),
    responses(
        (status = 204, description = "Removed"),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`webhooks:write`), `folder_forbidden`", body = ErrorBody),
        (status = 404, description = "No such webhook", body = ErrorBody),
    ))]
async fn delete_webhook(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiFailure> {
    who.require(scopes::WEBHOOKS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "only an unbound caller removes webhooks".into(),
        ));
    }
    let missing = || ApiFailure::NotFound(format!("no webhook {id}"));
    let n: i64 = id.parse().map_err(|_| missing())?;
    if !sh.store.delete_webhook(n).await? {
        return Err(missing());
    }
    sh.reload_webhooks().await?;
    audit_row(&sh, &who, "webhook.delete", None, "ok", n.to_string()).await;
    Ok(StatusCode::NO_CONTENT)
}

/// One turn: what ran, why, with which run.
#[utoipa::path(get, path = "/v1/turns/{turn_id}", tag = "turns", security(("bearer" = [])),
    params(("turn_id" = String, Path, description = "The turn")),
    responses(
        (status = 200, description = "The turn", body = TurnView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`turns:read`)", body = ErrorBody),
        (status = 404, description = "No such turn, or not the caller's", body = ErrorBody),
    ))]
async fn get_turn(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(turn_id): Path<String>,
) -> Result<Json<TurnView>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    let missing = || ApiFailure::NotFound(format!("no turn {turn_id}"));
    if !is_valid_id(&turn_id) {
        return Err(missing());
    }
    let t = sh.store.turn(&turn_id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&t.folder) {
        return Err(missing());
    }
    Ok(Json(sh.store.turn_view(t).await?))
}

/// Turn paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct TurnsQuery {
    /// Only this folder (and those below it).
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Only turns in this state (another answers 400 `invalid_query`).
    state: Option<TurnState>,
    /// The previous page's `next_before`.
    before: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// Turns, newest first (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/turns", tag = "turns", security(("bearer" = [])),
    params(TurnsQuery),
    responses(
        (status = 200, description = "A page of turns", body = TurnList),
        (status = 400, description = "`invalid_query` (an unknown state), `invalid_request` (a folder filter that is not a folder)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`turns:read`)", body = ErrorBody),
    ))]
async fn list_turns(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<TurnsQuery>,
) -> Result<Json<TurnList>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    if let Some(f) = &q.folder {
        parse_folder(f)?;
    }
    let folder = match (q.folder, who.folder()) {
        (Some(f), _) if !who.covers_folder(&f) => {
            return Ok(Json(TurnList {
                turns: vec![],
                next_before: None,
            }));
        }
        (Some(f), _) => Some(f),
        (None, bound) => bound.map(str::to_owned),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sh.store.turns(folder, q.state, q.before, limit).await?;
    let next_before = match rows.last() {
        Some(t) if rows.len() == limit => sh.store.turn_rowid(&t.turn_id).await?,
        _ => None,
    };
    let mut turns = Vec::with_capacity(rows.len());
    for t in rows {
        turns.push(sh.store.turn_view(t).await?);
    }
    Ok(Json(TurnList { turns, next_before }))
}

/// Usage filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct UsageQuery {
    /// Only this group.
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Only this UTC day, `YYYY-MM-DD`.
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    day: Option<String>,
    /// Only this turn.
    turn_id: Option<String>,
    /// At most this many rows, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// LLM usage through the gateway.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct UsageReport {
    /// Rows by group, day, turn, wire format and model, newest day first.
    rows: Vec<crate::store::UsageRow>,
    /// The rows' calls.
    calls: u64,
    /// The rows' input tokens.
    input_tokens: u64,
    /// The rows' output tokens.
    output_tokens: u64,
}

/// Tokens the groups' agents used through the LLM gateway, per group, UTC day, turn and model
/// (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/usage", tag = "turns", security(("bearer" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "Usage rows and their totals", body = UsageReport),
        (status = 400, description = "`invalid_query`, `invalid_request` (the folder or the day)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`turns:read`)", body = ErrorBody),
    ))]
async fn usage(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    if let Some(f) = &q.folder {
        parse_folder(f)?;
    }
    if let Some(d) = &q.day {
        let ok = d.len() == 10
            && d.bytes().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            });
        if !ok {
            return Err(ApiFailure::Invalid(format!(
                "day must be YYYY-MM-DD, not {d:?}"
            )));
        }
    }
    let folder = q.folder.or_else(|| who.folder().map(str::to_owned));
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let mut rows = sh.store.llm_usage(folder, q.day, q.turn_id, limit).await?;
    rows.retain(|r| who.covers_folder(&r.folder));
    let sum =
        |f: fn(&crate::store::UsageRow) -> u64| rows.iter().map(f).fold(0u64, u64::saturating_add);
    Ok(Json(UsageReport {
        calls: sum(|r| r.calls),
        input_tokens: sum(|r| r.input_tokens),
        output_tokens: sum(|r| r.output_tokens),
        rows,
    }))
}

/// Task filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct TaskQuery {
    /// Only this group and the groups below it.
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Also the tasks that are done or cancelled.
    all: Option<bool>,
}

/// A scheduled task as the API shows it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TaskView {
    /// `task-<hex>`.
    id: String,
    /// The group it belongs to.
    folder: String,
    /// The chat its prompt arrives in.
    chat_jid: String,
    /// The prompt.
    prompt: String,
    /// Its cron schedule (UTC), for a repeating task.
    cron: Option<String>,
    /// Its next firing (RFC 3339), while active.
    next_at: Option<String>,
    /// `active`, `done` or `cancelled`.
    state: String,
    /// How many times it fired.
    fired: i64,
    /// The turn that scheduled it.
    created_by: String,
}

/// `GET /v1/tasks` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct TaskList {
    /// Soonest first (at most 1000).
    tasks: Vec<TaskView>,
}

fn task_view(t: crate::store::TaskRow) -> TaskView {
    let at = |ms: i64| hako_shared::time::rfc3339(hako_shared::time::from_unix_millis(ms));
    TaskView {
        id: t.id,
        folder: t.folder,
        chat_jid: t.chat_jid,
        prompt: t.prompt,
        cron: t.cron,
        next_at: t.next_at.map(at),
        state: t.state,
        fired: t.fired,
        created_by: t.created_by,
    }
}

/// The scheduled tasks the caller's groups have (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/tasks", tag = "groups", security(("bearer" = [])),
    params(TaskQuery),
    responses(
        (status = 200, description = "The tasks, soonest first", body = TaskList),
        (status = 400, description = "`invalid_query`, `invalid_request` (the folder)", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:read`)", body = ErrorBody),
    ))]
async fn list_tasks(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<TaskQuery>,
) -> Result<Json<TaskList>, ApiFailure> {
    who.require(scopes::GROUPS_READ)?;
    let folder = match q.folder {
        Some(f) => Some(parse_folder(&f)?.to_string()),
        None => who.folder().map(str::to_owned),
    };
    let mut rows = sh.store.tasks_under(folder, q.all.unwrap_or(false)).await?;
    rows.retain(|t| who.covers_folder(&t.folder));
    Ok(Json(TaskList {
        tasks: rows.into_iter().map(task_view).collect(),
    }))
}

/// Cancel a scheduled task (the operator, or a tenant whose folder covers the task's group).
#[utoipa::path(delete, path = "/v1/tasks/{id}", tag = "groups", security(("bearer" = [])),
    params(("id" = String, Path, description = "The task")),
    responses(
        (status = 200, description = "Cancelled (or already over: its state says which)", body = TaskView),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`groups:write`)", body = ErrorBody),
        (status = 404, description = "No such task, or not the caller's", body = ErrorBody),
    ))]
async fn cancel_task(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<TaskView>, ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    let missing = || ApiFailure::NotFound(format!("no task {id}"));
    if !is_valid_id(&id) {
        return Err(missing());
    }
    let t = sh.store.task(&id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&t.folder) {
        return Err(missing());
    }
    if sh.store.cancel_task(&t.folder, &id, now_ms()).await? {
        sh.tasks_changed.notify_one();
        audit_row(&sh, &who, "task.cancel", Some(&t.folder), "ok", id.clone()).await;
    }
    let t = sh.store.task(&id).await?.ok_or_else(missing)?;
    Ok(Json(task_view(t)))
}

/// Audit paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// The previous page's `next_before`.
    before: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// `GET /v1/audit` answer, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
struct AuditPage {
    entries: Vec<AuditRow>,
    /// Pass as `before` for the next page.
    next_before: Option<i64>,
}

/// routd's audit log: every change to groups, routes and webhooks (unbound callers).
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the audit log", body = AuditPage),
        (status = 400, description = "`invalid_query`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`audit:read`), `folder_forbidden`", body = ErrorBody),
    ))]
async fn audit(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiFailure> {
    who.require(scopes::AUDIT_READ)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "the audit log spans every folder; a folder-bound token cannot read it".into(),
        ));
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let entries = sh.store.audit_rows(q.before, limit).await?;
    let next_before = (entries.len() == limit)
        .then(|| entries.last().map(|r| r.id))
        .flatten();
    Ok(Json(AuditPage {
        entries,
        next_before,
    }))
}

/// The turn a spawn token may act for: only its own turn, in its own folder, while it is
/// live. Anyone else gets 404 (the same answer as for no such turn).
async fn acting_turn(
    sh: &Shared,
    who: &Principal,
    turn_id: &str,
) -> Result<hako_mcp::Scope, ApiFailure> {
    who.require(scopes::TURNS_ACT)?;
    let turn_id = routd_turn(turn_id);
    let missing = || ApiFailure::NotFound(format!("no turn {turn_id}"));
    if !is_valid_id(turn_id) {
        return Err(missing());
    }
    if let Some(c) = who.claims() {
        let own = c.typ == hako_shared::auth::TokenType::Spawn
            && c.turn_id.as_deref().map(routd_turn) == Some(turn_id);
        if !own {
            return Err(missing());
        }
    }
    let t = sh.store.turn(turn_id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&t.folder) {
        return Err(missing());
    }
    crate::tools::scope_of(sh, &t).await?.ok_or_else(missing)
}

async fn act(
    sh: &Arc<Shared>,
    who: &Principal,
    turn_id: &str,
    tool: hako_shared::grants::Tool,
    args: serde_json::Map<String, serde_json::Value>,
) -> Result<Json<serde_json::Value>, ApiFailure> {
    let scope = acting_turn(sh, who, turn_id).await?;
    let backend = crate::tools::RoutdTools { sh: sh.clone() };
    Ok(Json(
        hako_mcp::dispatch(&backend, &scope, tool, args).await?,
    ))
}

/// One of the turn's tools over HTTP, with the run's spawn token: the same call, checks and
/// answer as over the turn's MCP socket (`mcp.sock`). The body is the tool's arguments.
#[utoipa::path(post, path = "/v1/turns/{turn_id}/tools/{tool}", tag = "tools", security(("bearer" = [])),
    params(
        ("turn_id" = String, Path, description = "The turn (routd's id, or runed's `<turn>.<try>` from the agent's input)"),
        ("tool" = String, Path, description = "send_message, get_history, set_status, schedule_task, list_tasks, cancel_task, reset_session, register_group, spawn_group"),
    ),
    request_body(content = Object, description = "The tool's arguments, as its MCP input schema says"),
    responses(
        (status = 200, description = "The tool's result", body = Object),
        (status = 400, description = "`invalid_arguments`, `invalid_json`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`turns:act`), `not_granted`", body = ErrorBody),
        (status = 404, description = "No such turn or tool, or not the caller's; `not_found`", body = ErrorBody),
        (status = 409, description = "`turn_ended`, `conflict`", body = ErrorBody),
    ))]
async fn turn_tool(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path((turn_id, tool)): Path<(String, String)>,
    ApiJson(args): ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Value>, ApiFailure> {
    let tool = hako_shared::grants::Tool::from_name(&tool)
        .ok_or_else(|| ApiFailure::NotFound(format!("no tool {tool:?}")))?;
    act(&sh, &who, &turn_id, tool, args).await
}

/// `send_message` by its contract name: an `Idempotency-Key` header makes a retry send
/// nothing twice.
#[utoipa::path(post, path = "/v1/turns/{turn_id}/send", tag = "tools", security(("bearer" = [])),
    params(
        ("turn_id" = String, Path, description = "The turn"),
        ("Idempotency-Key" = Option<String>, Header, description = "A retry with the same key sends nothing"),
    ),
    request_body(content = Object, description = "`{\"text\", \"chat_jid\"?}`"),
    responses(
        (status = 200, description = "The message (`duplicate: true` for a retry)", body = Object),
        (status = 400, description = "`invalid_arguments`, `invalid_json`", body = ErrorBody),
        (status = 401, description = "No valid token", body = ErrorBody),
        (status = 403, description = "`insufficient_scope` (`turns:act`), `not_granted`", body = ErrorBody),
        (status = 404, description = "No such turn, or not the caller's; `not_found`", body = ErrorBody),
        (status = 409, description = "`turn_ended`", body = ErrorBody),
    ))]
async fn turn_send(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(turn_id): Path<String>,
    headers: HeaderMap,
    ApiJson(mut args): ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Value>, ApiFailure> {
    if let Some(k) = headers.get("idempotency-key") {
        let k = k
            .to_str()
            .map_err(|_| ApiFailure::Invalid("Idempotency-Key: printable text".into()))?;
        args.entry("idempotency_key")
            .or_insert_with(|| serde_json::Value::from(k));
    }
    act(
        &sh,
        &who,
        &turn_id,
        hako_shared::grants::Tool::SendMessage,
        args,
    )
    .await
}
