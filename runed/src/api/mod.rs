//! The HTTP API (`specs/runed.md`, `runed/openapi.json`). Every route checks its scope; a folder-bound caller
//! sees only runs of its folders (others answer 404) and can never ask for more than a
//! group's defaults (trust, mounts, network, image, sidecars, env passthrough).

pub(crate) mod media;

use hako_shared::audit::{AuditAction, AuditOutcome};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::{FromRef, Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::Stream;
use hako_shared::auth::{Principal, Verifier, scopes};
use hako_shared::http::{self as h, NoToken};
use hako_shared::http::{ApiInfo, ApiJson, ApiQuery, api_router};
use hako_shared::ids::{RunId, TurnId, is_valid_id};
use hako_shared::runs::{
    CreatedRun, HoldRequest, RunRequest, RunState, RunStatus, SessionPage, SpawnKind, SteerReply,
    SteerRequest, SteerState, SteerStatus, StopReply, StopRequest,
};
use hako_shared::time::{from_unix_millis, rfc3339, unix_millis};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{self as e, ApiFailure};
use crate::state::{Event, HoldInfo, MAX_SECRETS_BYTES, Pending, Shared, new_run_id};
use crate::store::{AuditRow, Inserted, SpawnRow};

/// The router's state.
#[derive(Clone)]
pub(crate) struct AppState(pub Arc<Shared>);

impl FromRef<AppState> for Verifier {
    fn from_ref(s: &AppState) -> Verifier {
        s.0.verifier.clone()
    }
}

/// What runed's document says of it.
pub(crate) const INFO: ApiInfo = ApiInfo {
    name: "runed",
    version: env!("CARGO_PKG_VERSION"),
    description: "hako's execution daemon: the only holder of the Docker socket; runs one locked-down container per agent turn.",
};

/// The API routes, each documented from its handler (ops routes are added by
/// `hako_shared::http::daemon_router`). Routes are only ever added here, through `routes!`, so
/// nothing is served that the document does not list.
pub(crate) fn documented() -> OpenApiRouter<AppState> {
    api_router::<AppState>(INFO)
        .routes(routes!(create_run, list_runs))
        .routes(routes!(stop_folder))
        .routes(routes!(get_run, kill_run))
        .routes(routes!(events))
        .routes(routes!(steer))
        .routes(routes!(create_hold))
        .routes(routes!(sessions))
        .routes(routes!(audit))
        .routes(routes!(list_secrets))
        .routes(routes!(set_secret, remove_secret))
        .routes(routes!(media::put_media))
}

/// `GET /v1/audit` answer, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct AuditPage {
    entries: Vec<AuditRow>,
    /// Pass as `before` for the next page; absent on the last.
    next_before: Option<i64>,
}

/// `202`: the run or hold is in (`existing`: it was already).
fn accepted(run_id: RunId, state: RunState, existing: bool) -> Response {
    let body = CreatedRun {
        run_id,
        state,
        existing,
    };
    (StatusCode::ACCEPTED, Json(body)).into_response()
}

async fn audit_row(
    sh: &Shared,
    who: &Principal,
    action: AuditAction,
    run: Option<&str>,
    folder: Option<&str>,
    outcome: AuditOutcome<'_>,
    detail: String,
) {
    let r = AuditRow::new(who.subject(), action, folder, outcome, detail).run(run);
    write_audit(sh, r).await;
}

/// Appends `r` to the audit log; a failure to write it is logged, never the caller's.
async fn write_audit(sh: &Shared, r: AuditRow) {
    if let Err(e) = sh.store.audit(r).await {
        tracing::error!(error = %e, "writing the audit log failed");
    }
}

/// A run the caller may see, or 404.
async fn visible(sh: &Shared, who: &Principal, run_id: &str) -> Result<SpawnRow, ApiFailure> {
    let missing = || ApiFailure::NoRun(run_id.to_owned());
    let Ok(id) = RunId::new(run_id) else {
        return Err(missing());
    };
    match sh.store.get(&id).await? {
        Some(r) if who.covers_folder(&r.folder) => Ok(r),
        _ => Err(missing()),
    }
}

async fn status(sh: &Shared, r: SpawnRow) -> Result<RunStatus, ApiFailure> {
    let outputs = sh.store.outputs(&r.run_id).await?;
    let steers = sh
        .store
        .steers(&r.run_id)
        .await?
        .into_iter()
        .map(|s| SteerStatus {
            steer_id: s.steer_id,
            state: s.state,
        })
        .collect();
    let t = |ms: i64| rfc3339(from_unix_millis(ms));
    Ok(RunStatus {
        run_id: r.run_id,
        folder: r.folder,
        turn_id: r.turn_id,
        state: r.state,
        outcome: r.outcome,
        outputs,
        truncated: r.truncated,
        exit_code: r.exit_code,
        error: r.error,
        created_at: t(r.created_at),
        started_at: r.started_at.map(t),
        ended_at: r.ended_at.map(t),
        steers,
    })
}

/// Whether the caller is a service token (or open dev mode): the only callers that choose a
/// group's network.
fn is_service(who: &Principal) -> bool {
    match who {
        Principal::Open => true,
        Principal::Token(c) => c.typ == hako_shared::auth::TokenType::Service,
    }
}

