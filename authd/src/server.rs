//! authd's routes (`specs/tokens.md`, `authd/openapi.json`). Each handler authenticates by hand rather than
//! through the `Principal` extractor so that every denial, including a bad token, lands in
//! the audit log.

use std::sync::{Arc, RwLock};

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use hako_shared::GroupFolder;
use hako_shared::audit::{AuditAction, AuditOutcome};
use hako_shared::auth::wire::{
    AuditList, MintRequest, MintResponse, RevokeResponse, RevokedList, RotateResponse,
    ServiceTokenRequest, ServiceTokenResponse,
};
use hako_shared::auth::{
    self as auth, AuthError, Claims, Jwks, Principal, Signer, TokenType, Verifier, bearer,
    now_secs, scope, scopes, service_grants,
};
use hako_shared::http::{self as h, ApiError, ApiInfo, ApiJson, ApiQuery, NoToken, api_router};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::{self as e, Refusal};
use hako_shared::metrics::{Counter, Metrics};

use crate::config::Config;
use crate::keys::{KeyRing, Retiring};
use crate::mint::{self, Limits};
use crate::store::{AuditRow, Committed, IssuedRow, Row, Store};

/// Counters touched on the hot path, created once.
pub(crate) struct Counters {
    pub issued_service: Counter,
    pub issued_user: Counter,
    pub issued_spawn: Counter,
    pub jwks_served: Counter,
    pub revocations: Counter,
    pub rotations: Counter,
}

impl Counters {
    pub fn new(m: &Metrics) -> Self {
        const ISSUED: &str = "authd_tokens_issued_total";
        const ISSUED_HELP: &str = "Tokens signed, by type.";
        Self {
            issued_service: m.counter(ISSUED, ISSUED_HELP, &[("typ", "service")]),
            issued_user: m.counter(ISSUED, ISSUED_HELP, &[("typ", "user")]),
            issued_spawn: m.counter(ISSUED, ISSUED_HELP, &[("typ", "spawn")]),
            jwks_served: m.counter("authd_jwks_served_total", "JWKS requests answered.", &[]),
            revocations: m.counter("authd_revocations_total", "Tokens revoked.", &[]),
            rotations: m.counter("authd_key_rotations_total", "Signing-key rotations.", &[]),
        }
    }
}

/// Everything the handlers share.
pub(crate) struct AppState {
    pub cfg: Config,
    pub verifier: Verifier,
    pub keys: RwLock<KeyRing>,
    pub store: Store,
    pub metrics: Metrics,
    pub counters: Counters,
    pub rotate_lock: tokio::sync::Mutex<()>,
}

pub(crate) type App = Arc<AppState>;

/// What authd's document says of it.
pub(crate) const INFO: ApiInfo = ApiInfo {
    name: "authd",
    version: env!("CARGO_PKG_VERSION"),
    description: "hako's token authority: signs every token (EdDSA), publishes the keys, downscopes, revokes, audits.",
};

/// The API routes, each documented from its handler (ops routes are added by
/// `hako_shared::http::daemon_router`). Routes are only ever added here, through `routes!`, so
/// nothing is served that the document does not list.
pub(crate) fn documented() -> OpenApiRouter<App> {
    api_router::<App>(INFO)
        .routes(routes!(jwks))
        .routes(routes!(rotate))
        .routes(routes!(service_token))
        .routes(routes!(mint_token))
        .routes(routes!(revoke))
        .routes(routes!(revoked))
        .routes(routes!(audit))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Attacker-supplied names go into the audit log only as short printable ASCII.
fn clean(s: &str) -> String {
    s.chars().filter(char::is_ascii_graphic).take(64).collect()
}

fn read_keys(app: &AppState) -> std::sync::RwLockReadGuard<'_, KeyRing> {
    app.keys.read().unwrap_or_else(|p| p.into_inner())
}

/// A fresh token id (time-ordered, see [`crate::jti`]).
pub(crate) fn new_jti() -> Result<String, ApiError> {
    crate::jti::new(now_ms()).map_err(ApiError::internal)
}

