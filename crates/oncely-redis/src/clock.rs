//! Whose clock decides leases, replay windows and retention.

use oncely_core::Clock;
use std::sync::Arc;

/// Where the store's scripts get "now" from.
///
/// # The clock rule
///
/// With [`ClockSource::Server`] (the default) every lease, replay window and retention is
/// measured on **the Redis server's clock**: each script reads `TIME` on the server, inside the
/// same atomic step that decides. Application instances whose clocks are skewed therefore
/// cannot shorten a lease (and take over a live request early) or lengthen one (and keep a dead
/// request blocking retries): every instance is judged by the same clock, and the record's
/// Redis TTL runs on that same clock. The times a store call returns
/// ([`Claim::lease_expires_at`](oncely_core::Claim::lease_expires_at) and the record
/// timestamps) are then server times in epoch milliseconds.
///
/// Requirements: a script that reads `TIME` and then writes needs effects replication, which is
/// the default from Redis 5 and the only mode from Redis 7; this crate is tested on Redis 7.
///
/// [`ClockSource::Application`] passes the application's "now" into every script instead. It
/// exists for tests (the conformance suite drives a [`ManualClock`](oncely_core::ManualClock))
/// and for deployments that must share one clock with another store; with it, the rule above
/// no longer holds and skewed clocks skew leases.
#[derive(Clone, Default)]
#[non_exhaustive]
pub enum ClockSource {
    /// The Redis server's `TIME` (the default).
    #[default]
    Server,
    /// The given application clock, read by the caller and passed to every script.
    Application(Arc<dyn Clock>),
}

impl std::fmt::Debug for ClockSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Server => f.write_str("Server"),
            Self::Application(c) => write!(f, "Application(now = {} ms)", c.now_millis()),
        }
    }
}
