//! `/v1/tasks`: scheduled tasks, listed and cancelled.

use axum::Json;
use axum::extract::{Path, State};
use hako_shared::GroupFolder;
use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{TaskList, TaskView};
use hako_shared::http::{ApiQuery, NoToken};
use hako_shared::ids::is_valid_id;
use serde::Deserialize;

use super::{AppState, audit_row, parse_folder};
use crate::error::ApiFailure;
use crate::state::now_ms;
use hako_shared::http as h;

/// Task filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct TaskQuery {
    /// Only this group and the groups below it.
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Also the tasks that are done or cancelled.
    all: Option<bool>,
}

pub(super) fn task_view(t: crate::store::TaskRow) -> TaskView {
    let at = |ms: i64| hako_shared::time::rfc3339(hako_shared::time::from_unix_millis(ms));
    TaskView {
        id: t.id,
        folder: t.folder.into_string(),
        chat_jid: t.chat_jid.into_string(),
        prompt: t.prompt,
        cron: t.cron,
        next_at: t.next_at.map(at),
        state: t.state.to_string(),
        fired: t.fired,
        created_by: t.created_by,
    }
}

hako_shared::error_responses!(ListTasksErrors { h::INVALID_QUERY, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`groups:read`"] });

/// The scheduled tasks the caller's groups have (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/tasks", tag = "groups", security(("bearer" = [])),
    params(TaskQuery),
    responses(
        (status = 200, description = "The tasks, soonest first", body = TaskList),
        ListTasksErrors,
        NoToken,
    ))]
pub(super) async fn list_tasks(
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

hako_shared::error_responses!(CancelTaskErrors { h::INSUFFICIENT_SCOPE["`groups:write`"], h::NOT_FOUND });

/// Cancel a scheduled task (the operator, or a tenant whose folder covers the task's group).
#[utoipa::path(delete, path = "/v1/tasks/{id}", tag = "groups", security(("bearer" = [])),
    params(("id" = String, Path, description = "The task")),
    responses(
        (status = 200, description = "Cancelled (or already over: its state says which)", body = TaskView),
        NoToken,
        CancelTaskErrors,
    ))]
pub(super) async fn cancel_task(
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
        audit_row(
            &sh,
            &who,
            AuditAction::TaskCancel,
            Some(&t.folder),
            AuditOutcome::Ok,
            id.clone(),
        )
        .await;
    }
    let t = sh.store.task(&id).await?.ok_or_else(missing)?;
    Ok(Json(task_view(t)))
}
