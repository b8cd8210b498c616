//! authd's configuration, parsed once from the environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use hako_shared::auth::grants;
use hako_shared::auth::verifier::DEFAULT_ISSUER;
use hako_shared::config::{ConfigError, Env};
use hako_shared::http::ServeLimits;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// Shortest service key accepted.
pub const MIN_KEY_LEN: usize = 16;
/// Longest service key accepted.
pub const MAX_KEY_LEN: usize = 1024;

/// authd's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DATA_DIR` (required): holds `authd.db`; created mode 0700.
    pub data_dir: PathBuf,
    /// `LISTEN_ADDR`, default `127.0.0.1:8181`.
    pub listen_addr: SocketAddr,
    /// `AUTHD_SERVICE_KEYS` or the file `AUTHD_SERVICE_KEYS_FILE` names (required):
    /// `runed=<key>,routd=<key>,…`.
    pub service_keys: ServiceKeys,
    /// `AUTHD_ISSUER`, default `hako-authd`.
    pub issuer: String,
    /// `AUTHD_SERVICE_TOKEN_TTL`, default 1h.
    pub service_token_ttl: Duration,
    /// `AUTHD_MAX_TOKEN_TTL`, default 1h: no downscoped token lives longer.
    pub max_token_ttl: Duration,
    /// `AUTHD_CLOCK_SKEW`, default 30s: leeway of verification, and the margin a retired key
    /// keeps verifying past the longest token lifetime.
    pub clock_skew: Duration,
    /// `AUTHD_AUDIT_RETENTION`, default 30d: audit rows older than this are deleted.
    pub audit_retention: Duration,
    /// `HAKO_MAX_CONNECTIONS`, `HAKO_HEADER_TIMEOUT`: bounds on the connections served.
    pub serve: ServeLimits,
}

impl Config {
    /// Reads the configuration; every error names the variable (never a key's value).
    pub fn from_env(env: &Env) -> Result<Self, ConfigError> {
        let data_dir = PathBuf::from(env.required("DATA_DIR")?);
        let listen_addr = env.listen_addr_or("LISTEN_ADDR", "127.0.0.1:8181")?;
        let raw = env.required_secret("AUTHD_SERVICE_KEYS")?;
        let service_keys = ServiceKeys::parse(&raw).map_err(|reason| ConfigError::Invalid {
            var: "AUTHD_SERVICE_KEYS".into(),
            value: "<redacted>".into(),
            reason,
        })?;
        let at_least_1s = |var: &str, d: Duration| {
            if d < Duration::from_secs(1) {
                Err(ConfigError::Invalid {
                    var: var.into(),
                    value: format!("{d:?}"),
                    reason: "must be at least 1s".into(),
                })
            } else {
                Ok(d)
            }
        };
        let service_token_ttl = at_least_1s(
            "AUTHD_SERVICE_TOKEN_TTL",
            env.duration_or("AUTHD_SERVICE_TOKEN_TTL", Duration::from_secs(3600))?,
        )?;
        let max_token_ttl = at_least_1s(
            "AUTHD_MAX_TOKEN_TTL",
            env.duration_or("AUTHD_MAX_TOKEN_TTL", Duration::from_secs(3600))?,
        )?;
        let issuer = env.string_or("AUTHD_ISSUER", DEFAULT_ISSUER);
        Ok(Self {
            data_dir,
            listen_addr,
            service_keys,
            issuer,
            service_token_ttl,
            max_token_ttl,
            clock_skew: env.duration_or("AUTHD_CLOCK_SKEW", Duration::from_secs(30))?,
            audit_retention: env
                .duration_or("AUTHD_AUDIT_RETENTION", Duration::from_secs(30 * 86_400))?,
            serve: ServeLimits::from_env(env)?,
        })
    }

    /// How long a retired key keeps verifying: the longest token lifetime plus the skew, so
    /// that every token it signed expires before it leaves the JWKS.
    pub fn rotation_window(&self) -> Duration {
        self.service_token_ttl.max(self.max_token_ttl) + self.clock_skew
    }
}

/// The daemons' service keys. Only SHA-256 digests are kept in memory; `Debug` shows names.
#[derive(Clone)]
pub struct ServiceKeys {
    entries: Vec<(String, [u8; 32])>,
    /// Compared against when the daemon is unknown, so that both failures cost the same.
    decoy: [u8; 32],
}

