//! The egress allowlist: the grammar of its entries (the `egress` claim of a spawn token and a
//! group's `egress_allowlist`), how a target is matched against them, and how an agent hands
//! its spawn token to the tools it runs (`specs/egress.md`).
//!
//! Always compiled, without dependencies: authd checks entries when it mints, runed when a
//! group is sent, the egress proxy matches with them, and an agent (a static binary without
//! the `auth` feature) builds its tools' proxy variables with [`child_proxy_env`].

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest host name accepted (RFC 1035).
pub const MAX_HOST: usize = 253;
/// Most entries in one allowlist (and one token's `egress` claim).
pub const MAX_ENTRIES: usize = 64;
/// The ports an entry without a port allows: HTTPS and HTTP.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// The host part of an entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    /// Exactly this DNS name (lowercase, no trailing dot).
    Exact(String),
    /// Any name strictly below this suffix (`*.example.com`: `a.example.com`, `a.b.example.com`,
    /// never `example.com` itself). The suffix has at least two labels.
    Suffix(String),
    /// Exactly this IPv4 address: an operator's explicit choice, so it may be private.
    Ip(Ipv4Addr),
}

/// One allowlist entry: `host`, `*.suffix` or an IPv4 address, with an optional `:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EgressRule {
    /// Which hosts.
    pub host: HostPattern,
    /// The one port allowed; `None`: 443 and 80.
    pub port: Option<u16>,
}

/// A target a client asked for, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TargetHost {
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// An address literal.
    Ip(IpAddr),
}

impl fmt::Display for TargetHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TargetHost::Name(n) => f.write_str(n),
            TargetHost::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            TargetHost::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

fn label_ok(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && !l.starts_with('-')
        && !l.ends_with('-')
        && l.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// A lowercase DNS name: labels of letters, digits and inner hyphens, and a last label that is
/// not all digits (`1.2.3`, `2130706433` or `0x7f.1` are numbers to a resolver, not names).
fn dns_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HOST
        && name.split('.').all(label_ok)
        && name
            .rsplit('.')
            .next()
            .is_some_and(|last| !last.bytes().all(|b| b.is_ascii_digit()))
}

fn split_port(raw: &str) -> Result<(&str, Option<u16>), String> {
    match raw.rsplit_once(':') {
        None => Ok((raw, None)),
        Some((host, port)) => {
            let p: u16 = port
                .parse()
                .ok()
                .filter(|p| *p != 0 && !port.starts_with('0'))
                .ok_or_else(|| format!("port {port:?} is not a number from 1 to 65535"))?;
            Ok((host, Some(p)))
        }
    }
}

impl EgressRule {
    /// Parses one entry, case-insensitively: `api.example.com`, `*.example.com`,
    /// `10.0.0.7`, each optionally followed by `:port`. Anything else (IPv6, a scheme, a path,
    /// a wildcard anywhere but at the front, a one-label wildcard like `*.com`) is refused with
    /// the reason.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let lower = raw.trim().to_ascii_lowercase();
        if lower.is_empty() {
            return Err("empty entry".into());
        }
        if lower.len() > MAX_HOST + 6 {
            return Err("longer than a host name and port can be".into());
        }
        let (host, port) = split_port(&lower)?;
        let host = host.strip_suffix('.').unwrap_or(host);
        let pattern = if let Some(suffix) = host.strip_prefix("*.") {
            if !dns_name_ok(suffix) {
                return Err(format!("{suffix:?} is not a DNS name"));
            }
            if !suffix.contains('.') {
                return Err(format!(
                    "*.{suffix} would allow a whole top-level domain; name at least two labels"
                ));
            }
            HostPattern::Suffix(suffix.to_owned())
        } else if let Ok(ip) = host.parse::<Ipv4Addr>() {
            HostPattern::Ip(ip)
        } else if dns_name_ok(host) {
            HostPattern::Exact(host.to_owned())
        } else {
            return Err(format!(
                "{host:?} is not a DNS name, *.suffix or IPv4 address"
            ));
        };
        Ok(Self {
            host: pattern,
            port,
        })
    }

    /// Whether this entry allows `host` on `port`.
    pub fn matches(&self, host: &TargetHost, port: u16) -> bool {
        let port_ok = match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        };
        port_ok
            && match (&self.host, host) {
                (HostPattern::Exact(e), TargetHost::Name(n)) => e == n,
                (HostPattern::Suffix(s), TargetHost::Name(n)) => n
                    .strip_suffix(s.as_str())
                    .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
                (HostPattern::Ip(a), TargetHost::Ip(IpAddr::V4(b))) => a == b,
                _ => false,
            }
    }

    /// Whether the entry names an address, not a name (its target may be private).
    pub fn is_ip(&self) -> bool {
        matches!(self.host, HostPattern::Ip(_))
    }
}