hako_shared::error_responses!(CreateRunErrors { h::INVALID_JSON, h::INVALID_GROUP, e::SECRETS_TOO_LARGE, h::INSUFFICIENT_SCOPE["`runs:run`"], h::FOLDER_FORBIDDEN, h::FORBIDDEN_GROUP_SETTING, h::BODY_TOO_LARGE, e::QUEUE_FULL });

/// Start a run: queued, then one container in its folder's turn. Idempotent on `turn_id`
/// within the folder (a repeat answers the same run with `existing: true`).
#[utoipa::path(post, path = "/v1/runs", tag = "runs", security(("bearer" = [])),
    request_body = RunRequest,
    responses(
        (status = 202, description = "Queued (or the turn's existing run)", body = CreatedRun),
        CreateRunErrors,
        NoToken,
    ))]
async fn create_run(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(req): ApiJson<RunRequest>,
) -> Result<Response, ApiFailure> {
    who.require(scopes::RUNS_RUN)?;
    let folder = req.folder.as_str().to_owned();
    who.require_folder(&folder)?;
    req.group.validate()?;
    let elevated = req.group.beyond(&sh.cfg.runner.limits);
    // A folder-bound caller may only tighten; an unbound one may set the rest, except the
    // network (and what an allowlist reaches, and the brokered secrets it may use), which
    // only a service token chooses (routd, from the group's config).
    let elevated: Vec<&'static str> = if is_service(&who) {
        Vec::new()
    } else if who.is_unbound() {
        elevated
            .into_iter()
            .filter(|f| matches!(*f, "network" | "egress_allowlist" | "secrets"))
            .collect()
    } else {
        elevated
    };
    if !elevated.is_empty() {
        let refused = ApiFailure::ForbiddenGroupSetting(elevated.clone());
        let outcome = AuditOutcome::Refused(refused.code());
        let r = AuditRow::new(
            who.subject(),
            AuditAction::RunCreate,
            Some(&folder),
            outcome,
            elevated.join(","),
        );
        write_audit(&sh, r.turn(Some(&req.turn_id))).await;
        return Err(refused);
    }
    let secret_bytes: usize = req.secrets.0.iter().map(|(k, v)| k.len() + v.len()).sum();
    if secret_bytes > MAX_SECRETS_BYTES {
        return Err(ApiFailure::SecretsTooLarge(secret_bytes));
    }
    let existing = |r: SpawnRow| accepted(r.run_id, r.state, true);
    let reserved = match sh.reserve(&folder) {
        Ok(r) => r,
        Err(full) => {
            // A repeat of a turn that is already in is answered as such, full or not.
            if let Some(r) = sh.store.run_of_turn(&folder, &req.turn_id).await? {
                return Ok(existing(r));
            }
            return Err(full.into());
        }
    };
    let mut stored = req.clone();
    stored.secrets = Default::default();
    let run_id = new_run_id();
    let row = SpawnRow {
        run_id: run_id.clone(),
        kind: SpawnKind::Run,
        folder: folder.clone(),
        turn_id: req.turn_id.clone(),
        session_id: req.session_id.clone(),
        state: RunState::Queued,
        outcome: None,
        exit_code: None,
        error: None,
        truncated: false,
        container_id: None,
        request: Some(serde_json::to_string(&stored).map_err(ApiFailure::internal)?),
        had_secrets: !req.secrets.0.is_empty(),
        created_at: unix_millis(SystemTime::now()),
        started_at: None,
        ended_at: None,
        deadline_at: None,
    };
    match sh.store.insert(row).await? {
        Inserted::Existing(r) => Ok(existing(*r)),
        Inserted::New => {
            hako_shared::failpoint::hit("runed.run.queued");
            sh.enqueue(
                &run_id,
                &folder,
                SpawnKind::Run,
                Pending {
                    secrets: req.secrets,
                    hold_ttl: Duration::ZERO,
                    request_id: hako_shared::http::current_request_id(),
                },
            );
            drop(reserved);
            sh.emit(Event::State {
                run_id: run_id.clone(),
                state: RunState::Queued,
            });
            let r = AuditRow::new(
                who.subject(),
                AuditAction::RunCreate,
                Some(&folder),
                AuditOutcome::Ok,
                String::new(),
            );
            write_audit(&sh, r.run(Some(&run_id)).turn(Some(&req.turn_id))).await;
            Ok(accepted(run_id, RunState::Queued, false))
        }
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    /// Long-poll until the run is over, at most this long (e.g. `30s`; capped by
    /// RUNED_MAX_WAIT).
    wait: Option<String>,
}

hako_shared::error_responses!(GetRunErrors { e::INVALID_WAIT, h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`runs:read`"], h::NOT_FOUND, h::TOO_MANY_STREAMS });

/// A run's status and output; `?wait=30s` long-polls until it is over.
#[utoipa::path(get, path = "/v1/runs/{run_id}", tag = "runs", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run"), WaitQuery),
    responses(
        (status = 200, description = "The run", body = RunStatus),
        GetRunErrors,
        NoToken,
    ))]
