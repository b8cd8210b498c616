//! Cron schedules of scheduled tasks: the five classic fields, in UTC.
//!
//! ```text
//! minute hour day-of-month month day-of-week
//!   0-59  0-23   1-31       1-12   0-6 (0 and 7 are Sunday)
//! ```
//!
//! Each field is `*`, a number, a range `a-b`, any of those with a step `/n`, or a comma list
//! of them. As in Vixie cron, when both day fields are restricted a day matches if either
//! does. No names (`MON`), no `@daily`: a schedule an agent writes should read the same to
//! everyone.

use crate::time::{civil_from_days, days_from_civil, days_in_month};

/// A parsed schedule: one bit per allowed value of each field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cron {
    minutes: u64,
    hours: u32,
    days: u32,
    months: u16,
    weekdays: u8,
    /// Whether each day field was `*` (it changes how the two combine).
    any_day: bool,
    any_weekday: bool,
}

/// A schedule that does not parse, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cron {field}: {reason}")]
pub struct BadCron {
    /// The field (`minute`, `hour`, …) or `schedule`.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

const FIELDS: [(&str, u32, u32); 5] = [
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day-of-month", 1, 31),
    ("month", 1, 12),
    ("day-of-week", 0, 7),
];

/// How far ahead a next firing is looked for (a `30 2 31 2 *` never comes).
const HORIZON_DAYS: i64 = 366 * 5;

impl Cron {
    /// Parses a five-field schedule.
    pub fn parse(text: &str) -> Result<Self, BadCron> {
        let parts: Vec<&str> = text.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(BadCron {
                field: "schedule",
                reason: format!(
                    "five fields (minute hour day-of-month month day-of-week), got {}",
                    parts.len()
                ),
            });
        }
        let mut bits = [0u64; 5];
        for (i, ((name, lo, hi), part)) in FIELDS.iter().zip(&parts).enumerate() {
            bits[i] = field(part, *lo, *hi).map_err(|reason| BadCron {
                field: name,
                reason,
            })?;
        }
        // Day-of-week 7 is Sunday, as 0.
        let weekdays = ((bits[4] | (bits[4] >> 7)) & 0x7f) as u8;
        let cron = Cron {
            minutes: bits[0],
            hours: bits[1] as u32,
            days: bits[2] as u32,
            months: bits[3] as u16,
            weekdays,
            any_day: parts[2] == "*",
            any_weekday: parts[4] == "*",
        };
        Ok(cron)
    }

    fn day_matches(&self, day_of_epoch: i64, day: u32) -> bool {
        // 1970-01-01 was a Thursday (4).
        let weekday = (day_of_epoch + 4).rem_euclid(7) as u32;
        let dom = self.days & (1 << day) != 0;
        let dow = self.weekdays & (1 << weekday) != 0;
        match (self.any_day, self.any_weekday) {
            (false, false) => dom || dow,
            _ => dom && dow,
        }
    }

    /// The first firing strictly after `after_ms` (Unix ms), on a whole minute; `None` when
    /// none comes within five years.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        let mut minute = after_ms.div_euclid(60_000) + 1;
        let horizon = minute + HORIZON_DAYS * 1440;
        while minute < horizon {
            let day = minute.div_euclid(1440);
            let (y, m, d) = civil_from_days(day);
            if self.months & (1 << m) == 0 {
                // The first day of the next month.
                let (ny, nm) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
                minute = days_from_civil(ny, nm, 1) * 1440;
                continue;
            }
            if d > days_in_month(y, m) || !self.day_matches(day, d) {
                minute = (day + 1) * 1440;
                continue;
            }
            let of_day = minute.rem_euclid(1440);
            let (h, mi) = (of_day / 60, of_day % 60);
            if self.hours & (1 << h) == 0 {
                minute = day * 1440 + (h + 1) * 60;
                continue;
            }
            if self.minutes & (1 << mi) == 0 {
                minute += 1;
                continue;
            }
            return Some(minute * 60_000);
        }
        None
    }
}

