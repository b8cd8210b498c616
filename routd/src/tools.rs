//! The turn's tools as routd carries them out: the message log, the progress note, scheduled
//! tasks, the group's session and sub-groups. [`hako_mcp::dispatch`] has parsed the call,
//! checked the grants and that the turn is live; what a call may reach beyond its grants (a
//! chat that routes to the group, a sub-folder of its own) is checked here.

use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use std::sync::Arc;

use hako_mcp::tools::{
    Call, CancelTask, GetHistory, RegisterGroup, ScheduleTask, SendMessage, SpawnGroup,
};
use hako_mcp::{Backend, Scope, ToolError};
use hako_shared::chat::MessageKind;
use hako_shared::chat::TurnState;
use hako_shared::cron::Cron;
use hako_shared::grants::Grants;
use hako_shared::ids::random_id;
use hako_shared::runs::Trust;
use hako_shared::time::{from_unix_millis, parse_rfc3339, rfc3339};
use hako_shared::{ChatJid, GroupFolder};
use serde_json::{Value, json};

use crate::live::Writes;
use crate::state::{Shared, now_ms};
use crate::store::{GroupRow, NewInbound, SetBy, TaskRow};

/// The furthest a one-off task may be scheduled ahead.
const MAX_AHEAD_MS: i64 = 366 * 24 * 3600 * 1000;

/// The scope of a turn's tools: its folder, chat and its group's grants (a group whose
/// stored grants no longer parse gets no tool, never every tool). `None` when the group is
/// gone.
pub(crate) async fn scope_of(
    sh: &Shared,
    t: &crate::store::TurnRow,
) -> Result<Option<Scope>, hako_shared::db::DbError> {
    let Some(group) = sh.store.group(&t.folder).await? else {
        return Ok(None);
    };
    let folder = t.folder.clone();
    let trust = group.spec.trust;
    let grants = Grants::parse(&group.grants, trust).unwrap_or_else(|e| {
        tracing::error!(%folder, error = %e, "the group's grants do not parse; its turn gets no tools");
        Grants::none(trust)
    });
    Ok(Some(Scope {
        folder,
        turn_id: t.turn_id.clone(),
        chat_jid: t.chat_jid.clone(),
        grants,
    }))
}

/// routd's backend of the turn's tools.
pub(crate) struct RoutdTools {
    pub sh: Arc<Shared>,
}

fn internal(e: impl std::fmt::Display) -> ToolError {
    tracing::error!(error = %e, "a tool call failed inside routd");
    ToolError::internal("routd could not complete the call; try again")
}

fn task_json(t: &TaskRow) -> Value {
    json!({
        "id": t.id,
        "chat_jid": t.chat_jid,
        "prompt": t.prompt,
        "cron": t.cron,
        "next_at": t.next_at.map(|ms| rfc3339(from_unix_millis(ms))),
        "state": t.state.as_str(),
        "fired": t.fired,
    })
}

impl RoutdTools {
    /// The chat a call names, which must route to the scope's group (the turn's own always
    /// does).
    fn own_chat(&self, scope: &Scope, chat: Option<String>) -> Result<ChatJid, ToolError> {
        let Some(chat) = chat.filter(|c| *c != scope.chat_jid) else {
            return Ok(scope.chat_jid.clone());
        };
        let chat = crate::routing::parse_jid("chat_jid", &chat).map_err(ToolError::invalid)?;
        if self.sh.routing.resolve(&chat).as_ref() != Some(&scope.folder) {
            return Err(ToolError::not_found(format!(
                "chat {chat:?} does not belong to the group {}",
                scope.folder
            )));
        }
        Ok(chat)
    }

