//! The HTTP conventions every daemon shares: the JSON error envelope and the failures every
//! daemon's requests share (`Common`, `daemon_failure!`), a JSON body extractor
//! that answers malformed input with that envelope, the ops routes (`/health`, `/ready`,
//! `/metrics`, `/openapi.json`), body limits, JSON 404/405 and panics as JSON 500. A file per
//! concept; everything is used as `hako_shared::http::…`.

mod codes;
mod error;
mod extract;
mod failure;
mod observe;
mod ops;
mod request_id;
mod router;
mod serve;
#[cfg(test)]
mod tests;

pub use codes::*;
#[cfg(feature = "openapi")]
pub use error::NoToken;
pub use error::{ApiError, ErrorBody};
pub use extract::{ApiJson, ApiQuery};
pub use failure::Common;
pub use ops::{ApiInfo, Health, Ops, Ready, ReadyCheck, api_router, document, openapi_operations};
pub use request_id::{REQUEST_ID_HEADER, current_request_id, with_request_id};
pub use router::{BodyLimits, daemon_router, guard, guard_with, local_only, traced};
pub use serve::{
    CLIENT_POOL_IDLE, Listener, ServeLimits, Served, health_check, serve, serve_with,
    shutdown_signal,
};
