//! A fleet of instances retrying through an outage, with and without the retry budget.
//!
//! # The model
//!
//! `instances` instances (default 100) each start one logical call every `call_interval`
//! (default 100 ms, with a per-instance random phase) until each has started
//! `calls_per_instance` (default 1,000). Every request crosses the network (10 ms mean, 2 ms
//! standard deviation each way) and, while the outage lasts, fails with probability
//! `failure_rate` (default 1.0: a total outage for the whole run). A failed request is a
//! transient error: the instance retries it after a full-jitter backoff, up to `max_attempts`
//! attempts in total, and, when the budget is on, only if that instance's own
//! [`RetryBudget`] (the real one, 500 tokens, 14 a transient retry, refunds on success) can pay.
//!
//! The report's **amplification** is requests sent divided by logical calls: 1.0 means no retry
//! load at all, 3.0 means every call used all 3 attempts.
//!
//! ```
//! use oncely_client::simulate::{OutageConfig, run_outage};
//!
//! let base = OutageConfig::new().with_instances(10).with_calls_per_instance(300);
//! let without = run_outage(&base.with_budget(None));
//! let with = run_outage(&base);
//! assert!((without.amplification - 3.0).abs() < 1e-9);
//! assert!(with.amplification < 1.2);
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::net::Net;
use crate::backoff::Backoff;
use crate::budget::{BudgetConfig, RetryBudget, RetryCost};

/// Configuration of an outage simulation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OutageConfig {
    instances: usize,
    calls_per_instance: u32,
    call_interval: Duration,
    failure_rate: f64,
    outage: Option<(Duration, Duration)>,
    max_attempts: u32,
    backoff: Backoff,
    budget: Option<BudgetConfig>,
    seed: u64,
}

impl Default for OutageConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl OutageConfig {
    /// 100 instances, 1,000 calls each, one every 100 ms, a total outage (failure rate 1.0) for
    /// the whole run, 3 attempts, full jitter from 500 ms capped at 8 s, the default budget,
    /// seed 1.
    pub const fn new() -> Self {
        Self {
            instances: 100,
            calls_per_instance: 1000,
            call_interval: Duration::from_millis(100),
            failure_rate: 1.0,
            outage: None,
            max_attempts: 3,
            backoff: Backoff::full_jitter(Duration::from_millis(500), Duration::from_secs(8)),
            budget: Some(BudgetConfig::new()),
            seed: 1,
        }
    }

    /// Number of instances, each with its own client and budget.
    pub const fn with_instances(mut self, instances: usize) -> Self {
        self.instances = instances;
        self
    }

    /// Logical calls each instance starts.
    pub const fn with_calls_per_instance(mut self, calls: u32) -> Self {
        self.calls_per_instance = calls;
        self
    }

    /// Time between two logical calls of one instance.
    pub const fn with_call_interval(mut self, interval: Duration) -> Self {
        self.call_interval = interval;
        self
    }

    /// Probability (0.0 to 1.0) that a request fails while the outage lasts.
    pub const fn with_failure_rate(mut self, rate: f64) -> Self {
        self.failure_rate = rate;
        self
    }

    /// Limits the outage to `[start, end)` of simulated time; by default it lasts the whole run.
    pub const fn with_outage_window(mut self, start: Duration, end: Duration) -> Self {
        self.outage = Some((start, end));
        self
    }

    /// Total attempts per logical call.
    pub const fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = if attempts == 0 { 1 } else { attempts };
        self
    }

    /// The backoff between attempts.
    pub const fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The per-instance retry budget, or `None` for no budget.
    pub const fn with_budget(mut self, budget: Option<BudgetConfig>) -> Self {
        self.budget = budget;
        self
    }

    /// The seed.
    pub const fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }
}

/// The result of [`run_outage`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct OutageReport {
    /// Whether the budget was on.
    pub budget: bool,
    /// Logical calls started (instances x calls per instance).
    pub logical_calls: u64,
    /// Requests that reached the server, retries included.
    pub requests: u64,
    /// `requests / logical_calls`.
    pub amplification: f64,
    /// Retries made.
    pub retries: u64,
    /// Retries the budget refused.
    pub retries_denied: u64,
    /// Logical calls that ended in success.
    pub succeeded: u64,
    /// Logical calls that ended in failure.
    pub failed: u64,
    /// The most requests the server received in any one second of simulated time.
    pub peak_requests_per_second: u64,
    /// When the last call ended.
    pub duration: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An instance starts its next logical call.
    Start { instance: usize },
    /// An attempt of a call reaches the server.
    Arrive { instance: usize, attempt: u32 },
    /// The answer reaches the instance.
    Answer {
        instance: usize,
        attempt: u32,
        ok: bool,
    },
}

