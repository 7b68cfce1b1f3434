//! The simulated network: a delay drawn from |Normal(mean, sd)|.

use std::time::Duration;

use rand::Rng;

/// Network delay model, as in the AWS Architecture Blog simulator: the absolute value of a
/// normal variate (the post notes real networks are closer to Weibull; close enough to compare
/// strategies).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Net {
    pub(crate) mean: Duration,
    pub(crate) sd: Duration,
}

impl Net {
    /// One delay, in nanoseconds.
    pub(crate) fn delay<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        // Box-Muller: u1 in (0, 1], u2 in [0, 1).
        let u1: f64 = 1.0 - rng.random::<f64>();
        let u2: f64 = rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let ns = self.mean.as_nanos() as f64 + self.sd.as_nanos() as f64 * z;
        ns.abs().min(u64::MAX as f64) as u64
    }
}