impl std::fmt::Debug for ServiceKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl ServiceKeys {
    /// Parses `name=key,name=key`. Refuses empty input, empty or short keys, names not in the
    /// grants table and duplicates. Errors name the entry, never the key.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let mut entries: Vec<(String, [u8; 32])> = Vec::new();
        for (i, part) in raw.split(',').enumerate() {
            let n = i + 1;
            let part = part.trim();
            if part.is_empty() {
                return Err(format!("entry {n} is empty"));
            }
            let (name, key) = part
                .split_once('=')
                .ok_or_else(|| format!("entry {n} is not name=key"))?;
            let name = name.trim();
            if grants::service_grants(name).is_none() {
                let shown: String = name.chars().take(32).collect();
                return Err(format!(
                    "entry {n}: {shown:?} is not a known daemon (known: {})",
                    grants::service_names().collect::<Vec<_>>().join(", ")
                ));
            }
            if key.len() < MIN_KEY_LEN {
                return Err(format!(
                    "entry {n} ({name}): key is shorter than {MIN_KEY_LEN} characters"
                ));
            }
            if key.len() > MAX_KEY_LEN {
                return Err(format!(
                    "entry {n} ({name}): key is longer than {MAX_KEY_LEN} characters"
                ));
            }
            if key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "entry {n} ({name}): key contains whitespace or control characters"
                ));
            }
            if entries.iter().any(|(e, _)| e == name) {
                return Err(format!("entry {n}: {name} appears twice"));
            }
            entries.push((name.to_owned(), digest(key)));
        }
        let mut decoy = [0u8; 32];
        getrandom::fill(&mut decoy).map_err(|e| format!("no randomness: {e}"))?;
        Ok(Self { entries, decoy })
    }

    /// The configured daemon names.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|(n, _)| n.as_str())
    }

    /// Whether `presented` is `daemon`'s key. Compares fixed-size digests in constant time,
    /// and an unknown daemon costs the same comparison as a known one.
    pub fn check(&self, daemon: &str, presented: &str) -> bool {
        let got = digest(presented);
        let (known, want) = match self.entries.iter().find(|(n, _)| n == daemon) {
            Some((_, d)) => (true, d),
            None => (false, &self.decoy),
        };
        let equal: bool = got.ct_eq(want).into();
        equal && known
    }
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    const K1: &str = "0123456789abcdef-runed";
    const K2: &str = "0123456789abcdef-routd";

    fn env(keys: &str) -> Env {
        Env::from_pairs([("DATA_DIR", "/tmp/x"), ("AUTHD_SERVICE_KEYS", keys)])
    }

    #[test]
    fn parses_and_checks_keys() {
        let c = Config::from_env(&env(&format!("runed={K1}, routd={K2}"))).unwrap();
        assert!(c.service_keys.check("runed", K1));
        assert!(c.service_keys.check("routd", K2));
        assert!(!c.service_keys.check("runed", K2));
        assert!(!c.service_keys.check("operator", K1));
        assert!(!c.service_keys.check("", ""));
        assert_eq!(c.listen_addr.to_string(), "127.0.0.1:8181");
        assert_eq!(c.issuer, "hako-authd");
        assert_eq!(c.rotation_window(), Duration::from_secs(3630));
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(K1) && dbg.contains("runed"), "{dbg}");
    }

    #[test]
    fn refuses_bad_keys_without_echoing_them() {
        for (raw, why) in [
            ("", "set but empty"),
            ("runed=", "shorter"),
            ("runed=short-secret", "shorter"),
            ("runed", "name=key"),
            (&format!("runed={K1},"), "empty"),
            (&format!("runed={K1},runed={K2}"), "twice"),
            (&format!("nobody={K1}"), "not a known daemon"),
            (&format!("runed={K1} x"), "whitespace"),
        ] {
            let e = Config::from_env(&env(raw)).unwrap_err().to_string();
            assert!(e.contains("AUTHD_SERVICE_KEYS"), "{raw:?}: {e}");
            assert!(e.contains(why), "{raw:?}: {e}");
            assert!(!e.contains(K1) && !e.contains(K2), "{e} echoes a key");
            assert!(!e.contains("short-secret"), "{e} echoes a key");
        }
    }

    #[test]
    fn other_variables() {
        let e = Config::from_env(&Env::from_pairs([("AUTHD_SERVICE_KEYS", "x")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("DATA_DIR"), "{e}");
        let mut pairs = vec![
            ("DATA_DIR", "/tmp/x".to_owned()),
            ("AUTHD_SERVICE_KEYS", format!("runed={K1}")),
        ];
        pairs.push(("AUTHD_MAX_TOKEN_TTL", "0".into()));
        let e = Config::from_env(&Env::from_pairs(pairs.clone()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("AUTHD_MAX_TOKEN_TTL"), "{e}");
        pairs.pop();
        pairs.push(("AUTHD_CLOCK_SKEW", "soon".into()));
        let e = Config::from_env(&Env::from_pairs(pairs))
            .unwrap_err()
            .to_string();
        assert!(e.contains("AUTHD_CLOCK_SKEW"), "{e}");
    }
}
