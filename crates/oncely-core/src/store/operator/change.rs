//! The changes a person makes: the version read, the rule of each change ([`check_change`])
//! and the record each one leaves.

use crate::clock::duration_millis;
use crate::record::{FencingToken, Record, RecordState, StoredResponse, UnixMillis};
use crate::store::StoreError;
use std::time::Duration;

/// The version of a record a person read (its fencing token and state): every change of
/// [`Operator`](super::Operator) names it and succeeds only while the record is still that version. Take it
/// from the record with [`RecordVersion::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordVersion {
    /// The fencing token read.
    pub token: FencingToken,
    /// The state read: `in_flight`, `complete` or `released` ([`Record::state_name`]).
    pub state: &'static str,
}

impl RecordVersion {
    /// The version of `rec`.
    pub fn of(rec: &Record) -> Self {
        Self {
            token: rec.token,
            state: rec.state_name(),
        }
    }

    /// The version `state` with `token` (for a console that kept the two apart).
    pub fn new(token: FencingToken, state: &'static str) -> Self {
        Self { token, state }
    }

    /// The token a change writes: one more than the one read.
    pub fn next_token(&self) -> FencingToken {
        FencingToken(self.token.0.saturating_add(1))
    }
}

/// A change of [`Operator`](super::Operator), for [`check_change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// [`Operator::release_record`](super::Operator::release_record); `force` releases a record whose lease is live.
    Release {
        /// Release even while the lease is live.
        force: bool,
    },
    /// [`Operator::resolve_record`](super::Operator::resolve_record); `force` resolves a record whose lease is live.
    Resolve {
        /// Resolve even while the lease is live.
        force: bool,
    },
    /// [`Operator::retry_record`](super::Operator::retry_record).
    Retry,
}

/// Why a change of [`Operator`](super::Operator) failed. Nothing changed in any case.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// No record of that `(scope, key)`.
    #[error("no record of that scope and key")]
    NotFound,
    /// The record is no longer the version read (another change, a completion, a takeover or
    /// an operator got there first): read it again and decide again.
    #[error(
        "the record changed since it was read (now {state}, fencing token {token}): read it again"
    )]
    Changed {
        /// Its state now.
        state: &'static str,
        /// Its fencing token now.
        token: i64,
    },
    /// The record's lease is live: its request may still be running. Wait, or force the
    /// change (which fences the running request off).
    #[error(
        "the lease is live until {lease_expires_at} (epoch milliseconds): its request may still be running; wait for it to lapse or force the change"
    )]
    LeaseLive {
        /// When the lease lapses unless renewed (epoch milliseconds).
        lease_expires_at: UnixMillis,
    },
    /// The change does not apply to the record's state.
    #[error("not allowed on a {state} record: {why}")]
    NotAllowed {
        /// The record's state.
        state: &'static str,
        /// Why, and what to do instead.
        why: &'static str,
    },
    /// The cursor was not made by this store's listing.
    #[error("not a cursor of this listing")]
    BadCursor,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Whether `change` may be made at `now` on `current` (the stored record) by a person who read
