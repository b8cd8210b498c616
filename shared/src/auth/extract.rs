//! The axum extractor that gives handlers the verified caller.
//!
//! A handler takes a [`Principal`]; the router's state must yield a [`Verifier`] through
//! `FromRef`. A missing or garbled `Authorization` header, or a token that does not verify,
//! is answered with the JSON envelope before the handler runs. Scope and folder checks are
//! then one call each.

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};

use super::AuthError;
use super::claims::Claims;
use super::verifier::Verifier;
use crate::http::ApiError;

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    /// Open dev mode: no authd, every check passes.
    Open,
    /// A verified token.
    Token(Arc<Claims>),
}

/// A caller a layer in front of the handlers has already authenticated another way (routd's
/// browser sessions), put in the request's extensions. Only server code can put it there: a
/// client has no way to set an extension.
#[derive(Debug, Clone)]
pub struct Authenticated(pub Principal);

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Err(AuthError::Missing);
    };
    if values.next().is_some() {
        return Err(AuthError::BadHeader("more than one Authorization header"));
    }
    let value = value
        .to_str()
        .map_err(|_| AuthError::BadHeader("not ASCII"))?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or(AuthError::BadHeader("expected 'Bearer <token>'"))?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(AuthError::BadHeader("scheme is not Bearer"));
    }
    let token = token.trim();
    if token.is_empty() {
        return Err(AuthError::BadHeader("empty token"));
    }
    Ok(token)
}

impl Principal {
    /// The caller of a request with these headers.
    pub async fn from_headers(verifier: &Verifier, headers: &HeaderMap) -> Result<Self, AuthError> {
        if verifier.is_open() {
            return Ok(Principal::Open);
        }
        let token = bearer(headers)?;
        Ok(Principal::Token(verifier.verify(token).await?))
    }

    /// The claims, unless open mode.
    pub fn claims(&self) -> Option<&Claims> {
        match self {
            Principal::Open => None,
            Principal::Token(c) => Some(c),
        }
    }

    /// Whether this is open dev mode.
    pub fn is_open(&self) -> bool {
        matches!(self, Principal::Open)
    }

    /// Who the caller acts for (`open` in open mode).
    pub fn subject(&self) -> &str {
        match self {
            Principal::Open => "open",
            Principal::Token(c) => &c.sub,
        }
    }

    /// Whom per-caller bounds (open streams) count against: the subject and the folder it
    /// is bound to. Tenants' tokens are all minted by the operator (subject `operator`), so
    /// the subject alone would make one tenant's streams everyone's.
    ///
    /// A bound token counts against its folder's **first segment** (its tenant, `acme` of
    /// `acme/support`): children minted for sub-folders are the same tenant's, never a
    /// multiplier of its quota.
    pub fn bound_key(&self) -> String {
        match self {
            Principal::Open => "open".into(),
            Principal::Token(c) => match &c.folder {
                Some(f) => {
                    let tenant = f.split('/').next().unwrap_or(f);
                    format!("{}@{tenant}", c.sub)
                }
                None => c.sub.clone(),
            },
        }
    }

    /// Who the caller is, as audit rows, verdicts and notices name it: the subject, and for a
    /// folder-bound token its folder (`operator@acme`). Tenants' tokens are minted by the
    /// operator and carry its subject, so the subject alone would credit a tenant's act to
    /// the operator.
    pub fn actor(&self) -> String {
        match self {
            Principal::Open => "open".into(),
            Principal::Token(c) => match &c.folder {
                Some(f) => format!("{}@{f}", c.sub),
                None => c.sub.clone(),
            },
        }
    }

    /// Whether the caller holds a scope covering `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        match self {
            Principal::Open => true,
            Principal::Token(c) => c.has_scope(scope),
        }
    }

    /// 403 `insufficient_scope` unless the caller holds `scope`.
    pub fn require(&self, scope: &str) -> Result<(), ApiError> {
        if self.has_scope(scope) {
            Ok(())
        } else {
            Err(AuthError::InsufficientScope(scope.to_owned()).into())
        }
    }

    /// Whether the caller reaches `folder`: open mode and unbound tokens reach every folder,
    /// a bound token its folder and those below it.
    pub fn covers_folder(&self, folder: &str) -> bool {
        match self {
            Principal::Open => true,
            Principal::Token(c) => c.covers_folder(folder),
        }
    }

    /// 403 `folder_forbidden` unless the caller reaches `folder`.
    pub fn require_folder(&self, folder: &str) -> Result<(), ApiError> {
        if self.covers_folder(folder) {
            Ok(())
        } else {
            Err(AuthError::FolderForbidden(folder.to_owned()).into())
        }
    }

    /// Whether the caller is bound to no folder.
    pub fn is_unbound(&self) -> bool {
        match self {
            Principal::Open => true,
            Principal::Token(c) => c.folder.is_none(),
        }
    }

    /// The caller's folder, if bound.
    pub fn folder(&self) -> Option<&str> {
        self.claims().and_then(|c| c.folder.as_deref())
    }
}

