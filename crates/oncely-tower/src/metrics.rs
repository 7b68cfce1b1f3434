//! The layer's counters: [`Metrics`] (its docs say what is sent where); docs/DESIGN.md,
//! "Counters".

use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident => $help:literal ),* $(,)?) => {
        /// The layer's counters (monotonic, since the layer was made). Shared by every service
        /// a layer makes; get it from
        /// [`IdempotencyLayer::metrics`](crate::IdempotencyLayer::metrics).
        ///
        /// One mechanism: every counter is sent through the [`metrics`] facade to whatever
        /// recorder the application installed (`metrics-exporter-prometheus`, ...; with none
        /// installed the facade drops them), and the same increment bumps this in-process
        /// reading, [`Metrics::snapshot`] (one layer's counts, for tests and for code that reads
        /// them). One list of counters feeds both; see docs/DESIGN.md, "Counters".
        ///
        /// The facade's series are `oncely_<name>_total` ([`MetricsSnapshot`]'s fields:
        /// `oncely_claims_total`, ...) with the labels `route` (axum's matched path template,
        /// `unknown` outside axum) and `store` (set with [`Metrics::set_store_label`]), plus, in
        /// the facade only:
        ///
        /// - `oncely_requests_total{route, outcome, store}`: one per claim attempt, `outcome`
        ///   one of `claimed`, `replayed`, `in_flight`, `mismatch`, `needs_attention`,
        ///   `store_error`;
        /// - `oncely_claim_duration_seconds{route, outcome, store}`: a histogram of the claim's
        ///   latency (the store's claim call, seconds);
        /// - `oncely_store_operation_duration_seconds{store, outcome}`: a histogram of every
        ///   store call the layer makes (claim, reads, renewals, releases; `outcome` `ok` or
        ///   `error`).
        ///
        /// [`Metrics::describe`] gives the installed recorder every series' help text (the
        /// `# HELP` lines of a Prometheus exporter).
        ///
        /// ```
        /// use oncely_core::MemoryStore;
        /// use oncely_tower::IdempotencyLayer;
        /// use std::sync::Arc;
        ///
        /// let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
        /// let metrics = layer.metrics(); // shared with every service the layer makes
        /// assert_eq!(metrics.snapshot().claims, 0);
        /// ```
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $name: AtomicU64, )*
            /// The `store` label of the facade's series (see [`Metrics::set_store_label`]).
            store: std::sync::OnceLock<&'static str>,
        }

        /// A point-in-time copy of [`Metrics`]; each field counts what the facade's
        /// `oncely_<field>_total` series counts, for this layer alone.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        #[non_exhaustive]
        pub struct MetricsSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Metrics {
            /// Reads every counter.
            pub fn snapshot(&self) -> MetricsSnapshot {
                MetricsSnapshot {
                    $( $name: self.$name.load(Ordering::Relaxed), )*
                }
            }
        }

        #[derive(Debug, Clone, Copy)]
        #[allow(non_camel_case_types)]
        pub(crate) enum Counter {
            $( $name, )*
        }

        impl Counter {
            /// Every counter, in the order of [`MetricsSnapshot`]'s fields.
            const ALL: &[Counter] = &[$( Counter::$name, )*];

            /// The facade's name: `oncely_<name>_total`.
            const fn series(self) -> &'static str {
                match self {
                    $( Counter::$name => concat!("oncely_", stringify!($name), "_total"), )*
                }
            }

            /// The help text (the exporter's `# HELP` line).
            const fn help(self) -> &'static str {
                match self {
                    $( Counter::$name => $help, )*
                }
            }
        }

        impl Metrics {
            /// The one record path of every counter: the in-process reading and the facade.
            pub(crate) fn inc(&self, c: Counter) {
                let a = match c {
                    $( Counter::$name => &self.$name, )*
                };
                a.fetch_add(1, Ordering::Relaxed);
                metrics::counter!(c.series(), "route" => facade::route(), "store" => self.store_label())
                    .increment(1);
            }
        }
    };
}

counters! {
    /// Claims granted (first attempts, takeovers and claims after the replay window).
    claims => "Claims granted (the request executed).",
    /// Stored responses replayed (including `idempotency_response_not_retained` answers).
    replays => "Stored responses replayed.",
    /// Requests answered `idempotency_request_in_flight`.
    in_flight_conflicts => "Requests answered 409 idempotency_request_in_flight.",
    /// Requests answered `idempotency_key_mismatch`.
    mismatches => "Requests answered idempotency_key_mismatch.",
    /// Claims that took over an in-flight record whose lease lapsed.
    lease_takeovers => "Claims that took over a lapsed lease.",
    /// Writes (renew, complete, release) rejected because the fencing token was stale.
    fencing_rejections => "Writes rejected for a stale fencing token.",
    /// Store calls that failed or took longer than the store timeout.
    store_errors => "Store calls that failed or timed out.",
    /// Claims released without storing a response (nothing executed, or a status the store
    /// policy does not keep).
    released => "Claims released without a stored response.",
    /// Records completed without their body (over the response size limit or a failed stream).
    not_retained => "Records completed without their body.",
    /// Requests answered `idempotency_key_missing`.
    key_missing => "Requests answered idempotency_key_missing.",
    /// Requests answered `idempotency_key_invalid`.
    key_invalid => "Requests answered idempotency_key_invalid.",
    /// Requests answered `idempotency_body_not_canonicalizable` (a JSON body that is not
    /// I-JSON, refused before any claim).
    body_not_canonicalizable => "Requests answered idempotency_body_not_canonicalizable.",
    /// Requests answered `idempotency_request_needs_attention` (their key's record was marked
    /// for a person by the completer, which gave up on it).
    needs_attention => "Requests answered idempotency_request_needs_attention (a record the completer gave up on).",
}

