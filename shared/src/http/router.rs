//! What every router hako serves gets: the ops routes, JSON 404/405, body limits (413 after
//! draining), panics as JSON 500, request ids and a tracing span per request.

use std::pin::Pin;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::ApiError;
use super::observe::{HttpMetrics, observe, route_of};
use super::ops::{Ops, OpsState, complete, ops_routes};
use super::request_id::{MakeId, REQUEST_ID_HEADER, sanitize_request_id};

/// Adds the documented ops routes, JSON fallbacks (404, 405), a body limit and panic-to-JSON
/// to a daemon's documented routes. Returns the router to serve and the daemon's OpenAPI
/// document, which is generated from the handlers and types, never written by hand. Every
/// API route is registered through the document: no API is served that it does not list
/// (routd merges its web page, which is not API, into `api` as an undocumented router).
pub fn daemon_router(
    api: utoipa_axum::router::OpenApiRouter,
    ops: Ops,
    body_limit: impl Into<BodyLimits>,
) -> (Router, utoipa::openapi::OpenApi) {
    let (router, mut doc) = api.merge(ops_routes()).split_for_parts();
    complete(&mut doc);
    let state = OpsState {
        name: ops.info.name,
        metrics: ops.metrics.clone(),
        ready: ops.ready.clone(),
        openapi: crate::openapi::render(&doc).into(),
    };
    let router = guard_with(router, body_limit.into())
        .layer(axum::Extension(state))
        .layer(axum::middleware::from_fn_with_state(
            HttpMetrics::new(ops.metrics.clone()),
            observe,
        ));
    (traced(router), doc)
}

/// The request body limits of a router: one for every route, and larger ones for the routes
/// that take files (by their matched path, e.g. `/v1/folders/{folder}/media/{name}`). Such a
/// route reads its body as a stream and bounds it itself (`axum::body::to_bytes`): the
/// default limit of axum's extractors does not apply to it.
#[derive(Debug, Clone, Default)]
pub struct BodyLimits {
    /// Every route's.
    pub default: usize,
    /// Per matched path, the larger limit of a route that takes files.
    pub routes: Vec<(&'static str, usize)>,
}

impl BodyLimits {
    /// The limit for a request to the route `matched` (`None`: no route matched).
    fn of(&self, matched: Option<&str>) -> usize {
        matched
            .and_then(|m| self.routes.iter().find(|(p, _)| *p == m))
            .map_or(self.default, |(_, n)| *n)
    }
}

impl From<usize> for BodyLimits {
    fn from(default: usize) -> Self {
        BodyLimits {
            default,
            routes: Vec::new(),
        }
    }
}

/// The JSON fallbacks (404, 405), the body limit (413 after draining) and panic-to-JSON: what
/// every router hako serves gets, the daemons' APIs and the per-turn gateway alike.
pub fn guard(router: Router, body_limit: usize) -> Router {
    guard_with(router, body_limit.into())
}

/// [`guard`] with larger limits for the routes that take files.
pub fn guard_with(router: Router, limits: BodyLimits) -> Router {
    let body_limit = limits.default;
    let limits = std::sync::Arc::new(limits);
    router
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "method not allowed on this route",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn(move |req: Request, next| {
            // Layered on the routes: the matched path is known here.
            let limit = limits.of(req
                .extensions()
                .get::<axum::extract::MatchedPath>()
                .map(|m| m.as_str()));
            refuse_oversized(limit, req, next)
        }))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                super::INTERNAL
                    .error("internal error; see the daemon's log")
                    .into_response()
            },
        ))
}

/// Open dev mode's wall (`HAKO_OPEN_DEV=1`: any caller, no tokens): only requests addressed
/// to this machine's loopback by name (`Host` of `localhost`, `127.0.0.1`, `[::1]`, any port)
/// and, when a browser sends an `Origin`, from a loopback origin, are served; others get 403
/// `foreign_host`. Listening on loopback is not enough: a web page the developer visits can
/// point its own name at 127.0.0.1 (DNS rebinding) and drive an open daemon through the
/// browser, with a foreign `Host` and `Origin`.
pub fn local_only(router: Router) -> Router {
    router.layer(axum::middleware::from_fn(
        |req: Request, next: axum::middleware::Next| async move {
            if is_local_request(req.headers()) {
                next.run(req).await
            } else {
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "foreign_host",
                    "open dev mode serves requests to localhost, 127.0.0.1 or [::1] only \
                     (the Host and Origin headers name another site)",
                )
                .into_response()
            }
        },
    ))
}

