//! Per-route HTTP metrics: counts and latencies by route template, never raw paths.

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use super::request_id::{REQUEST_ID_HEADER, with_request_id};
use crate::metrics::Metrics;

/// The route template a request matched (`/v1/runs/{run_id}`), or `unmatched`: labels and
/// log fields never carry raw paths, which a caller chooses.
pub(super) fn route_of<B>(req: &axum::http::Request<B>) -> String {
    req.extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned())
}

/// Metric handles by series key, shared by the request tasks.
type Cache<K, V> = Arc<std::sync::RwLock<std::collections::HashMap<K, V>>>;

/// Per-route request counts and latencies, with the metric handles cached per series.
#[derive(Clone)]
pub(super) struct HttpMetrics {
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
    pub(super) fn new(registry: Metrics) -> Self {
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
pub(super) async fn observe(
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
