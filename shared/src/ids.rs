//! The grammar of the ids that travel between daemons (`turn_id`, `run_id`): one definition,
//! so an id one daemon accepts is never refused by the next (runed once accepted `@` in a
//! turn id that authd's mint refused, so the run was accepted and then failed).

/// The longest id accepted.
pub const MAX_ID: usize = 128;

/// What an id may hold, for error messages.
pub const ID_GRAMMAR: &str = "1-128 characters of letters, digits, '-', '_', '.', ':'";

/// Whether `s` is a valid turn or run id: 1 to [`MAX_ID`] characters of `[A-Za-z0-9._:-]`.
pub fn is_valid_id(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_ID
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

/// A fresh random id: `prefix` then `2 * bytes` hex digits (`random_id("m-", 12)`). The one
/// constructor of every random id and name hako makes. Without an OS entropy source (the
/// only way getrandom fails) the digits come from the clock and a process-wide counter run
/// through a mixer: unique within the process and never all zeros, where the fallbacks this
/// replaced gave every id the same zeros.
pub fn random_id(prefix: &str, bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    if getrandom::fill(&mut b).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let mut state = nanos ^ N.fetch_add(1, Ordering::Relaxed).rotate_left(32);
        for chunk in b.chunks_mut(8) {
            state = splitmix64(state);
            chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
        }
    }
    hex(prefix, &b)
}

/// `bytes` bytes from the OS's entropy source, as hex: what a secret is made of (a web
/// session's value, its CSRF token). Unlike [`random_id`] it has no fallback: without
/// entropy it fails, and its caller refuses what it was asked to do.
pub fn random_secret(bytes: usize) -> Result<String, getrandom::Error> {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b)?;
    Ok(hex("", &b))
}

fn hex(prefix: &str, b: &[u8]) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(prefix.len() + 2 * b.len());
    out.push_str(prefix);
    for x in b {
        let _ = write!(out, "{x:02x}");
    }
    out
}

/// SplitMix64's step: a bijection, so distinct inputs give distinct outputs.
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A string that failed the id grammar.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {ID_GRAMMAR}")]
pub struct InvalidId {
    /// `turn id` or `run id`.
    pub kind: &'static str,
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $example:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Validates `raw` against the id grammar.
            pub fn new(raw: impl Into<String>) -> Result<Self, InvalidId> {
                let raw = raw.into();
                if is_valid_id(&raw) {
                    Ok(Self(raw))
                } else {
                    Err(InvalidId { kind: $kind })
                }
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id as an owned string.
            pub fn into_string(self) -> String {
                self.0
            }

            /// A fresh id: `prefix` (a constant of the code, in the grammar: `run-`, `ap-`)
            /// and `2 * bytes` hex digits.
            pub fn random(prefix: &'static str, bytes: usize) -> Self {
                let id = random_id(prefix, bytes);
                debug_assert!(is_valid_id(&id), "{id}");
                Self(id)
            }
        }

        /// Padded as text is (`{:<24}` in the CLI's tables).
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(&self.0)
            }
        }

        /// Read as the text it is (it cannot be changed through this).
        impl std::ops::Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = InvalidId;
            fn from_str(s: &str) -> Result<Self, InvalidId> {
                Self::new(s)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                crate::openapi::string(
                    concat!("A ", $kind, ": 1-128 letters, digits, '-', '_', '.', ':'"),
                    Some("^[A-Za-z0-9._:-]{1,128}$"),
                    $example,
                )
            }
        }

        #[cfg(feature = "openapi")]
        impl utoipa::ToSchema for $name {}

        /// Stored as its text.
        #[cfg(feature = "db")]
        impl rusqlite::types::ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                self.0.to_sql()
            }
        }

        /// Read back through the grammar: a row holding a bad id is an error, not an id.
        #[cfg(feature = "db")]
        impl rusqlite::types::FromSql for $name {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                let raw = String::column_result(v)?;
                Self::new(raw).map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let raw = String::deserialize(d)?;
                Self::new(raw).map_err(serde::de::Error::custom)
            }
        }
    };
}

id_type!(
    /// The id of a turn (one chat turn, chosen by its caller; runs are idempotent on it within
    /// a folder).
    TurnId,
    "turn id",
    "turn-42"
);
id_type!(
    /// The id of a run (chosen by runed).
    RunId,
    "run id",
    "run-0f3a9c2e7b41d856"
);

id_type!(
    /// The id of an approval request (`ap-` and hex digits, made by routd): what `/approve`
    /// and `/deny` name.
    ApprovalId,
    "approval id",
    "ap-3f9a1c0b2e7d"
);
id_type!(
    /// The id of a message in a chat's log: the sender's (a chat adapter's, idempotent on it)
    /// or one routd makes (`m-…`, a reply's `<turn>.<try>.<block>`).
    MessageId,
    "message id",
    "tg:42:1001"
);
id_type!(
    /// The id of a scheduled task (`task-` and hex digits, made by routd).
    TaskId,
    "task id",
    "task-0a1b2c3d4e5f"
);

/// Try `attempt` of routd's turn `turn`: what runed knows as its turn, `<turn>.<attempt>`
/// (routd asks runed for one run per try, and runed is idempotent on its turn id). The one
/// place that packs and parses it: routd's run request, and the spawn token's `turn_id` claim
/// that the gateway and the tool API read back to find the turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TurnTry {
    turn: TurnId,
    attempt: u32,
}

