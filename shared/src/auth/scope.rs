//! The one scope grammar of hako.
//!
//! A scope is `resource:verb`. Both parts are lowercase ASCII names (`[a-z][a-z0-9_-]{0,31}`);
//! the verb may also be `*`. A held `res:*` covers every verb of `res` (and a requested
//! `res:*`); a held `res:verb` covers exactly itself. Anything else, including a bare `*` or
//! `*:verb`, is not a scope and covers nothing: a malformed scope in a token can never widen it.

/// Longest resource or verb name accepted.
pub const MAX_PART: usize = 32;

/// The grammar as a regular expression, for API documents ([`validate`] is what decides).
pub const PATTERN: &str = "^[a-z][a-z0-9_-]{0,31}:([a-z][a-z0-9_-]{0,31}|[*])$";

/// A list of at least one scope, as API documents show it.
#[cfg(feature = "openapi")]
pub fn list_schema() -> utoipa::openapi::schema::Array {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(PATTERN)),
        )
        .min_items(Some(1))
        .build()
}

/// Why a scope string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    /// Not of the form `resource:verb`.
    #[error("scope {0:?} is not of the form resource:verb")]
    Shape(String),
    /// The resource part is not a name.
    #[error("scope {0:?} has an invalid resource: use [a-z][a-z0-9_-], at most 32 characters")]
    Resource(String),
    /// The verb part is neither a name nor `*`.
    #[error("scope {0:?} has an invalid verb: use [a-z][a-z0-9_-], at most 32 characters, or *")]
    Verb(String),
}

/// A parsed scope, borrowing its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    /// The resource, e.g. `runs`.
    pub resource: &'a str,
    /// The verb, e.g. `read`, or `*`.
    pub verb: &'a str,
}

impl<'a> Scope<'a> {
    /// Parses and validates `raw`.
    pub fn parse(raw: &'a str) -> Result<Self, ScopeError> {
        let (resource, verb) = raw
            .split_once(':')
            .ok_or_else(|| ScopeError::Shape(clip(raw)))?;
        if !is_name(resource) {
            return Err(ScopeError::Resource(clip(raw)));
        }
        if verb != "*" && !is_name(verb) {
            return Err(ScopeError::Verb(clip(raw)));
        }
        Ok(Self { resource, verb })
    }

    /// Whether this held scope covers `wanted`.
    pub fn covers(&self, wanted: &Scope<'_>) -> bool {
        self.resource == wanted.resource && (self.verb == "*" || self.verb == wanted.verb)
    }
}

/// Keeps error messages bounded when a caller sends a huge string.
fn clip(raw: &str) -> String {
    raw.chars().take(80).collect()
}

fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_PART
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'_' || *c == b'-')
}

/// Validates a scope string.
pub fn validate(raw: &str) -> Result<(), ScopeError> {
    Scope::parse(raw).map(drop)
}

/// Whether the held scope `held` covers `wanted`. Malformed strings on either side cover
/// nothing.
pub fn covers(held: &str, wanted: &str) -> bool {
    match (Scope::parse(held), Scope::parse(wanted)) {
        (Ok(h), Ok(w)) => h.covers(&w),
        _ => false,
    }
}

/// Whether any scope in `held` covers `wanted`.
pub fn any_covers<S: AsRef<str>>(held: &[S], wanted: &str) -> bool {
    let Ok(w) = Scope::parse(wanted) else {
        return false;
    };
    held.iter()
        .filter_map(|h| Scope::parse(h.as_ref()).ok())
        .any(|h| h.covers(&w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_wildcard_verbs() {
        assert!(covers("runs:read", "runs:read"));
        assert!(!covers("runs:read", "runs:run"));
        assert!(covers("runs:*", "runs:read"));
        assert!(covers("runs:*", "runs:kill"));
        assert!(covers("runs:*", "runs:*"));
        // A single verb never covers the wildcard.
        assert!(!covers("runs:read", "runs:*"));
        // Resources must match exactly, not by prefix.
        assert!(!covers("runs:*", "runsx:read"));
        assert!(!covers("run:*", "runs:read"));
    }

    #[test]
    fn bare_star_and_malformed_cover_nothing() {
        for held in [
            "*",
            "*:*",
            "*:read",
            ":",
            "runs",
            "runs:",
            ":read",
            "Runs:read",
            "",
        ] {
            assert!(!covers(held, "runs:read"), "{held:?} must cover nothing");
            assert!(validate(held).is_err(), "{held:?} must be invalid");
        }
        assert!(!any_covers(&["*", "runs"], "runs:read"));
        assert!(any_covers(&["*", "runs:*"], "runs:read"));
        // A malformed wanted scope is never covered.
        assert!(!covers("runs:*", "runs:read:x"));
    }

    #[test]
    fn grammar() {
        for ok in [
            "runs:read",
            "a:b",
            "egress:connect",
            "llm:call",
            "x-y_1:z-2_",
            "keys:*",
        ] {
            assert!(validate(ok).is_ok(), "{ok}");
        }
        assert!(matches!(validate("runs"), Err(ScopeError::Shape(_))));
        assert!(matches!(
            validate("1runs:read"),
            Err(ScopeError::Resource(_))
        ));
        assert!(matches!(validate("runs:READ"), Err(ScopeError::Verb(_))));
        assert!(matches!(validate("runs:re ad"), Err(ScopeError::Verb(_))));
        assert!(matches!(validate("runs:a:b"), Err(ScopeError::Verb(_))));
        assert!(validate(&format!("{}:read", "a".repeat(33))).is_err());
        assert!(validate(&format!("{}:read", "a".repeat(32))).is_ok());
        assert!(validate("rüns:read").is_err());
        // Error text stays short even for huge input.
        let e = validate(&"x".repeat(100_000)).unwrap_err().to_string();
        assert!(e.len() < 200);
    }
}
