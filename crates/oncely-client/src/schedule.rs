//! The transport-agnostic core of the retry loop: after a retryable outcome, decide whether to
//! retry and how long to wait, or why to stop.
//!
//! [`CallState`] is one logical call. [`CallState::plan_retry`] checks, in this order:
//!
//! 1. the attempt limit ([`StopReason::AttemptsExhausted`]), which counts every attempt except
//!    those answered `409 idempotency_request_in_flight` (the server ran nothing for them; the
//!    call keeps waiting for the first request's answer until the deadline, the `Retry-After` of
//!    each conflict a lower bound on its wait: `docs/DESIGN.md`, "In-use answer treated as
//!    failure" and "A gateway that burned the key");
//! 2. the deadline: no time left ([`StopReason::DeadlineExhausted`]);
//! 3. the jittered backoff, combined with the server's `Retry-After` as a lower bound:
//!    `wait = max(hint, jittered)` (RFC 9110 section 10.2.3 says how long to wait *at least*;
//!    a `Retry-After: 0` therefore still waits the jittered backoff, case C4);
//! 4. a hint that does not fit in the time left ends the call at once, carrying the hint
//!    ([`StopReason::RetryAfterBeyondDeadline`]); a wait that does not fit ends it with
//!    [`StopReason::DeadlineExhausted`]: no sleep ever ends past the deadline;
//! 5. the retry budget pays for the retry, or the call stops ([`StopReason::BudgetEmpty`]).
//!
//! Both transports drive it: the reqwest middleware ([`crate::middleware`]) and the gRPC layer
//! (`crate::grpc`, feature `grpc`), where the server's hint is `google.rpc.RetryInfo`.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use oncely_client::classify::RetryReason;
//! use oncely_client::deadline::Deadline;
//! use oncely_client::policy::RetryPolicy;
//! use oncely_client::schedule::{CallState, WaitSource};
//!
//! let policy = RetryPolicy::new();
//! let start = Instant::now();
//! let mut call = CallState::new(Deadline::starting_at(start, policy.deadline()));
//! call.record_attempt();
//! let plan = call
//!     .plan_retry(&policy, None, RetryReason::Throttled, Some(Duration::from_secs(2)), start, &mut rand::rng())
//!     .unwrap();
//! // The backoff before the first retry is at most 500 ms, so the 2-second hint wins.
//! assert_eq!(plan.wait, Duration::from_secs(2));
//! assert_eq!(plan.source, WaitSource::RetryAfter);
//! ```

use std::time::{Duration, Instant};

use rand::Rng;

use crate::budget::RetryBudget;
use crate::classify::RetryReason;
use crate::deadline::Deadline;
use crate::error::StopReason;
use crate::policy::RetryPolicy;

/// What set the length of a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitSource {
    /// The jittered backoff (no hint, or a hint shorter than the backoff).
    Backoff,
    /// The server's `Retry-After`, longer than the jittered backoff.
    RetryAfter,
}

/// A decided retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPlan {
    /// How long to sleep before the next attempt.
    pub wait: Duration,
    /// What set that length.
    pub source: WaitSource,
    /// The jittered backoff that was drawn.
    pub backoff: Duration,
    /// The server's `Retry-After`, if it sent a well-formed one.
    pub hint: Option<Duration>,
    /// Tokens left in the budget after paying, if a budget is in use.
    pub tokens_left: Option<u32>,
    /// Tokens this retry cost, if a budget is in use.
    pub cost: Option<u32>,
    /// Which retry this is (1 for the second attempt).
    pub retry_number: u32,
}

/// `max(hint, jittered)`, and which of the two it was. A hint equal to the backoff counts as the
/// backoff.
pub fn combine_wait(hint: Option<Duration>, jittered: Duration) -> (Duration, WaitSource) {
    match hint {
        Some(h) if h > jittered => (h, WaitSource::RetryAfter),
        _ => (jittered, WaitSource::Backoff),
    }
}

/// The state of one logical call.
#[derive(Clone, Debug)]
pub struct CallState {
    deadline: Deadline,
    attempts: u32,
    in_flight_answers: u32,
    previous_delay: Option<Duration>,
    last_retry_cost: Option<u32>,
}

impl CallState {
    /// A call that has made no attempt yet.
    pub fn new(deadline: Deadline) -> Self {
        Self {
            deadline,
            attempts: 0,
            in_flight_answers: 0,
            previous_delay: None,
            last_retry_cost: None,
        }
    }

