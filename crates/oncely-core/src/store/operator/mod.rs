//! [`Operator`]: what a person (through `oncely records` or an operator console) may do to a
//! record, beside the request path ([`KeyStore`](super::KeyStore)) and the jobs
//! ([`Maintenance`]): list records with filters, read one, release it, resolve it with an
//! answer a person decided, or lift the completer's mark so that it is re-driven once more.
//!
//! # Fencing
//!
//! Every change is one atomic compare-and-set on the record, like the store's own writes
//! (module docs of [`store`](super), "Why leases need fencing tokens"): it names the version of
//! the record the person read ([`RecordVersion`]: its fencing token and state), and succeeds
//! only while the stored record is still that version; otherwise it fails with
//! [`OperatorError::Changed`] and changes nothing. Every change also raises the fencing token
//! by one, so a process still holding the claim it read (an owner that was only paused) is
//! fenced off ([`StoreError::Fenced`](super::StoreError::Fenced)) when it tries to write afterwards, and of two changes
//! made from the same reading only one can win.
//!
//! # Rules
//!
//! The rule of each change, shared by every backend: [`check_change`].
//!
//! | change | allowed on | refused |
//! |---|---|---|
//! | [`release_record`](Operator::release_record) | in flight, complete | a live lease unless `force`; released |
//! | [`resolve_record`](Operator::resolve_record) | in flight | a live lease unless `force`; complete, released |
//! | [`retry_record`](Operator::retry_record) | in flight and marked, with a stored request | not marked; no stored request |
//!
//! The listing (filter, page, cursor) is in `list.rs`, the changes and their rule in
//! `change.rs`.

mod change;
mod list;
#[cfg(test)]
mod tests;

pub use change::{
    Change, OperatorError, RecordVersion, check_change, missed, released, resolved, retried,
};
pub use list::{
    MAX_PAGE, RecordFilter, RecordPage, cursor_start, decode_cursor, encode_cursor, id_of, page_of,
    page_size,
};

use super::Maintenance;
use crate::key::RecordKey;
use crate::record::{Record, StoredResponse};
use async_trait::async_trait;
use std::time::Duration;

/// What a person may do to a store's records (see the module docs): a trait beside
/// [`KeyStore`](super::KeyStore) and [`Maintenance`], implemented by the memory store, Redis
/// and the three SQL stores (through their one implementation, [`guarded`](super::guarded)),
/// and covered by the conformance suite (the crate `oncely-conformance`, its `operator`
/// scenarios). A store that wraps another one forwards these through
/// [`StoreWrapper`](super::StoreWrapper).
///
/// Reading one record is [`KeyStore::get`](super::KeyStore::get) (every field). Every change
/// names the [`RecordVersion`] read, raises the fencing token, and returns the record as it is
/// afterwards. All times are epoch milliseconds from the store's clock.
#[async_trait]
pub trait Operator: Maintenance {
    /// Lists up to `limit` (at most [`MAX_PAGE`]) records that pass `filter`, in `(scope, key)`
    /// order, from `cursor` (`None`: from the start; else a [`RecordPage::next`] of this
    /// store). Released records are never listed. See [`RecordPage`] for pages shorter than
    /// the limit.
    ///
    /// # Errors
    ///
    /// [`OperatorError::BadCursor`]; [`OperatorError::Store`] ([`StoreError::Unavailable`](super::StoreError::Unavailable) or
    /// [`StoreError::Corrupt`](super::StoreError::Corrupt)).
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError>;

    /// Forgets the record: it becomes released (the next request with its key executes anew,
    /// as after [`KeyStore::release`](super::KeyStore::release)), its stored request,
    /// response and re-drive bookkeeping are dropped, and its fencing token is raised, so an
    /// owner still running the old claim cannot complete it. Allowed on an in-flight record
    /// whose lease lapsed (or, with `force`, a live one) and on a complete one (its response
    /// no longer replays).
    ///
    /// # Errors
    ///
    /// As [`check_change`] for [`Change::Release`]; [`OperatorError::Store`].
    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError>;

    /// Completes an in-flight record with `response`, the answer a person decided: it replays
    /// it from now on, for the replay window, and is kept for `retention` from now. Its stored
    /// request and mark are dropped and its fencing token raised, so the owner of the old
    /// claim cannot complete it too (of a resolve and a completion, one wins). A live lease
    /// is refused unless `force`.
    ///
    /// # Errors
    ///
    /// As [`check_change`] for [`Change::Resolve`]; [`OperatorError::Store`].
    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError>;

    /// Lifts the completer's mark from an in-flight record that kept its request: it is
    /// abandoned work again, listed by [`Maintenance::list_abandoned`] at once (no backoff),
    /// with its attempt count set to `attempts`. The completer re-drives a record while its
    /// attempts are under its `max_attempts`: pass `max_attempts - 1` for one more re-drive,
    /// 0 for a whole new round. The fencing token is raised (the re-drive takes the record
    /// over anyway).
    ///
    /// # Errors
    ///
    /// As [`check_change`] for [`Change::Retry`]; [`OperatorError::Store`].
    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError>;
}

#[async_trait]
impl<S: Operator + ?Sized> Operator for std::sync::Arc<S> {
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        (**self).list_records(filter, limit, cursor).await
    }
    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError> {
        (**self).release_record(id, seen, force).await
    }
    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError> {
        (**self)
            .resolve_record(id, seen, response, retention, force)
            .await
    }
    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError> {
        (**self).retry_record(id, seen, attempts).await
    }
}
