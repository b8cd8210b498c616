//! runed's operations (`specs/runed.md`, `runed/openapi.json`).

use hako_shared::media::MediaSaved;
use hako_shared::runs::{
    CreatedRun, RunList, RunRequest, RunStatus, RunStreamEvent, SteerReply, SteerRequest,
    StopReply, StopRequest,
};
use hako_shared::secrets::{SecretList, SecretValueRequest};
use reqwest::Method;

use crate::op::{Daemon, Events, Op, Text, seg};

const D: Daemon = Daemon::Runed;

/// `POST /v1/runs`: starts a run (or finds the one of a turn id it knows).
pub fn create_run(req: &RunRequest) -> Op<CreatedRun> {
    Op::new(D, Method::POST, "/v1/runs".into()).json(req)
}

/// `GET /v1/runs`: runs, newest first (query: `folder`, `state`, `before`, `limit`).
pub fn runs() -> Op<RunList> {
    Op::get(D, "/v1/runs".into())
}

/// `GET /v1/runs/{id}`: one run (query: `wait`, a long poll for its end).
pub fn run(id: &str) -> Op<RunStatus> {
    Op::get(D, format!("/v1/runs/{}", seg(id)))
}

/// `DELETE /v1/runs/{id}`: kills a run.
pub fn kill_run(id: &str) -> Op<RunStatus> {
    Op::new(D, Method::DELETE, format!("/v1/runs/{}", seg(id)))
}

/// `GET /v1/runs/{id}/events`: a run's stored blocks, then each event until it ends.
pub fn run_events(id: &str) -> Op<Events<RunStreamEvent>> {
    Op::get(D, format!("/v1/runs/{}/events", seg(id)))
}

/// `POST /v1/runs/{id}/steer`: follow-ups into a live run.
pub fn steer(id: &str, req: &SteerRequest) -> Op<SteerReply> {
    Op::new(D, Method::POST, format!("/v1/runs/{}/steer", seg(id))).json(req)
}

/// `POST /v1/runs/stop`: stops a folder's run (and with `retire`, its box and directory).
pub fn stop(req: &StopRequest) -> Op<StopReply> {
    Op::new(D, Method::POST, "/v1/runs/stop".into()).json(req)
}

/// `PUT /v1/folders/{folder}/media/{name}`: a file into a folder's media directory.
pub fn put_media(folder: &str, name: &str, data: bytes::Bytes) -> Op<MediaSaved> {
    Op::new(
        D,
        Method::PUT,
        format!("/v1/folders/{}/media/{}", seg(folder), seg(name)),
    )
    .bytes(data)
}

/// `GET /v1/secrets`: the brokered secrets' names (never their values).
pub fn secrets() -> Op<SecretList> {
    Op::get(D, "/v1/secrets".into())
}

/// `PUT /v1/secrets/{name}`: sets a secret's value.
pub fn put_secret(name: &str, req: &SecretValueRequest) -> Op<()> {
    Op::new(D, Method::PUT, format!("/v1/secrets/{}", seg(name))).json(req)
}

/// `DELETE /v1/secrets/{name}`: removes a secret.
pub fn delete_secret(name: &str) -> Op<()> {
    Op::new(D, Method::DELETE, format!("/v1/secrets/{}", seg(name)))
}

/// `GET /v1/audit`: runed's audit log, newest first (query: `before`, `limit`).
pub fn audit() -> Op<serde_json::Value> {
    Op::get(D, "/v1/audit".into())
}

/// `GET /health`: whether it answers.
pub fn health() -> Op<serde_json::Value> {
    Op::get(D, "/health".into())
}

/// `GET /ready`: its database and Docker.
pub fn ready() -> Op<serde_json::Value> {
    Op::get(D, "/ready".into())
}

/// `GET /metrics`: the Prometheus exposition.
pub fn metrics() -> Op<Text> {
    Op::get(D, "/metrics".into())
}
