//! routd's client of runed: start a run, follow its events, steer it, stop a folder's run,
//! read a run. It authenticates with routd's own service token (refreshed from authd as it
//! runs short), carries the request id, and tells "runed (or authd) is not answering" —
//! wait and try again — from "runed refused" — a configuration problem — apart.

use std::sync::Arc;
use std::time::Duration;

use hako_client::{CallError, Client, Daemon, Op, runed};
use hako_shared::GroupFolder;
use hako_shared::auth::{AuthdClient, ClientError, ServiceTokenSource};
use hako_shared::ids::RunId;
use hako_shared::media::MediaSaved;
use hako_shared::runs::{
    CreatedRun, RunList, RunRequest, RunState, RunStatus, RunStreamEvent, SteerMessage, SteerReply,
    SteerRequest, StopReply, StopRequest,
};
use serde::de::DeserializeOwned;

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

impl RunedError {
    /// A call's failure as routd acts on it: no answer or a 5xx waits and is tried again,
    /// 429 is busy, any other refusal is final.
    fn from_call(e: CallError) -> Self {
        match e {
            CallError::Unavailable { message, .. } => {
                RunedError::Unavailable(format!("runed: {message}"))
            }
            CallError::Shape { message, .. } => {
                RunedError::Unavailable(format!("runed's answer did not parse: {message}"))
            }
            CallError::Refused {
                status, message, ..
            } if status >= 500 => {
                RunedError::Unavailable(format!("runed answered {status}: {message}"))
            }
            CallError::Refused {
                status: 429,
                code,
                message,
                ..
            } => RunedError::Busy { code, message },
            CallError::Refused {
                status,
                code,
                message,
                ..
            } => RunedError::Refused {
                status,
                code,
                message,
            },
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
    client: Client,
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
        let client = Client::new(Daemon::Runed, base, timeout)
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        Ok(Self { client, auth })
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

    /// A refusal of routd's token (revoked, or its key rotated away): exchange anew next time.
    async fn refused(&self, e: CallError) -> RunedError {
        if e.status() == Some(401)
            && let Auth::Service(src) = &self.auth
        {
            src.invalidate().await;
        }
        RunedError::from_call(e)
    }

    /// `op` with routd's token.
    async fn call<T: DeserializeOwned>(&self, op: Op<T>) -> Result<T, RunedError> {
        let token = self.token().await?;
        match self.client.call(op, token.as_deref()).await {
            Ok(v) => Ok(v),
            Err(e) => Err(self.refused(e).await),
        }
    }

    /// Starts (or, for a turn id it knows, finds) a run.
    pub async fn create_run(&self, req: &RunRequest) -> Result<CreatedRun, RunedError> {
        self.call(runed::create_run(req)).await
    }

    /// A run's status, long-polling up to `wait` (at most 60 s) for its end.
    pub async fn run(&self, run_id: &RunId, wait: Duration) -> Result<RunStatus, RunedError> {
        let secs = wait.as_secs().min(60);
        let op = runed::run(run_id.as_str());
        let op = if secs == 0 {
            op
        } else {
            op.query("wait", format!("{secs}s"))
                .limit(Duration::from_secs(secs + 15))
        };
        self.call(op).await
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
        self.call(runed::steer(run_id.as_str(), &body)).await
    }

    /// Saves a file a chat sent into `folder`'s media directory.
    pub async fn put_media(
        &self,
        folder: &GroupFolder,
        name: &str,
        data: axum::body::Bytes,
    ) -> Result<MediaSaved, RunedError> {
        self.call(runed::put_media(folder.as_str(), name, data))
            .await
    }

    /// Kills a folder's live run; with `retire`, also its warm box and its directory (its
    /// group was deleted).
    pub async fn stop(&self, folder: &GroupFolder, retire: bool) -> Result<StopReply, RunedError> {
        let body = StopRequest {
            folder: folder.clone(),
            retire,
        };
        self.call(runed::stop(&body)).await
    }

    /// Whether runed answers (for `/ready`).
    pub async fn health(&self) -> Result<(), String> {
        self.client
            .call(runed::health(), None)
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// runed's own readiness (`/ready`: its database and Docker), for the watch page.
    pub async fn ready(&self) -> Result<(), String> {
        self.client
            .call(runed::ready(), None)
            .await
            .map(drop)
            .map_err(|e| RunedError::from_call(e).to_string())
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
        self.call(
            runed::runs()
                .query("state", state.as_str())
                .query("limit", 1000),
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
        let token = self.token().await?;
        match self
            .client
            .events(runed::run_events(run_id.as_str()), token.as_deref())
            .await
        {
            Ok(inner) => Ok(EventStream { inner }),
            Err(e) => Err(self.refused(e).await),
        }
    }
}

/// A run's server-sent events, parsed.
pub struct EventStream {
    inner: hako_client::EventStream<RunStreamEvent>,
}

impl EventStream {
    /// The next event; `Ok(None)` when the stream ended. Keep-alive comments are skipped; an
    /// event with data that does not parse is an error (the stream is dropped and reopened).
    pub async fn next(&mut self) -> Result<Option<RunStreamEvent>, RunedError> {
        self.inner.next().await.map_err(RunedError::from_call)
    }
}
