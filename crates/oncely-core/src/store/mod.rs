//! The store traits: [`KeyStore`], the one place that arbitrates every transition of the key
//! state machine atomically (the request path), and [`Maintenance`], what the background jobs
//! and operators need beside it. [`StoreWrapper`] gives a store over another store every
//! operation it does not change.
//!
//! # Why leases need fencing tokens
//!
//! A lease alone is a promise about time, and time lies: an owner can stop for longer than its
//! lease (a garbage-collection pause, a stalled VM, a slow disk) without knowing it. While it is
//! stopped the lease lapses, a retry takes the key over and completes it; then the old owner
//! wakes up and, still believing it holds the key, writes its own result over the new one. No
//! amount of lease tuning prevents this, because the owner cannot check the lease and write in
//! one step. The cure is to make the *store* do the check: every claim hands out a fencing
//! token that is larger than every token handed out for that key before, every write carries it,
//! and the store accepts a write only when the token is still the record's current one. The paused
//! owner's late write then fails with [`StoreError::Fenced`] and changes nothing. (This is the
//! fencing scheme Martin Kleppmann describes in "How to do distributed locking"; a bare
//! `SET NX` lock with a TTL lacks it.)
//!
//! # Contract for implementations
//!
//! - `claim` is one atomic decision per `(scope, key)`, made by [`decide`](fn@decide) (the claim
//!   rule, in `decide.rs`) or an exact equivalent inside the database: never a read followed by
//!   an unconditional write. Losing an insert race is the normal "record exists" path, never an
//!   error.
//! - Every write after the claim (`renew`, `checkpoint`, `complete`, `release`) succeeds only
//!   while the record is in flight with the caller's token, and otherwise returns
//!   [`StoreError::Fenced`] without changing anything.
//! - The stored request lives only while the record is in flight: `complete` and `release`
//!   drop it in the same write (the completer re-drives in-flight records only).
//! - Times come from the store's [`Clock`](crate::Clock) (or, for a store that documents it, the
//!   server's own clock).
//! - A store implements both traits, [`KeyStore`] and [`Maintenance`], and the shared
//!   conformance suite (the crate `oncely-conformance`), which covers both, must pass.

mod claim;
mod decide;
pub mod guarded;
pub mod memory;
pub mod operator;
mod wrapper;

pub use claim::{Claim, ClaimKind, ClaimOutcome, ClaimRequest};
pub use decide::{Decision, decide};
pub use operator::{
    Change, Operator, OperatorError, RecordFilter, RecordPage, RecordVersion, check_change,
};
pub use wrapper::StoreWrapper;

use crate::key::RecordKey;
use crate::record::{FencingToken, Record, RecordState, Redrives, StoredResponse, UnixMillis};
use async_trait::async_trait;
use std::time::Duration;

/// The lease in milliseconds, never zero (an unknown or zero budget is not "no lease";
/// docs/DESIGN.md, "Crashed owner").
pub fn lease_millis(lease: Duration) -> i64 {
    crate::clock::duration_millis(lease).max(1)
}

/// What the reaper did in one call (or, from `oncely_jobs::reap_all`, in one pass).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReapReport {
    /// Records deleted (past retention).
    pub deleted: u64,
    /// Of those, records that were still in flight (abandoned and never finished): worth a log
    /// line, since their requests may have left a half-done effect.
    pub orphaned: u64,
    /// Records marked for a person that are still kept (the completer gave up on them), as
    /// counted by the pass, which logs each one; [`Maintenance::reap`] itself leaves it 0.
    pub marked: u64,
}

impl ReapReport {
    /// `deleted` records deleted, `orphaned` of them still in flight, `marked` marked records
    /// still kept.
    pub fn new(deleted: u64, orphaned: u64, marked: u64) -> Self {
        Self {
            deleted,
            orphaned,
            marked,
        }
    }
}

/// What the completer writes on an abandoned record with [`Maintenance::note_redrive`].
///
/// `#[non_exhaustive]`: a backend's match needs a wildcard arm (answer an error, write nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RedriveNote {
    /// One more re-drive is starting: count it, and list the record again no earlier than
    /// `backoff` from now.
    Attempt {
        /// The pause before the next attempt may start.
        backoff: Duration,
    },
    /// The completer gives up: mark the record for a person.
    Mark,
}

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The write carried a token that is no longer the record's current one, or the record is
    /// no longer in flight: the caller was fenced off and nothing changed.
    #[error("fenced: the fencing token is stale or the record is no longer in flight")]
    Fenced,
    /// The store could not be reached, timed out or failed. The layer fails closed (`503`).
    #[error("key store unavailable: {0}")]
    Unavailable(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A stored record could not be decoded.
    #[error("corrupt record: {0}")]
    Corrupt(String),
}

impl StoreError {
    /// Wraps any error as [`StoreError::Unavailable`].
    pub fn unavailable(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Unavailable(Box::new(e))
    }
}

