//! routd's metrics: messages in and out, turns by outcome, turn latency (a message in to the
//! first reply out), the age of the oldest unanswered message per folder (the red flag: growing
//! means runed, authd or the agent is not answering), webhook deliveries by result, and whether
//! runed answers.

use hako_shared::metrics::{Counter, Gauge, Histogram, Metrics};

/// The daemon's metric handles.
#[derive(Clone)]
pub struct RoutdMetrics {
    /// The registry `/metrics` renders.
    pub registry: Metrics,
    /// Inbound messages appended.
    pub messages_in: Counter,
    /// Inbound messages whose id was posted before.
    pub duplicates: Counter,
    /// Seconds from a turn's first message in to its first reply out.
    pub turn_latency: Histogram,
    /// 1 while runed (or authd, for routd's token) does not answer.
    pub runed_down: Gauge,
}

/// Latency buckets, seconds.
const LATENCY: &[f64] = &[
    0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1200.0,
];

impl RoutdMetrics {
    /// Registers the metrics.
    pub fn new() -> Self {
        let registry = Metrics::default();
        Self {
            messages_in: registry.counter(
                "routd_messages_in_total",
                "Inbound messages appended.",
                &[],
            ),
            duplicates: registry.counter(
                "routd_duplicate_messages_total",
                "Inbound messages posted again under the same id (and body).",
                &[],
            ),
            turn_latency: registry.histogram(
                "routd_turn_latency_seconds",
                "From a turn's first message in to its first reply out.",
                &[],
                LATENCY,
            ),
            runed_down: registry.gauge(
                "routd_runed_unavailable",
                "1 while runed (or authd, for routd's token) does not answer; turns wait.",
                &[],
            ),
            registry,
        }
    }

    /// A scheduled task's prompt arrived in its chat.
    pub fn task_fired(&self) {
        self.registry
            .counter(
                "routd_tasks_fired_total",
                "Scheduled task firings (each one an inbound task message).",
                &[],
            )
            .inc();
    }

    /// A call of the LLM gateway ended with `result` (`ok`, `client_error`, or why it was not
    /// forwarded).
    pub fn llm_request(&self, api: &'static str, result: &'static str) {
        self.registry
            .counter(
                "routd_llm_requests_total",
                "Calls of the LLM gateway, by wire format and result.",
                &[("api", api), ("result", result)],
            )
            .inc();
    }

    /// Tokens a provider reported for one answer.
    pub fn llm_tokens(&self, api: &'static str, input: u64, output: u64) {
        for (kind, n) in [("input", input), ("output", output)] {
            self.registry
                .counter(
                    "routd_llm_tokens_total",
                    "Tokens the providers reported through the gateway, by wire format and kind.",
                    &[("api", api), ("kind", kind)],
                )
                .add(n);
        }
    }

    /// A tool call of the turn's agent ended with `result` (`ok` or an error code).
    pub fn tool_call(&self, tool: &'static str, result: &'static str) {
        self.registry
            .counter(
                "routd_tool_calls_total",
                "Calls of the turn's tools (MCP or HTTP), by tool and result.",
                &[("tool", tool), ("result", result)],
            )
            .inc();
    }

    /// An outbound message of `kind` appended.
    pub fn message_out(&self, kind: &'static str) {
        self.registry
            .counter(
                "routd_messages_out_total",
                "Outbound messages appended (replies and notices).",
                &[("kind", kind)],
            )
            .inc();
    }

    /// A turn ended with `outcome` (`done`, `failed`, `killed`).
    pub fn turn_ended(&self, outcome: &'static str) {
        self.registry
            .counter(
                "routd_turns_total",
                "Turns ended, by how.",
                &[("outcome", outcome)],
            )
            .inc();
    }

    /// runed answered a turn's start with 429 (its queue full): the turn waits and asks again.
    pub fn runed_busy(&self) {
        self.registry
            .counter(
                "routd_runed_busy_total",
                "Starts of turns runed refused with its queue full (429); each waits and asks again.",
                &[],
            )
            .inc();
    }

    /// A try of a turn was retried.
    pub fn turn_retried(&self) {
        self.registry
            .counter(
                "routd_turn_retries_total",
                "Tries of turns retried (no output).",
                &[],
            )
            .inc();
    }

    /// A webhook attempt ended with `result` (`delivered`, `failed`, `undeliverable`).
    pub fn delivery(&self, result: &'static str) {
        self.registry
            .counter(
                "routd_webhook_deliveries_total",
                "Webhook delivery attempts, by result.",
                &[("result", result)],
            )
            .inc();
    }

    /// An approval request was made (`requested`) or left `pending` for `result`.
    pub fn approval(&self, result: &'static str) {
        self.registry
            .counter(
                "routd_approvals_total",
                "Approval requests made (requested) and decided, by verdict (approved, denied, timed_out, turn_ended, abandoned).",
                &[("result", result)],
            )
            .inc();
    }

    /// How many approval requests wait, and the age of the oldest in seconds.
    pub fn approvals_waiting(&self, pending: i64, oldest_seconds: i64) {
        self.registry
            .gauge(
                "routd_approvals_pending",
                "Approval requests waiting for a verdict.",
                &[],
            )
            .set(pending);
        self.registry
            .gauge(
                "routd_approval_oldest_pending_seconds",
                "Age of the oldest approval request waiting for a verdict (0: none).",
                &[],
            )
            .set(oldest_seconds);
    }

    /// The oldest unanswered message of `folder`, in seconds.
    pub fn oldest_unanswered(&self, folder: &str, seconds: i64) {
        self.registry
            .gauge(
                "routd_oldest_unanswered_seconds",
                "Age of the oldest inbound message not answered yet, per folder.",
                &[("folder", folder)],
            )
            .set(seconds);
    }
}

impl Default for RoutdMetrics {
    fn default() -> Self {
        Self::new()
    }
}
