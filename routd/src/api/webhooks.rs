//! `/v1/webhooks`: where a chat's replies are posted, signed.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use hako_shared::auth::{Principal, scopes};
use hako_shared::chat::{NewWebhook, WebhookList, WebhookView};
use hako_shared::http::{ApiJson, NoToken};

use super::{AppState, audit_row, check_text};
use crate::error as e;
use crate::error::ApiFailure;
use crate::state::now_ms;
use hako_shared::http as h;

/// Whether a webhook URL names a target inside the host or its network: a special address
/// (loopback, link-local, private, …) or a `localhost` name.
pub(super) fn private_target(url: &reqwest::Url) -> bool {
    let Some(host) = url.host_str() else {
        return true;
    };
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => hako_shared::allowlist::is_special(ip) || hako_shared::allowlist::never(ip),
        Err(_) => {
            let d = bare.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
    }
}

hako_shared::error_responses!(AddWebhookErrors { h::INVALID_JSON, h::INVALID_REQUEST, h::INSUFFICIENT_SCOPE["`webhooks:write`"], h::FOLDER_FORBIDDEN, e::WEBHOOK_EXISTS });

/// Register a channel's webhook (unbound callers). The secret is never shown again.
#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    request_body = NewWebhook,
    responses(
        (status = 201, description = "Registered", body = WebhookView),
        AddWebhookErrors,
        NoToken,
    ))]
pub(super) async fn add_webhook(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    ApiJson(w): ApiJson<NewWebhook>,
) -> Result<(StatusCode, Json<WebhookView>), ApiFailure> {
    who.require(scopes::WEBHOOKS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "webhooks serve whole channels: only an unbound caller registers them".into(),
        ));
    }
    check_text("prefix", &w.prefix, 1, 64)?;
    let url = reqwest::Url::parse(&w.url).map_err(|e| ApiFailure::Invalid(format!("url: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(ApiFailure::Invalid(
            "url: an http:// or https:// URL".into(),
        ));
    }
    if !sh.cfg.webhook_allow_private && private_target(&url) {
        return Err(ApiFailure::Invalid(format!(
            "url: {} is a loopback, link-local or private address (the daemons, the cloud's \
             metadata, the LAN); set ROUTD_WEBHOOK_ALLOW_PRIVATE=1 to allow it",
            url.host_str().unwrap_or("")
        )));
    }
    if !(16..=256).contains(&w.secret.len()) {
        return Err(ApiFailure::Invalid("secret: 16-256 bytes".into()));
    }
    let row = sh
        .store
        .add_webhook(w.prefix.clone(), w.url, w.secret, now_ms())
        .await?
        .ok_or(ApiFailure::WebhookExists(w.prefix))?;
    sh.chats.reload_webhooks(&sh.store).await?;
    audit_row(
        &sh,
        &who,
        AuditAction::WebhookAdd,
        None,
        AuditOutcome::Ok,
        format!("{} -> {}", row.prefix, url.host_str().unwrap_or("")),
    )
    .await;
    Ok((
        StatusCode::CREATED,
        Json(WebhookView {
            id: row.id,
            prefix: row.prefix,
            url: row.url,
        }),
    ))
}

hako_shared::error_responses!(ListWebhooksErrors { h::INSUFFICIENT_SCOPE["`webhooks:read`"], h::FOLDER_FORBIDDEN });

/// The webhooks (never their secrets).
#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks", security(("bearer" = [])),
    responses(
        (status = 200, description = "The webhooks", body = WebhookList),
        NoToken,
        ListWebhooksErrors,
    ))]
pub(super) async fn list_webhooks(
    State(AppState(sh)): State<AppState>,
    who: Principal,
) -> Result<Json<WebhookList>, ApiFailure> {
    who.require(scopes::WEBHOOKS_READ)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "webhooks serve whole channels: only an unbound caller lists them".into(),
        ));
    }
    let webhooks = sh
        .store
        .webhooks()
        .await?
        .into_iter()
        .map(|w| WebhookView {
            id: w.id,
            prefix: w.prefix,
            url: w.url,
        })
        .collect();
    Ok(Json(WebhookList { webhooks }))
}

hako_shared::error_responses!(DeleteWebhookErrors { h::INSUFFICIENT_SCOPE["`webhooks:write`"], h::FOLDER_FORBIDDEN, h::NOT_FOUND });

/// Remove a webhook (messages still delivering to it become undeliverable).
#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks", security(("bearer" = [])),
    params(("id" = i64, Path, description = "The webhook")),
    responses(
        (status = 204, description = "Removed"),
        NoToken,
        DeleteWebhookErrors,
    ))]
pub(super) async fn delete_webhook(
    State(AppState(sh)): State<AppState>,
    who: Principal,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiFailure> {
    who.require(scopes::WEBHOOKS_WRITE)?;
    if !who.is_unbound() {
        return Err(ApiFailure::FolderForbidden(
            "only an unbound caller removes webhooks".into(),
        ));
    }
    let missing = || ApiFailure::NotFound(format!("no webhook {id}"));
    let n: i64 = id.parse().map_err(|_| missing())?;
    if !sh.store.delete_webhook(n).await? {
        return Err(missing());
    }
    sh.chats.reload_webhooks(&sh.store).await?;
    audit_row(
        &sh,
        &who,
        AuditAction::WebhookDelete,
        None,
        AuditOutcome::Ok,
        n.to_string(),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}