async fn get_run(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(run_id): Path<String>,
    ApiQuery(q): ApiQuery<WaitQuery>,
) -> Result<Json<RunStatus>, ApiFailure> {
    who.require(scopes::RUNS_READ)?;
    let wait = match q.wait.as_deref() {
        None | Some("") => Duration::ZERO,
        Some(w) => hako_shared::config::parse_duration(w)
            .map_err(|e| ApiFailure::InvalidWait(e.to_string()))?
            .min(sh.cfg.max_wait),
    };
    // Subscribe before reading, so that an end between the read and the wait is not missed.
    let mut rx = sh.events.subscribe();
    let mut row = visible(&sh, &who, &run_id).await?;
    if !wait.is_zero() && !row.state.is_terminal() {
        let _pass = sh.watchers.enter(&who.bound_key(), !who.is_unbound())?;
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let ended = tokio::select! {
                r = rx.recv() => match r {
                    Ok(e) => matches!(&*e, Event::State { run_id: id, state } if **id == *run_id && state.is_terminal()),
                    // Missed events: re-read the row.
                    Err(broadcast::error::RecvError::Lagged(_)) => true,
                    Err(broadcast::error::RecvError::Closed) => break,
                },
                () = tokio::time::sleep_until(deadline) => break,
                () = sh.stopping.cancelled() => break,
            };
            if ended {
                row = visible(&sh, &who, &run_id).await?;
                if row.state.is_terminal() {
                    break;
                }
            }
        }
        row = visible(&sh, &who, &run_id).await?;
    }
    Ok(Json(status(&sh, row).await?))
}

/// What an SSE stream of one run carries, whole (a block too large to ride in the broadcast
/// is read from the store first).
fn sse(e: &Event) -> SseEvent {
    let name = match e {
        Event::State { .. } => "state",
        Event::Output { .. } => "output",
    };
    SseEvent::default()
        .event(name)
        .data(serde_json::to_string(e).unwrap_or_default())
}

/// One run's SSE stream: everything stored so far, then each new event; when it lags behind
/// the broadcast (a slow reader), it catches up from the store, so the terminal state is never
/// missed and the stream always ends.
struct RunStream {
    store: crate::store::Store,
    stop: tokio_util::sync::CancellationToken,
    rx: broadcast::Receiver<Arc<Event>>,
    run_id: RunId,
    /// Blocks sent: the next index expected.
    seen: usize,
    /// Read the store before the next broadcast event (at start, and after a lag).
    resync: bool,
    pending: std::collections::VecDeque<Event>,
    /// The last state sent: the store read and the broadcast overlap, and a client must
    /// see each state once, in order.
    state: Option<RunState>,
    done: bool,
    _pass: Option<hako_shared::watchers::Pass>,
}

impl RunStream {
    /// Queues what the store has that was not sent: blocks from `seen`, then the state.
    async fn catch_up(&mut self) -> Result<(), ApiFailure> {
        let row = self
            .store
            .get(&self.run_id)
            .await?
            .ok_or_else(|| ApiFailure::NoRun(self.run_id.to_string()))?;
        for (index, block) in self.store.outputs_from(&self.run_id, self.seen).await? {
            self.seen = index + 1;
            self.pending.push_back(Event::Output {
                run_id: self.run_id.clone(),
                index,
                block: Some(block),
            });
        }
        if self.is_news(row.state) {
            self.pending.push_back(Event::State {
                run_id: self.run_id.clone(),
                state: row.state,
            });
        }
        self.done = row.state.is_terminal();
        Ok(())
    }

    /// Whether `state` moves the stream forward; if so it becomes the last state sent.
    fn is_news(&mut self, state: RunState) -> bool {
        if self.state.is_some_and(|s| s.stage() >= state.stage()) {
            return false;
        }
        self.state = Some(state);
        true
    }

    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.done {
                return None;
            }
            if self.resync {
                self.resync = false;
                if self.catch_up().await.is_err() {
                    return None;
                }
                continue;
            }
            let got = tokio::select! {
                r = self.rx.recv() => r,
                () = self.stop.cancelled() => return None,
            };
            match got {
                Ok(e) if *e.run_id() == self.run_id => match &*e {
                    Event::Output { index, block, .. } => {
                        if *index < self.seen {
                            continue;
                        }
                        if *index > self.seen || block.is_none() {
                            // A gap, or a block too large for the broadcast: from the store.
                            self.resync = true;
                            continue;
                        }
                        self.seen = index + 1;
                        return Some((*e).clone());
                    }
                    Event::State { state, .. } => {
                        if !self.is_news(*state) {
                            continue;
                        }
                        self.done = state.is_terminal();
                        return Some((*e).clone());
                    }
                },
                Ok(_) => continue,
                Err(broadcast::error::RecvError::Lagged(_)) => self.resync = true,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }
}

hako_shared::error_responses!(EventsErrors { h::INSUFFICIENT_SCOPE["`runs:read`"], h::NOT_FOUND, h::TOO_MANY_STREAMS });

/// Server-sent events of one run: what is stored first (blocks, then the state), then each
/// state change and block as it comes; the stream ends after the terminal state.
#[utoipa::path(get, path = "/v1/runs/{run_id}/events", tag = "runs", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run")),
    responses(
        (status = 200, description = "`state` and `output` events, each `data` one JSON event", content_type = "text/event-stream", body = Event),
        NoToken,
        EventsErrors,
    ))]