impl fmt::Display for EgressRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => f.write_str(h)?,
            HostPattern::Suffix(s) => write!(f, "*.{s}")?,
            HostPattern::Ip(a) => write!(f, "{a}")?,
        }
        if let Some(p) = self.port {
            write!(f, ":{p}")?;
        }
        Ok(())
    }
}

/// Normalises the host a client asked for: a DNS name (lowercase, trailing dot dropped), an
/// IPv4 address, or an IPv6 literal in brackets. `None` for anything else, including names a
/// resolver would read as numbers.
pub fn target_host(raw: &str) -> Option<TargetHost> {
    let lower = raw.to_ascii_lowercase();
    if let Some(inner) = lower.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        return inner
            .parse::<std::net::Ipv6Addr>()
            .ok()
            .map(|a| TargetHost::Ip(IpAddr::V6(a)));
    }
    let host = lower.strip_suffix('.').unwrap_or(&lower);
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Some(TargetHost::Ip(IpAddr::V4(ip)));
    }
    dns_name_ok(host).then(|| TargetHost::Name(host.to_owned()))
}

/// The entry among `rules` that allows `host:port`, if any. Entries that do not parse match
/// nothing.
pub fn allowing<'a>(
    rules: impl IntoIterator<Item = &'a str>,
    host: &TargetHost,
    port: u16,
) -> Option<EgressRule> {
    rules
        .into_iter()
        .filter_map(|r| EgressRule::parse(r).ok())
        .find(|r| r.matches(host, port))
}

/// The proxy variables runed sets in an `allowlist` container (and clients read).
pub const PROXY_VARS: [&str; 4] = ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"];
/// The no-proxy variables, set empty: every destination goes through the proxy.
pub const NO_PROXY_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];
/// The user name an agent puts before its token in a proxy URL (the proxy ignores it).
pub const PROXY_USER: &str = "hako";

/// `http://host:port` with the spawn token as its password: `http://hako:<token>@host:port`.
/// `None` when the URL is not a plain `http://` URL without credentials, or the token holds
/// characters a URL's user part cannot carry unescaped (a hako token is base64url and dots).
pub fn with_credentials(proxy_url: &str, token: &str) -> Option<String> {
    let rest = proxy_url.strip_prefix("http://")?;
    if rest.is_empty() || rest.contains('@') {
        return None;
    }
    let token_ok = !token.is_empty()
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    token_ok.then(|| format!("http://{PROXY_USER}:{token}@{rest}"))
}

/// What an agent runner puts into the environment of the tools it starts, so that ordinary
/// clients (curl, pip, git, SDKs) authenticate to the egress proxy with the run's token: each
/// proxy variable of `env` with the token added. The container's own environment (what
/// Docker stores) never holds the token; this lives only in the memory of the processes that
/// get it. Empty when the container has no proxy (not an `allowlist` group).
pub fn child_proxy_env<K, V>(
    env: impl IntoIterator<Item = (K, V)>,
    token: &str,
) -> Vec<(String, String)>
where
    K: AsRef<str>,
    V: AsRef<str>,
{
    env.into_iter()
        .filter(|(k, _)| PROXY_VARS.contains(&k.as_ref()))
        .filter_map(|(k, v)| {
            with_credentials(v.as_ref(), token).map(|url| (k.as_ref().to_owned(), url))
        })
        .collect()
}

/// Addresses that are never a target: "this host" (0.0.0.0/8, `::`), multicast, broadcast.
pub fn never(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[0] == 0 || a.is_multicast() || a.is_broadcast(),
        IpAddr::V6(a) => a.is_unspecified() || a.is_multicast(),
    }
}

fn special_v4(a: Ipv4Addr) -> bool {
    let o = a.octets();
    a.is_loopback()
        || a.is_link_local() // 169.254/16: cloud metadata lives here
        || a.is_private()
        || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64/10, carrier-grade NAT
        || (o[0] == 192 && o[1] == 0 && o[2] == 0) // 192.0.0/24, protocol assignments
        || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18/15, benchmarking
        || o[0] >= 240 // reserved
}

fn special_v6(a: Ipv6Addr) -> bool {
    if let Some(v4) = a.to_ipv4_mapped() {
        return special_v4(v4) || never(IpAddr::V4(v4));
    }
    let s = a.segments();
    a.is_loopback()
        || (s[0] & 0xfe00) == 0xfc00 // fc00::/7, unique local
        || (s[0] & 0xffc0) == 0xfe80 // fe80::/10, link-local
        || (s[0] & 0xffc0) == 0xfec0 // fec0::/10, old site-local
        || (s[0] == 0x64 && s[1] == 0xff9b) // 64:ff9b::/96 NAT64 can reach private v4
        || s[0] == 0x2002 // 6to4 embeds any v4
}

