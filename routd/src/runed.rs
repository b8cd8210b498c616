//! What routd asks of runed ([`Runs`]: start a run, follow its events, steer it, stop a
//! folder's run, read a run) and the client that asks the real one over HTTP
//! ([`RunedClient`]). The client authenticates with routd's own service token (refreshed
//! from authd as it runs short), carries the request id, and tells "runed (or authd) is not
//! answering" — wait and try again — from "runed refused" — a configuration problem — apart.
//!
//! routd's turn logic sees runed through [`Runs`] alone, so its tests can put a scripted
//! runed behind it (`start_with`), as the runner's tests put a simulated engine
//! behind the engine trait.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{BoxStream, StreamExt};
use hako_client::authd::{AuthdClient, ServiceTokenSource};
use hako_client::{CallError, Client, Daemon, Op, runed};
use hako_shared::GroupFolder;
use hako_shared::auth::ClientError;
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

/// What routd asks of runed. [`RunedClient`] asks the real one; a test may answer itself.
/// Every call answers a [`RunedError`] routd acts on: unavailable and busy wait and try
/// again, a refusal is final.
pub trait Runs: Send + Sync + 'static {
    /// Starts (or, for a turn id it knows, finds) a run.
    fn create_run<'a>(
        &'a self,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<CreatedRun, RunedError>>;

    /// A run's status, long-polling up to `wait` (at most 60 s) for its end.
    fn run<'a>(
        &'a self,
        run_id: &'a RunId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<RunStatus, RunedError>>;

    /// A run's events: every stored block first (from index 0), then each new event, ending
    /// after the terminal state.
    fn events<'a>(&'a self, run_id: &'a RunId) -> BoxFuture<'a, Result<EventStream, RunedError>>;

    /// Drops follow-up messages into a live run, once per `steer_id`.
    fn steer<'a>(
        &'a self,
        run_id: &'a RunId,
        steer_id: &'a str,
        messages: Vec<String>,
    ) -> BoxFuture<'a, Result<SteerReply, RunedError>>;

    /// Saves a file a chat sent into `folder`'s media directory.
    fn put_media<'a>(
        &'a self,
        folder: &'a GroupFolder,
        name: &'a str,
        data: axum::body::Bytes,
    ) -> BoxFuture<'a, Result<MediaSaved, RunedError>>;

    /// Kills a folder's live run; with `retire`, also its warm box and its directory.
    fn stop<'a>(
        &'a self,
        folder: &'a GroupFolder,
        retire: bool,
    ) -> BoxFuture<'a, Result<StopReply, RunedError>>;

    /// Runs in `state` (newest first, at most 1000).
    fn runs(&self, state: RunState) -> BoxFuture<'_, Result<RunList, RunedError>>;

    /// Whether runed answers and routd can get its token: routd's own `/ready`.
    fn reachable(&self) -> BoxFuture<'_, Result<(), String>>;

    /// runed's readiness and authd's, for the watch page.
    fn readiness(&self) -> BoxFuture<'_, Readiness>;
}

/// The daemons behind routd as the watch page shows them.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// runed's `/ready` (its database and its engine).
    pub runed: Result<(), String>,
    /// authd's `/ready`; `None` in open mode (no authd).
    pub authd: Option<Result<(), String>>,
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
}

impl Runs for RunedClient {
    fn create_run<'a>(
        &'a self,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<CreatedRun, RunedError>> {
        Box::pin(self.call(runed::create_run(req)))
    }

    fn run<'a>(
        &'a self,
        run_id: &'a RunId,
        wait: Duration,
    ) -> BoxFuture<'a, Result<RunStatus, RunedError>> {
        let secs = wait.as_secs().min(60);
        let op = runed::run(run_id.as_str());
        let op = if secs == 0 {
            op
        } else {
            op.query("wait", format!("{secs}s"))
                .limit(Duration::from_secs(secs + 15))
        };
        Box::pin(self.call(op))
    }

    fn events<'a>(&'a self, run_id: &'a RunId) -> BoxFuture<'a, Result<EventStream, RunedError>> {
        Box::pin(async move {
            let token = self.token().await?;
            match self
                .client
                .events(runed::run_events(run_id.as_str()), token.as_deref())
                .await
            {
                Ok(inner) => Ok(EventStream::from_client(inner)),
                Err(e) => Err(self.refused(e).await),
            }
        })
    }

    fn steer<'a>(
        &'a self,
        run_id: &'a RunId,
        steer_id: &'a str,
        messages: Vec<String>,
    ) -> BoxFuture<'a, Result<SteerReply, RunedError>> {
        let body = SteerRequest {
            steer_id: Some(steer_id.to_owned()),
            messages: messages.into_iter().map(SteerMessage::Text).collect(),
        };
        Box::pin(async move { self.call(runed::steer(run_id.as_str(), &body)).await })
    }

    fn put_media<'a>(
        &'a self,
        folder: &'a GroupFolder,
        name: &'a str,
        data: axum::body::Bytes,
    ) -> BoxFuture<'a, Result<MediaSaved, RunedError>> {
        Box::pin(self.call(runed::put_media(folder.as_str(), name, data)))
    }

    fn stop<'a>(
        &'a self,
        folder: &'a GroupFolder,
        retire: bool,
    ) -> BoxFuture<'a, Result<StopReply, RunedError>> {
        let body = StopRequest {
            folder: folder.clone(),
            retire,
        };
        Box::pin(async move { self.call(runed::stop(&body)).await })
    }

    fn runs(&self, state: RunState) -> BoxFuture<'_, Result<RunList, RunedError>> {
        Box::pin(
            self.call(
                runed::runs()
                    .query("state", state.as_str())
                    .query("limit", 1000),
            ),
        )
    }

    fn reachable(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.token().await.map(drop).map_err(|e| e.to_string())?;
            self.client
                .call(runed::health(), None)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
    }

    fn readiness(&self) -> BoxFuture<'_, Readiness> {
        Box::pin(async move {
            let runed = async {
                self.client
                    .call(runed::ready(), None)
                    .await
                    .map(drop)
                    .map_err(|e| RunedError::from_call(e).to_string())
            };
            let authd = async {
                match &self.auth {
                    Auth::Open => None,
                    Auth::Service(src) => {
                        Some(src.client().ready().await.map_err(|e| e.to_string()))
                    }
                }
            };
            let (runed, authd) = tokio::join!(runed, authd);
            Readiness { runed, authd }
        })
    }
}

/// A run's events, parsed: from runed's server-sent events, or any stream a test makes.
pub struct EventStream(BoxStream<'static, Result<RunStreamEvent, RunedError>>);

impl EventStream {
    /// A stream of `events`; it ends where they end (an error ends it too).
    pub fn new(
        events: impl futures_util::Stream<Item = Result<RunStreamEvent, RunedError>> + Send + 'static,
    ) -> Self {
        Self(events.boxed())
    }

    /// runed's server-sent events: keep-alive comments are skipped; an event with data that
    /// does not parse is an error (the stream is dropped and reopened).
    fn from_client(inner: hako_client::EventStream<RunStreamEvent>) -> Self {
        Self::new(futures_util::stream::unfold(Some(inner), |s| async move {
            let mut s = s?;
            match s.next().await {
                Ok(Some(e)) => Some((Ok(e), Some(s))),
                Ok(None) => None,
                Err(e) => Some((Err(RunedError::from_call(e)), None)),
            }
        }))
    }

    /// The next event; `Ok(None)` when the stream ended.
    pub async fn next(&mut self) -> Result<Option<RunStreamEvent>, RunedError> {
        self.0.next().await.transpose()
    }
}
