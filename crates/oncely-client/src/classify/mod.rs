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
//!     classify, Outcome, Phase, ProblemFacts, RequestFacts, ResponseFacts, RetryReason, Signal,
//!     TransportFailure, Verdict,
//! };
//!
//! let keyless_post = RequestFacts::new(&Method::POST, false);
//! let timeout = Outcome::Transport { phase: Phase::AfterSend, failure: TransportFailure::Timeout };
//! assert_eq!(classify(&keyless_post, &timeout, false), Verdict::OutcomeUnknown);
//!
//! let keyed_post = RequestFacts::new(&Method::POST, true);
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
//! let retry_me = ProblemFacts::from_json(br#"{"retryable": true}"#).unwrap();
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

//!
//! # Files
//!
//! - `facts.rs`: what classification reads (the request, the response, the transport failure);
//! - `signals.rs`: the server's explicit word and the caller's hook;
//! - `status.rs`: HTTP responses (the explicit word, then the allowlist);
//! - `transport.rs`: attempts that got no response;
//! - `reason.rs`: the verdict and the retry reason.
//!
//! gRPC statuses are classified by the `grpc` feature's `oncely_client::grpc` module, over the
//! same verdicts, reasons and transport rules.

mod facts;
mod reason;
mod signals;
mod status;
mod transport;

pub use facts::{
    IN_FLIGHT_CODE, Outcome, Phase, ProblemFacts, RequestFacts, ResponseFacts, TransportFailure,
    is_idempotent_method,
};
pub use reason::{RetryReason, Verdict, grpc_code_name};
pub use signals::{
    ResponseClassifier, STRIPE_SHOULD_RETRY, Signal, X_SHOULD_RETRY, bool_header, explicit_word,
};
pub use status::{classify, classify_with, needs_problem_body};
pub use transport::classify_transport;
