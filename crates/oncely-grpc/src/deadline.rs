//! The call's deadline, from `grpc-timeout`, and why the lease ignores it.
//!
//! The layer reads `grpc-timeout` (gRPC over HTTP/2: 1 to 8 digits and a unit, `H` hours, `M`
//! minutes, `S` seconds, `m` milliseconds, `u` microseconds, `n` nanoseconds) and hands the
//! handler the point in time it stands for as a [`GrpcDeadline`] request extension, so that the
//! handler can bound its own outside calls by it. tonic's transport server
//! (`tonic::transport::Server`) enforces the deadline itself: when it passes, it drops the
//! call's future and answers the client `CANCELLED` ("Timeout expired"), not the
//! `DEADLINE_EXCEEDED` of gRPC's status code guide. A server that is not tonic's (an axum router
//! serving the same methods) does not enforce it.
//!
//! The claim's **lease stays the policy's** (30 seconds by default), whatever the deadline: a
//! claimed handler runs to its end even after its caller gave up, and its response is stored
//! for the retry. The layer polls the handler in place, inside the call's future, and hands it
//! to a tokio task of its own only when that future is dropped unfinished (the deadline
//! passed, or the client went away), so no execution is cut short and none pays for a task
//! of its own while its caller waits. A lease tied to a short deadline would lapse while the
//! handler still runs and let a retry take the key over: a second execution beside the first.

use std::time::Duration;

/// When the call's deadline passes: `grpc-timeout` added to the time the layer received the
/// call. Inserted into the request extensions of calls that carry a valid `grpc-timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrpcDeadline(pub tokio::time::Instant);

impl GrpcDeadline {
    /// What is left of the deadline now (zero once it passed).
    pub fn remaining(&self) -> Duration {
        self.0
            .saturating_duration_since(tokio::time::Instant::now())
    }
}

/// Parses a `grpc-timeout` value: `None` when it is not 1 to 8 ASCII digits followed by one of
/// `H`, `M`, `S`, `m`, `u`, `n` (gRPC over HTTP/2, "Requests").
///
/// ```
/// use oncely_grpc::parse_grpc_timeout;
/// use std::time::Duration;
/// assert_eq!(parse_grpc_timeout(b"250m"), Some(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(b"2S"), Some(Duration::from_secs(2)));
/// assert_eq!(parse_grpc_timeout(b"123456789S"), None); // over 8 digits
/// assert_eq!(parse_grpc_timeout(b"5"), None); // no unit
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Option<Duration> {
    let (&unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_and_the_bounds() {
        assert_eq!(parse_grpc_timeout(b"1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout(b"7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            parse_grpc_timeout(b"99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(
            parse_grpc_timeout(b"12345678m"),
            Some(Duration::from_millis(12_345_678))
        );
        for bad in [&b""[..], b"m", b"-1S", b"1s", b"1.5S", b" 1S", b"1 S"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
