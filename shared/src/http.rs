//! The HTTP conventions every daemon shares: the JSON error envelope, a JSON body extractor
//! that answers malformed input with that envelope, the ops routes (`/health`, `/ready`,
//! `/metrics`, `/openapi.json`), body limits, JSON 404/405 and panics as JSON 500.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metrics::Metrics;

/// The error body every daemon returns: `{"error":"<code>","message":"<text>"}`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    /// Machine-readable code, e.g. `scope_exceeds_parent`.
    pub error: Cow<'static, str>,
    /// Human-readable explanation.
    pub message: String,
}

/// An error on its way to becoming an HTTP response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The status code.
    pub status: StatusCode,
    /// The envelope.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with a status, a code and a message.
    pub fn new(
        status: StatusCode,
        code: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            body: ErrorBody {
                error: code.into(),
                message: message.into(),
            },
        }
    }

    /// 400 `bad_request`-style error with a specific code.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 500 `internal`: the message is logged, the client gets a generic text.
    pub fn internal(err: impl std::fmt::Display) -> Self {
        tracing::error!(error = %err, "internal error");
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "internal error; see the daemon's log",
        )
    }

    /// 503 `unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.body.error,
            self.body.message
        )
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body)).into_response()
    }
}

/// A JSON request body. Unlike `axum::Json`, every rejection is the JSON error envelope:
/// 400 `invalid_json`, 413 `body_too_large`, 415 `unsupported_media_type`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The common case, `Content-Type: application/json` and a well-formed body, is parsed
        // once with plain serde_json. Anything else goes through axum's extractor, whose
        // messages name the offending field; both accept exactly the same bodies.
        if !plain_json(req.headers()) {
            return match Json::<T>::from_request(req, state).await {
                Ok(Json(v)) => Ok(ApiJson(v)),
                Err(rej) => Err(rejection(rej.status(), rej.body_text())),
            };
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rej| rejection(rej.status(), rej.body_text()))?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(ApiJson(v)),
            Err(_) => match Json::<T>::from_bytes(&bytes) {
                Ok(Json(v)) => Ok(ApiJson(v)),
                Err(rej) => Err(rejection(rej.status(), rej.body_text())),
            },
        }
    }
}

/// A query string, decoded (percent-decoding included) into `T`. Unlike
/// `axum::extract::Query`, a rejection is the JSON envelope: 400 `invalid_query`, with a
/// message naming the parameter at fault. Give `T` `#[serde(deny_unknown_fields)]` so that a
/// misspelt parameter is refused rather than ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(rej) => Err(ApiError::bad_request(
                "invalid_query",
                rej.body_text()
                    .trim_start_matches("Failed to deserialize query string: ")
                    .to_owned(),
            )),
        }
    }
}

/// `Content-Type` is exactly `application/json` (no parameters).
fn plain_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"))
}

/// A refused body as the envelope, by the status axum's extractor chose.
fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(status, "body_too_large", text),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            status,
            "unsupported_media_type",
            "expected Content-Type: application/json",
        ),
        _ => ApiError::new(StatusCode::BAD_REQUEST, "invalid_json", text),
    }
}

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
fn valid_request_id(v: &[u8]) -> bool {
    (1..=64).contains(&v.len())
        && v.iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// Makes the id of a request that came without a valid one: `req-` and 16 hex digits.
#[derive(Clone, Copy, Default)]
struct MakeId;

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

/// The route template a request matched (`/v1/runs/{run_id}`), or `unmatched`: labels and
/// log fields never carry raw paths, which a caller chooses.
fn route_of<B>(req: &axum::http::Request<B>) -> String {
    req.extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned())
}

/// Metric handles by series key, shared by the request tasks.
type Cache<K, V> = Arc<std::sync::RwLock<std::collections::HashMap<K, V>>>;

/// Per-route request counts and latencies, with the metric handles cached per series.
#[derive(Clone)]
struct HttpMetrics {
    registry: Metrics,
    /// By (route, method, status).
    counters: Cache<(String, String, u16), crate::metrics::Counter>,
    /// By (route, method).
    latencies: Cache<(String, String), crate::metrics::Histogram>,
}