async fn events(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, ApiFailure> {
    who.require(scopes::RUNS_READ)?;
    let run_id = visible(&sh, &who, &run_id).await?.run_id;
    let pass = sh.watchers.enter(&who.bound_key(), !who.is_unbound())?;
    // Subscribed before the first read of the store, so nothing falls between the two.
    let st = RunStream {
        rx: sh.events.subscribe(),
        store: sh.store.clone(),
        stop: sh.stopping.clone(),
        run_id,
        seen: 0,
        resync: true,
        pending: Default::default(),
        state: None,
        done: false,
        _pass: Some(pass),
    };
    let stream = futures_util::stream::unfold(st, |mut st| async move {
        let e = st.next().await?;
        Some((Ok(sse(&e)), st))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

hako_shared::error_responses!(SteerErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`runs:run`"], h::NOT_FOUND, e::NOT_LIVE });

/// Place follow-up messages into a live run, exactly once. The answer comes as soon as the
/// follow-up is in the run's drop (`placed`); its fate (`taken` by the agent or `returned`
/// when the run ended first) is final in the run's status once the run is terminal. The work
/// runs on a task of its own: a caller that hangs up changes nothing, and asking again with
/// the same `steer_id` answers the same follow-up.
#[utoipa::path(post, path = "/v1/runs/{run_id}/steer", tag = "runs", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run")),
    request_body = SteerRequest,
    responses(
        (status = 200, description = "The follow-up and where it is (`placed`, or a repeat's `taken`/`returned`)", body = SteerReply),
        SteerErrors,
        NoToken,
    ))]
async fn steer(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(run_id): Path<String>,
    ApiJson(body): ApiJson<SteerRequest>,
) -> Result<Json<SteerReply>, ApiFailure> {
    who.require(scopes::RUNS_RUN)?;
    let row = visible(&sh, &who, &run_id).await?;
    let run_id = row.run_id.clone();
    if body.messages.is_empty() {
        return Err(ApiFailure::EmptyMessages);
    }
    let steer_id = match body.steer_id {
        Some(id) if is_valid_id(&id) => id,
        Some(_) => return Err(ApiFailure::InvalidSteerId),
        None => format!("s-{}", new_run_id().trim_start_matches("run-")),
    };
    let msgs: Vec<String> = body.messages.into_iter().map(|m| m.into_text()).collect();
    let reply = |state| SteerReply {
        run_id: run_id.clone(),
        steer_id: steer_id.clone(),
        state,
    };
    if let Some(existing) = sh.store.steer(&run_id, &steer_id).await? {
        return Ok(Json(reply(existing.state)));
    }
    let live = sh.sched().live.get(&run_id).map(|l| l.run.clone());
    let not_live = || ApiFailure::NotLive(run_id.to_string());
    let Some(live) = live else {
        return Err(not_live());
    };
    let runner = sh.runner().map_err(|_| not_live())?;
    let n = msgs.len();
    let task = {
        let (sh, run_id, steer_id) = (sh.clone(), run_id.clone(), steer_id.clone());
        tokio::spawn(async move { place(&sh, &runner, &live, &run_id, &steer_id, &msgs).await })
    };
    let placed = task.await.map_err(ApiFailure::internal)?;
    audit_row(
        &sh,
        &who,
        AuditAction::RunSteer,
        Some(&run_id),
        Some(&row.folder),
        match &placed {
            Ok(s) => AuditOutcome::Steer(*s),
            Err(e) => AuditOutcome::Refused(e.code()),
        },
        format!("{steer_id}: {n} message(s)"),
    )
    .await;
    Ok(Json(reply(placed?)))
}

/// Places one follow-up: staged under a temp name, recorded, then shown to the agent, with
/// the run's gate held throughout so that its end settles what was recorded. Whoever records
/// an id first places it; a concurrent repeat discards its copy.
async fn place(
    sh: &Shared,
    runner: &hako_runner::Runner,
    live: &hako_runner::LiveRun,
    run_id: &RunId,
    steer_id: &str,
    msgs: &[String],
) -> Result<SteerState, ApiFailure> {
    let staged = match runner.stage_followup(live, msgs).await {
        Ok(s) => s,
        Err(hako_runner::RunError::NotLive(_)) => {
            return Err(ApiFailure::NotLive(run_id.to_string()));
        }
        Err(e) => return Err(ApiFailure::internal(e)),
    };
    let now = hako_shared::time::unix_millis(std::time::SystemTime::now());
    match sh
        .store
        .add_steer(run_id, steer_id, staged.name(), now)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            staged.discard();
            return Ok(sh
                .store
                .steer(run_id, steer_id)
                .await?
                .map_or(SteerState::Placed, |r| r.state));
        }
        Err(e) => {
            staged.discard();
            return Err(e.into());
        }
    }
    if let Err(e) = staged.publish(runner).await {
        // Recorded but never shown: the run's end settles it as returned.
        tracing::warn!(run = %run_id, steer = steer_id, error = %e, "placing a follow-up failed");
    }
    Ok(SteerState::Placed)
}

async fn kill_and_wait(sh: &Arc<Shared>, row: &SpawnRow) -> Result<SpawnRow, ApiFailure> {
    let mut rx = sh.events.subscribe();
    sh.kill(&row.run_id, &row.folder).await;
    let deadline = tokio::time::Instant::now()
        + sh.cfg.runner.kill_grace
        + sh.cfg.runner.docker_timeout.min(Duration::from_secs(15));
    loop {
        let r = sh
            .store
            .get(&row.run_id)
            .await?
            .ok_or_else(|| ApiFailure::NoRun(row.run_id.to_string()))?;
        if r.state.is_terminal() {
            return Ok(r);
        }
        tokio::select! {
            _ = rx.recv() => {}
            () = tokio::time::sleep_until(deadline) => return Ok(r),
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

hako_shared::error_responses!(KillRunErrors { h::INSUFFICIENT_SCOPE["`runs:kill`"], h::NOT_FOUND });

/// Kill a run (stop, kill, remove) or release a hold; a kill is its own outcome, never retried.
#[utoipa::path(delete, path = "/v1/runs/{run_id}", tag = "runs", security(("bearer" = [])),
    params(("run_id" = String, Path, description = "The run")),
    responses(
        (status = 200, description = "The run, ended", body = RunStatus),
        NoToken,
        KillRunErrors,
    ))]
async fn kill_run(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(run_id): Path<String>,
) -> Result<Json<RunStatus>, ApiFailure> {
    who.require(scopes::RUNS_KILL)?;
    let row = visible(&sh, &who, &run_id).await?;
    let run_id = row.run_id.clone();
    let row = if row.state.is_terminal() {
        row
    } else {
        let r = kill_and_wait(&sh, &row).await?;
        audit_row(
            &sh,
            &who,
            AuditAction::RunKill,
            Some(&run_id),
            Some(&row.folder),
            AuditOutcome::Ok,
            String::new(),
        )
        .await;
        r
    };
    Ok(Json(status(&sh, row).await?))
}

hako_shared::error_responses!(StopFolderErrors { h::INVALID_JSON, h::INSUFFICIENT_SCOPE["`runs:kill`"], h::FOLDER_FORBIDDEN, e::DOCKER_UNAVAILABLE });

/// Kill a folder's live run and the runs waiting for its slot; with `retire`, also remove
/// the folder's warm box and move its directory to the trash (its group was deleted).
#[utoipa::path(post, path = "/v1/runs/stop", tag = "runs", security(("bearer" = [])),
    request_body = StopRequest,
    responses(
        (status = 200, description = "The runs killed", body = StopReply),
        StopFolderErrors,
        NoToken,
    ))]
