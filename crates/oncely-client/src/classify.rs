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
//! # The server's explicit word comes first
//!
//! Before the allowlist, an error response (status 400 or above) is checked for an explicit
//! "retry" or "do not retry" from the server, in this order; **the first one present decides**:
//!
//! 1. the problem+json (RFC 9457) extension `retryable` (`true` / `false`), read from a JSON
//!    body of at most 64 KiB;
//! 2. the `x-should-retry` header (`true` / `false`), the convention of the Stainless-generated
//!    SDKs (OpenAI, Anthropic, ...);
//! 3. the `Stripe-Should-Retry` header (`true` / `false`), Stripe's documented signal;
//! 4. the caller's [`ResponseClassifier`], if one is set (for a signal this crate does not know);
//! 5. the allowlist above.
//!
//! A malformed value (anything but `true` or `false`, ignoring ASCII case and surrounding
//! whitespace) counts as absent. What the word does:
//!
//! - `false`: the response is returned as is, even a `503` or a `429`.
//! - `true`: the response is retried if the allowlist retries it, **and also** if its status is
//!   otherwise not retried (a `500`, a `400`...) but the request is safe to repeat (an
//!   idempotent method or an idempotency key): like the Stainless SDKs, `x-should-retry: true`
//!   forces a retry. It never makes an unsafe request retryable: a keyless `POST` answered `500`
//!   may have run, and is returned as is ([`RetryReason::ServerAsked`] is only ever given to safe
//!   requests).
//!
//! Whatever the word, the attempt limit, the deadline and the retry budget still bound the call.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, Method, StatusCode};
//! use oncely_client::classify::{
//!     classify, Outcome, Phase, Problem, RequestFacts, ResponseFacts, RetryReason, Signal,
//!     TransportFailure, Verdict,
//! };
//!
//! let keyless_post = RequestFacts { method: &Method::POST, has_key: false };
//! let timeout = Outcome::Transport { phase: Phase::AfterSend, failure: TransportFailure::Timeout };
//! assert_eq!(classify(&keyless_post, &timeout, false), Verdict::OutcomeUnknown);
//!
//! let keyed_post = RequestFacts { method: &Method::POST, has_key: true };
//! assert!(matches!(classify(&keyed_post, &timeout, false), Verdict::Retry(_)));
//!
//! let none = HeaderMap::new();
//! let unprocessable = ResponseFacts::new(StatusCode::UNPROCESSABLE_ENTITY, &none, None);
//! assert_eq!(classify(&keyed_post, &Outcome::Response(unprocessable), false), Verdict::Done);
//!
//! // The precedence: problem+json `retryable`, then x-should-retry, then Stripe-Should-Retry.
//! let mut headers = HeaderMap::new();
//! headers.insert("x-should-retry", HeaderValue::from_static("false"));
//! headers.insert("stripe-should-retry", HeaderValue::from_static("true"));
//! let unavailable = ResponseFacts::new(StatusCode::SERVICE_UNAVAILABLE, &headers, None);
//! assert_eq!(classify(&keyed_post, &Outcome::Response(unavailable), false), Verdict::Done);
//! let retry_me = Problem::from_json(br#"{"retryable": true}"#).unwrap();
//! let with_problem = ResponseFacts::new(StatusCode::SERVICE_UNAVAILABLE, &headers, Some(&retry_me));
//! assert!(matches!(classify(&keyed_post, &Outcome::Response(with_problem), false), Verdict::Retry(_)));
//!
//! // `true` forces a retry of a status the allowlist does not retry, for a safe request only.
//! let mut forced = HeaderMap::new();
//! forced.insert("x-should-retry", HeaderValue::from_static("true"));
//! let bug = Outcome::Response(ResponseFacts::new(StatusCode::INTERNAL_SERVER_ERROR, &forced, None));
//! assert_eq!(
//!     classify(&keyed_post, &bug, false),
//!     Verdict::Retry(RetryReason::ServerAsked {
//!         status: StatusCode::INTERNAL_SERVER_ERROR,
//!         signal: Signal::XShouldRetry,
//!     })
//! );
//! assert_eq!(classify(&keyless_post, &bug, false), Verdict::Done);
//! ```

