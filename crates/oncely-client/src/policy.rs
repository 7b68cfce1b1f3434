//! The retry policy: how many attempts, how long in total, how long each, how to back off.
//!
//! These defaults are the contract for callers who never read docs, so each is justified
//! against the published defaults of three widely used SDK families:
//!
//! | setting | Oncely | AWS SDKs (standard mode) | Stripe (stripe-go) | Stainless-generated SDKs |
//! |---|---|---|---|---|
//! | attempts in total | **3** | 3 | 1 + 2 retries (`DefaultMaxNetworkRetries`) | 1 + 2 retries |
//! | base delay | **500 ms** | `random(0..1) * 2^n` seconds, i.e. 1 s (the 2026 revision uses a shorter base for transient errors than for throttling) | 500 ms, growing quadratically | 500 ms |
//! | cap on one delay | **8 s** | 20 s | 5 s | 8 s |
//! | per-attempt timeout | **10 s** | per service | 80 s | 60 s |
//! | connect timeout | **3 s** (inside the attempt timeout) | 3.1 s (`standard` defaults mode) | not compared | not compared |
//! | overall deadline | **30 s** | none by default | none | none |
//! | jitter | **full** | full | partial | partial (up to 25 % off) |
//!
//! - **3 attempts**: what all three families converge on. More attempts multiply load during an
//!   outage (see [`crate::budget`]) and rarely turn a failure into a success.
//! - **500 ms base, 8 s cap**: the Stainless numbers, sitting between Stripe's 5 s and AWS's
//!   20 s caps. With full jitter the expected sleeps before retries 1 and 2 are 250 ms and
//!   500 ms: quick enough for interactive callers, spread enough to de-synchronise a fleet.
//! - **30 s overall deadline**: the SDKs above bound each attempt but not the call, so their
//!   worst case is 3 x 60 s plus sleeps. A caller that never configured anything should get an
//!   answer, success or a typed error, within half a minute: longer than any sane interactive
//!   request, shorter than typical load-balancer idle timeouts (60 s), so the caller's own caller
//!   is still listening when we give up.
//! - **10 s per attempt**: leaves room inside the 30 s deadline for the third attempt even when
//!   the first two hang, and is far above the latency of a healthy API write. A server slower than
//!   that is, for the caller, indistinguishable from a dead one.
//! - **3 s to connect**: a TCP (and TLS) handshake to a healthy server takes milliseconds even
//!   across a continent; one that has not completed in 3 s is a black hole (a full backlog, a
//!   dropped SYN, a dead host) and waiting longer only eats the deadline. A connect that fails or
//!   times out sent nothing, so it is retried for any method, keyless `POST` included. It is a
//!   setting of the reqwest client, so it applies to clients built by
//!   [`crate::OncelyRetry::client`] or [`crate::OncelyRetry::client_builder`]: a client you build
//!   yourself needs `connect_timeout` set, or a hung connect ends as a timeout of the whole
//!   attempt, which cannot tell "never connected" from "sent and waiting" (for a keyless `POST`:
//!   outcome unknown). It is cut to the attempt timeout when that is shorter.
//! - **500 not retried**: a `500` is usually a bug that will happen again, and on a write without
//!   a key it may have run; enable it with [`RetryPolicy::with_retry_500`] (it is then retried
//!   only for requests that are safe to repeat).
//!
//! ```
//! use std::time::Duration;
//! use oncely_client::policy::RetryPolicy;
//!
//! const POLICY: RetryPolicy = RetryPolicy::new()
//!     .with_max_attempts(4)
//!     .with_deadline(Duration::from_secs(10))
//!     .with_attempt_timeout(Duration::from_secs(2));
//! assert_eq!(POLICY.max_attempts(), 4);
//! assert_eq!(RetryPolicy::default().deadline(), Duration::from_secs(30));
//! ```

use std::time::Duration;

use crate::backoff::{Backoff, Jitter};
use crate::budget::BudgetConfig;

/// Default total attempts per logical call (the first one included): 3.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// Default overall deadline per logical call: 30 seconds.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);
/// Default per-attempt timeout: 10 seconds (always cut to the time left).
pub const DEFAULT_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default connect timeout: 3 seconds (never more than the attempt timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The backoff's defaults (500 milliseconds base, 8 seconds cap), defined beside the backoff and
/// listed here with the policy's other defaults.
pub use crate::backoff::{DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY};

/// How a client retries. Immutable and `Copy`; build it with the `const fn with_*` methods.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    max_attempts: u32,
    deadline: Duration,
    attempt_timeout: Duration,
    connect_timeout: Duration,
    backoff: Backoff,
    retry_500: bool,
    mint_keys: bool,
    budget: Option<BudgetConfig>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::new()
    }
}