async fn stop_folder(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(body): ApiJson<StopRequest>,
) -> Result<Json<StopReply>, ApiFailure> {
    who.require(scopes::RUNS_KILL)?;
    let folder = body.folder.as_str().to_owned();
    who.require_folder(&folder)?;
    // The live run and those still waiting for the folder's slot: a stop that left a
    // queued run to start after it would stop nothing the user sees.
    let ids: Vec<RunId> = {
        let mut s = sh.sched();
        // A box put off for the folder is not made after its stop.
        s.deferred.retain(|(f, _)| *f != folder);
        let live = s
            .live
            .iter()
            .filter(|(_, l)| l.folder == folder && l.kind == SpawnKind::Run)
            .map(|(id, _)| id.clone());
        let queued = s
            .queue
            .waiting(&folder)
            .filter(|e| e.kind == SpawnKind::Run)
            .map(|e| e.run_id.clone());
        live.chain(queued).collect()
    };
    let mut killed = Vec::new();
    for id in ids {
        if let Some(row) = sh.store.get(&id).await? {
            kill_and_wait(&sh, &row).await?;
            killed.push(id);
        }
    }
    if body.retire {
        let runner = sh.runner().map_err(ApiFailure::DockerUnavailable)?;
        runner
            .retire_folder(&body.folder)
            .await
            .map_err(ApiFailure::internal)?;
        audit_row(
            &sh,
            &who,
            AuditAction::FolderRetire,
            None,
            Some(&folder),
            AuditOutcome::Ok,
            String::new(),
        )
        .await;
    }
    audit_row(
        &sh,
        &who,
        AuditAction::RunStop,
        None,
        Some(&folder),
        AuditOutcome::Ok,
        killed
            .iter()
            .map(RunId::as_str)
            .collect::<Vec<_>>()
            .join(","),
    )
    .await;
    Ok(Json(StopReply { folder, killed }))
}

hako_shared::error_responses!(CreateHoldErrors { h::INVALID_JSON, h::INSUFFICIENT_SCOPE["`runs:run`"], h::FOLDER_FORBIDDEN, e::QUEUE_FULL });

/// Claim a folder's run slot for an external job; released by `DELETE /v1/runs/{run_id}`.
#[utoipa::path(post, path = "/v1/holds", tag = "runs", security(("bearer" = [])),
    request_body = HoldRequest,
    responses(
        (status = 202, description = "Queued for the folder's slot", body = CreatedRun),
        CreateHoldErrors,
        NoToken,
    ))]
