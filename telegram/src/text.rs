//! Text for Telegram: long replies split at its limit.

/// Telegram's limit on one message's text, in UTF-16 code units.
pub const LIMIT: usize = 4096;

/// `text` in parts of at most `limit` UTF-16 code units, in order, cut at the last line
/// break inside the limit, else the last white space, else anywhere (never inside a
/// character). The break a cut falls on is dropped (the parts are separate messages); no
/// other character is lost.
pub fn split(text: &str, limit: usize) -> Vec<String> {
    let mut parts = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        // The byte index up to which `rest` fits.
        let mut units = 0;
        let mut fit = rest.len();
        for (i, c) in rest.char_indices() {
            units += c.len_utf16();
            if units > limit {
                fit = i;
                break;
            }
        }
        if fit == rest.len() {
            parts.push(rest.to_owned());
            break;
        }
        let head = &rest[..fit];
        let (cut, skip) = match head.rfind('\n') {
            Some(i) if i > 0 => (i, 1),
            _ => match head.rfind(char::is_whitespace) {
                Some(i) if i > 0 => {
                    let w = head[i..].chars().next().map_or(1, char::len_utf8);
                    (i, w)
                }
                _ => (fit, 0),
            },
        };
        parts.push(rest[..cut].to_owned());
        rest = &rest[cut + skip..];
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_part() {
        assert_eq!(split("hello", LIMIT), vec!["hello"]);
    }

    #[test]
    fn long_text_splits_on_lines_in_order() {
        let lines: Vec<String> = (0..120)
            .map(|i| format!("{i:04} {}", "x".repeat(95)))
            .collect();
        let text = lines.join("\n");
        let parts = split(&text, LIMIT);
        assert_eq!(parts.len(), 3);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= LIMIT));
        assert_eq!(parts.join("\n"), text);
    }

    #[test]
    fn no_break_cuts_anywhere_but_inside_a_character() {
        let text = "é".repeat(5000);
        let parts = split(&text, LIMIT);
        assert_eq!(parts.len(), 2);
        assert_eq!(parts.concat(), text);
        let emoji = "😀".repeat(3000); // two units each
        let parts = split(&emoji, LIMIT);
        assert!(parts.iter().all(|p| p.encode_utf16().count() <= LIMIT));
        assert_eq!(parts.concat(), emoji);
    }
}
