//! The turn's tools in chat mode (seed `003_…`): the same MCP server as routd's, in-process,
//! with a backend that has no daemon behind it. `send_message`, `spawn_group` and
//! `register_group` need routd (another chat, the group registry): they answer
//! `not_available`. The others work on the conversation itself: `get_history` reads it,
//! `set_status` shows the note on stderr, `schedule_task` fires its prompt into the chat while
//! it is open, `reset_session` makes the next container start a fresh session.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use hako_mcp::tools::{GetHistory, ScheduleTask};
use hako_mcp::{Backend, Call, Scope, ToolError};
use hako_shared::time::{from_unix_millis, rfc3339, unix_millis};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One line of the conversation.
#[derive(Debug, Clone)]
pub struct Line {
    /// Its place.
    pub seq: i64,
    /// `in` (the user, a task) or `out` (the agent).
    pub direction: &'static str,
    /// The text.
    pub content: String,
    /// Unix ms.
    pub at: i64,
}

struct Task {
    id: String,
    prompt: String,
    cron: Option<hako_shared::cron::Cron>,
    cron_text: Option<String>,
    next_at: i64,
    timer: tokio::task::JoinHandle<()>,
}

/// What the tools share with the chat.
pub struct CliTools {
    /// The conversation, oldest first.
    pub transcript: Mutex<Vec<Line>>,
    /// Open while the chat runs; calls after its end get `turn_ended`.
    pub open: AtomicBool,
    /// Set by `reset_session`; the chat starts its next container without a session.
    pub reset: AtomicBool,
    /// Where fired tasks' prompts and status notes go.
    events: mpsc::Sender<ToolEvent>,
    tasks: Mutex<Vec<Task>>,
    seq: AtomicU64,
}

/// What a tool asks of the chat.
#[derive(Debug)]
pub enum ToolEvent {
    /// A scheduled prompt is due: it becomes a line of the conversation.
    Prompt(String),
    /// The agent's progress note.
    Status(String),
}

/// The most tasks a chat keeps.
const MAX_TASKS: usize = 100;

fn unavailable(tool: &str, why: &str) -> ToolError {
    ToolError {
        code: hako_mcp::ToolCode::NotAvailable,
        message: format!("{tool} is not available in CLI mode: {why}"),
    }
}

fn now_ms() -> i64 {
    unix_millis(SystemTime::now())
}

impl CliTools {
    /// Tools whose prompts and notes go to `events`.
    pub fn new(events: mpsc::Sender<ToolEvent>) -> Arc<Self> {
        Arc::new(Self {
            transcript: Mutex::new(Vec::new()),
            open: AtomicBool::new(true),
            reset: AtomicBool::new(false),
            events,
            tasks: Mutex::new(Vec::new()),
            seq: AtomicU64::new(0),
        })
    }

    /// Adds a line to the conversation.
    pub fn record(&self, direction: &'static str, content: &str) {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst) as i64 + 1;
        lock(&self.transcript).push(Line {
            seq,
            direction,
            content: content.to_owned(),
            at: now_ms(),
        });
    }

