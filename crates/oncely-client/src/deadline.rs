//! One overall deadline per logical call.
//!
//! The deadline starts when the logical call starts (the first attempt) and is never reset. Each
//! attempt's timeout is the smaller of its own limit and the time left, and no sleep is started
//! that would end at or past the deadline: the call stops at once instead (case C5), so a call
//! ends within its deadline plus the few milliseconds it takes to notice.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use oncely_client::deadline::Deadline;
//!
//! let start = Instant::now();
//! let deadline = Deadline::starting_at(start, Duration::from_secs(12));
//! let later = start + Duration::from_secs(10);
//! assert_eq!(deadline.remaining(later), Duration::from_secs(2));
//! // A 5-second attempt limit is cut to the 2 seconds that are left.
//! assert_eq!(deadline.attempt_limit(later, Duration::from_secs(5)), Duration::from_secs(2));
//! assert!(!deadline.fits(later, Duration::from_secs(2)));
//! ```

use std::time::{Duration, Instant};

/// The end of a logical call's time budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadline {
    start: Instant,
    total: Duration,
}

impl Deadline {
    /// A deadline `total` after `start`.
    pub const fn starting_at(start: Instant, total: Duration) -> Self {
        Self { start, total }
    }

    /// The whole budget (the configured overall deadline).
    pub const fn total(&self) -> Duration {
        self.total
    }

    /// When the call started.
    pub const fn start(&self) -> Instant {
        self.start
    }

    /// Time spent since the start, as of `now`.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.start)
    }

    /// Time left as of `now` (zero once the deadline has passed).
    pub fn remaining(&self, now: Instant) -> Duration {
        self.total.saturating_sub(self.elapsed(now))
    }

    /// Whether the deadline has passed as of `now`.
    pub fn is_exhausted(&self, now: Instant) -> bool {
        self.remaining(now).is_zero()
    }

    /// The timeout for an attempt starting at `now`: `min(limit, remaining)`.
    pub fn attempt_limit(&self, now: Instant, limit: Duration) -> Duration {
        limit.min(self.remaining(now))
    }

    /// Whether a sleep of `wait` starting at `now` would end strictly before the deadline,
    /// leaving time for another attempt.
    pub fn fits(&self, now: Instant, wait: Duration) -> bool {
        wait < self.remaining(now)
    }
}
