//! Operations in tests: sent through `hako_shared::testing::ApiClient`, which checks that
//! every error answer is the envelope, and answered as the status and the JSON body, for
//! tests that assert refusals as well as answers.

use hako_shared::testing::ApiClient;
use serde_json::Value;

use crate::op::{Body, Op};

/// Sends `op` with `token`; answers the status and the body (`Null` when empty).
pub async fn send<R>(api: &ApiClient, token: &str, op: Op<R>) -> (u16, Value) {
    let body: Option<Value> = match &op.body {
        Body::None => None,
        Body::Json(b) => Some(serde_json::from_slice(b).expect("a JSON body")),
        Body::Bytes(_) | Body::Invalid(_) => panic!("{}: not a JSON call", op.path),
    };
    api.call(op.method, &op.path, Some(token), body.as_ref())
        .await
}
