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
    body_limit: usize,
) -> (Router, utoipa::openapi::OpenApi) {
    let (router, mut doc) = api.merge(ops_routes()).split_for_parts();
    complete(&mut doc);
    let state = OpsState {
        name: ops.info.name,
        metrics: ops.metrics.clone(),
        ready: ops.ready.clone(),
        openapi: crate::openapi::render(&doc).into(),
    };
    let router = guard(router, body_limit)
        .layer(axum::Extension(state))
        .layer(axum::middleware::from_fn_with_state(
            HttpMetrics::new(ops.metrics.clone()),
            observe,
        ));
    (traced(router), doc)
}

/// The JSON fallbacks (404, 405), the body limit (413 after draining) and panic-to-JSON: what
/// every router hako serves gets, the daemons' APIs and the per-turn gateway alike.
pub fn guard(router: Router, body_limit: usize) -> Router {
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
            refuse_oversized(body_limit, req, next)
        }))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error; see the daemon's log",
                )
                .into_response()
            },
        ))
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
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "body_too_large",
        format!("the request body is {len} bytes; the limit is {limit}"),
    )
    .into_response()
}
