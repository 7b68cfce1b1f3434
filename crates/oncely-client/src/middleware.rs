//! The reqwest-middleware face: [`OncelyRetry`].
//!
//! ```no_run
//! use std::time::Duration;
//! use oncely_client::{OncelyRetry, RetryPolicy};
//!
//! # async fn run() -> Result<(), reqwest_middleware::Error> {
//! let retry = OncelyRetry::new(RetryPolicy::new().with_deadline(Duration::from_secs(10)));
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
//!     .with(retry.clone()) // first = outermost: one retry loop around everything below it
//!     .build();
//! let response = client.post("http://127.0.0.1:8080/payments").body("{}").send().await?;
//! println!("{} after {} retries so far", response.status(), retry.metrics().snapshot().retries);
//! # Ok(()) }
//! ```
//!
//! # Where it sits
//!
//! Put it first in the middleware chain (the outermost layer), so that one logical call is one
//! retry loop with one deadline. With other resilience pieces the order, outermost first, is
//! **Retry -> CircuitBreaker -> RateLimiter -> Bulkhead**: the retry loop sees an open breaker or
//! a full bulkhead as a failure it may (within budget and deadline) wait out, while the breaker
//! counts every attempt rather than every logical call, and the rate limiter and bulkhead bound
//! the attempts that actually reach the network.
//!
//! # What one logical call does
//!
//! 1. Starts the deadline (policy default 30 s, or [`CallOptions`] from the request extensions).
//! 2. For `POST` and `PATCH` without an `Idempotency-Key`, mints one (UUID v4) and sets it on the
//!    request; every attempt of this call carries that same key.
//! 3. Sends an attempt with the timeout `min(attempt timeout, caller's request timeout, time
//!    left)`. As with reqwest's own request timeout, it also bounds reading the body of the
//!    response that is finally returned.
//! 4. Classifies the outcome ([`crate::classify`]); for `409`, `429`, `408` and 5xx responses
//!    with a JSON body of at most 64 KiB and a `Content-Length`, it reads the body for the
//!    problem+json `code` and `retryable` fields and hands the response back intact.
//! 5. Returns the response, returns an error, or plans a retry ([`crate::schedule`]), logs it
//!    with `tracing` at `INFO` (attempt, reason, wait and why, tokens left), sleeps and repeats.
//!
//! Bodies: a buffered body is cloned before each attempt and resent byte for byte. A streaming
//! body (one `reqwest::Request::try_clone` cannot copy) is sent once; if that attempt fails
//! retryably the call ends with [`StopReason::BodyNotReplayable`].
//!
//! # Errors
//!
//! Responses that are not retried (2xx, 3xx, 4xx, a `retryable: false` problem) are returned as
//! `Ok`, whatever their status. Everything else ends in
//! `reqwest_middleware::Error::Middleware` holding a [`RetryError`] (get it with
//! [`RetryError::from_middleware`]), which says how many attempts were made and why the call
//! stopped: deadline, attempts, budget, not retryable, outcome unknown, a `Retry-After` beyond
//! the deadline (with the hint), or a body that cannot be replayed. A retryable response that
//! ends the call (its last attempt, or a budget that cannot pay) is reported as an error with
//! [`RetryError::last_status`] set; its body is dropped.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Extensions, HeaderValue};
use rand::SeedableRng;
use rand::rngs::StdRng;
use reqwest::{Request, Response, ResponseBuilderExt};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};

use crate::budget::RetryBudget;
use crate::classify::{
    Outcome, Phase, Problem, RequestFacts, TransportFailure, Verdict, classify, needs_problem_body,
};
use crate::clock::{Clock, TokioClock};
use crate::deadline::Deadline;
use crate::error::{BoxError, RetryError, StopReason};
use crate::key::{IDEMPOTENCY_KEY, MakeIdempotencyKey, UuidV4Keys, needs_key};
use crate::metrics::{RetryMetrics, bump};
use crate::policy::RetryPolicy;
use crate::retry_after::retry_after_from_headers;
use crate::schedule::{CallState, WaitSource};

/// Largest problem+json body read for classification, in bytes (64 KiB).
pub const MAX_PROBLEM_BODY: u64 = 64 * 1024;

