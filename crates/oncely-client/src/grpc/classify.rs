//! gRPC status classification: is this status retried, and after how long at least?
//!
//! Read in this order; the first rule that applies decides:
//!
//! 1. **The server's machine code**, `google.rpc.ErrorInfo.reason` in `grpc-status-details-bin`
//!    (AIP-193), when it is one of Oncely's codes ([`oncely_core::ErrorCode`], any `domain`, in
//!    our snake case or in the `UPPER_SNAKE_CASE` that `google.rpc.ErrorInfo` prescribes):
//!    `idempotency_request_in_flight` and `idempotency_store_unavailable` are retried (the
//!    first at the throttle price), every other one (`idempotency_key_mismatch`,
//!    `idempotency_key_missing`, `idempotency_key_invalid`, ...) never, whatever the code.
//! 2. **The server's pushback**, `grpc-retry-pushback-ms` (gRFC A6): a negative or malformed
//!    value is "do not retry"; a valid one is a lower bound on the wait.
//! 3. **The status code**:
//!
//! | code | verdict |
//! |---|---|
//! | `UNAVAILABLE` (14), answered by the server | retried, any call (the server says it did not handle it, like HTTP `503`) |
//! | `RESOURCE_EXHAUSTED` (8) **with** `RetryInfo` | retried, throttle price (a quota that refills) |
//! | `RESOURCE_EXHAUSTED` without `RetryInfo` | returned (a quota that may never refill, a message too large) |
//! | `DEADLINE_EXCEEDED` (4), answered by the server | retried when safe to repeat (keyed or idempotent), within what is left of the call's deadline; else returned |
//! | `INTERNAL` (13), `UNKNOWN` (2) | retried only with [`crate::RetryPolicy::with_retry_500`] and when safe to repeat |
//! | `OK`, `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `ALREADY_EXISTS`, `ABORTED` (without our in-flight reason), `NOT_FOUND`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `CANCELLED`, `OUT_OF_RANGE`, `UNIMPLEMENTED`, `DATA_LOSS` | returned as is, never retried |
//!
//! A response that is not a gRPC answer (an HTTP status other than `200` without `grpc-status`:
//! a proxy answered) is judged by the HTTP allowlist instead ([`classify_http`]), and reported
//! with the status gRPC maps it to ([`status_from_http`]).
//!
//! The wait before a retry is at least `google.rpc.RetryInfo.retry_delay` (AIP-194), else the
//! pushback, combined with the jittered backoff exactly as `Retry-After` is for HTTP
//! ([`crate::schedule`]): a lower bound; one that does not fit in the time left ends the call
//! at once with [`crate::StopReason::RetryAfterBeyondDeadline`].
//!
//! ```
//! use std::time::Duration;
//! use http::HeaderMap;
//! use oncely_client::classify::{RetryReason, Verdict};
//! use oncely_client::grpc::classify::classify_status;
//! use tonic::{Code, Status};
//! use tonic_types::{ErrorDetails, StatusExt};
//!
//! let none = HeaderMap::new();
//! let in_flight = Status::with_error_details(
//!     Code::Aborted,
//!     "a request with this key is in progress",
//!     ErrorDetails::with_error_info("idempotency_request_in_flight", "oncely", [])
//!         .set_retry_info(Some(Duration::from_secs(1)))
//!         .clone(),
//! );
//! let (verdict, hint) = classify_status(true, &in_flight, &none, false);
//! assert!(matches!(verdict, Verdict::Retry(RetryReason::Grpc { code: 10, throttle: true, .. })));
//! assert_eq!(hint, Some(Duration::from_secs(1)));
//!
//! let mismatch = Status::with_error_details(
//!     Code::FailedPrecondition,
//!     "key reused with another request",
//!     ErrorDetails::with_error_info("idempotency_key_mismatch", "oncely", []),
//! );
//! assert_eq!(classify_status(true, &mismatch, &none, false).0, Verdict::Done);
//! ```

use std::time::Duration;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use oncely_core::ErrorCode;
use tonic::{Code, Status};
use tonic_types::StatusExt;

use crate::classify::{Outcome, RequestFacts, ResponseFacts, RetryReason, Verdict, classify};

/// gRFC A6's server pushback trailer: milliseconds to wait, or negative for "do not retry".
pub const GRPC_RETRY_PUSHBACK_MS: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// Oncely's machine codes, as `ErrorInfo.reason` carries them.
const OUR_CODES: [ErrorCode; 9] = [
    ErrorCode::KeyMissing,
    ErrorCode::KeyInvalid,
    ErrorCode::KeyMismatch,
    ErrorCode::RequestInFlight,
    ErrorCode::StoreUnavailable,
    ErrorCode::ResponseNotRetained,
    ErrorCode::ScopeMissing,
    ErrorCode::RequestTooLarge,
    ErrorCode::BodyNotCanonicalizable,
];