    /// A sub-folder of the scope's folder (never the folder itself).
    fn sub_folder(scope: &Scope, raw: &str) -> Result<GroupFolder, ToolError> {
        let f = GroupFolder::new(raw).map_err(|e| ToolError::invalid(format!("folder: {e}")))?;
        if f == scope.folder || !scope.folder.contains(&f) {
            return Err(ToolError {
                code: hako_mcp::ToolCode::NotGranted,
                message: format!(
                    "folder {f}: a group may only manage sub-folders of its own ({}/…)",
                    scope.folder
                ),
            });
        }
        Ok(f)
    }

    /// Counts what a call writes into the log against the turn's bounds and its group's
    /// bytes of the day: over either, the call is refused (`rate_limited`, 429 over HTTP)
    /// and nothing is written. A turn could fill the disk otherwise (6,151 messages, 407 MB
    /// of routd.db in 8 s).
    async fn count_write(&self, scope: &Scope, add: Writes) -> Result<(), ToolError> {
        let bounds = self.sh.cfg.turn_writes;
        if let Some(live) = self.sh.turns.live.get(&scope.turn_id)
            && !live.write(add, |w| {
                w.messages <= bounds.messages
                    && w.bytes <= bounds.bytes
                    && w.status <= bounds.status
            })
        {
            return Err(ToolError::rate_limited(format!(
                "this turn has written as much as a turn may ({} messages, {} bytes of text, {} \
                 status edits: ROUTD_TURN_MAX_MESSAGES, _BYTES, _STATUS); say the rest in the \
                 turn's answer",
                bounds.messages, bounds.bytes, bounds.status
            )));
        }
        let day = crate::gateway::utc_day(now_ms());
        let limit = self.sh.cfg.group_bytes_per_day;
        if !self
            .sh
            .store
            .add_group_write(scope.folder.as_str(), &day, add.bytes, limit)
            .await
            .map_err(internal)?
        {
            return Err(ToolError::rate_limited(format!(
                "the group {} has written {limit} bytes today (UTC), its bound \
                 (ROUTD_GROUP_MAX_BYTES_PER_DAY)",
                scope.folder
            )));
        }
        Ok(())
    }

    async fn audit(&self, scope: &Scope, action: AuditAction, detail: String) {
        let actor = format!("turn:{}", scope.turn_id);
        let turn = Some(scope.turn_id.as_str());
        self.sh
            .audit_turn(
                &actor,
                action,
                Some(scope.folder.as_str()),
                turn,
                AuditOutcome::Ok,
                detail,
            )
            .await;
    }

    async fn send_message(&self, scope: &Scope, c: SendMessage) -> Result<Value, ToolError> {
        let chat = self.own_chat(scope, c.chat_jid)?;
        if c.text.len() > self.sh.cfg.max_content {
            return Err(ToolError::invalid(format!(
                "text is {} bytes; at most {} (ROUTD_MAX_CONTENT)",
                c.text.len(),
                self.sh.cfg.max_content
            )));
        }
        self.count_write(
            scope,
            Writes {
                messages: 1,
                bytes: c.text.len() as u64,
                status: 0,
            },
        )
        .await?;
        // A caller's key makes the id stable: a retry appends nothing.
        let id = match &c.idempotency_key {
            Some(k) => crate::store::keyed_message_id(&format!("{}.send.", scope.turn_id), k, ""),
            None => random_id(&format!("{}.send.", scope.turn_id), 8),
        };
        let seq = self
            .sh
            .say(
                id.clone(),
                &chat,
                MessageKind::Message,
                c.text,
                Some(scope.turn_id.to_string()),
                None,
            )
            .await
            .map_err(internal)?;
        Ok(json!({"id": id, "chat_jid": chat, "seq": seq, "duplicate": seq.is_none()}))
    }

