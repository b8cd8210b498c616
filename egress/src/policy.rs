//! The decisions, as pure functions where they can be: the credentials of a request, why it
//! is refused (one reason each, with its status and metric label), and which addresses a
//! target may be reached at.

use std::net::IpAddr;

use base64::Engine as _;
use hyper::StatusCode;
use hyper::header::{HeaderMap, PROXY_AUTHORIZATION};

use crate::config::Cidr;

/// Why a request was refused. Each is counted under its [`Denial::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Denial {
    /// No `Proxy-Authorization`.
    NoToken,
    /// A token that does not verify (malformed, forged, another issuer, unknown key).
    BadToken,
    /// Past its `exp`.
    Expired,
    /// On authd's revocation list.
    Revoked,
    /// A valid token that is not a spawn token with `egress:connect`.
    NotForEgress,
    /// The proxy cannot check tokens: authd's keys unreachable, or the revocation list stale.
    VerifierUnavailable,
    /// The token's allowlist does not name this host and port.
    HostNotAllowed,
    /// Allowed by name, but it resolves only to loopback, link-local, private or otherwise
    /// special addresses the operator did not allow.
    PrivateAddress,
    /// The token already holds its bound of connections.
    TooManyConnections,
    /// Not a proxy request (origin-form, no port on CONNECT, a scheme other than http).
    BadRequest,
    /// The run's secrets are bound to this host, but this proxy has no broker (no CA, no
    /// store): refused rather than tunnelled with its placeholders.
    BrokerUnavailable,
    /// A secret bound to this host is not set (or its file cannot be used): the request is
    /// refused, not sent with its placeholder.
    SecretUnavailable,
    /// `TRACE` (or `TRACK`) toward a host the run's secrets are bound to: a server that
    /// answers it echoes the request's headers, values included, back to the box.
    TraceRefused,
}

impl Denial {
    /// Every reason, for metrics created at zero.
    pub const ALL: [Denial; 13] = [
        Denial::NoToken,
        Denial::BadToken,
        Denial::Expired,
        Denial::Revoked,
        Denial::NotForEgress,
        Denial::VerifierUnavailable,
        Denial::HostNotAllowed,
        Denial::PrivateAddress,
        Denial::TooManyConnections,
        Denial::BadRequest,
        Denial::BrokerUnavailable,
        Denial::SecretUnavailable,
        Denial::TraceRefused,
    ];

    /// The metric label and the `x-hako-egress-denied` header.
    pub fn code(self) -> &'static str {
        match self {
            Denial::NoToken => "no_token",
            Denial::BadToken => "bad_token",
            Denial::Expired => "expired",
            Denial::Revoked => "revoked",
            Denial::NotForEgress => "token_not_for_egress",
            Denial::VerifierUnavailable => "verifier_unavailable",
            Denial::HostNotAllowed => "host_not_allowed",
            Denial::PrivateAddress => "private_address",
            Denial::TooManyConnections => "too_many_connections",
            Denial::BadRequest => "bad_request",
            Denial::BrokerUnavailable => "broker_unavailable",
            Denial::SecretUnavailable => "secret_unavailable",
            Denial::TraceRefused => "trace_refused",
        }
    }

    /// 407 when the credentials are missing or unusable (so that clients which only send
    /// credentials when challenged send them), 503 when the proxy cannot check tokens, 429
    /// at the connection bound, 400 for a request that is not a proxy request, else 403.
    pub fn status(self) -> StatusCode {
        match self {
            Denial::NoToken | Denial::BadToken | Denial::Expired | Denial::Revoked => {
                StatusCode::PROXY_AUTHENTICATION_REQUIRED
            }
            Denial::VerifierUnavailable | Denial::BrokerUnavailable | Denial::SecretUnavailable => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Denial::TooManyConnections => StatusCode::TOO_MANY_REQUESTS,
            Denial::BadRequest => StatusCode::BAD_REQUEST,
            Denial::TraceRefused => StatusCode::METHOD_NOT_ALLOWED,
            Denial::NotForEgress | Denial::HostNotAllowed | Denial::PrivateAddress => {
                StatusCode::FORBIDDEN
            }
        }
    }

    /// What a person reading the body needs to know.
    pub fn explain(self) -> &'static str {
        match self {
            Denial::NoToken => {
                "no credentials: send the run's spawn token as the proxy password (http://hako:<token>@proxy:port) or as Proxy-Authorization: Bearer <token>"
            }
            Denial::BadToken => "the proxy credentials are not a valid hako token",
            Denial::Expired => "the spawn token has expired",
            Denial::Revoked => "the spawn token has been revoked (its run is over)",
            Denial::NotForEgress => "the token is not a spawn token with egress:connect",
            Denial::VerifierUnavailable => {
                "the proxy cannot check tokens right now (authd unreachable); nothing passes until it can"
            }
            Denial::HostNotAllowed => "the run's egress allowlist does not name this host and port",
            Denial::PrivateAddress => {
                "the name resolves only to loopback, link-local or private addresses, which an allowlist entry by name never reaches"
            }
            Denial::TooManyConnections => "this token holds as many connections as it may",
            Denial::BadRequest => {
                "not a proxy request: use CONNECT host:port, or an absolute http:// URL"
            }
            Denial::BrokerUnavailable => {
                "the run's secrets are bound to this host, but this proxy brokers no secrets (EGRESS_SECRETS_DIR, EGRESS_CA_DIR)"
            }
            Denial::SecretUnavailable => {
                "a secret bound to this host is not set or cannot be read (hako secrets list)"
            }
            Denial::TraceRefused => {
                "TRACE toward a host the run's secrets are bound to would echo their values back"
            }
        }
    }
}

