//! The model for `hako chat` with a model (`--model`, `--agent claude|codex`): without routd, the
//! chat serves the turn's `api.sock` itself, as routd's gateway does for a stack's turns
//! (`specs/routd.md`, "The LLM gateway"), reduced to what one person at a terminal needs:
//!
//! - the credential of every call must be this chat's own token (random, given to the agent on
//!   stdin only, like a spawn token); anything else is 401;
//! - the model must be the chat's (403 `model_not_allowed`);
//! - the provider's key (`ANTHROPIC_API_KEY`, or `OPENAI_API_KEY` for an agent in the OpenAI
//!   format, Codex, of the chat's environment) replaces the token, and never enters the
//!   container; the answer streams back as it comes.
//!
//! Budgets and the request policy are routd's: a chat is its operator's own session.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use hako_shared::runs::LlmApi;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Requests larger than this are refused (routd's default body limit).
const BODY_LIMIT: usize = 16 << 20;

/// What the chat's gateway forwards with.
struct Gate {
    token: String,
    api: LlmApi,
    key: String,
    base: String,
    model: String,
    http: reqwest::Client,
}

/// A provider's key variable, URL variable, default URL and routes.
fn provider(
    api: LlmApi,
) -> (
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
) {
    match api {
        LlmApi::Anthropic => (
            "ANTHROPIC_API_KEY",
            "HAKO_ANTHROPIC_URL",
            "https://api.anthropic.com",
            &["/v1/messages", "/v1/messages/count_tokens"],
        ),
        LlmApi::Openai => (
            "OPENAI_API_KEY",
            "HAKO_OPENAI_URL",
            "https://api.openai.com",
            &["/v1/responses", "/v1/chat/completions"],
        ),
    }
}

fn refuse(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        axum::Json(json!({"error": code, "message": message.into()})),
    )
        .into_response()
}

async fn call(
    State(g): State<Arc<Gate>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let presented = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .or_else(|| {
            headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
        });
    // Constant-time enough for a per-chat random token on a socket only its container has.
    if presented != Some(g.token.as_str()) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "only this chat's token may use its gateway",
        );
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body must be JSON",
        );
    };
    let asked = v.get("model").and_then(Value::as_str).unwrap_or("");
    if asked != g.model {
        return refuse(
            StatusCode::FORBIDDEN,
            "model_not_allowed",
            format!("this chat uses the model {:?}, not {asked:?}", g.model),
        );
    }
    let mut req = g
        .http
        .post(format!("{}{}", g.base, uri.path()))
        .header("content-type", "application/json")
        .body(body);
    for name in [
        "anthropic-version",
        "anthropic-beta",
        "openai-beta",
        "accept",
    ] {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v);
        }
    }
    req = match g.api {
        LlmApi::Anthropic if !headers.contains_key("anthropic-version") => req
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", &g.key),
        LlmApi::Anthropic => req.header("x-api-key", &g.key),
        LlmApi::Openai => req.bearer_auth(&g.key),
    };
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            return refuse(
                StatusCode::BAD_GATEWAY,
                "provider_unreachable",
                format!("the provider did not answer: {}", e.without_url()),
            );
        }
    };
    let status = resp.status().as_u16();
    if matches!(status, 401 | 403) {
        let mut r = refuse(
            StatusCode::BAD_GATEWAY,
            "provider_key_refused",
            format!("the provider refused the key: check {}", provider(g.api).0),
        );
        r.headers_mut().insert(
            "x-should-retry",
            axum::http::HeaderValue::from_static("false"),
        );
        return r;
    }
    let mut out = Response::builder().status(status);
    if let Some(ct) = resp.headers().get("content-type") {
        out = out.header("content-type", ct);
    }
    out.body(Body::from_stream(resp.bytes_stream().map(|c| {
        c.map_err(|e| std::io::Error::other(e.without_url().to_string()))
    })))
    .unwrap_or_else(|_| refuse(StatusCode::BAD_GATEWAY, "provider_error", "a bad answer"))
}

/// Serves the chat's gateway on `socket` until `stop`; answers the token the agent must
/// present. The provider of `api`: `HAKO_ANTHROPIC_URL` (default `https://api.anthropic.com`)
/// with `ANTHROPIC_API_KEY`, or `HAKO_OPENAI_URL` (default `https://api.openai.com`) with
/// `OPENAI_API_KEY`.
pub fn serve(
    socket: &Path,
    model: &str,
    api: LlmApi,
    stop: CancellationToken,
) -> anyhow::Result<String> {
    let (key_var, url_var, default_url, routes) = provider(api);
    let key = std::env::var(key_var)
        .ok()
        .filter(|k| !k.trim().is_empty())
        .with_context(|| {
            format!(
                "a chat with a model needs {key_var} in hako chat's environment (it never \
                 enters the container: the chat's gateway holds it)"
            )
        })?;
    let base = std::env::var(url_var)
        .unwrap_or_else(|_| default_url.into())
        .trim_end_matches('/')
        .to_owned();
    let mut b = [0u8; 24];
    getrandom::fill(&mut b)
        .map_err(|e| anyhow::anyhow!("no randomness for the chat's token: {e}"))?;
    let token: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let gate = Arc::new(Gate {
        token: format!("hako-chat-{token}"),
        api,
        key: key.trim().to_owned(),
        base,
        model: model.to_owned(),
        http: reqwest::Client::builder()
            .no_proxy()
            .build()
            .context("the chat gateway's client")?,
    });
    let (listener, _) = hako_mcp::bind_socket(socket)
        .with_context(|| format!("cannot serve the model on {}", socket.display()))?;
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let mut app = axum::Router::new();
    for route in routes {
        app = app.route(route, axum::routing::post(call));
    }
    let app = app
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(gate.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(gate.token.clone())
}
