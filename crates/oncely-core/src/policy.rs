//! The idempotency policy: windows, lease, in-flight behaviour, what is stored, size limits.

use crate::problem::StatusProfile;
use std::time::Duration;

/// How a request that finds its key in flight (lease alive, same fingerprint) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum InFlightBehavior {
    /// Answer `409 idempotency_request_in_flight` with `Retry-After` at once (the default).
    #[default]
    Reject,
    /// Wait up to `max` for the first request to complete and replay its response; answer the
    /// `409` if it has not completed by then. The second request never runs the handler.
    Wait {
        /// The longest wait.
        max: Duration,
        /// How often the store is polled.
        poll: Duration,
    },
}

/// Which completed responses are stored and replayed, and which release the key.
///
/// The default follows Stripe: a response is stored whenever the handler may have caused side
/// effects: 2xx, 3xx, 4xx other than 408/409/425/429, and 5xx from non-transactional handlers
/// (replayed verbatim, as Stripe's API v1 does). 408, 409, 425 and 429 say "nothing was done,
/// try again", so they release the key. A transactional handler whose transaction rolled back
/// left no effect, so its 5xx releases the key and a retry re-executes (as Stripe's v2 allows);
/// a handler can also mark any response as "nothing executed".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StorePolicy {
    /// The default described above.
    #[default]
    SideEffects,
}

impl StorePolicy {
    /// Whether a response with `status` is stored for replay (`true`) or the key is released
    /// (`false`). `rolled_back` is `true` when the handler reported that its transaction rolled
    /// back (or that nothing executed).
    pub fn stores(self, status: u16, rolled_back: bool) -> bool {
        if rolled_back {
            return false;
        }
        !matches!(status, 408 | 409 | 425 | 429)
    }
}

/// The whole policy. Defaults: replay window 24 h, retention 72 h, lease 30 s, heartbeat every
/// 10 s, reject in-flight duplicates, `Retry-After: 1` second, `ietf` statuses, request bodies
/// up to 1 MiB buffered, responses up to 1 MiB stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a completed key replays its stored response (default 24 hours). After it, a
    /// reused key is a brand-new request, never an error.
    pub replay_window: Duration,
    /// How long records are kept before the reaper deletes them (default 72 hours; must be at
    /// least the replay window).
    pub retention: Duration,
    /// The lease of every claim (default 30 seconds), independent of any request deadline.
    pub lease: Duration,
    /// How often a running handler's lease is renewed (default 10 seconds; must be shorter than
    /// the lease).
    pub heartbeat: Duration,
    /// What an in-flight duplicate gets.
    pub in_flight: InFlightBehavior,
    /// The `Retry-After` value, in whole seconds, on `409 idempotency_request_in_flight` and `503`
    /// (default 1 second).
    pub retry_after_secs: u64,
    /// Which statuses the codes map to.
    pub profile: StatusProfile,
    /// Which responses are stored.
    pub store_policy: StorePolicy,
    /// The largest request body buffered for fingerprinting, in bytes (default 1 MiB); a larger
    /// one gets `413 idempotency_request_too_large` and nothing runs.
    pub max_request_bytes: usize,
    /// The largest response body stored for replay, in bytes (default 1 MiB). A larger one is
    /// delivered to the first caller whole, and the record is completed as "not retained".
    pub max_response_bytes: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            replay_window: Duration::from_secs(24 * 3600),
            retention: Duration::from_secs(72 * 3600),
            lease: Duration::from_secs(30),
            heartbeat: Duration::from_secs(10),
            in_flight: InFlightBehavior::Reject,
            retry_after_secs: 1,
            profile: StatusProfile::Ietf,
            store_policy: StorePolicy::SideEffects,
            max_request_bytes: 1 << 20,
            max_response_bytes: 1 << 20,
        }
    }
}

