//! # oncely-client: retry writes safely
//!
//! The client half of Oncely. A retry loop that is safe to leave on by default for callers who
//! never read its docs:
//!
//! - **an explicit allowlist** of what is retried ([`classify`]), keyed on the method, on whether
//!   the request carries an `Idempotency-Key`, and on whether a failure happened before or after
//!   the request was sent; an ambiguous failure that cannot be retried safely is reported as
//!   "outcome unknown", never silently repeated;
//! - **idempotency keys** ([`key`]) minted once per logical call for `POST` and `PATCH` and reused
//!   on every attempt, or your own (an event-derived key is best);
//! - **full-jitter backoff** ([`backoff`]) that stays within `[0, cap]` for any attempt number;
//! - **`Retry-After`** ([`retry_after`]) in all its RFC 9110 forms, as a lower bound on the
//!   jittered backoff;
//! - **two bounds per call**: at most 3 attempts *and* one overall deadline ([`deadline`]), with
//!   each attempt's timeout cut to the time left, and a 3 s connect timeout inside it: a failure
//!   before the request was written (refused, DNS, connect timeout) is "not sent" and retried
//!   for any method;
//! - **caller keys checked** with the server's rules (1 to 255 visible ASCII characters) before
//!   anything is sent;
//! - **a retry budget** ([`budget`]) shared by every request of a client, so a fleet cannot turn an
//!   outage into a retry storm;
//! - `tracing` logs and [`metrics`] counters for every retry;
//! - a deterministic [`simulate`] module comparing backoff strategies and budgets;
//! - **two transports, one retry core**: the reqwest middleware ([`middleware`]) and, with the
//!   `grpc` feature, a tower layer for tonic channels (`grpc`: the key in `idempotency-key`
//!   metadata, the time left as `grpc-timeout`, `google.rpc.RetryInfo` honoured like
//!   `Retry-After`). Both drive the same policy, backoff, budget and deadline code
//!   ([`schedule`]); only sending an attempt and reading its outcome differ.
//!
//! What it promises is *effectively-once* with a server that honours `Idempotency-Key`
//! (Oncely's server half, or Stripe-like APIs): at-least-once delivery plus duplicate collapse on
//! the server. It does not promise exactly-once execution, which no client can: a request that
//! timed out may have run, and only the key lets a retry find out without running it twice.
//!
//! ## Quick start
//!
//! ```no_run
//! use std::time::Duration;
//! use oncely_client::{IdempotencyKeyExt, OncelyRetry, RetryError, RetryPolicy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // The defaults: 3 attempts, a 30 s deadline, 10 s per attempt and 3 s to connect, full
//! // jitter from 500 ms capped at 8 s, a 500-token retry budget, keys minted for POST and PATCH.
//! let retry = OncelyRetry::new(RetryPolicy::new());
//! let client = retry.clone().client()?; // 3 s connect timeout, the retry layer, its guard
//!
//! let result = client
//!     .post("http://127.0.0.1:8080/orders/42/confirm")
//!     .idempotency_key("order-confirm-42") // event-derived: the recommended form
//!     .body(r#"{"amount":1000}"#)
//!     .send()
//!     .await;
//! match result {
//!     Ok(response) => println!("{}", response.status()),
//!     Err(e) => match RetryError::from_middleware(&e) {
//!         Some(stop) if stop.is_outcome_unknown() => println!("may have run: {stop}"),
//!         Some(stop) => println!("gave up after {} attempts: {stop}", stop.attempts()),
//!         None => return Err(e.into()),
//!     },
//! }
//! println!("{:?}", retry.metrics().snapshot());
//! # Ok(()) }
//! ```
//!
//! ## The server's word, in order of precedence
//!
//! For an error response (status 400 or above), the first of these that is present decides
//! ([`classify`] has the details):
//!
//! 1. problem+json (RFC 9457) `retryable: true|false`, from a JSON body of at most 64 KiB
//!    (with a `Content-Length` or chunked; a body that breaks or stalls counts as absent, and
//!    the status decides);
//! 2. `x-should-retry: true|false` (the Stainless-generated SDKs' convention);
//! 3. `Stripe-Should-Retry: true|false` (Stripe's);
//! 4. the caller's hook, [`classify::ResponseClassifier`] (per client or per call);
//! 5. the allowlist (429, 408, 503, the in-flight 409; 502/504 and opt-in 500 when safe).
//!
//! `false` returns the response as is. `true` retries it, even a status the allowlist would
//! return (a `500`, a `400`), but only when the request is safe to repeat (idempotent method or
//! idempotency key): a keyless `POST` that may have run is never repeated. The attempt limit,
//! the deadline and the retry budget bound every retry, whoever asked for it.
//!
//! ```
//! use http::{HeaderMap, HeaderValue, Method, StatusCode};
//! use oncely_client::classify::{classify, Outcome, ProblemFacts, RequestFacts, ResponseFacts, Verdict};
//!
//! let get = RequestFacts::new(&Method::GET, false);
//! let mut headers = HeaderMap::new();
//! headers.insert("x-should-retry", HeaderValue::from_static("false"));
//! headers.insert("stripe-should-retry", HeaderValue::from_static("true"));
//! let unavailable = |problem| Outcome::Response(ResponseFacts::new(StatusCode::SERVICE_UNAVAILABLE, &headers, problem));
//!
//! // x-should-retry (2) beats Stripe-Should-Retry (3) and the allowlist (5): not retried.
//! assert_eq!(classify(&get, &unavailable(None), false), Verdict::Done);
//! // problem+json `retryable` (1) beats them all: retried.
//! let problem = ProblemFacts::from_json(br#"{"retryable": true}"#).unwrap();
//! assert!(matches!(classify(&get, &unavailable(Some(&problem)), false), Verdict::Retry(_)));
//! ```
//!
//! ## Layering: one retry layer per stack
//!
//! With other resilience pieces, outermost first: **Retry -> CircuitBreaker -> RateLimiter ->
//! Bulkhead**, then this crate's [`SendGuard`] last (see [`middleware`]). Two retry layers never
//! multiply: an inner [`OncelyRetry`] sees the outer one and passes through, so our layer added
//! twice still makes the policy's 3 attempts; another retry layer (such as reqwest-retry) under
//! ours is not supported, and the [`SendGuard`] at the bottom refuses its sends beyond the
//! call's attempt limit or deadline and makes our layer stop with
//! [`StopReason::NestedRetryLayer`]. [`OncelyRetry::wrap`] and [`OncelyRetry::client`] install
//! the guard for you.
//!
//! ```no_run
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # fn build(breaker: impl reqwest_middleware::Middleware, limiter: impl reqwest_middleware::Middleware)
//! # -> Result<reqwest_middleware::ClientWithMiddleware, reqwest::Error> {
//! let retry = OncelyRetry::new(RetryPolicy::new());
//! let client = reqwest_middleware::ClientBuilder::new(retry.client_builder().build()?)
//!     .with(retry.clone()) // Retry: the one retry loop, one deadline per call
//!     .with(breaker)       // CircuitBreaker: counts attempts, not logical calls
//!     .with(limiter)       // RateLimiter (then Bulkhead): bound what reaches the network
//!     .with(retry.guard()) // SendGuard: counts and caps what really goes out
//!     .build();
//! # Ok(client) }
//! ```
//!
//! ## Simulations
//!
//! ```
//! use oncely_client::simulate::{ContentionConfig, Strategy, run_contention};
//!
//! let report = run_contention(&ContentionConfig::new().with_clients(20), Strategy::FullJitter);
//! assert_eq!(report.completed, 20);
//! ```

pub mod backoff;
pub mod budget;
pub mod classify;
pub mod deadline;
mod driver;
pub mod error;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod key;
pub mod metrics;
pub mod middleware;
mod options;
pub mod policy;
pub mod retry_after;
pub mod schedule;
pub mod simulate;
pub mod timer;

pub use backoff::{Backoff, Jitter};
pub use budget::{BudgetConfig, RetryBudget};
pub use error::{RetryError, StopReason};
pub use key::IdempotencyKeyExt;
pub use key::{IdempotencyKey, KeyError};
pub use metrics::{RetryMetrics, RetryMetricsSnapshot};
pub use middleware::{OncelyRetry, SendGuard};
pub use options::CallOptions;
pub use policy::RetryPolicy;