async fn create_hold(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(body): ApiJson<HoldRequest>,
) -> Result<Response, ApiFailure> {
    who.require(scopes::RUNS_RUN)?;
    let folder = body.folder.as_str().to_owned();
    who.require_folder(&folder)?;
    let ttl = body
        .ttl
        .map_or(sh.cfg.runner.run_timeout, |t| t.0)
        .min(sh.cfg.runner.run_timeout)
        .max(Duration::from_secs(1));
    let reserved = sh.reserve(&folder)?;
    let run_id = new_run_id();
    let row = SpawnRow {
        run_id: run_id.clone(),
        kind: SpawnKind::Hold,
        folder: folder.clone(),
        turn_id: TurnId::new(format!("hold:{run_id}")).expect("a run id in the grammar, prefixed"),
        session_id: String::new(),
        state: RunState::Queued,
        outcome: None,
        exit_code: None,
        error: None,
        truncated: false,
        container_id: None,
        request: Some(
            serde_json::to_string(&HoldInfo {
                ttl_ms: ttl.as_millis() as u64,
            })
            .map_err(ApiFailure::internal)?,
        ),
        had_secrets: false,
        created_at: unix_millis(SystemTime::now()),
        started_at: None,
        ended_at: None,
        deadline_at: None,
    };
    sh.store.insert(row).await?;
    sh.enqueue(
        &run_id,
        &folder,
        SpawnKind::Hold,
        Pending {
            secrets: Default::default(),
            hold_ttl: ttl,
            request_id: hako_shared::http::current_request_id(),
        },
    );
    drop(reserved);
    audit_row(
        &sh,
        &who,
        AuditAction::HoldCreate,
        Some(&run_id),
        Some(&folder),
        AuditOutcome::Ok,
        String::new(),
    )
    .await;
    Ok(accepted(run_id, RunState::Queued, false))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct PageQuery {
    folder: Option<String>,
    before: Option<i64>,
    limit: Option<usize>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct RunsQuery {
    /// Only this folder and the folders below it.
    folder: Option<String>,
    /// Only runs in this state (`queued`, `starting`, `running`, `exited`, `error`, `killed`,
    /// `timed_out`).
    state: Option<String>,
    /// The previous page's `next_before`.
    before: Option<i64>,
    /// At most this many, 1-1000 (default 100).
    limit: Option<usize>,
}

hako_shared::error_responses!(ListRunsErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`runs:read`"], h::NOT_FOUND });

/// Runs and holds, newest first (a folder-bound caller sees its folders only).
#[utoipa::path(get, path = "/v1/runs", tag = "runs", security(("bearer" = [])),
    params(RunsQuery),
    responses(
        (status = 200, description = "A page of runs", body = hako_shared::runs::RunList),
        ListRunsErrors,
        NoToken,
    ))]
async fn list_runs(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<RunsQuery>,
) -> Result<Json<hako_shared::runs::RunList>, ApiFailure> {
    who.require(scopes::RUNS_READ)?;
    let folder = match (q.folder, who.folder()) {
        (Some(f), _) => {
            if !who.covers_folder(&f) {
                return Err(ApiFailure::NoFolder(f));
            }
            Some(f)
        }
        (None, bound) => bound.map(str::to_owned),
    };
    let state = match q.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(RunState::parse(s).ok_or_else(|| {
            ApiFailure::from(h::INVALID_QUERY.error(format!(
                "state {s:?} is none of queued, starting, running, exited, error, killed, timed_out"
            )))
        })?),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sh.store.list(folder, state, q.before, limit).await?;
    let next_before = (rows.len() == limit)
        .then(|| rows.last().map(|(id, _)| *id))
        .flatten();
    let t = |ms: i64| rfc3339(from_unix_millis(ms));
    let runs = rows
        .into_iter()
        .filter(|(_, r)| who.covers_folder(&r.folder))
        .map(|(_, r)| hako_shared::runs::RunSummary {
            run_id: r.run_id,
            kind: r.kind,
            folder: r.folder,
            turn_id: r.turn_id,
            state: r.state,
            outcome: r.outcome,
            exit_code: r.exit_code,
            error: r.error,
            created_at: t(r.created_at),
            started_at: r.started_at.map(t),
            ended_at: r.ended_at.map(t),
        })
        .collect();
    Ok(Json(hako_shared::runs::RunList { runs, next_before }))
}

hako_shared::error_responses!(SessionsErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`sessions:read`"], h::NOT_FOUND });

/// Session history, newest first (a folder-bound caller sees its folders only).
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", security(("bearer" = [])),
    params(PageQuery),
    responses(
        (status = 200, description = "A page of the history", body = SessionPage),
        SessionsErrors,
        NoToken,
    ))]
