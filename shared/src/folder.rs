//! Group folders: the validated names that become paths on the host.
//!
//! A folder is a `/`-separated path of at most [`MAX_DEPTH`] segments, each matching
//! `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`. Because a folder becomes `groups/<folder>/` on the
//! host, the grammar leaves no room for traversal: no `..`, no `.`, no empty or absolute
//! segments, ASCII only. No name is reserved: a folder's storage is a flat key of its own
//! (`crate::layout`), never a directory inside its parent's, so no folder can alias another
//! folder's directories or the host's.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The deepest folder path accepted.
pub const MAX_DEPTH: usize = 8;
/// The longest segment accepted.
pub const MAX_SEGMENT: usize = 64;

/// Why a folder name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FolderError {
    /// The name is empty.
    #[error("folder name is empty")]
    Empty,
    /// More than [`MAX_DEPTH`] segments.
    #[error("folder has {0} segments; at most {MAX_DEPTH} are allowed")]
    TooDeep(usize),
    /// A leading `/`, a trailing `/` or `//`.
    #[error("folder has an empty segment (leading, trailing or doubled '/')")]
    EmptySegment,
    /// `.` or `..`.
    #[error("folder segment {0:?} is a relative path component")]
    Traversal(String),
    /// A segment longer than [`MAX_SEGMENT`].
    #[error("folder segment is {0} bytes long; at most {MAX_SEGMENT} are allowed")]
    TooLong(usize),
    /// A character outside `[A-Za-z0-9_-]`, or a segment that starts with `_` or `-`.
    #[error(
        "folder segment {0:?} is invalid: use letters, digits, '_' and '-', starting with a letter or digit"
    )]
    BadSegment(String),
}

/// A validated group folder, such as `acme` or `acme/support`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupFolder(String);

impl GroupFolder {
    /// Validates `raw` as a group folder.
    pub fn new(raw: &str) -> Result<Self, FolderError> {
        validate(raw)?;
        Ok(Self(raw.to_owned()))
    }

    /// The folder as written, e.g. `acme/support`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The folder as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }

    /// The first segment: the folder's world (`acme` for `acme/support`).
    pub fn world(&self) -> &str {
        self.0.split('/').next().unwrap_or(&self.0)
    }

    /// The segments, outermost first.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether `self` equals `other` or is an ancestor of it (`a` contains `a/b`, not `ab`).
    pub fn contains(&self, other: &GroupFolder) -> bool {
        contains(&self.0, &other.0)
    }
}

/// The containment rule on raw names: `parent` equals `child` or is a `/`-prefix of it.
pub fn contains(parent: &str, child: &str) -> bool {
    match child.strip_prefix(parent) {
        Some("") => true,
        Some(rest) => rest.starts_with('/'),
        None => false,
    }
}

fn validate(raw: &str) -> Result<(), FolderError> {
    if raw.is_empty() {
        return Err(FolderError::Empty);
    }
    let depth = raw.split('/').count();
    if depth > MAX_DEPTH {
        return Err(FolderError::TooDeep(depth));
    }
    for seg in raw.split('/') {
        validate_segment(seg)?;
    }
    Ok(())
}

fn validate_segment(seg: &str) -> Result<(), FolderError> {
    if seg.is_empty() {
        return Err(FolderError::EmptySegment);
    }
    if seg == "." || seg == ".." {
        return Err(FolderError::Traversal(seg.to_owned()));
    }
    if seg.len() > MAX_SEGMENT {
        return Err(FolderError::TooLong(seg.len()));
    }
    let bytes = seg.as_bytes();
    let ok_first = bytes[0].is_ascii_alphanumeric();
    let ok_rest = bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-');
    if !ok_first || !ok_rest {
        return Err(FolderError::BadSegment(seg.to_owned()));
    }
    Ok(())
}

impl fmt::Display for GroupFolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for GroupFolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GroupFolder({:?})", self.0)
    }
}

