//! Sending operations: one client per daemon, one error type, bounded answers.

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::time::Duration;

use serde::de::DeserializeOwned;

use crate::op::{Body, Daemon, Events, Op, Text};

/// The largest answer, and the largest event of a stream, read.
const MAX_ANSWER: usize = 16 << 20;
/// How long opening an event stream may take (the stream itself has no limit).
const STREAM_OPEN: Duration = Duration::from_secs(15);

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No answer: not listening, timed out, broke off, or too large to read.
    #[error("{daemon} does not answer at {url} ({message})")]
    Unavailable {
        /// The daemon called.
        daemon: Daemon,
        /// The URL called.
        url: String,
        /// What happened.
        message: String,
    },
    /// A non-2xx answer: its status, and its error envelope's code and message.
    #[error("{daemon} answered {status} {code}: {message}")]
    Refused {
        /// The daemon called.
        daemon: Daemon,
        /// The HTTP status.
        status: u16,
        /// The envelope's `error` (`?` when it had none).
        code: String,
        /// The envelope's `message` (or the answer's first bytes).
        message: String,
    },
    /// A 2xx answer this client does not read (another version), or a body that would not
    /// serialize.
    #[error("{daemon} answered {path} in a shape this hako does not read: {message}")]
    Shape {
        /// The daemon called.
        daemon: Daemon,
        /// The call's path.
        path: String,
        /// What did not fit.
        message: String,
    },
}

impl CallError {
    /// The answer's status, when there was one.
    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// A client of one daemon at one base URL.
#[derive(Clone, Debug)]
pub struct Client {
    daemon: Daemon,
    base: String,
    http: reqwest::Client,
    timeout: Duration,
}

impl Client {
    /// A client of `daemon` at `base`; each call (streams excepted) ends within `timeout`.
    pub fn new(daemon: Daemon, base: &str, timeout: Duration) -> Result<Self, CallError> {
        let http = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(hako_shared::http::CLIENT_POOL_IDLE)
            .tcp_keepalive(Duration::from_secs(30))
            .build()
            .map_err(|e| CallError::Unavailable {
                daemon,
                url: base.to_owned(),
                message: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Client {
            daemon,
            base: base.trim_end_matches('/').to_owned(),
            http,
            timeout,
        })
    }

    /// The daemon's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The daemon.
    pub fn daemon(&self) -> Daemon {
        self.daemon
    }

    fn unavailable(&self, url: &str, e: impl std::fmt::Display) -> CallError {
        CallError::Unavailable {
            daemon: self.daemon,
            url: url.to_owned(),
            message: e.to_string(),
        }
    }

    fn request<R>(
        &self,
        op: &Op<R>,
        token: Option<&str>,
    ) -> Result<(String, reqwest::RequestBuilder), CallError> {
        debug_assert_eq!(
            op.daemon, self.daemon,
            "{} sent to {}",
            op.path, self.daemon
        );
        let url = format!("{}{}", self.base, op.path);
        let mut req = self.http.request(op.method.clone(), &url);
        if let Some(id) = hako_shared::http::current_request_id() {
            req = req.header(hako_shared::http::REQUEST_ID_HEADER, &*id);
        }
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req = match &op.body {
            Body::None => req,
            Body::Json(b) => req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b.clone()),
            Body::Bytes(b) => req
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(b.clone()),
            Body::Invalid(e) => {
                return Err(CallError::Shape {
                    daemon: self.daemon,
                    path: op.path.clone(),
                    message: format!("the request body does not serialize: {e}"),
                });
            }
        };
        Ok((url, req))
    }

    /// Sends `op` and reads its answer as `R` (an empty answer reads as JSON `null`).
    pub async fn call<R: DeserializeOwned>(
        &self,
        op: Op<R>,
        token: Option<&str>,
    ) -> Result<R, CallError> {
        let (status, body) = self.raw(&op, token).await?;
        if !(200..300).contains(&status) {
            return Err(refused(self.daemon, status, &body));
        }
        let body: &[u8] = if body.is_empty() { b"null" } else { &body };
        serde_json::from_slice(body).map_err(|e| CallError::Shape {
            daemon: self.daemon,
            path: op.path.clone(),
            message: e.to_string(),
        })
    }

    /// Sends `op` and answers its text.
    pub async fn text(&self, op: Op<Text>, token: Option<&str>) -> Result<String, CallError> {
        let (status, body) = self.raw(&op, token).await?;
        if !(200..300).contains(&status) {
            return Err(refused(self.daemon, status, &body));
        }
        String::from_utf8(body).map_err(|e| CallError::Shape {
            daemon: self.daemon,
            path: op.path.clone(),
            message: e.to_string(),
        })
    }

