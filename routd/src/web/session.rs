//! Browser sessions (`specs/web.md`): a one-time sign-in link's token is exchanged for an
//! `HttpOnly`, `SameSite=Strict` cookie that acts with that token's scopes and folder. A
//! layer in front of the API turns the cookie into the caller, and refuses a state change
//! that does not carry the session's CSRF token.

use hako_shared::audit::AuditAction;
use hako_shared::audit::AuditOutcome;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hako_shared::auth::{Authenticated, Principal, TokenType, scopes};
use hako_shared::http::ApiError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::state::{Shared, now_ms};
use crate::store::WebSession;

/// The session cookie's name.
pub(crate) const COOKIE: &str = "hako_session";
/// The header a state change carries the session's CSRF token in.
pub(crate) const CSRF_HEADER: &str = "x-hako-csrf";

/// `POST /web/session` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignIn {
    /// The sign-in link's token (the part after `#`).
    pub token: String,
    /// End the browser's live session and sign in with this link instead: the person saw
    /// both and chose (a link someone sent must never swap their session silently).
    #[serde(default)]
    pub replace: bool,
}

/// The identity sign-in links are minted from (`hako web`): the operator's, or a child of
/// it bound to a tenant's folder. A channel adapter's child token is no person's link.
const LINK_SUBJECT: &str = "operator";

/// What the page knows of its session.
#[derive(Debug, Serialize)]
pub(crate) struct SessionView {
    /// Who the session acts for.
    pub subject: String,
    /// The folder it is bound to; none: every folder.
    pub folder: Option<String>,
    /// Its scopes.
    pub scopes: Vec<String>,
    /// Unix ms; none in open dev mode.
    pub expires_at: Option<i64>,
    /// Every state change sends this in `x-hako-csrf`.
    pub csrf: String,
}

impl SessionView {
    fn of(s: &WebSession) -> Self {
        Self {
            subject: s.claims.sub.clone(),
            folder: s.claims.folder.clone(),
            scopes: s.claims.scope.clone(),
            expires_at: Some(s.expires_at),
            csrf: s.csrf.clone(),
        }
    }

    /// Open dev mode: no sign-in, no CSRF token to check.
    fn open() -> Self {
        Self {
            subject: "open".into(),
            folder: None,
            scopes: vec!["*".into()],
            expires_at: None,
            csrf: String::new(),
        }
    }
}

fn sha256_hex(v: &str) -> String {
    let d = Sha256::digest(v.as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// The session cookie's value, if the request carries one.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.trim())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// Why a request's session does not hold.
fn ended() -> ApiError {
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "session_ended",
        "the browser session ended (signed out, expired or revoked): sign in again with a new link (`hako web`)",
    )
}

fn db_error(e: hako_shared::db::DbError) -> ApiError {
    ApiError::from(e)
}

/// The live session of a request: `None` without a cookie; an error when the cookie names no
/// live session (ended, expired, revoked, or never was).
pub(crate) async fn session(
    sh: &Shared,
    headers: &HeaderMap,
) -> Result<Option<WebSession>, ApiError> {
    let Some(value) = cookie(headers) else {
        return Ok(None);
    };
    let s = sh
        .store
        .web_session(&sha256_hex(value), now_ms())
        .await
        .map_err(db_error)?
        .ok_or_else(ended)?;
    if revoked(sh, &s) {
        end_revoked(sh, &s).await;
        return Err(ended());
    }
    Ok(Some(s))
}

/// Whether authd revoked the session's link or the token the link was minted from (a
/// tenant's token revoked takes its link's session with it, even after the link expired).
fn revoked(sh: &Shared, s: &WebSession) -> bool {
    sh.verifier.is_revoked(&s.link_jti)
        || s.claims
            .parent_jti
            .as_deref()
            .is_some_and(|p| sh.verifier.is_revoked(p))
}

/// Ends a revoked session in `routd.db`: authd's revocation list forgets a token once it has
/// expired, and the session must not come back then.
async fn end_revoked(sh: &Shared, s: &WebSession) {
    match sh.store.end_web_session(&s.id_hash, now_ms()).await {
        Ok(true) => {
            sh.signed_out.add(&s.link_jti, s.claims.exp);
            sh.audit(
                &s.claims.sub,
                AuditAction::WebSessionEnd,
                s.claims.folder.as_deref(),
                AuditOutcome::Revoked,
                format!("link {}", s.link_jti),
            )
            .await;
        }
        Ok(false) => {}
        Err(e) => tracing::warn!(error = %e, "ending a revoked web session failed"),
    }
}

/// Ends the sessions whose link (or its parent) authd revoked, every second while routd
/// runs: a revocation is seen while authd still lists it, whether or not the session is used.
pub(crate) async fn sweep_revoked(sh: Arc<Shared>) {
    loop {
        if let Ok(live) = sh.store.web_sessions(now_ms()).await {
            for s in live.iter().filter(|s| revoked(&sh, s)) {
                end_revoked(&sh, s).await;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            () = sh.stopping.cancelled() => return,
        }
    }
}

fn csrf_ok(headers: &HeaderMap, want: &str) -> bool {
    let Some(got) = headers.get(CSRF_HEADER).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    // Constant time: the comparison must not tell how much of a guess was right.
    got.len() == want.len()
        && got
            .bytes()
            .zip(want.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

fn is_safe(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// In front of the API: a request with a token is the token's; one with a session cookie acts
/// as the session (a state change only with the session's CSRF token). Answers to a session
/// are never cached.
pub(crate) async fn api_layer(
    State(sh): State<Arc<Shared>>,
    mut req: Request,
    next: Next,
) -> Response {
    if sh.verifier.is_open() || req.headers().contains_key(header::AUTHORIZATION) {
        return next.run(req).await;
    }
    let s = match session(&sh, req.headers()).await {
        Ok(Some(s)) => s,
        Ok(None) => return next.run(req).await,
        Err(e) => return e.into_response(),
    };
    if !is_safe(req.method()) && !csrf_ok(req.headers(), &s.csrf) {
        return csrf_refused().into_response();
    }
    req.extensions_mut()
        .insert(Authenticated(Principal::Token(Arc::new(s.claims))));
    let mut resp = next.run(req).await;
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

fn csrf_refused() -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "csrf_failed",
        "a state change from a browser session must carry the session's token in x-hako-csrf",
    )
}

/// Whether a browser request comes from this site: `Origin`, when sent, names the host the
/// request went to, and `Sec-Fetch-Site`, when sent, says same-origin.
fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_ok = match headers.get(header::ORIGIN).map(|v| v.to_str()) {
        None => true,
        Some(Ok(o)) => host.is_some_and(|h| {
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|rest| rest == h)
        }),
        Some(Err(_)) => false,
    };
    let site_ok = match headers.get("sec-fetch-site").map(|v| v.to_str()) {
        None => true,
        Some(Ok(s)) => s == "same-origin",
        Some(Err(_)) => false,
    };
    origin_ok && site_ok
}

fn set_cookie(value: &str, max_age: i64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age}{secure}"
    ))
    .expect("a cookie of hex digits is a header value")
}