/// `seen`: the rule of every backend, checked in the same atomic step as the write (the memory
/// store), or before a write whose `WHERE` clause holds the same conditions and after which
/// nothing else is needed (the SQL stores; see [`check_change`]'s table in the module docs).
///
/// # Errors
///
/// [`OperatorError::NotFound`], [`OperatorError::Changed`], [`OperatorError::LeaseLive`] or
/// [`OperatorError::NotAllowed`].
pub fn check_change(
    current: Option<&Record>,
    seen: RecordVersion,
    change: Change,
    now: UnixMillis,
) -> Result<(), OperatorError> {
    let rec = current.ok_or(OperatorError::NotFound)?;
    if rec.token != seen.token || rec.state_name() != seen.state {
        return Err(OperatorError::Changed {
            state: rec.state_name(),
            token: rec.token.0,
        });
    }
    let state = rec.state_name();
    let live = match rec.state {
        RecordState::InFlight {
            lease_expires_at, ..
        } if lease_expires_at > now => Some(lease_expires_at),
        _ => None,
    };
    let force = match change {
        Change::Release { force } | Change::Resolve { force } => force,
        Change::Retry => true,
    };
    match (change, &rec.state) {
        (_, RecordState::Released) => Err(OperatorError::NotAllowed {
            state,
            why: "it is released already: the next request with its key executes anew",
        }),
        (Change::Resolve { .. }, RecordState::Complete { .. }) => Err(OperatorError::NotAllowed {
            state,
            why: "it is complete and replays its response; release it to let the next request execute anew",
        }),
        (Change::Retry, RecordState::Complete { .. }) => Err(OperatorError::NotAllowed {
            state,
            why: "it is complete: nothing to re-drive",
        }),
        (Change::Retry, RecordState::InFlight { .. }) if !rec.redrives.is_marked() => {
            Err(OperatorError::NotAllowed {
                state,
                why: "it is not marked for a person: the completer re-drives it already",
            })
        }
        (Change::Retry, RecordState::InFlight { .. }) if rec.request.is_none() => {
            Err(OperatorError::NotAllowed {
                state,
                why: "it kept no request, so the completer cannot re-drive it: resolve or release it",
            })
        }
        _ => match live {
            Some(lease_expires_at) if !force => Err(OperatorError::LeaseLive { lease_expires_at }),
            _ => Ok(()),
        },
    }
}

/// The record `rec` becomes by [`Operator::release_record`](super::Operator::release_record) (made by the person who read
/// `seen`): released, with the next token, no request and fresh [`Redrives`](crate::Redrives).
/// The rule a store applies in its atomic step after [`check_change`] passed.
pub fn released(rec: &Record, seen: RecordVersion) -> Record {
    Record {
        token: seen.next_token(),
        state: RecordState::Released,
        request: None,
        redrives: crate::Redrives::default(),
        ..rec.clone()
    }
}

/// The record `rec` becomes by [`Operator::resolve_record`](super::Operator::resolve_record) at `now`: complete with
/// `response`, the next token, kept for `retention` from now, no request, not marked (the
/// attempt count is kept, for the record's history).
pub fn resolved(
    rec: &Record,
    seen: RecordVersion,
    response: StoredResponse,
    retention: Duration,
    now: UnixMillis,
) -> Record {
    Record {
        token: seen.next_token(),
        state: RecordState::Complete {
            response,
            completed_at: now,
        },
        expires_at: now.saturating_add(duration_millis(retention)),
        request: None,
        redrives: crate::Redrives::new(rec.redrives.attempts, None, None),
        ..rec.clone()
    }
}

/// The record `rec` becomes by [`Operator::retry_record`](super::Operator::retry_record): the next token, not marked, no
/// backoff, `attempts` attempts; the rest (the lease, the recovery point, the request) kept.
pub fn retried(rec: &Record, seen: RecordVersion, attempts: u32) -> Record {
    Record {
        token: seen.next_token(),
        redrives: crate::Redrives::new(attempts, None, None),
        ..rec.clone()
    }
}

/// Why a store's guarded write of `change` matched no row, from the record as read afterwards
/// (`current`): the error of [`check_change`], or [`OperatorError::Changed`] when the record
/// passes it now (it changed and changed back in between). For the SQL stores, whose write
/// holds [`check_change`]'s conditions in its `WHERE` clause.
pub fn missed(
    current: Option<&Record>,
    seen: RecordVersion,
    change: Change,
    now: UnixMillis,
) -> OperatorError {
    match (check_change(current, seen, change, now), current) {
        (Err(e), _) => e,
        (Ok(()), Some(rec)) => OperatorError::Changed {
            state: rec.state_name(),
            token: rec.token.0,
        },
        (Ok(()), None) => OperatorError::NotFound,
    }
}
