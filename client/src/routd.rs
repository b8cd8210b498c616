//! routd's operations (`specs/routd.md`, `routd/openapi.json`).

use hako_shared::approvals::{ApprovalList, ApprovalView, VerdictBody};
use hako_shared::chat::{
    GroupConfig, GroupList, GroupView, MessagePage, MessageView, NewRoute, NewWebhook, PostMessage,
    Posted, RouteList, RouteView, TaskList, TaskView, TurnList, TurnView, WebhookList, WebhookView,
};
use hako_shared::media::MediaSaved;
use hako_shared::web::{WebSessionList, WebSessionView};
use reqwest::Method;

use crate::op::{Daemon, Events, Op, Text, seg};

const D: Daemon = Daemon::Routd;

/// `POST /v1/messages`: one inbound chat message (idempotent by its id).
pub fn post_message(m: &PostMessage) -> Op<Posted> {
    Op::new(D, Method::POST, "/v1/messages".into()).json(m)
}

/// `GET /v1/chats/{jid}/messages`: a page of a chat's log (query: `after`, `limit`).
pub fn chat_messages(jid: &str) -> Op<MessagePage> {
    Op::get(D, format!("/v1/chats/{}/messages", seg(jid)))
}

/// `GET /v1/chats/{jid}/events`: a chat's messages as they come (query: `after`).
pub fn chat_events(jid: &str) -> Op<Events<MessageView>> {
    Op::get(D, format!("/v1/chats/{}/events", seg(jid)))
}

/// `PUT /v1/chats/{jid}/media/{name}`: a file a chat sent, into its folder's media.
pub fn put_chat_media(jid: &str, name: &str, data: bytes::Bytes) -> Op<MediaSaved> {
    Op::new(
        D,
        Method::PUT,
        format!("/v1/chats/{}/media/{}", seg(jid), seg(name)),
    )
    .bytes(data)
}

/// `GET /v1/groups`.
pub fn groups() -> Op<GroupList> {
    Op::get(D, "/v1/groups".into())
}

/// `GET /v1/groups/{folder}`.
pub fn group(folder: &str) -> Op<GroupView> {
    Op::get(D, format!("/v1/groups/{}", seg(folder)))
}

/// `PUT /v1/groups/{folder}`: creates or replaces a group.
pub fn put_group(folder: &str, cfg: &GroupConfig) -> Op<GroupView> {
    Op::new(D, Method::PUT, format!("/v1/groups/{}", seg(folder))).json(cfg)
}

/// `DELETE /v1/groups/{folder}`.
pub fn delete_group(folder: &str) -> Op<()> {
    Op::new(D, Method::DELETE, format!("/v1/groups/{}", seg(folder)))
}

/// `GET /v1/routes`, in the order they are tried.
pub fn routes() -> Op<RouteList> {
    Op::get(D, "/v1/routes".into())
}

/// `POST /v1/routes`.
pub fn add_route(r: &NewRoute) -> Op<RouteView> {
    Op::new(D, Method::POST, "/v1/routes".into()).json(r)
}

/// `DELETE /v1/routes/{id}`.
pub fn delete_route(id: i64) -> Op<RouteView> {
    Op::new(D, Method::DELETE, format!("/v1/routes/{id}"))
}

/// `GET /v1/webhooks`.
pub fn webhooks() -> Op<WebhookList> {
    Op::get(D, "/v1/webhooks".into())
}

/// `POST /v1/webhooks`.
pub fn add_webhook(w: &NewWebhook) -> Op<WebhookView> {
    Op::new(D, Method::POST, "/v1/webhooks".into()).json(w)
}

/// `GET /v1/approvals` (query: `all`, `limit`).
pub fn approvals() -> Op<ApprovalList> {
    Op::get(D, "/v1/approvals".into())
}

/// `GET /v1/approvals/{id}`: one request whole.
pub fn approval(id: &str) -> Op<ApprovalView> {
    Op::get(D, format!("/v1/approvals/{}", seg(id)))
}

/// `POST /v1/approvals/{id}`: a verdict.
pub fn decide(id: &str, approve: bool) -> Op<ApprovalView> {
    Op::new(D, Method::POST, format!("/v1/approvals/{}", seg(id))).json(&VerdictBody { approve })
}

/// `GET /v1/turns` (query: `state`, `folder`, `limit`).
pub fn turns() -> Op<TurnList> {
    Op::get(D, "/v1/turns".into())
}

/// `GET /v1/turns/{id}`.
pub fn turn(id: &str) -> Op<TurnView> {
    Op::get(D, format!("/v1/turns/{}", seg(id)))
}

/// `POST /v1/turns/{turn_id}/tools/{tool}`: one of a turn's tools over HTTP, with the run's
/// spawn token (`turn_id`: routd's id, or runed's `<turn>.<try>`); `args` are the tool's
/// arguments, the answer its result.
pub fn turn_tool(turn_id: &str, tool: &str, args: &serde_json::Value) -> Op<serde_json::Value> {
    Op::new(
        D,
        Method::POST,
        format!("/v1/turns/{}/tools/{}", seg(turn_id), seg(tool)),
    )
    .json(args)
}

/// `GET /v1/audit`: routd's audit log, newest first (query: `before`, `limit`).
pub fn audit() -> Op<serde_json::Value> {
    Op::get(D, "/v1/audit".into())
}

/// `GET /v1/tasks` (query: `all`, `folder`).
pub fn tasks() -> Op<TaskList> {
    Op::get(D, "/v1/tasks".into())
}

/// `DELETE /v1/tasks/{id}`: cancels a task.
pub fn cancel_task(id: &str) -> Op<TaskView> {
    Op::new(D, Method::DELETE, format!("/v1/tasks/{}", seg(id)))
}

/// `GET /v1/web-sessions`.
pub fn web_sessions() -> Op<WebSessionList> {
    Op::get(D, "/v1/web-sessions".into())
}

/// `DELETE /v1/web-sessions/{jti}`: ends the web session a link opened.
pub fn end_web_session(jti: &str) -> Op<WebSessionView> {
    Op::new(D, Method::DELETE, format!("/v1/web-sessions/{}", seg(jti)))
}

/// `GET /health`: whether it answers (`ok`, as text).
pub fn health() -> Op<Text> {
    Op::get(D, "/health".into())
}

/// `GET /ready`.
pub fn ready() -> Op<serde_json::Value> {
    Op::get(D, "/ready".into())
}
