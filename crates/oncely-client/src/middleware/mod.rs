//! The reqwest-middleware face: [`OncelyRetry`] and its [`SendGuard`].
//!
//! ```no_run
//! use std::time::Duration;
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let retry = OncelyRetry::new(RetryPolicy::new().with_deadline(Duration::from_secs(10)));
//! // A reqwest client with the policy's connect timeout, our layer on top, the guard below.
//! let client = retry.clone().client()?;
//! let response = client.post("http://127.0.0.1:8080/payments").body("{}").send().await?;
//! println!("{} after {} retries so far", response.status(), retry.metrics().snapshot().retries);
//! # Ok(()) }
//! ```
//!
//! # Where it sits: one retry layer per stack
//!
//! Put it first in the middleware chain (the outermost layer), so that one logical call is one
//! retry loop with one deadline, and put its [`SendGuard`] last (the innermost layer, right
//! above the network). [`OncelyRetry::wrap`] and [`OncelyRetry::client`] do both. With other
//! resilience pieces the order, outermost first, is
//! **Retry -> CircuitBreaker -> RateLimiter -> Bulkhead -> [`SendGuard`]**: the breaker counts
//! every attempt rather than every logical call, and the rate limiter and bulkhead bound the
//! attempts that actually reach the network. An error such a layer returns on its own (an open
//! breaker, a full bulkhead) is returned to the caller at once, not retried: this layer cannot
//! tell what it means.
//!
//! Two retry layers in one stack multiply (3 attempts around 3 attempts is 9 requests), so:
//!
//! - **our layer twice**: the inner instance sees the outer one (a request extension the outer
//!   one sets) and passes each attempt straight through; only the outer one retries, and the
//!   attempt limit, the deadline and the budget hold for the whole stack;
//! - **another retry layer below ours** (reqwest-retry's `RetryTransientMiddleware`, say) is not
//!   supported. Our layer cannot see it, but the [`SendGuard`] below it counts the requests
//!   that really go out: it refuses any beyond the call's attempt limit or past its deadline,
//!   and when one attempt of ours turned into several requests our layer stops with
//!   [`StopReason::NestedRetryLayer`](crate::StopReason::NestedRetryLayer) (the last status is in the error) instead of retrying.
//!   Without the guard (a chain built by hand without [`OncelyRetry::guard`]) nothing can see
//!   the inner layer, and the attempts multiply;
//! - **another retry layer above ours** sees our final error or response and may retry it again:
//!   not supported either; remove one of the two.
//!
//! ```no_run
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # fn build(breaker: impl reqwest_middleware::Middleware) -> reqwest_middleware::ClientWithMiddleware {
//! let retry = OncelyRetry::new(RetryPolicy::new());
//! let client = reqwest_middleware::ClientBuilder::new(retry.client_builder().build().unwrap())
//!     .with(retry.clone()) // outermost: the one retry loop
//!     .with(breaker)       // then circuit breaker, rate limiter, bulkhead
//!     .with(retry.guard()) // innermost: counts what really goes out
//!     .build();
//! # client }
//! ```
//!
//! # What one logical call does
//!
//! 1. Starts the deadline (policy default 30 s, or [`CallOptions`] from the request extensions).
//! 2. Checks a caller's `Idempotency-Key` with the server's rules (1 to 255 visible ASCII
//!    characters, sent once); a bad one ends the call with
//!    [`StopReason::InvalidIdempotencyKey`](crate::StopReason::InvalidIdempotencyKey) before anything is sent.
//! 3. For `POST` and `PATCH` without an `Idempotency-Key`, mints one (UUID v4, unless the policy
//!    or [`CallOptions::with_key_minting`] says not to) and sets it on the request; every attempt
//!    of this call carries that same key.
//! 4. Sends an attempt with the timeout `min(attempt timeout, caller's request timeout, time
//!    left)`. As with reqwest's own request timeout, it also bounds reading the body of the
//!    response that is finally returned.
//! 5. Classifies the outcome ([`crate::classify`]): for an error response (status 400 or above)
//!    with a JSON body of at most 64 KiB (by `Content-Length`, or counted as it arrives for a
//!    chunked body), it reads the body, within what is left of the attempt's time, for the
//!    problem+json `code` and `retryable` fields, and hands the response back intact. A body that
//!    breaks, stalls or is too large is noted in the logs and never changes the verdict: the
//!    status (and the headers) decide, and a response returned to the caller still yields the
//!    bytes that arrived, then the same error.
//! 6. Returns the response, returns an error, or plans a retry ([`crate::schedule`]), logs it
//!    with `tracing` at `INFO` (attempt, reason, wait and why, tokens left), sleeps and repeats.
//!    A call dropped during that sleep gives the retry's tokens back to the budget.
//!
//! Bodies: a buffered body is cloned before each attempt and resent byte for byte. A streaming
//! body (one `reqwest::Request::try_clone` cannot copy) is sent once; if that attempt fails
//! retryably the call ends with [`StopReason::BodyNotReplayable`](crate::StopReason::BodyNotReplayable).
//!
//! # Errors
//!
//! Responses that are not retried (2xx, 3xx, 4xx, a `retryable: false` problem) are returned as
//! `Ok`, whatever their status. Everything else ends in
//! `reqwest_middleware::Error::Middleware` holding a [`RetryError`](crate::RetryError) (get it with
//! [`RetryError::from_middleware`](crate::RetryError::from_middleware)), which says how many attempts were made and why the call
//! stopped: deadline, attempts, budget, not retryable, outcome unknown, a `Retry-After` beyond
//! the deadline (with the hint), a body that cannot be replayed, an invalid key, or a nested
//! retry layer. A retryable response that ends the call (its last attempt, or a budget that
//! cannot pay) is reported as an error with [`RetryError::last_status`](crate::RetryError::last_status) set; its body is
//! dropped. The reason names the root cause: an error another layer wrapped around a transport
//! error is classified by that transport error.
//!
//! # Files
//!
//! - `builder.rs`: [`OncelyRetry`], its builder methods and the clients it builds;
//! - `call.rs`: the request loop of one logical call (the `Middleware` implementation);
//! - `body.rs`: reading a small error body for problem+json and handing the response back
//!   intact;
//! - `guard.rs`: the [`SendGuard`] and what the outer layer shares with it for one call.

mod body;
mod builder;
mod call;
mod guard;

pub use body::MAX_PROBLEM_BODY;
pub use builder::OncelyRetry;
pub use guard::SendGuard;

pub use crate::options::CallOptions;
