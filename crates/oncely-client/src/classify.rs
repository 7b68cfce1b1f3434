//! Outcome classification: is this attempt's outcome retried, returned, or an unknown outcome?
//!
//! The verdict is keyed on three facts, and nothing else:
//!
//! - the **method**: `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT` and `DELETE` are idempotent by
//!   RFC 9110 section 9.2.2, so repeating them is safe;
//! - whether the request carries an **`Idempotency-Key`**: with one, the server collapses repeats
//!   (IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field"), so a `POST` becomes safe too;
//! - the **phase** of a transport failure: [`Phase::BeforeSend`] (the connection was never made,
//!   so the server cannot have seen the request) or [`Phase::AfterSend`] (the request may have
//!   reached the server and run: the outcome is ambiguous).
//!
//! # The allowlist
//!
//! | outcome | verdict |
//! |---|---|
//! | connection failure before sending | retry, any method |
//! | `429 Too Many Requests` | retry (throttle price) |
//! | `408 Request Timeout` | retry: the server says it did not receive the whole request |
//! | `503 Service Unavailable` | retry: the server says it did not handle the request |
//! | `502`, `504` | retry when safe to repeat (a gateway may have forwarded the request) |
//! | `409` with problem+json `code: "idempotency_request_in_flight"` | retry (throttle price) |
//! | `500` | retry only if enabled ([`crate::policy::RetryPolicy::with_retry_500`]) and safe to repeat |
//! | timeout or reset after sending, safe to repeat | retry |
//! | timeout or reset after sending, *not* safe to repeat | [`Verdict::OutcomeUnknown`] |
//! | any problem+json with `retryable: false` | returned as is: the server's "do not retry" wins |
//! | any other response (2xx, 3xx, other 4xx including `422`) | returned as is |
//! | any other transport error (a bug: bad URL, redirect loop, body error) | [`Verdict::NotRetryable`] |
//!
//! ```
//! use http::{Method, StatusCode};
//! use oncely_client::classify::{classify, Outcome, Phase, RequestFacts, TransportFailure, Verdict};
//!
//! let keyless_post = RequestFacts { method: &Method::POST, has_key: false };
//! let timeout = Outcome::Transport { phase: Phase::AfterSend, failure: TransportFailure::Timeout };
//! assert_eq!(classify(&keyless_post, &timeout, false), Verdict::OutcomeUnknown);
//!
//! let keyed_post = RequestFacts { method: &Method::POST, has_key: true };
//! assert!(matches!(classify(&keyed_post, &timeout, false), Verdict::Retry(_)));
//!
//! let unprocessable = Outcome::Response { status: StatusCode::UNPROCESSABLE_ENTITY, problem: None };
//! assert_eq!(classify(&keyed_post, &unprocessable, false), Verdict::Done);
//! ```

use std::fmt;

use http::{Method, StatusCode};
use serde::Deserialize;

use crate::budget::RetryCost;

/// The problem+json `code` of the server's "a request with this key is still running" conflict.
pub const IN_FLIGHT_CODE: &str = "idempotency_request_in_flight";

/// When a transport failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before any byte of the request could reach the server (the connection failed).
    BeforeSend,
    /// After the request may have been sent: the server may have acted on it.
    AfterSend,
}

/// What kind of transport failure an attempt ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TransportFailure {
    /// The connection could not be established (refused, DNS, connect timeout).
    Connect,
    /// The attempt timed out.
    Timeout,
    /// The connection was reset or closed before a complete response arrived.
    Reset,
    /// Anything else (invalid request, redirect policy, body error): a bug, never retried.
    Other,
}

/// The fields of an RFC 9457 problem+json body that classification reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Problem {
    /// The machine-readable `code` extension, such as `idempotency_request_in_flight`.
    #[serde(default)]
    pub code: Option<String>,
    /// The `retryable` extension: `Some(false)` is the server's explicit "do not retry".
    #[serde(default)]
    pub retryable: Option<bool>,
}

impl Problem {
    /// Parses a JSON body; `None` if it is not a JSON object.
    pub fn from_json(body: &[u8]) -> Option<Self> {
        serde_json::from_slice(body).ok()
    }
}

/// One attempt's outcome, as far as classification cares.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// A response arrived.
    Response {
        /// Its status.
        status: StatusCode,
        /// Its problem+json body, when it had one and it was read.
        problem: Option<&'a Problem>,
    },
    /// No response arrived.
    Transport {
        /// When the failure happened.
        phase: Phase,
        /// What it was.
        failure: TransportFailure,
    },
}