use std::fmt;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, Method, StatusCode};
use serde::Deserialize;

use crate::budget::RetryCost;

/// The problem+json `code` of the server's "a request with this key is still running" conflict.
pub const IN_FLIGHT_CODE: &str = "idempotency_request_in_flight";

/// The Stainless convention's header: `x-should-retry: true|false`.
pub const X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");

/// Stripe's header: `Stripe-Should-Retry: true|false` (stored lower case, as `http` does).
pub const STRIPE_SHOULD_RETRY: HeaderName = HeaderName::from_static("stripe-should-retry");

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

/// A response, as far as classification cares.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct ResponseFacts<'a> {
    /// Its status.
    pub status: StatusCode,
    /// Its headers (for `x-should-retry` and `Stripe-Should-Retry`).
    pub headers: &'a HeaderMap,
    /// Its problem+json body, when it had one and it was read.
    pub problem: Option<&'a Problem>,
}

impl<'a> ResponseFacts<'a> {
    /// The facts of one response.
    pub const fn new(
        status: StatusCode,
        headers: &'a HeaderMap,
        problem: Option<&'a Problem>,
    ) -> Self {
        Self {
            status,
            headers,
            problem,
        }
    }
}

/// One attempt's outcome, as far as classification cares.
#[derive(Clone, Copy, Debug)]
pub enum Outcome<'a> {
    /// A response arrived.
    Response(ResponseFacts<'a>),
    /// No response arrived.
    Transport {
        /// When the failure happened.
        phase: Phase,
        /// What it was.
        failure: TransportFailure,
    },
}

/// Where an explicit "retry" / "do not retry" came from (see the [module docs](self) for the
/// order in which they are read).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Signal {
    /// The problem+json `retryable` extension.
    ProblemRetryable,
    /// The `x-should-retry` header (Stainless convention).
    XShouldRetry,
    /// The `Stripe-Should-Retry` header.
    StripeShouldRetry,
    /// The caller's [`ResponseClassifier`].
    Caller,
}

impl fmt::Display for Signal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProblemRetryable => "problem+json retryable",
            Self::XShouldRetry => "x-should-retry",
            Self::StripeShouldRetry => "Stripe-Should-Retry",
            Self::Caller => "the caller's classifier",
        })
    }
}

/// The caller's hook: an extra "retry" (`Some(true)`) / "do not retry" (`Some(false)`) signal
/// read from a response, or `None` for no opinion (the allowlist then decides).
///
/// It is read after the server's own signals (problem+json `retryable`, `x-should-retry`,
/// `Stripe-Should-Retry`) and before the allowlist, only for error responses (status 400 or
/// above), and obeys the same limits: `Some(true)` retries only a request that is safe to
/// repeat, within the attempt limit, the deadline and the budget. Set it for every call with
/// [`crate::OncelyRetry::with_classifier`] or for one with [`crate::CallOptions::with_classifier`].
///
/// ```
/// use oncely_client::classify::ResponseClassifier;
///
/// // An API that says "come back later" with its own header.
/// let hook = ResponseClassifier::new(|r| {
///     r.headers.get("x-acme-retryable").map(|v| v.as_bytes() == b"yes")
/// });
/// # let _ = hook;
/// ```
#[derive(Clone)]
pub struct ResponseClassifier(Arc<ClassifyFn>);

