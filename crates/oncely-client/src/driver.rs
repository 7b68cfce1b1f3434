//! The retry loop's transport-agnostic half, shared by the reqwest middleware
//! ([`crate::middleware`]) and the gRPC layer (`crate::grpc`): one retry core, two transports.
//!
//! A transport sends attempts and classifies their outcomes; everything else lives here, once:
//! the configuration (policy, budget, metrics, key maker, timer, random source), minting a key,
//! planning a retry ([`crate::schedule::CallState::plan_retry`]: attempts, deadline, full
//! jitter, the server's hint, the budget), logging and counting it, sleeping with a refund if
//! the call is dropped meanwhile, and giving up with a [`RetryError`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::HeaderValue;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::budget::RetryBudget;
use crate::classify::RetryReason;
use crate::deadline::Deadline;
use crate::error::{BoxError, LastAnswer, RetryError, StopReason};
use crate::key::{IdempotencyKey, MakeIdempotencyKey, UuidV4Keys};
use crate::metrics::{Counter, RetryMetrics};
use crate::policy::RetryPolicy;
use crate::schedule::{CallState, WaitSource};
use crate::timer::{Timer, TokioTimer};

/// The builder methods and accessors of each transport's face over its [`Driver`] (a field
/// named `core`): written once, so the two faces cannot drift apart.
macro_rules! core_methods {
    () => {
        /// Shares an existing budget (for example between several clients of one process
        /// talking to the same dependency, over HTTP or gRPC), or `None` to disable the budget.
        pub fn with_budget(
            mut self,
            budget: Option<std::sync::Arc<$crate::budget::RetryBudget>>,
        ) -> Self {
            self.core.budget = budget;
            self
        }

        /// Uses another key maker for minted keys (its keys are checked like a caller's).
        pub fn with_key_maker(mut self, keys: impl $crate::key::MakeIdempotencyKey) -> Self {
            self.core.keys = std::sync::Arc::new(keys);
            self
        }

        /// Uses another timer (tests, simulations): every "now" and every sleep of the retry
        /// loop goes through it. Default: [`TokioTimer`]($crate::timer::TokioTimer).
        pub fn with_timer(mut self, timer: impl $crate::timer::Timer) -> Self {
            self.core.timer = std::sync::Arc::new(timer);
            self
        }

        /// Seeds the jitter's random source, for reproducible delays.
        pub fn with_rng_seed(mut self, seed: u64) -> Self {
            self.core.seed(seed);
            self
        }

        /// The policy.
        pub fn policy(&self) -> &$crate::policy::RetryPolicy {
            &self.core.policy
        }

        /// The shared retry budget, if any.
        pub fn budget(&self) -> Option<&std::sync::Arc<$crate::budget::RetryBudget>> {
            self.core.budget.as_ref()
        }

        /// The shared counters.
        pub fn metrics(&self) -> &std::sync::Arc<$crate::metrics::RetryMetrics> {
            &self.core.metrics
        }
    };
}
pub(crate) use core_methods;

/// What a retry's log line says about the attempt that failed.
pub(crate) struct RetryLog<'a> {
    /// The HTTP method, or `grpc` for a gRPC call.
    pub(crate) method: &'a str,
    /// The request path (for gRPC, the method path `/package.Service/Method`).
    pub(crate) path: &'a str,
    /// The attempt's error, if it ended in one.
    pub(crate) error: Option<String>,
    /// The idempotency key every attempt carries.
    pub(crate) key: Option<&'a str>,
}

/// The shared state of one client: cloning is cheap and shares the budget, the metrics and
/// the random source.
#[derive(Clone, Debug)]
pub(crate) struct Driver {
    pub(crate) policy: RetryPolicy,
    pub(crate) budget: Option<Arc<RetryBudget>>,
    pub(crate) metrics: Arc<RetryMetrics>,
    pub(crate) keys: Arc<dyn MakeIdempotencyKey>,
    pub(crate) timer: Arc<dyn Timer>,
    pub(crate) rng: Arc<Mutex<StdRng>>,
}

