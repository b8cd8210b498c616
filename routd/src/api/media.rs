//! `PUT /v1/chats/{jid}/media/{name}`: a file a chat sent its agent (a photo, a voice note, a
//! document), saved into the media directory of the folder the chat routes to, where the
//! agent finds it at `/workspace/media/<name>`. The message that carries it names that path
//! (`specs/channels.md`, Media).

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::NoToken;
use hako_shared::media::MediaSaved;

use super::{AppState, chat_folder, parse_folder};
use crate::error as e;
use crate::error::ApiFailure;
use crate::routing::check_jid;
use crate::runed::RunedError;
use hako_shared::http as h;

/// The route's path, for its body limit.
pub(crate) const ROUTE: &str = "/v1/chats/{jid}/media/{name}";

hako_shared::error_responses!(PutMediaErrors { h::INVALID_REQUEST, h::INVALID_MEDIA_NAME, h::INSUFFICIENT_SCOPE["`messages:write`"], h::NOT_FOUND, h::BODY_TOO_LARGE, h::MEDIA_FULL, e::RUNED_UNAVAILABLE });

/// Saves a file a chat sent into the media directory of the folder the chat routes to (a
/// file of that name is replaced: an adapter names a file after the platform's ids, so a
/// replayed upload lands on itself). The same callers as `POST /v1/messages` for the chat.
#[utoipa::path(put, path = "/v1/chats/{jid}/media/{name}", tag = "messages", security(("bearer" = [])),
    params(
        ("jid" = String, Path, description = "The chat (percent-encoded)", example = "tg:111"),
        ("name" = String, Path, description = "The file's name: 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit", example = "tg111_1001.jpg"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file"),
    responses(
        (status = 200, description = "Saved; `path` is where the agent finds it", body = MediaSaved),
        PutMediaErrors,
        NoToken,
    ))]
pub(super) async fn put_media(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path((jid, name)): Path<(String, String)>,
    body: Body,
) -> Result<Json<MediaSaved>, ApiFailure> {
    who.require(scopes::MESSAGES_WRITE)?;
    check_jid("jid", &jid).map_err(ApiFailure::Invalid)?;
    hako_shared::media::check_name(&name).map_err(|e| ApiFailure::RunedRefused {
        status: 400,
        code: "invalid_media_name".into(),
        message: e,
    })?;
    let Some(folder) = chat_folder(&sh, &who, &jid)? else {
        return Err(ApiFailure::NotFound(format!(
            "chat {jid} routes to no folder: add a route first"
        )));
    };
    let folder = parse_folder(&folder)?;
    let limit = sh.cfg.media_max;
    let data = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiFailure::RunedRefused {
            status: 413,
            code: "body_too_large".into(),
            message: format!("the file is larger than {limit} bytes (ROUTD_MEDIA_MAX)"),
        })?;
    let saved = sh
        .runed
        .put_media(&folder, &name, data)
        .await
        .map_err(|e| match e {
            RunedError::Refused {
                status,
                code,
                message,
            } if status != 401 && status != 403 => ApiFailure::RunedRefused {
                status,
                code,
                message,
            },
            e => ApiFailure::RunedUnavailable(format!("saving the file: {e}")),
        })?;
    Ok(Json(saved))
}
