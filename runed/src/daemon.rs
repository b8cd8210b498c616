//! The daemon's core loop: the scheduler that moves runs from the queue into containers,
//! and each run's life from `queued` to its terminal state. The shared state lives in
//! `state`, a run's record and end in `record`, re-adoption in `adopt`.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use hako_shared::contract::{ContainerInput, Redacted};
use hako_shared::ids::RunId;
use hako_shared::runs::{Outcome, RunRequest, RunState, SpawnKind};
use hako_shared::time::unix_millis;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::record::{end_without_container, finalize, forward, remove_containers, revoke_tokens};
use crate::recover;
use crate::state::{Event, Live, Pending, Shared, Slot, lock};
use crate::tokens::{BrokerError, SpawnToken};
use hako_runner::{BindHook, Bound, LiveRun, NotWarmed, RunControl, RunEnd, RunReport, RunSpec};

/// The scheduler: starts whatever the queue allows, whenever something changes.
pub(crate) async fn scheduler(sh: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = sh.wake.notified() => {}
            _ = tick.tick() => {}
            () = sh.stopping.cancelled() => return,
        }
        sh.gauges();
        if lock(&sh.docker_down).is_some() || !sh.adopted.load(std::sync::atomic::Ordering::SeqCst)
        {
            if sh.probe_docker().await.is_err() {
                continue;
            }
            if !sh.adopted.load(std::sync::atomic::Ordering::SeqCst) {
                recover::adopt_all(&sh).await;
            }
        }
        if let Some((until, _)) = lock(&sh.broker_pause).clone()
            && Instant::now() < until
        {
            continue;
        }
        loop {
            if sh.stopping.is_cancelled() {
                return;
            }
            let next = {
                let mut s = sh.sched();
                let Some((folder, e)) = s.queue.next_ready() else {
                    break;
                };
                let p = s.pending.remove(&e.run_id);
                let control = RunControl {
                    kill: CancellationToken::new(),
                    detach: sh.stopping.child_token(),
                };
                let folder_g = match hako_shared::GroupFolder::new(&folder) {
                    Ok(g) => g,
                    Err(_) => {
                        s.queue.release(&folder, e.kind);
                        continue;
                    }
                };
                let run = LiveRun::new(e.run_id.clone(), folder_g);
                s.live.insert(
                    e.run_id.clone(),
                    Live {
                        folder: folder.clone(),
                        kind: e.kind,
                        control: control.clone(),
                        run: run.clone(),
                    },
                );
                (folder, e, p, control, run)
            };
            sh.gauges();
            let (folder, e, p, control, run) = next;
            let sh2 = sh.clone();
            match e.kind {
                SpawnKind::Run => {
                    // One span per run; the creating request's id goes along (and on to
                    // authd with the spawn token's mint).
                    let rid: Arc<str> = p
                        .as_ref()
                        .and_then(|p| p.request_id.clone())
                        .unwrap_or_else(|| Arc::from("-"));
                    let span = tracing::info_span!("run", run = %e.run_id, folder = %folder, request = %rid);
                    tokio::spawn(
                        hako_shared::http::with_request_id(
                            rid,
                            run_one(sh2, e.run_id, folder, p, control, run),
                        )
                        .instrument(span),
                    );
                }
                SpawnKind::Hold => {
                    let ttl = p.map_or(sh.cfg.runner.run_timeout, |p| p.hold_ttl);
                    tokio::spawn(async move {
                        hold(sh2, e.run_id, control, ttl).await;
                    });
                }
            }
        }
        make_deferred_boxes(&sh);
    }
}

/// A hold keeps its folder's slot until released, its TTL passes, or shutdown.
pub(crate) async fn hold(sh: Arc<Shared>, run_id: RunId, control: RunControl, ttl: Duration) {
    let _slot = Slot::new(&sh, &run_id);
    match sh
        .store
        .mark_running(&run_id, "", unix_millis(SystemTime::now()))
        .await
    {
        Ok(true) => sh.emit(Event::State {
            run_id: run_id.clone(),
            state: RunState::Running,
        }),
        _ => return,
    }
    let (state, outcome) = tokio::select! {
        () = control.kill.cancelled() => (RunState::Exited, Outcome::Ok),
        () = tokio::time::sleep(ttl) => (RunState::TimedOut, Outcome::TimedOut),
        () = control.detach.cancelled() => return,
    };
    end_without_container(&sh, &run_id, state, outcome, None).await;
}

