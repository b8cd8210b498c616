//! Human approval of held tool calls. A call an ask rule (`?tool`) matches is held here: a
//! request is stored (`approvals`), asked in the turn's chat as an `approval` message, and
//! the call waits for the first verdict, from the chat (`/approve ID`, `/deny ID`) or the API
//! (`POST /v1/approvals/{id}`, `hako approvals`). A request leaves `pending` once, by one
//! conditional update in `routd.db` ([`conclude`]): the first verdict wins, a later one is
//! told who was first. No verdict within the group's wait or the turn ending denies it
//! (fail closed). A request outlives routd: a restart keeps a live turn's requests pending,
//! and the agent's side asking again with the same call's name ([`attach`]) waits on the
//! same request; one no one asks for again is denied. The database is the truth; the
//! waiters here are only woken by it.

use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::ids::TurnId;
use std::sync::Arc;

use hako_mcp::{Call, Scope, ToolError};
use hako_shared::approvals::{ApprovalPolicy, ApprovalState};
use hako_shared::chat::MessageKind;
use serde_json::{Map, Value};

use crate::state::{Shared, now_ms};
use crate::store::{ApprovalRow, Decided};
use crate::waiters::Waiting;

/// The longest text of an argument shown in the chat's request (the rest is cut there, and
/// the request says so; the API, `hako approvals show` and the page show the whole call).
const SHOWN_TEXT: usize = 1000;
/// The largest held call, its arguments as JSON: a person must be able to read what they
/// approve, and each request is stored (a row, a chat message, an audit row).
pub(crate) const MAX_HELD_ARGS: usize = hako_mcp::tools::MAX_TEXT + (4 << 10);
/// The most calls one turn may hold at once: each is a row, a message and an audit row, and
/// a turn has one person to ask.
pub(crate) const MAX_HELD_PER_TURN: usize = 4;

/// Who gives a verdict.
#[derive(Debug, Clone)]
pub(crate) enum Judge<'a> {
    /// A sender writing in a chat. `vouched`: the message came from a caller that vouches for
    /// its `sender` (a chat adapter, the `channel` identity, or the operator); anyone else's
    /// `sender` is only a claim.
    Chat {
        chat: &'a str,
        sender: &'a str,
        vouched: bool,
    },
    /// A caller of the API: who it is (`operator`, `operator@acme`), whether it is unbound
    /// (the operator) and whether its folder covers the request's.
    Api {
        actor: String,
        unbound: bool,
        covers: bool,
    },
}

/// Why a verdict changed nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// No such request, or not one this judge may see (the same answer, on purpose).
    #[error("no approval request {0} waits for this chat or caller")]
    NotFound(String),
    /// The judge may see it but not answer it.
    #[error("{0}")]
    NotAllowed(String),
    /// Someone was first.
    #[error("{id} is already decided: {state} (by {by})", state = .state.as_str())]
    Decided {
        id: String,
        state: ApprovalState,
        by: String,
    },
}

/// The group's approval settings (a group row that does not read is an error: the call is
/// refused, never let through).
async fn policy(sh: &Shared, folder: &str) -> Result<Option<ApprovalPolicy>, ToolError> {
    let group = sh.store.group(folder).await.map_err(internal)?;
    Ok(group.map(|g| g.approvals))
}

fn internal(e: impl std::fmt::Display) -> ToolError {
    tracing::error!(error = %e, "an approval failed inside routd");
    ToolError::internal("routd could not hold the call for approval; try again")
}

/// The arguments as the chat's request shows them, and whether anything was cut: long texts
/// at any depth (a Bash command sits inside `agent_tool`'s `input`).
fn shown(args: &Map<String, Value>) -> (Value, bool) {
    fn cut(v: &Value, cutting: &mut bool) -> Value {
        match v {
            Value::String(s) if s.len() > SHOWN_TEXT => {
                *cutting = true;
                let mut end = SHOWN_TEXT;
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                Value::String(format!("{}… (cut: {} bytes)", &s[..end], s.len()))
            }
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), cut(v, cutting)))
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|v| cut(v, cutting)).collect()),
            v => v.clone(),
        }
    }
    let mut cutting = false;
    let v = Value::Object(
        args.iter()
            .map(|(k, v)| (k.clone(), cut(v, &mut cutting)))
            .collect(),
    );
    (v, cutting)
}