/// Per-call overrides, passed as a request extension
/// (`reqwest_middleware::RequestBuilder::with_extension`).
///
/// ```no_run
/// # async fn run(client: reqwest_middleware::ClientWithMiddleware) -> Result<(), reqwest_middleware::Error> {
/// use std::time::Duration;
/// use oncely_client::CallOptions;
///
/// let response = client
///     .get("http://127.0.0.1:8080/report")
///     .with_extension(CallOptions::new().with_deadline(Duration::from_secs(5)))
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallOptions {
    deadline: Option<Duration>,
    max_attempts: Option<u32>,
}

impl CallOptions {
    /// No overrides.
    pub const fn new() -> Self {
        Self {
            deadline: None,
            max_attempts: None,
        }
    }

    /// This call's overall deadline instead of the policy's.
    pub const fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = Some(deadline);
        self
    }

    /// This call's total attempts instead of the policy's (1 disables retries for it).
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }
}

/// The retry middleware for `reqwest_middleware`.
///
/// Cloning is cheap and shares the budget, the metrics and the random source: keep a clone to
/// read [`OncelyRetry::metrics`] after handing one to the client builder.
#[derive(Clone, Debug)]
pub struct OncelyRetry {
    policy: RetryPolicy,
    budget: Option<Arc<RetryBudget>>,
    metrics: Arc<RetryMetrics>,
    keys: Arc<dyn MakeIdempotencyKey>,
    clock: Arc<dyn Clock>,
    rng: Arc<Mutex<StdRng>>,
}

impl Default for OncelyRetry {
    fn default() -> Self {
        Self::new(RetryPolicy::new())
    }
}

impl OncelyRetry {
    /// A middleware with this policy, a fresh budget (if the policy enables one), fresh metrics,
    /// UUID v4 keys, tokio's clock and an OS-seeded random source.
    pub fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            budget: policy.budget().map(|c| Arc::new(RetryBudget::new(c))),
            metrics: Arc::new(RetryMetrics::default()),
            keys: Arc::new(UuidV4Keys),
            clock: Arc::new(TokioClock),
            rng: Arc::new(Mutex::new(StdRng::from_os_rng())),
        }
    }

    /// Shares an existing budget (for example between several clients of one process talking to
    /// the same dependency), or `None` to disable the budget.
    pub fn with_budget(mut self, budget: Option<Arc<RetryBudget>>) -> Self {
        self.budget = budget;
        self
    }

    /// Uses another key maker for minted keys.
    pub fn with_key_maker(mut self, keys: impl MakeIdempotencyKey) -> Self {
        self.keys = Arc::new(keys);
        self
    }

    /// Uses another clock (tests, simulations).
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Seeds the jitter's random source, for reproducible delays.
    pub fn with_rng_seed(mut self, seed: u64) -> Self {
        self.rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        self
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// The shared retry budget, if any.
    pub fn budget(&self) -> Option<&Arc<RetryBudget>> {
        self.budget.as_ref()
    }

    /// The shared counters.
    pub fn metrics(&self) -> &Arc<RetryMetrics> {
        &self.metrics
    }

    /// Wraps a reqwest client with this middleware as its only layer.
    pub fn wrap(self, client: reqwest::Client) -> ClientWithMiddleware {
        ClientBuilder::new(client).with(self).build()
    }

    fn give_up(
        &self,
        reason: StopReason,
        call: &CallState,
        last_status: Option<http::StatusCode>,
        key: &Option<String>,
        source: Option<BoxError>,
    ) -> reqwest_middleware::Error {
        let m = &self.metrics;
        bump(&m.gave_up);
        match reason {
            StopReason::DeadlineExhausted { .. } | StopReason::RetryAfterBeyondDeadline { .. } => {
                bump(&m.deadline_exhausted)
            }
            StopReason::AttemptsExhausted { .. } => bump(&m.attempts_exhausted),
            StopReason::BudgetEmpty { .. } => bump(&m.budget_exhausted),
            StopReason::OutcomeUnknown => bump(&m.outcome_unknown),
            StopReason::BodyNotReplayable => bump(&m.not_replayable),
            _ => {}
        }
        let elapsed = call.deadline().elapsed(self.clock.now());
        tracing::warn!(
            attempts = call.attempts(),
            reason = %reason,
            last_status = last_status.map(|s| s.as_u16()),
            elapsed_ms = elapsed.as_millis() as u64,
            tokens_left = self.budget.as_ref().map(|b| b.available()),
            idempotency_key = key.as_deref(),
            "oncely: giving up"
        );
        reqwest_middleware::Error::middleware(
            RetryError::new(reason, call.attempts(), elapsed)
                .with_last_status(last_status)
                .with_key(key.clone())
                .with_source(source),
        )
    }
}

