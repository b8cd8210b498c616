//! `PUT /v1/folders/{folder}/media/{name}`: a file a chat sent its agent, written into the
//! folder's media directory (`specs/runed.md`, Media). The body is the file, up to
//! `RUNED_MEDIA_MAX`; the folder's directory holds at most `RUNED_MEDIA_FOLDER_MAX`.

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use hako_runner::media::MediaError;
use hako_shared::GroupFolder;
use hako_shared::audit::{AuditAction, AuditOutcome};
use hako_shared::auth::{Principal, scopes};
use hako_shared::http::{self as h, NoToken};
use hako_shared::media::MediaSaved;

use super::{AppState, audit_row};
use crate::error::{self as e, ApiFailure};

/// The route's path, for its body limit.
pub(crate) const ROUTE: &str = "/v1/folders/{folder}/media/{name}";

hako_shared::error_responses!(PutMediaErrors { h::INVALID_REQUEST, h::INVALID_MEDIA_NAME, h::INSUFFICIENT_SCOPE["`media:write`"], h::NOT_FOUND, h::BODY_TOO_LARGE, h::MEDIA_FULL, e::DOCKER_UNAVAILABLE });

/// Saves a file into a folder's media directory, where the agent finds it at
/// `/workspace/media/<name>` (a file of that name is replaced). routd calls it for the chats
/// that route to the folder; a folder-bound caller reaches its own folders only.
#[utoipa::path(put, path = "/v1/folders/{folder}/media/{name}", tag = "media", security(("bearer" = [])),
    params(
        ("folder" = String, Path, description = "The group folder (its `/` percent-encoded)", example = "main"),
        ("name" = String, Path, description = "The file's name: 1-128 of A-Z a-z 0-9 . _ -, starting with a letter or digit", example = "tg111_1001.jpg"),
    ),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "The file"),
    responses(
        (status = 200, description = "Saved", body = MediaSaved),
        PutMediaErrors,
        NoToken,
    ))]
pub(crate) async fn put_media(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path((folder, name)): Path<(String, String)>,
    body: Body,
) -> Result<Json<MediaSaved>, ApiFailure> {
    who.require(scopes::MEDIA_WRITE)?;
    let folder = GroupFolder::new(&folder).map_err(|e| ApiFailure::InvalidFolder(e.to_string()))?;
    if !who.covers_folder(folder.as_str()) {
        return Err(ApiFailure::NoFolder(folder.to_string()));
    }
    hako_shared::media::check_name(&name).map_err(|e| ApiFailure::Media(MediaError::Name(e)))?;
    let limit = sh.cfg.media_max;
    let data = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiFailure::MediaTooLarge(limit))?;
    let runner = sh
        .runner()
        .map_err(|e| ApiFailure::DockerUnavailable(e.to_string()))?;
    let saved = runner
        .save_media(&folder, &name, data, sh.cfg.media_folder_max)
        .await;
    let saved = saved.map_err(|e| match e {
        MediaError::Io(e) => ApiFailure::internal(e),
        e => ApiFailure::Media(e),
    });
    let (outcome, why) = match &saved {
        Ok(_) => (AuditOutcome::Ok, String::new()),
        Err(f) => (AuditOutcome::Refused(f.code()), format!(" refused: {f}")),
    };
    audit_row(
        &sh,
        &who,
        AuditAction::MediaPut,
        None,
        Some(folder.as_str()),
        outcome,
        format!("name={name}{why}"),
    )
    .await;
    let bytes = saved?;
    tracing::info!(folder = %folder, name, bytes, "media saved");
    Ok(Json(MediaSaved::new(folder.as_str(), &name, bytes)))
}
