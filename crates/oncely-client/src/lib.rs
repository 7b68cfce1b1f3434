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
//!   each attempt's timeout cut to the time left;
//! - **a retry budget** ([`budget`]) shared by every request of a client, so a fleet cannot turn an
//!   outage into a retry storm;
//! - `tracing` logs and [`metrics`] counters for every retry;
//! - a deterministic [`simulate`] module comparing backoff strategies and budgets.
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
//! // The defaults: 3 attempts, a 30 s deadline, full jitter from 500 ms capped at 8 s,
//! // a 500-token retry budget, keys minted for POST and PATCH.
//! let retry = OncelyRetry::new(RetryPolicy::new());
//! let client = retry.clone().wrap(reqwest::Client::new());
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
//! ## Layering
//!
//! With other resilience pieces, outermost first: **Retry -> CircuitBreaker -> RateLimiter ->
//! Bulkhead** (see [`middleware`]).
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
pub mod clock;
pub mod deadline;
pub mod error;
pub mod key;
pub mod metrics;
pub mod middleware;
pub mod policy;
pub mod retry_after;
pub mod schedule;
pub mod simulate;

pub use backoff::{Backoff, Jitter};
pub use budget::{BudgetConfig, RetryBudget};
pub use error::{RetryError, StopReason};
pub use key::IdempotencyKeyExt;
pub use metrics::{MetricsSnapshot, RetryMetrics};
pub use middleware::{CallOptions, OncelyRetry};
pub use policy::RetryPolicy;
