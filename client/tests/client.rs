//! The client against a real HTTP server on loopback: what a caller sees of each way a call
//! ends (an answer, a refusal with its envelope, a wrong shape, no answer in time, an answer
//! too large, an event stream).

use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use hako_client::{CallError, Client, Daemon, routd};

/// Serves `app` on a loopback port; answers its base URL.
async fn serve(app: Router) -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    url
}

fn client(base: &str) -> Client {
    Client::new(Daemon::Routd, base, Duration::from_secs(2)).unwrap()
}

#[tokio::test]
async fn answers_refusals_shapes_limits_and_streams() {
    let app = Router::new()
        .route(
            "/v1/groups",
            get(|| async { axum::Json(serde_json::json!({"groups": []})) }),
        )
        .route(
            "/v1/groups/{folder}",
            get(|| async {
                (
                    StatusCode::NOT_FOUND,
                    axum::Json(serde_json::json!({"error": "not_found", "message": "no group x"})),
                )
            })
            .delete(|| async { StatusCode::NO_CONTENT }),
        )
        .route(
            "/v1/routes",
            get(|| async { axum::Json(serde_json::json!({"routes": 7})) }),
        )
        .route(
            "/v1/turns",
            // Never answers.
            get(std::future::pending::<&'static str>),
        )
        .route(
            "/v1/tasks",
            get(|| async { vec![b' '; (16 << 20) + 1].into_response() }),
        )
        .route(
            "/v1/chats/{jid}/events",
            get(|| async {
                let m = serde_json::json!({
                    "id": "m-1", "seq": 3, "chat_jid": "web:a", "direction": "out",
                    "kind": "message", "sender": "agent", "sender_name": null,
                    "content": "hi", "timestamp": 1, "state": "sent", "turn_id": null,
                    "reply_to": null
                });
                let body = format!(": keep-alive\n\nevent: message\nid: 3\ndata: {m}\n\n");
                ([("content-type", "text/event-stream")], body)
            }),
        );
    let base = serve(app).await;
    let c = client(&base);

    // An answer, read as the API's own type; an empty 204 as `()`.
    assert!(
        c.call(routd::groups(), Some("t"))
            .await
            .unwrap()
            .groups
            .is_empty()
    );
    c.call(routd::delete_group("x"), Some("t")).await.unwrap();

    // A refusal: its status and the envelope's code and message.
    match c.call(routd::group("x"), Some("t")).await.unwrap_err() {
        CallError::Refused {
            daemon,
            status,
            code,
            message,
        } => {
            assert_eq!((daemon, status), (Daemon::Routd, 404));
            assert_eq!(
                (code.as_str(), message.as_str()),
                ("not_found", "no group x")
            );
        }
        e => panic!("{e:?}"),
    }

    // A 2xx of another shape names the call.
    let e = c.call(routd::routes(), None).await.unwrap_err();
    assert!(
        matches!(&e, CallError::Shape { path, .. } if path == "/v1/routes"),
        "{e:?}"
    );

    // No answer within the client's limit; a longer one for a call that asks for it.
    let t0 = Instant::now();
    let e = c.call(routd::turns(), None).await.unwrap_err();
    assert!(matches!(e, CallError::Unavailable { .. }), "{e:?}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    // An answer larger than 16 MiB is not read whole.
    let e = c.call(routd::tasks(), None).await.unwrap_err();
    assert!(e.to_string().contains("larger than 16 MiB"), "{e}");

    // An event stream, keep-alives skipped, each event read as a message; then its end.
    let mut events = c
        .events(routd::chat_events("web:a").query("after", 2), None)
        .await
        .unwrap();
    let m = events.next().await.unwrap().unwrap();
    assert_eq!((m.seq, m.content.as_str()), (3, "hi"));
    assert!(events.next().await.unwrap().is_none());

    // Nobody listening: unavailable, naming the daemon and URL.
    let gone = client("http://127.0.0.1:9");
    let e = gone.call(routd::groups(), None).await.unwrap_err();
    assert!(matches!(e, CallError::Unavailable { .. }), "{e:?}");
    assert!(
        e.to_string().contains("http://127.0.0.1:9/v1/groups"),
        "{e}"
    );
}
