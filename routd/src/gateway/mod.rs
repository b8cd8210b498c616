//! The LLM gateway of a turn: HTTP on the folder's `ipc/api.sock` (the agent's
//! `/var/run/pub/arizuko/api.sock`), served while the turn is live, beside its `mcp.sock`.
//!
//! The agent authenticates with its run's spawn token (`x-api-key` or `Authorization:
//! Bearer`); the gateway checks it (signature, expiry, revocation, `llm:call`, this folder and
//! this turn), checks the group's daily token budget, swaps the token for the provider's real
//! key and forwards the call: Anthropic Messages (`POST /v1/messages`,
//! `/v1/messages/count_tokens`), OpenAI-compatible chat completions
//! (`POST /v1/chat/completions`) or OpenAI Responses (`POST /v1/responses`, what Codex
//! speaks): the wire formats of [`format::Format`]. The answer passes through as it arrives, a stream event by
//! event, while [`usage::Meter`] reads the tokens it reports; they are recorded per turn and
//! per group when the answer ends (or is cut). The real key never reaches the container.

pub mod format;
pub mod policy;
pub mod usage;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt as _;
use hako_shared::GroupFolder;
use hako_shared::auth::{AuthError, TokenType, scopes};
use hako_shared::db::DbError;
use hako_shared::error_chain;
use hako_shared::http::ApiError;
use hako_shared::ids::{TurnId, TurnTry};
use hako_shared::runs::LlmApi;
use serde_json::Value;

use crate::live::CutOff;
use crate::state::Shared;
use crate::store::UsageRow;
use format::Format;
use usage::{Meter, Usage};

/// The longest model name recorded with usage.
const MAX_MODEL: usize = 128;
/// How much of a provider's 5xx body is quoted in the 502.
const MAX_ERROR_DETAIL: usize = 2048;
/// The longest a request body may take to arrive (it is read after the token and the call
/// slot are checked, so a slow sender holds only its own turn's slot).
const BODY_READ: Duration = Duration::from_secs(30);
/// Connections a turn's gateway keeps open beyond its `ROUTD_LLM_MAX_CALLS`.
pub(crate) const SPARE_CONNECTIONS: usize = 4;

/// Request headers passed on to the provider (the agent's credentials never are).
const PASS_REQUEST: &[&str] = &[
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "accept",
];
/// Answer headers passed back to the agent.
const PASS_RESPONSE: &[&str] = &["content-type", "retry-after", "request-id", "x-request-id"];
/// Answer header prefixes passed back (rate limit state the agent's SDK reads).
const PASS_RESPONSE_PREFIX: &[&str] = &["anthropic-ratelimit-", "x-ratelimit-"];
/// The Anthropic API version sent when the agent names none.
const ANTHROPIC_VERSION: &str = "2023-06-01";

/// One turn's gateway: the folder and turn its socket serves.
pub(crate) struct GatewayTurn {
    pub sh: Arc<Shared>,
    pub folder: GroupFolder,
    pub turn_id: TurnId,
    /// Calls in flight (`ROUTD_LLM_MAX_CALLS`): a permit is held until the answer ends.
    pub calls: Arc<tokio::sync::Semaphore>,
}

