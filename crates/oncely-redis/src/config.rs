//! [`RedisConfig`]: the store's connection settings and their defaults.

use crate::keys::DEFAULT_NAMESPACE;
use std::time::Duration;

/// The default operation timeout: 2 seconds per Redis round trip.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// The default `WAIT` timeout: 500 milliseconds for the required replicas to acknowledge.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// The default interval of the walk of the whole namespace (the maintenance index's backstop):
/// 1 hour.
pub const DEFAULT_INDEX_WALK_EVERY: Duration = Duration::from_secs(3600);

/// Connection settings for [`RedisStore::connect_with`](crate::RedisStore::connect_with). The store
/// URL's query parameters `namespace`, `accept_volatile`, `wait_replicas` and `wait_timeout_ms`,
/// when present, override the fields of the same name.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The longest one Redis round trip may take before the operation fails with
    /// [`StoreError::Unavailable`](oncely_core::StoreError::Unavailable) (wrapping
    /// [`OperationTimedOut`](crate::OperationTimedOut)). Also used as the connection's connect and
    /// response timeouts. A write that waits for replicas may take this plus
    /// [`RedisConfig::wait_timeout`]. Default: [`DEFAULT_OPERATION_TIMEOUT`] (2 seconds).
    pub operation_timeout: Duration,
    /// The key prefix, so several applications (or test runs) can share one Redis database
    /// without seeing each other's records: every operation, the reaper's and the completer's
    /// passes included, reaches only the records of its own namespace. Default:
    /// [`DEFAULT_NAMESPACE`] (`oncely`). Braces and `%` are escaped (see
    /// [`record_key`](crate::record_key)). URL: `namespace=NAME` (at least one character,
    /// taken as written, no percent-decoding).
    pub namespace: String,
    /// Accept a Redis that keeps nothing across a restart (see
    /// [`Persistence`](crate::Persistence)): the store then connects, and a restart loses the
    /// replay window of every key (a retry across it executes again). Default: `false`, and
    /// [`RedisStore::connect_with`](crate::RedisStore::connect_with) refuses such a Redis with
    /// [`ConnectError::Volatile`](crate::ConnectError::Volatile). URL: `accept_volatile=true`.
    pub accept_volatile: bool,
    /// How many replicas must acknowledge each claim, renewal, recovery point and completion
    /// (`WAIT numreplicas timeout` after the write, on the same connection) before the store
    /// answers; fewer within [`RedisConfig::wait_timeout`] is
    /// [`StoreError::Unavailable`](oncely_core::StoreError::Unavailable) wrapping
    /// [`ReplicasDidNotAcknowledge`](crate::ReplicasDidNotAcknowledge). `None` (the default) means
    /// 1 on a Redis Cluster and 0 (no `WAIT`) on one endpoint; `Some(0)` turns it off. URL:
    /// `wait_replicas=N`. Read [`RedisStore`](crate::RedisStore) ("Failover") for what this does
    /// and does not promise.
    pub wait_replicas: Option<u32>,
    /// The `WAIT` timeout. Default: [`DEFAULT_WAIT_TIMEOUT`] (500 milliseconds). URL:
    /// `wait_timeout_ms=M`.
    pub wait_timeout: Duration,
    /// How often the maintenance passes walk the whole namespace for records that have no
    /// index entry ([`RedisStore::rebuild_index`](crate::RedisStore::rebuild_index)): at most
    /// once per this long across every process sharing the namespace, and on the first pass
    /// ever. Records written before the index existed, or by an older version during a rolling
    /// upgrade, are found by the next walk. `None` never walks by itself (call
    /// `rebuild_index` after an upgrade instead). Default: [`DEFAULT_INDEX_WALK_EVERY`]
    /// (1 hour).
    pub index_walk_every: Option<Duration>,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            accept_volatile: false,
            wait_replicas: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
            index_walk_every: Some(DEFAULT_INDEX_WALK_EVERY),
        }
    }
}

impl RedisConfig {
    /// The defaults: a 2-second operation timeout, namespace `oncely`, a Redis that persists
    /// nothing refused, `WAIT` for 1 replica (500 ms) on a cluster and none on one endpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`RedisConfig::operation_timeout`].
    #[must_use]
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Sets [`RedisConfig::namespace`].
    #[must_use]
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets [`RedisConfig::accept_volatile`].
    #[must_use]
    pub fn with_accept_volatile(mut self, accept: bool) -> Self {
        self.accept_volatile = accept;
        self
    }

    /// Sets [`RedisConfig::wait_replicas`] and [`RedisConfig::wait_timeout`].
    #[must_use]
    pub fn with_wait(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = Some(replicas);
        self.wait_timeout = timeout;
        self
    }

    /// Sets [`RedisConfig::index_walk_every`].
    #[must_use]
    pub fn with_index_walk_every(mut self, every: Option<Duration>) -> Self {
        self.index_walk_every = every;
        self
    }
}