/// Latency buckets of `http_request_duration_seconds`.
const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    120.0,
];

impl HttpMetrics {
    fn new(registry: Metrics) -> Self {
        Self {
            registry,
            counters: Default::default(),
            latencies: Default::default(),
        }
    }

    fn record(&self, route: String, method: String, status: u16, seconds: f64) {
        let key = (route, method, status);
        let hit = self
            .counters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let counter = hit.unwrap_or_else(|| {
            let status = status.to_string();
            let c = self.registry.counter(
                "http_requests_total",
                "HTTP requests answered, by route template, method and status.",
                &[("route", &key.0), ("method", &key.1), ("status", &status)],
            );
            self.counters
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.clone(), c.clone());
            c
        });
        counter.inc();
        let key = (key.0, key.1);
        let hit = self
            .latencies
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&key)
            .cloned();
        let hist = hit.unwrap_or_else(|| {
            let h = self.registry.histogram(
                "http_request_duration_seconds",
                "Time to answer an HTTP request (to the response head), by route template and method.",
                &[("route", &key.0), ("method", &key.1)],
                LATENCY_BUCKETS,
            );
            self.latencies
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key, h.clone());
            h
        });
        hist.observe(seconds);
    }
}

/// Times and counts each request by route, and runs its handler as part of its request id.
async fn observe(
    axum::extract::State(m): axum::extract::State<HttpMetrics>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let route = route_of(&req);
    let method = req.method().as_str().to_owned();
    let id: Arc<str> = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .into();
    let start = std::time::Instant::now();
    let resp = with_request_id(id, next.run(req)).await;
    m.record(
        route,
        method,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

/// Drops a caller's request id that is not a valid one, so that one is made up instead.
async fn sanitize_request_id(mut req: Request, next: axum::middleware::Next) -> Response {
    let bad = req
        .headers()
        .get(REQUEST_ID_HEADER)
        .is_some_and(|v| !valid_request_id(v.as_bytes()));
    if bad {
        req.headers_mut().remove(REQUEST_ID_HEADER);
    }
    next.run(req).await
}

/// Readiness probe: `Ok` when the daemon's dependencies answer, else the reason.
pub type ReadyCheck =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What a daemon's OpenAPI document says of it.
#[derive(Debug, Clone, Copy)]
pub struct ApiInfo {
    /// The daemon's name, shown in `/health` and as the document's title.
    pub name: &'static str,
    /// The daemon's version.
    pub version: &'static str,
    /// What the daemon is, for the document's description.
    pub description: &'static str,
}

/// What the ops routes need from a daemon.
#[derive(Clone)]
pub struct Ops {
    /// The daemon's name and version.
    pub info: ApiInfo,
    /// The daemon's metrics.
    pub metrics: Metrics,
    /// The readiness check.
    pub ready: ReadyCheck,
}

/// What the ops handlers read (an extension on the router).
#[derive(Clone)]
struct OpsState {
    name: &'static str,
    metrics: Metrics,
    ready: ReadyCheck,
    openapi: Arc<str>,
}

/// `GET /health`.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    /// The daemon's name.
    pub daemon: String,
}

/// `GET /ready` when ready.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Ready {
    /// Always `ready`.
    pub status: String,
}

/// Liveness: 200 once the daemon serves.
#[utoipa::path(get, path = "/health", tag = "ops",
    responses((status = 200, description = "The daemon is up", body = Health)))]
async fn health(axum::Extension(st): axum::Extension<OpsState>) -> Json<Health> {
    Json(Health {
        status: "ok".into(),
        daemon: st.name.into(),
    })
}

/// Readiness: 200 only when the daemon's dependencies answer.
#[utoipa::path(get, path = "/ready", tag = "ops", responses(
    (status = 200, description = "Every dependency answers", body = Ready),
    (status = 503, description = "`not_ready`: names the dependency that does not answer", body = ErrorBody)))]
