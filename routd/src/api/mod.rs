//! The HTTP API (`specs/routd.md`, `routd/openapi.json`). Every route checks its scope; a
//! folder-bound caller reaches only chats that route to its folders, and its groups and turns
//! (others answer 404, or 403 where it asks to write). JIDs and folders in a path are
//! percent-encoded (`web:acme%2Fsupport`).

use std::sync::Arc;

use axum::extract::FromRef;
use hako_shared::GroupFolder;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, Verifier};
use hako_shared::http::{ApiInfo, api_router};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

mod approvals;
mod audit;
mod chats;
mod groups;
pub(crate) mod media;
mod messages;
mod overview;
mod routes;
mod tasks;
mod tools;
mod turns;
mod web_sessions;
mod webhooks;

use crate::error::ApiFailure;
use crate::state::Shared;

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
/// through `routes!`, so no API is served that the document does not list (the web page
/// under `/web/` is pages, not API).
pub(crate) fn documented() -> OpenApiRouter<AppState> {
    api_router::<AppState>(INFO)
        .routes(routes!(messages::post_message))
        .routes(routes!(media::put_media))
        .routes(routes!(chats::chat_messages))
        .routes(routes!(chats::chat_events))
        .routes(routes!(
            groups::put_group,
            groups::get_group,
            groups::delete_group
        ))
        .routes(routes!(groups::list_groups))
        .routes(routes!(routes::add_route, routes::list_routes))
        .routes(routes!(routes::delete_route))
        .routes(routes!(webhooks::add_webhook, webhooks::list_webhooks))
        .routes(routes!(webhooks::delete_webhook))
        .routes(routes!(turns::get_turn))
        .routes(routes!(turns::list_turns))
        .routes(routes!(tools::turn_tool))
        .routes(routes!(tools::turn_send))
        .routes(routes!(turns::usage))
        .routes(routes!(overview::overview))
        .routes(routes!(tasks::list_tasks))
        .routes(routes!(tasks::cancel_task))
        .routes(routes!(audit::audit))
        .routes(routes!(approvals::list_approvals))
        .routes(routes!(approvals::get_approval, approvals::decide_approval))
        .routes(routes!(web_sessions::list_web_sessions))
        .routes(routes!(web_sessions::end_web_session))
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
    action: hako_shared::audit::AuditAction,
    folder: Option<&str>,
    outcome: AuditOutcome<'_>,
    detail: String,
) {
    sh.audit(&who.actor(), action, folder, outcome, detail)
        .await;
}

/// Whether `who` acts for the `channel` service identity (a chat adapter): its own token or
/// any token minted from it (authd keeps a chain's subject). Unbound, yet it reaches only the
/// chats `ROUTD_CHANNEL_CHATS` names, never a folder's `web:` chats; a child it mints is held
/// to the same chats.
fn is_channel(who: &Principal) -> bool {
    who.claims().is_some_and(|c| c.sub == CHANNEL)
}

/// The chat adapters' service identity.
pub(crate) const CHANNEL: &str = "channel";

/// The folder a chat routes to, when the caller may see the chat.
fn chat_folder(
    sh: &Shared,
    who: &Principal,
    chat: &str,
) -> Result<Option<GroupFolder>, ApiFailure> {
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

fn parse_folder(raw: &str) -> Result<GroupFolder, ApiFailure> {
    GroupFolder::new(raw).map_err(|e| ApiFailure::Invalid(format!("folder: {e}")))
}
