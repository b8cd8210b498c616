//! `/v1/turns` and `/v1/usage`: turns as they run and ran, and what their models cost.

use axum::Json;
use axum::extract::{Path, State};
use hako_shared::GroupFolder;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{TurnList, TurnState, TurnView};
use hako_shared::http::{ApiQuery, NoToken};
use hako_shared::ids::TurnId;
use serde::{Deserialize, Serialize};

use super::{AppState, parse_folder};
use crate::error::ApiFailure;
use hako_shared::http as h;

hako_shared::error_responses!(GetTurnErrors { h::INSUFFICIENT_SCOPE["`turns:read`"], h::NOT_FOUND });

/// One turn: what ran, why, with which run.
#[utoipa::path(get, path = "/v1/turns/{turn_id}", tag = "turns", security(("bearer" = [])),
    params(("turn_id" = String, Path, description = "The turn")),
    responses(
        (status = 200, description = "The turn", body = TurnView),
        NoToken,
        GetTurnErrors,
    ))]
pub(super) async fn get_turn(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(turn_id): Path<String>,
) -> Result<Json<TurnView>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    let missing = || ApiFailure::NotFound(format!("no turn {turn_id}"));
    // An id outside the grammar names no turn: the same 404.
    let id = TurnId::new(turn_id.as_str()).map_err(|_| missing())?;
    let t = sh.store.turn(&id).await?.ok_or_else(missing)?;
    if !who.covers_folder(&t.folder) {
        return Err(missing());
    }
    Ok(Json(sh.store.turn_view(t).await?))
}

/// Turn paging.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct TurnsQuery {
    /// Only this folder (and those below it).
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Only turns in this state (another answers 400 `invalid_query`).
    state: Option<TurnState>,
    /// The previous page's `next_before`.
    before: Option<i64>,
    /// At most this many, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

hako_shared::error_responses!(ListTurnsErrors { h::INVALID_QUERY, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`turns:read`"] });

/// Turns, newest first (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/turns", tag = "turns", security(("bearer" = [])),
    params(TurnsQuery),
    responses(
        (status = 200, description = "A page of turns", body = TurnList),
        ListTurnsErrors,
        NoToken,
    ))]
pub(super) async fn list_turns(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<TurnsQuery>,
) -> Result<Json<TurnList>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    if let Some(f) = &q.folder {
        parse_folder(f)?;
    }
    let folder = match (q.folder, who.folder()) {
        (Some(f), _) if !who.covers_folder(&f) => {
            return Ok(Json(TurnList {
                turns: vec![],
                next_before: None,
            }));
        }
        (Some(f), _) => Some(f),
        (None, bound) => bound.map(str::to_owned),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sh.store.turns(folder, q.state, q.before, limit).await?;
    let next_before = match rows.last() {
        Some(t) if rows.len() == limit => sh.store.turn_rowid(&t.turn_id).await?,
        _ => None,
    };
    let mut turns = Vec::with_capacity(rows.len());
    for t in rows {
        turns.push(sh.store.turn_view(t).await?);
    }
    Ok(Json(TurnList { turns, next_before }))
}

/// Usage filters.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct UsageQuery {
    /// Only this group.
    #[param(value_type = Option<GroupFolder>)]
    folder: Option<String>,
    /// Only this UTC day, `YYYY-MM-DD`.
    #[param(pattern = "^[0-9]{4}-[0-9]{2}-[0-9]{2}$")]
    day: Option<String>,
    /// Only this turn.
    turn_id: Option<String>,
    /// At most this many rows, 1-1000 (default 100; others are clamped).
    limit: Option<usize>,
}

/// LLM usage through the gateway.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(super) struct UsageReport {
    /// Rows by group, day, turn, wire format and model, newest day first.
    rows: Vec<crate::store::UsageRow>,
    /// The rows' calls.
    calls: u64,
    /// The rows' input tokens.
    input_tokens: u64,
    /// The rows' output tokens.
    output_tokens: u64,
}

hako_shared::error_responses!(UsageErrors { h::INVALID_QUERY, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`turns:read`"] });

/// Tokens the groups' agents used through the LLM gateway, per group, UTC day, turn and model
/// (a folder-bound caller sees its folders').
#[utoipa::path(get, path = "/v1/usage", tag = "turns", security(("bearer" = [])),
    params(UsageQuery),
    responses(
        (status = 200, description = "Usage rows and their totals", body = UsageReport),
        UsageErrors,
        NoToken,
    ))]
pub(super) async fn usage(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<UsageQuery>,
) -> Result<Json<UsageReport>, ApiFailure> {
    who.require(scopes::TURNS_READ)?;
    if let Some(f) = &q.folder {
        parse_folder(f)?;
    }
    if let Some(d) = &q.day {
        let ok = d.len() == 10
            && d.bytes().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            });
        if !ok {
            return Err(ApiFailure::Invalid(format!(
                "day must be YYYY-MM-DD, not {d:?}"
            )));
        }
    }
    let folder = q.folder.or_else(|| who.folder().map(str::to_owned));
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    // A turn id outside the grammar is no turn's: no rows, as for a turn with none.
    let turn = match q.turn_id.map(TurnId::new).transpose() {
        Ok(t) => t,
        Err(_) => {
            return Ok(Json(UsageReport {
                rows: Vec::new(),
                calls: 0,
                input_tokens: 0,
                output_tokens: 0,
            }));
        }
    };
    let mut rows = sh.store.llm_usage(folder, q.day, turn, limit).await?;
    rows.retain(|r| who.covers_folder(&r.folder));
    let sum =
        |f: fn(&crate::store::UsageRow) -> u64| rows.iter().map(f).fold(0u64, u64::saturating_add);
    Ok(Json(UsageReport {
        calls: sum(|r| r.calls),
        input_tokens: sum(|r| r.input_tokens),
        output_tokens: sum(|r| r.output_tokens),
        rows,
    }))
}