/// A key store's request path: what the layer and the transactional phases call while a
/// request runs (claim, renew, checkpoint, complete, release, read). Every method is one atomic
/// operation on the store (see the module docs). The background jobs and operators need more:
/// [`Maintenance`], which every store of the workspace implements too. A store that changes a
/// few operations of another one writes only those, through [`StoreWrapper`].
///
/// All times are epoch milliseconds from the store's clock; all durations are
/// [`std::time::Duration`].
#[async_trait]
pub trait KeyStore: Send + Sync + 'static {
    /// Decides and records the claim of `(scope, key)` atomically, by [`decide`](fn@decide).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the store cannot answer; the caller must then not run
    /// the request (fail closed).
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError>;

    /// Extends the lease of an in-flight record to now plus `lease`; returns the new expiry
    /// (epoch milliseconds).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight.
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError>;

    /// Records a committed phase of a multi-step request and extends the lease.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight.
    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError>;

    /// Completes the record with its response; it then replays for the replay window and is
    /// kept for `retention` from now. The stored request ([`Record::request`]) is dropped in
    /// the same atomic write: only the completer reads it, and only from in-flight records.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight; the
    /// stored record is then unchanged.
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError>;

    /// Releases the claim: the key behaves as absent again (nothing was executed, or the
    /// transaction rolled back). The stored request is dropped, as by [`KeyStore::complete`].
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight.
    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError>;

    /// Reads a record (for status pages, the wait mode and the jobs).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError>;
}

/// What the background jobs and operators need from a key store, beside the request path: the
/// reaper deletes records past retention ([`Maintenance::reap`]) and logs the ones marked for a
/// person ([`Maintenance::list_marked`]); the completer lists abandoned requests
/// ([`Maintenance::list_abandoned`]) and counts or gives up its re-drives
/// ([`Maintenance::note_redrive`]). What a person does to records (listing with filters, a
/// forced release, resolving and unmarking a marked record) is [`Operator`], on top of it.
///
/// The layer takes an `Arc<dyn KeyStore>`; the jobs take an `Arc<dyn Maintenance>` (or
/// `&dyn Maintenance`), which upcasts to the former, so one store serves both.
#[async_trait]
pub trait Maintenance: KeyStore {
    /// Deletes up to `batch` records whose retention ended (`expires_at <= now`), oldest
    /// first, in one short operation. Call repeatedly until it deletes fewer than `batch`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`].
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError>;

    /// Lists up to `limit` in-flight records whose lease lapsed at least `grace` ago (abandoned
    /// requests for the completer), oldest lease first. Records marked for a person are never
    /// listed, nor records whose [`Redrives::next_attempt_at`] is still ahead.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError>;

    /// The completer's write on an abandoned record, one atomic compare-and-set: it succeeds
    /// only while the record is in flight with `token`, its lease has lapsed, it is not marked,
    /// and its attempt count is still `attempts_seen` (so two completers that listed the same
    /// record count one attempt, and only one of them re-drives it). Then
    /// [`RedriveNote::Attempt`] adds one attempt and sets [`Redrives::next_attempt_at`] to now
    /// plus the backoff; [`RedriveNote::Mark`] sets [`Redrives::marked_at`] to now. Returns the
    /// record's new [`Redrives`]. Nothing else of the record changes.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when any condition fails (another request took the key over, it
    /// completed, its owner renewed it, or another completer got there first); nothing changed.
    /// [`StoreError::Unavailable`] when the store cannot answer.
    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError>;

    /// Lists up to `limit` in-flight records marked for a person (the completer gave up on
    /// them), oldest mark first: the reaper logs each of them on every pass until a person
    /// deals with it or its retention ends.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError>;
}

#[async_trait]
impl<S: KeyStore + ?Sized> KeyStore for std::sync::Arc<S> {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        (**self).claim(req).await
    }
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        (**self).renew(id, token, lease).await
    }
    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        (**self).checkpoint(id, token, recovery_point, lease).await
    }
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        (**self).complete(id, token, response, retention).await
    }
    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        (**self).release(id, token).await
    }
    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        (**self).get(id).await
    }
}

#[async_trait]
impl<S: Maintenance + ?Sized> Maintenance for std::sync::Arc<S> {
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        (**self).reap(batch).await
    }
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        (**self).list_abandoned(grace, limit).await
    }
    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        (**self).note_redrive(id, token, attempts_seen, note).await
    }
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        (**self).list_marked(limit).await
    }
}

/// The [`Redrives`] that [`Maintenance::note_redrive`] writes over `seen` at `now`: the rule every
/// backend applies (inside its own atomic step).
pub fn next_redrives(seen: Redrives, note: RedriveNote, now: UnixMillis) -> Redrives {
    match note {
        RedriveNote::Attempt { backoff } => Redrives {
            attempts: seen.attempts.saturating_add(1),
            next_attempt_at: Some(now.saturating_add(crate::clock::duration_millis(backoff))),
            marked_at: None,
        },
        RedriveNote::Mark => Redrives {
            marked_at: Some(now),
            ..seen
        },
    }
}

/// Whether `rec` may take [`Maintenance::note_redrive`] at `now`: in flight with `token`, lease
/// lapsed, not marked, `attempts_seen` attempts. The condition every backend checks in the same
/// atomic step as its write.
pub fn redrive_allowed(
    rec: &Record,
    token: FencingToken,
    attempts_seen: u32,
    now: UnixMillis,
) -> bool {
    matches!(rec.state, RecordState::InFlight { lease_expires_at, .. } if lease_expires_at <= now)
        && rec.token == token
        && rec.redrives.marked_at.is_none()
        && rec.redrives.attempts == attempts_seen
}
