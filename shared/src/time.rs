//! Timestamps as text, without a calendar dependency: RFC 3339 in UTC with milliseconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch.
pub fn unix_millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_millis() as i64,
        Err(e) => -(e.duration().as_millis() as i64),
    }
}

/// The time `ms` milliseconds after the epoch.
pub fn from_unix_millis(ms: i64) -> SystemTime {
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms as u64)
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

/// `2026-11-23T13:38:00.123Z`.
pub fn rfc3339(t: SystemTime) -> String {
    let ms = unix_millis(t);
    let (days, rem) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (y, m, d) = civil_from_days(days);
    let (h, min, s, milli) = (
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000,
    );
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{min:02}:{s:02}.{milli:03}Z")
}

/// `20261123T133800.123Z`: sortable and safe in file names.
pub fn compact(t: SystemTime) -> String {
    rfc3339(t).replace(['-', ':'], "")
}

/// Parses RFC 3339 (`2026-11-23T13:38:00Z`, optional fraction, `Z` or `±HH:MM`, a space for
/// the `T` accepted) to Unix milliseconds; `None` when it is not that or not a real instant.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().ok()
        } else {
            None
        }
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut millis = 0;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        let frac = s.get(start..i)?;
        if frac.is_empty() {
            return None;
        }
        millis = format!("{:0<3}", &frac[..frac.len().min(3)]).parse().ok()?;
    }
    let offset_min = match b.get(i)? {
        b'Z' | b'z' if i + 1 == b.len() => 0,
        sign @ (b'+' | b'-') if i + 6 == b.len() && b[i + 3] == b':' => {
            let m = num(i + 1..i + 3)? * 60 + num(i + 4..i + 6)?;
            if *sign == b'-' { -m } else { m }
        }
        _ => return None,
    };
    if !(1..=12).contains(&mo) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    if d < 1 || d > i64::from(days_in_month(y, mo as u32)) {
        return None;
    }
    let days = days_from_civil(y, mo as u32, d as u32);
    Some(((days * 86_400 + h * 3600 + mi * 60 + sec.min(59)) - offset_min * 60) * 1000 + millis)
}

/// The number of days of `month` (1-12) in `year`.
pub fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since the epoch of a civil date (Howard Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date (year, month, day) of a day since the epoch (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(from_unix_millis(951_782_400_000)),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            rfc3339(from_unix_millis(1_795_441_080_123)),
            "2026-11-23T13:38:00.123Z"
        );
        assert_eq!(
            compact(from_unix_millis(1_795_441_080_123)),
            "20261123T133800.123Z"
        );
        assert_eq!(unix_millis(from_unix_millis(-5)), -5);
    }

    #[test]
    fn parses_what_it_formats_and_offsets() {
        for ms in [0, 951_782_400_000, 1_795_441_080_123, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339(&rfc3339(from_unix_millis(ms))), Some(ms));
        }
        assert_eq!(
            parse_rfc3339("2026-11-23T14:38:00+01:00"),
            Some(1_795_441_080_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-23 13:38:00.1Z"),
            Some(1_795_441_080_100)
        );
        for bad in [
            "",
            "2026-11-23",
            "2026-02-30T00:00:00Z",
            "2026-13-01T00:00:00Z",
            "2026-11-23T24:00:00Z",
            "2026-11-23T13:38:00",
            "2026-11-23T13:38:00.Z",
            "2026-11-23T13:38:00+0100",
            "２026-11-23T13:38:00Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        for z in [-800_000, -1, 0, 59, 20_000, 2_932_896] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
    }
}
