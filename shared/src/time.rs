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

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
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
}
