//! Operations in tests: sent through `hako_shared::testing::ApiClient`, which checks that
//! every error answer is the envelope (a file upload's too), and answered as the status and
//! the JSON body, for tests that assert refusals as well as answers.

use hako_shared::testing::ApiClient;
use serde_json::Value;

use crate::op::{Body, Op};

/// Sends `op` with `token`; answers the status and the body (`Null` when empty).
pub async fn send<R>(api: &ApiClient, token: &str, op: Op<R>) -> (u16, Value) {
    let body: Option<Value> = match op.body {
        Body::None => None,
        Body::Json(b) => Some(serde_json::from_slice(&b).expect("a JSON body")),
        Body::Bytes(b) => {
            return api
                .raw(
                    op.method,
                    &op.path,
                    Some(token),
                    "application/octet-stream",
                    b,
                )
                .await;
        }
        Body::Invalid(e) => panic!("{}: the body would not serialize: {e}", op.path),
    };
    api.call(op.method, &op.path, Some(token), body.as_ref())
        .await
}
