//! Every "now" goes through a [`Clock`], so tests run leases and replay windows on manual or
//! paused time instead of sleeping.

use crate::record::UnixMillis;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in epoch milliseconds.
pub trait Clock: Send + Sync + 'static {
    /// Now, as integer milliseconds since the Unix epoch.
    fn now_millis(&self) -> UnixMillis;
}

/// The system clock (the default).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_millis(&self) -> UnixMillis {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Cloning shares the time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A clock standing at `start` (epoch milliseconds).
    pub fn new(start: UnixMillis) -> Self {
        Self(Arc::new(AtomicI64::new(start)))
    }

    /// A clock standing at the system's current time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_millis())
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_millis(by), Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set(&self, to: UnixMillis) {
        self.0.store(to, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_millis(&self) -> UnixMillis {
        self.0.load(Ordering::SeqCst)
    }
}

/// A clock that follows tokio's clock (so `tokio::time::pause` and `advance` move it), anchored
/// at the system time when it was made.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    anchor_millis: UnixMillis,
    anchor: tokio::time::Instant,
}

#[cfg(feature = "tokio")]
impl TokioClock {
    /// Anchors tokio's clock at the current system time.
    pub fn new() -> Self {
        Self {
            anchor_millis: SystemClock.now_millis(),
            anchor: tokio::time::Instant::now(),
        }
    }
}

#[cfg(feature = "tokio")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "tokio")]
impl Clock for TokioClock {
    fn now_millis(&self) -> UnixMillis {
        self.anchor_millis
            .saturating_add(duration_millis(self.anchor.elapsed()))
    }
}

/// A duration as whole milliseconds, saturating at `i64::MAX`.
pub fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
