//! Typed configuration from environment variables.
//!
//! Every daemon parses its environment once at start into a typed struct through [`Env`].
//! A bad value is a [`ConfigError`] that names the variable, so the operator knows what to fix;
//! binaries print it and exit non-zero instead of running with a guess.

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// A configuration value that could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A required variable is unset.
    #[error("{var} is required but not set")]
    Missing {
        /// The variable's name.
        var: String,
    },
    /// A required variable is unset, and there is more to say about what to do.
    #[error("{var} is required: {hint}")]
    Required {
        /// The variable's name.
        var: String,
        /// What to set.
        hint: String,
    },
    /// A variable that needs a value is set to the empty string.
    #[error("{var} is set but empty: give it a value or unset it")]
    Empty {
        /// The variable's name.
        var: String,
    },
    /// A variable is set to something that does not parse.
    #[error("{var}={value:?} is invalid: {reason}")]
    Invalid {
        /// The variable's name.
        var: String,
        /// The offending value (never used for secret variables; see [`Env::secret`]).
        value: String,
        /// What was expected.
        reason: String,
    },
}

/// A source of configuration variables: the process environment, or a map in tests.
#[derive(Debug, Clone)]
pub struct Env {
    vars: HashMap<String, String>,
}

impl Env {
    /// Snapshot of the process environment (non-UTF-8 variables are ignored).
    pub fn from_process() -> Self {
        Self {
            vars: std::env::vars().collect(),
        }
    }

