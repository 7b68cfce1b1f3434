//! gRPC status classification: is this status retried, and after how long at least?
//!
//! Read in this order; the first rule that applies decides:
//!
//! 1. **The server's machine code**, `google.rpc.ErrorInfo.reason` in `grpc-status-details-bin`
//!    (AIP-193), when it is one of Oncely's codes (any of [`oncely_core::ErrorCode::ALL`], any
//!    `domain`, in our snake case or in the `UPPER_SNAKE_CASE` that `google.rpc.ErrorInfo`
//!    prescribes): the retryable ones ([`oncely_core::ErrorCode::retryable`]:
//!    `idempotency_request_in_flight`, `idempotency_store_unavailable`, `server_shutting_down`,
//!    `database_unavailable`, `request_suspended`, `response_failed`) are retried (the first at
//!    the throttle price), every other one (`idempotency_key_mismatch`,
//!    `idempotency_request_needs_attention`, `handler_did_not_commit`, ...) never, whatever the
//!    status code and whatever [`crate::RetryPolicy::with_retry_500`] says.
//! 2. **The server's pushback**, `grpc-retry-pushback-ms` (gRFC A6): a negative or malformed
//!    value is "do not retry"; a valid one is a lower bound on the wait.
//! 3. **The status code**, every one of the 17 ([`status_verdict`]), after gRPC's status code
//!    guide and gRFC A6 (whose stock policies retry `UNAVAILABLE`), with the HTTP allowlist's
//!    rule that what may have run is repeated only when it is safe to repeat:
//!
//! | code | verdict |
//! |---|---|
//! | `UNAVAILABLE` (14), answered by the server | retried, any call (the server says it did not handle it, like HTTP `503`) |
//! | `RESOURCE_EXHAUSTED` (8) **with** `RetryInfo` | retried, throttle price (a quota that refills, like HTTP `429`) |
//! | `RESOURCE_EXHAUSTED` without `RetryInfo` | returned (a quota that may never refill, a message too large) |
//! | `DEADLINE_EXCEEDED` (4), answered by the server | retried when safe to repeat (keyed or idempotent), within what is left of the call's deadline, like HTTP `504`; else returned |
//! | `INTERNAL` (13), `UNKNOWN` (2) | retried only with [`crate::RetryPolicy::with_retry_500`] and when safe to repeat, like HTTP `500` |
//! | `ABORTED` (10) without our in-flight reason | returned: gRPC's guide retries it "at a higher level" (the whole read-modify-write), not as the same call |
//! | `CANCELLED` (1) | returned: the call was cancelled, and repeating it is the caller's decision |
//! | `DATA_LOSS` (15) | returned: unrecoverable, a retry cannot undo it |
//! | `OK`, `INVALID_ARGUMENT`, `FAILED_PRECONDITION`, `ALREADY_EXISTS`, `NOT_FOUND`, `PERMISSION_DENIED`, `UNAUTHENTICATED`, `OUT_OF_RANGE`, `UNIMPLEMENTED` | returned as is, never retried: the same call gets the same answer (like HTTP's other `4xx`) |
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

/// The Oncely machine code an `ErrorInfo.reason` names (in either case), if any.
fn our_code(reason: &str) -> Option<ErrorCode> {
    ErrorCode::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(reason))
}

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
    let ours = status
        .get_details_error_info()
        .and_then(|info| our_code(&info.reason));
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
    let verdict = match status_verdict(
        status.code(),
        safe,
        status.get_details_retry_info().is_some(),
        retry_500,
    ) {
        Some(throttle) => Verdict::Retry(RetryReason::Grpc {
            code,
            reason: None,
            throttle,
        }),
        None => Verdict::Done,
    };
    (verdict, hint)
}