type ClassifyFn = dyn Fn(&ResponseFacts<'_>) -> Option<bool> + Send + Sync;

impl ResponseClassifier {
    /// Wraps a function from a response's facts to `Some(retry?)` or `None` (no opinion).
    pub fn new(f: impl Fn(&ResponseFacts<'_>) -> Option<bool> + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// Runs the hook.
    pub fn should_retry(&self, response: &ResponseFacts<'_>) -> Option<bool> {
        (self.0)(response)
    }
}

impl fmt::Debug for ResponseClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ResponseClassifier(..)")
    }
}

/// Reads a `true` / `false` header (ASCII case and surrounding whitespace ignored); anything
/// else, or several values, counts as absent.
pub fn bool_header(headers: &HeaderMap, name: &HeaderName) -> Option<bool> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    if values.next().is_some() {
        return None;
    }
    let value = value.to_str().ok()?.trim();
    if value.eq_ignore_ascii_case("true") {
        Some(true)
    } else if value.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// The first explicit word present, in the documented order: problem+json `retryable`,
/// `x-should-retry`, `Stripe-Should-Retry`, then the caller's hook.
pub fn explicit_word(
    response: &ResponseFacts<'_>,
    caller: Option<&ResponseClassifier>,
) -> Option<(Signal, bool)> {
    if let Some(r) = response.problem.and_then(|p| p.retryable) {
        return Some((Signal::ProblemRetryable, r));
    }
    if let Some(r) = bool_header(response.headers, &X_SHOULD_RETRY) {
        return Some((Signal::XShouldRetry, r));
    }
    if let Some(r) = bool_header(response.headers, &STRIPE_SHOULD_RETRY) {
        return Some((Signal::StripeShouldRetry, r));
    }
    caller
        .and_then(|c| c.should_retry(response))
        .map(|r| (Signal::Caller, r))
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

/// Classifies one attempt's outcome; `retry_500` enables retrying `500` for requests that are
/// safe to repeat. The same as [`classify_with`] without a caller hook.
pub fn classify(request: &RequestFacts<'_>, outcome: &Outcome<'_>, retry_500: bool) -> Verdict {
    classify_with(request, outcome, retry_500, None)
}

/// Classifies one attempt's outcome with the caller's hook (see the [module docs](self) for the
/// order of the signals).
pub fn classify_with(
    request: &RequestFacts<'_>,
    outcome: &Outcome<'_>,
    retry_500: bool,
    caller: Option<&ResponseClassifier>,
) -> Verdict {
    let safe = request.safe_to_repeat();
    match *outcome {
        Outcome::Transport { phase, failure } => classify_transport(safe, phase, failure),
        Outcome::Response(response) => {
            let allowed = allowlist(&response, safe, retry_500);
            if response.status.as_u16() < 400 {
                return allowed;
            }
            match explicit_word(&response, caller) {
                Some((_, false)) => Verdict::Done,
                Some((signal, true)) => match allowed {
                    Verdict::Retry(_) => allowed,
                    _ if safe => Verdict::Retry(RetryReason::ServerAsked {
                        status: response.status,
                        signal,
                    }),
                    _ => allowed,
                },
                None => allowed,
            }
        }
    }
}

/// Classifies an attempt that got no response, for any transport (the reqwest middleware and
/// the gRPC layer share it); `safe` says whether repeating the request cannot cause a second
/// side effect (an idempotent method or gRPC method, or an idempotency key).
///
/// A failure before sending is retried whatever the request; a timeout or a reset after
/// sending only when `safe`, otherwise the outcome is unknown (case C1); any other failure is
/// a bug and not retried.
pub fn classify_transport(safe: bool, phase: Phase, failure: TransportFailure) -> Verdict {
    match (phase, failure) {
        (_, TransportFailure::Other) => Verdict::NotRetryable,
        (Phase::BeforeSend, _) => Verdict::Retry(RetryReason::ConnectFailed),
        (Phase::AfterSend, TransportFailure::Connect) => Verdict::Retry(RetryReason::ConnectFailed),
        (Phase::AfterSend, TransportFailure::Timeout) if safe => {
            Verdict::Retry(RetryReason::TimedOut)
        }
        (Phase::AfterSend, TransportFailure::Reset) if safe => {
            Verdict::Retry(RetryReason::ConnectionReset)
        }
        (Phase::AfterSend, _) => Verdict::OutcomeUnknown,
    }
}

/// The allowlist alone (no explicit word).
fn allowlist(response: &ResponseFacts<'_>, safe: bool, retry_500: bool) -> Verdict {
    let status = response.status;
    match status {
        StatusCode::TOO_MANY_REQUESTS => Verdict::Retry(RetryReason::Throttled),
        StatusCode::REQUEST_TIMEOUT => Verdict::Retry(RetryReason::RequestTimeout),
        StatusCode::CONFLICT
            if response.problem.and_then(|p| p.code.as_deref()) == Some(IN_FLIGHT_CODE) =>
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

/// Whether a response's problem+json body is read to classify it: every error response
/// (status 400 or above), since any of them may carry `retryable` or the in-flight `code`.
/// The middleware reads it only when it is JSON and at most 64 KiB.
pub fn needs_problem_body(status: StatusCode) -> bool {
    status.as_u16() >= 400
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

    static NO_HEADERS: std::sync::LazyLock<HeaderMap> = std::sync::LazyLock::new(HeaderMap::new);

    fn resp(status: u16, problem: Option<&Problem>) -> Outcome<'_> {
        Outcome::Response(ResponseFacts::new(
            StatusCode::from_u16(status).unwrap(),
            &NO_HEADERS,
            problem,
        ))
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

    fn with_headers<'a>(
        status: u16,
        headers: &'a HeaderMap,
        problem: Option<&'a Problem>,
    ) -> Outcome<'a> {
        Outcome::Response(ResponseFacts::new(
            StatusCode::from_u16(status).unwrap(),
            headers,
            problem,
        ))
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(*name, http::HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn bool_headers_accept_only_one_true_or_false() {
        let name = X_SHOULD_RETRY;
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", " True ")]), &name),
            Some(true)
        );
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", "false")]), &name),
            Some(false)
        );
        assert_eq!(
            bool_header(&headers(&[("x-should-retry", "1")]), &name),
            None
        );
        assert_eq!(
            bool_header(
                &headers(&[("x-should-retry", "true"), ("x-should-retry", "false")]),
                &name
            ),
            None
        );
        assert_eq!(bool_header(&HeaderMap::new(), &name), None);
    }

    #[test]
    fn explicit_word_precedence_and_limits() {
        let stripe_no = headers(&[("stripe-should-retry", "false")]);
        assert_eq!(
            classify(&GET, &with_headers(503, &stripe_no, None), false),
            Verdict::Done
        );
        let both = headers(&[("x-should-retry", "true"), ("stripe-should-retry", "false")]);
        assert!(matches!(
            classify(&GET, &with_headers(503, &both, None), false),
            Verdict::Retry(RetryReason::ServerError(_))
        ));
        // `true` on a status the allowlist returns: retried only when safe to repeat.
        let yes = headers(&[("x-should-retry", "true")]);
        assert_eq!(
            classify(&KEYED_POST, &with_headers(400, &yes, None), false),
            Verdict::Retry(RetryReason::ServerAsked {
                status: StatusCode::BAD_REQUEST,
                signal: Signal::XShouldRetry
            })
        );
        assert_eq!(
            classify(&POST, &with_headers(400, &yes, None), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&POST, &with_headers(500, &yes, None), false),
            Verdict::Done
        );
        // Success and redirects are never turned into retries.
        assert_eq!(
            classify(&GET, &with_headers(200, &yes, None), false),
            Verdict::Done
        );
        assert_eq!(
            classify(&GET, &with_headers(304, &yes, None), false),
            Verdict::Done
        );
        // The problem's `retryable` comes first.
        let no = Problem {
            code: None,
            retryable: Some(false),
        };
        assert_eq!(
            classify(&GET, &with_headers(503, &yes, Some(&no)), false),
            Verdict::Done
        );
        // The caller's hook comes after the server's headers, before the allowlist.
        let hook =
            ResponseClassifier::new(|r| (r.status == StatusCode::IM_A_TEAPOT).then_some(true));
        let none = HeaderMap::new();
        assert_eq!(
            classify_with(&GET, &with_headers(418, &none, None), false, Some(&hook)),
            Verdict::Retry(RetryReason::ServerAsked {
                status: StatusCode::IM_A_TEAPOT,
                signal: Signal::Caller
            })
        );
        let refuse = ResponseClassifier::new(|_| Some(false));
        assert!(matches!(
            classify_with(&GET, &with_headers(503, &yes, None), false, Some(&refuse)),
            Verdict::Retry(_)
        ));
        assert_eq!(
            classify_with(&GET, &with_headers(503, &none, None), false, Some(&refuse)),
            Verdict::Done
        );
        assert_eq!(
            RetryReason::ServerAsked {
                status: StatusCode::TOO_MANY_REQUESTS,
                signal: Signal::StripeShouldRetry
            }
            .cost(),
            RetryCost::Throttle
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