impl Metrics {
    /// Names the store in the `store` label of the `metrics` facade's series (`sqlite`,
    /// `postgres`, `redis`, ...; `unknown` until set). The first call wins: one layer has one
    /// store.
    pub fn set_store_label(&self, store: &'static str) {
        let _ = self.store.set(store);
    }

    /// The `store` label: what [`Metrics::set_store_label`] set, else `unknown`.
    pub fn store_label(&self) -> &'static str {
        self.store.get().copied().unwrap_or("unknown")
    }
}

impl Metrics {
    /// Describes every series the layer sends (the counters, `oncely_requests_total` and the
    /// two histograms, in seconds) to the recorder installed now: the help text a Prometheus
    /// exporter prints as `# HELP`. Call it once after installing the recorder (a recorder
    /// installed later misses the descriptions, never the values).
    pub fn describe() {
        for c in Counter::ALL {
            metrics::describe_counter!(c.series(), c.help());
        }
        metrics::describe_counter!(
            "oncely_requests_total",
            "Claim attempts, by outcome (claimed, replayed, in_flight, mismatch, needs_attention, store_error)."
        );
        metrics::describe_histogram!(
            "oncely_claim_duration_seconds",
            metrics::Unit::Seconds,
            "The store's claim call, by outcome."
        );
        metrics::describe_histogram!(
            "oncely_store_operation_duration_seconds",
            metrics::Unit::Seconds,
            "Every store call the layer makes, by outcome (ok, error)."
        );
    }
}

/// The facade's side: the request's route (a task-local scoped to the request's future, so
/// every counter bumped while it runs carries it) and the histograms.
pub(crate) mod facade {
    use std::sync::Arc;
    use std::time::Duration;

    tokio::task_local! {
        static ROUTE: Arc<str>;
    }

    /// The route of the request being handled, `unknown` outside one (a claimed request whose
    /// caller dropped it finishes on a task of its own, without the label).
    pub(crate) fn route() -> String {
        ROUTE
            .try_with(|r| r.to_string())
            .unwrap_or_else(|_| "unknown".to_owned())
    }

    /// Runs `fut` with `route` as the route label.
    pub(crate) fn scoped<F: Future>(route: Arc<str>, fut: F) -> impl Future<Output = F::Output> {
        ROUTE.scope(route, fut)
    }

    /// One claim attempt: `oncely_requests_total` and `oncely_claim_duration_seconds`.
    pub(crate) fn claim(store: &'static str, outcome: &'static str, took: Duration) {
        let route = route();
        metrics::counter!("oncely_requests_total", "route" => route.clone(), "outcome" => outcome, "store" => store)
            .increment(1);
        metrics::histogram!("oncely_claim_duration_seconds", "route" => route, "outcome" => outcome, "store" => store)
            .record(took.as_secs_f64());
    }

    /// One store call: `oncely_store_operation_duration_seconds`.
    pub(crate) fn store_call(store: &'static str, ok: bool, took: Duration) {
        metrics::histogram!("oncely_store_operation_duration_seconds", "store" => store, "outcome" => if ok { "ok" } else { "error" })
            .record(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use std::collections::HashMap;

    #[test]
    fn one_increment_reaches_the_snapshot_and_the_facade() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let m = Metrics::default();
        m.set_store_label("sqlite");
        metrics::with_local_recorder(&recorder, || {
            Metrics::describe();
            m.inc(Counter::claims);
            m.inc(Counter::claims);
            m.inc(Counter::key_invalid);
        });
        let s = m.snapshot();
        assert_eq!((s.claims, s.key_invalid, s.replays), (2, 1, 0));
        let seen: HashMap<String, (Vec<String>, Option<String>, DebugValue)> = snapshotter
            .snapshot()
            .into_vec()
            .into_iter()
            .map(|(key, _, description, value)| {
                let labels = key
                    .key()
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                (
                    key.key().name().to_owned(),
                    (labels, description.map(|d| d.to_string()), value),
                )
            })
            .collect();
        let claims = &seen["oncely_claims_total"];
        assert_eq!(claims.0, ["route=unknown", "store=sqlite"]);
        assert_eq!(
            claims.1.as_deref(),
            Some("Claims granted (the request executed).")
        );
        assert_eq!(claims.2, DebugValue::Counter(2));
        assert_eq!(seen["oncely_key_invalid_total"].2, DebugValue::Counter(1));
        // Only what was counted has a series; every counter's name comes from the one list.
        assert!(!seen.contains_key("oncely_replays_total"));
        assert_eq!(Counter::ALL.len(), 13);
    }
}