/// The audit detail of a mint: what the child holds, never the token.
fn mint_detail(child: &Claims) -> String {
    use std::fmt::Write as _;
    let mut d = String::with_capacity(128);
    // Writing to a String cannot fail.
    let _ = write!(d, "jti={} typ={} scope=", child.jti, child.typ);
    for (i, s) in child.scope.iter().enumerate() {
        if i > 0 {
            d.push(' ');
        }
        d.push_str(s);
    }
    let folder = child.folder.as_deref().unwrap_or("*");
    let _ = write!(d, " folder={folder} exp={}", child.exp);
    if let Some(r) = &child.run_id {
        let _ = write!(d, " run_id={r}");
    }
    // Brokered secrets by name: never a placeholder (not secret, but of no use here) or value.
    for (i, s) in child.secrets.iter().enumerate() {
        d.push_str(if i == 0 { " secrets=" } else { "," });
        d.push_str(s.name.as_str());
    }
    d
}

fn audit_row(
    actor: &str,
    actor_jti: Option<&str>,
    action: AuditAction,
    outcome: AuditOutcome<'_>,
    detail: String,
) -> AuditRow {
    AuditRow {
        at_ms: now_ms(),
        actor: actor.to_owned(),
        actor_jti: actor_jti.map(str::to_owned),
        action,
        outcome: outcome.as_str().to_owned(),
        detail,
        request_id: hako_shared::audit::request_id(),
    }
}

impl AppState {
    /// Records a denial and hands the error back.
    async fn deny(
        &self,
        actor: &str,
        actor_jti: Option<&str>,
        action: AuditAction,
        err: ApiError,
        detail: String,
    ) -> ApiError {
        self.metrics
            .counter(
                "authd_denials_total",
                "Requests denied (401/403), by action.",
                &[("action", action.as_str())],
            )
            .inc();
        let row = audit_row(
            actor,
            actor_jti,
            action,
            AuditOutcome::Refused(&err.body.error),
            detail,
        );
        if let Err(e) = self.store.write(vec![Row::Audit(row)]).await {
            tracing::error!(error = %e, %action, "cannot write the audit row of a denial");
        }
        err
    }

    /// The verified caller, or a recorded denial.
    async fn authenticate(
        &self,
        headers: &HeaderMap,
        action: AuditAction,
    ) -> Result<Arc<Claims>, ApiError> {
        match Principal::from_headers(&self.verifier, headers).await {
            Ok(Principal::Token(c)) => Ok(c),
            // authd's own verifier is never open; treat the impossible case as a denial.
            Ok(Principal::Open) => Err(self
                .deny(
                    "anonymous",
                    None,
                    action,
                    AuthError::Missing.into(),
                    String::new(),
                )
                .await),
            Err(e) => Err(self
                .deny("anonymous", None, action, e.into(), String::new())
                .await),
        }
    }

    async fn require(
        &self,
        caller: &Claims,
        scope: &str,
        action: AuditAction,
    ) -> Result<(), ApiError> {
        if caller.has_scope(scope) {
            return Ok(());
        }
        Err(self
            .deny(
                &caller.sub,
                Some(&caller.jti),
                action,
                AuthError::InsufficientScope(scope.to_owned()).into(),
                String::new(),
            )
            .await)
    }

    fn issued_counter(&self, typ: TokenType) -> &Counter {
        match typ {
            TokenType::Service => &self.counters.issued_service,
            TokenType::User => &self.counters.issued_user,
            TokenType::Spawn => &self.counters.issued_spawn,
        }
    }
}

/// The public keys that still verify (active and retiring), as a JWKS.
#[utoipa::path(get, path = "/v1/keys", tag = "keys",
    responses((status = 200, description = "Ed25519 keys (OKP), each with its RFC 7638 thumbprint as kid", body = Jwks)))]
