//! Downscoping: the rules a child token obeys, as a pure function of the parent's claims,
//! the request and the time (so that every rule is unit-tested without I/O).
//!
//! A child never has more scope, a wider folder, a longer life or a looser run binding than
//! its parent: each scope is covered by one of the parent's; its folder equals or sits under
//! the parent's (an unbound parent may bind any folder; an omitted folder inherits the
//! parent's); its life ends no later than the parent's and lasts at most the global maximum;
//! `sub` is the parent's and `parent_jti` names the parent. A spawn parent only mints spawn
//! children of the same run and turn. Egress hosts are chosen by service tokens (runed) only;
//! any other parent passes on at most the hosts it holds; the same holds for brokered secrets
//! (names, hosts within the child's egress list, placeholders). A parent at or past
//! its `exp` cannot mint, even inside the verifier's clock-skew leeway.

use axum::http::StatusCode;
use hako_shared::GroupFolder;
use hako_shared::auth::claims::normalize_egress_host;
use hako_shared::auth::wire::MintRequest;
use hako_shared::auth::{Claims, TokenType, scope};
use hako_shared::http::ApiError;

/// Most scopes in one token.
pub const MAX_SCOPES: usize = 64;
/// Most egress hosts in one token.
pub const MAX_EGRESS: usize = hako_shared::allowlist::MAX_ENTRIES;
use hako_shared::http::Code;
pub use hako_shared::ids::MAX_ID;
use hako_shared::ids::{ID_GRAMMAR, is_valid_id};

/// Why a child token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MintError {
    /// The parent is at or past its expiry.
    #[error("the parent token has expired and cannot mint")]
    ParentExpired,
    /// A requested scope is malformed, or none was requested.
    #[error("{0}")]
    InvalidScope(String),
    /// A requested scope is not covered by the parent's.
    #[error("scope {0:?} is not covered by the parent token's scopes")]
    ScopeExceedsParent(String),
    /// The requested folder is not a valid group folder.
    #[error("folder is invalid: {0}")]
    InvalidFolder(String),
    /// The requested folder is outside the parent's.
    #[error("folder {child:?} is outside the parent token's folder {parent:?}")]
    FolderOutsideParent {
        /// Requested.
        child: String,
        /// The parent's.
        parent: String,
    },
    /// `ttl_seconds` is zero.
    #[error("ttl_seconds must be at least 1")]
    InvalidTtl,
    /// Longer than the parent's remaining life.
    #[error("ttl_seconds {asked} exceeds the parent token's remaining {left}s")]
    TtlExceedsParent {
        /// Requested.
        asked: u64,
        /// The parent's remaining seconds.
        left: i64,
    },
    /// Longer than `AUTHD_MAX_TOKEN_TTL`.
    #[error("ttl_seconds {asked} exceeds the maximum of {max}s (AUTHD_MAX_TOKEN_TTL)")]
    TtlExceedsMax {
        /// Requested.
        asked: u64,
        /// The maximum.
        max: u64,
    },
    /// A request that makes no sense for the token type.
    #[error("{0}")]
    InvalidRequest(String),
    /// A spawn parent asked for a different type of child.
    #[error("a spawn token can only mint spawn tokens")]
    TypExceedsParent,
    /// A spawn parent asked for another run or turn.
    #[error("run_id and turn_id must equal the parent token's")]
    RunOutsideParent,
    /// An egress host is malformed.
    #[error(
        "egress entry {0:?} is invalid: use a DNS name, *.suffix or IPv4 address, with an optional :port"
    )]
    InvalidEgress(String),
    /// An egress host a non-service parent does not have.
    #[error("egress host {0:?} is not in the parent token's egress list")]
    EgressExceedsParent(String),
    /// A brokered secret's entry is malformed, or names a host outside the egress list.
    #[error("{0}")]
    InvalidSecrets(String),
    /// A brokered secret a non-service parent does not hold (by name, hosts and placeholder).
    #[error("secret {0} is not in the parent token's secrets as asked")]
    SecretsExceedParent(String),
}

