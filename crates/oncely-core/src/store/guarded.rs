//! [`Operator`] written once for the stores whose listing is one query and whose every change
//! is one guarded write: the SQL stores (SQLite, PostgreSQL, MySQL / MariaDB). A store gives
//! only its statements, [`GuardedStore`]: its SQL text, the parameters in its dialect and its
//! row decoding. The paging, the values of each change, the version guard's parameters and the
//! answer to a write that matched no row are here, and [`guarded_operator!`](crate::guarded_operator)
//! implements [`Operator`] over them.
//!
//! Each change is one `UPDATE` whose `WHERE` clause holds [`check_change`]'s conditions (the
//! record still the [`RecordVersion`] read, and the rule of the change; see the module docs of
//! [`operator`](super::operator), "Fencing" and "Rules"), so a write that matched a row needs no
//! other check; one that matched none is answered from the record as read afterwards
//! ([`missed`]).
//!
//! [`Operator`]: super::Operator
//! [`check_change`]: super::check_change

use super::operator::{
    Change, OperatorError, RecordFilter, RecordPage, RecordVersion, cursor_start, missed, page_of,
    page_size,
};
use super::{KeyStore, StoreError};
use crate::clock::duration_millis;
use crate::key::RecordKey;
use crate::record::{FencingToken, Record, StoredResponse, UnixMillis};
use async_trait::async_trait;
use std::time::Duration;

/// One page of the listing, as the store's query reads it: every filter but the route (the
/// shared code applies the whole [`RecordFilter::matches`] rule to what was read), in
/// `(scope, key)` order after the cursor. Built by [`list_records`] (the struct is
/// `#[non_exhaustive]`).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct PageQuery<'a> {
    /// The filter: its `scope`, `in_flight`, `marked` and `abandoned` go into the query.
    pub filter: &'a RecordFilter,
    /// The scope the page starts after (`""` for the first page: before every record).
    pub after_scope: &'a str,
    /// The key the page starts after, within [`PageQuery::after_scope`] (`""` for the first
    /// page: keys are never empty).
    pub after_key: &'a str,
    /// Now, from the store's clock (epoch milliseconds): an abandoned record's lease expired
    /// at or before it.
    pub now: UnixMillis,
    /// The latest creation time a listed record may have (epoch milliseconds), or `None`
    /// ([`RecordFilter::created_at_most`]).
    pub created_at_most: Option<UnixMillis>,
    /// The most records to read (1 to [`MAX_PAGE`](super::operator::MAX_PAGE)).
    pub limit: i64,
}

impl PageQuery<'_> {
    /// The filter's scope, if any, as stored text.
    pub fn scope(&self) -> Option<&str> {
        self.filter.scope.as_ref().map(|s| s.as_str())
    }
}

/// What a change writes, beside the new token and the guard (see [`GuardedChange`]).
#[derive(Debug, Clone, Copy)]
pub enum ChangeWrite<'a> {
    /// [`Operator::release_record`](super::Operator::release_record): the record becomes
    /// released; `force` also releases a record whose lease is live.
    Release {
        /// Release even while the lease is live.
        force: bool,
    },
    /// [`Operator::resolve_record`](super::Operator::resolve_record): the record becomes
    /// complete with `response`, completed at [`GuardedChange::now`]; `force` also resolves a
    /// record whose lease is live.
    Resolve {
        /// Resolve even while the lease is live.
        force: bool,
        /// The response a person decided (its status, body and `body_retained` are written).
        response: &'a StoredResponse,
        /// The response's header fields as stored ([`StoredResponse::encode_headers`]).
        headers: &'a [u8],
        /// When the record may be reaped: now plus the retention (epoch milliseconds).
        expires_at: UnixMillis,
    },
    /// [`Operator::retry_record`](super::Operator::retry_record): the completer's mark lifted,
    /// no backoff, the attempt count set to `attempts`.
    Retry {
        /// The attempt count written.
        attempts: u32,
    },
}

