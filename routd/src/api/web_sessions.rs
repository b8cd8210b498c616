//! `/v1/web-sessions`: the web page's browser sessions, for the operator to see and end. A
//! session outlives its sign-in link's token (minutes against hours), so revoking that token
//! at authd ends it only while the token lives; ending it here works for its whole life.

use axum::Json;
use axum::extract::{Path, State};
use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::NoToken;
use hako_shared::web::{WebSessionList, WebSessionView};

use super::{AppState, audit_row};
use crate::error::ApiFailure;
use crate::state::now_ms;
use crate::store::WebSession;
use hako_shared::http as h;

impl From<WebSession> for WebSessionView {
    fn from(s: WebSession) -> Self {
        Self {
            link_jti: s.link_jti,
            subject: s.claims.sub,
            folder: s.claims.folder,
            scopes: s.claims.scope,
            created_at: s.created_at,
            expires_at: s.expires_at,
        }
    }
}

/// Whether `who` reaches a session: its folder, or, for an unbound session, unbound callers.
fn reaches(who: &Principal, s: &WebSession) -> bool {
    match &s.claims.folder {
        Some(f) => who.covers_folder(f),
        None => who.is_unbound(),
    }
}

hako_shared::error_responses!(ListWebSessionsErrors { h::INSUFFICIENT_SCOPE["`tokens:revoke`"] });

/// The live browser sessions of the web page (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/web-sessions", tag = "web", security(("bearer" = [])),
    responses(
        (status = 200, description = "The live sessions", body = WebSessionList),
        NoToken,
        ListWebSessionsErrors,
    ))]
pub(super) async fn list_web_sessions(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<WebSessionList>, ApiFailure> {
    who.require(scopes::TOKENS_REVOKE)?;
    let sessions = sh
        .store
        .web_sessions(now_ms())
        .await?
        .into_iter()
        .filter(|s| reaches(&who, s))
        .map(WebSessionView::from)
        .collect();
    Ok(Json(WebSessionList { sessions }))
}

hako_shared::error_responses!(EndWebSessionErrors { h::INSUFFICIENT_SCOPE["`tokens:revoke`"], h::NOT_FOUND });

/// Ends the browser session a sign-in link opened: its cookie answers 401 `session_ended`
/// from now on and its chat streams end.
#[utoipa::path(delete, path = "/v1/web-sessions/{jti}", tag = "web", security(("bearer" = [])),
    params(("jti" = String, Path, description = "The sign-in link's token id")),
    responses(
        (status = 200, description = "The session, ended", body = WebSessionView),
        NoToken,
        EndWebSessionErrors,
    ))]
pub(super) async fn end_web_session(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(jti): Path<String>,
) -> Result<Json<WebSessionView>, ApiFailure> {
    who.require(scopes::TOKENS_REVOKE)?;
    let not_found = || ApiFailure::NotFound(format!("no live web session of link {jti}"));
    let live = sh.store.web_sessions(now_ms()).await?;
    let Some(s) = live.into_iter().find(|s| s.link_jti == jti) else {
        return Err(not_found());
    };
    if !reaches(&who, &s) {
        return Err(not_found());
    }
    let Some(s) = sh.store.end_web_session_of_link(&jti, now_ms()).await? else {
        return Err(not_found());
    };
    sh.signed_out.add(&s.link_jti, s.claims.exp);
    audit_row(
        &sh,
        &who,
        AuditAction::WebSessionEnd,
        s.claims.folder.as_deref(),
        AuditOutcome::Ok,
        format!("link {jti}"),
    )
    .await;
    Ok(Json(s.into()))
}