hako_shared::error_codes! {
    /// The parent token has expired and cannot mint.
    pub const PARENT_EXPIRED = (401, "parent_expired");
    /// A requested scope is malformed, or none was requested.
    pub const INVALID_SCOPE = (400, "invalid_scope");
    /// A requested scope is not covered by the parent's scopes.
    pub const SCOPE_EXCEEDS_PARENT = (403, "scope_exceeds_parent");
    /// The requested folder is not a group folder's name.
    pub const INVALID_FOLDER = (400, "invalid_folder");
    /// The requested folder is outside the parent's folder.
    pub const FOLDER_OUTSIDE_PARENT = (403, "folder_outside_parent");
    /// `ttl_seconds` is zero.
    pub const INVALID_TTL = (400, "invalid_ttl");
    /// `ttl_seconds` exceeds the parent's remaining life.
    pub const TTL_EXCEEDS_PARENT = (403, "ttl_exceeds_parent");
    /// `ttl_seconds` exceeds `AUTHD_MAX_TOKEN_TTL`.
    pub const TTL_EXCEEDS_MAX = (403, "ttl_exceeds_max");
    /// A spawn token asked for another type of child.
    pub const TYP_EXCEEDS_PARENT = (403, "typ_exceeds_parent");
    /// A spawn token asked for another run or turn than its own.
    pub const RUN_OUTSIDE_PARENT = (403, "run_outside_parent");
    /// An egress entry is not a DNS name, `*.suffix` or IPv4 address with an optional port.
    pub const INVALID_EGRESS = (400, "invalid_egress");
    /// An egress host the parent (not a service token) does not have.
    pub const EGRESS_EXCEEDS_PARENT = (403, "egress_exceeds_parent");
    /// A brokered secret's entry is malformed, or names a host outside the egress list.
    pub const INVALID_SECRETS = (400, "invalid_secrets");
    /// A brokered secret the parent (not a service token) does not hold as asked.
    pub const SECRETS_EXCEED_PARENT = (403, "secrets_exceed_parent");
}

impl MintError {
    /// The code it answers with: 400 for malformed requests, 401 for an expired parent,
    /// 403 for asking more than the parent has.
    pub fn answer(&self) -> &'static Code {
        match self {
            MintError::ParentExpired => &PARENT_EXPIRED,
            MintError::InvalidScope(_) => &INVALID_SCOPE,
            MintError::ScopeExceedsParent(_) => &SCOPE_EXCEEDS_PARENT,
            MintError::InvalidFolder(_) => &INVALID_FOLDER,
            MintError::FolderOutsideParent { .. } => &FOLDER_OUTSIDE_PARENT,
            MintError::InvalidTtl => &INVALID_TTL,
            MintError::TtlExceedsParent { .. } => &TTL_EXCEEDS_PARENT,
            MintError::TtlExceedsMax { .. } => &TTL_EXCEEDS_MAX,
            MintError::InvalidRequest(_) => &hako_shared::http::INVALID_REQUEST,
            MintError::TypExceedsParent => &TYP_EXCEEDS_PARENT,
            MintError::RunOutsideParent => &RUN_OUTSIDE_PARENT,
            MintError::InvalidEgress(_) => &INVALID_EGRESS,
            MintError::EgressExceedsParent(_) => &EGRESS_EXCEEDS_PARENT,
            MintError::InvalidSecrets(_) => &INVALID_SECRETS,
            MintError::SecretsExceedParent(_) => &SECRETS_EXCEED_PARENT,
        }
    }

    /// The envelope's error code.
    pub fn code(&self) -> &'static str {
        self.answer().code
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.answer().status()
    }
}

impl From<MintError> for ApiError {
    fn from(e: MintError) -> Self {
        ApiError::new(e.status(), e.code(), e.to_string())
    }
}

/// The limits of downscoping.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest child life, seconds.
    pub max_ttl: u64,
}