/// The status code's own verdict (rule 3 of the [module docs](self)), for a status without one
/// of our machine codes: `Some(throttle)` to retry it (at the throttle price when `throttle`),
/// `None` to return it. `safe`: the call is keyed or its method idempotent; `retry_info`: the
/// status carries `google.rpc.RetryInfo`; `retry_500`: [`crate::RetryPolicy::retry_500`].
pub const fn status_verdict(
    code: Code,
    safe: bool,
    retry_info: bool,
    retry_500: bool,
) -> Option<bool> {
    // No wildcard arm: a status code added to tonic does not build until it is classified.
    match code {
        Code::Unavailable => Some(false),
        Code::ResourceExhausted if retry_info => Some(true),
        Code::DeadlineExceeded if safe => Some(false),
        Code::Internal | Code::Unknown if retry_500 && safe => Some(false),
        Code::ResourceExhausted | Code::DeadlineExceeded | Code::Internal | Code::Unknown => None,
        Code::Ok
        | Code::Cancelled
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::DataLoss
        | Code::Unauthenticated => None,
    }
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
pub(crate) const fn is_server_failure(code: Code) -> bool {
    match code {
        Code::Unavailable
        | Code::Internal
        | Code::Unknown
        | Code::DataLoss
        | Code::DeadlineExceeded => true,
        Code::Ok
        | Code::Cancelled
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::ResourceExhausted
        | Code::FailedPrecondition
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::Unauthenticated => false,
    }
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

    fn retry_info_status(code: Code, delay: Duration) -> Status {
        Status::with_error_details(code, "x", ErrorDetails::with_retry_info(Some(delay)))
    }

    /// Every gRPC status code, 0 to 16 (the exhaustive matches above break the build when
    /// tonic adds one).
    fn all_codes() -> impl Iterator<Item = Code> {
        (0..17).map(Code::from_i32)
    }

    #[test]
    fn our_non_retryable_codes_are_never_retried_whatever_the_status() {
        let none = HeaderMap::new();
        for reason in [
            "idempotency_key_mismatch",
            "idempotency_key_missing",
            "idempotency_key_invalid",
        ] {
            for code in all_codes() {
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

    /// The status table of the module docs, one arm per code and no wildcard: whether a status
    /// without our machine code is retried, for `(safe, retry_info, retry_500)`, and at the
    /// throttle price.
    fn expected(code: Code, safe: bool, retry_info: bool, retry_500: bool) -> Option<bool> {
        match code {
            Code::Unavailable => Some(false),
            Code::ResourceExhausted => retry_info.then_some(true),
            Code::DeadlineExceeded => safe.then_some(false),
            Code::Internal | Code::Unknown => (safe && retry_500).then_some(false),
            Code::Ok
            | Code::Cancelled
            | Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::OutOfRange
            | Code::Unimplemented
            | Code::DataLoss
            | Code::Unauthenticated => None,
        }
    }

    #[test]
    fn the_status_table() {
        let none = HeaderMap::new();
        for code in all_codes() {
            let n = code as i32;
            for (safe, retry_info, retry_500) in
                (0..8).map(|b| (b & 1 != 0, b & 2 != 0, b & 4 != 0))
            {
                let s = if retry_info {
                    retry_info_status(code, Duration::from_secs(1))
                } else {
                    Status::new(code, "x")
                };
                let want = expected(code, safe, retry_info, retry_500);
                assert_eq!(
                    status_verdict(code, safe, retry_info, retry_500),
                    want,
                    "{code:?}"
                );
                let got = classify_status(safe, &s, &none, retry_500).0;
                let want = match want {
                    Some(throttle) => Verdict::Retry(RetryReason::Grpc {
                        code: n,
                        reason: None,
                        throttle,
                    }),
                    None => Verdict::Done,
                };
                assert_eq!(
                    got, want,
                    "{code:?} safe={safe} retry_info={retry_info} retry_500={retry_500}"
                );
            }
        }
        let quota = retry_info_status(Code::ResourceExhausted, Duration::from_secs(3));
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
        let bad = retry_info_status(Code::InvalidArgument, Duration::from_secs(1));
        assert_eq!(classify_status(true, &bad, &none, true).0, Verdict::Done);
    }

    #[test]
    fn every_machine_code_decides_whatever_the_status() {
        let none = HeaderMap::new();
        for ours in ErrorCode::ALL {
            for reason in [ours.as_str().to_owned(), ours.as_str().to_ascii_uppercase()] {
                for code in all_codes() {
                    for (safe, retry_500) in [(false, false), (true, false), (true, true)] {
                        let s = with_info(code, &reason);
                        let want = if ours.retryable() {
                            Verdict::Retry(RetryReason::Grpc {
                                code: code as i32,
                                reason: Some(ours.as_str()),
                                throttle: ours == ErrorCode::RequestInFlight,
                            })
                        } else {
                            Verdict::Done
                        };
                        assert_eq!(
                            classify_status(safe, &s, &none, retry_500).0,
                            want,
                            "{reason} as {code:?}, safe={safe}, retry_500={retry_500}"
                        );
                    }
                }
            }
        }
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
