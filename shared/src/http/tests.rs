//! The shared HTTP layer against real requests.

use std::sync::Arc;

use axum::http::{Request, StatusCode};
use axum::{Json, Router};

use super::{extract::*, ops::*, request_id::*, router::*, serve::*};
use crate::metrics::Metrics;
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
    daemon_router(r, ops, 1024).0
}

/// The ops of a test daemon that is ready.
fn ready_ops() -> Ops {
    Ops {
        info: ApiInfo {
            name: "test",
            version: "0",
            description: "a test daemon",
        },
        metrics: Metrics::default(),
        ready: Arc::new(|| Box::pin(async { Ok(()) })),
    }
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
    let ops = ready_ops();
    let app = daemon_router(r, ops, 1024).0;
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
    let app = daemon_router(r, ops, 1024).0;
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
        text.contains(r#"http_requests_total{route="/items/{id}",method="GET",status="200"} 4"#),
        "{text}"
    );
    assert!(
        text.contains(r#"http_request_duration_seconds_count{route="/items/{id}",method="GET"} 4"#),
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

/// The daemon's stopping token is cancelled by the handle itself, at shutdown and at drop:
/// work that watches it (turns, runs) stops even when nobody calls shutdown.
#[tokio::test]
async fn the_stopping_token_is_cancelled_at_shutdown_and_at_drop() {
    for graceful in [true, false] {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let token = tokio_util::sync::CancellationToken::new();
        let worker = tokio::spawn({
            let t = token.clone();
            async move { t.cancelled().await }
        });
        let served = Served::spawn(l, Router::new(), ServeLimits::default(), [])
            .unwrap()
            .stopping(token.clone());
        assert!(!token.is_cancelled());
        if graceful {
            served
                .shutdown(std::time::Duration::from_secs(5))
                .await
                .unwrap();
        } else {
            drop(served);
        }
        worker.await.unwrap();
        assert!(token.is_cancelled(), "graceful: {graceful}");
    }
}

/// A route that takes files gets its own, larger limit (by its matched path, parameters and
/// all); every other route keeps the default.
#[tokio::test]
async fn a_file_route_has_its_own_body_limit() {
    use axum::response::IntoResponse;
    let ops = ready_ops();
    let r = utoipa_axum::router::OpenApiRouter::new()
        .route(
            "/files/{name}",
            axum::routing::put(|body: Body| async move {
                match axum::body::to_bytes(body, 64 << 10).await {
                    Ok(b) => Json(serde_json::json!({"bytes": b.len()})).into_response(),
                    Err(_) => StatusCode::PAYLOAD_TOO_LARGE.into_response(),
                }
            }),
        )
        .route(
            "/echo",
            post(|ApiJson(v): ApiJson<serde_json::Value>| async move { Json(v) }),
        );
    let limits = BodyLimits {
        default: 1024,
        routes: vec![("/files/{name}", 64 << 10)],
    };
    let app = daemon_router(r, ops, limits).0;
    let send = |req: Request<Body>| {
        let app = app.clone();
        async move {
            let resp = app.oneshot(req).await.unwrap();
            let status = resp.status();
            let b = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&b).unwrap_or_default(),
            )
        }
    };
    let file = |n: usize| {
        Request::put("/files/a.bin")
            .header("content-length", n.to_string())
            .body(Body::from(vec![0u8; n]))
            .unwrap()
    };
    let (s, v) = send(file(10 << 10)).await;
    assert_eq!(
        (s, v["bytes"].as_u64()),
        (StatusCode::OK, Some(10 << 10)),
        "{v}"
    );
    let (s, v) = send(file(65 << 10)).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert_eq!(v["error"], "body_too_large");
    let json = format!("\"{}\"", "x".repeat(10 << 10));
    let (s, v) = send(
        Request::post("/echo")
            .header("content-type", "application/json")
            .header("content-length", json.len().to_string())
            .body(Body::from(json))
            .unwrap(),
    )
    .await;
    assert_eq!(
        s,
        StatusCode::PAYLOAD_TOO_LARGE,
        "the default still holds: {v}"
    );
}