async fn jwks(State(app): State<App>) -> Json<Jwks> {
    app.counters.jwks_served.inc();
    Json(read_keys(&app).jwks(now_secs()))
}

hako_shared::error_responses!(RevokedErrors { h::UNAVAILABLE });

/// Revoked tokens that have not expired yet, for offline verifiers.
#[utoipa::path(get, path = "/v1/revoked", tag = "tokens",
    responses(
        (status = 200, description = "The revocation list", body = RevokedList),
        RevokedErrors,
    ))]
async fn revoked(State(app): State<App>) -> Result<Json<RevokedList>, ApiError> {
    // Listed until `exp` plus the clock skew: a verifier accepts a token that long.
    let skew = app.cfg.clock_skew.as_secs() as i64;
    let revoked = app.store.revoked(now_secs() - skew).await?;
    Ok(Json(RevokedList { revoked }))
}

hako_shared::error_responses!(ServiceTokenErrors { h::INVALID_JSON, e::INVALID_SERVICE_KEY });

/// Exchange a daemon's service key (the bearer) for its service token.
#[utoipa::path(post, path = "/v1/service-token", tag = "tokens",
    security(("bearer" = [])),
    request_body = ServiceTokenRequest,
    responses(
        (status = 200, description = "The daemon's service token and fixed grants", body = ServiceTokenResponse),
        ServiceTokenErrors,
    ))]
async fn service_token(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<ApiJson<ServiceTokenRequest>, ApiError>,
) -> Result<Json<ServiceTokenResponse>, ApiError> {
    let ApiJson(req) = body?;
    // One answer for every failure: no header, unknown daemon, wrong key.
    let ok = match bearer(&headers) {
        Ok(key) => app.cfg.service_keys.check(&req.daemon, key),
        Err(_) => false,
    };
    let known = service_grants(&req.daemon);
    let Some(grants) = known.filter(|_| ok) else {
        let err = ApiError::from(Refusal::InvalidServiceKey);
        // The caller hears one answer; the audit log tells the operator which it was. A name
        // outside the grants table is never logged: a misconfigured client may send its key
        // in the `daemon` field.
        let (actor, reason) = match known {
            Some(_) => (req.daemon.as_str(), "reason=wrong_or_missing_key"),
            None => ("unknown", "reason=unknown_daemon"),
        };
        return Err(app
            .deny(
                actor,
                None,
                AuditAction::ServiceToken,
                err,
                reason.to_owned(),
            )
            .await);
    };
    let now = now_secs();
    let claims = Claims {
        iss: app.cfg.issuer.clone(),
        sub: req.daemon.clone(),
        typ: TokenType::Service,
        scope: grants.iter().map(|s| (*s).to_owned()).collect(),
        folder: None,
        jti: new_jti()?,
        iat: now,
        nbf: now,
        exp: now + app.cfg.service_token_ttl.as_secs() as i64,
        run_id: None,
        turn_id: None,
        parent_jti: None,
        egress: Vec::new(),
        secrets: Vec::new(),
    };
    let signer = read_keys(&app).active.clone();
    let token = signer.sign(&claims).map_err(ApiError::internal)?;
    let rows = vec![
        Row::Issued(IssuedRow {
            jti: claims.jti.clone(),
            sub: claims.sub.clone(),
            typ: TokenType::Service.as_str().into(),
            parent_jti: None,
            folder: None,
            exp: claims.exp,
            issued_at: now,
        }),
        Row::Audit(audit_row(
            &claims.sub,
            None,
            AuditAction::ServiceToken,
            AuditOutcome::Ok,
            format!("jti={} exp={}", claims.jti, claims.exp),
        )),
    ];
    app.store.write(rows).await?;
    app.counters.issued_service.inc();
    Ok(Json(ServiceTokenResponse {
        token,
        jti: claims.jti,
        expires_at: claims.exp,
        scope: claims.scope,
    }))
}