    async fn get_history(&self, scope: &Scope, c: GetHistory) -> Result<Value, ToolError> {
        let limit = c.limit.unwrap_or(50) as usize;
        let rows = self
            .sh
            .store
            .messages(&scope.chat_jid, c.before, None, limit)
            .await
            .map_err(internal)?;
        let next_before = (rows.len() == limit)
            .then(|| rows.first().map(|m| m.seq))
            .flatten();
        let messages: Vec<Value> = rows
            .iter()
            .map(|m| {
                json!({
                    "seq": m.seq,
                    "direction": m.direction,
                    "kind": m.kind,
                    "sender": m.sender,
                    "sender_name": m.sender_name,
                    "content": m.content,
                    "at": rfc3339(from_unix_millis(m.timestamp)),
                })
            })
            .collect();
        Ok(json!({"chat_jid": scope.chat_jid, "messages": messages, "next_before": next_before}))
    }

    async fn set_status(&self, scope: &Scope, text: String) -> Result<Value, ToolError> {
        self.count_write(
            scope,
            Writes {
                messages: 0,
                bytes: text.len() as u64,
                status: 1,
            },
        )
        .await?;
        let sh = &self.sh;
        let webhook = sh.chats.webhook_for(&scope.chat_jid).is_some();
        let seq = sh
            .store
            .set_status(&scope.turn_id, &scope.chat_jid, text, webhook, now_ms())
            .await
            .map_err(internal)?;
        sh.metrics.message_out(MessageKind::Status.as_str());
        sh.chats.told(&scope.chat_jid, webhook);
        Ok(json!({"id": format!("{}.status", scope.turn_id), "seq": seq}))
    }

    async fn schedule_task(&self, scope: &Scope, c: ScheduleTask) -> Result<Value, ToolError> {
        let chat = self.own_chat(scope, c.chat_jid)?;
        let now = now_ms();
        let (next_at, cron) = match (c.at, c.after, c.cron) {
            (Some(at), None, None) => {
                let ms = parse_rfc3339(&at).ok_or_else(|| {
                    ToolError::invalid(format!(
                        "at {at:?}: an RFC 3339 instant, e.g. 2026-12-01T09:00:00Z"
                    ))
                })?;
                if ms < now - 60_000 {
                    return Err(ToolError::invalid(format!("at {at:?} is in the past")));
                }
                (ms, None)
            }
            (None, Some(after), None) => {
                let d = hako_shared::config::parse_duration(&after)
                    .map_err(|e| ToolError::invalid(format!("after {after:?}: {e}")))?;
                (now.saturating_add(d.as_millis() as i64), None)
            }
            (None, None, Some(expr)) => {
                let parsed = Cron::parse(&expr).map_err(|e| ToolError::invalid(e.to_string()))?;
                let next = parsed
                    .next_after(now)
                    .ok_or_else(|| ToolError::invalid(format!("cron {expr:?} never fires")))?;
                (next, Some(expr))
            }
            _ => {
                return Err(ToolError::invalid("give exactly one of at, after, cron"));
            }
        };
        if next_at > now + MAX_AHEAD_MS && cron.is_none() {
            return Err(ToolError::invalid("at most a year ahead"));
        }
        let active = self
            .sh
            .store
            .active_tasks(scope.folder.as_str())
            .await
            .map_err(internal)?;
        if active >= self.sh.cfg.max_tasks as i64 {
            return Err(ToolError {
                code: hako_mcp::ToolCode::Conflict,
                message: format!(
                    "the group has {active} active tasks, the most it may have (ROUTD_MAX_TASKS); cancel one first"
                ),
            });
        }
        let row = TaskRow {
            id: hako_shared::ids::TaskId::random("task-", 6),
            folder: scope.folder.clone(),
            chat_jid: chat,
            prompt: c.prompt,
            cron,
            next_at: Some(next_at),
            state: crate::store::TaskState::Active,
            fired: 0,
            last_fired_at: None,
            created_by: scope.turn_id.to_string(),
            created_at: now,
        };
        self.sh
            .store
            .add_task(row.clone())
            .await
            .map_err(internal)?;
        self.sh.tasks_changed.notify_one();
        self.audit(scope, AuditAction::TaskSchedule, row.id.to_string())
            .await;
        Ok(task_json(&row))
    }