async fn sessions(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<SessionPage>, ApiFailure> {
    who.require(scopes::SESSIONS_READ)?;
    let folder = match (q.folder, who.folder()) {
        (Some(f), _) => {
            if !who.covers_folder(&f) {
                return Err(ApiFailure::NoFolder(f));
            }
            Some(f)
        }
        (None, bound) => bound.map(str::to_owned),
    };
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sh.store.sessions(folder, q.before, limit).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    Ok(Json(SessionPage {
        sessions: rows,
        next_before: next,
    }))
}

/// Only the operator (an unbound token holding `scope`) reaches brokered secrets.
fn secrets_caller(who: &Principal, scope: &str) -> Result<(), ApiFailure> {
    who.require(scope)?;
    if !who.is_unbound() {
        return Err(ApiFailure::SecretsNeedUnbound);
    }
    Ok(())
}

fn secret_name(raw: &str) -> Result<hako_shared::secrets::SecretName, ApiFailure> {
    hako_shared::secrets::SecretName::parse(raw).map_err(ApiFailure::InvalidSecretName)
}

/// The store's calls run on a blocking thread (small files, but files).
async fn on_store<T: Send + 'static>(
    sh: &Shared,
    f: impl FnOnce(
        &hako_runner::secret_store::SecretStore,
    ) -> Result<T, hako_runner::secret_store::StoreError>
    + Send
    + 'static,
) -> Result<T, ApiFailure> {
    let store = sh.secrets.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(ApiFailure::internal)?
        .map_err(|e| match e {
            hako_runner::secret_store::StoreError::Value(v) => ApiFailure::InvalidSecretValue(v),
            other => ApiFailure::internal(other),
        })
}

hako_shared::error_responses!(ListSecretsErrors { h::INSUFFICIENT_SCOPE["`secrets:read`"], h::FOLDER_FORBIDDEN });

/// The operator's brokered secrets, by name: when each was set, never a value
/// (`specs/egress.md`, Secrets).
#[utoipa::path(get, path = "/v1/secrets", tag = "secrets", security(("bearer" = [])),
    responses(
        (status = 200, description = "The secrets, by name", body = hako_shared::secrets::SecretList),
        NoToken,
        ListSecretsErrors,
    ))]
async fn list_secrets(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<hako_shared::secrets::SecretList>, ApiFailure> {
    secrets_caller(&who, scopes::SECRETS_READ)?;
    let stored = on_store(&sh, |s| s.list()).await?;
    Ok(Json(hako_shared::secrets::SecretList {
        secrets: stored
            .into_iter()
            .map(|s| hako_shared::secrets::SecretView {
                name: s.name,
                set_at: rfc3339(s.set_at),
            })
            .collect(),
    }))
}

hako_shared::error_responses!(SetSecretErrors { e::INVALID_SECRET_NAME, e::INVALID_SECRET_VALUE, h::INVALID_JSON, h::INSUFFICIENT_SCOPE["`secrets:write`"], h::FOLDER_FORBIDDEN });

/// Sets a brokered secret (replacing its value at once). The value goes into the egress
/// proxy's store (0600, the proxy's user) and nowhere else: never the database, a log, an
/// audit row or an answer. Groups name the secrets they use in their `secrets`.
#[utoipa::path(put, path = "/v1/secrets/{name}", tag = "secrets", security(("bearer" = [])),
    params(("name" = String, Path, description = "The secret's name: uppercase letters, digits and _ (an environment variable's name)", example = "GH_TOKEN")),
    request_body = hako_shared::secrets::SecretValueRequest,
    responses(
        (status = 204, description = "Set"),
        SetSecretErrors,
        NoToken,
    ))]
async fn set_secret(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Result<StatusCode, ApiFailure> {
    secrets_caller(&who, scopes::SECRETS_WRITE)?;
    let name = secret_name(&name)?;
    // Parsed here, so that no extractor's message can quote the body.
    let req: hako_shared::secrets::SecretValueRequest =
        serde_json::from_slice(&body).map_err(|_| ApiFailure::InvalidSecretBody)?;
    drop(body);
    let n = name.clone();
    on_store(&sh, move |s| s.set(&n, req.value.as_bytes())).await?;
    audit_row(
        &sh,
        &who,
        AuditAction::SecretSet,
        None,
        None,
        AuditOutcome::Ok,
        format!("name={name}"),
    )
    .await;
    tracing::info!(secret = %name, "brokered secret set");
    Ok(StatusCode::NO_CONTENT)
}

hako_shared::error_responses!(RemoveSecretErrors { e::INVALID_SECRET_NAME, h::INSUFFICIENT_SCOPE["`secrets:write`"], h::FOLDER_FORBIDDEN, h::NOT_FOUND });

/// Removes a brokered secret: from the next request on, the proxy has no value for it and
/// refuses requests that need it (`secret_unavailable`).
#[utoipa::path(delete, path = "/v1/secrets/{name}", tag = "secrets", security(("bearer" = [])),
    params(("name" = String, Path, description = "The secret's name", example = "GH_TOKEN")),
    responses(
        (status = 204, description = "Removed"),
        RemoveSecretErrors,
        NoToken,
    ))]
async fn remove_secret(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiFailure> {
    secrets_caller(&who, scopes::SECRETS_WRITE)?;
    let name = secret_name(&name)?;
    let n = name.clone();
    if !on_store(&sh, move |s| s.remove(&n)).await? {
        return Err(ApiFailure::NoSecret(name.to_string()));
    }
    audit_row(
        &sh,
        &who,
        AuditAction::SecretRemove,
        None,
        None,
        AuditOutcome::Ok,
        format!("name={name}"),
    )
    .await;
    tracing::info!(secret = %name, "brokered secret removed");
    Ok(StatusCode::NO_CONTENT)
}

hako_shared::error_responses!(AuditErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`audit:read`"], h::FOLDER_FORBIDDEN });

/// runed's audit log, newest first (unbound callers only).
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    params(PageQuery),
    responses(
        (status = 200, description = "A page of the audit log", body = AuditPage),
        AuditErrors,
        NoToken,
    ))]
