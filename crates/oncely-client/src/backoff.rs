//! Backoff with jitter: how long to sleep before the next attempt.
//!
//! Two strategies are offered, both from Marc Brooker's AWS Architecture Blog post
//! "Exponential Backoff And Jitter" (2015):
//!
//! - **Full jitter** (the default): `sleep = random(0, min(cap, base * 2^attempt))`. In the
//!   post's simulation it does the least total work of every strategy, which is what matters
//!   when many clients contend for one resource.
//! - **Decorrelated jitter**: `sleep = min(cap, random(base, previous_sleep * 3))`. It finishes
//!   slightly sooner than full jitter in the same simulation at the price of a little more work;
//!   pick it for latency-bound callers.
//!
//! No un-jittered option is offered: a fleet of clients that failed together and back off by the
//! same amount fails together again (the simulator in [`crate::simulate`] shows it).
//!
//! # Guarantees
//!
//! For every attempt number (`u32::MAX` included) and every configuration, the delay is within
//! `[0, cap]`: the exponential ceiling is computed with checked 128-bit arithmetic and saturates
//! at `cap`, so a high attempt number never panics and never wraps to a zero delay.
//!
//! ```
//! use std::time::Duration;
//! use oncely_client::backoff::Backoff;
//!
//! let backoff = Backoff::full_jitter(Duration::from_millis(500), Duration::from_secs(8));
//! let mut rng = rand::rng();
//! let mut previous = None;
//! for attempt in [0, 1, 2, 64, u32::MAX] {
//!     let delay = backoff.delay(attempt, previous, &mut rng);
//!     assert!(delay <= Duration::from_secs(8));
//!     previous = Some(delay);
//! }
//! // The ceiling at a high attempt number is the cap, never a wrapped zero.
//! assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(8));
//! ```

use std::time::Duration;

use rand::Rng;

/// Default backoff base delay: 500 milliseconds (the ceiling of the first retry's sleep; see
/// [`crate::policy`] for how it compares with other SDKs' defaults).
pub const DEFAULT_BASE_DELAY: Duration = Duration::from_millis(500);
/// Default backoff cap: 8 seconds (the longest sleep; see [`crate::policy`]).
pub const DEFAULT_MAX_DELAY: Duration = Duration::from_secs(8);

/// Which jitter formula a [`Backoff`] uses.
///
/// Source: AWS Architecture Blog, "Exponential Backoff And Jitter".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Jitter {
    /// `random(0, min(cap, base * 2^attempt))`; the default: least total work under contention.
    Full,
    /// `min(cap, random(base, previous * 3))`; slightly faster completion, slightly more work.
    Decorrelated,
}

/// A jittered exponential backoff: base delay, cap and jitter formula.
///
/// `attempt` in [`Backoff::delay`] and [`Backoff::ceiling`] counts *retries* from 0: the sleep
/// before the first retry uses `attempt = 0`, so its ceiling is `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Backoff {
    jitter: Jitter,
    base: Duration,
    cap: Duration,
}

impl Default for Backoff {
    /// Full jitter, base 500 milliseconds, cap 8 seconds (see [`crate::policy`] for why).
    fn default() -> Self {
        Self::full_jitter(DEFAULT_BASE_DELAY, DEFAULT_MAX_DELAY)
    }
}

impl Backoff {
    /// Full jitter with the given base delay and cap.
    pub const fn full_jitter(base: Duration, cap: Duration) -> Self {
        Self {
            jitter: Jitter::Full,
            base,
            cap,
        }
    }

    /// Decorrelated jitter with the given base delay and cap.
    pub const fn decorrelated_jitter(base: Duration, cap: Duration) -> Self {
        Self {
            jitter: Jitter::Decorrelated,
            base,
            cap,
        }
    }

    /// Returns a copy with another jitter formula.
    pub const fn with_jitter(mut self, jitter: Jitter) -> Self {
        self.jitter = jitter;
        self
    }

    /// Returns a copy with another base delay.
    pub const fn with_base(mut self, base: Duration) -> Self {
        self.base = base;
        self
    }

    /// Returns a copy with another cap (the largest delay ever returned).
    pub const fn with_cap(mut self, cap: Duration) -> Self {
        self.cap = cap;
        self
    }

    /// The jitter formula.
    pub const fn jitter(&self) -> Jitter {
        self.jitter
    }

    /// The base delay.
    pub const fn base(&self) -> Duration {
        self.base
    }

    /// The cap: no delay is ever longer.
    pub const fn cap(&self) -> Duration {
        self.cap
    }