    async fn list_tasks(&self, scope: &Scope) -> Result<Value, ToolError> {
        let rows = self
            .sh
            .store
            .tasks(scope.folder.as_str(), false)
            .await
            .map_err(internal)?;
        Ok(json!({"tasks": rows.iter().map(task_json).collect::<Vec<_>>()}))
    }

    async fn cancel_task(&self, scope: &Scope, c: CancelTask) -> Result<Value, ToolError> {
        let done = self
            .sh
            .store
            .cancel_task(scope.folder.as_str(), &c.id, now_ms())
            .await
            .map_err(internal)?;
        if !done {
            return Err(ToolError::not_found(format!(
                "no active task {:?} in this group",
                c.id
            )));
        }
        self.sh.tasks_changed.notify_one();
        self.audit(scope, AuditAction::TaskCancel, c.id.clone())
            .await;
        Ok(json!({"id": c.id, "state": "cancelled"}))
    }

    async fn reset_session(&self, scope: &Scope) -> Result<Value, ToolError> {
        self.sh
            .store
            .set_session(scope.folder.as_str(), &scope.chat_jid, None, now_ms())
            .await
            .map_err(internal)?;
        // This turn's own `newSessionId` must not bring the session back at its end.
        if let Some(live) = self.sh.turns.live.get(&scope.turn_id) {
            live.reset_session();
        }
        self.audit(scope, AuditAction::SessionReset, String::new())
            .await;
        Ok(json!({"reset": true, "from": "the next turn"}))
    }

    async fn register_group(&self, scope: &Scope, c: RegisterGroup) -> Result<Value, ToolError> {
        let f = Self::sub_folder(scope, &c.folder)?;
        if c.name.chars().count() > 128 {
            return Err(ToolError::invalid("name: 1-128 characters"));
        }
        if c.system_prompt.as_ref().is_some_and(|p| p.len() > 64 << 10) {
            return Err(ToolError::invalid("system_prompt: at most 64 KiB"));
        }
        let max = self.sh.cfg.max_tenant_groups;
        let existing = self.sh.store.group(f.as_str()).await.map_err(internal)?;
        // What the operator set (or a tenant made from it) is theirs: an agent re-registering
        // it would replace their grants and settings with its own.
        if existing.as_ref().is_some_and(|g| g.set_by != SetBy::Agent) {
            return Err(ToolError {
                code: hako_mcp::ToolCode::NotGranted,
                message: format!(
                    "the group {f} exists and was set by its {}; register_group changes only \
                     groups an agent made",
                    existing.as_ref().map_or("operator", |g| g.set_by.as_str())
                ),
            });
        }
        if existing.is_none()
            && self
                .sh
                .store
                .groups_under(scope.folder.as_str())
                .await
                .map_err(internal)?
                >= max
        {
            return Err(ToolError::rate_limited(format!(
                "{} has {max} groups, the most it may make (ROUTD_MAX_TENANT_GROUPS)",
                scope.folder
            )));
        }
        let grants = c.grants.unwrap_or_default();
        // A sub-group is untrusted: it cannot have the main-only tools, whatever it is given.
        Grants::parse(&grants, Trust::Untrusted).map_err(|e| ToolError::invalid(e.to_string()))?;
        let row = GroupRow {
            folder: f.clone(),
            name: c.name,
            system_prompt: c.system_prompt.unwrap_or_default(),
            grants,
            spec: Default::default(),
            // Who approves its held calls stays the operator's to say.
            approvals: existing.map(|g| g.approvals).unwrap_or_default(),
            updated_at: now_ms(),
            set_by: SetBy::Agent,
        };
        let created = self.sh.store.put_group(row).await.map_err(internal)?;
        self.sh
            .routing
            .reload(&self.sh.store)
            .await
            .map_err(internal)?;
        self.sh.turns.wake.notify_one();
        self.audit(scope, AuditAction::GroupRegister, f.to_string())
            .await;
        Ok(json!({"folder": f.as_str(), "chat_jid": format!("web:{f}"), "created": created}))
    }

