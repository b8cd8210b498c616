//! The model relay: how an agent program, which speaks HTTP over TCP, reaches the gateway's
//! unix socket from a box with loopback only, without ever holding the token.
//!
//! An HTTP/1.1 proxy on `127.0.0.1` in front of the gateway's `api.sock`. It puts the run's
//! spawn token on every request itself (`x-api-key`, which the gateway reads in every wire
//! format; whatever key or `Authorization` the child sent is dropped), so the program never
//! holds the token: it runs with a placeholder key, no process it starts can read the token
//! from its environment, and it can be started before the turn, when there is no token yet.
//! A request that arrives before [`Relay::authorize`] waits for it. Its own failures answer
//! in a shape both the Anthropic and the OpenAI clients read (`error.message`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, HeaderValue};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinHandle;

use crate::output::log;

/// Connections relayed at once (the gateway allows a turn a few calls in flight).
const MAX_CONNECTIONS: usize = 16;
/// The key an agent program is given: any non-empty value; the relay replaces it.
pub const PLACEHOLDER_KEY: &str = "hako-relay-adds-the-key";

type Body = Either<Incoming, Full<Bytes>>;

/// A running relay; stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    key: watch::Sender<Option<Arc<HeaderValue>>>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on an ephemeral loopback port and relays to `socket`, holding every request
    /// until [`Relay::authorize`].
    pub async fn start(socket: PathBuf) -> std::io::Result<Relay> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (key, keys) = watch::channel(None);
        let socket: Arc<Path> = socket.into();
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (socket, keys) = (socket.clone(), keys.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let svc = hyper::service::service_fn(move |req| {
                        forward(req, socket.clone(), keys.clone())
                    });
                    // A connection that breaks mid-way is the program's to retry.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Ok(Relay { addr, key, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on every request carries `token`; the held ones go on.
    pub fn authorize(&self, token: &str) -> Result<(), String> {
        let mut value = HeaderValue::from_str(token)
            .map_err(|_| "the spawn token is not a valid header value".to_owned())?;
        value.set_sensitive(true);
        self.key.send_replace(Some(Arc::new(value)));
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request: the token put on, then sent to the gateway on a connection of its own, the
/// answer streamed back as it comes (the model's server-sent events).
async fn forward(
    mut req: Request<Incoming>,
    socket: Arc<Path>,
    mut keys: watch::Receiver<Option<Arc<HeaderValue>>>,
) -> Result<Response<Body>, Infallible> {
    let key = match keys.wait_for(Option::is_some).await {
        Ok(k) => k.as_ref().map(|k| HeaderValue::clone(k)),
        Err(_) => None,
    };
    let Some(key) = key else {
        return Ok(failure(
            StatusCode::SERVICE_UNAVAILABLE,
            "the relay stopped",
        ));
    };
    let headers = req.headers_mut();
    headers.remove(AUTHORIZATION);
    headers.insert("x-api-key", key);
    let stream = match UnixStream::connect(&socket).await {
        Ok(s) => s,
        Err(e) => {
            log(format_args!(
                "model relay: cannot reach {}: {e}",
                socket.display()
            ));
            return Ok(failure(
                StatusCode::BAD_GATEWAY,
                "the model gateway is not reachable from this box",
            ));
        }
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(h) => h,
        Err(e) => return Ok(failure(StatusCode::BAD_GATEWAY, &e.to_string())),
    };
    // The connection drives itself; it ends when the answer is read or dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(match sender.send_request(req).await {
        Ok(resp) => resp.map(Either::Left),
        Err(e) => failure(
            StatusCode::BAD_GATEWAY,
            &format!("the model gateway broke off: {e}"),
        ),
    })
}

/// An error in the Messages API's shape (`{"type": "error", "error": {"type", "message"}}`),
/// which OpenAI's clients read too (`error.message`).
fn failure(status: StatusCode, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": "error",
        "error": {"type": "api_error", "message": message},
    });
    let mut resp = Response::new(Either::Right(Full::new(Bytes::from(body.to_string()))));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-request HTTP server on a unix socket that answers with the headers it got.
    async fn echo_headers(socket: PathBuf) -> JoinHandle<()> {
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let mut seen: Vec<String> = req
                            .headers()
                            .iter()
                            .filter(|(k, _)| matches!(k.as_str(), "x-api-key" | "authorization"))
                            .map(|(k, v)| format!("{k}={}", v.to_str().unwrap()))
                            .collect();
                        seen.sort();
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        seen.push(String::from_utf8_lossy(&body).into_owned());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(seen.join(";")))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(s), svc)
                        .await;
                });
            }
        })
    }

    async fn post(addr: SocketAddr, headers: &str, body: &str) -> String {
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "POST /v1/messages HTTP/1.1\r\nhost: x\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        tcp.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        tcp.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test]
    async fn the_relay_holds_requests_until_the_token_and_replaces_any_key() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("api.sock");
        let _server = echo_headers(socket.clone()).await;
        let relay = Relay::start(socket).await.unwrap();
        let addr = relay.addr();
        let mut held = tokio::spawn(post(
            addr,
            "x-api-key: stolen\r\nauthorization: Bearer forged\r\n",
            "{\"a\":1}",
        ));
        // Nothing answers before the token: the request is held, not refused.
        assert!(
            tokio::time::timeout(Duration::from_millis(200), &mut held)
                .await
                .is_err(),
            "a request went through before the relay had a token"
        );
        relay.authorize("tok-1").unwrap();
        let out = held.await.unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.ends_with("x-api-key=tok-1;{\"a\":1}"), "{out}");
        // Later requests carry it at once.
        let out = post(addr, "", "b").await;
        assert!(out.ends_with("x-api-key=tok-1;b"), "{out}");
        assert!(relay.authorize("bad\ntoken").is_err());
    }

    #[tokio::test]
    async fn an_unreachable_gateway_is_an_api_error() {
        let dir = tempfile::tempdir().unwrap();
        let relay = Relay::start(dir.path().join("none.sock")).await.unwrap();
        relay.authorize("t").unwrap();
        let out = post(relay.addr(), "", "{}").await;
        assert!(out.starts_with("HTTP/1.1 502"), "{out}");
        assert!(out.contains("\"type\":\"api_error\""), "{out}");
    }
}
