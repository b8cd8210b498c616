//! `/v1/approvals`: the held tool calls waiting for a person, and verdicts on them.

use axum::Json;
use axum::extract::{Path, State};
use hako_shared::approvals::{ApprovalList, ApprovalView, VerdictBody};
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::{ApiJson, ApiQuery, NoToken};
use serde::Deserialize;

use super::AppState;
use crate::approvals::{Judge, Refusal, decide};
use crate::error as e;
use crate::error::ApiFailure;
use hako_shared::http as h;

/// Which requests.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalQuery {
    /// Every request, decided ones too (default: the pending ones only).
    all: Option<bool>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

hako_shared::error_responses!(ListApprovalsErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`approvals:read`"] });

/// The approval requests of the caller's groups (a folder-bound caller sees its folders'):
/// the pending ones, or all with `all=true`.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", security(("bearer" = [])),
    params(ApprovalQuery),
    responses(
        (status = 200, description = "The requests, newest first", body = ApprovalList),
        ListApprovalsErrors,
        NoToken,
    ))]
pub(super) async fn list_approvals(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<ApprovalQuery>,
) -> Result<Json<ApprovalList>, ApiFailure> {
    who.require(scopes::APPROVALS_READ)?;
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    // Filtered by folder in the query, before the limit: another tenant's requests must not
    // push the caller's own out of its list.
    let rows = sh
        .store
        .approvals(!q.all.unwrap_or(false), who.folder(), limit)
        .await?;
    Ok(Json(ApprovalList {
        approvals: rows.into_iter().map(ApprovalView::from).collect(),
    }))
}

fn valid_id(id: &str) -> bool {
    id.len() <= 64 && hako_shared::ids::is_valid_id(id)
}

hako_shared::error_responses!(GetApprovalErrors { h::INSUFFICIENT_SCOPE["`approvals:read`"], h::NOT_FOUND });

/// One approval request.
#[utoipa::path(get, path = "/v1/approvals/{id}", tag = "approvals", security(("bearer" = [])),
    params(("id" = String, Path, description = "The request (`ap-…`)")),
    responses(
        (status = 200, description = "The request", body = ApprovalView),
        NoToken,
        GetApprovalErrors,
    ))]
pub(super) async fn get_approval(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<Json<ApprovalView>, ApiFailure> {
    who.require(scopes::APPROVALS_READ)?;
    let missing = || ApiFailure::NotFound(format!("no approval request {id}"));
    if !valid_id(&id) {
        return Err(missing());
    }
    let row = sh.store.approval(&id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&row.folder) {
        return Err(missing());
    }
    Ok(Json(row.into()))
}

hako_shared::error_responses!(DecideApprovalErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`approvals:write`"], h::FOLDER_FORBIDDEN, h::NOT_FOUND, e::ALREADY_DECIDED });

/// Approve or deny a held call. The first verdict wins (from here, `hako approvals` or the
/// chat); a later one answers 409 and changes nothing. The operator (an unbound caller) may
/// always answer; a caller bound to a folder covering the group's may, unless the group takes
/// approvals from the operator only.
#[utoipa::path(post, path = "/v1/approvals/{id}", tag = "approvals", security(("bearer" = [])),
    params(("id" = String, Path, description = "The request (`ap-…`)")),
    request_body = VerdictBody,
    responses(
        (status = 200, description = "The verdict is recorded; the call runs or is refused", body = ApprovalView),
        DecideApprovalErrors,
        NoToken,
    ))]
pub(super) async fn decide_approval(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
    ApiJson(v): ApiJson<VerdictBody>,
) -> Result<Json<ApprovalView>, ApiFailure> {
    who.require(scopes::APPROVALS_WRITE)?;
    let missing = || ApiFailure::NotFound(format!("no approval request {id}"));
    if !valid_id(&id) {
        return Err(missing());
    }
    let row = sh.store.approval(&id).await?.ok_or_else(missing)?;
    let judge = Judge::Api {
        actor: who.actor(),
        unbound: who.is_unbound(),
        covers: who.covers_folder(&row.folder),
    };
    match decide(&sh, &id, v.approve, judge).await? {
        Ok(row) => Ok(Json(row.into())),
        Err(Refusal::NotFound(_)) => Err(missing()),
        Err(r @ Refusal::NotAllowed(_)) => Err(ApiFailure::FolderForbidden(r.to_string())),
        Err(r @ Refusal::Decided { .. }) => Err(ApiFailure::AlreadyDecided(r.to_string())),
    }
}
