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
    /// Answer `202 Accepted` at once, with `Location` set to a status URL where the client
    /// polls the key's state, and `Retry-After` (the asynchronous-request pattern of RFC 9110
    /// section 15.3.3). The second request never runs the handler, and a generated SDK that
    /// treats every 2xx as an answer stops retrying (so it does not give up and retry with a new
    /// key, which would run the operation twice). The response is not stored.
    Accepted {
        /// The status URL template: `{key}` is replaced by the percent-encoded key, e.g.
        /// `/v1/idempotency-keys/{key}` (what `oncely serve` uses).
        status_url: &'static str,
    },
}

impl InFlightBehavior {
    /// The status URL of `key` under the `Accepted` mode's template (`None` in other modes).
    /// Every byte of the key outside the RFC 3986 unreserved set is percent-encoded, so the
    /// key is one path segment whatever it contains.
    pub fn status_url(&self, key: &str) -> Option<String> {
        let Self::Accepted { status_url } = self else {
            return None;
        };
        let mut encoded = String::with_capacity(key.len());
        for b in key.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                encoded.push(char::from(b));
            } else {
                encoded.push_str(&format!("%{b:02X}"));
            }
        }
        Some(status_url.replace("{key}", &encoded))
    }
}

/// The `Retry-After` for a duplicate that found its key in flight, in whole seconds, from the
/// lease and the first request's progress rather than a constant.
///
/// - `elapsed_ms`: how long the first request has been running (now minus its claim); a
///   request that has run for `t` is expected to need about as long again, so the answer
///   starts from `t`, halved when the request already committed a phase (`has_recovery_point`:
///   it is part-way through);
/// - `lease_remaining_ms`: when the lease lapses unless renewed; a retry later than that could
///   take over a dead request, so the answer never exceeds it (rounded down to whole seconds:
///   1.5 seconds of lease left answer 1, not 2);
/// - the result is at least `floor_secs` (the policy's `retry_after_secs`, at least 1 second,
///   the least a `Retry-After` in whole seconds can say: a lease under 2 seconds gets 1, the
///   one case where the answer may pass the lease) and at most
///   [`MAX_IN_FLIGHT_RETRY_AFTER_SECS`].
pub fn in_flight_retry_after_secs(
    elapsed_ms: i64,
    lease_remaining_ms: i64,
    has_recovery_point: bool,
    floor_secs: u64,
) -> u64 {
    let floor = floor_secs.max(1);
    let expected_ms = if has_recovery_point {
        elapsed_ms / 2
    } else {
        elapsed_ms
    }
    .max(0);
    let expected = (expected_ms as u64).div_ceil(1000);
    let lease = lease_remaining_ms.max(0) as u64 / 1000;
    expected
        .min(lease)
        .clamp(floor, MAX_IN_FLIGHT_RETRY_AFTER_SECS.max(floor))
}

/// The longest `Retry-After` given to an in-flight duplicate: 30 seconds (the default lease;
/// a client retrying later than its own deadline would give up instead).
pub const MAX_IN_FLIGHT_RETRY_AFTER_SECS: u64 = 30;

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

    /// Whether a response that a transactional handler is about to commit with its writes
    /// (`oncely_sqlx::Tx::commit`) is committed and stored (`true`), or its phase rolls back
    /// instead and the key is released (or the request suspended at its recovery point), so
    /// that a retry runs again (`false`). What a handler commits is judged like what it
    /// returns: 408, 409, 425 and 429 say "nothing was done, try again", and a 5xx from a
    /// transactional handler says its work did not complete, so neither is kept; replaying it
    /// for the whole replay window would tell every retry to come back in vain.
    pub fn keeps_commit(self, status: u16) -> bool {
        self.stores(status, false) && status < 500
    }
}

/// The whole policy. Defaults: replay window 24 h, retention 72 h, lease 30 s, heartbeat every
/// 10 s, reject in-flight duplicates, `Retry-After` at least 1 second, `ietf` statuses, request bodies
/// up to 1 MiB buffered, responses up to 1 MiB stored.
///
/// Build it from [`Policy::new`] (or [`Policy::default`]) with the `const fn with_*` methods;
/// the struct is `#[non_exhaustive]` (it may gain fields), so other crates cannot write it as a
/// literal. [`Policy::validate`] checks the whole.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
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
    /// The `Retry-After` value, in whole seconds, on `503` (default 1 second), and the least
    /// one on `409 idempotency_request_in_flight` / `202` (sized there by
    /// [`in_flight_retry_after_secs`]).
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
        Self::new()
    }
}

