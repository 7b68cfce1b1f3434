//! Counters of what the retry loop did, shared by every request of a client.
//!
//! Plain atomics, cheap to update on every attempt; read them with [`RetryMetrics::snapshot`]
//! and export them to whatever metrics system you use.
//!
//! With the `metrics` feature every counter is also sent through the [`metrics`] facade to the
//! recorder the application installed, as `oncely_client_<name>_total` (e.g.
//! `oncely_client_retries_total`, `oncely_client_budget_exhausted_total`), and the retry
//! budget's balance as the gauge `oncely_client_retry_budget_tokens` (after every withdrawal
//! and deposit).

use std::sync::atomic::{AtomicU64, Ordering};

/// One counter: a relaxed atomic and, for the `metrics` facade, its name.
#[derive(Debug)]
pub(crate) struct Counter {
    value: AtomicU64,
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    name: &'static str,
}

impl Counter {
    const fn new(name: &'static str) -> Self {
        Self {
            value: AtomicU64::new(0),
            name,
        }
    }
}

/// Live counters (relaxed atomics).
#[derive(Debug)]
pub struct RetryMetrics {
    pub(crate) calls: Counter,
    pub(crate) attempts: Counter,
    pub(crate) retries: Counter,
    pub(crate) retry_after_waits: Counter,
    pub(crate) keys_minted: Counter,
    pub(crate) budget_exhausted: Counter,
    pub(crate) deadline_exhausted: Counter,
    pub(crate) attempts_exhausted: Counter,
    pub(crate) outcome_unknown: Counter,
    pub(crate) not_replayable: Counter,
    pub(crate) gave_up: Counter,
}

impl Default for RetryMetrics {
    fn default() -> Self {
        Self {
            calls: Counter::new("oncely_client_calls_total"),
            attempts: Counter::new("oncely_client_attempts_total"),
            retries: Counter::new("oncely_client_retries_total"),
            retry_after_waits: Counter::new("oncely_client_retry_after_waits_total"),
            keys_minted: Counter::new("oncely_client_keys_minted_total"),
            budget_exhausted: Counter::new("oncely_client_budget_exhausted_total"),
            deadline_exhausted: Counter::new("oncely_client_deadline_exhausted_total"),
            attempts_exhausted: Counter::new("oncely_client_attempts_exhausted_total"),
            outcome_unknown: Counter::new("oncely_client_outcome_unknown_total"),
            not_replayable: Counter::new("oncely_client_not_replayable_total"),
            gave_up: Counter::new("oncely_client_gave_up_total"),
        }
    }
}

/// A point-in-time copy of [`RetryMetrics`]: one client's counters (the server layer counts a
/// different set of its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryMetricsSnapshot {
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
    pub fn snapshot(&self) -> RetryMetricsSnapshot {
        let l = |c: &Counter| c.value.load(Ordering::Relaxed);
        RetryMetricsSnapshot {
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

pub(crate) fn bump(counter: &Counter) {
    counter.value.fetch_add(1, Ordering::Relaxed);
    #[cfg(feature = "metrics")]
    metrics::counter!(counter.name).increment(1);
}

/// Reports the retry budget's balance (`oncely_client_retry_budget_tokens`), with the
/// `metrics` feature.
pub(crate) fn budget_balance(tokens: u32) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("oncely_client_retry_budget_tokens").set(f64::from(tokens));
    #[cfg(not(feature = "metrics"))]
    let _ = tokens;
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn counters_and_the_budget_balance_reach_the_facade() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let m = RetryMetrics::default();
        metrics::with_local_recorder(&recorder, || {
            bump(&m.retries);
            bump(&m.retries);
            bump(&m.budget_exhausted);
            budget_balance(495);
        });
        assert_eq!(m.snapshot().retries, 2);
        let seen: std::collections::HashMap<String, DebugValue> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, _, value)| (key.key().name().to_owned(), value))
            .collect();
        assert_eq!(seen["oncely_client_retries_total"], DebugValue::Counter(2));
        assert_eq!(
            seen["oncely_client_budget_exhausted_total"],
            DebugValue::Counter(1)
        );
        assert!(matches!(
            seen["oncely_client_retry_budget_tokens"],
            DebugValue::Gauge(g) if g.into_inner() == 495.0
        ));
        assert!(!seen.contains_key("oncely_client_calls_total"));
    }
}