/// Runs the outage simulation.
pub fn run_outage(config: &OutageConfig) -> OutageReport {
    let mut rng = StdRng::seed_from_u64(config.seed);
    let net = Net {
        mean: Duration::from_millis(10),
        sd: Duration::from_millis(2),
    };
    let budgets: Vec<Option<RetryBudget>> = (0..config.instances)
        .map(|_| config.budget.map(RetryBudget::new))
        .collect();
    let mut started = vec![0u32; config.instances];
    let mut queue: BinaryHeap<Reverse<(u64, u64, Event)>> = BinaryHeap::new();
    let mut seq = 0u64;
    let mut push = |queue: &mut BinaryHeap<_>, at: u64, event: Event| {
        seq += 1;
        queue.push(Reverse((at, seq, event)));
    };
    let interval = u64::try_from(config.call_interval.as_nanos()).unwrap_or(u64::MAX);
    for instance in 0..config.instances {
        let phase = if interval == 0 {
            0
        } else {
            rng.random_range(0..interval)
        };
        push(&mut queue, phase, Event::Start { instance });
    }
    let outage = config.outage.map(|(s, e)| {
        (
            u64::try_from(s.as_nanos()).unwrap_or(u64::MAX),
            u64::try_from(e.as_nanos()).unwrap_or(u64::MAX),
        )
    });
    let mut report = OutageReport {
        budget: config.budget.is_some(),
        logical_calls: 0,
        requests: 0,
        amplification: 0.0,
        retries: 0,
        retries_denied: 0,
        succeeded: 0,
        failed: 0,
        peak_requests_per_second: 0,
        duration: Duration::ZERO,
    };
    // Last retry cost per in-flight call is needed for refunds; calls of one instance may
    // overlap, so it travels with the attempt number (cost is constant: transient).
    let transient_cost = config.budget.map(|b| b.cost(RetryCost::Transient));
    let mut second = u64::MAX;
    let mut in_second = 0u64;
    let mut now = 0u64;
    while let Some(Reverse((at, _, event))) = queue.pop() {
        now = at;
        match event {
            Event::Start { instance } => {
                if started[instance] >= config.calls_per_instance {
                    continue;
                }
                started[instance] += 1;
                report.logical_calls += 1;
                push(
                    &mut queue,
                    now.saturating_add(net.delay(&mut rng)),
                    Event::Arrive {
                        instance,
                        attempt: 1,
                    },
                );
                if started[instance] < config.calls_per_instance {
                    push(
                        &mut queue,
                        now.saturating_add(interval),
                        Event::Start { instance },
                    );
                }
            }
            Event::Arrive { instance, attempt } => {
                report.requests += 1;
                let this_second = now / 1_000_000_000;
                if this_second != second {
                    second = this_second;
                    in_second = 0;
                }
                in_second += 1;
                report.peak_requests_per_second = report.peak_requests_per_second.max(in_second);
                let in_outage = outage.is_none_or(|(s, e)| now >= s && now < e);
                let ok = !(in_outage && rng.random_bool(config.failure_rate.clamp(0.0, 1.0)));
                push(
                    &mut queue,
                    now.saturating_add(net.delay(&mut rng)),
                    Event::Answer {
                        instance,
                        attempt,
                        ok,
                    },
                );
            }
            Event::Answer {
                instance,
                attempt,
                ok,
            } => {
                let budget = budgets[instance].as_ref();
                if ok {
                    report.succeeded += 1;
                    if let Some(b) = budget {
                        b.on_success(if attempt > 1 { transient_cost } else { None });
                    }
                    continue;
                }
                if attempt >= config.max_attempts {
                    report.failed += 1;
                    continue;
                }
                if let Some(b) = budget
                    && b.try_withdraw(RetryCost::Transient).is_err()
                {
                    report.retries_denied += 1;
                    report.failed += 1;
                    continue;
                }
                report.retries += 1;
                let sleep = config.backoff.delay(attempt - 1, None, &mut rng);
                let sleep = u64::try_from(sleep.as_nanos()).unwrap_or(u64::MAX);
                push(
                    &mut queue,
                    now.saturating_add(sleep)
                        .saturating_add(net.delay(&mut rng)),
                    Event::Arrive {
                        instance,
                        attempt: attempt + 1,
                    },
                );
            }
        }
    }
    report.duration = Duration::from_nanos(now);
    report.amplification = if report.logical_calls == 0 {
        0.0
    } else {
        report.requests as f64 / report.logical_calls as f64
    };
    report
}

/// Runs the same outage twice, without and then with the configured budget (the default budget
/// if the configuration has none), and returns both reports in that order.
pub fn compare_budget(config: &OutageConfig) -> [OutageReport; 2] {
    let budget = config.budget.unwrap_or_default();
    [
        run_outage(&config.with_budget(None)),
        run_outage(&config.with_budget(Some(budget))),
    ]
}
