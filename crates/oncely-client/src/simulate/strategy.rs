//! Backoff strategies compared by the simulations.

use std::fmt;
use std::time::Duration;

use rand::Rng;

use crate::backoff::{Backoff, uniform};

/// A backoff strategy, named as in the AWS Architecture Blog post.
///
/// Only [`Strategy::FullJitter`] and [`Strategy::Decorrelated`] exist in the retry policy; the
/// others are here to show why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Strategy {
    /// Retry at once.
    NoBackoff,
    /// `min(cap, base * 2^n)`, no jitter.
    Exponential,
    /// `v / 2 + random(0, v / 2)` with `v = min(cap, base * 2^n)`.
    EqualJitter,
    /// `random(0, min(cap, base * 2^n))`.
    FullJitter,
    /// `min(cap, random(base, previous * 3))`.
    Decorrelated,
}

impl Strategy {
    /// Every strategy, in the order above.
    pub const ALL: [Strategy; 5] = [
        Strategy::NoBackoff,
        Strategy::Exponential,
        Strategy::EqualJitter,
        Strategy::FullJitter,
        Strategy::Decorrelated,
    ];

    /// A short stable name (`none`, `exponential`, `equal`, `full`, `decorrelated`).
    pub const fn name(&self) -> &'static str {
        match self {
            Strategy::NoBackoff => "none",
            Strategy::Exponential => "exponential",
            Strategy::EqualJitter => "equal",
            Strategy::FullJitter => "full",
            Strategy::Decorrelated => "decorrelated",
        }
    }

    /// The sleep before retry `retry` (from 0), given the previous sleep of the same client.
    pub(crate) fn delay<R: Rng + ?Sized>(
        &self,
        base: Duration,
        cap: Duration,
        retry: u32,
        previous: Option<Duration>,
        rng: &mut R,
    ) -> Duration {
        let full = Backoff::full_jitter(base, cap);
        match self {
            Strategy::NoBackoff => Duration::ZERO,
            Strategy::Exponential => full.ceiling(retry),
            Strategy::EqualJitter => {
                let v = full.ceiling(retry);
                v / 2 + uniform(Duration::ZERO, v / 2, rng)
            }
            Strategy::FullJitter => full.delay(retry, previous, rng),
            Strategy::Decorrelated => {
                Backoff::decorrelated_jitter(base, cap).delay(retry, previous, rng)
            }
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