/// Loopback, link-local, private and the other ranges a name from the internet must not lead
/// to (DNS rebinding onto the host, its LAN or the cloud metadata address).
pub fn is_special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => special_v4(a),
        IpAddr::V6(a) => special_v6(a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> TargetHost {
        target_host(n).unwrap()
    }

    #[test]
    fn entries_parse_and_print_canonically() {
        for (raw, canon) in [
            ("API.Example.com", "api.example.com"),
            ("api.example.com.", "api.example.com"),
            ("*.Example.com", "*.example.com"),
            ("*.example.com:8443", "*.example.com:8443"),
            ("10.0.0.1", "10.0.0.1"),
            ("169.254.169.254:80", "169.254.169.254:80"),
            ("pypi.org:443", "pypi.org:443"),
            ("localhost", "localhost"),
        ] {
            assert_eq!(EgressRule::parse(raw).unwrap().to_string(), canon, "{raw}");
        }
        for bad in [
            "",
            "*.com",
            "*",
            "a.*.com",
            "*example.com",
            "a..b",
            "-a.com",
            "a.com:0",
            "a.com:65536",
            "a.com:08",
            "a.com:x",
            "a b",
            ".",
            "é.com",
            "http://a.com",
            "a.com/path",
            "[::1]",
            "::1",
            "1.2.3",
            "2130706433",
            "0x7f.1",
            "010.0.0.1",
        ] {
            assert!(EgressRule::parse(bad).is_err(), "{bad:?}");
        }
        assert!(EgressRule::parse(&"a.".repeat(200)).is_err());
    }

    #[test]
    fn matching_is_exact_or_strictly_below_a_suffix_on_the_right_port() {
        let exact = EgressRule::parse("api.example.com").unwrap();
        assert!(exact.matches(&name("API.example.COM."), 443));
        assert!(exact.matches(&name("api.example.com"), 80));
        assert!(!exact.matches(&name("api.example.com"), 8080));
        assert!(!exact.matches(&name("x.api.example.com"), 443));
        assert!(!exact.matches(&name("api.example.com.evil.net"), 443));
        let wild = EgressRule::parse("*.example.com").unwrap();
        assert!(wild.matches(&name("a.example.com"), 443));
        assert!(wild.matches(&name("a.b.example.com"), 80));
        assert!(
            !wild.matches(&name("example.com"), 443),
            "the apex is not below"
        );
        assert!(!wild.matches(&name("badexample.com"), 443));
        assert!(!wild.matches(&name("a.example.com"), 22));
        let port = EgressRule::parse("git.example.com:22").unwrap();
        assert!(port.matches(&name("git.example.com"), 22));
        assert!(
            !port.matches(&name("git.example.com"), 443),
            "a port replaces the defaults"
        );
        let ip = EgressRule::parse("10.1.2.3").unwrap();
        assert!(ip.is_ip() && !exact.is_ip());
        assert!(ip.matches(&name("10.1.2.3"), 443));
        assert!(!ip.matches(&name("10.1.2.4"), 443));
        // A name never matches an IP entry, nor an IP a name entry.
        let numeric_name = EgressRule::parse("ten.example").unwrap();
        assert!(!numeric_name.matches(&name("10.1.2.3"), 443));
        assert!(target_host("[::1]").is_some());
        assert!(!ip.matches(&target_host("[::ffff:10.1.2.3]").unwrap(), 443));
        assert!(target_host("1.2.3").is_none() && target_host("a b").is_none());
        assert_eq!(
            allowing(["bad entry", "*.example.com"], &name("x.example.com"), 443)
                .map(|r| r.to_string()),
            Some("*.example.com".into())
        );
        assert_eq!(allowing(["a.com"], &name("b.com"), 443), None);
    }

    #[test]
    fn the_token_goes_into_the_tools_proxy_variables_only() {
        let token = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln-_";
        let env = [
            ("HTTPS_PROXY", "http://hako-egress:3128"),
            ("http_proxy", "http://hako-egress:3128"),
            ("PATH", "/bin"),
            ("HTTP_PROXY", "http://someone:else@proxy:1"),
        ];
        let got = child_proxy_env(env, token);
        assert_eq!(
            got,
            vec![
                (
                    "HTTPS_PROXY".to_owned(),
                    format!("http://hako:{token}@hako-egress:3128")
                ),
                (
                    "http_proxy".to_owned(),
                    format!("http://hako:{token}@hako-egress:3128")
                ),
            ]
        );
        assert!(with_credentials("http://p:1", "a b").is_none());
        assert!(with_credentials("http://p:1", "a@b").is_none());
        assert!(with_credentials("https://p:1", token).is_none());
        assert!(child_proxy_env([("HTTPS_PROXY", "http://p:1")], "").is_empty());
    }
}