/// An `allowlist` run's brokered secrets, as its token will carry them: each secret the group
/// names, its hosts, and a fresh placeholder. A secret that is not set fails the run, naming
/// it (its requests could only be refused).
fn brokered_for(
    sh: &Shared,
    g: &hako_shared::runs::GroupSpec,
) -> Result<Vec<hako_shared::secrets::SecretClaim>, String> {
    if g.network != hako_shared::runs::Network::Allowlist {
        return Ok(Vec::new());
    }
    g.secrets
        .iter()
        .map(|b| {
            if !sh.secrets.contains(&b.name) {
                return Err(format!(
                    "secret {} is not set: the operator sets it with `hako secrets set {}`",
                    b.name, b.name
                ));
            }
            let hosts = b
                .parsed_hosts()
                .map_err(|(i, e)| format!("secrets: {} hosts[{i}]: {e}", b.name))?;
            Ok(hako_shared::secrets::SecretClaim {
                name: b.name.clone(),
                hosts: hosts.iter().map(ToString::to_string).collect(),
                placeholder: hako_shared::secrets::Placeholder::random()
                    .map_err(|e| format!("no entropy for a placeholder: {e}"))?,
            })
        })
        .collect()
}

/// Where one run is between the queue and its end. `run_one` drives it; [`Step::next`] is its
/// one transition, and every way out is an [`Exit`], handled in one place ([`leave`]).
enum Step {
    /// Taken from the queue, with what waited in memory (its secrets).
    Taken(Option<Pending>),
    /// Read back from disk and marked `starting`: its spawn token is minted next.
    Starting(Box<RunRequest>),
    /// Its token is minted and on disk: the runner runs it.
    Minted {
        req: Box<RunRequest>,
        token: SpawnToken,
        brokered: Vec<hako_shared::secrets::SecretClaim>,
    },
    /// The runner is done with it.
    Ran { req: Box<RunRequest>, end: RunEnd },
    /// Over: how it leaves.
    Over(Exit),
}

/// How a run leaves `run_one`.
enum Exit {
    /// Killed while it waited: never started, nothing to record.
    Gone,
    /// Ended before any container existed: recorded with this state, outcome and reason.
    Failed {
        state: RunState,
        outcome: Outcome,
        why: Option<String>,
    },
    /// Back to the queue, keeping its slot's place (authd or Docker away); its live tokens
    /// revoked first when `revoke`.
    Requeue {
        secrets: hako_shared::contract::Secrets,
        revoke: bool,
    },
    /// Detached at shutdown: the next runed re-adopts it.
    Detached,
    /// Docker went away with its container: re-attached once Docker answers.
    Readopt { container: String },
    /// Ran to an end: recorded, its containers removed, the folder's next box made.
    Settled {
        req: Box<RunRequest>,
        report: Box<RunReport>,
        next_box: Box<RunSpec>,
    },
}

/// What every step of one run shares.
struct RunCtx {
    sh: Arc<Shared>,
    run_id: RunId,
    folder: String,
    control: RunControl,
    live: Arc<LiveRun>,
}

/// One run, from the queue to its end.
async fn run_one(
    sh: Arc<Shared>,
    run_id: RunId,
    folder: String,
    p: Option<Pending>,
    control: RunControl,
    live: Arc<LiveRun>,
) {
    let cx = RunCtx {
        sh,
        run_id,
        folder,
        control,
        live,
    };
    // The folder's slot goes back on every way out, but for those that hand the run on (back
    // to the queue, re-attached after an outage, detached at shutdown): `leave` decides.
    let slot = Slot::new(&cx.sh, &cx.run_id);
    let mut step = Step::Taken(p);
    let exit = loop {
        step = match step {
            Step::Over(exit) => break exit,
            step => step.next(&cx).await,
        };
    };
    leave(&cx, slot, exit).await;
}

impl Step {
    async fn next(self, cx: &RunCtx) -> Step {
        match self {
            Step::Taken(p) => taken(cx, p).await,
            Step::Starting(req) => mint(cx, req).await,
            Step::Minted {
                req,
                token,
                brokered,
            } => run(cx, req, token, brokered).await,
            Step::Ran { req, end } => Step::Over(ran(cx, req, end).await),
            over @ Step::Over(_) => over,
        }
    }
}

fn fail(state: RunState, outcome: Outcome, why: impl Into<String>) -> Step {
    Step::Over(Exit::Failed {
        state,
        outcome,
        why: Some(why.into()),
    })
}

