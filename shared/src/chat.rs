//! Wire types of routd, the routing plane: messages and chats, groups and routes, turns,
//! webhooks. Channel adapters, the CLI and the tests speak these; routd serves them.

use serde::{Deserialize, Serialize};

use crate::approvals::ApprovalPolicy;
use crate::folder::GroupFolder;
use crate::runs::GroupSpec;

/// Which way a message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// From the chat to hako.
    In,
    /// From hako (the agent, or routd itself) to the chat.
    Out,
}

crate::wire_names!(Direction { In => "in", Out => "out" });

/// What a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MessageKind {
    /// A chat message (inbound), or the agent's reply (outbound).
    Message,
    /// A slash command routd handled itself (`/new`, `/stop`, `/ping`, `/chatid`).
    Command,
    /// A notice from routd to the chat (a command's answer, a turn stopped or failed).
    Notice,
    /// The turn's progress note (`set_status`): one per turn, edited in place (the same id,
    /// a higher `version`, moved to the end of the log).
    Status,
    /// A scheduled task's prompt arriving in the chat (inbound; it starts a turn).
    Task,
    /// routd asks the chat to approve or deny a held tool call (outbound; its id is
    /// `<turn>.approval.<approval id>`, its text names the request and how to answer).
    Approval,
}

crate::wire_names!(MessageKind {
    Message => "message",
    Command => "command",
    Notice => "notice",
    Status => "status",
    Task => "task",
    Approval => "approval",
});

/// Where a message stands. An inbound message moves `pending` → `answered` or `failed`
/// (a command is `handled` at once); an outbound one is `sent` (no webhook for its chat) or
/// `delivering` → `delivered` or `undeliverable`. A state only moves forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum MessageState {
    /// Inbound, not answered yet.
    Pending,
    /// Inbound: a turn answered it (or ended without retry: stopped, an error reply).
    Answered,
    /// Inbound: every try of its turn failed.
    Failed,
    /// Inbound: a command routd handled.
    Handled,
    /// Outbound, no webhook for the chat: it is in the log (and on SSE), nothing more to do.
    Sent,
    /// Outbound, waiting for (another) webhook attempt.
    Delivering,
    /// Outbound: the webhook took it.
    Delivered,
    /// Outbound: every attempt failed, or the message grew too old.
    Undeliverable,
}

crate::wire_names!(MessageState {
    Pending => "pending",
    Answered => "answered",
    Failed => "failed",
    Handled => "handled",
    Sent => "sent",
    Delivering => "delivering",
    Delivered => "delivered",
    Undeliverable => "undeliverable",
});

/// The life of a turn: `starting` → `running` → `done`, `failed` or `killed`, with
/// `waiting` (a retry's backoff) between a try that gave the chat nothing and the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum TurnState {
    /// About to ask runed for the try's run (its id is not known yet).
    Starting,
    /// The try's run is live on runed.
    Running,
    /// Waiting out a retry's backoff.
    Waiting,
    /// Answered.
    Done,
    /// Every try failed, or the run could not be started at all.
    Failed,
    /// Stopped on request.
    Killed,
}

// In the order of a turn's life.
crate::wire_names!(TurnState {
    Starting => "starting",
    Running => "running",
    Waiting => "waiting",
    Done => "done",
    Failed => "failed",
    Killed => "killed",
});

impl TurnState {
    /// The states of a turn that is not over.
    pub const LIVE: [TurnState; 3] = [TurnState::Starting, TurnState::Running, TurnState::Waiting];

    /// Whether the turn is over.
    pub fn is_over(self) -> bool {
        !Self::LIVE.contains(&self)
    }
}

/// `POST /v1/messages` body: one inbound chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    /// The channel's id for the message (1-128 of `[A-Za-z0-9._:-]`); posting the same id
    /// again with the same body is answered as a duplicate, with another body refused. Made
    /// up when absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:-]{1,128}$"))]
    pub id: Option<String>,
    /// The chat, e.g. `tg:-100123` or `web:acme/support` (1-256 printable characters).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub chat_jid: String,
    /// Who wrote it (1-256 printable characters).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub sender: String,
    /// Their display name (at most 256 characters).
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(max_length = 256, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")
    )]
    pub sender_name: Option<String>,
    /// The text (at most `ROUTD_MAX_CONTENT` bytes, 64 KiB by default).
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub content: String,
    /// When it was written, Unix milliseconds (routd's clock when absent).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0))]
    pub timestamp: Option<i64>,
    /// The id of the message it answers (1-128 printable characters).
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub reply_to: Option<String>,
}

