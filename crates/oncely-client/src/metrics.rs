//! Counters of what the retry loop did, shared by every request of a client.
//!
//! Plain atomics, cheap to update on every attempt; read them with [`RetryMetrics::snapshot`]
//! and export them to whatever metrics system you use.

use std::sync::atomic::{AtomicU64, Ordering};

/// Live counters (relaxed atomics).
#[derive(Debug, Default)]
pub struct RetryMetrics {
    pub(crate) calls: AtomicU64,
    pub(crate) attempts: AtomicU64,
    pub(crate) retries: AtomicU64,
    pub(crate) retry_after_waits: AtomicU64,
    pub(crate) keys_minted: AtomicU64,
    pub(crate) budget_exhausted: AtomicU64,
    pub(crate) deadline_exhausted: AtomicU64,
    pub(crate) attempts_exhausted: AtomicU64,
    pub(crate) outcome_unknown: AtomicU64,
    pub(crate) not_replayable: AtomicU64,
    pub(crate) gave_up: AtomicU64,
}

/// A point-in-time copy of [`RetryMetrics`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricsSnapshot {
    /// Logical calls started.
    pub calls: u64,
    /// Attempts made (requests handed to the transport), first attempts included.
    pub attempts: u64,
    /// Retries made (attempts after the first).
    pub retries: u64,
    /// Retries whose wait was set by the server's `Retry-After` rather than the backoff.
    pub retry_after_waits: u64,
    /// Idempotency keys minted by the client.
    pub keys_minted: u64,
    /// Calls that stopped because the retry budget could not pay.
    pub budget_exhausted: u64,
    /// Calls that stopped because the deadline ran out (or a `Retry-After` did not fit in it).
    pub deadline_exhausted: u64,
    /// Calls that stopped after their last allowed attempt.
    pub attempts_exhausted: u64,
    /// Calls that stopped with an unknown outcome.
    pub outcome_unknown: u64,
    /// Calls whose body could not be replayed for a retry.
    pub not_replayable: u64,
    /// Calls that ended in an error, whatever the reason.
    pub gave_up: u64,
}

impl RetryMetrics {
    /// A copy of every counter.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MetricsSnapshot {
            calls: l(&self.calls),
            attempts: l(&self.attempts),
            retries: l(&self.retries),
            retry_after_waits: l(&self.retry_after_waits),
            keys_minted: l(&self.keys_minted),
            budget_exhausted: l(&self.budget_exhausted),
            deadline_exhausted: l(&self.deadline_exhausted),
            attempts_exhausted: l(&self.attempts_exhausted),
            outcome_unknown: l(&self.outcome_unknown),
            not_replayable: l(&self.not_replayable),
            gave_up: l(&self.gave_up),
        }
    }
}

pub(crate) fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}