/// The timeout the middleware itself enforced on an attempt.
#[derive(Debug, thiserror::Error)]
#[error("attempt timed out after {} ms", .0.as_millis())]
struct AttemptTimedOut(Duration);

/// One attempt's result, classified.
enum Attempt {
    Response {
        response: Response,
        verdict: Verdict,
        hint: Option<Duration>,
    },
    Failed {
        error: BoxError,
        verdict: Verdict,
    },
}

fn transport_of(error: &reqwest_middleware::Error) -> (Phase, TransportFailure) {
    match error {
        reqwest_middleware::Error::Reqwest(e) => {
            if e.is_connect() {
                (Phase::BeforeSend, TransportFailure::Connect)
            } else if e.is_timeout() {
                (Phase::AfterSend, TransportFailure::Timeout)
            } else if e.is_request() {
                (Phase::AfterSend, TransportFailure::Reset)
            } else {
                (Phase::BeforeSend, TransportFailure::Other)
            }
        }
        reqwest_middleware::Error::Middleware(_) => (Phase::BeforeSend, TransportFailure::Other),
    }
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"))
}

/// Reads a small JSON body to look for problem+json fields, then rebuilds an equivalent response
/// (status, version, headers, URL and the same body bytes).
async fn inspect_problem(
    response: Response,
    limit: Duration,
) -> Result<(Response, Option<Problem>), BoxError> {
    let small = response
        .content_length()
        .is_some_and(|n| n <= MAX_PROBLEM_BODY);
    if !small || !is_json(response.headers()) {
        return Ok((response, None));
    }
    let status = response.status();
    let version = response.version();
    let url = response.url().clone();
    let headers = response.headers().clone();
    let body: Bytes = match tokio::time::timeout(limit, response.bytes()).await {
        Ok(Ok(body)) => body,
        Ok(Err(e)) => return Err(Box::new(e)),
        Err(_) => return Err(Box::new(AttemptTimedOut(limit))),
    };
    let problem = Problem::from_json(&body);
    let mut rebuilt = http::Response::builder()
        .status(status)
        .version(version)
        .url(url)
        .body(body)
        .map_err(|e| Box::new(e) as BoxError)?;
    *rebuilt.headers_mut() = headers;
    Ok((Response::from(rebuilt), problem))
}