/// Why the gateway did not forward a call (the provider's own 4xx answers pass through).
#[derive(Debug, thiserror::Error)]
pub(crate) enum GatewayError {
    /// No token, a bad, expired or revoked one, or one of another turn.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A valid token, but not this turn's spawn token.
    #[error("{0}")]
    WrongTurn(String),
    /// No key for the provider.
    #[error(
        "routd has no key for {0}: the operator sets {key} (or {key}_FILE)",
        key = key_var(*.0)
    )]
    NotConfigured(LlmApi),
    /// The group's tokens for today are spent.
    #[error(
        "group {folder} has used {used} of its {budget} tokens for today (UTC); the budget resets at 00:00 UTC"
    )]
    Budget {
        /// The group.
        folder: String,
        /// Tokens used today.
        used: u64,
        /// The daily budget.
        budget: u64,
    },
    /// The turn has `ROUTD_LLM_MAX_CALLS` calls in flight already.
    #[error(
        "this turn has {0} model calls in flight already (ROUTD_LLM_MAX_CALLS); wait for one to end"
    )]
    TooManyCalls(usize),
    /// The body is not a JSON object.
    #[error("the body must be a JSON object: {0}")]
    InvalidJson(String),
    /// The body is larger than `ROUTD_LLM_BODY_LIMIT`.
    #[error("the body is larger than {0} bytes (ROUTD_LLM_BODY_LIMIT)")]
    TooLarge(usize),
    /// The body did not arrive in time.
    #[error("the body did not arrive within {0:?}")]
    SlowBody(Duration),
    /// The request asks for something the gateway does not forward.
    #[error(transparent)]
    Policy(#[from] policy::PolicyError),
    /// The provider refused routd's own key.
    #[error(
        "{api} refused routd's key ({status}); the operator checks {key}",
        key = key_var(*api_kind)
    )]
    ProviderKey {
        /// The provider.
        api: &'static str,
        /// Which one.
        api_kind: LlmApi,
        /// Its status (401 or 403).
        status: u16,
    },
    /// The provider did not answer.
    #[error("{api} did not answer: {detail}")]
    Unreachable {
        /// The provider.
        api: &'static str,
        /// Why.
        detail: String,
    },
    /// The provider answered with a server error.
    #[error("{api} answered {status}: {detail}")]
    Provider {
        /// The provider.
        api: &'static str,
        /// Its status.
        status: u16,
        /// The start of its answer.
        detail: String,
    },
    /// An earlier call of this turn met a refusal no retry can fix: the same answer again,
    /// without calling the provider.
    #[error("{}", .0.message)]
    CutOff(CutOff),
    /// routd's database.
    #[error(transparent)]
    Db(#[from] DbError),
}

fn key_var(api: LlmApi) -> &'static str {
    match api {
        LlmApi::Anthropic => "ANTHROPIC_API_KEY",
        LlmApi::Openai => "OPENAI_API_KEY",
    }
}

impl GatewayError {
    /// The label of `routd_llm_requests_total{result}`.
    fn result(&self) -> &'static str {
        match self {
            GatewayError::Auth(_) | GatewayError::WrongTurn(_) => "unauthorized",
            GatewayError::NotConfigured(_) => "not_configured",
            GatewayError::Budget { .. } => "budget_exhausted",
            GatewayError::TooManyCalls(_) => "too_many_calls",
            GatewayError::InvalidJson(_)
            | GatewayError::TooLarge(_)
            | GatewayError::SlowBody(_) => "invalid",
            GatewayError::Policy(_) => "not_allowed",
            GatewayError::ProviderKey { .. } => "provider_error",
            GatewayError::Unreachable { .. } => "unreachable",
            GatewayError::Provider { .. } => "provider_error",
            GatewayError::CutOff(_) => "cut_off",
            GatewayError::Db(_) => "internal",
        }
    }

    /// Whether no retry within the turn can fix it (the provider refused routd's key, no key,
    /// the day's budget): the turn is cut off from its model.
    fn is_permanent(&self) -> bool {
        matches!(
            self,
            GatewayError::ProviderKey { .. }
                | GatewayError::NotConfigured(_)
                | GatewayError::Budget { .. }
                | GatewayError::CutOff(_)
        )
    }
}

impl GatewayError {
    /// The status and code the agent gets (`None`: the shared envelope of a token or
    /// database error).
    fn status_code(&self) -> Option<(StatusCode, &'static str)> {
        Some(match self {
            GatewayError::Auth(_) | GatewayError::Db(_) => return None,
            GatewayError::WrongTurn(_) => (StatusCode::UNAUTHORIZED, "wrong_turn"),
            GatewayError::NotConfigured(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "provider_not_configured")
            }
            GatewayError::Budget { .. } => (StatusCode::TOO_MANY_REQUESTS, "budget_exhausted"),
            GatewayError::TooManyCalls(_) => (StatusCode::TOO_MANY_REQUESTS, "too_many_calls"),
            GatewayError::InvalidJson(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            GatewayError::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            GatewayError::SlowBody(_) => (StatusCode::REQUEST_TIMEOUT, "body_timeout"),
            GatewayError::Policy(p) => (
                if matches!(p, policy::PolicyError::Invalid(_)) {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::FORBIDDEN
                },
                p.code(),
            ),
            GatewayError::ProviderKey { .. } => (StatusCode::BAD_GATEWAY, "provider_key_refused"),
            GatewayError::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "provider_unreachable"),
            GatewayError::Provider { .. } => (StatusCode::BAD_GATEWAY, "provider_error"),
            GatewayError::CutOff(c) => (
                StatusCode::from_u16(c.status).unwrap_or(StatusCode::BAD_GATEWAY),
                c.code,
            ),
        })
    }
}

