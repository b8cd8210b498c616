//! The ops routes every daemon serves (`/health`, `/ready`, `/metrics`, `/openapi.json`) and
//! the generated OpenAPI document.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Json;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::ErrorBody;
use crate::metrics::Metrics;

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
pub(super) struct OpsState {
    pub(super) name: &'static str,
    pub(super) metrics: Metrics,
    pub(super) ready: ReadyCheck,
    pub(super) openapi: Arc<str>,
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

crate::error_responses!(ReadyErrors { super::NOT_READY });

/// Readiness: 200 only when the daemon's dependencies answer.
#[utoipa::path(get, path = "/ready", tag = "ops", responses(
    (status = 200, description = "Every dependency answers", body = Ready),
    ReadyErrors))]
async fn ready(axum::Extension(st): axum::Extension<OpsState>) -> Response {
    match (st.ready)().await {
        Ok(()) => Json(Ready {
            status: "ready".into(),
        })
        .into_response(),
        Err(why) => super::NOT_READY.error(why).into_response(),
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
pub(super) fn ops_routes<S>() -> utoipa_axum::router::OpenApiRouter<S>
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
pub(super) fn complete(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
    common_errors(doc);
    let components = doc.components.get_or_insert_with(Default::default);
    // Every error answer refers to the envelope's schema (`error_responses!` by name).
    components
        .schemas
        .entry("ErrorBody".into())
        .or_insert_with(<ErrorBody as utoipa::PartialSchema>::schema);
    components.add_security_scheme(
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