hako_shared::error_responses!(MintTokenErrors { h::INVALID_JSON, mint::INVALID_SCOPE, mint::INVALID_FOLDER, mint::INVALID_TTL, h::INVALID_REQUEST, mint::INVALID_EGRESS, mint::INVALID_SECRETS, auth::INVALID_TOKEN, auth::TOKEN_EXPIRED, auth::TOKEN_REVOKED, mint::PARENT_EXPIRED, mint::SCOPE_EXCEEDS_PARENT, mint::FOLDER_OUTSIDE_PARENT, mint::TTL_EXCEEDS_PARENT, mint::TTL_EXCEEDS_MAX, mint::TYP_EXCEEDS_PARENT, mint::RUN_OUTSIDE_PARENT, mint::EGRESS_EXCEEDS_PARENT, mint::SECRETS_EXCEED_PARENT });

/// Downscope: a child of the bearer token, never more scope, a wider folder or a longer life.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens",
    security(("bearer" = [])),
    request_body = MintRequest,
    responses(
        (status = 200, description = "The child token", body = MintResponse),
        MintTokenErrors,
    ))]
async fn mint_token(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<ApiJson<MintRequest>, ApiError>,
) -> Result<Json<MintResponse>, ApiError> {
    let parent = app.authenticate(&headers, AuditAction::TokenMint).await?;
    let ApiJson(req) = body?;
    let now = now_secs();
    let limits = Limits {
        max_ttl: app.cfg.max_token_ttl.as_secs(),
    };
    let child = match mint::downscope(&parent, &req, now, new_jti()?, limits) {
        Ok(c) => c,
        Err(e) => {
            // Only well-formed scopes and folders are recorded: free text from the caller
            // could hold anything, a token included.
            let scope: Vec<&str> = req
                .scope
                .iter()
                .take(16)
                .map(|s| {
                    if scope::validate(s).is_ok() {
                        s.as_str()
                    } else {
                        "<invalid>"
                    }
                })
                .collect();
            let folder = match req.folder.as_deref() {
                None => String::new(),
                Some(f) => GroupFolder::new(f)
                    .map(|g| g.as_str().to_owned())
                    .unwrap_or_else(|_| "<invalid>".into()),
            };
            let detail = format!("scope={} folder={folder}", scope.join(" "));
            let err: ApiError = e.into();
            // Malformed requests are not denials; asking for more than the parent holds is.
            if err.status == StatusCode::BAD_REQUEST {
                return Err(err);
            }
            return Err(app
                .deny(
                    &parent.sub,
                    Some(&parent.jti),
                    AuditAction::TokenMint,
                    err,
                    detail,
                )
                .await);
        }
    };
    let signer = read_keys(&app).active.clone();
    let token = signer.sign(&child).map_err(ApiError::internal)?;
    // Every verifier refuses a longer token unread: minting one would hand out a dead token.
    if token.len() > hako_shared::auth::jws::MAX_TOKEN_LEN {
        return Err(ApiError::bad_request(
            "invalid_request",
            format!(
                "the token would be {} bytes, over the {} every verifier reads: ask for fewer scopes, egress entries or secrets",
                token.len(),
                hako_shared::auth::jws::MAX_TOKEN_LEN
            ),
        ));
    }
    let detail = mint_detail(&child);
    let rows = vec![
        Row::Issued(IssuedRow {
            jti: child.jti.clone(),
            sub: child.sub.clone(),
            typ: child.typ.as_str().into(),
            parent_jti: child.parent_jti.clone(),
            folder: child.folder.clone(),
            exp: child.exp,
            issued_at: now,
        }),
        Row::Audit(audit_row(
            &parent.sub,
            Some(&parent.jti),
            AuditAction::TokenMint,
            AuditOutcome::Ok,
            detail,
        )),
    ];
    match app.store.write(rows).await? {
        Committed::Ok => hako_shared::failpoint::hit("authd.token.minted"),
        Committed::ParentRevoked => {
            // The parent was revoked while this child was being minted; the child was revoked
            // with it in the same transaction and is never handed out.
            app.verifier.mark_revoked(&child.jti, child.exp);
            return Err(AuthError::Revoked.into());
        }
    }
    app.issued_counter(child.typ).inc();
    Ok(Json(MintResponse {
        token,
        jti: child.jti,
        expires_at: child.exp,
    }))
}

