//! authd's operations the CLI calls with the operator's token (`specs/authd.md`); the
//! daemons' own token traffic goes through `hako_shared::auth::AuthdClient`.

use hako_shared::auth::wire::{MintRequest, MintResponse, RevokeResponse};
use reqwest::Method;

use crate::op::{Daemon, Op, seg};

const D: Daemon = Daemon::Authd;

/// `POST /v1/tokens`: a token downscoped from the caller's.
pub fn mint(req: &MintRequest) -> Op<MintResponse> {
    Op::new(D, Method::POST, "/v1/tokens".into()).json(req)
}

/// `DELETE /v1/tokens/{jti}`: revokes a token and those minted from it.
pub fn revoke(jti: &str) -> Op<RevokeResponse> {
    Op::new(D, Method::DELETE, format!("/v1/tokens/{}", seg(jti)))
}

/// `GET /ready`.
pub fn ready() -> Op<serde_json::Value> {
    Op::get(D, "/ready".into())
}
