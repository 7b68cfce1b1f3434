//! Counters of what the layer did, out of the box: read them with [`Metrics::snapshot`] or
//! serve them with [`Metrics::render_prometheus`].
//!
//! ```
//! use oncely_core::MemoryStore;
//! use oncely_tower::IdempotencyLayer;
//! use std::sync::Arc;
//!
//! let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
//! let metrics = layer.metrics(); // shared with every service the layer makes
//! assert_eq!(metrics.snapshot().claims, 0);
//! assert!(metrics.render_prometheus().contains("oncely_claims_total 0"));
//! ```

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident => $help:literal ),* $(,)?) => {
        /// The layer's counters (monotonic, since the layer was made). Shared by every service
        /// a layer makes; get it from [`IdempotencyLayer::metrics`](crate::IdempotencyLayer::metrics).
        #[derive(Debug, Default)]
        pub struct Metrics {
            $( $name: AtomicU64, )*
        }

        /// A point-in-time copy of [`Metrics`].
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

            /// The counters in the Prometheus text exposition format (version 0.0.4), one
            /// `oncely_<name>_total` counter each, with `# HELP` and `# TYPE` lines.
            pub fn render_prometheus(&self) -> String {
                let s = self.snapshot();
                let mut out = String::new();
                $(
                    let _ = writeln!(out, "# HELP oncely_{}_total {}", stringify!($name), $help);
                    let _ = writeln!(out, "# TYPE oncely_{}_total counter", stringify!($name));
                    let _ = writeln!(out, "oncely_{}_total {}", stringify!($name), s.$name);
                )*
                out
            }
        }

        #[derive(Debug, Clone, Copy)]
        #[allow(non_camel_case_types)]
        pub(crate) enum Counter {
            $( $name, )*
        }

        impl Metrics {
            pub(crate) fn inc(&self, c: Counter) {
                let a = match c {
                    $( Counter::$name => &self.$name, )*
                };
                a.fetch_add(1, Ordering::Relaxed);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let m = Metrics::default();
        m.inc(Counter::claims);
        m.inc(Counter::claims);
        m.inc(Counter::key_invalid);
        let s = m.snapshot();
        assert_eq!(s.claims, 2);
        assert_eq!(s.key_invalid, 1);
        assert_eq!(s.replays, 0);
        let text = m.render_prometheus();
        assert!(text.contains("# TYPE oncely_claims_total counter\noncely_claims_total 2\n"));
        assert!(text.contains("oncely_key_invalid_total 1\n"));
        assert_eq!(text.lines().count(), 13 * 3);
    }
}