/// The server's pushback: `Some(Some(wait))`, `Some(None)` for "do not retry", `None` when
/// absent.
pub fn pushback(headers: &HeaderMap) -> Option<Option<Duration>> {
    let value = headers.get(GRPC_RETRY_PUSHBACK_MS)?;
    let ms = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok());
    Some(ms.map(Duration::from_millis))
}

/// Classifies a status the server answered with (`safe`: the call is keyed or its method
/// idempotent; `retry_500`: [`crate::RetryPolicy::retry_500`]), and returns the server's
/// lower bound on the wait, if any. See the [module docs](self) for the rules.
pub fn classify_status(
    safe: bool,
    status: &Status,
    headers: &HeaderMap,
    retry_500: bool,
) -> (Verdict, Option<Duration>) {
    let code = status.code() as i32;
    let pushed = pushback(headers);
    let hint = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .or(pushed.flatten());
    let ours = status.get_details_error_info().and_then(|info| {
        OUR_CODES
            .into_iter()
            .find(|c| c.as_str().eq_ignore_ascii_case(&info.reason))
    });
    if let Some(ours) = ours {
        let verdict = if ours.retryable() {
            Verdict::Retry(RetryReason::Grpc {
                code,
                reason: Some(ours.as_str()),
                throttle: ours == ErrorCode::RequestInFlight,
            })
        } else {
            Verdict::Done
        };
        return (verdict, hint);
    }
    if pushed == Some(None) {
        return (Verdict::Done, None);
    }
    let retry = |throttle| {
        Verdict::Retry(RetryReason::Grpc {
            code,
            reason: None,
            throttle,
        })
    };
    let verdict = match status.code() {
        Code::Unavailable => retry(false),
        Code::ResourceExhausted if status.get_details_retry_info().is_some() => retry(true),
        Code::DeadlineExceeded if safe => retry(false),
        Code::Internal | Code::Unknown if retry_500 && safe => retry(false),
        _ => Verdict::Done,
    };
    (verdict, hint)
}

/// Classifies a response that is not a gRPC answer: an HTTP status other than `200` without a
/// `grpc-status` (a proxy or a load balancer answered, not the service). It is judged by the
/// HTTP SDK's own allowlist ([`crate::classify`]), as a `POST` that is keyed when `safe`: `429`
/// and `503` retried, `502` and `504` when safe to repeat, never another `4xx`; its
/// `Retry-After` is the lower bound on the wait, as for HTTP.
pub fn classify_http(
    safe: bool,
    status: StatusCode,
    headers: &HeaderMap,
    retry_500: bool,
) -> Verdict {
    let request = RequestFacts {
        method: &Method::POST,
        has_key: safe,
    };
    let response = ResponseFacts::new(status, headers, None);
    classify(&request, &Outcome::Response(response), retry_500)
}

