//! `/v1/routes`: which group a chat's messages go to.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{NewRoute, RouteList, RouteView};
use hako_shared::http::{ApiJson, NoToken};

use super::{AppState, MAX_POSITION, audit_row};
use crate::error::ApiFailure;
use crate::routing::check_jid;
use crate::state::now_ms;
use hako_shared::http as h;

hako_shared::error_responses!(AddRouteErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`groups:write`"], h::FOLDER_FORBIDDEN });

/// Add a route rule (unbound callers: a route decides where any chat goes).
#[utoipa::path(post, path = "/v1/routes", tag = "routes", security(("bearer" = [])),
    request_body = NewRoute,
    responses(
        (status = 201, description = "Added", body = RouteView),
        AddRouteErrors,
        NoToken,
    ))]
pub(super) async fn add_route(
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
        .add_route(r.pattern, r.folder, r.position, now_ms())
        .await?;
    sh.routing.reload(&sh.store).await?;
    sh.turns.wake.notify_one();
    audit_row(
        &sh,
        &who,
        AuditAction::RouteAdd,
        Some(&row.folder),
        AuditOutcome::Ok,
        row.pattern.clone(),
    )
    .await;
    Ok((
        StatusCode::CREATED,
        Json(RouteView {
            id: row.id,
            pattern: row.pattern,
            folder: row.folder.into_string(),
            position: row.position,
        }),
    ))
}

hako_shared::error_responses!(ListRoutesErrors { h::INSUFFICIENT_SCOPE["`groups:read`"] });

/// The route rules, in the order they are tried (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/routes", tag = "routes", security(("bearer" = [])),
    responses(
        (status = 200, description = "The rules", body = RouteList),
        NoToken,
        ListRoutesErrors,
    ))]
pub(super) async fn list_routes(
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
            folder: r.folder.into_string(),
            position: r.position,
        })
        .collect();
    Ok(Json(RouteList { routes }))
}

hako_shared::error_responses!(DeleteRouteErrors { h::INSUFFICIENT_SCOPE["`groups:write`"], h::FOLDER_FORBIDDEN, h::NOT_FOUND });

/// Remove a route rule.
#[utoipa::path(delete, path = "/v1/routes/{id}", tag = "routes", security(("bearer" = [])),
    params(("id" = i64, Path, description = "The rule")),
    responses(
        (status = 200, description = "The rule removed", body = RouteView),
        NoToken,
        DeleteRouteErrors,
    ))]
pub(super) async fn delete_route(
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
        AuditAction::RouteDelete,
        Some(&row.folder),
        AuditOutcome::Ok,
        row.pattern.clone(),
    )
    .await;
    Ok(Json(RouteView {
        id: row.id,
        pattern: row.pattern,
        folder: row.folder.into_string(),
        position: row.position,
    }))
}
