//! What a claim asks for and what it answers: [`ClaimRequest`], [`ClaimOutcome`] and, when the
//! request now owns the key, its [`Claim`] and [`ClaimKind`]. The rule between the two is
//! [`decide`](super::decide()) (`decide.rs`); the store operation is `KeyStore::claim`.

use crate::fingerprint::Fingerprint;
use crate::key::RecordKey;
use crate::record::{FencingToken, StoredRequest, StoredResponse, UnixMillis};
use std::time::Duration;

#[cfg(doc)]
use crate::record::Redrives;

/// What a claim asks for. Build it with [`ClaimRequest::new`] (the struct is
/// `#[non_exhaustive]`: it may gain fields).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClaimRequest {
    /// `(scope, key)`.
    pub id: RecordKey,
    /// The fingerprint of the request being claimed.
    pub fingerprint: Fingerprint,
    /// The lease to set (always set: a zero lease is raised to 1 millisecond).
    pub lease: Duration,
    /// The replay window: a record completed longer ago than this is claimed anew.
    pub replay_window: Duration,
    /// How long to keep the record (from now, and again from completion).
    pub retention: Duration,
    /// The request, kept for the completer while the record is in flight (completing or
    /// releasing the record drops it); `None` to keep nothing.
    pub request: Option<StoredRequest>,
}

impl ClaimRequest {
    /// A claim of `id` by the request with `fingerprint`: hold it for `lease` (a zero lease is
    /// raised to 1 millisecond), replay a completion for `replay_window`, keep the record for
    /// `retention` (from now, and again from completion). It keeps no request for the completer;
    /// set one with [`ClaimRequest::with_request`]. The three durations usually come from the
    /// [`Policy`](crate::Policy): 30 seconds, 24 hours and 72 hours by default.
    pub fn new(
        id: RecordKey,
        fingerprint: Fingerprint,
        lease: Duration,
        replay_window: Duration,
        retention: Duration,
    ) -> Self {
        Self {
            id,
            fingerprint,
            lease,
            replay_window,
            retention,
            request: None,
        }
    }

    /// Sets the request kept for the completer while the record is in flight (default `None`).
    pub fn with_request(mut self, request: Option<StoredRequest>) -> Self {
        self.request = request;
        self
    }
}

/// A successful claim: the caller now owns `(scope, key)` and must execute (or resume).
/// Stores build it with [`Claim::new`] (the struct is `#[non_exhaustive]`: it may gain fields).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Claim {
    /// The token to carry on every later write.
    pub token: FencingToken,
    /// When the lease lapses unless renewed (epoch milliseconds).
    pub lease_expires_at: UnixMillis,
    /// Where a taken-over request should resume; `None` for a first attempt.
    pub recovery_point: Option<String>,
    /// Why the claim was granted.
    pub kind: ClaimKind,
}

impl Claim {
    /// A claim holding `token` until `lease_expires_at` (epoch milliseconds), granted for
    /// `kind`, with no recovery point (set one with [`Claim::with_recovery_point`]).
    pub fn new(token: FencingToken, lease_expires_at: UnixMillis, kind: ClaimKind) -> Self {
        Self {
            token,
            lease_expires_at,
            recovery_point: None,
            kind,
        }
    }

    /// Sets where a taken-over request resumes (default `None`).
    pub fn with_recovery_point(mut self, recovery_point: Option<String>) -> Self {
        self.recovery_point = recovery_point;
        self
    }
}

/// Why a claim was granted.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimKind {
    /// No record (or a released one): a first attempt.
    New,
    /// The previous owner's lease lapsed: resume from the recovery point.
    Takeover,
    /// The previous completion is past the replay window: a brand-new request.
    AfterReplayWindow,
}

/// The answer to a claim.
///
/// `#[non_exhaustive]`: a match outside this crate needs a wildcard arm, which must fail
/// closed (never run the request on an outcome it does not know).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ClaimOutcome {
    /// The caller owns the key.
    Claimed(Claim),
    /// Another request holds a live lease with the same fingerprint.
    InFlight {
        /// When that lease lapses unless renewed (epoch milliseconds).
        lease_expires_at: UnixMillis,
    },
    /// Completed inside the replay window with the same fingerprint: replay, never re-execute.
    Replay {
        /// The stored response.
        response: StoredResponse,
        /// When it completed (epoch milliseconds).
        completed_at: UnixMillis,
    },
    /// The record holds a different fingerprint: `422 idempotency_key_mismatch`, never replay.
    Mismatch,
    /// The record is in flight, abandoned, and the completer gave up on it and marked it for a
    /// person ([`Redrives::marked_at`]): `409 idempotency_request_needs_attention`, not
    /// retryable. The request is never executed again, by a retry or by the completer: its
    /// first attempt may have taken effect part-way, and only a person can tell.
    NeedsAttention {
        /// When the completer marked it (epoch milliseconds).
        marked_at: UnixMillis,
        /// How many times the completer had re-driven it.
        attempts: u32,
        /// The last committed phase of the request, if any.
        recovery_point: Option<String>,
    },
}
