//! HTTP/1.1 over a unix socket (routd's gateway, `api.sock`): one request per connection,
//! the answer's body read piece by piece as it arrives, each wait bounded.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::Request;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tokio::time::timeout;

/// Connecting to the socket.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A request that got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The socket is not there or refuses.
    #[error("cannot connect to {path}: {source}")]
    Connect {
        /// The socket.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// No answer (or no next piece of it) in time.
    #[error("no answer from the gateway within {0:?}")]
    Timeout(Duration),
    /// The connection broke.
    #[error("the gateway connection failed: {0}")]
    Broken(String),
    /// The answer outgrew its bound.
    #[error("the answer passed {0} bytes")]
    TooLarge(usize),
}

/// An answer whose body is still to be read.
pub struct Answer {
    /// The status.
    pub status: u16,
    /// `Content-Type`.
    pub content_type: String,
    /// `x-should-retry` (the header Anthropic's and OpenAI's SDKs obey): `Some(false)` when
    /// the gateway says no retry can help.
    pub should_retry: Option<bool>,
    body: Incoming,
    idle: Duration,
}

impl Answer {
    /// The next piece of the body; `None` at its end.
    pub async fn next(&mut self) -> Result<Option<Bytes>, HttpError> {
        loop {
            let frame = timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| HttpError::Timeout(self.idle))?;
            match frame {
                None => return Ok(None),
                Some(Err(e)) => return Err(HttpError::Broken(e.to_string())),
                Some(Ok(f)) => {
                    if let Ok(data) = f.into_data() {
                        return Ok(Some(data));
                    }
                    // Trailers: nothing for us.
                }
            }
        }
    }

    /// The whole body, up to `max` bytes.
    pub async fn text(mut self, max: usize) -> Result<String, HttpError> {
        let mut all = Vec::new();
        while let Some(b) = self.next().await? {
            if all.len() + b.len() > max {
                return Err(HttpError::TooLarge(max));
            }
            all.extend_from_slice(&b);
        }
        Ok(String::from_utf8_lossy(&all).into_owned())
    }
}

/// POSTs `body` (JSON) to `path` on the socket; waits at most `wait` for the answer to start,
/// and `idle` between pieces of its body later.
pub async fn post_json(
    socket: &Path,
    path: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    wait: Duration,
    idle: Duration,
) -> Result<Answer, HttpError> {
    let stream = timeout(CONNECT_TIMEOUT, UnixStream::connect(socket))
        .await
        .map_err(|_| HttpError::Timeout(CONNECT_TIMEOUT))?
        .map_err(|source| HttpError::Connect {
            path: socket.display().to_string(),
            source,
        })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| HttpError::Broken(e.to_string()))?;
    // The connection drives itself; it ends when the answer is read or dropped.
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = Request::post(path)
        .header("host", "gateway")
        .header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| HttpError::Broken(e.to_string()))?;
    let resp = timeout(wait, sender.send_request(req))
        .await
        .map_err(|_| HttpError::Timeout(wait))?
        .map_err(|e| HttpError::Broken(e.to_string()))?;
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let should_retry = match resp.headers().get("x-should-retry").map(|v| v.as_bytes()) {
        Some(b"true") => Some(true),
        Some(b"false") => Some(false),
        _ => None,
    };
    Ok(Answer {
        status: resp.status().as_u16(),
        content_type,
        should_retry,
        body: resp.into_body(),
        idle,
    })
}