    async fn spawn_group(&self, scope: &Scope, c: SpawnGroup) -> Result<Value, ToolError> {
        let f = Self::sub_folder(scope, &c.folder)?;
        // Its prompt arrives in the folder's web: chat, which must be a JID routd can read.
        let chat = ChatJid::web(&f)
            .map_err(|e| ToolError::invalid(format!("folder {f}: its chat web:{f} {e}")))?;
        if self
            .sh
            .store
            .group(f.as_str())
            .await
            .map_err(internal)?
            .is_none()
        {
            return Err(ToolError::not_found(format!(
                "no group in {f}; register_group first"
            )));
        }
        let id = random_id(&format!("spawn:{}:", scope.turn_id), 6);
        let now = now_ms();
        self.sh
            .store
            .ingest(NewInbound {
                id: id.clone(),
                chat_jid: chat.clone(),
                kind: MessageKind::Message,
                sender: format!("group:{}", scope.folder),
                sender_name: None,
                content: c.prompt,
                timestamp: now,
                reply_to: None,
                body_hash: String::new(),
                now,
            })
            .await
            .map_err(internal)?;
        self.sh.chats.told(&chat, false);
        self.sh.turns.wake.notify_one();
        self.audit(scope, AuditAction::GroupSpawn, f.to_string())
            .await;
        Ok(json!({"folder": f.as_str(), "chat_jid": chat, "message_id": id}))
    }
}

impl Backend for RoutdTools {
    fn record(&self, tool: hako_shared::grants::Tool, outcome: Result<(), &'static str>) {
        self.sh
            .metrics
            .tool_call(tool.name(), outcome.err().unwrap_or("ok"));
    }

    async fn is_live(&self, scope: &Scope) -> bool {
        matches!(
            self.sh.store.turn(&scope.turn_id).await,
            Ok(Some(t)) if matches!(t.state, TurnState::Starting | TurnState::Running)
        )
    }

    async fn ask(
        &self,
        scope: &Scope,
        call: &Call,
        args: &serde_json::Map<String, Value>,
        key: Option<&hako_mcp::CallKey>,
    ) -> Result<(), ToolError> {
        // The same call asked again (its connection broke, routd restarted) is the request
        // it made the first time: nothing is counted or written again.
        if let Some(k) = key
            && let Some(row) = self
                .sh
                .store
                .approval_of_call(&scope.turn_id, k.as_str())
                .await
                .map_err(internal)?
        {
            return crate::approvals::attach(&self.sh, scope, row).await;
        }
        // A held call is written three times (its request, the chat's message, an audit
        // row): it counts as a message of the turn's and its bytes against the turn's and
        // the group's bounds, like any other write.
        let bytes = serde_json::to_vec(args).map_or(0, |v| v.len());
        crate::approvals::readable(call.tool().name(), bytes)?;
        let bytes = bytes as u64;
        self.count_write(
            scope,
            Writes {
                messages: 1,
                bytes,
                status: 0,
            },
        )
        .await?;
        crate::approvals::hold(&self.sh, scope, call, args, key).await
    }

    async fn call(&self, scope: &Scope, call: Call) -> Result<Value, ToolError> {
        match call {
            Call::SendMessage(c) => self.send_message(scope, c).await,
            Call::GetHistory(c) => self.get_history(scope, c).await,
            Call::SetStatus(c) => self.set_status(scope, c.text).await,
            Call::ScheduleTask(c) => self.schedule_task(scope, c).await,
            Call::ListTasks(_) => self.list_tasks(scope).await,
            Call::CancelTask(c) => self.cancel_task(scope, c).await,
            Call::ResetSession(_) => self.reset_session(scope).await,
            Call::RegisterGroup(c) => self.register_group(scope, c).await,
            Call::SpawnGroup(c) => self.spawn_group(scope, c).await,
            // Answered by the dispatch itself.
            Call::AgentTool(c) => Ok(c.allow()),
        }
    }
}
