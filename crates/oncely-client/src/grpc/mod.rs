//! The gRPC transport (feature `grpc`): the same retry core as the reqwest middleware, for
//! tonic channels.
//!
//! [`GrpcRetry`] holds the policy, the retry budget, the metrics and the method table;
//! [`GrpcRetry::wrap`] (or the [`GrpcRetryLayer`] of [`GrpcRetry::layer`]) puts it around a
//! tonic `Channel`, or any `tower::Service<http::Request<tonic::body::Body>>`, and the result
//! goes where a generated client takes a channel: `PaymentsClient::new(retry.wrap(channel))`.
//! The decisions (attempts, deadline, full jitter, the server's hint as a lower bound, the
//! budget) are the ones [`crate::schedule`] makes for HTTP: one retry core, two transports.
//!
//! ```
//! use std::time::Duration;
//! use oncely_client::RetryPolicy;
//! use oncely_client::grpc::{GrpcMethod, GrpcRetry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let retry = GrpcRetry::new(RetryPolicy::new().with_deadline(Duration::from_secs(10)))
//!     .with_method("/oncely.payments.v1.Payments/CreatePayment", GrpcMethod::keyed())
//!     .with_service("oncely.payments.v1.Reports", GrpcMethod::idempotent())
//!     .with_method("/oncely.payments.v1.Payments/Upload", GrpcMethod::streaming());
//! let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
//!     .connect_timeout(retry.policy().connect_timeout()) // 3 s: a hung connect is "not sent"
//!     .connect_lazy();
//! let channel = retry.wrap(channel);
//! // let mut payments = PaymentsClient::new(channel); // a generated client, unchanged
//! let mut grpc = tonic::client::Grpc::new(channel); // what a generated client holds
//! # let _ = &mut grpc;
//! # Ok(()) }
//! ```
//!
//! # What one logical call does
//!
//! 1. Finds the method's kind ([`GrpcMethod`]) by its path in the table ([`GrpcMethods`]).
//! 2. Starts the deadline: the policy's (default 30 s), a [`crate::CallOptions`] request
//!    extension's (`tonic::Request::extensions_mut`; its deadline, attempts and key minting
//!    apply, its HTTP response hook does not), or the caller's own `grpc-timeout` (tonic's
//!    `Request::set_timeout`) when that is shorter.
//! 3. Checks a caller's `idempotency-key` metadata entry with the server's rules (1 to 255
//!    visible ASCII characters, sent once); a bad one ends the call before anything is sent,
//!    with [`crate::StopReason::InvalidIdempotencyKey`] (the client sees `INVALID_ARGUMENT`).
//! 4. For a [`GrpcMethod::keyed`] method without a key, mints one (UUID v4) into the
//!    `idempotency-key` entry; every attempt of the call carries that same key.
//! 5. Buffers the encoded unary request ([`body`]); a streaming request is sent once.
//! 6. Sends each attempt with `grpc-timeout` set to `min(attempt timeout, time left)`, never
//!    more than what is left of the call's deadline, and enforces the same limit locally on the
//!    wait for the response headers. tonic's own `Channel` enforces the header it sees as well
//!    (its `GrpcTimeout` service takes the shorter of `grpc-timeout` and `Endpoint::timeout`
//!    and fails with `TimeoutExpired`, which this layer reads as a timeout after sending);
//!    `Endpoint::timeout` itself sends no header. The server reads the header as its deadline.
//! 7. Classifies the outcome: a trailers-only response by its status and details
//!    ([`classify`]), a failure without response by when it happened (a `tonic::ConnectError`
//!    is "not sent" and retried for any call; a timeout or a broken connection after sending is
//!    retried only for keyed or idempotent calls, and otherwise ends as "outcome unknown").
//!    A response that carries a message is returned as it is: its status comes in the
//!    trailers, after data the caller may already consume, and is not retried. An HTTP answer
//!    without `grpc-status` (a proxy's `503`) is judged by the HTTP allowlist, with its
//!    `Retry-After`.
//! 8. Retries ([`crate::schedule::CallState::plan_retry`]) or stops, logging each retry at
//!    `INFO` and counting it in [`GrpcRetry::metrics`].
//!
//! # Errors
//!
//! A call that does not end with the server's answer ends with the service error
//! [`crate::RetryError`] (attempts, reason, key, last `grpc-status`). A generated client turns
//! it into a `tonic::Status` with `Status::from_error`, which takes the first `Status` in the
//! error's chain: the server's own last status when there was one (code, message, details and
//! metadata intact, so a retryable `UNAVAILABLE` that ran out of attempts is still
//! `UNAVAILABLE`), else one this layer sets: `DEADLINE_EXCEEDED` for the deadline or a timeout,
//! `UNKNOWN` for a connection lost after sending, `UNAVAILABLE` for a failed connection,
//! `INVALID_ARGUMENT` for a bad key. [`retry_error`] finds the [`crate::RetryError`] under the status.
//!
//! # Streaming calls
//!
//! A client-streaming or bidirectional method is declared [`GrpcMethod::streaming`]: its
//! request is never buffered and the call is never retried (a failure that would have been
//! retried ends with [`crate::StopReason::BodyNotReplayable`]). An undeclared method whose
//! request stream is not complete when first read is treated the same way, so a stream is
//! never resent, partially or empty, and never held back (an undeclared one whose whole stream
//! is ready at once is, like a unary request, a buffered body resent byte for byte: declare
//! streaming methods to rule that out). Server-streaming calls (a unary
//! request) are retried like unary calls until their response headers arrive.
//!
//! # Our budget and gRFC A6 retry throttling
//!
//! gRFC A6 defines retry throttling per server name, in the service config's
//! `retryThrottling: { maxTokens, tokenRatio }`: a bucket starts at `maxTokens` (1 to 1000);
//! every attempt that fails with a status the policy retries (or with a server pushback)
//! takes **1** token; every successful RPC adds **`tokenRatio`** (0 to 1, three decimals), up to
//! `maxTokens`; retries are allowed only while the count is **above `maxTokens / 2`**. The
//! budget of this crate ([`crate::budget`], shared by both transports) is the same idea with
//! different accounting, from the AWS SDKs' retry quota:
//!
//! | | gRFC A6 throttling | Oncely's retry budget |
//! |---|---|---|
//! | what pays | every failed attempt, retried or not: 1 token | every retry: 14 tokens (a transient failure), 5 (throttling: the in-flight conflict, `RESOURCE_EXHAUSTED`) |
//! | what refills | every success: `tokenRatio` | a first-attempt success: 1 token; a success after a retry: that retry's cost back |
//! | retries stop when | tokens <= `maxTokens / 2` | the retry's cost exceeds the tokens left (0 to 13 left) |
//! | scope | one channel's server name | one [`GrpcRetry`] (and its clones), or an `Arc<RetryBudget>` shared with [`GrpcRetry::with_budget`] |
//!
//! So they relate as follows; the numbers are A6's own example (`maxTokens: 10`,
//! `tokenRatio: 0.1`) and our defaults.
//!
//! - **Same mechanism**: a token bucket per client, drained by failure, refilled by success,
//!   that turns retries off during an outage and back on by itself once successes return
//!   (never a restart, case C9).
//! - **Total outage**: A6 stops retrying once `maxTokens / 2` attempts have failed (10 -> 5:
//!   4 retries in all, after the first call's first failure); ours after `500 / 14 = 35`
//!   transient retries (then 0 to 13 tokens are left).
//! - **Steady state**: A6 keeps retrying while failed attempts stay below `tokenRatio` times the
//!   successes (about 1 failure per 10 successes); ours while retries stay below
//!   `refund / cost` times the first-attempt successes (`1 / 14`: about 1 transient retry per
//!   14 successes, 1 throttled retry per 5).
//! - **What is measured**: A6 the failure rate (a failed first attempt pays even when it is
//!   not retried), ours the retry rate (only a retry that is made pays, and a retry that then
//!   succeeds is paid back in full).
//! - **As A6 parameters**: if A6 charged only retried failures, our defaults would be
//!   `maxTokens = 2 * 500 / 14 = 71` and `tokenRatio = 1 / 14 = 0.071` for transient failures
//!   (`2 * 500 / 5 = 200` and `0.2` for throttling).
//!
//! ```
//! use oncely_client::budget::{BudgetConfig, RetryBudget, RetryCost};
//!
//! // gRFC A6 with maxTokens 10, tokenRatio 0.1, under a total outage: each call fails its
//! // first attempt (-1) and retries while tokens > 5.
//! let (max_tokens, mut tokens, mut a6_retries) = (10.0_f64, 10.0_f64, 0);
//! for _call in 0..100 {
//!     tokens -= 1.0; // the first attempt failed
//!     while tokens > max_tokens / 2.0 {
//!         a6_retries += 1;
//!         tokens -= 1.0; // the retry failed too
//!     }
//! }
//! assert_eq!(a6_retries, 4);
//!
//! // Ours, same outage: only retries pay, 14 tokens each, from 500.
//! let budget = RetryBudget::new(BudgetConfig::new());
//! let mut ours = 0;
//! while budget.try_withdraw(RetryCost::Transient).is_ok() {
//!     ours += 1;
//! }
//! assert_eq!(ours, 35);
//! ```
//!
//! Do not turn on a stock A6 retry policy *and* this layer for one channel: the attempts
//! multiply. tonic itself has no A6 retries; with a client that does (grpc-go, grpcio), use its
//! `retryPolicy` with the status table of the server instead of this crate.

