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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        for ok in ["t", "turn-1", "a.b:c_d", &"x".repeat(MAX_ID)] {
            assert!(is_valid_id(ok), "{ok}");
        }
        for bad in ["", "a@b", "a b", "a/b", "ü", &"x".repeat(MAX_ID + 1)] {
            assert!(!is_valid_id(bad), "{bad}");
        }
    }
}
