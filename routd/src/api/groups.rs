//! `/v1/groups`: groups, as the operator sets them and as a folder-bound tenant may change them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use hako_shared::GroupFolder;
use hako_shared::approvals::ApprovalPolicy;
use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{GroupConfig, GroupList, GroupView};
use hako_shared::http::{ApiJson, NoToken};
use hako_shared::runs::GroupSpec;

use super::{AppState, audit_row, check_text, parse_folder};
use crate::error as e;
use crate::error::ApiFailure;
use crate::state::{Shared, now_ms};
use crate::store::{GroupRow, SetBy};
use hako_shared::http as h;

/// The most chat sessions a group's view lists.
pub(super) const VIEW_SESSIONS: usize = 20;

pub(super) async fn group_view(sh: &Shared, g: GroupRow) -> Result<GroupView, ApiFailure> {
    let sessions = sh.store.sessions_of(&g.folder, VIEW_SESSIONS).await?;
    Ok(GroupView {
        values_in_box: g.spec.env_allowlist.clone(),
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

hako_shared::error_responses!(PutGroupErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INVALID_GROUP, h::INSUFFICIENT_SCOPE["`groups:write`"], h::FOLDER_FORBIDDEN });

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
        PutGroupErrors,
        NoToken,
    ))]
pub(super) async fn put_group(
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
            AuditAction::GroupPut,
            Some(folder.as_str()),
            AuditOutcome::from(&h::FOLDER_FORBIDDEN),
            String::new(),
        )
        .await;
        return Err(ApiFailure::FolderForbidden(refused.into()));
    }
    let (row, created) = if who.is_unbound() {
        let row = GroupRow {
            folder: folder.clone(),
            name: cfg.name,
            system_prompt: cfg.system_prompt,
            grants: cfg.grants,
            spec: cfg.group,
            approvals: cfg.approvals,
            updated_at: now_ms(),
            set_by: SetBy::Operator,
        };
        let created = sh.store.put_group(row.clone()).await?;
        (row, created)
    } else {
        tenant_put(&sh, &who, &folder, cfg.name, cfg.system_prompt).await?
    };
    sh.routing.reload(&sh.store).await?;
    sh.turns.wake.notify_one();
    audit_row(
        &sh,
        &who,
        AuditAction::GroupPut,
        Some(folder.as_str()),
        AuditOutcome::Ok,
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
pub(super) async fn tenant_put(
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
    // A tenant's own folder is the operator's to make: a group a tenant made there would
    // start from no one's settings (or from `main`'s, above the tenant).
    if folder.as_str() == root {
        return Err(ApiFailure::FolderForbidden(format!(
            "there is no group {folder}: the operator makes a tenant's own group, and the \
             tenant makes groups below it"
        )));
    }
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
    // The nearest ancestor inside the tenant's own folder: nothing wider (and never none,
    // which would be no one's settings: every tool, approvals from the chat).
    let parent = parent.filter(|p| hako_shared::folder::contains(root, &p.folder));
    let Some(p) = parent else {
        return Err(ApiFailure::FolderForbidden(format!(
            "{folder} has no group above it in {root}: a tenant's group starts from the \
             settings of a group the operator made for it"
        )));
    };
    let mut spec = p.spec;
    if spec.trust == hako_shared::runs::Trust::Main {
        spec.trust = hako_shared::runs::Trust::Untrusted;
    }
    // Its ask rules keep their approvers: a sub-group is no way around them.
    let (grants, approvals) = (p.grants, p.approvals);
    let row = GroupRow {
        folder: folder.clone(),
        name,
        system_prompt,
        grants,
        spec,
        approvals,
        updated_at: now,
        set_by: SetBy::Tenant,
    };
    let created = sh.store.put_group(row.clone()).await?;
    Ok((row, created))
}

hako_shared::error_responses!(GetGroupErrors { h::INSUFFICIENT_SCOPE["`groups:read`"], h::NOT_FOUND });

/// One group.
#[utoipa::path(get, path = "/v1/groups/{folder}", tag = "groups", security(("bearer" = [])),
    params(("folder" = GroupFolder, Path, description = "The group folder (percent-encoded)")),
    responses(
        (status = 200, description = "The group", body = GroupView),
        NoToken,
        GetGroupErrors,
    ))]
pub(super) async fn get_group(
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

hako_shared::error_responses!(DeleteGroupErrors { h::INSUFFICIENT_SCOPE["`groups:write`"], h::FOLDER_FORBIDDEN, h::NOT_FOUND, e::RUNED_UNAVAILABLE });

/// Remove a group, with its routes, sessions and tasks (its history stays in the log); runed
/// stops its runs, removes its warm box and moves its folder's files to the trash, so a
/// group made in the folder later starts from nothing. A folder-bound caller may remove only
/// the groups it (or a main group's agent) made below its folder, never one the operator set.
#[utoipa::path(delete, path = "/v1/groups/{folder}", tag = "groups", security(("bearer" = [])),
    params(("folder" = GroupFolder, Path, description = "The group folder (percent-encoded)")),
    responses(
        (status = 204, description = "Removed"),
        NoToken,
        DeleteGroupErrors,
    ))]
pub(super) async fn delete_group(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(folder): Path<String>,
) -> Result<StatusCode, ApiFailure> {
    who.require(scopes::GROUPS_WRITE)?;
    let f = parse_folder(&folder)?;
    who.require_folder(f.as_str())?;
    let g = sh
        .store
        .group(f.as_str())
        .await?
        .ok_or_else(|| ApiFailure::NotFound(format!("no group {f}")))?;
    if !who.is_unbound() && g.set_by == SetBy::Operator {
        audit_row(
            &sh,
            &who,
            AuditAction::GroupDelete,
            Some(f.as_str()),
            AuditOutcome::from(&h::FOLDER_FORBIDDEN),
            String::new(),
        )
        .await;
        return Err(ApiFailure::FolderForbidden(format!(
            "the operator set the group {f}: only the operator removes it"
        )));
    }
    // The folder first: a group whose files could not be moved aside stays, rather than
    // leaving them to whoever makes a group there next.
    sh.runed.stop(&f, true).await.map_err(|e| {
        ApiFailure::RunedUnavailable(format!(
            "runed could not retire {f}'s folder ({e}); the group was not removed"
        ))
    })?;
    if !sh.store.delete_group(f.as_str()).await? {
        return Err(ApiFailure::NotFound(format!("no group {f}")));
    }
    sh.routing.reload(&sh.store).await?;
    audit_row(
        &sh,
        &who,
        AuditAction::GroupDelete,
        Some(f.as_str()),
        AuditOutcome::Ok,
        String::new(),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

hako_shared::error_responses!(ListGroupsErrors { h::INSUFFICIENT_SCOPE["`groups:read`"] });

/// The groups the caller covers.
#[utoipa::path(get, path = "/v1/groups", tag = "groups", security(("bearer" = [])),
    responses(
        (status = 200, description = "The groups, by folder", body = GroupList),
        NoToken,
        ListGroupsErrors,
    ))]
pub(super) async fn list_groups(
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
