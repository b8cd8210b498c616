//! Reading and parsing what the host sends: the stdin line and follow-up files.

use std::io::Read;

use hako_shared::contract::{ContainerInput, FollowUp};
use thiserror::Error;

/// Upper bound of the stdin line and of one follow-up file.
pub const MAX_INPUT_BYTES: usize = 16 * 1024 * 1024;

/// Why the input could not be used. Messages never quote the input: it holds the token and
/// the secrets.
#[derive(Debug, Error)]
pub enum InputError {
    /// Nothing arrived before EOF.
    #[error("no input: stdin closed before a JSON line arrived")]
    Empty,
    /// More than [`MAX_INPUT_BYTES`] before the end of the line.
    #[error("input larger than {MAX_INPUT_BYTES} bytes")]
    TooLarge,
    /// Reading failed.
    #[error("reading the input failed: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not the expected JSON.
    #[error("invalid input JSON ({0})")]
    Json(String),
}

/// Reads one line (up to `\n` or EOF) of at most `max` bytes, without the newline.
/// Bytes after the newline are ignored: stdin carries exactly one line.
pub fn read_line_bounded(mut r: impl Read, max: usize) -> Result<Vec<u8>, InputError> {
    let mut line = Vec::new();
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        let chunk = &buf[..n];
        let (part, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (&chunk[..i], true),
            None => (chunk, false),
        };
        if line.len() + part.len() > max {
            return Err(InputError::TooLarge);
        }
        line.extend_from_slice(part);
        if done {
            break;
        }
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        return Err(InputError::Empty);
    }
    Ok(line)
}

/// A serde_json error reduced to its category and position. serde's messages can quote parts
/// of the input ("invalid type: string \"…\""), which may be a secret.
pub fn describe_json_error(e: &serde_json::Error) -> String {
    let kind = match e.classify() {
        serde_json::error::Category::Io => "I/O error",
        serde_json::error::Category::Syntax => "syntax error",
        serde_json::error::Category::Data => "unexpected structure",
        serde_json::error::Category::Eof => "unexpected end",
    };
    format!("{kind} at line {} column {}", e.line(), e.column())
}

/// Parses the stdin line.
pub fn parse_input(line: &[u8]) -> Result<ContainerInput, InputError> {
    serde_json::from_slice(line).map_err(|e| InputError::Json(describe_json_error(&e)))
}

/// Parses a follow-up file.
pub fn parse_follow_up(bytes: &[u8]) -> Result<FollowUp, InputError> {
    serde_json::from_slice(bytes).map_err(|e| InputError::Json(describe_json_error(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_one_line_and_ignores_the_rest() {
        let got = read_line_bounded(&b"{\"a\":1}\nmore stuff\n"[..], 100).unwrap();
        assert_eq!(got, b"{\"a\":1}");
        let got = read_line_bounded(&b"{}"[..], 100).unwrap();
        assert_eq!(got, b"{}");
    }

    #[test]
    fn bounds_and_empty() {
        assert!(matches!(
            read_line_bounded(&[b'x'; 101][..], 100),
            Err(InputError::TooLarge)
        ));
        assert!(read_line_bounded(&[b'x'; 100][..], 100).is_ok());
        assert!(matches!(
            read_line_bounded(&b""[..], 100),
            Err(InputError::Empty)
        ));
        assert!(matches!(
            read_line_bounded(&b"  \n{}"[..], 100),
            Err(InputError::Empty)
        ));
    }

    #[test]
    fn json_errors_never_quote_the_input() {
        let bad = br#"{"secrets": ["sk-canary-123"], "messages": []}"#;
        let msg = parse_input(bad).unwrap_err().to_string();
        assert!(!msg.contains("sk-canary"), "{msg}");
        assert!(msg.contains("line 1"), "{msg}");
        let bad = br#"{"token": 12, "x": "sk-canary-123"}"#;
        let msg = parse_input(bad).unwrap_err().to_string();
        assert!(!msg.contains("sk-canary"), "{msg}");
    }

    #[test]
    fn follow_up() {
        assert_eq!(
            parse_follow_up(br#"{"content":"hi"}"#).unwrap().content,
            "hi"
        );
        assert!(parse_follow_up(b"hi").is_err());
        assert!(parse_follow_up(br#"{"text":"hi"}"#).is_err());
    }
}
