//! The errors this crate puts inside [`StoreError::Unavailable`](oncely_core::StoreError).

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