/// Reads the request back (it waited on disk; only its secrets waited in memory) and marks
/// the run `starting`.
async fn taken(cx: &RunCtx, p: Option<Pending>) -> Step {
    let (sh, run_id) = (&cx.sh, &cx.run_id);
    let stored = match sh.store.get(run_id).await {
        Ok(row) => row
            .and_then(|r| r.request)
            .and_then(|r| serde_json::from_str::<RunRequest>(&r).ok()),
        Err(e) => {
            tracing::error!(run = %run_id, error = %e, "reading a queued request failed");
            None
        }
    };
    let Some(mut req) = stored else {
        // Nothing to run (a lost request): fail it so the caller retries.
        return fail(
            RunState::Error,
            Outcome::Fatal,
            "the run's request was lost",
        );
    };
    req.secrets = p.map(|p| p.secrets).unwrap_or_default();
    match sh
        .store
        .transition(run_id, &[RunState::Queued], RunState::Starting)
        .await
    {
        Ok(true) => {
            sh.emit(Event::State {
                run_id: run_id.clone(),
                state: RunState::Starting,
            });
            Step::Starting(Box::new(req))
        }
        // Killed while waiting: never started.
        Ok(false) => Step::Over(Exit::Gone),
        Err(e) => {
            tracing::error!(run = %run_id, error = %e, "recording a start failed");
            Step::Over(Exit::Gone)
        }
    }
}

/// Mints the run's spawn token and puts its jti on disk before any container can hold it,
/// so every token a container ever held can be revoked, by this process or after a restart
/// (`retry_revocations`).
async fn mint(cx: &RunCtx, req: Box<RunRequest>) -> Step {
    let (sh, run_id) = (&cx.sh, &cx.run_id);
    let ceiling = sh.cfg.runner.ceiling(req.group.timeout.map(|t| t.0));
    let brokered = match brokered_for(sh, &req.group) {
        Ok(b) => b,
        Err(why) => return fail(RunState::Error, Outcome::Error, why),
    };
    // Egress only where the proxy enforces it: other runs' tokens name no host.
    let hosts: &[String] = if req.group.network == hako_shared::runs::Network::Allowlist {
        &req.group.egress_allowlist
    } else {
        &[]
    };
    let token = match sh
        .broker
        .mint(
            &cx.folder,
            &req.turn_id,
            run_id,
            hosts,
            &brokered,
            ceiling + sh.cfg.token_margin,
        )
        .await
    {
        Ok(t) => t,
        Err(BrokerError::Unavailable(why)) => {
            tracing::warn!(run = %run_id, error = %why, "no spawn token; the run stays queued");
            *lock(&sh.broker_pause) = Some((Instant::now() + Duration::from_secs(1), why));
            return Step::Over(Exit::Requeue {
                secrets: req.secrets,
                revoke: false,
            });
        }
        Err(e @ BrokerError::Refused(_)) => {
            return fail(RunState::Error, Outcome::Error, e.to_string());
        }
    };
    *lock(&sh.broker_pause) = None;
    if let Err(e) = sh
        .store
        .add_token(&token.jti, run_id, &cx.folder, token.expires_at)
        .await
    {
        tracing::error!(run = %run_id, error = %e, "recording the spawn token failed");
        if let Err(e) = sh.broker.revoke(&token.jti).await {
            tracing::warn!(run = %run_id, error = %e, "revoking the unrecorded spawn token failed; it expires with the run ceiling");
        }
        return fail(
            RunState::Error,
            Outcome::Fatal,
            format!("recording the spawn token failed: {e}"),
        );
    }
    hako_shared::failpoint::hit("runed.token.minted");
    Step::Minted {
        req,
        token,
        brokered,
    }
}

/// Hands the run to the runner, its output forwarded as it comes, until the runner is done.
async fn run(
    cx: &RunCtx,
    req: Box<RunRequest>,
    token: SpawnToken,
    brokered: Vec<hako_shared::secrets::SecretClaim>,
) -> Step {
    let (sh, run_id) = (&cx.sh, &cx.run_id);
    let input = ContainerInput {
        session_id: req.session_id.clone(),
        messages: req.messages.clone(),
        system_prompt: req.system_prompt.clone(),
        grants: req.grants.clone(),
        folder: cx.folder.clone(),
        sender_jid: req.sender_jid.clone(),
        turn_id: req.turn_id.to_string(),
        run_id: run_id.to_string(),
        token: Redacted(token.token),
        secrets: req.secrets.clone(),
        query_timeout_ms: None,
    };
    let spec = RunSpec {
        run_id: run_id.clone(),
        turn_id: Some(req.turn_id.clone()),
        folder: req.folder.clone(),
        input,
        group: req.group.clone(),
        close: sh.close_when(),
        bind: Some(bind_hook(sh.clone(), run_id.clone())),
        brokered,
    };
    let (tx, fwd) = forward(sh.clone(), run_id.clone());
    let end = match sh.runner() {
        Ok(r) => r.run(spec, tx, cx.control.clone(), cx.live.clone()).await,
        Err(why) => {
            drop(tx);
            RunEnd::Finished(Box::new(RunReport {
                run_id: run_id.clone(),
                sidecars: false,
                state: RunState::Error,
                outcome: Outcome::Fatal,
                terminal: false,
                blocks: Vec::new(),
                truncated: false,
                exit_code: None,
                error: Some(why),
                log: String::new(),
                log_file: None,
                container_id: None,
                started_at: None,
                ended_at: SystemTime::now(),
            }))
        }
    };
    let _ = fwd.await;
    Step::Ran { req, end }
}

