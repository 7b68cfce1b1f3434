//! The `grpc-timeout` request header (gRPC over HTTP/2, "PROTOCOL-HTTP2.md": `TimeoutValue`
//! of at most 8 ASCII digits, then a unit: `H` hours, `M` minutes, `S` seconds, `m`
//! milliseconds, `u` microseconds, `n` nanoseconds).
//!
//! ```
//! use std::time::Duration;
//! use oncely_client::grpc::timeout::{format_grpc_timeout, parse_grpc_timeout};
//!
//! // The most precise unit that fits in 8 digits, rounded down: never more than the time left.
//! assert_eq!(format_grpc_timeout(Duration::from_millis(2500)), "2500000u");
//! assert_eq!(format_grpc_timeout(Duration::from_nanos(123_456_789_999)), "123456m");
//! assert_eq!(parse_grpc_timeout("2500000u"), Some(Duration::from_millis(2500)));
//! assert_eq!(parse_grpc_timeout("123456789S"), None); // 9 digits
//! ```

use std::time::Duration;

use http::HeaderName;

/// The `grpc-timeout` header name.
pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

/// Largest `TimeoutValue`: 8 digits.
const MAX_VALUE: u128 = 99_999_999;

/// Formats a timeout with the most precise unit whose value fits in 8 digits, rounding down,
/// so the header never says more than `timeout` (tonic's `Request::set_timeout` formats the
/// same way). Timeouts beyond 99,999,999 hours saturate at that.
pub fn format_grpc_timeout(timeout: Duration) -> String {
    let secs = u128::from(timeout.as_secs());
    let candidates = [
        (timeout.as_nanos(), 'n'),
        (timeout.as_micros(), 'u'),
        (timeout.as_millis(), 'm'),
        (secs, 'S'),
        (secs / 60, 'M'),
        (secs / 3600, 'H'),
    ];
    for (value, unit) in candidates {
        if value <= MAX_VALUE {
            return format!("{value}{unit}");
        }
    }
    format!("{MAX_VALUE}H")
}

/// Parses a `grpc-timeout` value; `None` for a malformed one (empty, more than 8 digits, an
/// unknown unit).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    if !value.is_char_boundary(split) {
        return None;
    }
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatted_never_exceeds_and_round_trips_within_one_unit() {
        for nanos in [
            1u64,
            999,
            99_999_999,
            100_000_000,
            1_500_000_001,
            99_999_999_999,
            100_000_000_000,
            3_600_000_000_000_123,
        ] {
            let d = Duration::from_nanos(nanos);
            let text = format_grpc_timeout(d);
            let back = parse_grpc_timeout(&text).unwrap();
            assert!(back <= d, "{text} says more than {d:?}");
            // Rounding down loses less than one unit, and a coarser unit is used only when the
            // finer one's value passed 8 digits, so the value is at least 100,000 of its unit
            // (units step by 1000, or 60) and the loss under 1/100,000 of the timeout.
            assert!(
                d - back < d / 100_000 + Duration::from_nanos(1),
                "{text} for {d:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn any_timeout_is_sent_rounded_down_by_less_than_one_unit(
            nanos in 1u64..=u64::MAX,
        ) {
            let d = Duration::from_nanos(nanos);
            let text = format_grpc_timeout(d);
            let back = parse_grpc_timeout(&text).unwrap();
            proptest::prop_assert!(back <= d, "{} says more than {:?}", text, d);
            // Under one unit, and the value is at least 100,000 units (see the test above).
            proptest::prop_assert!(d - back < d / 100_000 + Duration::from_nanos(1), "{} for {:?}", text, d);
        }
    }

    #[test]
    fn malformed_values_are_refused() {
        for bad in ["", "S", "1", "12x", "-1S", "123456789m", "1.5S", " 1S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
        assert_eq!(parse_grpc_timeout("30M"), Some(Duration::from_secs(1800)));
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
    }
}