    /// The call's deadline.
    pub fn deadline(&self) -> &Deadline {
        &self.deadline
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Attempts answered `409 idempotency_request_in_flight` so far (retried without counting
    /// against the attempt limit).
    pub fn in_flight_answers(&self) -> u32 {
        self.in_flight_answers
    }

    /// Attempts made so far that count against [`RetryPolicy::max_attempts`]: all of them but
    /// those answered in flight.
    pub fn counted_attempts(&self) -> u32 {
        self.attempts.saturating_sub(self.in_flight_answers)
    }

    /// Records that an attempt is being made.
    pub fn record_attempt(&mut self) {
        self.attempts = self.attempts.saturating_add(1);
    }

    /// Sets the attempt count, when more attempts were made than this loop recorded (requests
    /// another layer re-sent, as counted by [`crate::SendGuard`]).
    pub fn set_attempts(&mut self, attempts: u32) {
        self.attempts = attempts;
    }

    /// What the last retry cost, if the call was retried and a budget is in use.
    pub fn last_retry_cost(&self) -> Option<u32> {
        self.last_retry_cost
    }

    /// Records a successful end of the call in the budget: refunds the last retry's cost, or
    /// the first-attempt refund.
    pub fn on_success(&self, budget: Option<&RetryBudget>) {
        if let Some(budget) = budget {
            budget.on_success(self.last_retry_cost);
        }
    }

    /// Decides the retry after a retryable outcome observed at `now` (see the module docs for
    /// the order of the checks).
    ///
    /// # Errors
    ///
    /// The [`StopReason`] when the call must stop instead.
    pub fn plan_retry<R: Rng + ?Sized>(
        &mut self,
        policy: &RetryPolicy,
        budget: Option<&RetryBudget>,
        reason: RetryReason,
        hint: Option<Duration>,
        now: Instant,
        rng: &mut R,
    ) -> Result<RetryPlan, StopReason> {
        // The server ran nothing for an in-flight answer: waiting for the first request's
        // answer is bounded by the deadline, not by the attempt limit (`docs/DESIGN.md`,
        // "In-use answer treated as failure").
        if reason.is_in_flight() {
            self.in_flight_answers = self.in_flight_answers.saturating_add(1);
        }
        if self.counted_attempts() >= policy.max_attempts() {
            return Err(StopReason::AttemptsExhausted {
                max_attempts: policy.max_attempts(),
            });
        }
        let remaining = self.deadline.remaining(now);
        if remaining.is_zero() {
            return Err(StopReason::DeadlineExhausted {
                deadline: self.deadline.total(),
            });
        }
        let retry_index = self.attempts.saturating_sub(1);
        let jittered = policy
            .backoff()
            .delay(retry_index, self.previous_delay, rng);
        let (wait, source) = combine_wait(hint, jittered);
        if let Some(hint) = hint
            && hint >= remaining
        {
            return Err(StopReason::RetryAfterBeyondDeadline { hint, remaining });
        }
        if !self.deadline.fits(now, wait) {
            return Err(StopReason::DeadlineExhausted {
                deadline: self.deadline.total(),
            });
        }
        let (tokens_left, cost) = match budget {
            Some(budget) => match budget.try_withdraw(reason.cost()) {
                Ok((left, cost)) => (Some(left), Some(cost)),
                Err(empty) => {
                    return Err(StopReason::BudgetEmpty {
                        available: empty.available,
                        cost: empty.cost,
                    });
                }
            },
            None => (None, None),
        };
        self.previous_delay = Some(jittered);
        self.last_retry_cost = cost;
        Ok(RetryPlan {
            wait,
            source,
            backoff: jittered,
            hint,
            tokens_left,
            cost,
            retry_number: self.attempts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::budget::BudgetConfig;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    fn policy() -> RetryPolicy {
        RetryPolicy::new()
            .with_full_jitter(Duration::from_millis(100), Duration::from_millis(400))
            .with_deadline(Duration::from_secs(5))
    }

    #[test]
    fn hint_is_a_lower_bound_not_a_replacement() {
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..100 {
            let j = crate::backoff::uniform(Duration::ZERO, Duration::from_millis(400), &mut rng);
            assert_eq!(
                combine_wait(Some(Duration::ZERO), j),
                (j, WaitSource::Backoff)
            );
            assert_eq!(combine_wait(None, j), (j, WaitSource::Backoff));
            let big = Duration::from_secs(1);
            assert_eq!(combine_wait(Some(big), j), (big, WaitSource::RetryAfter));
        }
    }

    #[test]
    fn attempts_are_bounded() {
        let p = policy();
        let start = Instant::now();
        let mut c = CallState::new(Deadline::starting_at(start, p.deadline()));
        let mut rng = StdRng::seed_from_u64(1);
        c.record_attempt();
        assert!(
            c.plan_retry(
                &p,
                None,
                RetryReason::Throttled,
                Some(Duration::ZERO),
                start,
                &mut rng
            )
            .is_ok()
        );
        c.record_attempt();
        assert!(
            c.plan_retry(
                &p,
                None,
                RetryReason::Throttled,
                Some(Duration::ZERO),
                start,
                &mut rng
            )
            .is_ok()
        );
        c.record_attempt();
        assert_eq!(
            c.plan_retry(&p, None, RetryReason::Throttled, None, start, &mut rng),
            Err(StopReason::AttemptsExhausted { max_attempts: 3 })
        );
    }

    #[test]
    fn in_flight_answers_do_not_count_against_the_attempt_limit() {
        let p = policy().with_deadline(Duration::from_secs(30));
        let start = Instant::now();
        let mut c = CallState::new(Deadline::starting_at(start, p.deadline()));
        let mut rng = StdRng::seed_from_u64(3);
        // Five in-flight answers in a row, the default limit of 3 attempts: still retried.
        for n in 1..=5 {
            c.record_attempt();
            let plan = c.plan_retry(&p, None, RetryReason::InFlight, None, start, &mut rng);
            assert!(plan.is_ok(), "in-flight answer {n}: {plan:?}");
        }
        assert_eq!((c.attempts(), c.counted_attempts()), (5, 0));
        // Other retryable outcomes still count: three of them end the call.
        for _ in 0..2 {
            c.record_attempt();
            assert!(
                c.plan_retry(&p, None, RetryReason::Throttled, None, start, &mut rng)
                    .is_ok()
            );
        }
        c.record_attempt();
        assert_eq!(
            c.plan_retry(&p, None, RetryReason::Throttled, None, start, &mut rng),
            Err(StopReason::AttemptsExhausted { max_attempts: 3 })
        );
        // The deadline still bounds the in-flight waits.
        let late = start + Duration::from_secs(30);
        assert!(matches!(
            c.plan_retry(&p, None, RetryReason::InFlight, None, late, &mut rng),
            Err(StopReason::DeadlineExhausted { .. })
        ));
    }

    #[test]
    fn hint_beyond_deadline_stops_with_the_hint() {
        let p = policy();
        let start = Instant::now();
        let mut c = CallState::new(Deadline::starting_at(start, p.deadline()));
        c.record_attempt();
        let now = start + Duration::from_secs(1);
        assert_eq!(
            c.plan_retry(
                &p,
                None,
                RetryReason::ServerError(http::StatusCode::SERVICE_UNAVAILABLE),
                Some(Duration::from_secs(120)),
                now,
                &mut rand::rng()
            ),
            Err(StopReason::RetryAfterBeyondDeadline {
                hint: Duration::from_secs(120),
                remaining: Duration::from_secs(4)
            })
        );
    }

    #[test]
    fn no_sleep_past_the_deadline() {
        let p = policy().with_full_jitter(Duration::from_secs(10), Duration::from_secs(10));
        let start = Instant::now();
        let mut c = CallState::new(Deadline::starting_at(start, Duration::from_millis(1)));
        c.record_attempt();
        // With a 10 s ceiling and 1 ms left, almost every draw must stop.
        let mut rng = StdRng::seed_from_u64(9);
        let r = c.plan_retry(&p, None, RetryReason::TimedOut, None, start, &mut rng);
        assert!(
            matches!(r, Err(StopReason::DeadlineExhausted { .. })),
            "{r:?}"
        );
        let later = start + Duration::from_millis(2);
        assert!(matches!(
            c.plan_retry(&p, None, RetryReason::TimedOut, None, later, &mut rng),
            Err(StopReason::DeadlineExhausted { .. })
        ));
    }

    #[test]
    fn budget_pays_or_stops() {
        let p = policy()
            .with_max_attempts(1000)
            .with_deadline(Duration::from_secs(3600));
        let budget = RetryBudget::new(BudgetConfig::new().with_capacity(20));
        let start = Instant::now();
        let mut c = CallState::new(Deadline::starting_at(start, p.deadline()));
        c.record_attempt();
        let plan = c
            .plan_retry(
                &p,
                Some(&budget),
                RetryReason::ConnectFailed,
                None,
                start,
                &mut rand::rng(),
            )
            .unwrap();
        assert_eq!((plan.tokens_left, plan.cost), (Some(6), Some(14)));
        c.record_attempt();
        assert_eq!(
            c.plan_retry(
                &p,
                Some(&budget),
                RetryReason::ConnectFailed,
                None,
                start,
                &mut rand::rng()
            ),
            Err(StopReason::BudgetEmpty {
                available: 6,
                cost: 14
            })
        );
        let plan = c
            .plan_retry(
                &p,
                Some(&budget),
                RetryReason::Throttled,
                None,
                start,
                &mut rand::rng(),
            )
            .unwrap();
        assert_eq!(plan.tokens_left, Some(1));
        c.on_success(Some(&budget));
        assert_eq!(budget.available(), 6);
    }
}
