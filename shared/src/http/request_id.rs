//! Request ids: taken from the caller when valid, made otherwise, carried across daemons.

use std::future::Future;
use std::sync::Arc;

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::response::Response;

/// The header that carries a request's id: taken from the caller when it is a valid id,
/// made up otherwise, returned on the answer, and sent on to the daemons the request calls.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    /// The id of the request (or the run it started) this task serves.
    static REQUEST_ID: Arc<str>;
}

/// The id of the request this task serves, if any: clients send it on
/// ([`REQUEST_ID_HEADER`]) so one id follows a request from daemon to daemon.
pub fn current_request_id() -> Option<Arc<str>> {
    REQUEST_ID.try_with(Arc::clone).ok()
}

/// Runs `fut` as part of request `id` (work a request started outlives its answer: a run).
pub async fn with_request_id<F: Future>(id: Arc<str>, fut: F) -> F::Output {
    REQUEST_ID.scope(id, fut).await
}

/// Whether a caller's request id is one to keep: 1-64 of `[A-Za-z0-9._:-]` (it goes into
/// every log line of the request, so nothing longer or stranger is taken as is).
pub(super) fn valid_request_id(v: &[u8]) -> bool {
    (1..=64).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Makes the id of a request that came without a valid one: `req-` and 16 hex digits.
#[derive(Clone, Copy, Default)]
pub(super) struct MakeId;

impl tower_http::request_id::MakeRequestId for MakeId {
    fn make_request_id<B>(
        &mut self,
        _req: &axum::http::Request<B>,
    ) -> Option<tower_http::request_id::RequestId> {
        HeaderValue::from_str(&crate::ids::random_id("req-", 8))
            .ok()
            .map(tower_http::request_id::RequestId::new)
    }
}

/// Drops a caller's request id that is not a valid one, so that one is made up instead.
pub(super) async fn sanitize_request_id(
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let bad = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .is_some_and(|v| !valid_request_id(v.as_bytes()));
    if bad {
        req.headers_mut().remove(REQUEST_ID_HEADER);
    }
    next.run(req).await
}
