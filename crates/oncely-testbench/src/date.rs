//! HTTP-dates in the three forms RFC 9110 section 5.6.7 requires recipients to accept.
//!
//! `httpdate` formats only the preferred IMF-fixdate; the obsolete RFC 850 and asctime forms are
//! written here from the same civil date.
//!
//! ```
//! use std::time::{Duration, UNIX_EPOCH};
//! use oncely_testbench::date::format;
//! use oncely_testbench::scenario::DateForm;
//!
//! let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
//! assert_eq!(format(t, DateForm::ImfFixdate), "Sun, 06 Nov 1994 08:49:37 GMT");
//! assert_eq!(format(t, DateForm::Rfc850), "Sunday, 06-Nov-94 08:49:37 GMT");
//! assert_eq!(format(t, DateForm::Asctime), "Sun Nov  6 08:49:37 1994");
//! ```

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::scenario::DateForm;

const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
const LONG_DAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Formats `t` (whole seconds; a fraction is dropped) in `form`. Times before 1970 are written
/// as 1970-01-01 00:00:00.
pub fn format(t: SystemTime, form: DateForm) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let days = secs / 86_400;
    let (h, m, s) = (secs % 86_400 / 3600, secs % 3600 / 60, secs % 60);
    let (year, month, day) = civil_from_days(days);
    let wd = (days % 7) as usize;
    let mon = MONTHS[(month - 1) as usize];
    match form {
        DateForm::ImfFixdate => {
            format!(
                "{}, {day:02} {mon} {year} {h:02}:{m:02}:{s:02} GMT",
                DAYS[wd]
            )
        }
        DateForm::Rfc850 => format!(
            "{}, {day:02}-{mon}-{:02} {h:02}:{m:02}:{s:02} GMT",
            LONG_DAYS[wd],
            year % 100
        ),
        DateForm::Asctime => format!("{} {mon} {day:>2} {h:02}:{m:02}:{s:02} {year}", DAYS[wd]),
    }
}

/// The first whole second at or after `now + in_ms` milliseconds (`in_ms` may be negative).
pub fn whole_second_after(now: SystemTime, in_ms: i64) -> SystemTime {
    let shift = Duration::from_millis(in_ms.unsigned_abs());
    let t = if in_ms >= 0 {
        now + shift
    } else {
        now.checked_sub(shift).unwrap_or(UNIX_EPOCH)
    };
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let whole = since.as_secs() + u64::from(since.subsec_nanos() > 0);
    UNIX_EPOCH + Duration::from_secs(whole)
}

/// Days since 1970-01-01 to (year, month 1-12, day 1-31), in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_back_to_the_same_second() {
        // Every day for 200 years from 1970, at a varying time of day.
        for d in (0..73_000u64).step_by(7) {
            let t = UNIX_EPOCH + Duration::from_secs(d * 86_400 + (d * 3_731) % 86_400);
            let imf = format(t, DateForm::ImfFixdate);
            assert_eq!(imf, httpdate::fmt_http_date(t), "day {d}");
            assert_eq!(
                httpdate::parse_http_date(&format(t, DateForm::Asctime)).unwrap(),
                t
            );
            let year = 1970 + d / 365;
            // RFC 850's two-digit year reads as 1970..2069 (httpdate's rule).
            if year < 2069 {
                assert_eq!(
                    httpdate::parse_http_date(&format(t, DateForm::Rfc850)).unwrap(),
                    t,
                    "{}",
                    format(t, DateForm::Rfc850)
                );
            }
        }
    }

    #[test]
    fn rounds_up_to_the_whole_second() {
        let now = UNIX_EPOCH + Duration::from_millis(10_200);
        assert_eq!(
            whole_second_after(now, 1000),
            UNIX_EPOCH + Duration::from_secs(12)
        );
        assert_eq!(
            whole_second_after(now, 800),
            UNIX_EPOCH + Duration::from_secs(11)
        );
        assert_eq!(
            whole_second_after(now, -5000),
            UNIX_EPOCH + Duration::from_secs(6)
        );
        let whole = UNIX_EPOCH + Duration::from_secs(7);
        assert_eq!(whole_second_after(whole, 0), whole);
    }
}