impl TurnTry {
    /// Try `attempt` of `turn`; refused when the packed id would pass [`MAX_ID`] (routd's
    /// turn ids, `t-` and 24 hex digits, always fit).
    pub fn new(turn: TurnId, attempt: u32) -> Result<Self, InvalidId> {
        let digits = attempt.checked_ilog10().unwrap_or(0) as usize + 1;
        if turn.len() + 1 + digits > MAX_ID {
            return Err(InvalidId { kind: "turn id" });
        }
        Ok(TurnTry { turn, attempt })
    }

    /// `<turn>.<attempt>`: a turn id followed by `.` and the try's digits (no leading zero,
    /// so the text is the one this type writes). Anything else, a bare turn id included, is
    /// refused: a claim that does not parse matches no turn.
    pub fn parse(s: &str) -> Result<Self, InvalidId> {
        let bad = || InvalidId { kind: "turn id" };
        let (turn, attempt) = s.rsplit_once('.').ok_or_else(bad)?;
        let canonical = !attempt.is_empty()
            && attempt.bytes().all(|b| b.is_ascii_digit())
            && (attempt == "0" || !attempt.starts_with('0'));
        if !canonical {
            return Err(bad());
        }
        let attempt = attempt.parse().map_err(|_| bad())?;
        // The whole text is in the grammar, so the turn (shorter) is too, and the pair fits.
        TurnId::new(s).map_err(|_| bad())?;
        TurnTry::new(TurnId::new(turn)?, attempt)
    }

    /// routd's turn.
    pub fn turn(&self) -> &TurnId {
        &self.turn
    }

    /// routd's turn, owned.
    pub fn into_turn(self) -> TurnId {
        self.turn
    }

    /// The try, from 1.
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The turn id runed knows this try by.
    pub fn runed_turn(&self) -> TurnId {
        let id = self.to_string();
        debug_assert!(is_valid_id(&id), "{id}");
        TurnId(id)
    }
}

impl std::fmt::Display for TurnTry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.turn, self.attempt)
    }
}

impl std::str::FromStr for TurnTry {
    type Err = InvalidId;
    fn from_str(s: &str) -> Result<Self, InvalidId> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_valid_and_distinct() {
        let a = random_id("m-", 12);
        assert_eq!(a.len(), 2 + 24);
        assert!(a.starts_with("m-") && is_valid_id(&a), "{a}");
        let many: std::collections::HashSet<String> = (0..1000).map(|_| random_id("", 8)).collect();
        assert_eq!(many.len(), 1000);
        assert_ne!(random_id("", 8), "0".repeat(16));
        let secret = random_secret(32).unwrap();
        assert_eq!(secret.len(), 64);
        assert!(secret.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(secret, random_secret(32).unwrap());
    }

    #[test]
    fn grammar() {
        for ok in ["t", "turn-1", "a.b:c_d", &"x".repeat(MAX_ID)] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in ["", "a@b", "a b", "a/b", "ü", &"x".repeat(MAX_ID + 1)] {
            assert!(!is_valid_id(bad), "{bad}");
            assert!(TurnId::new(bad).is_err());
        }
    }

    #[test]
    fn the_types_validate_on_the_wire() {
        let t: TurnId = serde_json::from_str("\"turn-1\"").unwrap();
        assert_eq!(t.as_str(), "turn-1");
        assert_eq!(serde_json::to_string(&t).unwrap(), "\"turn-1\"");
        let e = serde_json::from_str::<TurnId>("\"user@chat\"").unwrap_err();
        assert!(e.to_string().contains("invalid turn id"), "{e}");
        assert!(serde_json::from_str::<RunId>("\"\"").is_err());
    }

    #[test]
    fn a_try_packs_and_parses_in_one_place() {
        let t = TurnTry::new(TurnId::new("t-0123456789abcdef01234567").unwrap(), 3).unwrap();
        assert_eq!(t.to_string(), "t-0123456789abcdef01234567.3");
        assert_eq!(t.runed_turn(), "t-0123456789abcdef01234567.3");
        assert_eq!(TurnTry::parse(&t.to_string()).unwrap(), t);
        let p: TurnTry = "a.b.3".parse().unwrap();
        assert_eq!((p.turn().as_str(), p.attempt()), ("a.b", 3));
        assert_eq!(TurnTry::parse("a.0").unwrap().attempt(), 0);
        for bad in [
            "x",
            "x.",
            "x.y",
            ".3",
            "x.03",
            "x.-3",
            "x.+3",
            "x.3 ",
            "a@b.3",
            "x.4294967296",
            "",
        ] {
            assert!(TurnTry::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_packed_try_is_always_a_turn_id() {
        // routd's turn ids with the largest try.
        let routd = TurnId::new(random_id("t-", 12)).unwrap();
        let t = TurnTry::new(routd, u32::MAX).unwrap();
        assert!(is_valid_id(&t.to_string()));
        // Up to the longest id: the turn leaves room for the dot and the digits, or is refused.
        let longest = TurnId::new("x".repeat(MAX_ID - 2)).unwrap();
        let t = TurnTry::new(longest.clone(), 9).unwrap();
        assert_eq!(t.runed_turn().len(), MAX_ID);
        assert_eq!(TurnTry::parse(&t.to_string()).unwrap(), t);
        assert!(TurnTry::new(longest, 10).is_err());
        assert!(TurnTry::parse(&format!("{}.1", "x".repeat(MAX_ID - 1))).is_err());
    }
}
