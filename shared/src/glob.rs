//! The one glob of hako: route patterns (chat JIDs) and grant targets match with it.

/// Whether `text` matches `pattern`: `*` is any run of characters (none included), `?` one
/// character, anything else itself. Iterative, linear in practice (one backtrack point).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        for (p, t, m) in [
            ("tg:123", "tg:123", true),
            ("tg:123", "tg:1234", false),
            ("tg:*", "tg:", true),
            ("tg:*", "tg:-100123", true),
            ("*", "anything", true),
            ("tg:?23", "tg:123", true),
            ("tg:?23", "tg:23", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("*@g.us", "123@g.us", true),
            ("", "", true),
            ("", "x", false),
        ] {
            assert_eq!(glob(p, t), m, "{p} ~ {t}");
        }
        // A pathological pattern stays fast.
        let t = "a".repeat(10_000);
        assert!(!glob(&format!("{}b", "*a".repeat(50)), &t));
    }
}
