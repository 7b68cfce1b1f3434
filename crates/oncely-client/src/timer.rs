//! The timer plug point: every "now" and every sleep of the retry loop goes through a [`Timer`].
//!
//! A timer is not a record clock: `oncely_core::Clock` tells the server's records the time in
//! epoch milliseconds; a [`Timer`] gives the retry loop monotonic time for its deadline, sleeps
//! its backoff, and reads the wall clock only to turn a `Retry-After` HTTP-date into a wait.
//!
//! The default, [`TokioTimer`], follows tokio's time, so tests may pause it. Tests that talk to
//! a real server can plug a virtual timer whose `sleep` only advances its own notion of time, to
//! check a 120-second `Retry-After` without waiting 120 seconds.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant, SystemTime};

/// A boxed sleep future.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Monotonic time, wall-clock time and sleeping, for the retry loop.
pub trait Timer: Send + Sync + fmt::Debug + 'static {
    /// Monotonic now, used for the deadline.
    fn now(&self) -> Instant;
    /// Wall-clock now, used to turn a `Retry-After` HTTP-date into a wait.
    fn system_now(&self) -> SystemTime;
    /// Sleeps for `duration`.
    fn sleep(&self, duration: Duration) -> Sleep;
}

/// The default timer: tokio's (pausable) monotonic time and sleep, and the system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct TokioTimer;

impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn system_now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}