impl Policy {
    /// The defaults (the same as [`Policy::default`], usable in `const` items): replay window
    /// 24 hours, retention 72 hours, lease 30 seconds, heartbeat every 10 seconds, in-flight
    /// duplicates rejected (`409`), `Retry-After` at least 1 second, `ietf` statuses, the
    /// side-effects store policy, request and response bodies up to 1 MiB.
    ///
    /// Change parts with the `const fn with_*` methods, then check the whole with
    /// [`Policy::validate`] (the layer does when it is given the policy):
    ///
    /// ```
    /// use oncely_core::{Policy, StatusProfile};
    /// use std::time::Duration;
    ///
    /// const POLICY: Policy = Policy::new()
    ///     .with_replay_window(Duration::from_secs(3600))
    ///     .with_retention(Duration::from_secs(7200))
    ///     .with_profile(StatusProfile::Stripe);
    /// POLICY.validate().unwrap();
    /// assert!(Policy::new().with_retention(Duration::from_secs(1)).validate().is_err());
    /// ```
    pub const fn new() -> Self {
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

    /// How long a completed key replays its stored response (default 24 hours; at least 1
    /// second, and at most the retention, or [`Policy::validate`] fails).
    pub const fn with_replay_window(mut self, window: Duration) -> Self {
        self.replay_window = window;
        self
    }

    /// How long records are kept before the reaper deletes them (default 72 hours; at least the
    /// replay window, or [`Policy::validate`] fails).
    pub const fn with_retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The lease of every claim (default 30 seconds; at least 1 millisecond and longer than
    /// the heartbeat, or [`Policy::validate`] fails).
    pub const fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How often a running handler's lease is renewed (default 10 seconds; non-zero and
    /// shorter than the lease, or [`Policy::validate`] fails).
    pub const fn with_heartbeat(mut self, heartbeat: Duration) -> Self {
        self.heartbeat = heartbeat;
        self
    }

    /// What an in-flight duplicate gets (default [`InFlightBehavior::Reject`]; a
    /// [`InFlightBehavior::Wait`] of more than 60 seconds fails [`Policy::validate`]).
    pub const fn with_in_flight(mut self, in_flight: InFlightBehavior) -> Self {
        self.in_flight = in_flight;
        self
    }

    /// The `Retry-After` on `503`, and the least one on an in-flight `409`/`202`, in whole
    /// seconds (default 1).
    pub const fn with_retry_after_secs(mut self, secs: u64) -> Self {
        self.retry_after_secs = secs;
        self
    }

    /// Which statuses the codes map to (default [`StatusProfile::Ietf`]).
    pub const fn with_profile(mut self, profile: StatusProfile) -> Self {
        self.profile = profile;
        self
    }

    /// Which responses are stored (default [`StorePolicy::SideEffects`]).
    pub const fn with_store_policy(mut self, store_policy: StorePolicy) -> Self {
        self.store_policy = store_policy;
        self
    }

    /// The largest request body buffered for fingerprinting, in bytes (default 1 MiB).
    pub const fn with_max_request_bytes(mut self, bytes: usize) -> Self {
        self.max_request_bytes = bytes;
        self
    }

    /// The largest response body stored for replay, in bytes (default 1 MiB).
    pub const fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes;
        self
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
    #[error(
        "the heartbeat ({heartbeat:?}) must be shorter than the lease ({lease:?}): with a shorter lease, set `with_heartbeat` too (a third of the lease is usual)"
    )]
    HeartbeatNotShorterThanLease {
        /// The heartbeat.
        heartbeat: Duration,
        /// The lease.
        lease: Duration,
    },
    /// A zero heartbeat would renew the lease in a busy loop.
    #[error("the heartbeat must be at least 1 millisecond")]
    ZeroHeartbeat,
    /// In wait mode, a poll interval under 1 millisecond polls the store in a busy loop.
    #[error("the in-flight wait's poll interval ({0:?}) must be at least 1 millisecond")]
    WaitPollTooShort(Duration),
    /// `Retry-After: 0` tells every client to retry at once, in a tight loop (RFC 9110
    /// section 10.2.3 gives seconds; the layer's floor is 1).
    #[error("retry_after_secs must be at least 1 second")]
    ZeroRetryAfter,
    /// A zero body limit refuses every request body (`413`) or keeps no response for replay.
    #[error("max_{0}_bytes must be at least 1 byte")]
    ZeroBodyLimit(&'static str),
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
        if let InFlightBehavior::Wait { poll, .. } = self.in_flight
            && poll < Duration::from_millis(1)
        {
            return Err(PolicyError::WaitPollTooShort(poll));
        }
        if self.heartbeat.is_zero() {
            return Err(PolicyError::ZeroHeartbeat);
        }
        if self.retry_after_secs == 0 {
            return Err(PolicyError::ZeroRetryAfter);
        }
        if self.max_request_bytes == 0 {
            return Err(PolicyError::ZeroBodyLimit("request"));
        }
        if self.max_response_bytes == 0 {
            return Err(PolicyError::ZeroBodyLimit("response"));
        }
        if self.heartbeat >= self.lease {
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
    fn zero_intervals_and_limits_are_refused() {
        assert_eq!(
            Policy::new().with_heartbeat(Duration::ZERO).validate(),
            Err(PolicyError::ZeroHeartbeat)
        );
        assert_eq!(
            Policy::new().with_retry_after_secs(0).validate(),
            Err(PolicyError::ZeroRetryAfter)
        );
        assert_eq!(
            Policy::new().with_max_request_bytes(0).validate(),
            Err(PolicyError::ZeroBodyLimit("request"))
        );
        assert_eq!(
            Policy::new().with_max_response_bytes(0).validate(),
            Err(PolicyError::ZeroBodyLimit("response"))
        );
        let busy = InFlightBehavior::Wait {
            max: Duration::from_secs(1),
            poll: Duration::ZERO,
        };
        assert_eq!(
            Policy::new().with_in_flight(busy).validate(),
            Err(PolicyError::WaitPollTooShort(Duration::ZERO))
        );
        // A short lease needs a shorter heartbeat, and the error says so.
        let e = Policy::new()
            .with_lease(Duration::from_secs(2))
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("with_heartbeat"), "{e}");
        Policy::new()
            .with_lease(Duration::from_secs(2))
            .with_heartbeat(Duration::from_millis(600))
            .validate()
            .unwrap();
    }

    #[test]
    fn the_builder_sets_each_part_and_keeps_the_rest() {
        assert_eq!(Policy::new(), Policy::default());
        let p = Policy::new()
            .with_replay_window(Duration::from_secs(60))
            .with_retention(Duration::from_secs(120))
            .with_lease(Duration::from_secs(5))
            .with_heartbeat(Duration::from_secs(2))
            .with_retry_after_secs(3)
            .with_profile(StatusProfile::Stripe)
            .with_max_request_bytes(10)
            .with_max_response_bytes(20);
        p.validate().unwrap();
        assert_eq!(
            (p.replay_window, p.retention, p.lease, p.heartbeat),
            (
                Duration::from_secs(60),
                Duration::from_secs(120),
                Duration::from_secs(5),
                Duration::from_secs(2)
            )
        );
        assert_eq!((p.retry_after_secs, p.profile), (3, StatusProfile::Stripe));
        assert_eq!((p.max_request_bytes, p.max_response_bytes), (10, 20));
        assert_eq!(p.in_flight, InFlightBehavior::Reject);
        // The builder does not validate; validate() still does.
        assert_eq!(
            Policy::new().with_lease(Duration::ZERO).validate(),
            Err(PolicyError::ZeroLease)
        );
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
    fn in_flight_retry_after_follows_progress_and_stays_inside_the_lease() {
        // A fresh request: the floor.
        assert_eq!(in_flight_retry_after_secs(50, 30_000, false, 1), 1);
        // Running 8 s: about as long again, rounded up.
        assert_eq!(in_flight_retry_after_secs(8_000, 29_000, false, 1), 8);
        // Part-way (a phase committed): half of it.
        assert_eq!(in_flight_retry_after_secs(8_000, 29_000, true, 1), 4);
        // Never past the lease (a dead owner can be taken over then): rounded down.
        assert_eq!(in_flight_retry_after_secs(20_000, 2_500, false, 1), 2);
        // A 1.5 s lease: 1 s, not 2 (past the lease).
        assert_eq!(in_flight_retry_after_secs(3_000, 1_500, false, 1), 1);
        // Under a second of lease left: 1, the least whole seconds can say.
        assert_eq!(in_flight_retry_after_secs(3_000, 400, false, 1), 1);
        // Bounded above, and never below the floor nor 1 second.
        assert_eq!(in_flight_retry_after_secs(600_000, 600_000, false, 1), 30);
        assert_eq!(in_flight_retry_after_secs(0, 0, false, 0), 1);
        assert_eq!(in_flight_retry_after_secs(0, 0, false, 5), 5);
    }

    #[test]
    fn accepted_mode_builds_a_percent_encoded_status_url() {
        let m = InFlightBehavior::Accepted {
            status_url: "/v1/idempotency-keys/{key}",
        };
        assert_eq!(
            m.status_url("a b/c?%").as_deref(),
            Some("/v1/idempotency-keys/a%20b%2Fc%3F%25")
        );
        assert_eq!(
            m.status_url("k-1_x.y~").as_deref(),
            Some("/v1/idempotency-keys/k-1_x.y~")
        );
        assert_eq!(InFlightBehavior::Reject.status_url("k"), None);
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