impl RetryPolicy {
    /// The defaults: 3 attempts, 30 s deadline, 10 s per attempt, 3 s to connect, full jitter from 500 ms capped
    /// at 8 s, 500 not retried, keys minted for `POST`/`PATCH`, the default retry budget.
    pub const fn new() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            deadline: DEFAULT_DEADLINE,
            attempt_timeout: DEFAULT_ATTEMPT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            backoff: Backoff::full_jitter(DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY),
            retry_500: false,
            mint_keys: true,
            budget: Some(BudgetConfig::new()),
        }
    }

    /// Total attempts per logical call, the first included (minimum 1; 1 disables retries).
    /// Attempts answered `409 idempotency_request_in_flight` are not counted: the call waits for
    /// the first request's answer until the deadline (`docs/DESIGN.md`, "In-use answer treated
    /// as failure").
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = if attempts == 0 { 1 } else { attempts };
        self
    }

    /// The overall deadline of one logical call, all attempts and sleeps included.
    pub const fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The timeout of one attempt; each attempt gets `min(this, time left)`.
    pub const fn with_attempt_timeout(mut self, timeout: Duration) -> Self {
        self.attempt_timeout = timeout;
        self
    }

    /// The connect timeout of clients built by [`crate::OncelyRetry::client`] and
    /// [`crate::OncelyRetry::client_builder`] (default 3 s; cut to the attempt timeout when that
    /// is shorter). A connect that fails or times out sent nothing and is retried for any method.
    pub const fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The backoff (base, cap, jitter formula).
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Shortcut: full jitter with this base delay and cap.
    pub const fn with_full_jitter(self, base: Duration, cap: Duration) -> Self {
        self.with_backoff(Backoff::full_jitter(base, cap))
    }

    /// Shortcut: decorrelated jitter with this base delay and cap (for latency-bound callers).
    pub const fn with_decorrelated_jitter(self, base: Duration, cap: Duration) -> Self {
        self.with_backoff(Backoff::decorrelated_jitter(base, cap))
    }

    /// Whether `500 Internal Server Error` is retried (for requests that are safe to repeat).
    /// Default `false`.
    pub const fn with_retry_500(mut self, retry: bool) -> Self {
        self.retry_500 = retry;
        self
    }

    /// Whether a `POST` or `PATCH` without an `Idempotency-Key` gets one minted (once per
    /// logical call). Default `true`. Turning it off makes ambiguous failures of such requests
    /// end in an "outcome unknown" error instead of a safe retry.
    pub const fn with_key_minting(mut self, mint: bool) -> Self {
        self.mint_keys = mint;
        self
    }

    /// The retry budget configuration, or `None` to disable the budget (not recommended: see
    /// [`crate::budget`]).
    pub const fn with_budget(mut self, budget: Option<BudgetConfig>) -> Self {
        self.budget = budget;
        self
    }

    /// Total attempts per logical call.
    pub const fn max_attempts(&self) -> u32 {
        self.max_attempts
    }

    /// The overall deadline of one logical call.
    pub const fn deadline(&self) -> Duration {
        self.deadline
    }

    /// The per-attempt timeout (before cutting to the time left).
    pub const fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
    }

    /// The connect timeout: the configured one, cut to the attempt timeout.
    pub const fn connect_timeout(&self) -> Duration {
        if self.connect_timeout.as_nanos() < self.attempt_timeout.as_nanos() {
            self.connect_timeout
        } else {
            self.attempt_timeout
        }
    }

    /// The backoff.
    pub const fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The jitter formula of the backoff.
    pub const fn jitter(&self) -> Jitter {
        self.backoff.jitter()
    }

    /// Whether `500` is retried.
    pub const fn retry_500(&self) -> bool {
        self.retry_500
    }

    /// Whether keys are minted for `POST` and `PATCH`.
    pub const fn mints_keys(&self) -> bool {
        self.mint_keys
    }

    /// The retry budget configuration, if enabled.
    pub const fn budget(&self) -> Option<BudgetConfig> {
        self.budget
    }
}