async fn audit(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiQuery(q): ApiQuery<PageQuery>,
) -> Result<Json<AuditPage>, ApiFailure> {
    who.require(scopes::AUDIT_READ)?;
    if !who.is_unbound() {
        return Err(ApiFailure::AuditNeedsUnbound);
    }
    let limit = q.limit.unwrap_or(100).clamp(1, 1000);
    let rows = sh.store.audit_rows(q.before, limit).await?;
    let next = (rows.len() == limit)
        .then(|| rows.last().map(|r| r.id))
        .flatten();
    Ok(Json(AuditPage {
        entries: rows,
        next_before: next,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{EndRow, Store};
    use hako_shared::contract::{BlockStatus, OutputBlock};
    use hako_shared::runs::Outcome;

    fn row(id: &str) -> SpawnRow {
        SpawnRow {
            run_id: hako_shared::ids::RunId::new(id).unwrap(),
            kind: SpawnKind::Run,
            folder: "a".into(),
            turn_id: TurnId::new(format!("t-{id}")).unwrap(),
            session_id: String::new(),
            state: RunState::Running,
            outcome: None,
            exit_code: None,
            error: None,
            truncated: false,
            container_id: None,
            request: None,
            had_secrets: false,
            created_at: 1,
            started_at: None,
            ended_at: None,
            deadline_at: None,
        }
    }

    /// Run `r`'s event stream, from the store and `tx`'s broadcast, from the start.
    fn stream_of(store: &Store, tx: &broadcast::Sender<Arc<Event>>) -> RunStream {
        RunStream {
            store: store.clone(),
            stop: Default::default(),
            rx: tx.subscribe(),
            run_id: r(),
            seen: 0,
            resync: true,
            pending: Default::default(),
            state: None,
            done: false,
            _pass: None,
        }
    }

    fn r() -> hako_shared::ids::RunId {
        hako_shared::ids::RunId::new("r").unwrap()
    }

    fn block(i: usize) -> OutputBlock {
        OutputBlock {
            status: BlockStatus::Ok,
            result: Some(format!("b{i}")),
            new_session_id: None,
            error: None,
        }
    }

    /// The review's finding: on a lag the stream kept waiting, and if the terminal event was
    /// among those missed it never ended. Now it catches up from the store, in order, with
    /// no gap and no repeat, and ends on the terminal state.
    #[tokio::test]
    async fn a_lagging_stream_catches_up_from_the_store_and_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("runed.db")).await.unwrap();
        store.insert(row("r")).await.unwrap();
        let (tx, _) = broadcast::channel::<Arc<Event>>(8);
        let mut st = stream_of(&store, &tx);
        // The snapshot: no block yet, the state.
        assert!(matches!(
            st.next().await,
            Some(Event::State {
                state: RunState::Running,
                ..
            })
        ));
        // 100 blocks and the end, while the subscriber does not read: far past the ring.
        for i in 0..100 {
            store.add_output(&r(), i, &block(i)).await.unwrap();
            let _ = tx.send(Arc::new(Event::Output {
                run_id: r(),
                index: i,
                block: Some(block(i)),
            }));
        }
        let f = EndRow {
            state: RunState::Exited,
            outcome: Outcome::Ok,
            exit_code: Some(0),
            error: None,
            truncated: false,
            container_id: None,
            started_at: None,
            ended_at: 2,
        };
        assert!(store.end_run(&r(), &[RunState::Running], f).await.unwrap());
        let _ = tx.send(Arc::new(Event::State {
            run_id: r(),
            state: RunState::Exited,
        }));
        let mut indexes = Vec::new();
        let mut last = None;
        let all = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while let Some(e) = st.next().await {
                match e {
                    Event::Output { index, block, .. } => {
                        assert_eq!(block.unwrap().result.unwrap(), format!("b{index}"));
                        indexes.push(index);
                    }
                    Event::State { state, .. } => last = Some(state),
                }
            }
        })
        .await;
        assert!(all.is_ok(), "the stream ends");
        assert_eq!(indexes, (0..100).collect::<Vec<_>>());
        assert_eq!(last, Some(RunState::Exited));
    }

    /// The store read and the broadcast overlap: a state already sent in the snapshot (or
    /// one the run has passed) is not sent again, so a client sees each state once, in order.
    #[tokio::test]
    async fn a_stream_sends_each_state_once_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("runed.db")).await.unwrap();
        store.insert(row("r")).await.unwrap();
        let (tx, _) = broadcast::channel::<Arc<Event>>(8);
        let mut st = stream_of(&store, &tx);
        for state in [RunState::Starting, RunState::Running, RunState::Exited] {
            let _ = tx.send(Arc::new(Event::State { run_id: r(), state }));
        }
        let mut states = Vec::new();
        let all = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while let Some(e) = st.next().await {
                if let Event::State { state, .. } = e {
                    states.push(state);
                }
            }
        })
        .await;
        assert!(all.is_ok(), "the stream ends");
        // Running from the store; the broadcast's Starting (passed) and Running (sent) dropped.
        assert_eq!(states, vec![RunState::Running, RunState::Exited]);
    }
}