hako_shared::error_responses!(RevokeErrors { e::INVALID_JTI, e::NOT_TOKEN_ISSUER, h::NOT_FOUND });

/// Revoke a token and its not-yet-expired descendants.
#[utoipa::path(delete, path = "/v1/tokens/{jti}", tag = "tokens",
    security(("bearer" = [])),
    params(("jti" = String, Path, description = "The token's id")),
    responses(
        (status = 200, description = "Every jti revoked by this call", body = RevokeResponse),
        RevokeErrors,
        NoToken,
    ))]
async fn revoke(
    State(app): State<App>,
    headers: HeaderMap,
    jti: Result<Path<String>, axum::extract::rejection::PathRejection>,
) -> Result<Json<RevokeResponse>, ApiError> {
    let caller = app.authenticate(&headers, AuditAction::TokenRevoke).await?;
    let Ok(Path(jti)) = jti else {
        return Err(Refusal::InvalidJti("jti is not valid UTF-8").into());
    };
    if jti.is_empty() || jti.len() > 128 {
        return Err(Refusal::InvalidJti("jti must be 1-128 characters").into());
    }
    let Some(row) = app.store.issued(jti.clone()).await? else {
        return Err(Refusal::NoSuchToken.into());
    };
    // Who may revoke: anyone holding tokens:revoke; the token itself; a token it descends
    // from (its issuer, or the issuer's issuer: revoking that would take it down anyway); or
    // a service token of the same subject (a refreshed service token revoking what an earlier
    // one minted). A spawn token shares its subject with its siblings but is no service
    // token, so it cannot revoke them.
    // `tokens:revoke` reaches what the caller's folder covers: a folder-bound token never
    // revokes a token of another folder, or an unbound one (a daemon's service token).
    let in_reach = match (&caller.folder, &row.folder) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(_), Some(f)) => caller.covers_folder(f),
    };
    let mut allowed = (caller.has_scope(scopes::TOKENS_REVOKE) && in_reach)
        || caller.jti == row.jti
        || row.parent_jti.as_deref() == Some(caller.jti.as_str())
        || (caller.typ == TokenType::Service && caller.sub == row.sub);
    if !allowed && row.parent_jti.is_some() {
        allowed = app
            .store
            .ancestors(row.jti.clone())
            .await?
            .contains(&caller.jti);
    }
    if !allowed {
        let err = ApiError::from(Refusal::NotTokenIssuer);
        return Err(app
            .deny(
                &caller.sub,
                Some(&caller.jti),
                AuditAction::TokenRevoke,
                err,
                format!("jti={}", clean(&jti)),
            )
            .await);
    }
    let now = now_secs();
    let audit = audit_row(
        &caller.sub,
        Some(&caller.jti),
        AuditAction::TokenRevoke,
        AuditOutcome::Ok,
        format!("jti={jti}"),
    );
    let revoked = app.store.revoke_tree(jti.clone(), now, audit).await?;
    hako_shared::failpoint::hit("authd.token.revoked");
    for e in &revoked {
        app.verifier.mark_revoked(&e.jti, e.exp);
    }
    app.counters.revocations.add(revoked.len() as u64);
    Ok(Json(RevokeResponse {
        jti,
        revoked: revoked.into_iter().map(|e| e.jti).collect(),
    }))
}

hako_shared::error_responses!(RotateErrors { h::INSUFFICIENT_SCOPE["`keys:rotate`"] });

/// A new active signing key; the old one keeps verifying for the longest token life.
#[utoipa::path(post, path = "/v1/keys/rotate", tag = "keys",
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The new and the retiring key", body = RotateResponse),
        NoToken,
        RotateErrors,
    ))]