impl Driver {
    /// This policy, a fresh budget (if the policy enables one), fresh metrics, UUID v4 keys,
    /// tokio's timer and an OS-seeded random source.
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            budget: policy.budget().map(|c| Arc::new(RetryBudget::new(c))),
            metrics: Arc::new(RetryMetrics::default()),
            keys: Arc::new(UuidV4Keys),
            timer: Arc::new(TokioTimer),
            rng: Arc::new(Mutex::new(StdRng::from_os_rng())),
        }
    }

    /// Seeds the jitter's random source.
    pub(crate) fn seed(&mut self, seed: u64) {
        self.rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
    }

    /// Starts a logical call with this overall deadline, now.
    pub(crate) fn start_call(&self, deadline: Duration) -> CallState {
        self.metrics.inc(Counter::calls);
        CallState::new(Deadline::starting_at(self.timer.now(), deadline))
    }

    /// Records that an attempt goes out.
    pub(crate) fn record_attempt(&self, call: &mut CallState) {
        call.record_attempt();
        self.metrics.inc(Counter::attempts);
    }

    /// Mints the one key of a logical call, checked with the server's rules like a caller's.
    ///
    /// # Errors
    ///
    /// The key maker's key and why it is invalid.
    pub(crate) fn mint_key(&self) -> Result<HeaderValue, (oncely_core::KeyError, String)> {
        let minted = self.keys.make_key();
        let checked = IdempotencyKey::parse(minted.as_bytes()).and_then(|_| {
            HeaderValue::from_str(&minted).map_err(|_| oncely_core::KeyError::NotVisibleAscii(0))
        });
        match checked {
            Ok(value) => {
                self.metrics.inc(Counter::keys_minted);
                Ok(value)
            }
            Err(e) => Err((e, minted)),
        }
    }

    /// Ends a call: counts it, logs it at `WARN`, and builds the error.
    pub(crate) fn give_up(
        &self,
        reason: StopReason,
        call: &CallState,
        last: Option<LastAnswer>,
        key: Option<&str>,
        source: Option<BoxError>,
    ) -> RetryError {
        let m = &self.metrics;
        m.inc(Counter::gave_up);
        match reason {
            StopReason::DeadlineExhausted { .. } | StopReason::RetryAfterBeyondDeadline { .. } => {
                m.inc(Counter::deadline_exhausted)
            }
            StopReason::AttemptsExhausted { .. } => m.inc(Counter::attempts_exhausted),
            StopReason::BudgetEmpty { .. } => m.inc(Counter::budget_exhausted),
            StopReason::OutcomeUnknown => m.inc(Counter::outcome_unknown),
            StopReason::BodyNotReplayable => m.inc(Counter::not_replayable),
            _ => {}
        }
        let elapsed = call.deadline().elapsed(self.timer.now());
        tracing::warn!(
            attempts = call.attempts(),
            reason = %reason,
            last_status = last.map(LastAnswer::as_number),
            elapsed_ms = elapsed.as_millis() as u64,
            tokens_left = self.budget.as_ref().map(|b| b.available()),
            idempotency_key = key,
            "oncely: giving up"
        );
        RetryError::new(reason, call.attempts(), elapsed)
            .with_last(last)
            .with_key(key.map(str::to_owned))
            .with_source(source)
    }

    /// Plans the retry after a retryable outcome (with the server's hint, a lower bound on the
    /// wait), counts and logs it at `INFO`, and sleeps. A call dropped during the sleep gives
    /// the retry's tokens back to the budget.
    ///
    /// # Errors
    ///
    /// Why the call must stop instead ([`CallState::plan_retry`]); nothing was slept.
    pub(crate) async fn wait_to_retry(
        &self,
        call: &mut CallState,
        policy: &RetryPolicy,
        reason: RetryReason,
        hint: Option<Duration>,
        log: RetryLog<'_>,
    ) -> Result<(), StopReason> {
        let budget = self.budget.as_deref();
        let plan = {
            let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
            call.plan_retry(policy, budget, reason, hint, self.timer.now(), &mut *rng)?
        };
        self.metrics.inc(Counter::retries);
        if plan.source == WaitSource::RetryAfter {
            self.metrics.inc(Counter::retry_after_waits);
        }
        tracing::info!(
            attempt = call.attempts(),
            next_attempt = call.attempts() + 1,
            reason = %reason,
            error = log.error.as_deref().map(tracing::field::display),
            method = %log.method,
            path = %log.path,
            wait_ms = plan.wait.as_millis() as u64,
            wait_source = match plan.source {
                WaitSource::Backoff => "backoff",
                WaitSource::RetryAfter => "retry-after",
            },
            backoff_ms = plan.backoff.as_millis() as u64,
            retry_after_ms = plan.hint.map(|h| h.as_millis() as u64),
            tokens_left = plan.tokens_left,
            retry_cost = plan.cost,
            idempotency_key = log.key,
            "oncely: retrying"
        );
        let refund = RefundOnDrop {
            budget,
            tokens: plan.cost.unwrap_or(0),
        };
        self.timer.sleep(plan.wait).await;
        refund.disarm();
        Ok(())
    }
}

/// Gives a retry's tokens back to the budget unless disarmed: a call dropped during its backoff
/// sleep never used the retry it paid for.
struct RefundOnDrop<'a> {
    budget: Option<&'a RetryBudget>,
    tokens: u32,
}

impl RefundOnDrop<'_> {
    fn disarm(mut self) {
        self.tokens = 0;
    }
}

impl Drop for RefundOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(budget) = self.budget
            && self.tokens > 0
        {
            budget.deposit(self.tokens);
            tracing::debug!(
                tokens = self.tokens,
                "oncely: call dropped while waiting; retry refunded"
            );
        }
    }
}