/// The request facts classification depends on.
#[derive(Clone, Copy, Debug)]
pub struct RequestFacts<'a> {
    /// The request method.
    pub method: &'a Method,
    /// Whether the request carries an `Idempotency-Key` header.
    pub has_key: bool,
}

impl RequestFacts<'_> {
    /// Whether repeating the request cannot cause a second side effect: an idempotent method
    /// (RFC 9110 section 9.2.2) or an idempotency key.
    pub fn safe_to_repeat(&self) -> bool {
        self.has_key || is_idempotent_method(self.method)
    }
}

/// `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`: idempotent by RFC 9110 section 9.2.2.
pub fn is_idempotent_method(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

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
}

impl RetryReason {
    /// The budget price of retrying for this reason: throttling (`429`, in-flight) pays the
    /// throttle price, everything else the transient price.
    pub fn cost(&self) -> RetryCost {
        match self {
            Self::Throttled | Self::InFlight => RetryCost::Throttle,
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
        }
    }
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

/// Classifies one attempt's outcome; `retry_500` enables retrying `500` for requests that are
/// safe to repeat.
pub fn classify(request: &RequestFacts<'_>, outcome: &Outcome<'_>, retry_500: bool) -> Verdict {
    let safe = request.safe_to_repeat();
    match *outcome {
        Outcome::Transport { phase, failure } => match (phase, failure) {
            (_, TransportFailure::Other) => Verdict::NotRetryable,
            (Phase::BeforeSend, _) => Verdict::Retry(RetryReason::ConnectFailed),
            (Phase::AfterSend, TransportFailure::Connect) => {
                Verdict::Retry(RetryReason::ConnectFailed)
            }
            (Phase::AfterSend, TransportFailure::Timeout) if safe => {
                Verdict::Retry(RetryReason::TimedOut)
            }
            (Phase::AfterSend, TransportFailure::Reset) if safe => {
                Verdict::Retry(RetryReason::ConnectionReset)
            }
            (Phase::AfterSend, _) => Verdict::OutcomeUnknown,
        },
        Outcome::Response { status, problem } => {
            if problem.and_then(|p| p.retryable) == Some(false) {
                return Verdict::Done;
            }
            match status {
                StatusCode::TOO_MANY_REQUESTS => Verdict::Retry(RetryReason::Throttled),
                StatusCode::REQUEST_TIMEOUT => Verdict::Retry(RetryReason::RequestTimeout),
                StatusCode::CONFLICT
                    if problem.and_then(|p| p.code.as_deref()) == Some(IN_FLIGHT_CODE) =>
                {
                    Verdict::Retry(RetryReason::InFlight)
                }
                StatusCode::SERVICE_UNAVAILABLE => Verdict::Retry(RetryReason::ServerError(status)),
                StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT if safe => {
                    Verdict::Retry(RetryReason::ServerError(status))
                }
                StatusCode::INTERNAL_SERVER_ERROR if retry_500 && safe => {
                    Verdict::Retry(RetryReason::ServerError(status))
                }
                _ => Verdict::Done,
            }
        }
    }
}

/// Whether a response's problem+json body must be read to classify it: a `409` (is it the
/// in-flight conflict?) or a status that would be retried (does it say `retryable: false`?).
pub fn needs_problem_body(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::CONFLICT
            | StatusCode::TOO_MANY_REQUESTS
            | StatusCode::REQUEST_TIMEOUT
            | StatusCode::INTERNAL_SERVER_ERROR
            | StatusCode::BAD_GATEWAY
            | StatusCode::SERVICE_UNAVAILABLE
            | StatusCode::GATEWAY_TIMEOUT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resp(status: u16, problem: Option<&Problem>) -> Outcome<'_> {
        Outcome::Response {
            status: StatusCode::from_u16(status).unwrap(),
            problem,
        }
    }