/// `POST /v1/messages` answer (201 new, 200 duplicate).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Posted {
    /// The message id.
    pub id: String,
    /// Its place in the log (the chat's event id).
    pub seq: i64,
    /// The chat.
    pub chat_jid: String,
    /// Whether a route takes the chat to a group now (if not, the message waits, stored, for
    /// a route to appear).
    pub routed: bool,
    /// The group folder the chat routes to, when routed.
    pub folder: Option<String>,
    /// Whether this id was posted before (with the same body).
    pub duplicate: bool,
}

/// A message as routd serves it (history and events).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MessageView {
    /// Its place in the log: increasing, the cursor of history pages and the SSE event id.
    pub seq: i64,
    /// The message id (outbound ones are stable: `<turn>.<attempt>.<block>` for replies).
    pub id: crate::ids::MessageId,
    /// The chat.
    pub chat_jid: String,
    /// In or out.
    pub direction: Direction,
    /// Message, command or notice.
    pub kind: MessageKind,
    /// Who wrote it (`hako` for outbound).
    pub sender: String,
    /// Their display name.
    pub sender_name: Option<String>,
    /// The text.
    pub content: String,
    /// Unix milliseconds.
    pub timestamp: i64,
    /// The message it answers.
    pub reply_to: Option<String>,
    /// The turn that answered it (inbound) or produced it (outbound).
    pub turn_id: Option<String>,
    /// Where it stands (inbound and outbound states differ).
    pub state: MessageState,
    /// Edits of the message so far (a `status` message's text changes in place): a client
    /// shows the highest version of each id.
    #[serde(default)]
    pub version: u32,
}

/// `GET /v1/chats/{jid}/messages` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MessagePage {
    /// Messages in log order.
    pub messages: Vec<MessageView>,
    /// Pass as `before` for older messages; absent when there are none.
    pub next_before: Option<i64>,
}

/// `PUT /v1/groups/{folder}` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// A display name (1-128 printable characters).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 128,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub name: String,
    /// The system prompt of the group's turns.
    #[serde(default)]
    pub system_prompt: String,
    /// Grant rules handed to the agent.
    #[serde(default)]
    pub grants: Vec<String>,
    /// The container settings of the group's runs (checked as runed checks them).
    #[serde(default)]
    pub group: GroupSpec,
    /// Who approves the calls its ask rules (`?tool`) hold, and how long they wait.
    #[serde(default)]
    pub approvals: ApprovalPolicy,
}

/// A group as routd serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupView {
    /// The folder.
    pub folder: GroupFolder,
    /// The display name.
    pub name: String,
    /// The system prompt of the group's turns.
    pub system_prompt: String,
    /// Grant rules handed to the agent.
    pub grants: Vec<String>,
    /// The container settings of the group's runs.
    pub group: GroupSpec,
    /// Who approves the calls its ask rules hold, and how long they wait.
    pub approvals: ApprovalPolicy,
    /// The agent sessions its chats' next turns resume, one per chat (a group serving many
    /// chats shares its files between them, never a session), the most recent first (at
    /// most 20).
    pub sessions: Vec<ChatSession>,
    /// Unix ms.
    pub updated_at: i64,
    /// The host variables whose values this group's boxes get as they are (its
    /// `env_allowlist`): a secret among them is readable by the agent and every program it
    /// runs. Lend it as a brokered secret instead (`hako secrets`, the group's `secrets`).
    #[serde(default)]
    pub values_in_box: Vec<String>,
}

/// The agent session of one chat of a group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChatSession {
    /// The chat.
    pub chat_jid: String,
    /// The session its next turn resumes.
    pub session_id: String,
    /// Unix ms of its last change.
    pub updated_at: i64,
}

/// `GET /v1/groups` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupList {
    /// The groups the caller covers, by folder.
    pub groups: Vec<GroupView>,
}

/// The largest route position, either way (JSON-safe, far from overflow).
pub const MAX_ROUTE_POSITION: i64 = 1_000_000_000_000;

/// `POST /v1/routes` body: chats whose JID matches `pattern` go to `folder`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewRoute {
    /// A chat JID, exactly, or a glob: `*` any run of characters, `?` one (1-256 characters).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 256,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub pattern: String,
    /// The group folder.
    pub folder: GroupFolder,
    /// Where it goes in the order (lower first), at most [`MAX_ROUTE_POSITION`] either way;
    /// after the last rule when absent.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = -1_000_000_000_000_i64, maximum = 1_000_000_000_000_i64))]
    pub position: Option<i64>,
}

/// A route rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteView {
    /// Its id.
    pub id: i64,
    /// The pattern.
    pub pattern: String,
    /// The folder.
    pub folder: String,
    /// Its place in the order.
    pub position: i64,
}

