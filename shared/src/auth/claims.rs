//! The claims of a hako token (`specs/tokens.md`).

use serde::{Deserialize, Serialize};

use super::scope;

/// What kind of principal a token stands for.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenType {
    /// A daemon, from a service-key exchange.
    Service,
    /// A person or an integration acting for one, minted by downscoping.
    User,
    /// One agent container's token, bound to a run and a turn.
    Spawn,
}

impl TokenType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenType::Service => "service",
            TokenType::User => "user",
            TokenType::Spawn => "spawn",
        }
    }
}

impl std::fmt::Display for TokenType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The verified claims of a token. Times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The issuer (authd's `AUTHD_ISSUER`).
    pub iss: String,
    /// The subject: the daemon or user the token (and its whole chain) acts for.
    pub sub: String,
    /// The token's kind.
    pub typ: TokenType,
    /// Granted scopes, `resource:verb`.
    #[serde(default)]
    pub scope: Vec<String>,
    /// The group folder the token is bound to; `None` means unbound (every folder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folder: Option<String>,
    /// Unique token id (revocation key).
    pub jti: String,
    /// Issued at.
    pub iat: i64,
    /// Not before.
    pub nbf: i64,
    /// Expires at.
    pub exp: i64,
    /// The run a spawn token belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The turn a spawn token belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_id: Option<String>,
    /// The token this one was downscoped from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_jti: Option<String>,
    /// What the egress proxy lets this token reach: entries of `crate::allowlist::EgressRule`
    /// (`host`, `*.suffix`, IPv4, each with an optional `:port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// Spawn tokens: the brokered secrets the egress proxy may put on the wire for this run,
    /// each with its hosts and the run's placeholder (never a value; `specs/egress.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<crate::secrets::SecretClaim>,
}

impl Claims {
    /// Whether the token holds a scope covering `wanted`.
    pub fn has_scope(&self, wanted: &str) -> bool {
        scope::any_covers(&self.scope, wanted)
    }

    /// Whether the token reaches `folder`: unbound tokens reach every folder, bound ones their
    /// folder and the folders below it.
    pub fn covers_folder(&self, folder: &str) -> bool {
        match &self.folder {
            None => true,
            Some(own) => crate::folder::contains(own, folder),
        }
    }

    /// Seconds of life left at `now` (negative once expired).
    pub fn remaining(&self, now: i64) -> i64 {
        self.exp - now
    }
}

/// Longest host name accepted in an `egress` claim.
pub const MAX_HOST: usize = crate::allowlist::MAX_HOST;

/// Normalises and validates an egress entry (`crate::allowlist::EgressRule`): a DNS name,
/// `*.suffix` or IPv4 address, with an optional `:port`, lowercase. Returns the canonical form.
pub fn normalize_egress_host(raw: &str) -> Option<String> {
    crate::allowlist::EgressRule::parse(raw)
        .ok()
        .map(|r| r.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(folder: Option<&str>) -> Claims {
        Claims {
            iss: "i".into(),
            sub: "s".into(),
            typ: TokenType::Spawn,
            scope: vec!["runs:*".into(), "*".into()],
            folder: folder.map(str::to_owned),
            jti: "j".into(),
            iat: 0,
            nbf: 0,
            exp: 10,
            run_id: Some("r".into()),
            turn_id: None,
            parent_jti: None,
            egress: vec![],
            secrets: vec![],
        }
    }

    #[test]
    fn folder_and_scope_checks() {
        let c = claims(Some("acme"));
        assert!(c.covers_folder("acme"));
        assert!(c.covers_folder("acme/support"));
        assert!(!c.covers_folder("acmex"));
        assert!(!c.covers_folder("other"));
        assert!(claims(None).covers_folder("anything/below"));
        assert!(c.has_scope("runs:kill"));
        assert!(!c.has_scope("groups:read"));
        assert_eq!(c.remaining(4), 6);
    }

    #[test]
    fn wire_names() {
        let v = serde_json::to_value(claims(None)).unwrap();
        assert_eq!(v["typ"], "spawn");
        assert!(v.get("folder").is_none());
        assert!(v.get("egress").is_none());
        assert_eq!(v["run_id"], "r");
        assert!(serde_json::from_str::<Claims>(r#"{"typ":"root"}"#).is_err());
    }

    #[test]
    fn egress_hosts() {
        assert_eq!(
            normalize_egress_host("API.Example.com").as_deref(),
            Some("api.example.com")
        );
        assert_eq!(
            normalize_egress_host("10.0.0.1").as_deref(),
            Some("10.0.0.1")
        );
        assert_eq!(
            normalize_egress_host("*.Example.com:8443").as_deref(),
            Some("*.example.com:8443")
        );
        for bad in [
            "", "*.com", "a..b", "-a.com", "a.com:0", "a b", ".", "é.com",
        ] {
            assert!(normalize_egress_host(bad).is_none(), "{bad:?}");
        }
        assert!(normalize_egress_host(&"a.".repeat(200)).is_none());
    }
}