async fn rotate(
    State(app): State<App>,
    headers: HeaderMap,
) -> Result<Json<RotateResponse>, ApiError> {
    let caller = app.authenticate(&headers, AuditAction::KeyRotate).await?;
    app.require(&caller, scopes::KEYS_ROTATE, AuditAction::KeyRotate)
        .await?;
    let _one_at_a_time = app.rotate_lock.lock().await;
    let new = Signer::generate().map_err(ApiError::internal)?;
    let now = now_secs();
    let drop_after = now + app.cfg.rotation_window().as_secs() as i64;
    let old = read_keys(&app).active.clone();
    let audit = audit_row(
        &caller.sub,
        Some(&caller.jti),
        AuditAction::KeyRotate,
        AuditOutcome::Ok,
        format!(
            "kid={} previous={} drops_at={drop_after}",
            new.kid(),
            old.kid()
        ),
    );
    app.store
        .rotate(
            old.kid().to_owned(),
            new.kid().to_owned(),
            new.secret_bytes(),
            now,
            drop_after,
            audit,
        )
        .await?;
    // Trust the new key before signing with it, and bound the old one's trust.
    app.verifier
        .insert_key(new.kid(), new.verifying_key(), None);
    app.verifier
        .insert_key(old.kid(), old.verifying_key(), Some(drop_after));
    let kid = new.kid().to_owned();
    {
        let mut ring = app.keys.write().unwrap_or_else(|p| p.into_inner());
        ring.retiring.retain(|r| r.drop_at > now);
        ring.retiring.push(Retiring {
            jwk: old.jwk(),
            drop_at: drop_after,
        });
        ring.active = Arc::new(new);
    }
    app.counters.rotations.inc();
    tracing::info!(kid = %kid, previous = %old.kid(), drops_at = drop_after, "signing key rotated");
    Ok(Json(RotateResponse {
        kid,
        previous_kid: old.kid().to_owned(),
        previous_drops_at: drop_after,
    }))
}

/// `GET /v1/audit` paging.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct AuditQuery {
    /// Rows per page, 1-1000 (default 100).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u32>,
    /// Rows with ids below this (the previous page's `next_before`).
    before: Option<i64>,
}

hako_shared::error_responses!(AuditErrors { h::INVALID_QUERY, h::INSUFFICIENT_SCOPE["`audit:read`"], h::FOLDER_FORBIDDEN });

/// authd's audit log, newest first.
#[utoipa::path(get, path = "/v1/audit", tag = "audit",
    security(("bearer" = [])),
    params(AuditQuery),
    responses(
        (status = 200, description = "A page of the audit log", body = AuditList),
        AuditErrors,
        NoToken,
    ))]
async fn audit(
    State(app): State<App>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<AuditQuery>,
) -> Result<Json<AuditList>, ApiError> {
    let caller = app.authenticate(&headers, AuditAction::AuditRead).await?;
    app.require(&caller, scopes::AUDIT_READ, AuditAction::AuditRead)
        .await?;
    // authd's audit spans every folder and every daemon: not for a folder-bound token.
    if caller.folder.is_some() {
        let err = h::FOLDER_FORBIDDEN
            .error("authd's audit log spans every folder; a folder-bound token cannot read it");
        return Err(app
            .deny(
                &caller.sub,
                Some(&caller.jti),
                AuditAction::AuditRead,
                err,
                String::new(),
            )
            .await);
    }
    let limit = q.limit.unwrap_or(100);
    if !(1..=1000).contains(&limit) {
        return Err(Refusal::InvalidQuery("limit must be 1-1000").into());
    }
    let before = q.before;
    let list = app.store.audit(limit, before).await?;
    Ok(Json(list))
}

#[cfg(test)]
mod tests {
    #[test]
    fn clean_keeps_audit_text_short_and_printable() {
        assert_eq!(super::clean("run\ned \u{1F600}x"), "runedx");
        assert_eq!(super::clean(&"a".repeat(500)).len(), 64);
    }
}