impl ChangeWrite<'_> {
    /// The change, for [`check_change`](super::check_change).
    pub fn change(&self) -> Change {
        match *self {
            ChangeWrite::Release { force } => Change::Release { force },
            ChangeWrite::Resolve { force, .. } => Change::Resolve { force },
            ChangeWrite::Retry { .. } => Change::Retry,
        }
    }
}

/// One change as the store's guarded `UPDATE` writes it: the record `id` is changed only while
/// it is still the version `seen` (its token and its state) and the change's rule holds, and
/// gets the token [`GuardedChange::next_token`]. Built by the shared code (the struct is
/// `#[non_exhaustive]`).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct GuardedChange<'a> {
    /// `(scope, key)`.
    pub id: &'a RecordKey,
    /// The version read: the guard's token and state.
    pub seen: RecordVersion,
    /// Now, from the store's clock (epoch milliseconds): a lease that expired at or before it
    /// has lapsed.
    pub now: UnixMillis,
    /// What the change writes.
    pub write: ChangeWrite<'a>,
}

impl GuardedChange<'_> {
    /// The token the change writes: one more than the one read.
    pub fn next_token(&self) -> FencingToken {
        self.seen.next_token()
    }
}

/// The statements of a store whose [`Operator`](super::Operator) is written by this module
/// (implement it, then [`guarded_operator!`](crate::guarded_operator)). Each runs as a
/// transaction of its own; a store retries what its database asks it to retry (a serialization
/// failure, a deadlock).
#[async_trait]
pub trait GuardedStore: KeyStore {
    /// Now, from the store's clock (epoch milliseconds).
    fn now_millis(&self) -> UnixMillis;

    /// The records of one page (see [`PageQuery`]): released records never, at most
    /// `page.limit` of them, in `(scope, key)` order.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn read_page(&self, page: &PageQuery<'_>) -> Result<Vec<Record>, StoreError>;