impl From<GatewayError> for ApiError {
    fn from(e: GatewayError) -> Self {
        match (e.status_code(), e) {
            (_, GatewayError::Auth(a)) => ApiError::from(a),
            (_, GatewayError::Db(d)) => ApiError::from(d),
            (Some((status, code)), e) => ApiError::new(status, code, e.to_string()),
            (None, e) => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let provider_status = match &self {
            GatewayError::Provider { status, .. } | GatewayError::ProviderKey { status, .. } => {
                Some(*status)
            }
            _ => None,
        };
        let permanent = self.is_permanent();
        let mut r = ApiError::from(self).into_response();
        if let Some(s) = provider_status {
            r.headers_mut()
                .insert("x-hako-provider-status", HeaderValue::from(s));
        }
        if permanent {
            // Anthropic's and OpenAI's SDKs (and Claude Code) retry 429 and 5xx unless told
            // not to; these cannot be fixed by retrying.
            r.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        r
    }
}

/// The gateway's routes for one turn.
pub(crate) fn router(turn: Arc<GatewayTurn>) -> Router {
    let body_limit = turn.sh.cfg.llm.body_limit;
    let mut r = Router::new();
    for format in Format::ALL {
        r = r.route(format.path(), post(move |s, req| call(s, req, format)));
    }
    let r = r
        .route("/health", get(|| async { "ok\n" }))
        .with_state(turn);
    hako_shared::http::traced(hako_shared::http::guard(r, body_limit))
}

/// The UTC day of a Unix time in ms: `2026-11-26`.
pub(crate) fn utc_day(ms: i64) -> String {
    hako_shared::time::rfc3339(hako_shared::time::from_unix_millis(ms))[..10].to_owned()
}

async fn call(
    State(t): State<Arc<GatewayTurn>>,
    req: axum::extract::Request,
    format: Format,
) -> Response {
    let (parts, body) = req.into_parts();
    match forward(&t, &parts.headers, body, format).await {
        Ok(r) => r,
        Err(e) => {
            t.sh.metrics.llm_request(format.api().as_str(), e.result());
            if e.is_permanent()
                && let Some((status, code)) = e.status_code()
                && let Some(live) = t.sh.turns.live.get(&t.turn_id)
            {
                live.cut_off(CutOff {
                    status: status.as_u16(),
                    code,
                    message: e.to_string(),
                });
            }
            if matches!(
                e,
                GatewayError::Budget { .. }
                    | GatewayError::Provider { .. }
                    | GatewayError::ProviderKey { .. }
                    | GatewayError::Policy(_)
            ) {
                tracing::warn!(folder = %t.folder, turn = %t.turn_id, error = %e, "LLM call refused");
            }
            e.into_response()
        }
    }
}

/// The spawn token of a request: `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer`.
fn token(headers: &HeaderMap) -> Result<&str, AuthError> {
    if let Some(v) = headers.get("x-api-key") {
        let t = v
            .to_str()
            .map_err(|_| AuthError::BadHeader("x-api-key is not ASCII"))?
            .trim();
        if t.is_empty() {
            return Err(AuthError::BadHeader("empty x-api-key"));
        }
        return Ok(t);
    }
    hako_shared::auth::bearer(headers)
}

impl GatewayTurn {
    /// Only this turn's spawn token passes (any token in open dev mode).
    async fn authenticate(&self, headers: &HeaderMap) -> Result<(), GatewayError> {
        let verifier = &self.sh.verifier;
        if verifier.is_open() {
            return Ok(());
        }
        let c = verifier.verify(token(headers)?).await?;
        if c.typ != TokenType::Spawn || !c.has_scope(scopes::LLM_CALL) {
            return Err(GatewayError::WrongTurn(
                "only the run's spawn token (with llm:call) may use the gateway".into(),
            ));
        }
        if c.folder.as_deref() != Some(self.folder.as_str())
            || !claims_turn(c.turn_id.as_deref(), &self.turn_id)
        {
            return Err(GatewayError::WrongTurn(
                "the token belongs to another folder or turn than this socket's".into(),
            ));
        }
        Ok(())
    }

    /// The group's model when it names one, and whether its agent may reach a network, once
    /// every budget over it has room: its own and
    /// each ancestor group's (a group's `llm.daily_tokens`, else the install's), each against
    /// the day's tokens of its whole subtree, so that sub-groups a tenant makes spend their
    /// parent's budget and never mint their own.
    async fn check_budgets(&self, day: &str) -> Result<(Option<String>, bool), GatewayError> {
        let default = self.sh.cfg.llm.daily_tokens;
        let mut model = None;
        let mut networked = false;
        let segments: Vec<&str> = self.folder.segments().collect();
        for n in (1..=segments.len()).rev() {
            let folder = segments[..n].join("/");
            let Some(g) = self.sh.store.group(&folder).await? else {
                continue;
            };
            let spec = g.spec;
            let budget = spec
                .llm
                .as_ref()
                .and_then(|l| l.daily_tokens)
                .unwrap_or(default);
            if n == segments.len() {
                networked = spec.network != hako_shared::runs::Network::None;
                model = spec.llm.map(|l| l.model);
            }
            let used = self.sh.store.llm_used(&folder, day).await?;
            if used >= budget {
                return Err(GatewayError::Budget {
                    folder,
                    used,
                    budget,
                });
            }
        }
        Ok((model, networked))
    }
}

async fn forward(
    t: &Arc<GatewayTurn>,
    headers: &HeaderMap,
    body: Body,
    format: Format,
) -> Result<Response, GatewayError> {
    let (api, path) = (format.api(), format.path());
    // Everything that costs routd memory comes after the token and the call slot.
    t.authenticate(headers).await?;
    if let Some(c) =
        t.sh.turns
            .live
            .get(&t.turn_id)
            .and_then(|l| l.cut_off_reason())
    {
        return Err(GatewayError::CutOff(c));
    }
    let cfg = &t.sh.cfg.llm;
    let provider = cfg.provider(api).ok_or(GatewayError::NotConfigured(api))?;
    let permit = t
        .calls
        .clone()
        .try_acquire_owned()
        .map_err(|_| GatewayError::TooManyCalls(cfg.max_calls))?;
    let day = utc_day(crate::state::now_ms());
    let (group_model, networked) = t.check_budgets(&day).await?;
    let body =
        match tokio::time::timeout(BODY_READ, axum::body::to_bytes(body, cfg.body_limit)).await {
            Err(_) => return Err(GatewayError::SlowBody(BODY_READ)),
            Ok(Err(_)) => return Err(GatewayError::TooLarge(cfg.body_limit)),
            Ok(Ok(b)) => b,
        };

    let (body, model, checked) = {
        let mut v: Value =
            serde_json::from_slice(&body).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
        let obj = v
            .as_object_mut()
            .ok_or_else(|| GatewayError::InvalidJson("it is not an object".into()))?;
        let checked = policy::check(format, obj, body.len(), group_model.as_deref(), networked)?;
        let model: String = obj
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .chars()
            .take(MAX_MODEL)
            .collect();
        // What was checked is what goes: the parsed body, written again (a body the provider
        // could read differently, duplicate keys say, never passes as it came).
        let out = serde_json::to_vec(&v).map_err(|e| GatewayError::InvalidJson(e.to_string()))?;
        (Bytes::from(out), model, checked)
    };
    tracing::debug!(folder = %t.folder, %model, streaming = checked.streaming, "LLM call");

    let mut req =
        t.sh.llm_http
            .post(format!("{}{path}", provider.base_url))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body);
    for name in PASS_REQUEST {
        if let Some(v) = headers.get(*name) {
            req = req.header(*name, v);
        }
    }
    req = match api {
        LlmApi::Anthropic => {
            if !headers.contains_key("anthropic-version") {
                req = req.header("anthropic-version", ANTHROPIC_VERSION);
            }
            req.header("x-api-key", provider.key.expose())
        }
        LlmApi::Openai => req.bearer_auth(provider.key.expose()),
    };
    let unreachable = |detail: String| GatewayError::Unreachable {
        api: api.as_str(),
        detail,
    };
    let resp = match tokio::time::timeout(cfg.timeout, req.send()).await {
        Err(_) => {
            return Err(unreachable(format!(
                "no answer within {:?} (ROUTD_LLM_TIMEOUT)",
                cfg.timeout
            )));
        }
        // reqwest's error text names the URL, never the headers (the key).
        Ok(Err(e)) => return Err(unreachable(error_chain(&e))),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if matches!(status.as_u16(), 401 | 403) {
        // The provider's words about the operator's key (OpenAI quotes its last characters)
        // are not the agent's to read.
        return Err(GatewayError::ProviderKey {
            api: api.as_str(),
            api_kind: api,
            status: status.as_u16(),
        });
    }
    if status.is_server_error() {
        let detail = error_detail(resp, cfg.idle_timeout).await;
        return Err(GatewayError::Provider {
            api: api.as_str(),
            status: status.as_u16(),
            detail,
        });
    }

    let is_stream = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let mut out = Response::builder().status(status.as_u16());
    for (name, value) in resp.headers() {
        let n = name.as_str();
        if PASS_RESPONSE.contains(&n) || PASS_RESPONSE_PREFIX.iter().any(|p| n.starts_with(p)) {
            out = out.header(name.as_str(), value.as_bytes());
        }
    }
    if is_stream {
        // No proxy in between may buffer the events.
        out = out.header(
            HeaderName::from_static("x-accel-buffering"),
            HeaderValue::from_static("no"),
        );
    }
    t.sh.metrics.llm_request(
        api.as_str(),
        if status.is_success() {
            "ok"
        } else {
            "client_error"
        },
    );
    let record = Record {
        turn: t.clone(),
        api,
        model,
        day,
        meter: Meter::new(format, is_stream),
        // A refused call (4xx) is not billed; an answer that never says what it used is
        // charged its estimate.
        fallback: if status.is_success() {
            checked.estimate
        } else {
            Usage::default()
        },
        permit: Some(permit),
    };
    let body = metered(resp, record, cfg.max_response, cfg.idle_timeout);
    out.body(body)
        .map_err(|e| unreachable(format!("unusable answer headers: {e}")))
}

/// The start of a failed answer, for the 502's message.
async fn error_detail(resp: reqwest::Response, wait: Duration) -> String {
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    let read = async {
        while let Some(Ok(b)) = stream.next().await {
            body.extend_from_slice(&b);
            if body.len() >= MAX_ERROR_DETAIL {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(wait.min(Duration::from_secs(10)), read).await;
    body.truncate(MAX_ERROR_DETAIL);
    let text = String::from_utf8_lossy(&body);
    let text = text.trim();
    if text.is_empty() {
        "(no body)".into()
    } else {
        text.chars().filter(|c| !c.is_control()).collect()
    }
}

/// What an answer used, recorded when its body is done with (read to the end, cut, or
/// dropped because the agent went away).
struct Record {
    turn: Arc<GatewayTurn>,
    api: LlmApi,
    model: String,
    day: String,
    meter: Meter,
    /// Charged when the answer reported no final usage (the agent hung up, it was cut, it
    /// was too large to read): the call's estimate.
    fallback: Usage,
    /// The turn's call slot, free again once the usage is recorded (so the next call's
    /// budget check sees it).
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Drop for Record {
    fn drop(&mut self) {
        let seen = self.meter.finish();
        let charged = if self.meter.complete() {
            seen
        } else {
            Usage {
                input: seen.input.max(self.fallback.input),
                output: seen.output.max(self.fallback.output),
            }
        };
        let input = charged.input.min(policy::MAX_CHARGE);
        let output = charged.output.min(policy::MAX_CHARGE);
        let permit = self.permit.take();
        let sh = self.turn.sh.clone();
        sh.metrics.llm_tokens(self.api.as_str(), input, output);
        let row = UsageRow {
            folder: self.turn.folder.clone(),
            day: std::mem::take(&mut self.day),
            turn_id: self.turn.turn_id.clone(),
            api: self.api.as_str().to_owned(),
            model: std::mem::take(&mut self.model),
            calls: 1,
            input_tokens: input,
            output_tokens: output,
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::error!(folder = %row.folder, "LLM usage lost: no runtime at the end of an answer");
            return;
        };
        rt.spawn(async move {
            if let Err(e) = sh.store.add_llm_usage(row).await {
                tracing::error!(error = %e, "recording LLM usage failed");
            }
            drop(permit);
        });
    }
}

/// Why an answer was cut.
#[derive(Debug, thiserror::Error)]
enum Cut {
    #[error("the provider sent nothing for {0:?} (ROUTD_LLM_IDLE_TIMEOUT)")]
    Idle(Duration),
    #[error("the answer passed {0} bytes (ROUTD_LLM_MAX_RESPONSE)")]
    TooLarge(u64),
    #[error("the provider's answer broke off: {0}")]
    Upstream(String),
}

/// The answer's body, passed through chunk by chunk, metered, bounded in size and silence.
/// A cut ends the body with an error, so the agent sees a broken answer, never a short one
/// that looks whole.
fn metered(resp: reqwest::Response, record: Record, max: u64, idle: Duration) -> Body {
    struct St {
        inner: futures_util::stream::BoxStream<'static, reqwest::Result<Bytes>>,
        record: Record,
        seen: u64,
        done: bool,
    }
    let st = St {
        inner: resp.bytes_stream().boxed(),
        record,
        seen: 0,
        done: false,
    };
    let stream = futures_util::stream::unfold(st, move |mut st| async move {
        if st.done {
            return None;
        }
        let cut = match tokio::time::timeout(idle, st.inner.next()).await {
            Err(_) => Cut::Idle(idle),
            Ok(None) => return None,
            Ok(Some(Err(e))) => Cut::Upstream(error_chain(&e)),
            Ok(Some(Ok(b))) => {
                st.seen += b.len() as u64;
                if st.seen <= max {
                    st.record.meter.feed(&b);
                    return Some((Ok(b), st));
                }
                Cut::TooLarge(max)
            }
        };
        tracing::warn!(folder = %st.record.turn.folder, turn = %st.record.turn.turn_id, "LLM answer cut: {cut}");
        st.done = true;
        Some((Err(std::io::Error::other(cut.to_string())), st))
    });
    Body::from_stream(stream)
}

/// Whether a spawn token's `turn_id` claim (`<turn>.<try>`, minted by runed) is a try of
/// `turn`. A claim that does not parse is no turn's: the check fails closed.
pub(crate) fn claims_turn(claim: Option<&str>, turn: &TurnId) -> bool {
    claim
        .and_then(|c| TurnTry::parse(c).ok())
        .is_some_and(|t| t.turn() == turn)
}

/// The turn whose sockets are open, as the gateway needs it.
pub(crate) fn turn(sh: &Arc<Shared>, folder: &GroupFolder, turn_id: &TurnId) -> Arc<GatewayTurn> {
    Arc::new(GatewayTurn {
        sh: sh.clone(),
        folder: folder.clone(),
        turn_id: turn_id.clone(),
        calls: Arc::new(tokio::sync::Semaphore::new(sh.cfg.llm.max_calls)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_its_turns_only_through_a_parsed_try() {
        let turn = &TurnId::new("t-0123456789abcdef01234567").unwrap();
        assert!(claims_turn(Some("t-0123456789abcdef01234567.2"), turn));
        assert!(!claims_turn(Some("t-0123456789abcdef01234568.2"), turn));
        // A claim without the try no longer stands for the whole turn.
        for bad in [
            Some(turn.as_str()),
            Some("t-0123456789abcdef01234567."),
            None,
        ] {
            assert!(!claims_turn(bad, turn), "{bad:?}");
        }
    }

    #[test]
    fn days_are_utc_dates() {
        assert_eq!(utc_day(0), "1970-01-01");
        assert_eq!(utc_day(1_795_651_199_999), "2026-11-25");
        assert_eq!(utc_day(1_795_651_200_000), "2026-11-26");
    }

    #[test]
    fn the_token_comes_from_either_header() {
        let mut h = HeaderMap::new();
        assert!(matches!(token(&h), Err(AuthError::Missing)));
        h.insert("authorization", HeaderValue::from_static("Bearer abc"));
        assert_eq!(token(&h).unwrap(), "abc");
        h.insert("x-api-key", HeaderValue::from_static(" k "));
        assert_eq!(token(&h).unwrap(), "k");
        h.insert("x-api-key", HeaderValue::from_static(""));
        assert!(token(&h).is_err());
    }

    #[test]
    fn refusals_are_envelopes_with_their_codes() {
        for (e, status, code) in [
            (
                GatewayError::NotConfigured(LlmApi::Openai),
                503,
                "provider_not_configured",
            ),
            (
                GatewayError::Budget {
                    folder: "a".into(),
                    used: 10,
                    budget: 5,
                },
                429,
                "budget_exhausted",
            ),
            (
                GatewayError::Provider {
                    api: "anthropic",
                    status: 529,
                    detail: "overloaded".into(),
                },
                502,
                "provider_error",
            ),
            (GatewayError::WrongTurn("x".into()), 401, "wrong_turn"),
            (GatewayError::Auth(AuthError::Expired), 401, "token_expired"),
        ] {
            let msg = e.to_string();
            let api = ApiError::from(e);
            assert_eq!(
                (api.status.as_u16(), &*api.body.error),
                (status, code),
                "{msg}"
            );
        }
        assert!(
            GatewayError::NotConfigured(LlmApi::Openai)
                .to_string()
                .contains("OPENAI_API_KEY")
        );
    }
}