/// Why a permitted request still failed (not a denial: the target did not answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The name did not resolve (or not in time).
    Resolve,
    /// No address accepted the connection in time.
    Connect,
    /// The target's answer did not come, or broke.
    Upstream,
    /// TLS toward the target failed (its certificate is not trusted, or not for its name).
    Tls,
}

impl Failure {
    /// Every failure, for metrics created at zero.
    pub const ALL: [Failure; 4] = [
        Failure::Resolve,
        Failure::Connect,
        Failure::Upstream,
        Failure::Tls,
    ];

    /// The metric label.
    pub fn code(self) -> &'static str {
        match self {
            Failure::Resolve => "resolve",
            Failure::Connect => "connect",
            Failure::Upstream => "upstream",
            Failure::Tls => "tls",
        }
    }

    /// 502, the proxy's answer for a target it may reach but could not.
    pub fn status(self) -> StatusCode {
        StatusCode::BAD_GATEWAY
    }
}

/// A `Proxy-Authorization` header that is present but unusable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unusable Proxy-Authorization (several, an unknown scheme, or bad base64)")]
pub struct UnusableCredentials;

/// The token in a request's `Proxy-Authorization`: `Basic` (the password, or the user name
/// when the password is empty) or `Bearer`. An error for a header that is present but
/// unusable (several of them, an unknown scheme, bad base64).
pub fn token_of(headers: &HeaderMap) -> Result<Option<String>, UnusableCredentials> {
    let bad = |_| UnusableCredentials;
    let mut all = headers.get_all(PROXY_AUTHORIZATION).iter();
    let Some(value) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(UnusableCredentials);
    }
    let text = value.to_str().map_err(bad)?.trim();
    let (scheme, rest) = text.split_once(' ').ok_or(UnusableCredentials)?;
    let rest = rest.trim();
    let token = if scheme.eq_ignore_ascii_case("bearer") {
        rest.to_owned()
    } else if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(rest)
            .map_err(|_| UnusableCredentials)?;
        let pair = String::from_utf8(raw).map_err(|_| UnusableCredentials)?;
        let (user, pass) = pair.split_once(':').unwrap_or((&pair, ""));
        if pass.is_empty() {
            user.to_owned()
        } else {
            pass.to_owned()
        }
    } else {
        return Err(UnusableCredentials);
    };
    if token.is_empty() {
        return Ok(None);
    }
    Ok(Some(token))
}

pub use hako_shared::allowlist::{is_special, never};

/// Whether the proxy may connect to `ip` for an entry that allowed the target: never to
/// "this host", multicast or broadcast; to a special address only when the entry names that
/// address itself (`explicit_ip`) or the operator allowed its range.
pub fn address_allowed(ip: IpAddr, explicit_ip: bool, private_targets: &[Cidr]) -> bool {
    if never(ip) {
        return false;
    }
    if !is_special(ip) || explicit_ip {
        return true;
    }
    private_targets.iter().any(|c| c.contains(ip))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn special_ranges() {
        for s in [
            "127.0.0.1",
            "127.9.9.9",
            "169.254.169.254",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "100.64.0.1",
            "240.0.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(is_special(ip(s)), "{s}");
            assert!(!address_allowed(ip(s), false, &[]), "{s}");
        }
        for s in ["1.1.1.1", "172.32.0.1", "8.8.8.8", "2606:4700::1111"] {
            assert!(!is_special(ip(s)), "{s}");
            assert!(address_allowed(ip(s), false, &[]), "{s}");
        }
        for s in [
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "ff02::1",
        ] {
            assert!(!address_allowed(
                ip(s),
                true,
                &[Cidr::parse("0.0.0.0/0").unwrap()]
            ));
        }
        // An entry that names the address, or the operator's range, lets a special one pass.
        assert!(address_allowed(ip("169.254.169.254"), true, &[]));
        let ops = [Cidr::parse("172.30.5.128/25").unwrap()];
        assert!(address_allowed(ip("172.30.5.130"), false, &ops));
        assert!(!address_allowed(ip("172.30.5.1"), false, &ops));
    }

    #[test]
    fn credentials() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(PROXY_AUTHORIZATION, HeaderValue::from_str(v).unwrap());
            m
        };
        assert_eq!(token_of(&HeaderMap::new()), Ok(None));
        assert_eq!(token_of(&h("Bearer abc")), Ok(Some("abc".into())));
        assert_eq!(
            token_of(&h(&format!("Basic {}", b64("hako:tok.en")))),
            Ok(Some("tok.en".into()))
        );
        assert_eq!(
            token_of(&h(&format!("basic {}", b64("tok.en:")))),
            Ok(Some("tok.en".into()))
        );
        assert_eq!(token_of(&h(&format!("Basic {}", b64(":")))), Ok(None));
        assert_eq!(token_of(&h("Basic !!!")), Err(UnusableCredentials));
        assert_eq!(token_of(&h("Digest x")), Err(UnusableCredentials));
        assert_eq!(token_of(&h("Bearer")), Err(UnusableCredentials));
        let mut two = h("Bearer a");
        two.append(PROXY_AUTHORIZATION, HeaderValue::from_static("Bearer b"));
        assert_eq!(token_of(&two), Err(UnusableCredentials));
    }

    #[test]
    fn every_denial_has_a_distinct_code() {
        let mut codes: Vec<_> = Denial::ALL.iter().map(|d| d.code()).collect();
        codes.sort();
        codes.dedup();
        assert_eq!(codes.len(), Denial::ALL.len());
        assert_eq!(Denial::HostNotAllowed.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            Denial::Revoked.status(),
            StatusCode::PROXY_AUTHENTICATION_REQUIRED
        );
    }
}