/// Whether a host (`name[:port]`, a URL's authority) is this machine's loopback by name.
fn is_loopback_authority(authority: &str) -> bool {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, tail)) if tail.is_empty() || tail.starts_with(':') => h,
            _ => return false,
        },
        None => authority.split(':').next().unwrap_or(""),
    };
    let host = host.to_ascii_lowercase();
    host == "localhost"
        || host == "::1"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

fn is_local_request(headers: &axum::http::HeaderMap) -> bool {
    let host_ok = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_loopback_authority);
    let origin_ok = match headers.get(header::ORIGIN) {
        None => true,
        Some(o) => o.to_str().ok().is_some_and(|o| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(is_loopback_authority)
        }),
    };
    host_ok && origin_ok
}

/// Request ids (taken from a sane `x-request-id` or made, returned in the answer) and a
/// tracing span per request carrying it.
pub fn traced(router: Router) -> Router {
    router
        .layer(tower_http::request_id::PropagateRequestIdLayer::new(
            axum::http::HeaderName::from_static(REQUEST_ID_HEADER),
        ))
        .layer(
            tower_http::trace::TraceLayer::new_for_http()
                .make_span_with(|req: &axum::http::Request<axum::body::Body>| {
                    let id = req
                        .headers()
                        .get(REQUEST_ID_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!(
                        "request",
                        id = %id,
                        method = %req.method(),
                        route = %route_of(req),
                    )
                })
                .on_request(())
                .on_response(
                    tower_http::trace::DefaultOnResponse::new().level(tracing::Level::DEBUG),
                )
                .on_failure(tower_http::trace::DefaultOnFailure::new().level(tracing::Level::WARN)),
        )
        .layer(tower_http::request_id::SetRequestIdLayer::new(
            axum::http::HeaderName::from_static(REQUEST_ID_HEADER),
            MakeId,
        ))
        .layer(axum::middleware::from_fn(sanitize_request_id))
}

/// Bodies declared larger than this are refused without being read; smaller excess is drained.
const DRAIN_CAP: u64 = 16 << 20;
/// How long draining an oversized body may take.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Answers a body whose `Content-Length` is over `limit` with 413 before any handler runs.
///
/// The body is read and dropped first (up to [`DRAIN_CAP`], within [`DRAIN_TIMEOUT`]): a
/// server that closes a connection with unread data makes the kernel send a reset, and the
/// client, still writing, never sees the 413 that explains what to fix.
async fn refuse_oversized(limit: usize, req: Request, next: axum::middleware::Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let Some(len) = declared.filter(|&len| len > limit as u64) else {
        return next.run(req).await;
    };
    if len <= DRAIN_CAP {
        let mut body = req.into_body();
        let drain = std::future::poll_fn(|cx| {
            use axum::body::HttpBody;
            loop {
                match Pin::new(&mut body).poll_frame(cx) {
                    std::task::Poll::Ready(Some(Ok(_))) => continue,
                    std::task::Poll::Ready(_) => return std::task::Poll::Ready(()),
                    std::task::Poll::Pending => return std::task::Poll::Pending,
                }
            }
        });
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    }
    super::BODY_TOO_LARGE
        .error(format!(
            "the request body is {len} bytes; the limit is {limit}"
        ))
        .into_response()
}

#[cfg(test)]
mod local_tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> axum::http::HeaderMap {
        let mut m = axum::http::HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn open_mode_answers_loopback_names_only() {
        for host in [
            "127.0.0.1:8183",
            "localhost",
            "LOCALHOST:1",
            "[::1]:9",
            "127.9.0.1",
        ] {
            assert!(is_local_request(&h(&[("host", host)])), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8183",
            "10.0.0.1",
            "[::2]:1",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_local_request(&h(&[("host", host)])), "{host}");
        }
        assert!(!is_local_request(&h(&[])), "no Host");
        assert!(is_local_request(&h(&[
            ("host", "127.0.0.1:8183"),
            ("origin", "http://localhost:8183")
        ])));
        assert!(!is_local_request(&h(&[
            ("host", "127.0.0.1:8183"),
            ("origin", "http://evil.example")
        ])));
        assert!(!is_local_request(&h(&[
            ("host", "127.0.0.1:8183"),
            ("origin", "null")
        ])));
    }
}
