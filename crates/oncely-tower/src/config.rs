//! [`Config`]: everything a service of the layer needs, shared behind one `Arc`, built by
//! [`IdempotencyLayer`](crate::IdempotencyLayer) and read by the service, its claims and the
//! heartbeat (the drain gets its own part of it from the layer: the drain state, the store and
//! the store timeout).

use crate::claimer::Claimer;
use crate::dialect::Dialect;
use crate::drain::DrainState;
use crate::keeper::TimerKeeper;
use crate::key_rule::KeyRule;
use crate::key_source::KeySource;
use crate::local_claims::LocalClaims;
use crate::metrics::Metrics;
use crate::scope::ScopeExtractor;
use http::HeaderName;
use oncely_core::{Clock, Fingerprinter, KeyStore, Policy};
use std::sync::Arc;
use std::time::Duration;

/// Everything a service needs, shared behind one `Arc`.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn KeyStore>,
    pub(crate) claimer: Arc<dyn Claimer>,
    pub(crate) policy: Policy,
    pub(crate) scope: Arc<dyn ScopeExtractor>,
    pub(crate) fingerprinter: Arc<dyn Fingerprinter>,
    pub(crate) key_rule: Arc<dyn KeyRule>,
    pub(crate) key_source: KeySource,
    pub(crate) store_timeout: Duration,
    pub(crate) fingerprint_headers: Vec<HeaderName>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) drain: Arc<DrainState>,
    /// Duplicates of this process's own transactional claims, waiting in the process.
    pub(crate) local: Arc<LocalClaims>,
    /// Keeps the store timeout's timer from waking a parked worker ([`crate::keeper`]).
    pub(crate) keeper: Arc<TimerKeeper>,
    pub(crate) dialect: Arc<dyn Dialect>,
}