    /// An environment made of the given pairs, for tests and embedding.
    pub fn from_pairs<K: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        Self {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// Every variable with a non-empty value (e.g. to pass a family of them on).
    pub fn pairs(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vars
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// The raw value; an empty string counts as unset.
    pub fn get(&self, var: &str) -> Option<&str> {
        self.vars
            .get(var)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A required string; an empty value is refused as such, not taken for "unset".
    pub fn required(&self, var: &str) -> Result<String, ConfigError> {
        self.reject_empty(var)?;
        self.get(var)
            .map(str::to_owned)
            .ok_or(ConfigError::Missing {
                var: var.to_owned(),
            })
    }

    /// Whether the variable is present with an empty value.
    pub fn is_empty(&self, var: &str) -> bool {
        self.vars.get(var).is_some_and(|v| v.is_empty())
    }

    /// `Err(Empty)` when the variable is present but empty: for variables whose absence
    /// means something (a mode, a default) that an empty value must not silently select.
    pub fn reject_empty(&self, var: &str) -> Result<(), ConfigError> {
        if self.is_empty(var) {
            return Err(ConfigError::Empty {
                var: var.to_owned(),
            });
        }
        Ok(())
    }

    /// A boolean flag: `1`/`true`/`yes` or `0`/`false`/`no` (any case); unset is `false`.
    pub fn flag(&self, var: &str) -> Result<bool, ConfigError> {
        match self.get(var).map(str::to_ascii_lowercase).as_deref() {
            None | Some("0" | "false" | "no") => Ok(false),
            Some("1" | "true" | "yes") => Ok(true),
            Some(other) => Err(ConfigError::Invalid {
                var: var.to_owned(),
                value: other.to_owned(),
                reason: "expected 1 or 0".into(),
            }),
        }
    }

    /// A string with a default.
    pub fn string_or(&self, var: &str, default: &str) -> String {
        self.get(var).unwrap_or(default).to_owned()
    }

    /// A path with a default.
    pub fn path_or(&self, var: &str, default: impl Into<PathBuf>) -> PathBuf {
        self.get(var)
            .map(PathBuf::from)
            .unwrap_or_else(|| default.into())
    }

    /// An optional path.
    pub fn path(&self, var: &str) -> Option<PathBuf> {
        self.get(var).map(PathBuf::from)
    }

    /// Any `FromStr` value with a default; the parse error is reported with the variable name.
    pub fn parse_or<T>(&self, var: &str, default: T) -> Result<T, ConfigError>
    where
        T: FromStr,
        T::Err: std::fmt::Display,
    {
        match self.get(var) {
            None => Ok(default),
            Some(raw) => raw
                .trim()
                .parse()
                .map_err(|e: T::Err| ConfigError::Invalid {
                    var: var.to_owned(),
                    value: raw.to_owned(),
                    reason: e.to_string(),
                }),
        }
    }

    /// A duration such as `20m`, `30s`, `500ms`, `1h30m`, with a default.
    pub fn duration_or(&self, var: &str, default: Duration) -> Result<Duration, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            Some(raw) => parse_duration(raw).map_err(|reason| ConfigError::Invalid {
                var: var.to_owned(),
                value: raw.to_owned(),
                reason,
            }),
        }
    }

    /// A byte size such as `1g`, `512m`, `64k`, `1024`, with a default.
    pub fn size_or(&self, var: &str, default: u64) -> Result<u64, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            Some(raw) => parse_size(raw).map_err(|reason| ConfigError::Invalid {
                var: var.to_owned(),
                value: raw.to_owned(),
                reason,
            }),
        }
    }

    /// A boolean (`1/0`, `true/false`, `yes/no`, `on/off`) with a default.
    pub fn bool_or(&self, var: &str, default: bool) -> Result<bool, ConfigError> {
        match self.get(var) {
            None => Ok(default),
            Some(raw) => match raw.trim().to_ascii_lowercase().as_str() {
                "1" | "true" | "yes" | "on" => Ok(true),
                "0" | "false" | "no" | "off" => Ok(false),
                _ => Err(ConfigError::Invalid {
                    var: var.to_owned(),
                    value: raw.to_owned(),
                    reason: "expected true or false".into(),
                }),
            },
        }
    }

    /// A secret: required when `required`, never echoed back in errors.
    pub fn secret(&self, var: &str) -> Option<String> {
        self.get(var).map(str::to_owned)
    }

    /// A required secret from `var` or the file `<var>_FILE` names (see
    /// [`Env::secret_or_file`]); neither set: an error naming both.
    pub fn required_secret(&self, var: &str) -> Result<String, ConfigError> {
        self.secret_or_file(var)?
            .ok_or_else(|| ConfigError::Required {
                var: var.into(),
                hint: format!("set it, or {var}_FILE to a file holding it"),
            })
    }

    /// A secret from `var`, or from the file `<var>_FILE` names (where compose secrets and
    /// key files put it, so that it stays out of the process's environment). One trailing
    /// newline is dropped. Both set, an empty value, an unreadable or empty file: an error
    /// naming the variable, never echoing the secret.
    pub fn secret_or_file(&self, var: &str) -> Result<Option<String>, ConfigError> {
        let file_var = format!("{var}_FILE");
        self.reject_empty(var)?;
        self.reject_empty(&file_var)?;
        match (self.get(var), self.get(&file_var)) {
            (Some(_), Some(_)) => Err(ConfigError::Invalid {
                var: file_var.clone(),
                value: self.get(&file_var).unwrap_or_default().to_owned(),
                reason: format!("{var} is set too: set one of them"),
            }),
            (Some(v), None) => Ok(Some(v.to_owned())),
            (None, Some(path)) => {
                let invalid = |reason: String| ConfigError::Invalid {
                    var: file_var.clone(),
                    value: path.to_owned(),
                    reason,
                };
                // A key file is small; a bound keeps a wrong path (a device, a log) harmless.
                let mut text = String::new();
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(
                        std::fs::File::open(path).map_err(|e| invalid(e.to_string()))?,
                        64 << 10,
                    ),
                    &mut text,
                )
                .map_err(|e| invalid(e.to_string()))?;
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let text = text.strip_suffix('\r').unwrap_or(text);
                if text.is_empty() {
                    return Err(invalid("the file is empty".into()));
                }
                Ok(Some(text.to_owned()))
            }
            (None, None) => Ok(None),
        }
    }

    /// A socket address such as `127.0.0.1:8080`; `:8080` means all interfaces.
    pub fn listen_addr_or(
        &self,
        var: &str,
        default: &str,
    ) -> Result<std::net::SocketAddr, ConfigError> {
        let raw = self.get(var).unwrap_or(default);
        let full = if raw.starts_with(':') {
            format!("0.0.0.0{raw}")
        } else {
            raw.to_owned()
        };
        full.parse().map_err(|_| ConfigError::Invalid {
            var: var.to_owned(),
            value: raw.to_owned(),
            reason: "expected host:port, e.g. 127.0.0.1:8080 or :8080".into(),
        })
    }
}