/// The child claims `parent` may have, or why not.
pub fn downscope(
    parent: &Claims,
    req: &MintRequest,
    now: i64,
    jti: String,
    limits: Limits,
) -> Result<Claims, MintError> {
    let left = parent.exp - now;
    if left <= 0 {
        return Err(MintError::ParentExpired);
    }

    // Scopes.
    if req.scope.is_empty() {
        return Err(MintError::InvalidScope(
            "scope must list at least one scope".into(),
        ));
    }
    if req.scope.len() > MAX_SCOPES {
        return Err(MintError::InvalidScope(format!(
            "at most {MAX_SCOPES} scopes"
        )));
    }
    let mut scopes: Vec<String> = Vec::with_capacity(req.scope.len());
    for s in &req.scope {
        scope::validate(s).map_err(|e| MintError::InvalidScope(e.to_string()))?;
        if !parent.has_scope(s) {
            return Err(MintError::ScopeExceedsParent(s.clone()));
        }
        if !scopes.contains(s) {
            scopes.push(s.clone());
        }
    }

    // Folder.
    let folder = match &req.folder {
        None => parent.folder.clone(),
        Some(raw) => {
            let f = GroupFolder::new(raw).map_err(|e| MintError::InvalidFolder(e.to_string()))?;
            if let Some(pf) = &parent.folder
                && !hako_shared::folder::contains(pf, f.as_str())
            {
                return Err(MintError::FolderOutsideParent {
                    child: f.as_str().to_owned(),
                    parent: pf.clone(),
                });
            }
            Some(f.as_str().to_owned())
        }
    };

    // Lifetime.
    let ttl = match req.ttl_seconds {
        Some(0) => return Err(MintError::InvalidTtl),
        Some(asked) => {
            if asked > limits.max_ttl {
                return Err(MintError::TtlExceedsMax {
                    asked,
                    max: limits.max_ttl,
                });
            }
            if i64::try_from(asked).map_or(true, |a| a > left) {
                return Err(MintError::TtlExceedsParent { asked, left });
            }
            asked as i64
        }
        None => left.min(i64::try_from(limits.max_ttl).unwrap_or(i64::MAX)),
    };

    // Type and run binding.
    let typ = match req.typ {
        Some(t) => t,
        None if req.run_id.is_some() => TokenType::Spawn,
        None => TokenType::User,
    };
    if parent.typ == TokenType::Spawn && typ != TokenType::Spawn {
        return Err(MintError::TypExceedsParent);
    }
    let (run_id, turn_id, egress, secrets) = match typ {
        TokenType::Service => {
            return Err(MintError::InvalidRequest(
                "service tokens come only from POST /v1/service-token".into(),
            ));
        }
        TokenType::User => {
            if req.run_id.is_some()
                || req.turn_id.is_some()
                || !req.egress.is_empty()
                || !req.secrets.is_empty()
            {
                return Err(MintError::InvalidRequest(
                    "run_id, turn_id, egress and secrets belong to spawn tokens".into(),
                ));
            }
            (None, None, Vec::new(), Vec::new())
        }
        TokenType::Spawn => {
            let (Some(run), Some(turn)) = (&req.run_id, &req.turn_id) else {
                return Err(MintError::InvalidRequest(
                    "a spawn token needs run_id and turn_id".into(),
                ));
            };
            if !is_valid_id(run) || !is_valid_id(turn) {
                return Err(MintError::InvalidRequest(format!(
                    "run_id and turn_id must be {ID_GRAMMAR}"
                )));
            }
            if parent.typ == TokenType::Spawn
                && (parent.run_id.as_deref() != Some(run.as_str())
                    || parent.turn_id.as_deref() != Some(turn.as_str()))
            {
                return Err(MintError::RunOutsideParent);
            }
            if req.egress.len() > MAX_EGRESS {
                return Err(MintError::InvalidEgress(format!(
                    "at most {MAX_EGRESS} hosts"
                )));
            }
            let mut egress: Vec<String> = Vec::with_capacity(req.egress.len());
            for raw in &req.egress {
                let host = normalize_egress_host(raw)
                    .ok_or_else(|| MintError::InvalidEgress(raw.chars().take(80).collect()))?;
                // Only a service token (runed) decides a run's egress; any other parent can
                // hand on at most the hosts it holds itself (a user token holds none).
                if parent.typ != TokenType::Service && !parent.egress.contains(&host) {
                    return Err(MintError::EgressExceedsParent(host));
                }
                if !egress.contains(&host) {
                    egress.push(host);
                }
            }
            let secrets = secrets_of(parent, req, &egress)?;
            (Some(run.clone()), Some(turn.clone()), egress, secrets)
        }
    };

    Ok(Claims {
        iss: parent.iss.clone(),
        sub: parent.sub.clone(),
        typ,
        scope: scopes,
        folder,
        jti,
        iat: now,
        nbf: now,
        exp: now + ttl,
        run_id,
        turn_id,
        parent_jti: Some(parent.jti.clone()),
        egress,
        secrets,
    })
}

