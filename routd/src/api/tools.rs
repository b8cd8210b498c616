//! `/v1/turns/{turn_id}/tools/{tool}` and `/send`: the turn's tools over HTTP, for the turn's own spawn token.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::{ApiJson, NoToken};
use hako_shared::ids::{TurnId, TurnTry};

use super::AppState;
use crate::error as e;
use crate::error::ApiFailure;
use crate::gateway::claims_turn;
use crate::state::Shared;
use hako_shared::http as h;

/// The turn a spawn token may act for: only its own turn, in its own folder, while it is
/// live. Anyone else gets 404 (the same answer as for no such turn).
pub(super) async fn acting_turn(
    sh: &Shared,
    who: &Principal,
    turn_id: &str,
) -> Result<hako_mcp::Scope, ApiFailure> {
    who.require(scopes::TURNS_ACT)?;
    let missing = || ApiFailure::NotFound(format!("no turn {turn_id}"));
    let turn_id = path_turn(turn_id).ok_or_else(missing)?;
    if let Some(c) = who.claims() {
        let own = c.typ == hako_shared::auth::TokenType::Spawn
            && claims_turn(c.turn_id.as_deref(), &turn_id);
        if !own {
            return Err(missing());
        }
    }
    let t = sh.store.turn(&turn_id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&t.folder) {
        return Err(missing());
    }
    crate::tools::scope_of(sh, &t).await?.ok_or_else(missing)
}

/// The routd turn a path names: runed's `<turn>.<try>` (what the agent's input carries) or
/// routd's own id (never of that form: `t-` and hex digits). `None` is no turn's.
fn path_turn(raw: &str) -> Option<TurnId> {
    match TurnTry::parse(raw) {
        Ok(t) => Some(t.into_turn()),
        Err(_) => TurnId::new(raw).ok(),
    }
}

pub(super) async fn act(
    sh: &Arc<Shared>,
    who: &Principal,
    turn_id: &str,
    tool: hako_shared::grants::Tool,
    args: serde_json::Map<String, serde_json::Value>,
    key: Option<&hako_mcp::CallKey>,
) -> Result<Json<serde_json::Value>, ApiFailure> {
    let scope = acting_turn(sh, who, turn_id).await?;
    let backend = crate::tools::RoutdTools { sh: sh.clone() };
    Ok(Json(
        hako_mcp::dispatch(&backend, &scope, tool, args, key).await?,
    ))
}

/// The call's name over HTTP: its `Idempotency-Key` header (what `_meta.hako/call` is over
/// MCP), 1-128 of `[A-Za-z0-9._:-]`.
fn call_key(headers: &HeaderMap) -> Result<Option<hako_mcp::CallKey>, ApiFailure> {
    let Some(k) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    k.to_str()
        .ok()
        .and_then(hako_mcp::CallKey::parse)
        .map(Some)
        .ok_or_else(|| ApiFailure::Invalid("Idempotency-Key: 1-128 of [A-Za-z0-9._:-]".into()))
}

hako_shared::error_responses!(TurnToolErrors { e::INVALID_ARGUMENTS, h::INVALID_JSON, h::INSUFFICIENT_SCOPE["`turns:act`"], e::NOT_GRANTED, h::NOT_FOUND, e::TURN_ENDED, e::CONFLICT });

/// One of the turn's tools over HTTP, with the run's spawn token: the same call, checks and
/// answer as over the turn's MCP socket (`mcp.sock`). The body is the tool's arguments.
#[utoipa::path(post, path = "/v1/turns/{turn_id}/tools/{tool}", tag = "tools", security(("bearer" = [])),
    params(
        ("turn_id" = String, Path, description = "The turn (routd's id, or runed's `<turn>.<try>` from the agent's input)"),
        ("tool" = String, Path, description = "send_message, get_history, set_status, schedule_task, list_tasks, cancel_task, reset_session, register_group, spawn_group"),
        ("Idempotency-Key" = Option<String>, Header, description = "The call's name (1-128 of [A-Za-z0-9._:-]): asked again, the same call waits on the same approval request, and a send_message sends nothing twice"),
    ),
    request_body(content = Object, description = "The tool's arguments, as its MCP input schema says"),
    responses(
        (status = 200, description = "The tool's result", body = Object),
        TurnToolErrors,
        NoToken,
    ))]
pub(super) async fn turn_tool(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path((turn_id, tool)): Path<(String, String)>,
    headers: HeaderMap,
    ApiJson(args): ApiJson<serde_json::Map<String, serde_json::Value>>,
) -> Result<Json<serde_json::Value>, ApiFailure> {
    let tool = hako_shared::grants::Tool::from_name(&tool)
        .ok_or_else(|| ApiFailure::NotFound(format!("no tool {tool:?}")))?;
    let key = call_key(&headers)?;
    act(&sh, &who, &turn_id, tool, args, key.as_ref()).await
}

hako_shared::error_responses!(TurnSendErrors { e::INVALID_ARGUMENTS, h::INVALID_JSON, h::INSUFFICIENT_SCOPE["`turns:act`"], e::NOT_GRANTED, h::NOT_FOUND, e::TURN_ENDED });

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
        TurnSendErrors,
        NoToken,
    ))]
pub(super) async fn turn_send(
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
    // A key in the call-key grammar also names the call for a held request.
    let key = call_key(&headers).ok().flatten();
    act(
        &sh,
        &who,
        &turn_id,
        hako_shared::grants::Tool::SendMessage,
        args,
        key.as_ref(),
    )
    .await
}
