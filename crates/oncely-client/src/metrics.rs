//! Counters of what the retry loop did, shared by every request of a client.
//!
//! One mechanism: every counter is sent through the [`metrics`] facade to the recorder the
//! application installed, as `oncely_client_<name>_total` (e.g. `oncely_client_retries_total`,
//! `oncely_client_budget_exhausted_total`; with no recorder installed the facade drops them),
//! and the same increment bumps the client's in-process reading, [`RetryMetrics::snapshot`]
//! (per client, for tests and for code that reads one client's counts). One list of counters
//! feeds both; see docs/DESIGN.md, "Counters". The retry budget's balance is the facade's gauge
//! `oncely_client_retry_budget_tokens` (after every withdrawal and deposit).
//! [`RetryMetrics::describe`] gives the installed recorder every series' help text.

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident => $help:literal ),* $(,)?) => {
        /// Live counters (relaxed atomics), the in-process reading of the
        /// `oncely_client_<name>_total` series (see the [module docs](self)).
        #[derive(Debug, Default)]
        pub struct RetryMetrics {
            $( $name: AtomicU64, )*
        }

        /// A point-in-time copy of [`RetryMetrics`]: one client's counters (the server layer
        /// counts a different set of its own); each field counts what the facade's
        /// `oncely_client_<field>_total` series counts, for this client alone.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct RetryMetricsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl RetryMetrics {
            /// A copy of every counter.
            pub fn snapshot(&self) -> RetryMetricsSnapshot {
                RetryMetricsSnapshot {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }

            /// Describes every series the client sends (the counters and the budget's gauge,
            /// in tokens) to the recorder installed now: the help text a Prometheus exporter
            /// prints as `# HELP`. Call it once after installing the recorder.
            pub fn describe() {
                $( metrics::describe_counter!(
                    concat!("oncely_client_", stringify!($name), "_total"),
                    $help
                ); )*
                metrics::describe_gauge!(
                    "oncely_client_retry_budget_tokens",
                    "The retry budget's balance, in tokens (after every withdrawal and deposit)."
                );
            }

            /// The one record path of every counter: the in-process reading and the facade.
            pub(crate) fn inc(&self, c: Counter) {
                let (value, series) = match c {
                    $( Counter::$name => (
                        &self.$name,
                        concat!("oncely_client_", stringify!($name), "_total"),
                    ), )*
                };
                value.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(series).increment(1);
            }
        }

        /// One of the counters, for [`RetryMetrics::inc`].
        #[derive(Debug, Clone, Copy)]
        #[allow(non_camel_case_types)]
        pub(crate) enum Counter {
            $( $name, )*
        }
    };
}

counters! {
    /// Logical calls started.
    calls => "Logical calls started.",
    /// Attempts made (requests handed to the transport), first attempts included.
    attempts => "Attempts made, first attempts included.",
    /// Retries made (attempts after the first).
    retries => "Retries made (attempts after the first).",
    /// Retries whose wait was set by the server's `Retry-After` rather than the backoff.
    retry_after_waits => "Retries whose wait the server's Retry-After set.",
    /// Idempotency keys minted by the client.
    keys_minted => "Idempotency keys minted by the client.",
    /// Calls that stopped because the retry budget could not pay.
    budget_exhausted => "Calls stopped because the retry budget could not pay.",
    /// Calls that stopped because the deadline ran out (or a `Retry-After` did not fit in it).
    deadline_exhausted => "Calls stopped because the deadline ran out.",
    /// Calls that stopped after their last allowed attempt.
    attempts_exhausted => "Calls stopped after their last allowed attempt.",
    /// Calls that stopped with an unknown outcome.
    outcome_unknown => "Calls stopped with an unknown outcome.",
    /// Calls whose body could not be replayed for a retry.
    not_replayable => "Calls whose body could not be replayed for a retry.",
    /// Calls that ended in an error, whatever the reason.
    gave_up => "Calls that ended in an error, whatever the reason.",
}

/// Reports the retry budget's balance (`oncely_client_retry_budget_tokens`, in tokens).
pub(crate) fn budget_balance(tokens: u32) {
    metrics::gauge!("oncely_client_retry_budget_tokens").set(f64::from(tokens));
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    #[test]
    fn counters_and_the_budget_balance_reach_the_facade() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let m = RetryMetrics::default();
        metrics::with_local_recorder(&recorder, || {
            RetryMetrics::describe();
            m.inc(Counter::retries);
            m.inc(Counter::retries);
            m.inc(Counter::budget_exhausted);
            budget_balance(495);
        });
        assert_eq!(m.snapshot().retries, 2);
        assert_eq!(m.snapshot().budget_exhausted, 1);
        let seen: std::collections::HashMap<String, (Option<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, description, value)| {
                (
                    key.key().name().to_owned(),
                    (description.map(|d| d.to_string()), value),
                )
            })
            .collect();
        assert_eq!(
            seen["oncely_client_retries_total"].1,
            DebugValue::Counter(2)
        );
        assert_eq!(
            seen["oncely_client_retries_total"].0.as_deref(),
            Some("Retries made (attempts after the first).")
        );
        assert_eq!(
            seen["oncely_client_budget_exhausted_total"].1,
            DebugValue::Counter(1)
        );
        assert!(matches!(
            seen["oncely_client_retry_budget_tokens"].1,
            DebugValue::Gauge(g) if g.into_inner() == 495.0
        ));
        assert!(!seen.contains_key("oncely_client_calls_total"));
    }
}