    const POST: RequestFacts<'static> = RequestFacts {
        method: &Method::POST,
        has_key: false,
    };
    const KEYED_POST: RequestFacts<'static> = RequestFacts {
        method: &Method::POST,
        has_key: true,
    };
    const GET: RequestFacts<'static> = RequestFacts {
        method: &Method::GET,
        has_key: false,
    };

    #[test]
    fn client_errors_are_never_retried() {
        for status in [400, 401, 403, 404, 405, 409, 410, 412, 413, 422] {
            for req in [POST, KEYED_POST, GET] {
                assert_eq!(classify(&req, &resp(status, None), true), Verdict::Done);
            }
        }
    }

    #[test]
    fn throttles_and_unavailable_are_retried_for_every_method() {
        for req in [POST, KEYED_POST, GET] {
            assert_eq!(
                classify(&req, &resp(429, None), false),
                Verdict::Retry(RetryReason::Throttled)
            );
            assert_eq!(
                classify(&req, &resp(408, None), false),
                Verdict::Retry(RetryReason::RequestTimeout)
            );
            assert!(matches!(
                classify(&req, &resp(503, None), false),
                Verdict::Retry(RetryReason::ServerError(_))
            ));
        }
    }

    #[test]
    fn gateway_errors_need_a_safe_request() {
        assert_eq!(classify(&POST, &resp(502, None), false), Verdict::Done);
        assert_eq!(classify(&POST, &resp(504, None), false), Verdict::Done);
        assert!(matches!(
            classify(&KEYED_POST, &resp(504, None), false),
            Verdict::Retry(_)
        ));
        assert!(matches!(
            classify(&GET, &resp(502, None), false),
            Verdict::Retry(_)
        ));
    }

    #[test]
    fn five_hundred_is_off_by_default() {
        assert_eq!(classify(&GET, &resp(500, None), false), Verdict::Done);
        assert!(matches!(
            classify(&GET, &resp(500, None), true),
            Verdict::Retry(_)
        ));
        assert_eq!(classify(&POST, &resp(500, None), true), Verdict::Done);
    }

    #[test]
    fn problem_json_codes() {
        let in_flight = Problem {
            code: Some(IN_FLIGHT_CODE.into()),
            retryable: Some(true),
        };
        assert_eq!(
            classify(&KEYED_POST, &resp(409, Some(&in_flight)), false),
            Verdict::Retry(RetryReason::InFlight)
        );
        let mismatch = Problem {
            code: Some("idempotency_key_mismatch".into()),
            retryable: Some(false),
        };
        assert_eq!(
            classify(&KEYED_POST, &resp(422, Some(&mismatch)), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&KEYED_POST, &resp(409, Some(&mismatch)), false),
            Verdict::Done
        );
        let no = Problem {
            code: None,
            retryable: Some(false),
        };
        assert_eq!(classify(&GET, &resp(503, Some(&no)), false), Verdict::Done);
        assert_eq!(classify(&GET, &resp(429, Some(&no)), false), Verdict::Done);
    }

    #[test]
    fn transport_phases() {
        let t = |phase, failure| Outcome::Transport { phase, failure };
        assert_eq!(
            classify(
                &POST,
                &t(Phase::BeforeSend, TransportFailure::Connect),
                false
            ),
            Verdict::Retry(RetryReason::ConnectFailed)
        );
        assert_eq!(
            classify(
                &POST,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(&POST, &t(Phase::AfterSend, TransportFailure::Reset), false),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(
                &KEYED_POST,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::Retry(RetryReason::TimedOut)
        );
        for m in [
            Method::GET,
            Method::PUT,
            Method::DELETE,
            Method::HEAD,
            Method::OPTIONS,
        ] {
            let req = RequestFacts {
                method: &m,
                has_key: false,
            };
            assert_eq!(
                classify(&req, &t(Phase::AfterSend, TransportFailure::Reset), false),
                Verdict::Retry(RetryReason::ConnectionReset)
            );
        }
        let patch = RequestFacts {
            method: &Method::PATCH,
            has_key: false,
        };
        assert_eq!(
            classify(
                &patch,
                &t(Phase::AfterSend, TransportFailure::Timeout),
                false
            ),
            Verdict::OutcomeUnknown
        );
        assert_eq!(
            classify(&GET, &t(Phase::BeforeSend, TransportFailure::Other), false),
            Verdict::NotRetryable
        );
    }

    #[test]
    fn problem_parsing() {
        let p = Problem::from_json(
            br#"{"type":"about:blank","status":409,"code":"idempotency_request_in_flight","retryable":true}"#,
        )
        .unwrap();
        assert_eq!(p.code.as_deref(), Some(IN_FLIGHT_CODE));
        assert_eq!(p.retryable, Some(true));
        assert!(Problem::from_json(b"not json").is_none());
    }
}
