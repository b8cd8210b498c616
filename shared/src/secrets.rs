//! Brokered secrets (`specs/egress.md`, "Secrets the agent cannot read"): the grammar of a
//! secret's name and of the hosts it is bound to, a group's bindings, the per-run placeholder
//! that stands in for the value inside the box, and the entry of a spawn token's `secrets`
//! claim that tells the egress proxy which placeholder of which run it may replace, for which
//! hosts.
//!
//! Always compiled, without dependencies beyond `getrandom`: runed and routd check groups with
//! it, authd checks the claim when it mints, the proxy matches with it, and the CLI checks a
//! name before it sends a value anywhere.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::allowlist::{self, TargetHost};

/// Most secrets one group may use.
pub const MAX_SECRETS: usize = 16;
/// Most hosts one secret may be bound to.
pub const MAX_HOSTS: usize = 8;
/// Longest secret name.
pub const MAX_NAME: usize = 64;
/// Longest secret value, in bytes.
pub const MAX_VALUE: usize = 8 << 10;
/// What every placeholder starts with, so that the proxy can spot one (its own run's or
/// another's) wherever it turns up.
pub const PLACEHOLDER_PREFIX: &str = "hako_ph_";
/// Hex digits after the prefix: 128 random bits.
pub const PLACEHOLDER_HEX: usize = 32;
/// A placeholder's length.
pub const PLACEHOLDER_LEN: usize = PLACEHOLDER_PREFIX.len() + PLACEHOLDER_HEX;

/// The variables a box with brokered secrets gets the CA bundle's path in: what OpenSSL and
/// curl, Python's requests and httpx, node, git and curl's own read.
pub const CA_BUNDLE_VARS: [&str; 5] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
];

/// Names a box's environment already uses (or that steer its tools): a secret cannot take
/// them (nor [`CA_BUNDLE_VARS`]), or its placeholder would replace the proxy's address, the
/// CA bundle or hako's own.
const RESERVED: &[&str] = &[
    "HOME",
    "PATH",
    "USER",
    "SHELL",
    "TZ",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "SSL_CERT_DIR",
];
/// Prefixes of the names hako and the loader own.
const RESERVED_PREFIXES: &[&str] = &["HAKO_", "ARIZUKO_", "AUTHD_", "RUNED_", "LD_", "GIT_"];

/// A secret's name: what the operator sets (`hako secrets set GH_TOKEN`), what a group names,
/// and the environment variable that holds the placeholder in the box. Uppercase letters,
/// digits and `_`, starting with a letter, at most 64; not one of the box's own variables.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SecretName(String);

impl SecretName {
    /// Checks `raw` against the grammar; the error says what is wrong (never echoing more than
    /// the name itself, which is not secret).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let ok = !raw.is_empty()
            && raw.len() <= MAX_NAME
            && raw.as_bytes()[0].is_ascii_uppercase()
            && raw
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
        if !ok {
            return Err(format!(
                "a secret's name is 1-{MAX_NAME} uppercase letters, digits and _, starting with a letter (an environment variable's name)"
            ));
        }
        if RESERVED.contains(&raw)
            || CA_BUNDLE_VARS.contains(&raw)
            || RESERVED_PREFIXES.iter().any(|p| raw.starts_with(p))
        {
            return Err(format!(
                "{raw} is a name the box's environment already uses (proxy, CA bundle, hako's own)"
            ));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl<'de> Deserialize<'de> for SecretName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        SecretName::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// A host a secret is bound to: a DNS name (no wildcard, no address: the proxy must issue a
/// certificate for exactly this name) and a port (default 443).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SecretHost {
    /// Lowercase, without a trailing dot.
    pub name: String,
    /// The TLS port.
    pub port: u16,
}

impl SecretHost {
    /// Parses `name` or `name:port`, case-insensitively.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let rule = allowlist::EgressRule::parse(raw)?;
        let allowlist::HostPattern::Exact(name) = rule.host else {
            return Err(format!(
                "{raw:?}: a secret is bound to exact host names (no *.suffix, no address): the proxy presents a certificate for exactly that name"
            ));
        };
        Ok(Self {
            name,
            port: rule.port.unwrap_or(443),
        })
    }

    /// Whether this is `host:port`.
    pub fn is(&self, host: &TargetHost, port: u16) -> bool {
        matches!(host, TargetHost::Name(n) if *n == self.name) && port == self.port
    }
}

impl fmt::Display for SecretHost {
    /// The canonical form: `name` for 443, else `name:port`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port == 443 {
            f.write_str(&self.name)
        } else {
            write!(f, "{}:{}", self.name, self.port)
        }
    }
}

/// One secret a group may use, and the hosts its value may be sent to (its `secrets`, in the
/// group's container settings; the operator's alone).
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretBinding {
    /// The secret (`hako secrets set NAME`); the box's environment variable of that name holds
    /// the run's placeholder.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "GH_TOKEN"))]
    pub name: SecretName,
    /// The hosts (`name` or `name:port`, default 443) whose requests get the value in place of
    /// the placeholder; each must be on the group's `egress_allowlist`.
    #[cfg_attr(feature = "openapi", schema(example = json!(["github.com", "api.github.com"])))]
    pub hosts: Vec<String>,
}

