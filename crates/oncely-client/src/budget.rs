//! The retry budget: a token bucket shared by every request of a client.
//!
//! # Why budgets, not (only) max retries
//!
//! "At most 3 attempts" bounds what *one* call can do, but it says nothing about what a *fleet*
//! does. When a dependency goes down, every request of every instance fails, and every one of
//! them retries: with 3 attempts, an outage turns 1,000 requests a second into 3,000, arriving at
//! the moment the dependency is least able to serve them. The retries do not help (the
//! dependency is down for everyone), they delay its recovery, and their cost grows with the
//! number of layers that each retry independently (3 layers of 3 attempts is 27x).
//!
//! A max-attempts limit cannot tell "one request was unlucky" from "everything is failing",
//! because it only sees one request. A budget sees all of them. Each retry spends tokens from a
//! bucket shared by the whole client; successful requests put tokens back. While most requests
//! succeed the bucket stays full and an unlucky request is retried as usual. When most requests
//! fail, nothing refills the bucket, it drains after a bounded number of retries, and from then
//! on failures are returned at once, without retrying: the load the fleet sends to a broken
//! dependency falls back to about one request per logical call. When the dependency recovers,
//! successes refill the bucket and retries resume on their own, with no restart.
//!
//! The per-call attempt limit stays, as the bound on one caller's latency; the budget is the bound
//! on the fleet's load. The same argument is made by tower's `retry::budget` module and by the
//! AWS SDKs' "retry quota".
//!
//! # The numbers
//!
//! The defaults follow the AWS SDKs' standard retry mode (AWS SDKs and Tools Reference Guide,
//! "Retry behavior", in its 2026 revision): a bucket of **500** tokens; a retry after a transient
//! error (a 5xx, a timeout, a reset connection) costs **14**; a retry after throttling (429, or the
//! server's `idempotency_request_in_flight`) costs **5**, because a throttled server is healthy and
//! asking for patience, not failing; a request that succeeds on its first attempt refunds **1**;
//! a request that succeeds after a retry refunds the cost of that retry. Under a total outage a
//! full bucket therefore pays for `500 / 14 = 35` transient retries, then none, whatever the
//! number of calls.
//!
//! ```
//! use oncely_client::budget::{BudgetConfig, RetryBudget, RetryCost};
//!
//! let budget = RetryBudget::new(BudgetConfig::new());
//! assert_eq!(budget.available(), 500);
//! let mut retries = 0;
//! while budget.try_withdraw(RetryCost::Transient).is_ok() {
//!     retries += 1;
//! }
//! assert_eq!(retries, 35);
//! // Four first-attempt successes refund 4 tokens: 10 + 4 = 14, enough for one more retry.
//! for _ in 0..4 {
//!     budget.on_success(None);
//! }
//! assert!(budget.try_withdraw(RetryCost::Transient).is_ok());
//! ```

use std::sync::atomic::{AtomicU32, Ordering};

/// The numbers of a [`RetryBudget`]; all amounts are in tokens.
///
/// Defaults (AWS SDKs' standard retry mode): capacity 500, transient retry 14, throttle retry 5,
/// first-attempt success refund 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BudgetConfig {
    capacity: u32,
    transient_cost: u32,
    throttle_cost: u32,
    success_refund: u32,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        Self::new()
    }
}

impl BudgetConfig {
    /// The defaults: capacity 500, transient retry 14, throttle retry 5, success refund 1.
    pub const fn new() -> Self {
        Self {
            capacity: 500,
            transient_cost: 14,
            throttle_cost: 5,
            success_refund: 1,
        }
    }

    /// Sets the capacity (and the initial fill) of the bucket, in tokens.
    pub const fn with_capacity(mut self, tokens: u32) -> Self {
        self.capacity = tokens;
        self
    }

    /// Sets what a retry after a transient error costs, in tokens.
    pub const fn with_transient_cost(mut self, tokens: u32) -> Self {
        self.transient_cost = tokens;
        self
    }

    /// Sets what a retry after throttling costs, in tokens.
    pub const fn with_throttle_cost(mut self, tokens: u32) -> Self {
        self.throttle_cost = tokens;
        self
    }

    /// Sets what a success on the first attempt refunds, in tokens.
    pub const fn with_success_refund(mut self, tokens: u32) -> Self {
        self.success_refund = tokens;
        self
    }