fn field(text: &str, lo: u32, hi: u32) -> Result<u64, String> {
    let mut bits = 0u64;
    for item in text.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .map_err(|_| format!("step {s:?} is not a number"))?;
                if step == 0 || step > hi {
                    return Err(format!("step {step} out of 1-{hi}"));
                }
                (r, step)
            }
            None => (item, 1),
        };
        let num = |s: &str| -> Result<u32, String> {
            let v: u32 = s
                .parse()
                .map_err(|_| format!("{s:?} is not a number or *"))?;
            if v < lo || v > hi {
                return Err(format!("{v} out of {lo}-{hi}"));
            }
            Ok(v)
        };
        let (a, b) = match range {
            "*" => (lo, hi),
            r => match r.split_once('-') {
                Some((a, b)) => {
                    let (a, b) = (num(a)?, num(b)?);
                    if a > b {
                        return Err(format!("range {a}-{b} runs backwards"));
                    }
                    (a, b)
                }
                // `5/15` means from 5 to the end, every 15.
                None if step > 1 => (num(r)?, hi),
                None => {
                    let v = num(r)?;
                    (v, v)
                }
            },
        };
        let mut v = a;
        while v <= b {
            bits |= 1 << v;
            v += step;
        }
    }
    Ok(bits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::{from_unix_millis, parse_rfc3339, rfc3339};

    fn next(cron: &str, after: &str) -> String {
        let c = Cron::parse(cron).unwrap();
        let at = c.next_after(parse_rfc3339(after).unwrap()).unwrap();
        rfc3339(from_unix_millis(at))
    }

    #[test]
    fn next_firings() {
        let t = "2026-11-24T06:59:30Z"; // a Tuesday
        assert_eq!(next("* * * * *", t), "2026-11-24T07:00:00.000Z");
        assert_eq!(next("*/15 * * * *", t), "2026-11-24T07:00:00.000Z");
        assert_eq!(next("5/15 * * * *", t), "2026-11-24T07:05:00.000Z");
        assert_eq!(next("30 9 * * *", t), "2026-11-24T09:30:00.000Z");
        assert_eq!(next("30 5 * * *", t), "2026-11-25T05:30:00.000Z");
        assert_eq!(next("0 0 1 * *", t), "2026-12-01T00:00:00.000Z");
        assert_eq!(
            next("0 12 * * 1-5", "2026-11-27T13:00:00Z"),
            "2026-11-30T12:00:00.000Z"
        );
        assert_eq!(next("0 0 * * 0", t), "2026-11-29T00:00:00.000Z");
        assert_eq!(next("0 0 * * 7", t), "2026-11-29T00:00:00.000Z");
        // Both day fields restricted: either matches (the 1st, or a Friday).
        assert_eq!(next("0 0 1 * 5", t), "2026-11-27T00:00:00.000Z");
        assert_eq!(next("0 0 29 2 *", t), "2028-02-29T00:00:00.000Z");
        assert_eq!(next("0,30 8-9 * 1,6 *", t), "2027-01-01T08:00:00.000Z");
        // Strictly after: a firing at the very minute is the next one.
        assert_eq!(
            next("0 7 * * *", "2026-11-24T07:00:00Z"),
            "2026-11-25T07:00:00.000Z"
        );
    }

    #[test]
    fn a_date_that_never_comes_has_no_next() {
        let c = Cron::parse("0 0 31 2 *").unwrap();
        assert_eq!(c.next_after(0), None);
    }

    #[test]
    fn bad_schedules_name_the_field() {
        for (text, field) in [
            ("* * * *", "schedule"),
            ("60 * * * *", "minute"),
            ("* 24 * * *", "hour"),
            ("* * 0 * *", "day-of-month"),
            ("* * * 13 *", "month"),
            ("* * * * 8", "day-of-week"),
            ("*/0 * * * *", "minute"),
            ("5-1 * * * *", "minute"),
            ("MON * * * *", "minute"),
            ("* * * * MON", "day-of-week"),
        ] {
            assert_eq!(Cron::parse(text).unwrap_err().field, field, "{text}");
        }
    }
}
