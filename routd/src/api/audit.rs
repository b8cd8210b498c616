//! `/v1/audit`: what callers changed.

use axum::Json;
use axum::extract::State;
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::{ApiQuery, NoToken};
use serde::{Deserialize, Serialize};

use super::AppState;
use crate::error::ApiFailure;
use crate::store::AuditRow;
use hako_shared::http as h;

/// Audit paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct AuditQuery {
    /// The previous page's `next_before`.
    before: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// `GET /v1/audit` answer, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct AuditPage {
    entries: Vec<AuditRow>,
    /// Pass as `before` for the next page.
    next_before: Option<i64>,
}

hako_shared::error_responses!(AuditErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`audit:read`"], h::FOLDER_FORBIDDEN });

/// routd's audit log: every change to groups, routes and webhooks (unbound callers).
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the audit log", body = AuditPage),
        AuditErrors,
        NoToken,
    ))]
pub(super) async fn audit(
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