impl<S> FromRequestParts<S> for Principal
where
    Verifier: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        if let Some(Authenticated(p)) = parts.extensions.get::<Authenticated>() {
            return Ok(p.clone());
        }
        let verifier = Verifier::from_ref(state);
        Principal::from_headers(&verifier, &parts.headers)
            .await
            .map_err(ApiError::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::verifier::VerifierConfig;
    use axum::Router;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use axum::routing::get;
    use tower::ServiceExt;

    fn headers(v: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for x in v {
            h.append(header::AUTHORIZATION, x.parse().unwrap());
        }
        h
    }

    #[test]
    fn bearer_parsing() {
        assert_eq!(bearer(&headers(&["Bearer abc"])), Ok("abc"));
        assert_eq!(bearer(&headers(&["bearer  abc "])), Ok("abc"));
        assert_eq!(bearer(&headers(&[])), Err(AuthError::Missing));
        assert!(bearer(&headers(&["Basic abc"])).is_err());
        assert!(bearer(&headers(&["Bearer"])).is_err());
        assert!(bearer(&headers(&["Bearer  "])).is_err());
        assert!(bearer(&headers(&["Bearer a", "Bearer b"])).is_err());
    }

    async fn call(app: Router, auth: Option<&str>) -> (StatusCode, serde_json::Value) {
        let mut req = Request::get("/x");
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    fn app(v: Verifier) -> Router {
        Router::new()
            .route(
                "/x",
                get(|p: Principal| async move {
                    p.require("runs:kill")?;
                    p.require_folder("acme/x")?;
                    Ok::<_, ApiError>(axum::Json(serde_json::json!({"sub": p.subject()})))
                }),
            )
            .with_state(v)
    }

    #[tokio::test]
    async fn open_mode_passes_everything() {
        let v = Verifier::new(VerifierConfig::default()).unwrap();
        for auth in [None, Some("Bearer garbage"), Some("Basic x")] {
            let (s, body) = call(app(v.clone()), auth).await;
            assert_eq!(s, StatusCode::OK, "{auth:?}");
            assert_eq!(body["sub"], "open");
        }
        assert!(Principal::Open.is_unbound());
    }

    #[tokio::test]
    async fn missing_or_garbled_tokens_are_401_envelopes() {
        let v = Verifier::local("hako-authd", std::time::Duration::from_secs(1));
        for (auth, code) in [
            (None, "missing_token"),
            (Some("Bearer garbage"), "invalid_token"),
            (Some("Basic x"), "invalid_token"),
            (Some("Bearer a.b.c"), "invalid_token"),
        ] {
            let (s, body) = call(app(v.clone()), auth).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED, "{auth:?}");
            assert_eq!(body["error"], code, "{auth:?}");
        }
    }

    #[tokio::test]
    async fn scope_and_folder_checks() {
        let s = crate::auth::Signer::generate().unwrap();
        let v = Verifier::local("hako-authd", std::time::Duration::from_secs(1));
        v.insert_key(s.kid(), s.verifying_key(), None);
        let now = crate::auth::now_secs();
        let mut c = Claims {
            iss: "hako-authd".into(),
            sub: "routd".into(),
            typ: crate::auth::TokenType::User,
            scope: vec!["runs:*".into()],
            folder: Some("acme".into()),
            jti: "j".into(),
            iat: now,
            nbf: now,
            exp: now + 60,
            run_id: None,
            turn_id: None,
            parent_jti: None,
            egress: vec![],
            secrets: vec![],
        };
        let ok = format!("Bearer {}", s.sign(&c).unwrap());
        assert_eq!(call(app(v.clone()), Some(&ok)).await.0, StatusCode::OK);
        c.jti = "j2".into();
        c.folder = Some("acmex".into());
        let t = format!("Bearer {}", s.sign(&c).unwrap());
        let (st, body) = call(app(v.clone()), Some(&t)).await;
        assert_eq!(
            (st, body["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("folder_forbidden"))
        );
        c.jti = "j3".into();
        c.folder = None;
        c.scope = vec!["runs:read".into()];
        let t = format!("Bearer {}", s.sign(&c).unwrap());
        let (st, body) = call(app(v), Some(&t)).await;
        assert_eq!(
            (st, body["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("insufficient_scope"))
        );
    }
}