fn refused(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, code, message)
}

/// `POST /web/session`: exchanges a sign-in link's token for a session cookie, once.
pub(crate) async fn sign_in(
    sh: &Shared,
    headers: &HeaderMap,
    body: SignIn,
) -> Result<Response, ApiError> {
    if !same_origin(headers) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "cross_site",
            "sign-in is accepted only from hako's own page",
        ));
    }
    if sh.verifier.is_open() {
        return Ok(axum::Json(SessionView::open()).into_response());
    }
    let claims = sh.verifier.verify(body.token.trim()).await.map_err(|e| {
        refused(
            "invalid_link",
            format!("the sign-in link does not hold: {e}"),
        )
    })?;
    if claims.typ != TokenType::User || claims.sub != LINK_SUBJECT {
        return Err(refused(
            "invalid_link",
            "a sign-in link carries a user token minted by `hako web` from the operator's",
        ));
    }
    let life = claims.exp - claims.iat;
    if life > sh.cfg.web.link_max_ttl.as_secs() as i64 {
        return Err(refused(
            "invalid_link",
            format!(
                "the token lives {life} s, longer than a sign-in link may (ROUTD_WEB_LINK_MAX_TTL, {} s): mint a link with `hako web`",
                sh.cfg.web.link_max_ttl.as_secs()
            ),
        ));
    }
    if !claims.has_scope(scopes::CHATS_READ) {
        return Err(refused(
            "invalid_link",
            "the sign-in link's token cannot read chats (chats:read)",
        ));
    }
    // A live session in this browser is replaced only when the person chose to (the page
    // asks): otherwise a link another person sent would turn this browser into theirs.
    let current = session(sh, headers).await.ok().flatten();
    if let Some(cur) = &current
        && !body.replace
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "already_signed_in",
            format!(
                "this browser is signed in as {}; the link signs in as {}. Sign in with the \
                 link instead only if you meant to",
                who_of(&cur.claims),
                who_of(&claims)
            ),
        ));
    }
    let now = now_ms();
    let ttl = sh.cfg.web.session_ttl.as_millis() as i64;
    let mut session_claims = (*claims).clone();
    session_claims.exp = (now + ttl) / 1000;
    // Secrets, not ids: no sign-in without the OS's entropy.
    let secret = |n| {
        hako_shared::ids::random_secret(n).map_err(|e| {
            tracing::error!(error = %e, "no entropy for a web session");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_entropy",
                "the system's random source failed; no session was made",
            )
        })
    };
    let value = secret(32)?;
    let s = WebSession {
        id_hash: sha256_hex(&value),
        link_jti: claims.jti.clone(),
        csrf: secret(16)?,
        claims: session_claims,
        created_at: now,
        expires_at: now + ttl,
    };
    if !sh
        .store
        .open_web_session(s.clone())
        .await
        .map_err(db_error)?
    {
        sh.audit(
            &claims.sub,
            AuditAction::WebSignin,
            claims.folder.as_deref(),
            AuditOutcome::Refused("link_used"),
            String::new(),
        )
        .await;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "link_used",
            "this sign-in link was used already: ask for a new one (`hako web`)",
        ));
    }
    if let Some(cur) = current {
        sh.store
            .end_web_session(&cur.id_hash, now)
            .await
            .map_err(db_error)?;
        sh.signed_out.add(&cur.link_jti, cur.claims.exp);
    }
    sh.audit(
        &claims.sub,
        AuditAction::WebSignin,
        claims.folder.as_deref(),
        AuditOutcome::Ok,
        format!("link {}", claims.jti),
    )
    .await;
    let mut resp = (StatusCode::CREATED, axum::Json(SessionView::of(&s))).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::SET_COOKIE,
        set_cookie(&value, ttl / 1000, sh.cfg.web.cookie_secure),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(resp)
}