/// A policy whose parts contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Retention shorter than the replay window would delete records that should still replay.
    #[error("retention ({retention:?}) must be at least the replay window ({window:?})")]
    RetentionShorterThanWindow {
        /// The retention.
        retention: Duration,
        /// The replay window.
        window: Duration,
    },
    /// A zero lease would make every claim immediately abandoned.
    #[error("the lease must be at least 1 millisecond")]
    ZeroLease,
    /// A replay window under 1 second replays (almost) nothing: every retry would run again.
    #[error("the replay window ({0:?}) must be at least 1 second")]
    ReplayWindowTooShort(Duration),
    /// A wait longer than 60 seconds outlasts any sane client timeout: the duplicate's client
    /// gives up before the answer comes.
    #[error("the in-flight wait ({0:?}) must be at most 60 seconds (use the default 409 instead)")]
    WaitTooLong(Duration),
    /// A heartbeat not shorter than the lease lets a live owner lose its claim.
    #[error("the heartbeat ({heartbeat:?}) must be shorter than the lease ({lease:?})")]
    HeartbeatNotShorterThanLease {
        /// The heartbeat.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },
}

impl Policy {
    /// Checks the invariants.
    ///
    /// # Errors
    ///
    /// [`PolicyError`] naming the first broken invariant.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.retention < self.replay_window {
            return Err(PolicyError::RetentionShorterThanWindow {
                retention: self.retention,
                window: self.replay_window,
            });
        }
        if self.lease < Duration::from_millis(1) {
            return Err(PolicyError::ZeroLease);
        }
        if self.replay_window < Duration::from_secs(1) {
            return Err(PolicyError::ReplayWindowTooShort(self.replay_window));
        }
        if let InFlightBehavior::Wait { max, .. } = self.in_flight
            && max > Duration::from_secs(60)
        {
            return Err(PolicyError::WaitTooLong(max));
        }
        if self.heartbeat >= self.lease || self.heartbeat.is_zero() {
            return Err(PolicyError::HeartbeatNotShorterThanLease {
                heartbeat: self.heartbeat,
                lease: self.lease,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let p = Policy::default();
        p.validate().unwrap();
        assert_eq!(p.replay_window, Duration::from_secs(86_400));
        assert_eq!(p.retention, Duration::from_secs(259_200));
        assert_eq!(p.lease, Duration::from_secs(30));
    }

    #[test]
    fn invariants_are_enforced() {
        let p = Policy {
            retention: Duration::from_secs(10),
            ..Policy::default()
        };
        assert!(matches!(
            p.validate(),
            Err(PolicyError::RetentionShorterThanWindow { .. })
        ));
        let p = Policy {
            lease: Duration::ZERO,
            ..Policy::default()
        };
        assert_eq!(p.validate(), Err(PolicyError::ZeroLease));
        let p = Policy {
            replay_window: Duration::ZERO,
            retention: Duration::ZERO,
            ..Policy::default()
        };
        assert!(matches!(
            p.validate(),
            Err(PolicyError::ReplayWindowTooShort(_))
        ));
        let p = Policy {
            in_flight: InFlightBehavior::Wait {
                max: Duration::from_secs(61),
                poll: Duration::from_millis(50),
            },
            ..Policy::default()
        };
        assert!(matches!(p.validate(), Err(PolicyError::WaitTooLong(_))));
        let p = Policy {
            heartbeat: Duration::from_secs(30),
            ..Policy::default()
        };
        assert!(p.validate().is_err());
    }

    #[test]
    fn store_policy_matches_the_design() {
        let s = StorePolicy::SideEffects;
        for stored in [200, 201, 302, 400, 402, 404, 422, 500, 502] {
            assert!(s.stores(stored, false), "{stored} must be stored");
        }
        for released in [408, 409, 425, 429] {
            assert!(!s.stores(released, false), "{released} must release");
        }
        assert!(!s.stores(500, true));
        assert!(!s.stores(201, true));
    }
}