impl std::str::FromStr for GroupFolder {
    type Err = FolderError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl AsRef<str> for GroupFolder {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Serialize for GroupFolder {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for GroupFolder {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        GroupFolder::new(&raw).map_err(serde::de::Error::custom)
    }
}

/// Read as the text it is (it cannot be changed through this).
impl std::ops::Deref for GroupFolder {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for GroupFolder {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for GroupFolder {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for GroupFolder {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for GroupFolder {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

/// Stored as its text.
#[cfg(feature = "db")]
impl rusqlite::types::ToSql for GroupFolder {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

/// Read back through the grammar: a row holding a bad folder is an error, not a folder.
#[cfg(feature = "db")]
impl rusqlite::types::FromSql for GroupFolder {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let raw = String::column_result(v)?;
        Self::new(&raw).map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for GroupFolder {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::openapi::string(
            "A group folder: 1-8 '/'-separated segments, each a letter or digit then up to 63 letters, digits, '_' or '-'",
            Some("^[A-Za-z0-9][A-Za-z0-9_-]{0,63}(/[A-Za-z0-9][A-Za-z0-9_-]{0,63}){0,7}$"),
            "acme/support",
        )
    }
}

#[cfg(feature = "openapi")]
impl utoipa::ToSchema for GroupFolder {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_and_nested() {
        for ok in [
            "main",
            "acme",
            "acme/support",
            "a-b_c/D9",
            "0",
            "x/y/z/1/2/3/4/5",
        ] {
            assert!(GroupFolder::new(ok).is_ok(), "{ok} should be accepted");
        }
        assert!(GroupFolder::new(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn rejects_traversal_and_absolute() {
        assert_eq!(
            GroupFolder::new(".."),
            Err(FolderError::Traversal("..".into()))
        );
        assert_eq!(
            GroupFolder::new("a/../b"),
            Err(FolderError::Traversal("..".into()))
        );
        assert_eq!(
            GroupFolder::new("./a"),
            Err(FolderError::Traversal(".".into()))
        );
        assert_eq!(GroupFolder::new("/etc"), Err(FolderError::EmptySegment));
        assert_eq!(GroupFolder::new("a/"), Err(FolderError::EmptySegment));
        assert_eq!(GroupFolder::new("a//b"), Err(FolderError::EmptySegment));
        assert!(GroupFolder::new("a\\..\\b").is_err());
        assert!(GroupFolder::new("..%2f").is_err());
        assert!(GroupFolder::new("a\0b").is_err());
        assert_eq!(GroupFolder::new(""), Err(FolderError::Empty));
    }

    #[test]
    fn host_names_are_ordinary_folder_names() {
        // The flat layout leaves nothing to alias: these were reserved in the nested one.
        for ok in [
            "global",
            "share",
            "acme/share",
            "a/input",
            "a/env",
            "a/sidecars",
        ] {
            assert!(GroupFolder::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_unicode_and_odd_characters() {
        for bad in [
            "café",
            "ｍａｉｎ",
            "grüppe/x",
            "a b",
            "a:b",
            "-a",
            "_a",
            "a.b",
            "a\nb",
            "😀",
        ] {
            assert!(
                matches!(GroupFolder::new(bad), Err(FolderError::BadSegment(_))),
                "{bad:?} should be a bad segment"
            );
        }
    }

    #[test]
    fn rejects_overlong_and_too_deep() {
        assert_eq!(
            GroupFolder::new(&"a".repeat(65)),
            Err(FolderError::TooLong(65))
        );
        assert_eq!(
            GroupFolder::new("a/b/c/d/e/f/g/h/i"),
            Err(FolderError::TooDeep(9))
        );
        // A huge input is refused without pathological cost.
        assert!(GroupFolder::new(&"a/".repeat(100_000)).is_err());
    }

    #[test]
    fn containment_is_by_segment() {
        let a = GroupFolder::new("a").unwrap();
        let ab = GroupFolder::new("a/b").unwrap();
        let ab2 = GroupFolder::new("ab").unwrap();
        assert!(a.contains(&a));
        assert!(a.contains(&ab));
        assert!(!a.contains(&ab2));
        assert!(!ab.contains(&a));
        assert_eq!(ab.world(), "a");
    }

    #[test]
    fn serde_validates() {
        assert!(serde_json::from_str::<GroupFolder>("\"../x\"").is_err());
        let f: GroupFolder = serde_json::from_str("\"a/b\"").unwrap();
        assert_eq!(serde_json::to_string(&f).unwrap(), "\"a/b\"");
    }
}