    /// Sends `op` and answers its status and body as they are (at most 16 MiB), whatever the
    /// status: for tests of refusals, and callers that read the envelope themselves.
    pub async fn raw<R>(
        &self,
        op: &Op<R>,
        token: Option<&str>,
    ) -> Result<(u16, Vec<u8>), CallError> {
        let (url, req) = self.request(op, token)?;
        let limit = op.limit.unwrap_or(self.timeout);
        let read = async {
            let mut resp = req
                .send()
                .await
                .map_err(|e| self.unavailable(&url, root(&e)))?;
            let status = resp.status().as_u16();
            let mut out = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| self.unavailable(&url, root(&e)))?
            {
                if out.len() + chunk.len() > MAX_ANSWER {
                    return Err(self.unavailable(&url, "the answer is larger than 16 MiB"));
                }
                out.extend_from_slice(&chunk);
            }
            Ok((status, out))
        };
        tokio::time::timeout(limit, read)
            .await
            .map_err(|_| self.unavailable(&url, format!("no answer within {}s", limit.as_secs())))?
    }

    /// Opens `op`'s event stream (a refusal is an error); the stream has no limit of its own.
    pub async fn events<T: DeserializeOwned>(
        &self,
        op: Op<Events<T>>,
        token: Option<&str>,
    ) -> Result<EventStream<T>, CallError> {
        let (url, req) = self.request(&op, token)?;
        let resp = tokio::time::timeout(STREAM_OPEN, req.send())
            .await
            .map_err(|_| self.unavailable(&url, "no answer to an event stream"))?
            .map_err(|e| self.unavailable(&url, root(&e)))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let body = tokio::time::timeout(STREAM_OPEN, resp.bytes())
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default();
            return Err(refused(
                self.daemon,
                status,
                &body[..body.len().min(MAX_ANSWER)],
            ));
        }
        Ok(EventStream {
            daemon: self.daemon,
            url,
            resp,
            parser: hako_shared::sse::Parser::new(MAX_ANSWER),
            ready: VecDeque::new(),
            item: PhantomData,
        })
    }
}

/// A non-2xx answer as an error, from its envelope.
fn refused(daemon: Daemon, status: u16, body: &[u8]) -> CallError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = || String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
    CallError::Refused {
        daemon,
        status,
        code: v["error"].as_str().unwrap_or("?").to_owned(),
        message: v["message"].as_str().map_or_else(text, str::to_owned),
    }
}

/// The innermost cause of an error, which says what went wrong (refused, timed out); the
/// URL, which a caller names itself, left out.
fn root(e: &reqwest::Error) -> String {
    let mut cur: &(dyn std::error::Error + 'static) = e;
    while let Some(s) = cur.source() {
        cur = s;
    }
    cur.to_string()
}

/// A stream of server-sent events, each read as `T`.
pub struct EventStream<T> {
    daemon: Daemon,
    url: String,
    resp: reqwest::Response,
    parser: hako_shared::sse::Parser,
    ready: VecDeque<hako_shared::sse::Event>,
    item: PhantomData<fn() -> T>,
}

impl<T: DeserializeOwned> EventStream<T> {
    /// The next event; `Ok(None)` when the stream ended. Keep-alive comments are skipped; an
    /// event whose data this client does not read is an error (drop the stream, open anew).
    pub async fn next(&mut self) -> Result<Option<T>, CallError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return serde_json::from_str(&e.data)
                    .map(Some)
                    .map_err(|err| CallError::Shape {
                        daemon: self.daemon,
                        path: self.url.clone(),
                        message: format!("an event ({}): {err}", e.name),
                    });
            }
            let chunk = self
                .resp
                .chunk()
                .await
                .map_err(|e| CallError::Unavailable {
                    daemon: self.daemon,
                    url: self.url.clone(),
                    message: format!("the event stream broke off: {}", root(&e)),
                })?;
            let Some(chunk) = chunk else {
                return Ok(None);
            };
            let mut out = Vec::new();
            self.parser
                .feed(&chunk, &mut out)
                .map_err(|e| CallError::Unavailable {
                    daemon: self.daemon,
                    url: self.url.clone(),
                    message: e.to_string(),
                })?;
            self.ready.extend(out);
        }
    }
}