/// Decides how a run the runner is done with leaves: settled, or handed on when Docker went
/// away under it.
async fn ran(cx: &RunCtx, req: Box<RunRequest>, end: RunEnd) -> Exit {
    let (sh, run_id) = (&cx.sh, &cx.run_id);
    let report = match end {
        RunEnd::Detached => return Exit::Detached,
        RunEnd::Finished(report) => report,
    };
    let never_started = report.state == RunState::Error
        && !report.terminal
        && report.container_id.is_none()
        && report.started_at.is_none();
    if never_started && sh.probe_docker().await.is_err() {
        // Docker went away before the container existed: back to the queue.
        tracing::warn!(run = %run_id, "docker unavailable; the run goes back to the queue");
        return Exit::Requeue {
            secrets: req.secrets,
            revoke: true,
        };
    }
    // The container exists but runed lost it (the wait broke and the container could not be
    // inspected, nor removed): if Docker is away, the container most likely still runs. The
    // run keeps its slot and state and is re-attached once Docker answers, so it finishes
    // normally, is not run twice, and its container is removed.
    let lost = report.state == RunState::Error && !report.terminal;
    if lost
        && let Some(cid) = report.container_id.clone()
        && sh.probe_docker().await.is_err()
    {
        tracing::warn!(
            run = %run_id,
            container = cid,
            "docker unavailable mid-run; re-attaching when it is back"
        );
        return Exit::Readopt { container: cid };
    }
    // What the folder's next box is made from: the run without its input (token, secrets)
    // and without this run's placeholders.
    let next_box = RunSpec {
        run_id: run_id.clone(),
        turn_id: Some(req.turn_id.clone()),
        folder: req.folder.clone(),
        input: ContainerInput::default(),
        group: req.group.clone(),
        close: sh.close_when(),
        bind: None,
        brokered: Vec::new(),
    };
    Exit::Settled {
        req,
        report,
        next_box: Box::new(next_box),
    }
}

/// The one place a run leaves: what is recorded, and whether its folder's slot is given back
/// (dropped) or kept for the run that is handed on.
async fn leave(cx: &RunCtx, slot: Slot<'_>, exit: Exit) {
    let (sh, run_id) = (&cx.sh, &cx.run_id);
    match exit {
        Exit::Gone => {}
        Exit::Failed {
            state,
            outcome,
            why,
        } => end_without_container(sh, run_id, state, outcome, why).await,
        Exit::Requeue { secrets, revoke } => {
            if revoke {
                revoke_tokens(sh, run_id).await;
            }
            slot.keep();
            sh.back_to_queue(run_id, &cx.folder, secrets).await;
        }
        Exit::Detached => {
            slot.keep();
            sh.detached(run_id);
        }
        Exit::Readopt { container } => {
            slot.keep();
            recover::readopt_after_outage(
                sh.clone(),
                run_id.clone(),
                container,
                cx.control.clone(),
            )
            .await;
        }
        Exit::Settled {
            req,
            report,
            next_box,
        } => {
            finalize(sh, &cx.folder, &req.turn_id, &req.session_id, &report).await;
            remove_containers(sh, &report).await;
            if report.container_id.is_some() {
                hako_shared::failpoint::hit("runed.container.removed");
            }
            // The folder's next box, made while this run still holds the folder's slot (it
            // prepares the folder's directories), once this one's container is gone.
            if report.container_id.is_some() && !sh.stopping.is_cancelled() {
                warm_next(sh, &next_box).await;
            }
            drop(slot);
        }
    }
}

