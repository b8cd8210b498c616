//! `/v1/overview`: what the watch page shows at a glance: each daemon's readiness, the runs
//! live and queued, and per folder the messages that wait for an answer.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::NoToken;
use hako_shared::runs::{RunState, RunSummary};
use serde::Serialize;

use super::AppState;
use crate::error::ApiFailure;
use hako_shared::http as h;

/// One daemon's readiness.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct DaemonHealth {
    /// `routd`, `authd` or `runed`.
    name: &'static str,
    /// Whether it answers `/ready`.
    ready: bool,
    /// Why not.
    error: Option<String>,
}

/// Runs on runed the caller may see.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct RunsNow {
    /// Starting or running.
    live: usize,
    /// Waiting for a slot.
    queued: usize,
    /// The runs themselves, queued first.
    runs: Vec<RunSummary>,
}

/// A folder's unanswered messages.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct FolderBacklog {
    /// The folder.
    folder: String,
    /// Inbound messages waiting for an answer, over its chats.
    waiting: u64,
    /// When the oldest arrived (Unix ms).
    oldest_at: i64,
}

/// `GET /v1/overview` answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct Overview {
    /// routd, authd and runed (authd only when routd uses one).
    daemons: Vec<DaemonHealth>,
    /// Runs live and queued; absent when runed did not answer (see `runs_error`).
    runs: Option<RunsNow>,
    /// Why the runs are missing.
    runs_error: Option<String>,
    /// Folders with messages waiting, the oldest wait first.
    folders: Vec<FolderBacklog>,
}

fn health(name: &'static str, r: Result<(), String>) -> DaemonHealth {
    DaemonHealth {
        name,
        ready: r.is_ok(),
        error: r.err(),
    }
}

hako_shared::error_responses!(OverviewErrors { h::INSUFFICIENT_SCOPE["`turns:read`"] });

/// The stack at a glance (a folder-bound caller sees its folders' runs and backlog).
#[utoipa::path(get, path = "/v1/overview", tag = "turns", security(("bearer" = [])),
    responses(
        (status = 200, description = "Readiness, runs and backlog", body = Overview),
        NoToken,
        OverviewErrors,
    ))]
pub(super) async fn overview(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<Overview>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    let routd = sh.store.ping().await.map_err(|e| format!("routd.db: {e}"));
    let crate::runed::Readiness { runed, authd } = sh.runed.readiness().await;
    let mut daemons = vec![health("routd", routd)];
    if let Some(a) = authd {
        daemons.push(health("authd", a));
    }
    daemons.push(health("runed", runed));

    let mut runs_error = None;
    let mut runs = Vec::new();
    for state in [RunState::Queued, RunState::Starting, RunState::Running] {
        match sh.runed.runs(state).await {
            Ok(list) => runs.extend(
                list.runs
                    .into_iter()
                    .filter(|r| who.covers_folder(&r.folder)),
            ),
            Err(e) => {
                runs_error = Some(e.to_string());
                break;
            }
        }
    }
    let runs = runs_error.is_none().then(|| RunsNow {
        live: runs.iter().filter(|r| r.state != RunState::Queued).count(),
        queued: runs.iter().filter(|r| r.state == RunState::Queued).count(),
        runs,
    });

    let mut by_folder: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    for b in sh.store.backlog().await? {
        let Some(folder) = sh.routing.resolve(&b.chat_jid) else {
            continue;
        };
        if !who.covers_folder(&folder) {
            continue;
        }
        let e = by_folder
            .entry(folder.into_string())
            .or_insert((0, i64::MAX));
        e.0 += b.waiting;
        e.1 = e.1.min(b.oldest_at);
    }
    let mut folders: Vec<FolderBacklog> = by_folder
        .into_iter()
        .map(|(folder, (waiting, oldest_at))| FolderBacklog {
            folder,
            waiting,
            oldest_at,
        })
        .collect();
    folders.sort_by_key(|f| f.oldest_at);
    Ok(Json(Overview {
        daemons,
        runs,
        runs_error,
        folders,
    }))
}