/// Parses a duration: one or more `<number><unit>` parts, units `ms`, `s`, `m`, `h`, `d`.
/// A bare `0` is accepted; any other bare number is rejected because its unit is ambiguous.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let s = raw.trim();
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err("empty duration".into());
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "expected a number at {rest:?}; use e.g. 30s, 20m, 1h30m"
            ));
        }
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| "number too large".to_owned())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| b.is_ascii_alphabetic()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let part = match unit {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            "d" => Duration::from_secs(n.saturating_mul(86_400)),
            "" => return Err("missing unit; use ms, s, m, h or d (e.g. 20m)".into()),
            other => return Err(format!("unknown unit {other:?}; use ms, s, m, h or d")),
        };
        total = total.checked_add(part).ok_or("duration too large")?;
    }
    Ok(total)
}

/// Parses a byte size: a number with an optional binary unit `k`, `m`, `g`, `t`
/// (also `kb`, `kib`, … in any case), as Docker does: `1g` is 1 GiB.
pub fn parse_size(raw: &str) -> Result<u64, String> {
    let s = raw.trim().to_ascii_lowercase();
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err("expected a number with an optional unit, e.g. 512m or 1g".into());
    }
    let n: u64 = s[..digits]
        .parse()
        .map_err(|_| "number too large".to_owned())?;
    let mult: u64 = match s[digits..].trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?}; use k, m, g or t")),
    };
    n.checked_mul(mult).ok_or_else(|| "size too large".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_the_variable_or_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "s3cret\n").unwrap();
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let k = key.to_str().unwrap();
        let e = empty.to_str().unwrap();
        let read = |pairs: &[(&str, &str)]| Env::from_pairs(pairs.to_vec()).secret_or_file("K");
        assert_eq!(read(&[]), Ok(None));
        assert_eq!(read(&[("K", "v")]), Ok(Some("v".into())));
        assert_eq!(read(&[("K_FILE", k)]), Ok(Some("s3cret".into())));
        for (pairs, var, what) in [
            (vec![("K", "v"), ("K_FILE", k)], "K_FILE", "set one"),
            (vec![("K", "")], "K", "empty"),
            (vec![("K_FILE", e)], "K_FILE", "empty"),
            (
                vec![("K_FILE", "/nonexistent/key")],
                "K_FILE",
                "No such file",
            ),
        ] {
            let err = read(&pairs).unwrap_err().to_string();
            assert!(err.starts_with(var) && err.contains(what), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration(" 2d "), Ok(Duration::from_secs(172_800)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    }

    #[test]
    fn bad_durations_say_why() {
        assert!(parse_duration("20").unwrap_err().contains("missing unit"));
        assert!(parse_duration("20x").unwrap_err().contains("unknown unit"));
        assert!(
            parse_duration("m")
                .unwrap_err()
                .contains("expected a number")
        );
        assert!(parse_duration("").is_err());
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("99999999999999999999999s").is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("64kib"), Ok(64 << 10));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert!(parse_size("1.5g").is_err());
        assert!(parse_size("g").is_err());
        assert!(parse_size("1p").unwrap_err().contains("unknown size unit"));
        assert!(parse_size("99999999999t").is_err());
    }

    #[test]
    fn errors_name_the_variable() {
        let env = Env::from_pairs([
            ("RUNED_RUN_TIMEOUT", "twenty"),
            ("MEM", "lots"),
            ("N", "x"),
            ("B", "maybe"),
            ("L", "nope"),
        ]);
        let e = env
            .duration_or("RUNED_RUN_TIMEOUT", Duration::ZERO)
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("RUNED_RUN_TIMEOUT=\"twenty\" is invalid")
        );
        assert!(
            env.size_or("MEM", 0)
                .unwrap_err()
                .to_string()
                .contains("MEM")
        );
        assert!(
            env.parse_or::<u32>("N", 1)
                .unwrap_err()
                .to_string()
                .contains("N=")
        );
        assert!(
            env.bool_or("B", false)
                .unwrap_err()
                .to_string()
                .contains("B=")
        );
        assert!(
            env.listen_addr_or("L", ":1")
                .unwrap_err()
                .to_string()
                .contains("L=")
        );
        assert_eq!(
            env.required("ABSENT").unwrap_err().to_string(),
            "ABSENT is required but not set"
        );
    }

    #[test]
    fn defaults_apply_and_empty_is_unset() {
        let env = Env::from_pairs([("EMPTY", "")]);
        assert_eq!(
            env.duration_or("EMPTY", Duration::from_secs(5)),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(env.parse_or("ABSENT", 7u32), Ok(7));
        assert!(env.required("EMPTY").is_err());
        assert_eq!(
            env.listen_addr_or("ABSENT", ":8080").unwrap().to_string(),
            "0.0.0.0:8080"
        );
    }
}
