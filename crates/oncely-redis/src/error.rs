//! The errors of this crate: [`ConnectError`] from connecting, and the errors it puts inside
//! [`StoreError::Unavailable`](oncely_core::StoreError).

use crate::persistence::Persistence;
use oncely_core::StoreError;
use std::time::Duration;

/// A Redis round trip did not finish within the store's operation timeout
/// ([`RedisConfig::operation_timeout`](crate::RedisConfig::operation_timeout)). Returned boxed
/// in [`StoreError::Unavailable`](oncely_core::StoreError::Unavailable), so the layer fails
/// closed with `503`.
///
/// A timed-out write may still have been applied by the server (the answer was lost, not
/// necessarily the command). That is safe: a claim that was applied but not seen holds the key
/// only until its lease lapses, and every later write is checked against the fencing token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("redis did not answer within {} ms", .0.as_millis())]
pub struct OperationTimedOut(pub Duration);

/// Fewer replicas than required acknowledged a write within the `WAIT` timeout
/// ([`RedisConfig::wait_replicas`](crate::RedisConfig::wait_replicas)). Returned boxed in
/// [`StoreError::Unavailable`](oncely_core::StoreError::Unavailable), so the layer answers
/// `503 idempotency_store_unavailable` and the handler does not run (after a claim) or the
/// client retries (after a completion).
///
/// The write **was applied on the primary** and may or may not have reached a replica: after a
/// claim, the record holds the key until its lease lapses (a retry then takes it over); after
/// a completion, a failover may bring back the in-flight record, which a retry takes over from
/// its last acknowledged recovery point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "{acknowledged} of the {required} required replicas acknowledged the write within {} ms (WAIT)",
    .timeout.as_millis()
)]
#[non_exhaustive]
pub struct ReplicasDidNotAcknowledge {
    /// How many replicas had to acknowledge.
    pub required: u32,
    /// How many did (the `WAIT` reply).
    pub acknowledged: i64,
    /// The `WAIT` timeout.
    pub timeout: Duration,
}

/// The store URL is not one this crate reads (see
/// [`RedisStore::connect_with`](crate::RedisStore::connect_with) for the forms).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid Redis store URL: {0}")]
pub struct InvalidUrl(pub String);

/// A Redis node keeps nothing across a restart (or its settings could not be confirmed), and
/// the store was not told that losing the replay window on restart is acceptable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: a restart of such a node forgets every idempotency key it holds, and a retry across the restart executes the request again. \
     Turn on the append-only file on every node (appendonly yes, appendfsync always or everysec), \
     or accept losing the replay window on restart explicitly: accept_volatile=true in the store URL \
     (RedisConfig::accept_volatile in code)",
    describe(.nodes)
)]
#[non_exhaustive]
pub struct VolatileRedis {
    /// Each refused node (`host:port`, empty for a single endpoint) and what it keeps.
    pub nodes: Vec<(String, Persistence)>,
}

fn describe(nodes: &[(String, Persistence)]) -> String {
    nodes
        .iter()
        .map(|(node, p)| {
            if node.is_empty() {
                format!("Redis {p}")
            } else {
                format!("Redis node {node} {p}")
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Why [`RedisStore::connect_with`](crate::RedisStore::connect_with) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL is malformed or names an unknown scheme or option.
    #[error(transparent)]
    InvalidUrl(#[from] InvalidUrl),
    /// Redis could not be reached, or did not answer within the operation timeout.
    #[error(transparent)]
    Unavailable(StoreError),
    /// Redis persists nothing and volatility was not accepted (see [`VolatileRedis`]).
    #[error(transparent)]
    Volatile(#[from] VolatileRedis),
}