pub mod body;
pub mod classify;
mod methods;
mod service;
pub mod timeout;

pub use methods::{GrpcMethod, GrpcMethods};
pub use service::{GrpcRetryLayer, GrpcRetryService, retry_error};

use crate::driver::Driver;
use crate::policy::RetryPolicy;

/// The gRPC retry configuration: a [`RetryPolicy`], a retry budget, metrics and the method
/// table, shared by every call of the services it wraps.
///
/// Cloning is cheap and shares the budget, the metrics and the random source. Defaults: those
/// of [`RetryPolicy::new`] (3 attempts, a 30 s deadline, 10 s per attempt, full jitter from
/// 500 ms capped at 8 s, a 500-token budget), every method [`GrpcMethod::unkeyed`].
#[derive(Clone, Debug)]
pub struct GrpcRetry {
    core: Driver,
    methods: GrpcMethods,
}

impl Default for GrpcRetry {
    fn default() -> Self {
        Self::new(RetryPolicy::new())
    }
}

impl GrpcRetry {
    /// A configuration with this policy, a fresh budget (if the policy enables one), fresh
    /// metrics, UUID v4 keys, tokio's timer and an empty method table.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            core: Driver::new(policy),
            methods: GrpcMethods::new(),
        }
    }

    /// Declares one method, by its path `/package.Service/Method`.
    pub fn with_method(mut self, path: impl Into<String>, method: GrpcMethod) -> Self {
        self.methods = self.methods.with_method(path, method);
        self
    }

    /// Declares every method of a service, `package.Service`.
    pub fn with_service(mut self, service: impl Into<String>, method: GrpcMethod) -> Self {
        self.methods = self.methods.with_service(service, method);
        self
    }

    /// Replaces the whole method table.
    pub fn with_methods(mut self, methods: GrpcMethods) -> Self {
        self.methods = methods;
        self
    }

    crate::driver::core_methods!();

    /// The method table.
    pub fn methods(&self) -> &GrpcMethods {
        &self.methods
    }

    /// A [`tower::Layer`] for a `tower::ServiceBuilder` stack, outermost (see
    /// [`crate::middleware`] for the order with other resilience layers).
    pub fn layer(&self) -> GrpcRetryLayer {
        GrpcRetryLayer::new(self.clone())
    }

    /// Wraps a service (a tonic `Channel`) so that its calls are retried.
    pub fn wrap<S>(&self, inner: S) -> GrpcRetryService<S> {
        GrpcRetryService::new(self.clone(), inner)
    }
}