/// A session's identity in words: the operator, or a tenant's folder.
fn who_of(c: &hako_shared::auth::Claims) -> String {
    match &c.folder {
        Some(f) => format!("{}@{f}", c.sub),
        None => c.sub.clone(),
    }
}

/// `GET /web/session`: the session's view (with its CSRF token) for the page's script.
pub(crate) async fn current(sh: &Shared, headers: &HeaderMap) -> Result<SessionView, ApiError> {
    if sh.verifier.is_open() {
        return Ok(SessionView::open());
    }
    match session(sh, headers).await? {
        Some(s) => Ok(SessionView::of(&s)),
        None => Err(refused(
            "missing_session",
            "not signed in: open a sign-in link (`hako web`)",
        )),
    }
}

/// `POST /web/signout`: ends the session (its CSRF token required) and clears the cookie.
pub(crate) async fn sign_out(sh: &Shared, headers: &HeaderMap) -> Result<Response, ApiError> {
    let clear = set_cookie("", 0, sh.cfg.web.cookie_secure);
    let Some(s) = session(sh, headers).await? else {
        return Err(refused("missing_session", "not signed in"));
    };
    if !csrf_ok(headers, &s.csrf) {
        return Err(csrf_refused());
    }
    sh.store
        .end_web_session(&s.id_hash, now_ms())
        .await
        .map_err(db_error)?;
    sh.signed_out.add(&s.link_jti, s.claims.exp);
    sh.audit(
        &s.claims.sub,
        AuditAction::WebSignout,
        s.claims.folder.as_deref(),
        AuditOutcome::Ok,
        format!("link {}", s.link_jti),
    )
    .await;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    resp.headers_mut().insert(header::SET_COOKIE, clear);
    Ok(resp)
}

/// Whether a page request may see a page: open mode, or a live session.
pub(crate) async fn may_see_pages(sh: &Shared, headers: &HeaderMap) -> bool {
    sh.verifier.is_open() || matches!(session(sh, headers).await, Ok(Some(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        m
    }

    #[test]
    fn the_cookie_is_found_among_others_and_nothing_else_passes_for_it() {
        assert_eq!(
            cookie(&h(&[("cookie", "a=1; hako_session=abc; b=2")])),
            Some("abc")
        );
        assert_eq!(
            cookie(&h(&[("cookie", "a=1"), ("cookie", "hako_session=x")])),
            Some("x")
        );
        assert_eq!(cookie(&h(&[("cookie", "xhako_session=abc")])), None);
        assert_eq!(cookie(&h(&[("cookie", "hako_session=")])), None);
        assert_eq!(cookie(&h(&[])), None);
    }

    #[test]
    fn csrf_needs_the_exact_token() {
        assert!(csrf_ok(&h(&[(CSRF_HEADER, "abcd")]), "abcd"));
        assert!(!csrf_ok(&h(&[(CSRF_HEADER, "abce")]), "abcd"));
        assert!(!csrf_ok(&h(&[(CSRF_HEADER, "abc")]), "abcd"));
        assert!(!csrf_ok(&h(&[]), "abcd"));
    }

    #[test]
    fn sign_in_comes_only_from_the_page_itself() {
        assert!(same_origin(&h(&[("host", "127.0.0.1:8183")])));
        assert!(same_origin(&h(&[
            ("host", "127.0.0.1:8183"),
            ("origin", "http://127.0.0.1:8183"),
            ("sec-fetch-site", "same-origin")
        ])));
        assert!(!same_origin(&h(&[
            ("host", "127.0.0.1:8183"),
            ("origin", "http://evil.example")
        ])));
        assert!(!same_origin(&h(&[
            ("host", "127.0.0.1:8183"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&h(&[("origin", "http://127.0.0.1:8183")])));
    }
}