impl SecretBinding {
    /// The hosts, parsed (errors name the index).
    pub fn parsed_hosts(&self) -> Result<Vec<SecretHost>, (usize, String)> {
        self.hosts
            .iter()
            .enumerate()
            .map(|(i, h)| SecretHost::parse(h).map_err(|e| (i, e)))
            .collect()
    }
}

/// A secret's stand-in for one run: `hako_ph_` and 32 hex digits (128 random bits), made by
/// runed for each run and secret, carried in the run's spawn token (signed by authd, so the
/// proxy trusts it without trusting the box) and in the box's environment. It is worth
/// nothing outside its run: the proxy replaces it only in requests that carry that run's live
/// token, toward the secret's hosts.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Placeholder(String);

impl Placeholder {
    /// A fresh one; without the OS's entropy source, none (the run that needs it fails).
    pub fn random() -> Result<Self, getrandom::Error> {
        let hex = crate::ids::random_secret(PLACEHOLDER_HEX / 2)?;
        Ok(Self(format!("{PLACEHOLDER_PREFIX}{hex}")))
    }

    /// Checks the shape.
    pub fn parse(raw: &str) -> Option<Self> {
        is_placeholder(raw).then(|| Self(raw.to_owned()))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Placeholder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not a secret, but a log line has no use for it.
        f.write_str("Placeholder(..)")
    }
}

fn is_placeholder(s: &str) -> bool {
    s.len() == PLACEHOLDER_LEN
        && s.starts_with(PLACEHOLDER_PREFIX)
        && s[PLACEHOLDER_PREFIX.len()..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Every placeholder-shaped string in `text` (whatever run it belongs to).
pub fn placeholders_in(text: &[u8]) -> impl Iterator<Item = &str> {
    let prefix = PLACEHOLDER_PREFIX.as_bytes();
    let mut at = 0;
    std::iter::from_fn(move || {
        while at + PLACEHOLDER_LEN <= text.len() {
            let rest = &text[at..];
            let Some(i) = memchr::memmem::find(rest, prefix) else {
                at = text.len();
                return None;
            };
            let start = at + i;
            at = start + 1;
            if let Some(cand) = text.get(start..start + PLACEHOLDER_LEN)
                && let Ok(s) = std::str::from_utf8(cand)
                && is_placeholder(s)
            {
                at = start + PLACEHOLDER_LEN;
                return Some(s);
            }
        }
        None
    })
}

/// One entry of a spawn token's `secrets` claim: the secret's name, the hosts its value may
/// go to (canonical [`SecretHost`] forms) and this run's placeholder. Never the value.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretClaim {
    /// The secret.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "GH_TOKEN"))]
    pub name: SecretName,
    /// Where its value may be sent.
    pub hosts: Vec<String>,
    /// The run's stand-in for it.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "hako_ph_00112233445566778899aabbccddeeff"))]
    pub placeholder: Placeholder,
}

impl SecretClaim {
    /// Whether the claim's hosts include `host:port`.
    pub fn bound_to(&self, host: &TargetHost, port: u16) -> bool {
        self.hosts
            .iter()
            .filter_map(|h| SecretHost::parse(h).ok())
            .any(|h| h.is(host, port))
    }

    /// The claim checked and made canonical (hosts parsed, lowercase, deduplicated, at most
    /// [`MAX_HOSTS`], each allowed by `egress`: a value may only go where the run may go).
    pub fn canonical(&self, egress: &[String]) -> Result<Self, String> {
        if self.hosts.is_empty() || self.hosts.len() > MAX_HOSTS {
            return Err(format!(
                "secret {}: 1 to {MAX_HOSTS} hosts",
                self.name.as_str()
            ));
        }
        let mut hosts: Vec<String> = Vec::with_capacity(self.hosts.len());
        for raw in &self.hosts {
            let h = SecretHost::parse(raw).map_err(|e| format!("secret {}: {e}", self.name))?;
            let target = TargetHost::Name(h.name.clone());
            if allowlist::allowing(egress.iter().map(String::as_str), &target, h.port).is_none() {
                return Err(format!(
                    "secret {}: host {h} is not in the token's egress list",
                    self.name
                ));
            }
            let h = h.to_string();
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
        Ok(Self {
            name: self.name.clone(),
            hosts,
            placeholder: self.placeholder.clone(),
        })
    }
}

/// `PUT /v1/secrets/{name}` body (runed): the value, from the operator's stdin or file.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretValueRequest {
    /// The value: 1 to 8192 bytes of printable ASCII without spaces. Never echoed back,
    /// logged or stored anywhere but the proxy's store.
    #[cfg_attr(feature = "openapi", schema(example = "<the value, from stdin>"))]
    pub value: String,
}

impl fmt::Debug for SecretValueRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValueRequest(..)")
    }
}

/// One brokered secret as runed lists it: never its value.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretView {
    /// The name.
    #[cfg_attr(feature = "openapi", schema(value_type = String, example = "GH_TOKEN"))]
    pub name: SecretName,
    /// When it was last set (RFC 3339).
    pub set_at: String,
}