async fn ready(axum::Extension(st): axum::Extension<OpsState>) -> Response {
    match (st.ready)().await {
        Ok(()) => Json(Ready {
            status: "ready".into(),
        })
        .into_response(),
        Err(why) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "not_ready", why).into_response()
        }
    }
}

/// Prometheus metrics, text format 0.0.4.
#[utoipa::path(get, path = "/metrics", tag = "ops",
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
async fn metrics(axum::Extension(st): axum::Extension<OpsState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        st.metrics.render(),
    )
        .into_response()
}

/// This document.
#[utoipa::path(get, path = "/openapi.json", tag = "ops",
    responses((status = 200, description = "The OpenAPI 3.1 document of every route", content_type = "application/json", body = Object)))]
async fn openapi_doc(axum::Extension(st): axum::Extension<OpsState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        st.openapi.to_string(),
    )
        .into_response()
}

/// The OpenAPI router a daemon registers its documented routes on: title, version and the
/// error envelope's schema are set.
pub fn api_router<S>(info: ApiInfo) -> utoipa_axum::router::OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    let mut doc = utoipa::openapi::OpenApiBuilder::new()
        .info(
            utoipa::openapi::InfoBuilder::new()
                .title(info.name)
                .version(info.version)
                .description(Some(info.description))
                .build(),
        )
        .build();
    let components = doc.components.get_or_insert_with(Default::default);
    components.schemas.insert(
        "ErrorBody".into(),
        <ErrorBody as utoipa::PartialSchema>::schema(),
    );
    utoipa_axum::router::OpenApiRouter::with_openapi(doc)
}

/// The documented ops routes (`/health`, `/ready`, `/metrics`, `/openapi.json`); their
/// handlers read an extension that [`finish`] adds, so they fit any router state.
fn ops_routes<S>() -> utoipa_axum::router::OpenApiRouter<S>
where
    S: Clone + Send + Sync + 'static,
{
    use utoipa_axum::routes;
    utoipa_axum::router::OpenApiRouter::new()
        .routes(routes!(health))
        .routes(routes!(ready))
        .routes(routes!(metrics))
        .routes(routes!(openapi_doc))
}

/// Adds what [`document`] and [`finish`] both add once the routes are merged: the bearer
/// security scheme (merging the routes' components drops one set earlier) and the answers
/// every operation can give whatever its handler lists ([`common_errors`]).
fn complete(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
    common_errors(doc);
    doc.components
        .get_or_insert_with(Default::default)
        .add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .bearer_format("JWT")
                    .build(),
            ),
        );
}

/// The statuses the extractors answer before a handler runs, added to each operation that
/// does not list them: a parameter that does not parse (400), a body that is not JSON, is
/// too large or has another content type (400, 413, 415). So the document names every
/// status a client can see (schemathesis holds the daemons to it).
fn common_errors(doc: &mut utoipa::openapi::OpenApi) {
    for item in doc.paths.paths.values_mut() {
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            let params = op.parameters.as_ref().is_some_and(|p| !p.is_empty());
            let body = op.request_body.is_some();
            let answers = &mut op.responses.responses;
            let mut add = |code: &str, what: &str| {
                answers
                    .entry(code.to_owned())
                    .or_insert_with(|| crate::openapi::error_response(what).into());
            };
            if params || body {
                add(
                    "400",
                    "A parameter or the body is not valid (the code says which)",
                );
            }
            if body {
                add("413", "`body_too_large`: the body is over the limit");
                add(
                    "415",
                    "`unsupported_media_type`: the body must be `application/json`",
                );
            }
        }
    }
}

/// A daemon's whole OpenAPI document (its routes and the ops routes), without serving it:
/// for the committed copy and its test.
pub fn document<S>(api: utoipa_axum::router::OpenApiRouter<S>) -> utoipa::openapi::OpenApi
where
    S: Clone + Send + Sync + 'static,
{
    let mut doc = api.merge(ops_routes()).into_openapi();
    complete(&mut doc);
    doc
}

