//! The proxy's configuration, read once from the environment (`specs/egress.md`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::auth::VerifierConfig;
use hako_shared::config::{ConfigError, Env};

/// An address range, e.g. `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `addr/prefix` (or a bare address: one host).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (addr, prefix) = match raw.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (raw.trim(), None),
        };
        let net: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IP address"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix {p:?} is not 0 to {max}"))?,
        };
        Ok(Self { net, prefix })
    }

    /// Whether `ip` lies in this range (IPv4-mapped IPv6 addresses count as IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// Everything the proxy needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    /// `EGRESS_LISTEN` (default `127.0.0.1:3128`; the image sets `0.0.0.0:3128`).
    pub listen: SocketAddr,
    /// `EGRESS_ADMIN_LISTEN` (default `127.0.0.1:3129`): `/health`, `/ready`, `/metrics`.
    pub admin_listen: SocketAddr,
    /// `AUTHD_URL` and the verifier's timings. There is no open mode.
    pub verifier: VerifierConfig,
    /// `EGRESS_REVOCATION_MAX_AGE` (30s): past this without a fresh revocation list from
    /// authd, every request is refused.
    pub revocation_max_age: Duration,
    /// `EGRESS_PRIVATE_TARGETS`: ranges a name may resolve into although they are loopback,
    /// link-local or private (default none).
    pub private_targets: Vec<Cidr>,
    /// `EGRESS_MAX_CONNECTIONS` (1024): client connections at once.
    pub max_connections: usize,
    /// `EGRESS_MAX_CONNECTIONS_PER_TOKEN` (32): tunnels and requests in flight per token.
    pub max_per_token: usize,
    /// `EGRESS_IDLE_TIMEOUT` (5m): a tunnel or forwarded request with no byte either way for
    /// this long is closed.
    pub idle_timeout: Duration,
    /// `EGRESS_CONNECT_TIMEOUT` (10s): connecting to the target.
    pub connect_timeout: Duration,
    /// `EGRESS_HEADER_TIMEOUT` (10s): a client's request headers (and keep-alive idle).
    pub header_timeout: Duration,
    /// `EGRESS_DNS_TIMEOUT` (5s): resolving the target.
    pub dns_timeout: Duration,
    /// `EGRESS_DNS_CACHE` (5s, `0s`: off): how long a name's addresses are reused. They are
    /// checked again on every use.
    pub dns_cache: Duration,
    /// `EGRESS_RECHECK_INTERVAL` (1s): how often live connections' tokens are checked again
    /// (revoked or expired: the connection is cut).
    pub recheck: Duration,
    /// Brokered secrets: on when `EGRESS_SECRETS_DIR` and `EGRESS_CA_DIR` are set (runed sets
    /// both). Off, a run whose secrets are bound to a host is refused there
    /// (`broker_unavailable`), never tunnelled with its placeholder.
    pub broker: Option<BrokerConfig>,
}

/// Where brokered secrets and the TLS material come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// `EGRESS_SECRETS_DIR`: the operator's store, read-only (one 0600 file per secret).
    pub secrets_dir: PathBuf,
    /// `EGRESS_CA_DIR`: the proxy's own directory, where its CA is made on the first start
    /// and kept (the key, 0600, never leaves it).
    pub ca_dir: PathBuf,
    /// `EGRESS_SYSTEM_ROOTS` (`/etc/ssl/certs/ca-certificates.crt`, in the image): the roots
    /// targets are verified against, and what boxes trust besides the CA.
    pub system_roots: PathBuf,
    /// `EGRESS_EXTRA_ROOTS`: PEM certificates trusted for targets besides the system's (a
    /// test's CA; by explicit configuration only). Not handed to boxes.
    pub extra_roots: Option<String>,
}

/// The system roots' default path (Debian's `ca-certificates`, copied into the image).
pub const SYSTEM_ROOTS: &str = "/etc/ssl/certs/ca-certificates.crt";

