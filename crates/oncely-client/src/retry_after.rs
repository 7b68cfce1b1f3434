//! Parsing the `Retry-After` response header (RFC 9110, section 10.2.3).
//!
//! The header is either `delay-seconds` (a non-negative decimal integer of seconds) or an
//! `HTTP-date`. RFC 9110 section 5.6.7 requires recipients to accept all three date forms:
//!
//! | form | example |
//! |---|---|
//! | IMF-fixdate (preferred) | `Sun, 06 Nov 1994 08:49:37 GMT` |
//! | obsolete RFC 850 | `Sunday, 06-Nov-94 08:49:37 GMT` |
//! | ANSI C `asctime()` | `Sun Nov  6 08:49:37 1994` |
//!
//! A malformed value (a negative number, a fraction, garbage) is ignored: the header then gives
//! no hint and the retry waits the jittered backoff alone. A date in the past is a hint of zero.
//! How the hint is used (a lower bound combined with the jittered backoff) is decided by the
//! retry loop, see [`crate::policy`].
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use oncely_client::retry_after::parse_retry_after;
//!
//! let now = SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_717); // 06 Nov 1994 08:48:37 GMT
//! assert_eq!(parse_retry_after("120", now), Some(Duration::from_secs(120)));
//! assert_eq!(
//!     parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now),
//!     Some(Duration::from_secs(60)),
//! );
//! assert_eq!(parse_retry_after("-5", now), None);
//! ```

use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// Parses one `Retry-After` value into a wait, measured from `now`.
///
/// Returns `None` for a malformed or negative value. `delay-seconds` too large to represent
/// saturates (it will not fit any deadline, which is what such a server means). An HTTP-date in
/// the past gives `Some(Duration::ZERO)`.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    if value.bytes().all(|b| b.is_ascii_digit()) {
        // delay-seconds = 1*DIGIT. Overflow saturates instead of being ignored.
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs));
    }
    // httpdate accepts exactly the three forms RFC 9110 names.
    let when = httpdate::parse_http_date(value).ok()?;
    Some(when.duration_since(now).unwrap_or(Duration::ZERO))
}

/// Reads the `Retry-After` header of a response, if present and well formed.
///
/// A header that is repeated, not visible ASCII or malformed is ignored (`None`).
pub fn retry_after_from_headers(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let mut values = headers.get_all(http::header::RETRY_AFTER).iter();
    let first = values.next()?;
    if values.next().is_some() {
        return None;
    }
    parse_retry_after(first.to_str().ok()?, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> SystemTime {
        // Sun, 06 Nov 1994 08:47:37 GMT
        SystemTime::UNIX_EPOCH + Duration::from_secs(784_111_657)
    }

    #[test]
    fn delay_seconds() {
        assert_eq!(parse_retry_after("0", now()), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(" 7 ", now()),
            Some(Duration::from_secs(7))
        );
        assert_eq!(
            parse_retry_after("99999999999999999999999", now()),
            Some(Duration::from_secs(u64::MAX))
        );
    }

    #[test]
    fn all_three_date_forms() {
        let two_minutes = Some(Duration::from_secs(120));
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", now()),
            two_minutes
        );
        assert_eq!(
            parse_retry_after("Sunday, 06-Nov-94 08:49:37 GMT", now()),
            two_minutes
        );
        assert_eq!(
            parse_retry_after("Sun Nov  6 08:49:37 1994", now()),
            two_minutes
        );
    }

    #[test]
    fn past_date_is_zero() {
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now()),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn malformed_or_negative_is_ignored() {
        for bad in [
            "",
            "-1",
            "-120",
            "1.5",
            "soon",
            "12s",
            "Sun, 32 Nov 1994 08:49:37 GMT",
            "+5",
        ] {
            assert_eq!(parse_retry_after(bad, now()), None, "{bad:?}");
        }
    }

    #[test]
    fn header_map() {
        let mut h = HeaderMap::new();
        assert_eq!(retry_after_from_headers(&h, now()), None);
        h.insert(http::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(
            retry_after_from_headers(&h, now()),
            Some(Duration::from_secs(3))
        );
        h.append(http::header::RETRY_AFTER, "4".parse().unwrap());
        assert_eq!(retry_after_from_headers(&h, now()), None);
    }
}