/// Adds the documented ops routes, JSON fallbacks (404, 405), a body limit and panic-to-JSON
/// to a daemon's documented routes. Returns the router to serve and the daemon's OpenAPI
/// document, which is generated from the handlers and types, never written by hand. Every
/// served route is registered through the document: nothing is served that it does not list.
pub fn finish(
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

/// Lists the `(method, path)` pairs an OpenAPI document declares, for coverage tests.
pub fn openapi_operations(doc: &str) -> Result<Vec<(String, String)>, serde_json::Error> {
    let v: serde_json::Value = serde_json::from_str(doc)?;
    let mut out = Vec::new();
    if let Some(paths) = v.get("paths").and_then(|p| p.as_object()) {
        for (path, item) in paths {
            if let Some(item) = item.as_object() {
                for method in item.keys() {
                    out.push((method.to_ascii_uppercase(), path.clone()));
                }
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Bounds on the connections a daemon serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Connections open at once; at the bound no more are accepted (they wait in the
    /// kernel's backlog) until one closes.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers; it also closes a keep-alive
    /// connection left idle that long.
    pub header_timeout: std::time::Duration,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            header_timeout: std::time::Duration::from_secs(10),
        }
    }
}

impl ServeLimits {
    /// From `HAKO_MAX_CONNECTIONS` (1024) and `HAKO_HEADER_TIMEOUT` (10s).
    pub fn from_env(env: &crate::config::Env) -> Result<Self, crate::config::ConfigError> {
        let d = Self::default();
        let l = Self {
            max_connections: env.parse_or("HAKO_MAX_CONNECTIONS", d.max_connections)?,
            header_timeout: env.duration_or("HAKO_HEADER_TIMEOUT", d.header_timeout)?,
        };
        if l.max_connections == 0 {
            return Err(crate::config::ConfigError::Invalid {
                var: "HAKO_MAX_CONNECTIONS".into(),
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if l.header_timeout.is_zero() {
            return Err(crate::config::ConfigError::Invalid {
                var: "HAKO_HEADER_TIMEOUT".into(),
                value: "0".into(),
                reason: "must be more than 0".into(),
            });
        }
        Ok(l)
    }
}

/// Where the serve loop takes connections from: a TCP listener (the daemons' APIs) or a unix
/// socket (the per-turn gateway).
pub trait Listener: Send + 'static {
    /// A connection.
    type Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static;
    /// Waits for the next connection.
    fn accept_io(&self) -> impl Future<Output = std::io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        let (stream, _) = self.accept().await?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_io(&self) -> std::io::Result<Self::Io> {
        Ok(self.accept().await?.0)
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, with the default limits.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, shutdown, ServeLimits::default()).await
}

/// How long hako's HTTP clients keep an idle connection to a hako daemon for reuse: well
/// under the daemons' idle close (`HAKO_HEADER_TIMEOUT`, 10 s by default), so a client never
/// sends on a connection the daemon is closing at that moment ("error sending request": a
/// CLI command failed that way after a restart left its pooled connection idle for 10-30 s).
pub const CLIENT_POOL_IDLE: std::time::Duration = std::time::Duration::from_secs(4);

/// Serves `router` on `listener` until `shutdown` resolves: HTTP/1.1, at most
/// `limits.max_connections` at once, each closed when a request's headers (or the next
/// request on a kept-alive connection) take longer than `limits.header_timeout`. On
/// shutdown it stops accepting and lets each connection finish its request in flight.
pub async fn serve_with(
    listener: impl Listener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: ServeLimits,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            r = listener.accept_io() => match r {
                Ok(c) => c,
                // Out of file descriptors and the like: wait a little instead of spinning.
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection closed with an error");
                    }
                    return;
                }
                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    let _ = stop_tx.send(true);
    // Every connection holds a slot until it is done: all slots back means all done.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
    Ok(())
}

/// `<daemon> health`: the container healthcheck of a `FROM scratch` image (no shell, no curl).
/// Asks the daemon's own `/ready` on loopback, at the port of the first of `listen_vars` that
/// is set (else `default`), and answers the exit code: 0 when ready, 1 otherwise (what did
/// not answer is printed).
pub fn health_check(listen_vars: &[&str], default: &str) -> std::process::ExitCode {
    use std::io::{Read as _, Write as _};
    let addr = listen_vars
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| default.to_owned());
    let mut addr: std::net::SocketAddr = match addr.parse() {
        Ok(a) => a,
        Err(e) => {
            println!("unhealthy: listen address {addr:?}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let t = std::time::Duration::from_secs(5);
    let answer = (|| -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect_timeout(&addr, t)?;
        s.set_read_timeout(Some(t))?;
        s.set_write_timeout(Some(t))?;
        s.write_all(b"GET /ready HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
        let mut buf = Vec::new();
        s.take(64 << 10).read_to_end(&mut buf)?;
        Ok(String::from_utf8_lossy(&buf).into_owned())
    })();
    match answer {
        Ok(a) if a.starts_with("HTTP/1.1 200") || a.starts_with("HTTP/1.0 200") => {
            println!("ready");
            std::process::ExitCode::SUCCESS
        }
        Ok(a) => {
            let body = a.split("\r\n\r\n").nth(1).unwrap_or("").trim();
            println!("unhealthy: {} {body}", a.lines().next().unwrap_or(""));
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            println!("unhealthy: {addr}: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::routing::{get, post};
    use tower::ServiceExt;

    fn app() -> Router {
        let ops = Ops {
            info: ApiInfo {
                name: "test",
                version: "0",
                description: "a test daemon",
            },
            metrics: Metrics::default(),
            ready: Arc::new(|| Box::pin(async { Err("db is down".to_owned()) })),
        };
        let r = utoipa_axum::router::OpenApiRouter::new()
            .route(
                "/echo",
                post(|ApiJson(v): ApiJson<serde_json::Value>| async move { Json(v) }),
            )
            .route(
                "/typed",
                post(|ApiJson(v): ApiJson<Typed>| async move { Json(v.n) }),
            )
            .route(
                "/panic",
                get(|| async {
                    if true {
                        panic!("boom");
                    }
                    "unreachable"
                }),
            );
        finish(r, ops, 1024).0
    }

    async fn call(req: Request<Body>) -> (StatusCode, serde_json::Value) {
        let resp = app().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    fn post_json(body: impl Into<Body>) -> Request<Body> {
        Request::post("/echo")
            .header("content-type", "application/json")
            .body(body.into())
            .unwrap()
    }

    #[derive(serde::Deserialize)]
    struct Typed {
        n: u32,
    }

    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Page {
        limit: Option<u32>,
        name: Option<String>,
    }

    /// The review's finding: query rejections were axum's text/plain 400, and authd split
    /// query strings by hand without percent-decoding.
    #[tokio::test]
    async fn query_strings_are_decoded_and_refused_as_envelopes() {
        let r = utoipa_axum::router::OpenApiRouter::new().route(
            "/page",
            get(|ApiQuery(p): ApiQuery<Page>| async move {
                Json(serde_json::json!({"limit": p.limit, "name": p.name}))
            }),
        );
        let ops = Ops {
            info: ApiInfo {
                name: "test",
                version: "0",
                description: "a test daemon",
            },
            metrics: Metrics::default(),
            ready: Arc::new(|| Box::pin(async { Ok(()) })),
        };
        let app = finish(r, ops, 1024).0;
        let call = |uri: &'static str| {
            let app = app.clone();
            async move {
                let resp = app
                    .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                    .await
                    .unwrap();
                let status = resp.status();
                let ct = resp.headers().get("content-type").cloned();
                let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
                    .await
                    .unwrap();
                (
                    status,
                    ct,
                    serde_json::from_slice::<serde_json::Value>(&bytes).unwrap(),
                )
            }
        };
        let (s, _, v) = call("/page?limit=5&name=a%2Fb%20c").await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v, serde_json::json!({"limit": 5, "name": "a/b c"}));
        for bad in ["/page?limit=x", "/page?limit=-1", "/page?bogus=1"] {
            let (s, ct, v) = call(bad).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}");
            assert_eq!(ct.unwrap(), "application/json", "{bad}");
            assert_eq!(v["error"], "invalid_query", "{bad}: {v}");
        }
        let (_, _, v) = call("/page?limit=x").await;
        assert!(v["message"].as_str().unwrap().contains("limit"), "{v}");
    }

    /// `application/json` bodies take a fast path; any other JSON type takes axum's. Both
    /// accept the same bodies and refuse the rest with the same envelope and message, which
    /// names the field at fault.
    #[tokio::test]
    async fn both_json_paths_answer_alike() {
        let send = |ct: &'static str, body: &'static str| {
            Request::post("/typed")
                .header("content-type", ct)
                .body(Body::from(body))
                .unwrap()
        };
        for body in [
            r#"{"n": 7}"#,
            r#"{"n": "7"}"#,
            r#"{"n": -1}"#,
            r#"{}"#,
            r#"{"n": 7} x"#,
            r#"{"n": 7"#,
            "",
            "[1]",
        ] {
            let fast = call(send("application/json", body)).await;
            let slow = call(send("application/json; charset=utf-8", body)).await;
            assert_eq!(fast, slow, "{body}");
        }
        let (s, v) = call(send("Application/JSON", r#"{"n": 7}"#)).await;
        assert_eq!((s, v), (StatusCode::OK, serde_json::json!(7)));
        let (s, v) = call(send("application/json", r#"{"n": "7"}"#)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"], "invalid_json");
        assert!(v["message"].as_str().unwrap().contains('n'), "{v}");
    }

    #[tokio::test]
    async fn malformed_json_is_an_envelope() {
        let (s, v) = call(post_json("{not json")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(v["error"], "invalid_json");
        let (s, v) = call(post_json("x".repeat(4096))).await;
        assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(v["error"], "body_too_large");
        let req = Request::post("/echo").body(Body::from("{}")).unwrap();
        let (s, v) = call(req).await;
        assert_eq!(s, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert_eq!(v["error"], "unsupported_media_type");
    }

    #[tokio::test]
    async fn unknown_routes_methods_and_panics_are_json() {
        let (s, v) = call(Request::get("/nope").body(Body::empty()).unwrap()).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (StatusCode::NOT_FOUND, Some("not_found"))
        );
        let (s, v) = call(Request::get("/echo").body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(v["error"], "method_not_allowed");
        let (s, v) = call(Request::get("/panic").body(Body::empty()).unwrap()).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, Some("internal"))
        );
        let (s, v) = call(Request::get("/ready").body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(v["message"], "db is down");
        // The served document lists the ops routes it was generated with.
        let (s, v) = call(Request::get("/openapi.json").body(Body::empty()).unwrap()).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(v["openapi"], "3.1.0");
        for p in ["/health", "/ready", "/metrics", "/openapi.json"] {
            assert!(v["paths"][p]["get"].is_object(), "{p}: {v}");
        }
        assert_eq!(
            v["components"]["securitySchemes"]["bearer"]["scheme"], "bearer",
            "{}",
            v["components"]
        );
        assert!(v["components"]["schemas"]["ErrorBody"].is_object());
    }

    /// A buffer the test's log lines go to.
    #[derive(Clone, Default)]
    struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Logs {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Request tracing: an id in, the same id out and in every log line of the request; one
    /// made up when the caller gives none (or a bad one); and per-route counts and latencies
    /// by route template, never by raw path.
    #[tokio::test]
    async fn requests_carry_an_id_and_are_counted_by_route() {
        let logs = Logs::default();
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || sink.clone())
            .with_ansi(false)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let metrics = Metrics::default();
        let ops = Ops {
            info: ApiInfo {
                name: "test",
                version: "0",
                description: "a test daemon",
            },
            metrics: metrics.clone(),
            ready: Arc::new(|| Box::pin(async { Ok(()) })),
        };
        let r = utoipa_axum::router::OpenApiRouter::new().route(
            "/items/{id}",
            get(|| async {
                tracing::info!("handling an item");
                Json(current_request_id().map(|i| i.to_string()))
            }),
        );
        let app = finish(r, ops, 1024).0;
        let send = |uri: &str, id: Option<&str>| {
            let mut req = Request::get(uri);
            if let Some(id) = id {
                req = req.header(REQUEST_ID_HEADER, id);
            }
            app.clone().oneshot(req.body(Body::empty()).unwrap())
        };
        let resp = send("/items/1", Some("trace-me-1")).await.unwrap();
        assert_eq!(resp.headers()[REQUEST_ID_HEADER], "trace-me-1");
        let body = axum::body::to_bytes(resp.into_body(), 1024).await.unwrap();
        assert_eq!(
            &body[..],
            br#""trace-me-1""#,
            "the handler sees its request's id"
        );
        let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
        let line = text
            .lines()
            .find(|l| l.contains("handling an item"))
            .expect("the handler logged");
        assert!(
            line.contains("id=trace-me-1") && line.contains("route=/items/{id}"),
            "{line}"
        );
        for bad in [None, Some("x".repeat(100)), Some("a b".into())] {
            let resp = send("/items/2", bad.as_deref()).await.unwrap();
            let id = resp.headers()[REQUEST_ID_HEADER]
                .to_str()
                .unwrap()
                .to_owned();
            assert!(id.starts_with("req-") && id.len() == 20, "{id}");
        }
        send("/nowhere/at/all", None).await.unwrap();
        let text = metrics.render();
        assert!(
            text.contains(
                r#"http_requests_total{route="/items/{id}",method="GET",status="200"} 4"#
            ),
            "{text}"
        );
        assert!(
            text.contains(
                r#"http_request_duration_seconds_count{route="/items/{id}",method="GET"} 4"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"route="unmatched",method="GET",status="404"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("/items/1") && !text.contains("nowhere"),
            "no raw paths: {text}"
        );
    }

    #[test]
    fn openapi_operations_lists_pairs() {
        let ops = openapi_operations(r#"{"paths":{"/a":{"get":{},"post":{}}}}"#).unwrap();
        assert_eq!(
            ops,
            vec![("GET".into(), "/a".into()), ("POST".into(), "/a".into())]
        );
    }

    /// The review's finding: no header-read timeout and no connection bound. A client that
    /// never finishes its headers is cut off; connections past the bound wait for a slot.
    #[tokio::test]
    async fn slow_headers_are_cut_and_connections_are_bounded() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let limits = ServeLimits {
            max_connections: 2,
            header_timeout: std::time::Duration::from_millis(300),
        };
        tokio::spawn(serve_with(listener, app(), std::future::pending(), limits));
        // Slowloris: half a request line, then nothing. Closed after the timeout.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /health HTTP/1.1\r\nhost:")
            .await
            .unwrap();
        let t = std::time::Instant::now();
        let mut buf = Vec::new();
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            slow.read_to_end(&mut buf),
        )
        .await;
        assert!(read.is_ok(), "the connection is closed, not left open");
        assert!(
            t.elapsed() >= std::time::Duration::from_millis(250),
            "{:?}",
            t.elapsed()
        );
        // Two idle connections hold both slots; a third gets no answer until one closes.
        let idle1 = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _idle2 = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        let early = tokio::time::timeout(
            std::time::Duration::from_millis(150),
            third.read_to_string(&mut answer),
        )
        .await;
        assert!(early.is_err(), "served past the bound: {answer}");
        drop(idle1);
        // The idle ones are cut at the header timeout at the latest; then the third is served.
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            third.read_to_string(&mut answer),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test]
    async fn an_oversized_body_gets_its_413_over_a_real_connection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve(listener, app(), std::future::pending()));
        for size in [4096usize, 2 << 20] {
            let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
            let head = format!(
                "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
                 content-length: {size}\r\nconnection: close\r\n\r\n"
            );
            conn.write_all(head.as_bytes()).await.unwrap();
            // The whole body is sent: a server that hung up early would reset this write.
            conn.write_all(&vec![b' '; size]).await.unwrap();
            let mut answer = String::new();
            conn.read_to_string(&mut answer).await.unwrap();
            assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
            assert!(answer.contains(r#""error":"body_too_large""#), "{answer}");
        }
    }
}