#[async_trait::async_trait]
impl Middleware for OncelyRetry {
    async fn handle(
        &self,
        mut req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let mut policy = self.policy;
        if let Some(options) = extensions.get::<CallOptions>() {
            if let Some(d) = options.deadline {
                policy = policy.with_deadline(d);
            }
            if let Some(n) = options.max_attempts {
                policy = policy.with_max_attempts(n);
            }
        }
        bump(&self.metrics.calls);
        let mut call = CallState::new(Deadline::starting_at(self.clock.now(), policy.deadline()));

        // One key per logical call, set on the request before any clone: every attempt carries it.
        if policy.mints_keys()
            && needs_key(req.method())
            && !req.headers().contains_key(IDEMPOTENCY_KEY)
            && let Ok(value) = HeaderValue::from_str(&self.keys.make_key())
        {
            req.headers_mut().insert(IDEMPOTENCY_KEY, value);
            bump(&self.metrics.keys_minted);
        }
        let has_key = req.headers().contains_key(IDEMPOTENCY_KEY);
        let key = req
            .headers()
            .get(IDEMPOTENCY_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let method = req.method().clone();
        let facts = RequestFacts {
            method: &method,
            has_key,
        };
        let path = req.url().path().to_owned();
        let attempt_timeout = req.timeout().map_or(policy.attempt_timeout(), |t| {
            (*t).min(policy.attempt_timeout())
        });
        let replayable = req.try_clone().is_some();
        let mut original = Some(req);
        let budget = self.budget.as_deref();

        loop {
            let limit = call
                .deadline()
                .attempt_limit(self.clock.now(), attempt_timeout);
            if limit.is_zero() {
                let reason = StopReason::DeadlineExhausted {
                    deadline: policy.deadline(),
                };
                return Err(self.give_up(reason, &call, None, &key, None));
            }
            let this_attempt = if replayable {
                original.as_ref().and_then(Request::try_clone)
            } else {
                original.take()
            };
            let Some(mut this_attempt) = this_attempt else {
                return Err(self.give_up(StopReason::BodyNotReplayable, &call, None, &key, None));
            };
            *this_attempt.timeout_mut() = Some(limit);
            call.record_attempt();
            bump(&self.metrics.attempts);

            let result =
                tokio::time::timeout(limit, next.clone().run(this_attempt, extensions)).await;
            let attempt = match result {
                Err(_) => Attempt::Failed {
                    error: Box::new(AttemptTimedOut(limit)),
                    verdict: classify(
                        &facts,
                        &Outcome::Transport {
                            phase: Phase::AfterSend,
                            failure: TransportFailure::Timeout,
                        },
                        policy.retry_500(),
                    ),
                },
                Ok(Err(error)) => {
                    let (phase, failure) = transport_of(&error);
                    let verdict = classify(
                        &facts,
                        &Outcome::Transport { phase, failure },
                        policy.retry_500(),
                    );
                    let error: BoxError = match error {
                        reqwest_middleware::Error::Reqwest(e) => Box::new(e),
                        other => Box::new(other),
                    };
                    Attempt::Failed { error, verdict }
                }
                Ok(Ok(response)) => {
                    let status = response.status();
                    let hint =
                        retry_after_from_headers(response.headers(), self.clock.system_now());
                    let inspected = if needs_problem_body(status) {
                        let left = call.deadline().remaining(self.clock.now());
                        inspect_problem(response, left).await
                    } else {
                        Ok((response, None))
                    };
                    match inspected {
                        Ok((response, problem)) => Attempt::Response {
                            verdict: classify(
                                &facts,
                                &Outcome::Response {
                                    status,
                                    problem: problem.as_ref(),
                                },
                                policy.retry_500(),
                            ),
                            response,
                            hint,
                        },
                        // The body of a response we meant to inspect broke: we cannot hand it back
                        // intact, so report the failure (the status says what the server did).
                        Err(error) => {
                            return Err(self.give_up(
                                StopReason::NotRetryable,
                                &call,
                                Some(status),
                                &key,
                                Some(error),
                            ));
                        }
                    }
                }
            };

            let (reason, hint, last_status, source) = match attempt {
                Attempt::Response {
                    response,
                    verdict: Verdict::Done,
                    ..
                } => {
                    if !response.status().is_server_error() {
                        call.on_success(budget);
                    }
                    return Ok(response);
                }
                Attempt::Response {
                    response,
                    verdict: Verdict::Retry(reason),
                    hint,
                } => (reason, hint, Some(response.status()), None),
                Attempt::Response { response, .. } => {
                    // Responses only classify as Done or Retry; keep the response regardless.
                    return Ok(response);
                }
                Attempt::Failed {
                    error,
                    verdict: Verdict::Retry(reason),
                } => (reason, None, None, Some(error)),
                Attempt::Failed {
                    error,
                    verdict: Verdict::OutcomeUnknown,
                } => {
                    return Err(self.give_up(
                        StopReason::OutcomeUnknown,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
                Attempt::Failed { error, .. } => {
                    return Err(self.give_up(
                        StopReason::NotRetryable,
                        &call,
                        None,
                        &key,
                        Some(error),
                    ));
                }
            };

            if !replayable {
                return Err(self.give_up(
                    StopReason::BodyNotReplayable,
                    &call,
                    last_status,
                    &key,
                    source,
                ));
            }
            let planned = {
                let mut rng = self.rng.lock().unwrap_or_else(PoisonError::into_inner);
                call.plan_retry(&policy, budget, reason, hint, self.clock.now(), &mut *rng)
            };
            let plan = match planned {
                Ok(plan) => plan,
                Err(stop) => return Err(self.give_up(stop, &call, last_status, &key, source)),
            };
            bump(&self.metrics.retries);
            if plan.source == WaitSource::RetryAfter {
                bump(&self.metrics.retry_after_waits);
            }
            tracing::info!(
                attempt = call.attempts(),
                next_attempt = call.attempts() + 1,
                reason = %reason,
                error = source.as_ref().map(|e| tracing::field::display(e.to_string())),
                method = %method,
                path = %path,
                wait_ms = plan.wait.as_millis() as u64,
                wait_source = match plan.source {
                    WaitSource::Backoff => "backoff",
                    WaitSource::RetryAfter => "retry-after",
                },
                backoff_ms = plan.backoff.as_millis() as u64,
                retry_after_ms = plan.hint.map(|h| h.as_millis() as u64),
                tokens_left = plan.tokens_left,
                retry_cost = plan.cost,
                idempotency_key = key.as_deref(),
                "oncely: retrying"
            );
            self.clock.sleep(plan.wait).await;
        }
    }
}
