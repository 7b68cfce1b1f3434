//! [`IdempotencyLayer`]: the builder and [`tower::Layer`] of the idempotency middleware.

use crate::claimer::{Claimer, StoreClaimer};
use crate::config::Config;
use crate::dialect::{Dialect, ProblemJson};
use crate::drain::Drain;
use crate::key_rule::{DefaultKeyRule, KeyRule};
use crate::key_source::KeySource;
use crate::metrics::Metrics;
use crate::scope::{ExtensionScope, ScopeExtractor};
use crate::service::Idempotency;
use http::HeaderName;
use oncely_core::{
    Clock, DefaultFingerprinter, Fingerprinter, KeyStore, Policy, PolicyError, SystemClock,
};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tower::Layer;

/// The default store timeout: 5 seconds.
pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(5);

/// Request headers that never take part in the fingerprint nor in the stored request, even when
/// configured: credentials belong to the scope, and a rotated credential must not turn a retry
/// into a mismatch (DESIGN.md, "The key contract").
pub const CREDENTIAL_HEADERS: &[&str] = &["authorization", "proxy-authorization", "cookie"];

/// The idempotency middleware as a [`tower::Layer`]: wraps a service in [`Idempotency`].
///
/// Defaults: [`Policy::default()`] (replay window 24 hours, retention 72 hours, lease
/// 30 seconds renewed every 10 seconds, in-flight duplicates rejected with `Retry-After: 1`,
/// `ietf` statuses, 1 MiB request and response limits), the scope from request extensions
/// ([`ExtensionScope`]), fingerprint version 1 ([`DefaultFingerprinter`]), keys required on
/// POST/PATCH and accepted on PUT/DELETE ([`DefaultKeyRule`]) from the `Idempotency-Key` header
/// ([`KeySource::default()`]), a 5-second store timeout, no extra fingerprint headers, and the
/// system clock.
///
/// Cloning is cheap; clones share their [`Metrics`], and the one background task (started at
/// the first keyed request, one wake-up a second) that keeps each claim's store-timeout timer
/// from waking an idle worker thread.
///
/// ```
/// use oncely_core::{MemoryStore, Policy, InFlightBehavior};
/// use oncely_tower::IdempotencyLayer;
/// use std::{sync::Arc, time::Duration};
///
/// let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()))
///     .with_policy(Policy::default().with_in_flight(InFlightBehavior::Wait {
///         max: Duration::from_secs(5),
///         poll: Duration::from_millis(50),
///     }))
///     .with_store_timeout(Duration::from_secs(2))
///     .with_fingerprint_headers(vec![http::HeaderName::from_static("x-api-version")]);
/// # let _ = layer;
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer {
    config: Config,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("policy", &self.config.policy)
            .field("store_timeout", &self.config.store_timeout)
            .field("fingerprint_headers", &self.config.fingerprint_headers)
            .field("key_source", &self.config.key_source)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// A layer over `store` with the defaults listed on [`IdempotencyLayer`].
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        Self {
            config: Config {
                claimer: Arc::new(StoreClaimer(Arc::clone(&store))),
                store,
                policy: Policy::default(),
                scope: Arc::new(ExtensionScope),
                fingerprinter: Arc::new(DefaultFingerprinter),
                key_rule: Arc::new(DefaultKeyRule),
                key_source: KeySource::default(),
                store_timeout: DEFAULT_STORE_TIMEOUT,
                fingerprint_headers: Vec::new(),
                clock: Arc::new(SystemClock),
                metrics: Arc::new(Metrics::default()),
                drain: Arc::default(),
                local: Arc::default(),
                keeper: Arc::default(),
                dialect: Arc::new(ProblemJson),
            },
        }
    }

    /// Replaces the policy.
    ///
    /// # Panics
    ///
    /// When the policy is invalid (see [`Policy::validate`]); use
    /// [`IdempotencyLayer::try_with_policy`] to handle that as an error.
    #[track_caller]
    pub fn with_policy(self, policy: Policy) -> Self {
        match self.try_with_policy(policy) {
            Ok(l) => l,
            Err(e) => panic!("invalid idempotency policy: {e}"),
        }
    }

    /// Replaces the policy after validating it.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] naming the first broken invariant (retention shorter than the replay
    /// window, a zero lease, a heartbeat not shorter than the lease).
    pub fn try_with_policy(mut self, policy: Policy) -> Result<Self, PolicyError> {
        policy.validate()?;
        if policy.lease < Duration::from_secs(1) {
            tracing::warn!(
                lease_ms = policy.lease.as_millis() as u64,
                "idempotency lease under 1 second: a store stall or process pause longer than about two-thirds of it lets a duplicate take a live request over (docs/DESIGN.md, \"Leases and fencing tokens\")"
            );
        }
        self.config.policy = policy;
        Ok(self)
    }

    /// Replaces how claims are made (default [`StoreClaimer`]: one [`KeyStore::claim`] call,
    /// committed at once). A transactional claimer (the `oncely-sqlx` crate) claims inside the
    /// handler's own database transaction; its store must be the one this layer was made with.
    pub fn with_claimer(mut self, claimer: impl Claimer) -> Self {
        self.config.claimer = Arc::new(claimer);
        self
    }

    /// Replaces how the caller's scope is found (default [`ExtensionScope`]).
    pub fn with_scope_extractor(mut self, e: impl ScopeExtractor) -> Self {
        self.config.scope = Arc::new(e);
        self
    }

    /// Replaces the fingerprint function (default [`DefaultFingerprinter`], version 1). It must
    /// be deterministic and the same on every instance sharing the store.
    pub fn with_fingerprinter(mut self, f: impl Fingerprinter) -> Self {
        self.config.fingerprinter = Arc::new(f);
        self
    }

    /// Replaces which routes require, accept or ignore a key (default [`DefaultKeyRule`]).
    pub fn with_key_rule(mut self, r: impl KeyRule) -> Self {
        self.config.key_rule = Arc::new(r);
        self
    }

    /// Replaces where the key is read (default [`KeySource::default()`], the `Idempotency-Key`
    /// header): another header such as Standard Webhooks' `webhook-id`, or a JSON Pointer into
    /// the body such as `/id`. The key rules, the scope and the fingerprint are the same for
    /// every source; a missing or invalid key is `400 idempotency_key_missing` /
    /// `idempotency_key_invalid` naming the source.
    ///
    /// The source applies to every route this layer wraps: give a webhook route its own layer,
    /// a clone of the API's (clones share the store, [`Metrics`] and [`Drain`](crate::Drain)).
    pub fn with_key_source(mut self, source: KeySource) -> Self {
        self.config.key_source = source;
        self
    }

    /// Where this layer reads the key.
    pub fn key_source(&self) -> &KeySource {
        &self.config.key_source
    }

    /// Replaces how answers are said and responses judged (default [`ProblemJson`](crate::ProblemJson):
    /// RFC 9457 problem details and the HTTP status). The `oncely-grpc` crate sets its gRPC
    /// dialect here.
    pub fn with_dialect(mut self, d: impl Dialect) -> Self {
        self.config.dialect = Arc::new(d);
        self
    }

    /// Sets the longest wait for one store call (default 5 seconds). A claim slower than this
    /// fails closed with `503 idempotency_store_unavailable` and the handler does not run; a
    /// completion slower than this is logged and the response is still returned.
    ///
    /// A claim that timed out may still have been recorded by the store: the key then stays in
    /// flight until its lease lapses, and a retry after that takes it over.
    pub fn with_store_timeout(mut self, t: Duration) -> Self {
        self.config.store_timeout = t;
        // The keeper's period follows the store timeout (see `crate::keeper`): a keeper of its
        // own, not one shared with clones of other timeouts.
        self.config.keeper = Arc::default();
        self
    }

    /// Adds request headers to the fingerprint (default none), in this order; a header missing
    /// from a request counts as "no value". Their values are also kept in the stored request.
    /// Credential headers ([`CREDENTIAL_HEADERS`]) are ignored here: they never take part.
    pub fn with_fingerprint_headers(mut self, names: Vec<HeaderName>) -> Self {
        self.config.fingerprint_headers = names
            .into_iter()
            .filter(|n| !CREDENTIAL_HEADERS.contains(&n.as_str()))
            .collect();
        self
    }

    /// Replaces the clock (default the system clock). The layer reads it to check the replay
    /// window of a record it polls in wait mode and to size the in-flight `Retry-After` from
    /// the first request's age and lease; pass the store's clock.
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.config.clock = Arc::new(clock);
        self
    }

    /// The counters of this layer and of every service it made.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.config.metrics)
    }

    /// The graceful-shutdown handle of this layer and of every service it made (see
    /// [`Drain`](crate::Drain)). Call it after the builder methods: it keeps the store and
    /// store timeout configured at this point.
    pub fn drain(&self) -> Drain {
        Drain::new(
            Arc::clone(&self.config.drain),
            Arc::clone(&self.config.store),
            self.config.store_timeout,
        )
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.config.policy
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, Arc::new(self.config.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::MemoryStore;

    fn layer() -> IdempotencyLayer {
        IdempotencyLayer::new(Arc::new(MemoryStore::new()))
    }

    #[test]
    fn invalid_policies_are_refused() {
        let bad = Policy::default().with_heartbeat(Duration::from_secs(30));
        assert!(matches!(
            layer().try_with_policy(bad).unwrap_err(),
            PolicyError::HeartbeatNotShorterThanLease { .. }
        ));
        let good = Policy::default().with_lease(Duration::from_secs(60));
        assert_eq!(
            layer().try_with_policy(good).unwrap().policy().lease,
            Duration::from_secs(60)
        );
    }

    #[test]
    #[should_panic(expected = "invalid idempotency policy")]
    fn with_policy_panics_on_an_invalid_policy() {
        let _ = layer().with_policy(Policy::default().with_retention(Duration::from_secs(1)));
    }

    #[test]
    fn credential_headers_never_enter_the_fingerprint() {
        let l = layer().with_fingerprint_headers(vec![
            HeaderName::from_static("x-api-version"),
            http::header::AUTHORIZATION,
            http::header::COOKIE,
            http::header::PROXY_AUTHORIZATION,
        ]);
        assert_eq!(
            l.config.fingerprint_headers,
            vec![HeaderName::from_static("x-api-version")]
        );
        assert_eq!(l.config.store_timeout, DEFAULT_STORE_TIMEOUT);
    }
}