/// `GET /v1/secrets` answer (runed), by name.
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretList {
    /// The secrets.
    pub secrets: Vec<SecretView>,
}

/// Why a value cannot be a secret (never echoing it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    /// Empty.
    #[error("the value is empty")]
    Empty,
    /// Over [`MAX_VALUE`].
    #[error("the value is longer than {MAX_VALUE} bytes")]
    TooLong,
    /// A byte that cannot stand in an HTTP header as it is.
    #[error(
        "the value holds a byte that is not printable ASCII (byte {0}): it is sent in HTTP headers, where a space, control character or line break could split or end one"
    )]
    NotPrintable(usize),
}

/// Checks a value: 1 to [`MAX_VALUE`] bytes of printable ASCII without spaces (a token, a key,
/// a password), since it is written into HTTP headers as it is.
pub fn check_value(v: &[u8]) -> Result<(), ValueError> {
    if v.is_empty() {
        return Err(ValueError::Empty);
    }
    if v.len() > MAX_VALUE {
        return Err(ValueError::TooLong);
    }
    match v.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        Some(i) => Err(ValueError::NotPrintable(i)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["GH_TOKEN", "NPM_TOKEN", "A", "X1_2"] {
            assert_eq!(SecretName::parse(ok).unwrap().as_str(), ok);
        }
        for bad in [
            "",
            "gh_token",
            "1X",
            "_X",
            "GH-TOKEN",
            "GH TOKEN",
            "HTTPS_PROXY",
            "SSL_CERT_FILE",
            "HAKO_X",
            "LD_PRELOAD",
            "GIT_SSL_CAINFO",
            "PATH",
        ] {
            assert!(SecretName::parse(bad).is_err(), "{bad:?}");
        }
        assert!(SecretName::parse(&"A".repeat(65)).is_err());
        assert!(serde_json::from_str::<SecretName>("\"lower\"").is_err());
    }

    #[test]
    fn hosts() {
        let h = SecretHost::parse("API.GitHub.com").unwrap();
        assert_eq!((h.name.as_str(), h.port), ("api.github.com", 443));
        assert_eq!(h.to_string(), "api.github.com");
        let p = SecretHost::parse("git.example.com:8443").unwrap();
        assert_eq!(p.to_string(), "git.example.com:8443");
        assert!(p.is(&TargetHost::Name("git.example.com".into()), 8443));
        assert!(!p.is(&TargetHost::Name("git.example.com".into()), 443));
        for bad in ["*.github.com", "10.0.0.1", "", "https://github.com", "a b"] {
            assert!(SecretHost::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn placeholders_are_random_and_found_anywhere() {
        let (a, b) = (
            Placeholder::random().unwrap(),
            Placeholder::random().unwrap(),
        );
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), PLACEHOLDER_LEN);
        assert!(Placeholder::parse(a.as_str()).is_some());
        assert!(Placeholder::parse("hako_ph_xyz").is_none());
        assert!(!format!("{a:?}").contains(a.as_str()));
        let text = format!(
            "Bearer {} x hako_ph_short {}{}",
            a.as_str(),
            b.as_str(),
            a.as_str()
        );
        let found: Vec<&str> = placeholders_in(text.as_bytes()).collect();
        assert_eq!(found, vec![a.as_str(), b.as_str(), a.as_str()]);
        assert_eq!(placeholders_in(b"hako_ph_").count(), 0);
    }

    #[test]
    fn claims_are_made_canonical_within_the_egress_list() {
        let c = SecretClaim {
            name: SecretName::parse("GH_TOKEN").unwrap(),
            hosts: vec![
                "GitHub.com".into(),
                "github.com".into(),
                "api.github.com".into(),
            ],
            placeholder: Placeholder::random().unwrap(),
        };
        let egress = vec!["github.com".to_owned(), "*.github.com".to_owned()];
        let canon = c.canonical(&egress).unwrap();
        assert_eq!(canon.hosts, vec!["github.com", "api.github.com"]);
        assert!(canon.bound_to(&TargetHost::Name("api.github.com".into()), 443));
        assert!(!canon.bound_to(&TargetHost::Name("api.github.com".into()), 80));
        assert!(!canon.bound_to(&TargetHost::Name("evil.example".into()), 443));
        let e = c.canonical(&["github.com".to_owned()]).unwrap_err();
        assert!(e.contains("api.github.com"), "{e}");
        let none = SecretClaim {
            hosts: vec![],
            ..c.clone()
        };
        assert!(none.canonical(&egress).is_err());
    }

    #[test]
    fn values() {
        assert_eq!(check_value(b"ghp_abc123"), Ok(()));
        assert_eq!(check_value(b""), Err(ValueError::Empty));
        assert_eq!(check_value(b"a\r\nX: y"), Err(ValueError::NotPrintable(1)));
        assert_eq!(check_value(b"a b"), Err(ValueError::NotPrintable(1)));
        assert_eq!(
            check_value(&[b'a'; MAX_VALUE + 1]),
            Err(ValueError::TooLong)
        );
    }
}