/// A spawn child's brokered secrets: canonical, each named once, each host within the child's
/// `egress` (a value goes only where the run may go). Only a service token (runed) chooses
/// them; any other parent hands on at most what it holds, entry for entry.
fn secrets_of(
    parent: &Claims,
    req: &MintRequest,
    egress: &[String],
) -> Result<Vec<hako_shared::secrets::SecretClaim>, MintError> {
    use hako_shared::secrets::MAX_SECRETS;
    if req.secrets.len() > MAX_SECRETS {
        return Err(MintError::InvalidSecrets(format!(
            "at most {MAX_SECRETS} secrets"
        )));
    }
    let mut out: Vec<hako_shared::secrets::SecretClaim> = Vec::with_capacity(req.secrets.len());
    for s in &req.secrets {
        let c = s.canonical(egress).map_err(MintError::InvalidSecrets)?;
        if out
            .iter()
            .any(|o| o.name == c.name || o.placeholder == c.placeholder)
        {
            return Err(MintError::InvalidSecrets(format!(
                "secret {} is named twice, or shares a placeholder",
                c.name
            )));
        }
        if parent.typ != TokenType::Service && !parent.secrets.contains(&c) {
            return Err(MintError::SecretsExceedParent(c.name.to_string()));
        }
        out.push(c);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_shared::auth::AGENT_SCOPES;

    const NOW: i64 = 1_000_000;
    const LIMITS: Limits = Limits { max_ttl: 3600 };

    fn service(scope: &[&str]) -> Claims {
        Claims {
            iss: "hako-authd".into(),
            sub: "runed".into(),
            typ: TokenType::Service,
            scope: scope.iter().map(|s| s.to_string()).collect(),
            folder: None,
            jti: "p".into(),
            iat: NOW - 10,
            nbf: NOW - 10,
            exp: NOW + 600,
            run_id: None,
            turn_id: None,
            parent_jti: None,
            egress: vec![],
            secrets: vec![],
        }
    }

    fn req(scope: &[&str]) -> MintRequest {
        MintRequest {
            scope: scope.iter().map(|s| s.to_string()).collect(),
            ..MintRequest::default()
        }
    }

    fn spawn_req() -> MintRequest {
        MintRequest {
            folder: Some("acme/support".into()),
            run_id: Some("run-1".into()),
            turn_id: Some("turn-1".into()),
            egress: vec!["API.example.com".into()],
            ..req(AGENT_SCOPES)
        }
    }

    fn code(r: Result<Claims, MintError>) -> &'static str {
        r.unwrap_err().code()
    }

    #[test]
    fn a_spawn_token_from_runed() {
        let c = downscope(
            &service(AGENT_SCOPES),
            &spawn_req(),
            NOW,
            "c".into(),
            LIMITS,
        )
        .unwrap();
        assert_eq!(c.typ, TokenType::Spawn);
        assert_eq!(c.sub, "runed");
        assert_eq!(c.parent_jti.as_deref(), Some("p"));
        assert_eq!(c.folder.as_deref(), Some("acme/support"));
        assert_eq!(c.egress, vec!["api.example.com"]);
        // Default life: the parent's remaining, under the maximum.
        assert_eq!(c.exp, NOW + 600);
        assert_eq!((c.iat, c.nbf), (NOW, NOW));
    }

    #[test]
    fn scope_rules() {
        let p = service(&["runs:*", "sessions:read"]);
        assert!(downscope(&p, &req(&["runs:read", "runs:*"]), NOW, "c".into(), LIMITS).is_ok());
        assert_eq!(
            code(downscope(
                &p,
                &req(&["groups:read"]),
                NOW,
                "c".into(),
                LIMITS
            )),
            "scope_exceeds_parent"
        );
        assert_eq!(
            code(downscope(
                &p,
                &req(&["sessions:*"]),
                NOW,
                "c".into(),
                LIMITS
            )),
            "scope_exceeds_parent"
        );
        assert_eq!(
            code(downscope(&p, &req(&["*"]), NOW, "c".into(), LIMITS)),
            "invalid_scope"
        );
        assert_eq!(
            code(downscope(&p, &req(&[]), NOW, "c".into(), LIMITS)),
            "invalid_scope"
        );
        // A bare * held by the parent covers nothing.
        let star = service(&["*"]);
        assert_eq!(
            code(downscope(
                &star,
                &req(&["runs:read"]),
                NOW,
                "c".into(),
                LIMITS
            )),
            "scope_exceeds_parent"
        );
    }

    #[test]
    fn folder_rules() {
        let mut p = service(&["runs:*"]);
        p.folder = Some("acme".into());
        let mut r = req(&["runs:read"]);
        // Omitted: inherits the parent's.
        assert_eq!(
            downscope(&p, &r, NOW, "c".into(), LIMITS)
                .unwrap()
                .folder
                .as_deref(),
            Some("acme")
        );
        r.folder = Some("acme/sub".into());
        assert!(downscope(&p, &r, NOW, "c".into(), LIMITS).is_ok());
        r.folder = Some("acmex".into());
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "folder_outside_parent"
        );
        r.folder = Some("other".into());
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "folder_outside_parent"
        );
        r.folder = Some("../etc".into());
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "invalid_folder"
        );
    }

    #[test]
    fn lifetime_rules() {
        let p = service(&["runs:*"]);
        let mut r = req(&["runs:read"]);
        r.ttl_seconds = Some(600);
        assert_eq!(
            downscope(&p, &r, NOW, "c".into(), LIMITS).unwrap().exp,
            NOW + 600
        );
        r.ttl_seconds = Some(601);
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "ttl_exceeds_parent"
        );
        r.ttl_seconds = Some(0);
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "invalid_ttl"
        );
        r.ttl_seconds = Some(u64::MAX);
        assert_eq!(
            code(downscope(&p, &r, NOW, "c".into(), LIMITS)),
            "ttl_exceeds_max"
        );
        r.ttl_seconds = None;
        let small = Limits { max_ttl: 60 };
        assert_eq!(
            downscope(&p, &r, NOW, "c".into(), small).unwrap().exp,
            NOW + 60
        );
        // At or past exp (even within the verifier's leeway) the parent cannot mint.
        assert_eq!(
            code(downscope(&p, &r, NOW + 600, "c".into(), LIMITS)),
            "parent_expired"
        );
        assert_eq!(
            code(downscope(&p, &r, NOW + 610, "c".into(), LIMITS)),
            "parent_expired"
        );
    }

    #[test]
    fn spawn_rules() {
        let runed = service(AGENT_SCOPES);
        let child = downscope(&runed, &spawn_req(), NOW, "c".into(), LIMITS).unwrap();
        // A spawn token may narrow itself, for the same run and turn only.
        let mut r = spawn_req();
        r.scope = vec!["llm:call".into()];
        r.egress = vec![];
        assert!(downscope(&child, &r, NOW, "g".into(), LIMITS).is_ok());
        r.run_id = Some("run-2".into());
        assert_eq!(
            code(downscope(&child, &r, NOW, "g".into(), LIMITS)),
            "run_outside_parent"
        );
        let mut r = spawn_req();
        r.egress = vec!["evil.example.com".into()];
        assert_eq!(
            code(downscope(&child, &r, NOW, "g".into(), LIMITS)),
            "egress_exceeds_parent"
        );
        let mut r = req(&["llm:call"]);
        r.typ = Some(TokenType::User);
        assert_eq!(
            code(downscope(&child, &r, NOW, "g".into(), LIMITS)),
            "typ_exceeds_parent"
        );
        // Spawn tokens need both ids; user tokens take neither.
        let mut r = spawn_req();
        r.turn_id = None;
        assert_eq!(
            code(downscope(&runed, &r, NOW, "c".into(), LIMITS)),
            "invalid_request"
        );
        let mut r = req(AGENT_SCOPES);
        r.egress = vec!["a.com".into()];
        assert_eq!(
            code(downscope(&runed, &r, NOW, "c".into(), LIMITS)),
            "invalid_request"
        );
        let mut r = spawn_req();
        r.typ = Some(TokenType::Service);
        assert_eq!(
            code(downscope(&runed, &r, NOW, "c".into(), LIMITS)),
            "invalid_request"
        );
        let mut r = spawn_req();
        r.egress = vec!["*.Example.com:8443".into(), "*.example.com:8443".into()];
        let c = downscope(&runed, &r, NOW, "c".into(), LIMITS).unwrap();
        assert_eq!(c.egress, vec!["*.example.com:8443"], "canonical, once");
        r.egress = vec!["*.com".into()];
        assert_eq!(
            code(downscope(&runed, &r, NOW, "c".into(), LIMITS)),
            "invalid_egress"
        );
        // A user token holds no egress, so its spawn children get none either.
        let user = downscope(&runed, &req(AGENT_SCOPES), NOW, "u".into(), LIMITS).unwrap();
        assert_eq!(
            code(downscope(&user, &spawn_req(), NOW, "c".into(), LIMITS)),
            "egress_exceeds_parent"
        );
        let mut r = spawn_req();
        r.egress = vec![];
        assert!(downscope(&user, &r, NOW, "c".into(), LIMITS).is_ok());
        let mut r = spawn_req();
        r.run_id = Some("a/b".into());
        assert_eq!(
            code(downscope(&runed, &r, NOW, "c".into(), LIMITS)),
            "invalid_request"
        );
    }

    #[test]
    fn secrets_rules() {
        use hako_shared::secrets::{Placeholder, SecretClaim, SecretName};
        let runed = service(AGENT_SCOPES);
        let claim = |name: &str, hosts: &[&str], ph: &Placeholder| SecretClaim {
            name: SecretName::parse(name).unwrap(),
            hosts: hosts.iter().map(|h| (*h).to_owned()).collect(),
            placeholder: ph.clone(),
        };
        let (p1, p2) = (
            Placeholder::random().unwrap(),
            Placeholder::random().unwrap(),
        );
        let mut r = spawn_req();
        r.egress = vec!["github.com".into(), "*.github.com".into()];
        r.secrets = vec![
            claim("GH_TOKEN", &["GitHub.com", "api.github.com"], &p1),
            claim("NPM_TOKEN", &["npm.github.com"], &p2),
        ];
        let child = downscope(&runed, &r, NOW, "c".into(), LIMITS).unwrap();
        assert_eq!(child.secrets[0].hosts, vec!["github.com", "api.github.com"]);
        // Its own spawn children may keep or drop entries, never add or change one.
        let mut narrow = r.clone();
        narrow.secrets = vec![child.secrets[1].clone()];
        assert!(downscope(&child, &narrow, NOW, "g".into(), LIMITS).is_ok());
        let mut other = r.clone();
        other.secrets = vec![claim("GH_TOKEN", &["github.com"], &p1)];
        assert_eq!(
            code(downscope(&child, &other, NOW, "g".into(), LIMITS)),
            "secrets_exceed_parent",
            "fewer hosts is another entry: only runed chooses"
        );
        other.secrets = vec![claim("GH_TOKEN", &["github.com", "api.github.com"], &p2)];
        assert_eq!(
            code(downscope(&child, &other, NOW, "g".into(), LIMITS)),
            "secrets_exceed_parent"
        );
        // A host outside the egress list, a malformed host, a duplicate: refused.
        for secrets in [
            vec![claim("GH_TOKEN", &["gitlab.com"], &p1)],
            vec![claim("GH_TOKEN", &["*.github.com"], &p1)],
            vec![claim("GH_TOKEN", &[], &p1)],
            vec![
                claim("GH_TOKEN", &["github.com"], &p1),
                claim("GH_TOKEN", &["github.com"], &p2),
            ],
            vec![
                claim("GH_TOKEN", &["github.com"], &p1),
                claim("NPM_TOKEN", &["github.com"], &p1),
            ],
        ] {
            let mut bad = r.clone();
            bad.secrets = secrets;
            assert_eq!(
                code(downscope(&runed, &bad, NOW, "c".into(), LIMITS)),
                "invalid_secrets"
            );
        }
        // User tokens hold none; a user parent cannot hand any on.
        let mut u = req(AGENT_SCOPES);
        u.secrets = r.secrets.clone();
        assert_eq!(
            code(downscope(&runed, &u, NOW, "u".into(), LIMITS)),
            "invalid_request"
        );
    }
}
