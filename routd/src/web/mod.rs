//! The web page (`specs/web.md`): a chat with each group's agent and a watch page for the
//! operator, served by routd at `/web/` beside the API it speaks, so the page and the API
//! share one origin (no CORS, a `connect-src 'self'` policy) and the stack gains no daemon.
//! The assets are compiled into the binary; nothing is fetched at run time. These routes are
//! pages, not API: the API document does not list them.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use hako_shared::http::{ApiError, ApiJson};

use crate::state::Shared;

pub(crate) mod session;

pub(crate) use session::sweep_revoked;

/// The page's one policy: scripts, styles and everything else from routd itself only, no
/// inline script or style, no frames, no plug-ins, forms only to routd.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// A compiled-in file.
struct Asset {
    name: &'static str,
    mime: &'static str,
    body: &'static str,
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "app.js",
        mime: "text/javascript; charset=utf-8",
        body: include_str!("../../web/app.js"),
    },
    Asset {
        name: "signin.js",
        mime: "text/javascript; charset=utf-8",
        body: include_str!("../../web/signin.js"),
    },
    Asset {
        name: "style.css",
        mime: "text/css; charset=utf-8",
        body: include_str!("../../web/style.css"),
    },
];

const CHAT: &str = include_str!("../../web/chat.html");
const WATCH: &str = include_str!("../../web/watch.html");
const SIGNIN: &str = include_str!("../../web/signin.html");

/// The page's routes.
pub(crate) fn router(sh: Arc<Shared>) -> Router {
    Router::new()
        .route("/web", get(|| async { Redirect::to("/web/") }))
        .route("/web/", get(chat_page))
        .route("/web/watch", get(watch_page))
        .route("/web/signin", get(|| async { html(SIGNIN) }))
        .route("/web/assets/{name}", get(asset))
        .route("/web/session", post(sign_in).get(current))
        .route("/web/signout", post(sign_out))
        .layer(axum::middleware::from_fn(headers))
        .with_state(sh)
}

/// The security headers every answer under `/web/` carries.
async fn headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (k, v) in [
        ("content-security-policy", CSP),
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "DENY"),
        ("referrer-policy", "no-referrer"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        h.insert(k, HeaderValue::from_static(v));
    }
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    resp
}

fn html(body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response()
}

/// A page for a signed-in browser; others go to sign in.
async fn page(sh: &Shared, headers: &HeaderMap, body: &'static str) -> Response {
    if session::may_see_pages(sh, headers).await {
        html(body)
    } else {
        Redirect::to("/web/signin").into_response()
    }
}

async fn chat_page(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    page(&sh, &headers, CHAT).await
}

async fn watch_page(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    page(&sh, &headers, WATCH).await
}

async fn asset(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => (
            [
                (header::CONTENT_TYPE, a.mime),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            a.body,
        )
            .into_response(),
        None => hako_shared::http::NOT_FOUND
            .error("no such asset")
            .into_response(),
    }
}

async fn sign_in(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<session::SignIn>,
) -> Result<Response, ApiError> {
    session::sign_in(&sh, &headers, body).await
}

async fn current(
    State(sh): State<Arc<Shared>>,
    headers: HeaderMap,
) -> Result<axum::Json<session::SessionView>, ApiError> {
    session::current(&sh, &headers).await.map(axum::Json)
}

async fn sign_out(State(sh): State<Arc<Shared>>, headers: HeaderMap) -> Result<Response, ApiError> {
    session::sign_out(&sh, &headers).await
}
