//! The claim rule: [`decide`] turns an existing record (or none), a claim request and the
//! store's "now" into a [`Decision`], which every store applies inside one atomic step
//! (docs/DESIGN.md, "The key state machine"). Re-exported as `oncely_core::decide` and
//! `oncely_core::Decision`.

use super::claim::{ClaimKind, ClaimOutcome, ClaimRequest};
use crate::record::{FencingToken, Record, RecordState, UnixMillis};

#[cfg(doc)]
use crate::record::Redrives;

/// What [`decide`] tells a store to do.
///
/// Deliberately exhaustive (not `#[non_exhaustive]`): it is the contract between [`decide`] and
/// every backend, so a new kind of decision must be a compile error in each backend rather than
/// a wildcard arm nobody wrote for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Write a new in-flight record (insert, or overwrite a released or past-window one) with
    /// this token.
    Claim {
        /// The new token.
        token: FencingToken,
        /// Why.
        kind: ClaimKind,
        /// The recovery point to keep (takeover only).
        recovery_point: Option<String>,
    },
    /// Write nothing; answer this.
    Answer(ClaimOutcome),
}

/// The key state machine's claim rule, shared by every backend so that no path skips a check
/// (the path that finds an existing record must compare fingerprints too; docs/DESIGN.md,
/// "Validation skipped on one path").
///
/// | existing record | same fingerprint | different fingerprint |
/// |---|---|---|
/// | none, or released | claim (new) | claim (new) |
/// | complete, past the window | claim (anew) | claim (anew) |
/// | complete, inside the window | replay | mismatch |
/// | in flight, marked for a person | needs attention | mismatch |
/// | in flight, lease alive | in flight | mismatch |
/// | in flight, lease lapsed | takeover (resume) | mismatch |
///
/// A record marked for a person ([`Redrives::marked_at`], set by the completer when it gives
/// up) is never claimed again while it is kept, whatever its lease says: a second execution
/// of a request that may have taken effect part-way is exactly what the mark prevents.
pub fn decide(existing: Option<&Record>, req: &ClaimRequest, now: UnixMillis) -> Decision {
    let Some(rec) = existing else {
        return Decision::Claim {
            token: FencingToken(1),
            kind: ClaimKind::New,
            recovery_point: None,
        };
    };
    let next = FencingToken(rec.token.0.saturating_add(1));
    let same = rec.fingerprint == req.fingerprint;
    match &rec.state {
        RecordState::Released => Decision::Claim {
            token: next,
            kind: ClaimKind::New,
            recovery_point: None,
        },
        RecordState::Complete {
            response,
            completed_at,
        } => {
            let window_end =
                completed_at.saturating_add(crate::clock::duration_millis(req.replay_window));
            if now >= window_end {
                Decision::Claim {
                    token: next,
                    kind: ClaimKind::AfterReplayWindow,
                    recovery_point: None,
                }
            } else if same {
                Decision::Answer(ClaimOutcome::Replay {
                    response: response.clone(),
                    completed_at: *completed_at,
                })
            } else {
                Decision::Answer(ClaimOutcome::Mismatch)
            }
        }
        RecordState::InFlight {
            lease_expires_at,
            recovery_point,
        } => {
            if !same {
                Decision::Answer(ClaimOutcome::Mismatch)
            } else if let Some(marked_at) = rec.redrives.marked_at {
                Decision::Answer(ClaimOutcome::NeedsAttention {
                    marked_at,
                    attempts: rec.redrives.attempts,
                    recovery_point: recovery_point.clone(),
                })
            } else if now < *lease_expires_at {
                Decision::Answer(ClaimOutcome::InFlight {
                    lease_expires_at: *lease_expires_at,
                })
            } else {
                Decision::Claim {
                    token: next,
                    kind: ClaimKind::Takeover,
                    recovery_point: recovery_point.clone(),
                }
            }
        }
    }
}
