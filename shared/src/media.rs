//! Files a chat sends its agent (photos, voice notes, documents): a chat adapter uploads each
//! to routd (`PUT /v1/chats/{jid}/media/{name}`), routd hands it to runed for the folder the
//! chat routes to (`PUT /v1/folders/{folder}/media/{name}`), and runed writes it into the
//! folder's workspace, where the agent finds it at [`IN_BOX`]`/<name>`. The message that
//! carries it names that path. One file name rule for all three, here.

use serde::{Deserialize, Serialize};

/// The media directory, relative to the folder's workspace.
pub const DIR: &str = "media";

/// Where the agent sees the media directory.
pub const IN_BOX: &str = "/workspace/media";

/// The longest file name accepted.
pub const MAX_NAME: usize = 128;

/// The name rule, for error messages.
pub const NAME_GRAMMAR: &str =
    "1-128 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit";

/// Checks a media file name: one plain path component the agent's tools take without
/// quoting, never hidden, never `.` or `..`.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!("media name {name:?}: {NAME_GRAMMAR}"))
    }
}

/// `name` made to pass [`check_name`]: other characters become `_`, a leading one that is
/// not a letter or digit is dropped, and it is cut to [`MAX_NAME`] keeping its extension.
/// `None` when nothing of it is left.
pub fn sanitize_name(name: &str) -> Option<String> {
    let mapped: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let trimmed = mapped.trim_start_matches(|c: char| !c.is_ascii_alphanumeric());
    if trimmed.is_empty() {
        return None;
    }
    let out = if trimmed.len() <= MAX_NAME {
        trimmed.to_owned()
    } else {
        let ext = trimmed
            .rsplit_once('.')
            .map(|(_, e)| e)
            .filter(|e| e.len() <= 16)
            .unwrap_or("");
        let keep = MAX_NAME - if ext.is_empty() { 0 } else { ext.len() + 1 };
        let mut s = trimmed[..keep].to_owned();
        if !ext.is_empty() {
            s.push('.');
            s.push_str(ext);
        }
        s
    };
    check_name(&out).ok().map(|()| out)
}

/// A file saved to a folder's media directory (routd's and runed's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct MediaSaved {
    /// The folder it went to.
    pub folder: String,
    /// Its file name.
    pub name: String,
    /// Where the agent finds it.
    pub path: String,
    /// Its size.
    pub bytes: u64,
}

impl MediaSaved {
    /// The answer for `name` saved to `folder`.
    pub fn new(folder: &str, name: &str, bytes: u64) -> MediaSaved {
        MediaSaved {
            folder: folder.to_owned(),
            name: name.to_owned(),
            path: format!("{IN_BOX}/{name}"),
            bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in [
            "a",
            "tg111_1001.jpg",
            "Report-2026.v2.pdf",
            &"x".repeat(128),
        ] {
            check_name(ok).unwrap();
        }
        for bad in [
            "",
            ".",
            "..",
            ".hidden",
            "-x",
            "a/b",
            "../etc",
            "a b",
            "ä",
            "a\0",
            &"x".repeat(129),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn sanitized_names_pass_and_keep_their_extension() {
        assert_eq!(
            sanitize_name("My Report (1).pdf").unwrap(),
            "My_Report__1_.pdf"
        );
        assert_eq!(sanitize_name("../../etc/passwd").unwrap(), "etc_passwd");
        assert_eq!(sanitize_name("...").as_deref(), None);
        assert_eq!(sanitize_name("").as_deref(), None);
        let long = format!("{}.tar.gz", "a".repeat(300));
        let s = sanitize_name(&long).unwrap();
        assert_eq!(s.len(), MAX_NAME);
        assert!(s.ends_with(".gz"), "{s}");
        check_name(&s).unwrap();
        assert_eq!(sanitize_name("фото.jpg").unwrap(), "jpg");
    }
}
