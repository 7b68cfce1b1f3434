//! What classification says: the [`Verdict`] on one attempt, and the [`RetryReason`] a retry
//! carries into the schedule, the budget's price and the logs.

use std::fmt;

use http::StatusCode;

use super::facts::IN_FLIGHT_CODE;
use super::signals::Signal;
use crate::budget::RetryCost;

/// Why an attempt is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryReason {
    /// The connection failed before the request was sent.
    ConnectFailed,
    /// The attempt timed out after the request may have been sent (safe to repeat).
    TimedOut,
    /// The connection broke after the request may have been sent (safe to repeat).
    ConnectionReset,
    /// `429 Too Many Requests`.
    Throttled,
    /// `408 Request Timeout`.
    RequestTimeout,
    /// The server's `idempotency_request_in_flight` conflict.
    InFlight,
    /// A retryable 5xx (`502`, `503`, `504`, or `500` when enabled).
    ServerError(StatusCode),
    /// A status the allowlist does not retry, on a request safe to repeat, that the server (or
    /// the caller's hook) explicitly marked retryable.
    ServerAsked {
        /// The response status.
        status: StatusCode,
        /// Which signal said so.
        signal: Signal,
    },
    /// A gRPC status the gRPC allowlist retries (the `grpc` feature's `oncely_client::grpc`
    /// module has the table).
    Grpc {
        /// The `grpc-status` code (0 to 16), for example 14 for `UNAVAILABLE`.
        code: i32,
        /// The server's machine code from `google.rpc.ErrorInfo.reason`, when it decided, such
        /// as `idempotency_request_in_flight`.
        reason: Option<&'static str>,
        /// Whether the server asks to come back later rather than failing (the in-flight
        /// conflict, `RESOURCE_EXHAUSTED`): the throttle price of the budget.
        throttle: bool,
    },
}

impl RetryReason {
    /// Whether the server said another request with this key is still running
    /// (`409 idempotency_request_in_flight`, or its gRPC form): the server did not run this
    /// attempt, so the retry schedule does not count it against the attempt limit
    /// (`docs/DESIGN.md`, "In-use answer treated as failure").
    pub fn is_in_flight(&self) -> bool {
        match self {
            Self::InFlight => true,
            Self::Grpc { reason, .. } => *reason == Some(IN_FLIGHT_CODE),
            _ => false,
        }
    }

    /// The budget price of retrying for this reason: throttling (`429`, in-flight) pays the
    /// throttle price, everything else the transient price.
    pub fn cost(&self) -> RetryCost {
        match self {
            Self::Throttled | Self::InFlight => RetryCost::Throttle,
            Self::Grpc { throttle: true, .. } => RetryCost::Throttle,
            Self::ServerAsked { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => {
                RetryCost::Throttle
            }
            _ => RetryCost::Transient,
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ConnectFailed => f.write_str("connection failed before sending"),
            Self::TimedOut => f.write_str("timed out after sending"),
            Self::ConnectionReset => f.write_str("connection reset after sending"),
            Self::Throttled => f.write_str("429 Too Many Requests"),
            Self::RequestTimeout => f.write_str("408 Request Timeout"),
            Self::InFlight => f.write_str("409 idempotency_request_in_flight"),
            Self::ServerError(s) => write!(f, "{s}"),
            Self::ServerAsked { status, signal } => {
                write!(f, "{status} marked retryable by {signal}")
            }
            Self::Grpc { code, reason, .. } => {
                write!(f, "grpc-status {code} {}", grpc_code_name(*code))?;
                match reason {
                    Some(r) => write!(f, " {r}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The canonical name of a gRPC status code (`UNAVAILABLE` for 14), or `UNKNOWN` for a number
/// outside 0 to 16 (as gRPC reads one).
pub fn grpc_code_name(code: i32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

/// What to do with an attempt's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Retry, if the attempt limit, the deadline and the budget allow it.
    Retry(RetryReason),
    /// Hand the response back to the caller as it is.
    Done,
    /// A transport error that must not be retried (a bug, not a transient condition).
    NotRetryable,
    /// The request may or may not have taken effect, and repeating it is not safe: the caller
    /// must find out (case C1: a keyless `POST` that timed out after sending).
    OutcomeUnknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_flight_answer_over_http_and_grpc_is_told_apart() {
        assert!(RetryReason::InFlight.is_in_flight());
        let grpc = |reason| RetryReason::Grpc {
            code: 10,
            reason,
            throttle: true,
        };
        assert!(grpc(Some(IN_FLIGHT_CODE)).is_in_flight());
        assert!(!grpc(None).is_in_flight());
        assert!(!RetryReason::Throttled.is_in_flight());
        assert!(!RetryReason::ServerError(StatusCode::SERVICE_UNAVAILABLE).is_in_flight());
    }
}
