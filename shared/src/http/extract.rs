//! Extractors whose every rejection is the JSON error envelope.

use axum::Json;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

use super::ApiError;

/// A JSON request body. Unlike `axum::Json`, every rejection is the JSON error envelope:
/// 400 `invalid_json`, 413 `body_too_large`, 415 `unsupported_media_type`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // The common case, `Content-Type: application/json` and a well-formed body, is parsed
        // once with plain serde_json. Anything else goes through axum's extractor, whose
        // messages name the offending field; both accept exactly the same bodies.
        if !plain_json(req.headers()) {
            return match Json::<T>::from_request(req, state).await {
                Ok(Json(v)) => Ok(ApiJson(v)),
                Err(rej) => Err(rejection(rej.status(), rej.body_text())),
            };
        }
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|rej| rejection(rej.status(), rej.body_text()))?;
        match serde_json::from_slice(&bytes) {
            Ok(v) => Ok(ApiJson(v)),
            Err(_) => match Json::<T>::from_bytes(&bytes) {
                Ok(Json(v)) => Ok(ApiJson(v)),
                Err(rej) => Err(rejection(rej.status(), rej.body_text())),
            },
        }
    }
}

/// A query string, decoded (percent-decoding included) into `T`. Unlike
/// `axum::extract::Query`, a rejection is the JSON envelope: 400 `invalid_query`, with a
/// message naming the parameter at fault. Give `T` `#[serde(deny_unknown_fields)]` so that a
/// misspelt parameter is refused rather than ignored.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> axum::extract::FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(rej) => Err(super::INVALID_QUERY.error(
                rej.body_text()
                    .trim_start_matches("Failed to deserialize query string: ")
                    .to_owned(),
            )),
        }
    }
}

/// `Content-Type` is exactly `application/json` (no parameters).
fn plain_json(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"application/json"))
}

/// A refused body as the envelope, by the status axum's extractor chose.
fn rejection(status: StatusCode, text: String) -> ApiError {
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => super::BODY_TOO_LARGE.error(text),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            status,
            "unsupported_media_type",
            "expected Content-Type: application/json",
        ),
        _ => super::INVALID_JSON.error(text),
    }
}
