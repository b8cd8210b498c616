//! routd's client of runed: start a run, follow its events, steer it, stop a folder's run,
//! read a run. It authenticates with routd's own service token (refreshed from authd as it
//! runs short), carries the request id, and tells "runed (or authd) is not answering" —
//! wait and try again — from "runed refused" — a configuration problem — apart.

use std::sync::Arc;
use std::time::Duration;

use hako_shared::GroupFolder;
use hako_shared::auth::{AuthdClient, ClientError, ServiceTokenSource};
use hako_shared::ids::RunId;
use hako_shared::media::MediaSaved;
use hako_shared::runs::{
    CreatedRun, RunList, RunRequest, RunState, RunStatus, RunStreamEvent, SteerMessage, SteerReply,
    SteerRequest, StopReply, StopRequest,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest answer or event read from runed.
const MAX_ANSWER: usize = 16 << 20;

/// Why a call to runed failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RunedError {
    /// runed or authd did not answer (or answered 5xx): the work waits and is tried again.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// runed is full (429: its queue, or the caller's streams): the same request is tried
    /// again later, like an outage, but runed is up.
    #[error("runed is busy ({code}): {message}")]
    Busy {
        /// The envelope's code (`queue_full`, `too_many_streams`).
        code: String,
        /// The envelope's message.
        message: String,
    },
    /// runed refused the request (any other 4xx): retrying the same request cannot help.
    #[error("runed refused ({status} {code}): {message}")]
    Refused {
        /// HTTP status.
        status: u16,
        /// The envelope's code.
        code: String,
        /// The envelope's message.
        message: String,
    },
}

/// runed's 4xx answer as an error: 429 is [`RunedError::Busy`], the rest
/// [`RunedError::Refused`].
fn refusal(status: u16, body: &[u8]) -> RunedError {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let code = v["error"].as_str().unwrap_or("").to_owned();
    let message = v["message"].as_str().unwrap_or("").to_owned();
    if status == 429 {
        RunedError::Busy { code, message }
    } else {
        RunedError::Refused {
            status,
            code,
            message,
        }
    }
}

/// How routd authenticates to runed.
#[derive(Clone, Debug)]
enum Auth {
    /// Open dev mode: no token.
    Open,
    /// routd's service token from authd.
    Service(ServiceTokenSource),
}

/// The client.
#[derive(Clone, Debug)]
pub struct RunedClient {
    base: Arc<str>,
    /// Bounded calls.
    http: reqwest::Client,
    /// Event streams: no overall timeout (a run lasts up to runed's ceiling), but a connect
    /// timeout and TCP keepalive; the follower bounds its own waits.
    streams: reqwest::Client,
    auth: Auth,
}

impl RunedClient {
    /// A client of the runed at `base`, authenticating through authd when `authd_url` is set.
    pub fn new(
        base: &str,
        authd_url: Option<&str>,
        service_key: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let auth = match (authd_url, service_key) {
            (Some(url), Some(key)) => Auth::Service(ServiceTokenSource::new(
                AuthdClient::new(url)?,
                "routd",
                key,
            )),
            _ => Auth::Open,
        };
        let build = |t: Option<Duration>| {
            let b = reqwest::Client::builder()
                .no_proxy()
                .connect_timeout(Duration::from_secs(5))
                .pool_idle_timeout(hako_shared::http::CLIENT_POOL_IDLE)
                .tcp_keepalive(Duration::from_secs(30));
            let b = match t {
                Some(t) => b.timeout(t),
                None => b,
            };
            b.build().map_err(|e| ClientError::Transport(e.to_string()))
        };
        Ok(Self {
            base: base.trim_end_matches('/').into(),
            http: build(Some(timeout))?,
            streams: build(None)?,
            auth,
        })
    }

    async fn token(&self) -> Result<Option<Arc<str>>, RunedError> {
        match &self.auth {
            Auth::Open => Ok(None),
            Auth::Service(src) => src.token().await.map(Some).map_err(|e| match e {
                ClientError::Api { status, .. } if status < 500 => RunedError::Refused {
                    status,
                    code: "service_token".into(),
                    message: format!("authd refused routd's service key: {e}"),
                },
                e => RunedError::Unavailable(format!("authd: {e}")),
            }),
        }
    }