    /// Ends the tools: no more calls, no more firings.
    pub fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
        for t in lock(&self.tasks).drain(..) {
            t.timer.abort();
        }
    }

    fn history(&self, c: &GetHistory) -> Value {
        let limit = c.limit.unwrap_or(50) as usize;
        let t = lock(&self.transcript);
        let below: Vec<&Line> = t
            .iter()
            .filter(|l| c.before.is_none_or(|b| l.seq < b))
            .collect();
        let page = &below[below.len().saturating_sub(limit)..];
        let next_before = (below.len() > page.len())
            .then(|| page.first().map(|l| l.seq))
            .flatten();
        let messages: Vec<Value> = page
            .iter()
            .map(|l| {
                json!({"seq": l.seq, "direction": l.direction, "kind": "message",
                    "content": l.content, "at": rfc3339(from_unix_millis(l.at))})
            })
            .collect();
        json!({"chat_jid": "cli", "messages": messages, "next_before": next_before})
    }

    fn schedule(self: &Arc<Self>, c: ScheduleTask) -> Result<Value, ToolError> {
        let now = now_ms();
        let (next_at, cron, cron_text) = match (&c.at, &c.after, &c.cron) {
            (Some(at), None, None) => (
                hako_shared::time::parse_rfc3339(at)
                    .ok_or_else(|| ToolError::invalid(format!("at: {at:?} is not RFC 3339")))?,
                None,
                None,
            ),
            (None, Some(after), None) => {
                let d = hako_shared::config::parse_duration(after)
                    .map_err(|e| ToolError::invalid(format!("after: {e}")))?;
                (now + d.as_millis() as i64, None, None)
            }
            (None, None, Some(expr)) => {
                let cron = hako_shared::cron::Cron::parse(expr)
                    .map_err(|e| ToolError::invalid(format!("cron: {e}")))?;
                let next = cron
                    .next_after(now)
                    .ok_or_else(|| ToolError::invalid("cron: it never fires"))?;
                (next, Some(cron), Some(expr.clone()))
            }
            _ => {
                return Err(ToolError::invalid("give exactly one of at, after and cron"));
            }
        };
        let mut tasks = lock(&self.tasks);
        tasks.retain(|t| !t.timer.is_finished());
        if tasks.len() >= MAX_TASKS {
            return Err(ToolError::invalid(format!(
                "at most {MAX_TASKS} tasks in a chat"
            )));
        }
        let id = format!("task-{}", self.seq.fetch_add(1, Ordering::SeqCst) + 1);
        let timer = tokio::spawn(fire(
            Arc::downgrade(self),
            c.prompt.clone(),
            next_at,
            cron.clone(),
        ));
        tasks.push(Task {
            id: id.clone(),
            prompt: c.prompt,
            cron,
            cron_text,
            next_at,
            timer,
        });
        Ok(
            json!({"id": id, "next_at": rfc3339(from_unix_millis(next_at)),
            "note": "in CLI mode a task fires only while this chat is open"}),
        )
    }
}

/// Waits for a task's times and sends its prompt, once per time, while the chat is open.
async fn fire(
    tools: std::sync::Weak<CliTools>,
    prompt: String,
    mut at: i64,
    cron: Option<hako_shared::cron::Cron>,
) {
    loop {
        let wait = (at - now_ms()).max(0) as u64;
        tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
        let Some(t) = tools.upgrade() else { return };
        if !t.open.load(Ordering::SeqCst) {
            return;
        }
        let _ = t.events.send(ToolEvent::Prompt(prompt.clone())).await;
        match cron.as_ref().and_then(|c| c.next_after(now_ms())) {
            Some(next) => at = next,
            None => return,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The backend, as a handle the MCP server owns.
pub struct Handle(pub Arc<CliTools>);

impl Backend for Handle {
    async fn is_live(&self, _scope: &Scope) -> bool {
        self.0.open.load(Ordering::SeqCst)
    }

    async fn call(&self, _scope: &Scope, call: Call) -> Result<Value, ToolError> {
        let t = &self.0;
        match call {
            Call::SendMessage(_) => Err(unavailable(
                "send_message",
                "there is no other chat; write your answer as your reply",
            )),
            Call::SpawnGroup(_) => Err(unavailable("spawn_group", "it needs routd")),
            // Answered by the dispatch itself.
            Call::AgentTool(c) => Ok(c.allow()),
            Call::RegisterGroup(_) => Err(unavailable(
                "register_group",
                "there is no group registry without routd",
            )),
            Call::GetHistory(c) => Ok(t.history(&c)),
            Call::SetStatus(c) => {
                let _ = t.events.send(ToolEvent::Status(c.text.clone())).await;
                Ok(json!({"id": "cli.status", "shown": true}))
            }
            Call::ScheduleTask(c) => t.schedule(c),
            Call::ListTasks(_) => {
                let mut tasks = lock(&t.tasks);
                tasks.retain(|x| !x.timer.is_finished());
                let list: Vec<Value> = tasks
                    .iter()
                    .map(|x| {
                        json!({"id": x.id, "prompt": x.prompt, "cron": x.cron_text,
                            "next_at": rfc3339(from_unix_millis(
                                x.cron.as_ref().and_then(|c| c.next_after(now_ms())).unwrap_or(x.next_at)))})
                    })
                    .collect();
                Ok(json!({"tasks": list}))
            }
            Call::CancelTask(c) => {
                let mut tasks = lock(&t.tasks);
                let Some(i) = tasks.iter().position(|x| x.id == c.id) else {
                    return Err(ToolError::not_found(format!("no task {}", c.id)));
                };
                tasks.remove(i).timer.abort();
                Ok(json!({"id": c.id, "state": "cancelled"}))
            }
            Call::ResetSession(_) => {
                t.reset.store(true, Ordering::SeqCst);
                Ok(json!({"reset": true, "from": "the next container"}))
            }
        }
    }
}