/// Records that a run took a warm box, before the box gets its input: the box's labels name
/// no run, so this is what re-adoption after a restart finds it by.
fn bind_hook(sh: Arc<Shared>, run_id: RunId) -> BindHook {
    BindHook(Arc::new(move |b: Bound| {
        let (sh, run_id) = (sh.clone(), run_id.clone());
        Box::pin(async move {
            let now = unix_millis(SystemTime::now());
            match sh
                .store
                .bind_warm(&run_id, &b.container_id, now, b.deadline_ms)
                .await
            {
                Ok(true) => {
                    hako_shared::failpoint::hit("runed.warm.taken");
                    sh.emit(Event::State {
                        run_id,
                        state: RunState::Running,
                    })
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::error!(run = %run_id, error = %e, "recording the warm box taken failed")
                }
            }
        })
    }))
}

/// Starts the folder's next box, if its group and the install keep one, once runed is
/// otherwise idle. The box is made while this run still holds its folder's slot, so making
/// it while another folder's run waits would delay a run that is sure to come for a box that
/// may never be taken (eight folders on four slots threw most of theirs away); and making it
/// while other runs are live takes CPU from them (the last runs of a burst made boxes beside
/// each other, and warm boxes cost 1-2.5% of a burst's throughput). Such a folder's box is put
/// off until no run is live or waiting ([`make_deferred_boxes`]); a conversation alone on
/// runed gets its box at once.
async fn warm_next(sh: &Shared, spec: &RunSpec) {
    let Ok(runner) = sh.runner() else { return };
    if let Err(e) = runner.warms(&spec.group) {
        if e != NotWarmed::Off {
            tracing::debug!(folder = %spec.folder, reason = %e, "no warm box");
        }
        return;
    }
    {
        let mut s = sh.sched();
        let folder = spec.folder.as_str();
        s.deferred.retain(|(f, _)| f != folder);
        if s.queue.len() > s.queue.folder_len(folder) {
            tracing::debug!(folder = %spec.folder, "no warm box: other folders' runs wait for a slot");
            return;
        }
        // This run still counts: another is live beside it.
        if s.queue.active() > 1 {
            tracing::debug!(folder = %spec.folder, "warm box put off: other runs are live");
            s.deferred.push((folder.to_owned(), spec.clone()));
            // Only the newest `RUNED_WARM_MAX` are ever made: a busy runed with many folders
            // keeps no more.
            let over = s.deferred.len().saturating_sub(sh.cfg.runner.warm_max);
            s.deferred.drain(..over);
            return;
        }
    }
    make_box(sh, &runner, spec).await;
}

/// Makes the boxes [`warm_next`] put off, once no run is live or waiting: the newest
/// folders' first, as many as the pool keeps (`RUNED_WARM_MAX`), each while it holds its
/// folder's slot (a run of the folder that comes meanwhile waits for the box, and takes it).
fn make_deferred_boxes(sh: &Arc<Shared>) {
    let claimed: Vec<(FolderClaim, RunSpec)> = {
        let mut s = sh.sched();
        if s.deferred.is_empty() || !s.queue.is_empty() || s.queue.active() > 0 {
            return;
        }
        let all = std::mem::take(&mut s.deferred);
        let mut out = Vec::new();
        for (folder, spec) in all.into_iter().rev() {
            // A hold has the folder: no box (the run after the hold decides anew).
            if s.queue.is_busy(&folder) {
                continue;
            }
            s.queue.claim(&folder, SpawnKind::Run);
            out.push((FolderClaim(sh.clone(), folder), spec));
        }
        out
    };
    for (claim, spec) in claimed {
        tokio::spawn(async move {
            let sh = &claim.0;
            if sh.stopping.is_cancelled() {
                return;
            }
            if let Ok(runner) = sh.runner() {
                make_box(sh, &runner, &spec).await;
            }
        });
    }
}

/// A folder's slot taken to make its box: given back (and the scheduler woken) when dropped.
struct FolderClaim(Arc<Shared>, String);

impl Drop for FolderClaim {
    fn drop(&mut self) {
        self.0.sched().queue.release(&self.1, SpawnKind::Run);
        self.0.gauges();
        self.0.wake.notify_one();
    }
}

/// Makes `spec.folder`'s next box; a box not made is logged, never an error of the run.
async fn make_box(sh: &Shared, runner: &hako_runner::Runner, spec: &RunSpec) {
    match runner.prestart(spec).await {
        Ok(()) => hako_shared::failpoint::hit("runed.warm.recorded"),
        Err(NotWarmed::Off) => {}
        Err(e @ (NotWarmed::PerRun | NotWarmed::Image(_) | NotWarmed::Full(_))) => {
            tracing::debug!(folder = %spec.folder, reason = %e, "no warm box")
        }
        Err(e @ NotWarmed::Failed(_)) => {
            tracing::warn!(folder = %spec.folder, error = %e, "starting a warm box failed")
        }
    }
    sh.gauges();
}