    /// The un-jittered exponential ceiling `min(cap, base * 2^attempt)`.
    ///
    /// Computed in 128-bit nanoseconds with checked arithmetic: an overflow means "larger than
    /// any cap", so the result saturates at `cap` for every high `attempt` (`u32::MAX` included).
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let cap = self.cap.as_nanos();
        let base = self.base.as_nanos();
        let scaled = if attempt >= 127 {
            None
        } else {
            base.checked_mul(1u128 << attempt)
        };
        let nanos = scaled.map_or(cap, |v| v.min(cap));
        nanos_to_duration(nanos)
    }

    /// The jittered delay before retry number `attempt` (counted from 0).
    ///
    /// `previous` is the delay chosen before the previous retry of the same logical call, if any;
    /// only decorrelated jitter uses it (it starts from `base`).
    ///
    /// The result is always within `[0, cap]`.
    pub fn delay<R: Rng + ?Sized>(
        &self,
        attempt: u32,
        previous: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        match self.jitter {
            Jitter::Full => uniform(Duration::ZERO, self.ceiling(attempt), rng),
            Jitter::Decorrelated => {
                let cap = self.cap;
                let low = self.base.min(cap);
                let previous = previous.unwrap_or(self.base);
                let high = previous.saturating_mul(3).min(cap).max(low);
                uniform(low, high, rng).min(cap)
            }
        }
    }
}

/// A uniformly random duration in `[low, high]` (nanosecond resolution); `low` if `high < low`.
pub(crate) fn uniform<R: Rng + ?Sized>(low: Duration, high: Duration, rng: &mut R) -> Duration {
    if high <= low {
        return low;
    }
    let nanos = rng.random_range(low.as_nanos()..=high.as_nanos());
    nanos_to_duration(nanos)
}

/// Converts 128-bit nanoseconds back to a `Duration`, saturating at `Duration::MAX`.
pub(crate) fn nanos_to_duration(nanos: u128) -> Duration {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let secs = nanos / NANOS_PER_SEC;
    let sub = (nanos % NANOS_PER_SEC) as u32;
    match u64::try_from(secs) {
        Ok(secs) => Duration::new(secs, sub),
        Err(_) => Duration::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn ceiling_doubles_then_saturates_at_cap() {
        let b = Backoff::full_jitter(Duration::from_millis(5), Duration::from_secs(2));
        assert_eq!(b.ceiling(0), Duration::from_millis(5));
        assert_eq!(b.ceiling(1), Duration::from_millis(10));
        assert_eq!(b.ceiling(8), Duration::from_millis(1280));
        assert_eq!(b.ceiling(9), Duration::from_secs(2));
        for attempt in [31, 32, 63, 64, 65, 126, 127, 128, 1000, u32::MAX] {
            assert_eq!(
                b.ceiling(attempt),
                Duration::from_secs(2),
                "attempt {attempt}"
            );
        }
    }

    /// Case C6: a 10 ms cap at attempt 64 panicked elsewhere; attempt 32 wrapped to zero.
    #[test]
    fn c6_high_attempts_never_panic_nor_wrap_to_zero() {
        let b = Backoff::full_jitter(Duration::from_millis(1), Duration::from_millis(10));
        let mut rng = StdRng::seed_from_u64(6);
        for attempt in [32, 33, 63, 64, 65, u32::MAX - 1, u32::MAX] {
            assert_eq!(b.ceiling(attempt), Duration::from_millis(10));
            // Over many draws at a high attempt the delays spread across [0, cap], they are not
            // stuck at zero.
            let draws: Vec<_> = (0..200).map(|_| b.delay(attempt, None, &mut rng)).collect();
            assert!(draws.iter().all(|d| *d <= Duration::from_millis(10)));
            assert!(draws.iter().any(|d| *d > Duration::from_millis(5)));
        }
        let max = Backoff::full_jitter(Duration::MAX, Duration::MAX);
        assert_eq!(max.ceiling(u32::MAX), Duration::MAX);
        let _ = max.delay(u32::MAX, None, &mut rng);
        let d = Backoff::decorrelated_jitter(Duration::MAX, Duration::MAX);
        let _ = d.delay(u32::MAX, Some(Duration::MAX), &mut rng);
    }

    #[test]
    fn decorrelated_stays_between_base_and_cap() {
        let b = Backoff::decorrelated_jitter(Duration::from_millis(5), Duration::from_millis(100));
        let mut rng = StdRng::seed_from_u64(1);
        let mut prev = None;
        for attempt in 0..1000 {
            let d = b.delay(attempt, prev, &mut rng);
            assert!(d >= Duration::from_millis(5) && d <= Duration::from_millis(100));
            prev = Some(d);
        }
    }

    fn any_duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            (0u64..10_000_000_000).prop_map(Duration::from_nanos),
            (0u64..=u64::MAX, 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
            Just(Duration::ZERO),
            Just(Duration::MAX),
        ]
    }

    proptest! {
        /// For all attempt numbers and configurations, 0 <= delay <= cap.
        #[test]
        fn delay_is_always_within_zero_and_cap(
            base in any_duration(),
            cap in any_duration(),
            attempt in prop_oneof![0u32..200, any::<u32>(), Just(u32::MAX)],
            previous in proptest::option::of(any_duration()),
            decorrelated in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let b = if decorrelated {
                Backoff::decorrelated_jitter(base, cap)
            } else {
                Backoff::full_jitter(base, cap)
            };
            let mut rng = StdRng::seed_from_u64(seed);
            let d = b.delay(attempt, previous, &mut rng);
            prop_assert!(d <= cap);
            prop_assert!(b.ceiling(attempt) <= cap);
            if !decorrelated && base > Duration::ZERO && attempt >= 127 {
                // Never a wrapped zero ceiling at high attempts.
                prop_assert_eq!(b.ceiling(attempt), cap);
            }
        }
    }
}
