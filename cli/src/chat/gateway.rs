//! The model for `hako chat` with a model (`--model`, and `--agent claude`): without routd, the
//! chat serves the turn's `api.sock` itself, as routd's gateway does for a stack's turns
//! (`specs/routd.md`, "The LLM gateway"), reduced to what one person at a terminal needs:
//!
//! - the credential of every call must be this chat's own token (random, given to the agent on
//!   stdin only, like a spawn token); anything else is 401;
//! - the model must be the chat's (403 `model_not_allowed`);
//! - the provider's key (`ANTHROPIC_API_KEY` of the chat's environment) replaces the token,
//!   and never enters the container; the answer streams back as it comes.
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
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

/// Requests larger than this are refused (routd's default body limit).
const BODY_LIMIT: usize = 16 << 20;

/// What the chat's gateway forwards with.
struct Gate {
    token: String,
    key: String,
    base: String,
    model: String,
    http: reqwest::Client,
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
        .header("x-api-key", &g.key)
        .body(body);
    for name in ["anthropic-version", "anthropic-beta", "accept"] {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v);
        }
    }
    if !headers.contains_key("anthropic-version") {
        req = req.header("anthropic-version", "2023-06-01");
    }
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
            "the provider refused the key: check ANTHROPIC_API_KEY",
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
/// present. The provider is `HAKO_ANTHROPIC_URL` (default `https://api.anthropic.com`), the key
/// `ANTHROPIC_API_KEY`.
pub fn serve(socket: &Path, model: &str, stop: CancellationToken) -> anyhow::Result<String> {
    let key = std::env::var("ANTHROPIC_API_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty())
        .context(
            "a chat with a model needs ANTHROPIC_API_KEY in hako chat's environment (it never \
             enters the container: the chat's gateway holds it)",
        )?;
    let base = std::env::var("HAKO_ANTHROPIC_URL")
        .unwrap_or_else(|_| "https://api.anthropic.com".into())
        .trim_end_matches('/')
        .to_owned();
    let mut b = [0u8; 24];
    getrandom::fill(&mut b)
        .map_err(|e| anyhow::anyhow!("no randomness for the chat's token: {e}"))?;
    let token: String = b.iter().map(|x| format!("{x:02x}")).collect();
    let gate = Arc::new(Gate {
        token: format!("hako-chat-{token}"),
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
    let app = axum::Router::new()
        .route("/v1/messages", axum::routing::post(call))
        .route("/v1/messages/count_tokens", axum::routing::post(call))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(gate.clone());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
    Ok(gate.token.clone())
}