fn wait_text(ms: i64) -> String {
    let s = (ms / 1000).max(1);
    match s {
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// Refuses a call to hold whose arguments (`bytes` of JSON) no person could read whole.
pub(crate) fn readable(tool: &str, bytes: usize) -> Result<(), ToolError> {
    if bytes > MAX_HELD_ARGS {
        return Err(ToolError::invalid(format!(
            "{tool} needs a person's approval, and its arguments are {bytes} bytes: at most \
             {MAX_HELD_ARGS} can be shown to them. Make the call smaller (a script in a file, \
             then a short command that runs it)."
        )));
    }
    Ok(())
}

/// Holds `call` until its verdict: `Ok` when approved.
pub(crate) async fn hold(
    sh: &Arc<Shared>,
    scope: &Scope,
    call: &Call,
    args: &Map<String, Value>,
    key: Option<&hako_mcp::CallKey>,
) -> Result<(), ToolError> {
    let tool = call.tool().name();
    let Some(policy) = policy(sh, scope.folder.as_str()).await? else {
        return Err(ToolError::denied(format!(
            "{tool} needs approval, and the group's approval settings cannot be read: denied"
        )));
    };
    let whole = serde_json::to_vec(args).map_err(internal)?.len();
    readable(tool, whole)?;
    let now = now_ms();
    let wait = policy.wait().as_millis() as i64;
    let row = ApprovalRow {
        id: hako_shared::ids::ApprovalId::random("ap-", 6),
        turn_id: scope.turn_id.clone(),
        folder: scope.folder.clone(),
        chat_jid: scope.chat_jid.clone(),
        tool: tool.to_owned(),
        target: call.target(scope).map(str::to_owned),
        arguments: Value::Object(args.clone()),
        state: ApprovalState::Pending,
        decided_by: None,
        requested_at: now,
        expires_at: now.saturating_add(wait),
        decided_at: None,
        call_key: key.map(|k| k.as_str().to_owned()),
    };
    let id = row.id.clone();
    // Registered before the request can be seen: no verdict can come before its waiter.
    let waiting = Waiting::new(&sh.approvals, &id);
    if !sh
        .store
        .add_approval(row.clone(), MAX_HELD_PER_TURN)
        .await
        .map_err(internal)?
    {
        drop(waiting);
        sh.approvals.forget(&id);
        // The same call asked twice at once: the other asking made the request.
        if let Some(k) = key
            && let Some(first) = sh
                .store
                .approval_of_call(&scope.turn_id, k.as_str())
                .await
                .map_err(internal)?
        {
            return attach(sh, scope, first).await;
        }
        return Err(ToolError::rate_limited(format!(
            "this turn already has {MAX_HELD_PER_TURN} calls waiting for a person: wait for \
             their verdicts before asking for more"
        )));
    }
    sh.metrics.approval("requested");
    gauges(sh).await;
    let who = match policy.from {
        hako_shared::approvals::Approvers::Chat => "anyone in this chat",
        hako_shared::approvals::Approvers::Senders => "the group's named approvers",
        hako_shared::approvals::Approvers::Operator => "the operator (hako approvals)",
    };
    let (shown, cut) = shown(args);
    let text = format!(
        "Approval needed ({id}): the agent wants to run {tool}{} with {shown}.{} {who} may \
         answer /approve {id} or /deny {id} within {}; no answer denies it.",
        row.target
            .as_deref()
            .map(|t| format!(" on {t}"))
            .unwrap_or_default(),
        if cut {
            format!(
                " This is cut: read the whole call ({whole} bytes) with `hako approvals show \
                 {id}` or on the web page before you approve it."
            )
        } else {
            String::new()
        },
        wait_text(wait),
    );
    say(sh, &row, "request", text).await;
    audit(
        sh,
        &format!("turn:{}", scope.turn_id),
        AuditAction::ApprovalRequest,
        &row,
        AuditOutcome::Approval(ApprovalState::Pending),
    )
    .await;

    verdict(sh, scope, &row, waiting).await
}

/// The same call asked again (its connection broke, routd restarted): it waits on the
/// request its first asking made, or reads the verdict given meanwhile. Nothing is asked,
/// counted or written again.
pub(crate) async fn attach(
    sh: &Arc<Shared>,
    scope: &Scope,
    row: ApprovalRow,
) -> Result<(), ToolError> {
    tracing::info!(approval = %row.id, turn = %scope.turn_id, "a held call asked again: waiting on its request");
    let waiting = Waiting::new(&sh.approvals, &row.id);
    verdict(sh, scope, &row, waiting).await
}

/// Waits for request `row`'s verdict (the one transition is [`conclude`]'s): `Ok` when
/// approved; its wait running out or its turn ending denies it.
async fn verdict(
    sh: &Arc<Shared>,
    scope: &Scope,
    row: &ApprovalRow,
    waiting: Waiting<'_>,
) -> Result<(), ToolError> {
    let (id, tool) = (row.id.as_str(), row.tool.as_str());
    let wait = row.expires_at - row.requested_at;
    let ended = sh.turns.live.get(&scope.turn_id).map(|l| l.ended());
    let left = (row.expires_at - now_ms()).max(0) as u64;
    let expires = tokio::time::Instant::now() + std::time::Duration::from_millis(left);
    let state = loop {
        // Enabled before the state is read: a verdict between the read and the wait still
        // wakes it.
        let rung = waiting.notify.notified();
        tokio::pin!(rung);
        rung.as_mut().enable();
        match sh.store.approval(id).await.map_err(internal)? {
            Some(r) if r.state != ApprovalState::Pending => break r.state,
            Some(_) => {}
            None => return Err(internal("the approval request vanished")),
        }
        let end = async {
            match &ended {
                Some(t) => t.cancelled().await,
                None => std::future::pending().await,
            }
        };
        // routd stopping answers nothing: the request stays pending, the connection closes
        // with routd, and the agent's side asks again under the call's name when the
        // restarted routd binds the turn's socket (an answer, even an error, would end the
        // call for good, and the agent would move on without it).
        let stopping = std::future::pending::<Result<(), ToolError>>;
        // Stopping first: at shutdown the driver lets its turn go too, and that is routd
        // stopping, not the turn ending.
        let denial = tokio::select! {
            biased;
            () = sh.stopping.cancelled() => return stopping().await,
            () = &mut rung => continue,
            () = tokio::time::sleep_until(expires) => ApprovalState::TimedOut,
            () = end => ApprovalState::TurnEnded,
        };
        if sh.stopping.is_cancelled() {
            return stopping().await;
        }
        match conclude(sh, id, denial, None).await.map_err(internal)? {
            Some((r, _)) => break r.state,
            None => return Err(internal("the approval request vanished")),
        }
    };
    drop(waiting);
    sh.approvals.forget(id);
    match state {
        ApprovalState::Approved => Ok(()),
        ApprovalState::Denied => Err(ToolError::denied(format!(
            "a person denied this {tool} call ({id}); do not retry it, say what you wanted instead"
        ))),
        ApprovalState::TimedOut => Err(ToolError::denied(format!(
            "no one approved this {tool} call ({id}) within {}: denied",
            wait_text(wait)
        ))),
        ApprovalState::TurnEnded | ApprovalState::Abandoned | ApprovalState::Pending => Err(
            ToolError::denied(format!("the {tool} call ({id}) was denied: its turn ended")),
        ),
    }
}

/// Moves request `id` out of `pending` to `state` if it still is: the one transition, with
/// its effects (the waiter woken, the chat told, the audit row, the metric) exactly once.
/// Answers the row as it is after, and whether this call moved it (`None`: no such request).
pub(crate) async fn conclude(
    sh: &Shared,
    id: &str,
    state: ApprovalState,
    by: Option<String>,
) -> Result<Option<(ApprovalRow, bool)>, hako_shared::db::DbError> {
    match sh
        .store
        .decide_approval(id, state, by.clone(), now_ms())
        .await?
    {
        Decided::Now(row) => {
            sh.approvals.wake(id);
            sh.metrics.approval(state.as_str());
            gauges(sh).await;
            let by = by.as_deref().unwrap_or("routd");
            let text = match state {
                ApprovalState::Approved => format!("{id} approved by {by}: {} runs.", row.tool),
                ApprovalState::Denied => format!("{id} denied by {by}: {} does not run.", row.tool),
                ApprovalState::TimedOut => {
                    format!("{id} denied: no answer in time. {} does not run.", row.tool)
                }
                ApprovalState::TurnEnded => {
                    format!("{id} denied: the turn ended. {} does not run.", row.tool)
                }
                ApprovalState::Abandoned | ApprovalState::Pending => format!(
                    "{id} denied: its call was cut off (routd restarted, or the agent's \
                     connection broke) and the agent did not ask for it again. {} does not run.",
                    row.tool
                ),
            };
            say(sh, &row, "verdict", text).await;
            audit(
                sh,
                by,
                AuditAction::ApprovalVerdict,
                &row,
                AuditOutcome::Approval(state),
            )
            .await;
            Ok(Some((row, true)))
        }
        Decided::Before(row) => Ok(Some((row, false))),
        Decided::Missing => Ok(None),
    }
}

/// A verdict from `judge` on request `id`.
pub(crate) async fn decide(
    sh: &Shared,
    id: &str,
    approve: bool,
    judge: Judge<'_>,
) -> Result<Result<ApprovalRow, Refusal>, hako_shared::db::DbError> {
    let missing = || Refusal::NotFound(id.to_owned());
    let Some(row) = sh.store.approval(id).await? else {
        return Ok(Err(missing()));
    };
    let policy = sh.store.group(&row.folder).await?.map(|g| g.approvals);
    let by = match &judge {
        Judge::Chat {
            chat,
            sender,
            vouched,
        } => {
            // Another chat's request is not there for it to see.
            if **chat != row.chat_jid {
                return Ok(Err(missing()));
            }
            let refusal = if let Some(why) =
                chat_may_not_answer(sh, &row, policy.as_ref(), *vouched)
            {
                Some(format!(
                    "{sender} may not answer {id} from this chat: {why}"
                ))
            } else if !policy.as_ref().is_some_and(|p| p.admits_sender(sender)) {
                Some(format!(
                    "{sender} may not answer {id}: the group's approvals come from {}",
                    match policy.map(|p| p.from) {
                        Some(hako_shared::approvals::Approvers::Operator) | None => "the operator",
                        _ => "its named approvers",
                    }
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                let actor = format!("chat:{chat}:{sender}");
                audit(
                    sh,
                    &actor,
                    AuditAction::ApprovalVerdict,
                    &row,
                    AuditOutcome::Refused("not_allowed"),
                )
                .await;
                return Ok(Err(Refusal::NotAllowed(why)));
            }
            format!("chat:{chat}:{sender}")
        }
        Judge::Api {
            actor,
            unbound,
            covers,
        } => {
            if !unbound && !covers {
                return Ok(Err(missing()));
            }
            let operator_only = policy
                .as_ref()
                .is_none_or(|p| p.from == hako_shared::approvals::Approvers::Operator);
            if !unbound && operator_only {
                audit(
                    sh,
                    actor,
                    AuditAction::ApprovalVerdict,
                    &row,
                    AuditOutcome::Refused("not_allowed"),
                )
                .await;
                return Ok(Err(Refusal::NotAllowed(format!(
                    "{id}: the group's approvals come from the operator only"
                ))));
            }
            actor.clone()
        }
    };
    let state = if approve {
        ApprovalState::Approved
    } else {
        ApprovalState::Denied
    };
    match conclude(sh, id, state, Some(by)).await? {
        Some((after, true)) => Ok(Ok(after)),
        Some((after, false)) => Ok(Err(Refusal::Decided {
            id: id.to_owned(),
            state: after.state,
            by: after.decided_by.unwrap_or_else(|| "routd".into()),
        })),
        None => Ok(Err(missing())),
    }
}

/// Why a verdict from the request's own chat does not count, if it does not. A chat's word
/// is a person's only where that chat is the group's alone and the call stays in it:
/// - `from: chat` in a group reached through a glob route (`tg:*` → `support`): every
///   customer's chat is "the chat", so a customer could approve what their own prompt made
///   the agent do. Such a group names its approvers (`from: senders`) or leaves it to the
///   operator.
/// - `from: chat` for a call that reaches another chat (a `send_message` or `schedule_task`
///   naming one): the people who asked for it are not the ones it reaches.
/// - `from: senders` with a `sender` nobody vouches for: only a chat adapter (the `channel`
///   identity) or the operator says who wrote a message; a tenant's or a browser's post
///   claims a name.
fn chat_may_not_answer(
    sh: &Shared,
    row: &ApprovalRow,
    policy: Option<&ApprovalPolicy>,
    vouched: bool,
) -> Option<&'static str> {
    use hako_shared::approvals::Approvers;
    match policy.map(|p| p.from) {
        Some(Approvers::Chat) => {
            if sh.routing.is_shared(&row.chat_jid) {
                return Some(
                    "the group serves many chats through one route, so its approvers must be \
                     named (approvals.from: senders) or the operator's",
                );
            }
            let elsewhere = matches!(row.tool.as_str(), "send_message" | "schedule_task")
                && row.target.as_deref().is_some_and(|t| row.chat_jid != t);
            elsewhere.then_some(
                "the call reaches another chat; the group's named approvers or the operator \
                 decide it",
            )
        }
        Some(Approvers::Senders) if !vouched => Some(
            "only a message a chat adapter (or the operator) posted names its sender; use \
             `hako approvals` or the web page",
        ),
        _ => None,
    }
}

/// The turn ended: what it held is denied.
pub(crate) async fn end_of_turn(
    sh: &Shared,
    turn_id: &TurnId,
) -> Result<(), hako_shared::db::DbError> {
    for r in sh.store.pending_approvals(Some(turn_id)).await? {
        conclude(sh, &r.id, ApprovalState::TurnEnded, None).await?;
    }
    Ok(())
}

/// At start: requests an earlier routd left pending. Those of a turn that is over are
/// denied (`abandoned`, told); those of a live turn stay pending, orphans until the agent's
/// side asks again with the same call's name ([`attach`]), which its bridge does when the
/// turn's socket is back. Answers how many were denied.
pub(crate) async fn adopt_pending(sh: &Shared) -> Result<usize, hako_shared::db::DbError> {
    let mut denied = 0;
    for r in sh.store.pending_approvals(None).await? {
        let live = matches!(
            sh.store.turn(&r.turn_id).await?.map(|t| t.state),
            Some(s) if !s.is_over()
        );
        if live && r.call_key.is_some() {
            sh.approvals.orphan(&r.id);
        } else {
            conclude(sh, &r.id, ApprovalState::Abandoned, None).await?;
            denied += 1;
        }
    }
    Ok(denied)
}

/// Denies, every second, what no one waits for any more: a request past its wait
/// (`timed_out`), of a turn that ended (`turn_ended`), or an orphan no one asked again for
/// `ROUTD_APPROVAL_REATTACH` (`abandoned`): the agent's side asks again within seconds when
/// it can, and one that does not come back in that time is not coming.
pub(crate) async fn sweep(sh: Arc<Shared>) {
    loop {
        if let Err(e) = sweep_once(&sh).await {
            tracing::warn!(error = %e, "sweeping approval requests failed");
        }
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            () = sh.stopping.cancelled() => return,
        }
    }
}

async fn sweep_once(sh: &Shared) -> Result<(), hako_shared::db::DbError> {
    let now = now_ms();
    for r in sh.store.pending_approvals(None).await? {
        let over = sh
            .store
            .turn(&r.turn_id)
            .await?
            .is_none_or(|t| t.state.is_over());
        let denial = if r.expires_at <= now {
            Some(ApprovalState::TimedOut)
        } else if over {
            Some(ApprovalState::TurnEnded)
        } else if sh.approvals.orphaned_for(&r.id, sh.cfg.approval_reattach) {
            Some(ApprovalState::Abandoned)
        } else {
            None
        };
        if let Some(state) = denial {
            conclude(sh, &r.id, state, None).await?;
            sh.approvals.forget(&r.id);
        }
    }
    Ok(())
}

/// The pending gauges, now (the backlog watcher refreshes them too, as they age).
pub(crate) async fn gauges(sh: &Shared) {
    if let Ok((n, oldest)) = sh.store.approval_backlog().await {
        let age = oldest.map_or(0, |at| (now_ms() - at).max(0) / 1000);
        sh.metrics.approvals_waiting(n, age);
    }
}

async fn say(sh: &Shared, row: &ApprovalRow, what: &str, text: String) {
    let kind = if what == "request" {
        MessageKind::Approval
    } else {
        MessageKind::Notice
    };
    let id = match what {
        "request" => format!("{}.approval.{}", row.turn_id, row.id),
        w => format!("{}.approval.{}.{w}", row.turn_id, row.id),
    };
    if let Err(e) = sh
        .say(
            id,
            &row.chat_jid,
            kind,
            text,
            Some(row.turn_id.to_string()),
            None,
        )
        .await
    {
        tracing::warn!(error = %e, approval = %row.id, "the chat was not told of an approval");
    }
}

async fn audit(
    sh: &Shared,
    actor: &str,
    action: AuditAction,
    row: &ApprovalRow,
    outcome: AuditOutcome<'_>,
) {
    let detail = format!(
        "{} {}{}",
        row.id,
        row.tool,
        row.target
            .as_deref()
            .map(|t| format!(" on {t}"))
            .unwrap_or_default()
    );
    let turn = Some(row.turn_id.as_str());
    sh.audit_turn(actor, action, Some(&row.folder), turn, outcome, detail)
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_arguments_are_cut_for_the_chat_and_say_so() {
        let mut args = Map::new();
        args.insert("text".into(), Value::from("é".repeat(600)));
        args.insert("limit".into(), Value::from(5));
        args.insert(
            "input".into(),
            serde_json::json!({"command": "x".repeat(1500)}),
        );
        let (v, cut) = shown(&args);
        assert!(cut);
        let t = v["text"].as_str().unwrap();
        assert!(t.len() < 1050 && t.ends_with("(cut: 1200 bytes)"), "{t}");
        let c = v["input"]["command"].as_str().unwrap();
        assert!(
            c.ends_with("(cut: 1500 bytes)"),
            "nested texts are cut too: {c}"
        );
        assert_eq!(v["limit"], 5);
        let mut small = Map::new();
        small.insert("text".into(), Value::from("hello"));
        assert_eq!(shown(&small), (Value::Object(small.clone()), false));
        assert_eq!(wait_text(300_000), "5m");
        assert_eq!(wait_text(7_200_000), "2h");
        assert_eq!(wait_text(1_500), "1s");
    }
}