/// `GET /v1/routes` answer, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RouteList {
    /// The rules, first match wins; `web:<folder>` chats go to their folder without one.
    pub routes: Vec<RouteView>,
}

/// `POST /v1/webhooks` body: outbound messages of chats whose JID starts with `prefix` are
/// POSTed to `url`, signed with `secret`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewWebhook {
    /// The channel: a JID prefix such as `tg:` (1-64 characters; one webhook per prefix).
    #[cfg_attr(
        feature = "openapi",
        schema(
            min_length = 1,
            max_length = 64,
            pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$"
        )
    )]
    pub prefix: String,
    /// `http://` or `https://` URL.
    #[cfg_attr(feature = "openapi", schema(pattern = "^https?://[^/?#@\\s]+"))]
    pub url: String,
    /// The HMAC-SHA256 key of the signatures (16-256 bytes of UTF-8: no character bound in
    /// the schema, which counts characters); never shown again.
    pub secret: String,
}

/// A webhook as routd serves it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookView {
    /// Its id.
    pub id: i64,
    /// The channel prefix.
    pub prefix: String,
    /// The URL.
    pub url: String,
}

/// `GET /v1/webhooks` answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookList {
    /// The webhooks.
    pub webhooks: Vec<WebhookView>,
}

/// What a webhook receiver gets for each outbound message (the body routd signs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WebhookDelivery {
    /// The message.
    pub message: MessageView,
}

/// A turn: one agent run (and its retries) answering a batch of a chat's messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnView {
    /// The turn id (derived from the batch).
    pub turn_id: crate::ids::TurnId,
    /// The folder.
    pub folder: String,
    /// The chat.
    pub chat_jid: String,
    /// Where the turn stands.
    pub state: TurnState,
    /// Attempts made so far (1 for the first run).
    pub attempt: i64,
    /// The current (or last) run on runed.
    pub run_id: Option<crate::ids::RunId>,
    /// The last run's outcome.
    pub outcome: Option<crate::runs::Outcome>,
    /// What went wrong.
    pub error: Option<String>,
    /// Replies delivered to the chat.
    pub replies: i64,
    /// The ids of the messages it answers (its batch and what was steered in).
    pub messages: Vec<crate::ids::MessageId>,
    /// Unix ms.
    pub created_at: i64,
    /// Unix ms.
    pub ended_at: Option<i64>,
}

/// `GET /v1/turns` answer, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnList {
    /// The turns.
    pub turns: Vec<TurnView>,
    /// Pass as `before` for the next page.
    pub next_before: Option<i64>,
}

/// A scheduled task as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskView {
    /// `task-<hex>`.
    pub id: crate::ids::TaskId,
    /// The group it belongs to.
    pub folder: String,
    /// The chat its prompt arrives in.
    pub chat_jid: String,
    /// The prompt.
    pub prompt: String,
    /// Its cron schedule (UTC), for a repeating task.
    pub cron: Option<String>,
    /// Its next firing (RFC 3339), while active.
    pub next_at: Option<String>,
    /// `active`, `done` or `cancelled`.
    pub state: String,
    /// How many times it fired.
    pub fired: i64,
    /// The turn that scheduled it.
    pub created_by: String,
}

/// `GET /v1/tasks` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TaskList {
    /// Soonest first (at most 1000).
    pub tasks: Vec<TaskView>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The name a state is stored under is the name it travels under: the store writes
    /// `as_str` and the wire writes serde's name, and a client reads both.
    #[test]
    fn stored_names_are_wire_names_and_read_back() {
        fn check<T>(all: &[T], as_str: fn(T) -> &'static str, parse: fn(&str) -> Option<T>)
        where
            T: Copy + PartialEq + std::fmt::Debug + Serialize + serde::de::DeserializeOwned,
        {
            for &v in all {
                let name = as_str(v);
                assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(name));
                assert_eq!(parse(name), Some(v));
                let back: T = serde_json::from_value(serde_json::json!(name)).unwrap();
                assert_eq!(back, v);
            }
            assert_eq!(parse("bogus"), None);
        }
        check(
            &MessageState::ALL,
            MessageState::as_str,
            MessageState::parse,
        );
        check(&TurnState::ALL, TurnState::as_str, TurnState::parse);
        check(&MessageKind::ALL, MessageKind::as_str, MessageKind::parse);
        assert!(serde_json::from_str::<MessageState>("\"read\"").is_err());
        // The CLI's tables pad states.
        assert_eq!(format!("{:<10}|", MessageState::Sent), "sent      |");
        assert_eq!(format!("{:<9}|", TurnState::Done), "done     |");
    }
}