    /// Capacity of the bucket, in tokens.
    pub const fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Cost of one retry of the given kind, in tokens.
    pub const fn cost(&self, kind: RetryCost) -> u32 {
        match kind {
            RetryCost::Transient => self.transient_cost,
            RetryCost::Throttle => self.throttle_cost,
        }
    }

    /// Refund for a success on the first attempt, in tokens.
    pub const fn success_refund(&self) -> u32 {
        self.success_refund
    }
}

/// Which price a retry pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RetryCost {
    /// A 5xx, a timeout, a failed or reset connection (default 14 tokens).
    Transient,
    /// A 429 or an `idempotency_request_in_flight` 409: the server asks to come back later
    /// (default 5 tokens).
    Throttle,
}

/// The bucket could not pay for a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetEmpty {
    /// Tokens in the bucket when the retry was refused.
    pub available: u32,
    /// What the retry would have cost, in tokens.
    pub cost: u32,
}

/// A token bucket shared (through an `Arc`) by every request of one client.
///
/// Lock-free: the balance is one atomic, updated with compare-and-swap, so concurrent requests
/// never overdraw it.
#[derive(Debug)]
pub struct RetryBudget {
    config: BudgetConfig,
    tokens: AtomicU32,
}

impl RetryBudget {
    /// A full bucket.
    pub fn new(config: BudgetConfig) -> Self {
        Self {
            config,
            tokens: AtomicU32::new(config.capacity),
        }
    }

    /// The configuration.
    pub fn config(&self) -> BudgetConfig {
        self.config
    }

    /// Tokens currently in the bucket.
    pub fn available(&self) -> u32 {
        self.tokens.load(Ordering::Acquire)
    }

    /// Pays for one retry. On success returns the tokens left and the price paid.
    ///
    /// # Errors
    ///
    /// [`BudgetEmpty`] when the bucket holds fewer tokens than the retry costs; nothing is taken.
    pub fn try_withdraw(&self, kind: RetryCost) -> Result<(u32, u32), BudgetEmpty> {
        let cost = self.config.cost(kind);
        let mut current = self.tokens.load(Ordering::Acquire);
        loop {
            let Some(left) = current.checked_sub(cost) else {
                return Err(BudgetEmpty {
                    available: current,
                    cost,
                });
            };
            match self.tokens.compare_exchange_weak(
                current,
                left,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    crate::metrics::budget_balance(left);
                    return Ok((left, cost));
                }
                Err(actual) => current = actual,
            }
        }
    }

    /// Records a successful logical call: refunds the price of its last retry when it was
    /// retried (`last_retry_cost`), else the first-attempt refund. Never above capacity.
    pub fn on_success(&self, last_retry_cost: Option<u32>) {
        let refund = last_retry_cost.unwrap_or(self.config.success_refund);
        self.deposit(refund);
    }

    /// Adds tokens, never above capacity.
    pub fn deposit(&self, tokens: u32) {
        let capacity = self.config.capacity;
        let before = self
            .tokens
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| {
                Some(t.saturating_add(tokens).min(capacity))
            });
        if let Ok(t) = before {
            crate::metrics::budget_balance(t.saturating_add(tokens).min(capacity));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn drains_after_35_transient_retries_and_refills() {
        let b = RetryBudget::new(BudgetConfig::new());
        let mut n = 0;
        while b.try_withdraw(RetryCost::Transient).is_ok() {
            n += 1;
        }
        assert_eq!(n, 35);
        assert_eq!(
            b.try_withdraw(RetryCost::Transient),
            Err(BudgetEmpty {
                available: 10,
                cost: 14
            })
        );
        // A throttle retry is cheaper and still fits in 10 tokens.
        assert_eq!(b.try_withdraw(RetryCost::Throttle), Ok((5, 5)));
        b.on_success(Some(5));
        assert_eq!(b.available(), 10);
        for _ in 0..1000 {
            b.on_success(None);
        }
        assert_eq!(b.available(), 500);
    }

    #[test]
    fn concurrent_withdrawals_never_overdraw() {
        let b = Arc::new(RetryBudget::new(BudgetConfig::new()));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let b = b.clone();
                std::thread::spawn(move || {
                    let mut n = 0;
                    for _ in 0..100 {
                        if b.try_withdraw(RetryCost::Transient).is_ok() {
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        let total: u32 = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, 35);
    }
}