impl Config {
    /// Defaults against the authd at `authd_url` (tests start here).
    pub fn new(authd_url: &str) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 3128)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 3129)),
            verifier: VerifierConfig::remote(authd_url),
            revocation_max_age: Duration::from_secs(30),
            private_targets: Vec::new(),
            max_connections: 1024,
            max_per_token: 32,
            idle_timeout: Duration::from_secs(300),
            connect_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            dns_timeout: Duration::from_secs(5),
            dns_cache: Duration::from_secs(5),
            recheck: Duration::from_secs(1),
            broker: None,
        }
    }

    /// Reads the configuration; errors name the variable.
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let verifier = VerifierConfig::from_env(env)?;
        let Some(url) = verifier.authd_url.clone() else {
            return Err(ConfigError::Invalid {
                var: "HAKO_OPEN_DEV".into(),
                value: "1".into(),
                reason: "the egress proxy has no open mode: it lets nothing through without a \
                         spawn token verified against authd; set AUTHD_URL"
                    .into(),
            });
        };
        let mut c = Self::new(&url);
        c.verifier = verifier;
        c.listen = env.listen_addr_or("EGRESS_LISTEN", "127.0.0.1:3128")?;
        c.admin_listen = env.listen_addr_or("EGRESS_ADMIN_LISTEN", "127.0.0.1:3129")?;
        c.revocation_max_age =
            env.duration_or("EGRESS_REVOCATION_MAX_AGE", c.revocation_max_age)?;
        if c.revocation_max_age <= c.verifier.revoked_poll {
            return Err(ConfigError::Invalid {
                var: "EGRESS_REVOCATION_MAX_AGE".into(),
                value: format!("{:?}", c.revocation_max_age),
                reason: format!(
                    "must be longer than AUTHD_REVOKED_POLL ({:?}), or every request is refused between polls",
                    c.verifier.revoked_poll
                ),
            });
        }
        if let Some(list) = env.get("EGRESS_PRIVATE_TARGETS") {
            c.private_targets = list
                .split(',')
                .filter(|s| !s.trim().is_empty())
                .map(|s| {
                    Cidr::parse(s).map_err(|reason| ConfigError::Invalid {
                        var: "EGRESS_PRIVATE_TARGETS".into(),
                        value: s.into(),
                        reason,
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        c.dns_cache = env.duration_or("EGRESS_DNS_CACHE", c.dns_cache)?;
        c.broker = match (env.path("EGRESS_SECRETS_DIR"), env.path("EGRESS_CA_DIR")) {
            (None, None) => None,
            (Some(secrets_dir), Some(ca_dir)) => Some(BrokerConfig {
                secrets_dir,
                ca_dir,
                system_roots: env.path_or("EGRESS_SYSTEM_ROOTS", SYSTEM_ROOTS),
                extra_roots: env.get("EGRESS_EXTRA_ROOTS").map(str::to_owned),
            }),
            (Some(_), None) | (None, Some(_)) => {
                let (set, unset) = if env.get("EGRESS_CA_DIR").is_some() {
                    ("EGRESS_CA_DIR", "EGRESS_SECRETS_DIR")
                } else {
                    ("EGRESS_SECRETS_DIR", "EGRESS_CA_DIR")
                };
                return Err(ConfigError::Required {
                    var: unset.into(),
                    hint: format!("{set} is set: brokered secrets need both"),
                });
            }
        };
        c.max_connections = positive(env, "EGRESS_MAX_CONNECTIONS", c.max_connections)?;
        c.max_per_token = positive(env, "EGRESS_MAX_CONNECTIONS_PER_TOKEN", c.max_per_token)?;
        for (var, field) in [
            ("EGRESS_IDLE_TIMEOUT", &mut c.idle_timeout),
            ("EGRESS_CONNECT_TIMEOUT", &mut c.connect_timeout),
            ("EGRESS_HEADER_TIMEOUT", &mut c.header_timeout),
            ("EGRESS_DNS_TIMEOUT", &mut c.dns_timeout),
            ("EGRESS_RECHECK_INTERVAL", &mut c.recheck),
        ] {
            *field = env.duration_or(var, *field)?;
            if field.is_zero() {
                return Err(ConfigError::Invalid {
                    var: var.into(),
                    value: "0".into(),
                    reason: "must be more than 0".into(),
                });
            }
        }
        Ok(c)
    }
}

fn positive(env: &Env, var: &str, default: usize) -> Result<usize, ConfigError> {
    let v = env.parse_or(var, default)?;
    if v == 0 {
        return Err(ConfigError::Invalid {
            var: var.into(),
            value: "0".into(),
            reason: "must be at least 1".into(),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidrs() {
        let c = Cidr::parse("172.30.5.128/25").unwrap();
        assert!(c.contains("172.30.5.200".parse().unwrap()));
        assert!(!c.contains("172.30.5.1".parse().unwrap()));
        assert!(c.contains("::ffff:172.30.5.130".parse().unwrap()));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains("127.0.0.1".parse().unwrap()));
        assert!(!all.contains("::1".parse().unwrap()));
        let one = Cidr::parse("10.0.0.1").unwrap();
        assert!(one.contains("10.0.0.1".parse().unwrap()));
        assert!(!one.contains("10.0.0.2".parse().unwrap()));
        assert!(
            Cidr::parse("fd00::/8")
                .unwrap()
                .contains("fd12::1".parse().unwrap())
        );
        for bad in ["10.0.0.0/33", "x/8", "10.0.0.0/", "::/129"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_is_read_and_checked() {
        let c = Config::from_env(&Env::from_pairs([
            ("AUTHD_URL", "http://127.0.0.1:1"),
            ("EGRESS_PRIVATE_TARGETS", "10.0.0.0/8, 192.168.1.7"),
            ("EGRESS_LISTEN", ":3128"),
        ]))
        .unwrap();
        assert_eq!(c.private_targets.len(), 2);
        assert_eq!(c.listen.to_string(), "0.0.0.0:3128");
        let b = Config::from_env(&Env::from_pairs([
            ("AUTHD_URL", "http://127.0.0.1:1"),
            ("EGRESS_SECRETS_DIR", "/run/secrets"),
            ("EGRESS_CA_DIR", "/var/lib/ca"),
        ]))
        .unwrap()
        .broker
        .unwrap();
        assert_eq!(b.system_roots, PathBuf::from(SYSTEM_ROOTS));
        assert_eq!(b.extra_roots, None);
        let open = Config::from_env(&Env::from_pairs([("HAKO_OPEN_DEV", "1")]));
        assert!(open.unwrap_err().to_string().contains("no open mode"));
        assert!(Config::from_env(&Env::from_pairs::<&str, &str>([])).is_err());
        for (k, v) in [
            ("EGRESS_PRIVATE_TARGETS", "10.0.0.0/99"),
            ("EGRESS_MAX_CONNECTIONS_PER_TOKEN", "0"),
            ("EGRESS_IDLE_TIMEOUT", "0s"),
            ("EGRESS_REVOCATION_MAX_AGE", "5s"),
            ("EGRESS_SECRETS_DIR", "/s"),
            ("EGRESS_CA_DIR", "/c"),
        ] {
            let e = Config::from_env(&Env::from_pairs([
                ("AUTHD_URL", "http://127.0.0.1:1"),
                (k, v),
            ]))
            .unwrap_err()
            .to_string();
            assert!(e.contains(k), "{k}: {e}");
        }
    }
}
