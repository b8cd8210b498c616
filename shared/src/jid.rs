//! Chat JIDs: the names channels give their chats (`tg:42`, `web:team`, `wa:123@s.whatsapp.net`).
//! Channels choose them, so their grammar is loose: 1 to [`MAX_JID`] characters, none of them
//! a control character (which would break a log line or a header). routd checks each one once,
//! where it comes in; its rows then hold a [`ChatJid`], never a bare string that could be a
//! folder or a pattern.

use std::fmt;

/// The longest chat JID (or route pattern) accepted, in characters.
pub const MAX_JID: usize = 256;

/// Why a chat JID was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JidError {
    /// Empty, or longer than [`MAX_JID`] characters.
    #[error("must be 1-{MAX_JID} characters")]
    Length,
    /// A control character.
    #[error("holds a control character")]
    Control,
}

/// Checks a chat JID or a route pattern against the grammar.
pub fn check(raw: &str) -> Result<(), JidError> {
    if raw.is_empty() || raw.chars().count() > MAX_JID {
        return Err(JidError::Length);
    }
    if raw.chars().any(char::is_control) {
        return Err(JidError::Control);
    }
    Ok(())
}

/// A validated chat JID.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChatJid(String);

impl ChatJid {
    /// Validates `raw` as a chat JID.
    pub fn new(raw: impl Into<String>) -> Result<Self, JidError> {
        let raw = raw.into();
        check(&raw)?;
        Ok(Self(raw))
    }

    /// The direct chat of a folder, `web:<folder>`: through the grammar like any JID (a
    /// folder may be 519 characters long, its chat at most 256).
    pub fn web(folder: &crate::GroupFolder) -> Result<Self, JidError> {
        Self::new(format!("web:{folder}"))
    }

    /// The JID as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The JID as an owned string.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for ChatJid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(&self.0)
    }
}

impl fmt::Debug for ChatJid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ChatJid({:?})", self.0)
    }
}

/// Read as the text it is (it cannot be changed through this).
impl std::ops::Deref for ChatJid {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ChatJid {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ChatJid {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for ChatJid {
    type Err = JidError;
    fn from_str(s: &str) -> Result<Self, JidError> {
        Self::new(s)
    }
}

impl PartialEq<str> for ChatJid {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ChatJid {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ChatJid {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<ChatJid> for str {
    fn eq(&self, other: &ChatJid) -> bool {
        *self == other.0
    }
}

impl PartialEq<ChatJid> for &str {
    fn eq(&self, other: &ChatJid) -> bool {
        **self == other.0
    }
}

impl PartialEq<ChatJid> for String {
    fn eq(&self, other: &ChatJid) -> bool {
        *self == other.0
    }
}

impl serde::Serialize for ChatJid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for ChatJid {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        ChatJid::new(raw).map_err(|e| serde::de::Error::custom(format!("chat_jid {e}")))
    }
}

/// Stored as its text.
#[cfg(feature = "db")]
impl rusqlite::types::ToSql for ChatJid {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

/// Read back through the grammar: a row holding a bad JID is an error, not a JID.
#[cfg(feature = "db")]
impl rusqlite::types::FromSql for ChatJid {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        let raw = String::column_result(v)?;
        Self::new(raw).map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jid_is_one_to_256_characters_without_controls() {
        for ok in [
            "tg:42",
            "web:team",
            "wa:123@s.whatsapp.net",
            "ü",
            &"é".repeat(256),
        ] {
            assert_eq!(ChatJid::new(ok).unwrap(), ok);
        }
        assert_eq!(ChatJid::new(""), Err(JidError::Length));
        assert_eq!(ChatJid::new("x".repeat(257)), Err(JidError::Length));
        for bad in ["tg:4\n2", "a\u{0}b", "\u{7f}", "x\u{85}"] {
            assert_eq!(ChatJid::new(bad), Err(JidError::Control), "{bad:?}");
        }
    }

    /// The deepest, longest folder is a valid folder whose `web:` chat is not a valid JID:
    /// the chat is refused, never stored to fail when read back.
    #[test]
    fn a_folders_web_chat_is_held_to_the_jid_grammar() {
        let short = crate::GroupFolder::new("acme/support").unwrap();
        assert_eq!(ChatJid::web(&short).unwrap(), "web:acme/support");
        let long = crate::GroupFolder::new(&vec!["a".repeat(64); 8].join("/")).unwrap();
        assert_eq!(ChatJid::web(&long), Err(JidError::Length));
    }
}