    fn request(
        &self,
        client: &reqwest::Client,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let req = client.request(method, format!("{}{path}", self.base));
        match hako_shared::http::current_request_id() {
            Some(id) => req.header(hako_shared::http::REQUEST_ID_HEADER, &*id),
            None => req,
        }
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<T, RunedError> {
        let mut req = self.request(&self.http, method, path);
        if let Some(t) = self.token().await? {
            req = req.bearer_auth(&*t);
        }
        if let Some(b) = body {
            req = req.json(b);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| RunedError::Unavailable(format!("runed: {}", e.without_url())))?;
        self.answer(resp).await
    }

    /// runed's answer: its JSON on 2xx, else the error it stands for.
    async fn answer<T: DeserializeOwned>(&self, resp: reqwest::Response) -> Result<T, RunedError> {
        let status = resp.status().as_u16();
        let bytes = read_bounded(resp).await?;
        if status >= 500 {
            return Err(RunedError::Unavailable(format!(
                "runed answered {status}: {}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(300)])
            )));
        }
        if status >= 400 {
            if status == 401
                && let Auth::Service(src) = &self.auth
            {
                // A revoked or rotated-away service token: exchange anew next time.
                src.invalidate().await;
            }
            return Err(refusal(status, &bytes));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| RunedError::Unavailable(format!("runed's answer did not parse: {e}")))
    }

    /// Starts (or, for a turn id it knows, finds) a run.
    pub async fn create_run(&self, req: &RunRequest) -> Result<CreatedRun, RunedError> {
        self.send(reqwest::Method::POST, "/v1/runs", Some(req))
            .await
    }

    /// A run's status, long-polling up to `wait` (at most 60 s) for its end.
    pub async fn run(&self, run_id: &RunId, wait: Duration) -> Result<RunStatus, RunedError> {
        let secs = wait.as_secs().min(60);
        let path = if secs == 0 {
            format!("/v1/runs/{run_id}")
        } else {
            format!("/v1/runs/{run_id}?wait={secs}s")
        };
        let mut req = self.request(&self.streams, reqwest::Method::GET, &path);
        if let Some(t) = self.token().await? {
            req = req.bearer_auth(&*t);
        }
        let resp = tokio::time::timeout(Duration::from_secs(secs + 15), req.send())
            .await
            .map_err(|_| RunedError::Unavailable("runed: no answer to a long-poll".into()))?
            .map_err(|e| RunedError::Unavailable(format!("runed: {}", e.without_url())))?;
        let status = resp.status().as_u16();
        let bytes = read_bounded(resp).await?;
        match status {
            200 => serde_json::from_slice(&bytes)
                .map_err(|e| RunedError::Unavailable(format!("runed's answer did not parse: {e}"))),
            s if s >= 500 => Err(RunedError::Unavailable(format!("runed answered {s}"))),
            s => Err(refusal(s, &bytes)),
        }
    }

    /// Drops follow-up messages into a live run.
    pub async fn steer(
        &self,
        run_id: &RunId,
        steer_id: &str,
        messages: Vec<String>,
    ) -> Result<SteerReply, RunedError> {
        let body = SteerRequest {
            steer_id: Some(steer_id.to_owned()),
            messages: messages.into_iter().map(SteerMessage::Text).collect(),
        };
        self.send(
            reqwest::Method::POST,
            &format!("/v1/runs/{run_id}/steer"),
            Some(&body),
        )
        .await
    }

    /// Saves a file a chat sent into `folder`'s media directory.
    pub async fn put_media(
        &self,
        folder: &GroupFolder,
        name: &str,
        data: axum::body::Bytes,
    ) -> Result<MediaSaved, RunedError> {
        let path = format!(
            "/v1/folders/{}/media/{}",
            hako_shared::path_segment(folder.as_str()),
            hako_shared::path_segment(name)
        );
        let mut req = self
            .request(&self.http, reqwest::Method::PUT, &path)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(data);
        if let Some(t) = self.token().await? {
            req = req.bearer_auth(&*t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| RunedError::Unavailable(format!("runed: {}", e.without_url())))?;
        self.answer(resp).await
    }

    /// Kills a folder's live run; with `retire`, also its warm box and its directory (its
    /// group was deleted).
    pub async fn stop(&self, folder: &GroupFolder, retire: bool) -> Result<StopReply, RunedError> {
        let body = StopRequest {
            folder: folder.clone(),
            retire,
        };
        self.send(reqwest::Method::POST, "/v1/runs/stop", Some(&body))
            .await
    }

    /// Whether runed answers (for `/ready`).
    pub async fn health(&self) -> Result<(), String> {
        let resp = self
            .request(&self.http, reqwest::Method::GET, "/health")
            .send()
            .await
            .map_err(|e| format!("runed at {}: {}", self.base, e.without_url()))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(format!("runed at {} answered {}", self.base, resp.status()))
        }
    }

    /// runed's own readiness (`/ready`: its database and Docker), for the watch page.
    pub async fn ready(&self) -> Result<(), String> {
        let resp = self
            .request(&self.http, reqwest::Method::GET, "/ready")
            .send()
            .await
            .map_err(|e| format!("runed at {}: {}", self.base, e.without_url()))?;
        if resp.status().is_success() {
            return Ok(());
        }
        let status = resp.status().as_u16();
        let bytes = read_bounded(resp).await.unwrap_or_default();
        Err(refusal(status, &bytes).to_string())
    }

    /// authd's readiness (`/ready`), through the client routd gets its token from; open mode
    /// has no authd.
    pub async fn authd_health(&self) -> Option<Result<(), String>> {
        match &self.auth {
            Auth::Open => None,
            Auth::Service(src) => Some(src.client().ready().await.map_err(|e| e.to_string())),
        }
    }

    /// Runs in `state` (newest first, at most 1000).
    pub async fn runs(&self, state: RunState) -> Result<RunList, RunedError> {
        self.send(
            reqwest::Method::GET,
            &format!("/v1/runs?state={}&limit=1000", state.as_str()),
            None::<&()>,
        )
        .await
    }

    /// Whether routd can get its service token (for `/ready`); open mode always can.
    pub async fn authd_ready(&self) -> Result<(), String> {
        self.token().await.map(drop).map_err(|e| e.to_string())
    }

    /// Opens a run's event stream: every stored block first (from index 0), then each new
    /// event, ending after the terminal state.
    pub async fn events(&self, run_id: &RunId) -> Result<EventStream, RunedError> {
        let mut req = self.request(
            &self.streams,
            reqwest::Method::GET,
            &format!("/v1/runs/{run_id}/events"),
        );
        if let Some(t) = self.token().await? {
            req = req.bearer_auth(&*t);
        }
        let resp = tokio::time::timeout(Duration::from_secs(15), req.send())
            .await
            .map_err(|_| RunedError::Unavailable("runed: no answer to an event stream".into()))?
            .map_err(|e| RunedError::Unavailable(format!("runed: {}", e.without_url())))?;
        let status = resp.status().as_u16();
        if status != 200 {
            let bytes = read_bounded(resp).await.unwrap_or_default();
            return Err(if status >= 500 {
                RunedError::Unavailable(format!("runed answered {status}"))
            } else {
                refusal(status, &bytes)
            });
        }
        Ok(EventStream {
            resp,
            parser: hako_shared::sse::Parser::new(MAX_ANSWER),
            ready: Default::default(),
        })
    }
}

async fn read_bounded(mut resp: reqwest::Response) -> Result<Vec<u8>, RunedError> {
    let mut out = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| RunedError::Unavailable(format!("runed: {}", e.without_url())))?
    {
        if out.len() + chunk.len() > MAX_ANSWER {
            return Err(RunedError::Unavailable(
                "runed's answer is too large".into(),
            ));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A run's server-sent events, parsed.
pub struct EventStream {
    resp: reqwest::Response,
    parser: hako_shared::sse::Parser,
    ready: std::collections::VecDeque<hako_shared::sse::Event>,
}

impl EventStream {
    /// The next event; `Ok(None)` when the stream ended. Keep-alive comments are skipped; an
    /// event with data that does not parse is an error (the stream is dropped and reopened).
    pub async fn next(&mut self) -> Result<Option<RunStreamEvent>, RunedError> {
        loop {
            if let Some(e) = self.ready.pop_front() {
                return serde_json::from_str(&e.data).map(Some).map_err(|e| {
                    RunedError::Unavailable(format!("runed event did not parse: {e}"))
                });
            }
            let chunk = self.resp.chunk().await.map_err(|e| {
                RunedError::Unavailable(format!("runed stream: {}", e.without_url()))
            })?;
            let Some(chunk) = chunk else {
                return Ok(None);
            };
            let mut out = Vec::new();
            self.parser
                .feed(&chunk, &mut out)
                .map_err(|e| RunedError::Unavailable(format!("runed stream: {e}")))?;
            self.ready.extend(out);
        }
    }
}