/// The status gRPC gives an HTTP answer without `grpc-status` ("HTTP to gRPC Status Code
/// Mapping" in the gRPC repository's `doc/http-grpc-status-mapping.md`, as tonic's client
/// applies it): `400` `INTERNAL`, `401` `UNAUTHENTICATED`, `403` `PERMISSION_DENIED`, `404`
/// `UNIMPLEMENTED`, `429`, `502`, `503`, `504` `UNAVAILABLE`, anything else `UNKNOWN`.
pub fn status_from_http(status: StatusCode) -> Status {
    let code = match status.as_u16() {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502 | 503 | 504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(code, format!("HTTP {status} without grpc-status"))
}

/// Whether a status says the server failed rather than answered: such an end refunds nothing
/// to the retry budget (as a `5xx` does not for HTTP).
pub(crate) fn is_server_failure(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Internal
            | Code::Unknown
            | Code::DataLoss
            | Code::DeadlineExceeded
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use tonic_types::ErrorDetails;

    fn with_info(code: Code, reason: &str) -> Status {
        Status::with_error_details(
            code,
            "x",
            ErrorDetails::with_error_info(reason, "oncely", []),
        )
    }

    fn retry_info(code: Code, delay: Duration) -> Status {
        Status::with_error_details(code, "x", ErrorDetails::with_retry_info(Some(delay)))
    }

    const ALL_CODES: [Code; 17] = [
        Code::Ok,
        Code::Cancelled,
        Code::Unknown,
        Code::InvalidArgument,
        Code::DeadlineExceeded,
        Code::NotFound,
        Code::AlreadyExists,
        Code::PermissionDenied,
        Code::ResourceExhausted,
        Code::FailedPrecondition,
        Code::Aborted,
        Code::OutOfRange,
        Code::Unimplemented,
        Code::Internal,
        Code::Unavailable,
        Code::DataLoss,
        Code::Unauthenticated,
    ];

    #[test]
    fn our_non_retryable_codes_are_never_retried_whatever_the_status() {
        let none = HeaderMap::new();
        for reason in [
            "idempotency_key_mismatch",
            "idempotency_key_missing",
            "idempotency_key_invalid",
        ] {
            for code in ALL_CODES {
                for safe in [true, false] {
                    let s = with_info(code, reason);
                    assert_eq!(classify_status(safe, &s, &none, true).0, Verdict::Done);
                }
            }
        }
    }

    #[test]
    fn machine_codes_are_read_in_either_case() {
        let none = HeaderMap::new();
        let upper = with_info(Code::Aborted, "IDEMPOTENCY_REQUEST_IN_FLIGHT");
        assert!(matches!(
            classify_status(true, &upper, &none, false).0,
            Verdict::Retry(RetryReason::Grpc {
                reason: Some("idempotency_request_in_flight"),
                ..
            })
        ));
        let upper = with_info(Code::Unavailable, "IDEMPOTENCY_KEY_MISMATCH");
        assert_eq!(classify_status(true, &upper, &none, false).0, Verdict::Done);
        // Not ours: the status table decides (ABORTED is not retried).
        let other = with_info(Code::Aborted, "CONCURRENT_MODIFICATION");
        assert_eq!(classify_status(true, &other, &none, false).0, Verdict::Done);
    }

    #[test]
    fn in_flight_and_store_unavailable_are_retried_whatever_the_status() {
        let none = HeaderMap::new();
        for code in [Code::Aborted, Code::Unavailable, Code::FailedPrecondition] {
            let (v, _) = classify_status(
                true,
                &with_info(code, "idempotency_request_in_flight"),
                &none,
                false,
            );
            assert!(
                matches!(v, Verdict::Retry(RetryReason::Grpc { throttle: true, .. })),
                "{v:?}"
            );
            let (v, _) = classify_status(
                false,
                &with_info(code, "idempotency_store_unavailable"),
                &none,
                false,
            );
            assert!(
                matches!(
                    v,
                    Verdict::Retry(RetryReason::Grpc {
                        throttle: false,
                        ..
                    })
                ),
                "{v:?}"
            );
        }
    }

    #[test]
    fn the_status_table() {
        let none = HeaderMap::new();
        let retried = |safe, s: &Status, r500| {
            matches!(classify_status(safe, s, &none, r500).0, Verdict::Retry(_))
        };
        for code in ALL_CODES {
            let s = Status::new(code, "x");
            let expected_unsafe = code == Code::Unavailable;
            let expected_safe = matches!(code, Code::Unavailable | Code::DeadlineExceeded);
            assert_eq!(retried(false, &s, false), expected_unsafe, "{code:?}");
            assert_eq!(retried(true, &s, false), expected_safe, "{code:?}");
        }
        assert!(retried(true, &Status::internal("x"), true));
        assert!(!retried(false, &Status::internal("x"), true));
        let quota = retry_info(Code::ResourceExhausted, Duration::from_secs(3));
        assert_eq!(
            classify_status(false, &quota, &none, false),
            (
                Verdict::Retry(RetryReason::Grpc {
                    code: 8,
                    reason: None,
                    throttle: true
                }),
                Some(Duration::from_secs(3))
            )
        );
        // RetryInfo does not make a client error retryable.
        let bad = retry_info(Code::InvalidArgument, Duration::from_secs(1));
        assert_eq!(classify_status(true, &bad, &none, true).0, Verdict::Done);
    }

    #[test]
    fn http_answers_without_grpc_status_follow_the_http_allowlist() {
        let none = HeaderMap::new();
        let retried = |safe, code: u16| {
            matches!(
                classify_http(safe, StatusCode::from_u16(code).unwrap(), &none, false),
                Verdict::Retry(_)
            )
        };
        for code in [429, 503] {
            assert!(retried(false, code) && retried(true, code), "{code}");
        }
        for code in [502, 504] {
            assert!(!retried(false, code) && retried(true, code), "{code}");
        }
        for code in [400, 401, 403, 404, 409, 422, 500] {
            assert!(!retried(true, code), "{code}");
        }
        assert_eq!(
            status_from_http(StatusCode::BAD_GATEWAY).code(),
            Code::Unavailable
        );
        assert_eq!(
            status_from_http(StatusCode::NOT_FOUND).code(),
            Code::Unimplemented
        );
    }

    #[test]
    fn pushback_vetoes_or_bounds() {
        let mut h = HeaderMap::new();
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("-1"));
        assert_eq!(
            classify_status(true, &Status::unavailable("x"), &h, false),
            (Verdict::Done, None)
        );
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("soon"));
        assert_eq!(
            classify_status(true, &Status::unavailable("x"), &h, false).0,
            Verdict::Done
        );
        h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("250"));
        let (v, hint) = classify_status(true, &Status::unavailable("x"), &h, false);
        assert!(matches!(v, Verdict::Retry(_)));
        assert_eq!(hint, Some(Duration::from_millis(250)));
    }
}