    /// Runs the guarded write of `change` and returns the record as written, or `None` when
    /// it matched no row (the record is not the version read, or the change's rule refuses
    /// it: [`check_change`](super::check_change)'s conditions, in its `WHERE` clause).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`]; nothing was written.
    async fn write_change(&self, change: &GuardedChange<'_>) -> Result<Option<Record>, StoreError>;
}

/// [`Operator::list_records`](super::Operator::list_records) on `store`: the page size, the
/// cursor, the store's page, then the route filter and the next cursor ([`page_of`]).
///
/// # Errors
///
/// As [`Operator::list_records`](super::Operator::list_records).
pub async fn list_records<S: GuardedStore + ?Sized>(
    store: &S,
    filter: &RecordFilter,
    limit: usize,
    cursor: Option<&str>,
) -> Result<RecordPage, OperatorError> {
    let limit = page_size(limit);
    let (after_scope, after_key) = cursor_start(cursor)?;
    let now = store.now_millis();
    let page = PageQuery {
        filter,
        after_scope: &after_scope,
        after_key: &after_key,
        now,
        created_at_most: filter.created_at_most(now),
        limit: i64::try_from(limit).unwrap_or(i64::MAX),
    };
    let read = store.read_page(&page).await?;
    Ok(page_of(read, limit, filter, now))
}

/// [`Operator::release_record`](super::Operator::release_record) on `store`.
///
/// # Errors
///
/// As [`Operator::release_record`](super::Operator::release_record).
pub async fn release_record<S: GuardedStore + ?Sized>(
    store: &S,
    id: &RecordKey,
    seen: RecordVersion,
    force: bool,
) -> Result<Record, OperatorError> {
    change(
        store,
        id,
        seen,
        store.now_millis(),
        ChangeWrite::Release { force },
    )
    .await
}

/// [`Operator::resolve_record`](super::Operator::resolve_record) on `store`.
///
/// # Errors
///
/// As [`Operator::resolve_record`](super::Operator::resolve_record).
pub async fn resolve_record<S: GuardedStore + ?Sized>(
    store: &S,
    id: &RecordKey,
    seen: RecordVersion,
    response: &StoredResponse,
    retention: Duration,
    force: bool,
) -> Result<Record, OperatorError> {
    let now = store.now_millis();
    let headers = response.encode_headers();
    let write = ChangeWrite::Resolve {
        force,
        response,
        headers: &headers,
        expires_at: now.saturating_add(duration_millis(retention)),
    };
    change(store, id, seen, now, write).await
}

/// [`Operator::retry_record`](super::Operator::retry_record) on `store`.
///
/// # Errors
///
/// As [`Operator::retry_record`](super::Operator::retry_record).
pub async fn retry_record<S: GuardedStore + ?Sized>(
    store: &S,
    id: &RecordKey,
    seen: RecordVersion,
    attempts: u32,
) -> Result<Record, OperatorError> {
    change(
        store,
        id,
        seen,
        store.now_millis(),
        ChangeWrite::Retry { attempts },
    )
    .await
}

/// Runs the guarded write and returns the record it wrote, or why it matched no row.
async fn change<S: GuardedStore + ?Sized>(
    store: &S,
    id: &RecordKey,
    seen: RecordVersion,
    now: UnixMillis,
    write: ChangeWrite<'_>,
) -> Result<Record, OperatorError> {
    let change = GuardedChange {
        id,
        seen,
        now,
        write,
    };
    match store.write_change(&change).await? {
        Some(rec) => Ok(rec),
        None => {
            let current = store.get(id).await?;
            Err(missed(current.as_ref(), seen, write.change(), now))
        }
    }
}

/// Implements [`Operator`](crate::Operator) for a store type that implements
/// [`GuardedStore`](crate::store::guarded::GuardedStore) (and
/// [`Maintenance`](crate::Maintenance)): every operation is the one of
/// [`oncely_core::store::guarded`](crate::store::guarded). A macro rather than a blanket
/// implementation, which would overlap the one of [`StoreWrapper`](crate::StoreWrapper)s.
/// Write `oncely_core::guarded_operator!(MyStore);` beside the store's `GuardedStore`
/// implementation.
#[macro_export]
macro_rules! guarded_operator {
    ($store:ty) => {
        #[$crate::store::guarded::__async_trait]
        impl $crate::Operator for $store {
            async fn list_records(
                &self,
                filter: &$crate::RecordFilter,
                limit: usize,
                cursor: ::core::option::Option<&str>,
            ) -> ::core::result::Result<$crate::RecordPage, $crate::OperatorError> {
                $crate::store::guarded::list_records(self, filter, limit, cursor).await
            }

            async fn release_record(
                &self,
                id: &$crate::RecordKey,
                seen: $crate::RecordVersion,
                force: bool,
            ) -> ::core::result::Result<$crate::Record, $crate::OperatorError> {
                $crate::store::guarded::release_record(self, id, seen, force).await
            }

            async fn resolve_record(
                &self,
                id: &$crate::RecordKey,
                seen: $crate::RecordVersion,
                response: $crate::StoredResponse,
                retention: ::std::time::Duration,
                force: bool,
            ) -> ::core::result::Result<$crate::Record, $crate::OperatorError> {
                $crate::store::guarded::resolve_record(self, id, seen, &response, retention, force)
                    .await
            }

            async fn retry_record(
                &self,
                id: &$crate::RecordKey,
                seen: $crate::RecordVersion,
                attempts: u32,
            ) -> ::core::result::Result<$crate::Record, $crate::OperatorError> {
                $crate::store::guarded::retry_record(self, id, seen, attempts).await
            }
        }
    };
}

/// The attribute [`guarded_operator!`](crate::guarded_operator) implements with (not an API).
#[doc(hidden)]
pub use async_trait::async_trait as __async_trait;
