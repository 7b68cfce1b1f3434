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
//! fenced off ([`StoreError::Fenced`]) when it tries to write afterwards, and of two changes
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

use super::{Maintenance, StoreError};
use crate::clock::duration_millis;
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{FencingToken, Record, RecordState, StoredResponse, UnixMillis};
use async_trait::async_trait;
use std::time::Duration;

/// The most records one [`Operator::list_records`] page reads (1,000); a larger limit is
/// lowered to it.
pub const MAX_PAGE: usize = 1000;

/// Which records [`Operator::list_records`] lists. Every filter set must hold (they combine
/// with AND); the default lists every record that is not released. Build it with
/// [`RecordFilter::default`] and the `with_*` methods (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordFilter {
    /// Only in-flight records marked for a person ([`Record::is_marked`]).
    pub marked: bool,
    /// Only in-flight records (a live lease or not, marked or not).
    pub in_flight: bool,
    /// Only abandoned records: in flight, lease lapsed, not marked (the completer's work,
    /// whatever its backoff says).
    pub abandoned: bool,
    /// Only records of this scope.
    pub scope: Option<Scope>,
    /// Only records whose stored request's path is this route or below it (`/v1/payments`
    /// matches `/v1/payments`, `/v1/payments/pay_1` and `/v1/payments?x=1`, not
    /// `/v1/paymentsx`). Only in-flight records keep their request, so only they can match.
    pub route: Option<String>,
    /// Only records whose current claim was made at least this long ago
    /// ([`Record::created_at`]).
    pub older_than: Option<Duration>,
}

impl RecordFilter {
    /// Only marked records.
    #[must_use]
    pub fn with_marked(mut self, on: bool) -> Self {
        self.marked = on;
        self
    }
    /// Only in-flight records.
    #[must_use]
    pub fn with_in_flight(mut self, on: bool) -> Self {
        self.in_flight = on;
        self
    }
    /// Only abandoned records.
    #[must_use]
    pub fn with_abandoned(mut self, on: bool) -> Self {
        self.abandoned = on;
        self
    }
    /// Only records of `scope`.
    #[must_use]
    pub fn with_scope(mut self, scope: Option<Scope>) -> Self {
        self.scope = scope;
        self
    }
    /// Only records whose stored request is on `route` (see [`RecordFilter::route`]).
    #[must_use]
    pub fn with_route(mut self, route: Option<String>) -> Self {
        self.route = route;
        self
    }
    /// Only records claimed at least `age` ago.
    #[must_use]
    pub fn with_older_than(mut self, age: Option<Duration>) -> Self {
        self.older_than = age;
        self
    }

    /// The latest [`Record::created_at`] (epoch milliseconds) a record may have at `now`, when
    /// [`RecordFilter::older_than`] is set.
    pub fn created_at_most(&self, now: UnixMillis) -> Option<UnixMillis> {
        self.older_than
            .map(|age| now.saturating_sub(duration_millis(age)))
    }

    /// Whether `rec` passes every filter at `now`: the rule every backend applies (a SQL store
    /// pushes all but the route into its query, then checks the whole rule on what it read).
    /// Released records never pass.
    pub fn matches(&self, rec: &Record, now: UnixMillis) -> bool {
        let in_flight = matches!(rec.state, RecordState::InFlight { .. });
        let lapsed = matches!(rec.state, RecordState::InFlight { lease_expires_at, .. } if lease_expires_at <= now);
        !matches!(rec.state, RecordState::Released)
            && (!self.in_flight || in_flight)
            && (!self.marked || rec.is_marked())
            && (!self.abandoned || (lapsed && !rec.redrives.is_marked()))
            && self.scope.as_ref().is_none_or(|s| *s == rec.scope)
            && self
                .created_at_most(now)
                .is_none_or(|at| rec.created_at <= at)
            && self.route.as_deref().is_none_or(|route| {
                rec.request
                    .as_ref()
                    .is_some_and(|r| on_route(&r.uri, route))
            })
    }
}

/// Whether the path of `uri` (a path and query) is `route` or below it.
fn on_route(uri: &str, route: &str) -> bool {
    let route = route.trim_end_matches('/');
    let path = uri.split(['?', '#']).next().unwrap_or("");
    match path.strip_prefix(route) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// One page of [`Operator::list_records`]: the records in `(scope, key)` order, and the cursor
/// of the next page (`None`: the listing is done).
///
/// A page may hold fewer than the limit (none, even) while `next` is set: a store reads at
/// most the limit of records per page and may drop some of them by a filter it cannot put in
/// its query (the route). Keep asking until `next` is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordPage {
    /// The records, in `(scope, key)` order.
    pub records: Vec<Record>,
    /// The opaque cursor of the next page, for [`Operator::list_records`].
    pub next: Option<String>,
}

impl RecordPage {
    /// A page of `records` with the `next` cursor.
    pub fn new(records: Vec<Record>, next: Option<String>) -> Self {
        Self { records, next }
    }
}

/// The `(scope, key)` a page ends at, as the opaque cursor every store of the workspace hands
/// out in [`RecordPage::next`] (a store may use a form of its own: the cursor is only ever
/// given back to the store that made it). Hex of the JSON `[scope, key]`.
pub fn encode_cursor(id: &RecordKey) -> String {
    let json = serde_json::to_vec(&(id.scope.as_str(), id.key.as_str())).unwrap_or_default();
    hex::encode(json)
}

/// The `(scope, key)` of a cursor made by [`encode_cursor`].
///
/// # Errors
///
/// [`OperatorError::BadCursor`] when it is not one.
pub fn decode_cursor(cursor: &str) -> Result<(String, String), OperatorError> {
    let bytes = hex::decode(cursor).map_err(|_| OperatorError::BadCursor)?;
    serde_json::from_slice(&bytes).map_err(|_| OperatorError::BadCursor)
}

/// The version of a record a person read (its fencing token and state): every change of
/// [`Operator`] names it and succeeds only while the record is still that version. Take it
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

/// A change of [`Operator`], for [`check_change`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// [`Operator::release_record`]; `force` releases a record whose lease is live.
    Release {
        /// Release even while the lease is live.
        force: bool,
    },
    /// [`Operator::resolve_record`]; `force` resolves a record whose lease is live.
    Resolve {
        /// Resolve even while the lease is live.
        force: bool,
    },
    /// [`Operator::retry_record`].
    Retry,
}

/// Why a change of [`Operator`] failed. Nothing changed in any case.
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
    /// [`OperatorError::BadCursor`]; [`OperatorError::Store`] ([`StoreError::Unavailable`] or
    /// [`StoreError::Corrupt`]).
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

/// The record `rec` becomes by [`Operator::release_record`] (made by the person who read
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

/// The record `rec` becomes by [`Operator::resolve_record`] at `now`: complete with
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

/// The record `rec` becomes by [`Operator::retry_record`]: the next token, not marked, no
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

/// `limit` as a page size: at least 1, at most [`MAX_PAGE`].
pub fn page_size(limit: usize) -> usize {
    limit.clamp(1, MAX_PAGE)
}

/// The page of `read` (records in `(scope, key)` order, at most `limit` of them, as a store's
/// query returned them): the ones `filter` passes at `now`, and the next cursor when `read` was
/// full (there may be more). The tail of every store's [`Operator::list_records`].
pub fn page_of(
    read: Vec<Record>,
    limit: usize,
    filter: &RecordFilter,
    now: UnixMillis,
) -> RecordPage {
    let next = (read.len() >= limit)
        .then(|| read.last())
        .flatten()
        .map(|r| encode_cursor(&RecordKey::new(r.scope.clone(), r.key.clone())));
    RecordPage {
        records: read
            .into_iter()
            .filter(|r| filter.matches(r, now))
            .collect(),
        next,
    }
}

/// A record's `(scope, key)`.
pub fn id_of(rec: &Record) -> RecordKey {
    RecordKey::new(rec.scope.clone(), rec.key.clone())
}

/// The `(scope, key)` a cursor of [`encode_cursor`] ends at, as stored strings; `None` cursor:
/// the start (`("", "")`, before every record: keys are never empty).
///
/// # Errors
///
/// [`OperatorError::BadCursor`].
pub fn cursor_start(cursor: Option<&str>) -> Result<(String, String), OperatorError> {
    match cursor {
        None => Ok((String::new(), String::new())),
        Some(c) => {
            let (scope, key) = decode_cursor(c)?;
            IdempotencyKey::new(&key).map_err(|_| OperatorError::BadCursor)?;
            Ok((scope, key))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_the_path_or_below() {
        assert!(on_route("/v1/payments", "/v1/payments"));
        assert!(on_route("/v1/payments/pay_1", "/v1/payments"));
        assert!(on_route("/v1/payments?x=1", "/v1/payments/"));
        assert!(!on_route("/v1/paymentsx", "/v1/payments"));
        assert!(!on_route("/v2/payments", "/v1/payments"));
    }

    #[test]
    fn cursors_round_trip_and_refuse_strangers() {
        let id = RecordKey::new(
            Scope::new("acct \"1\""),
            IdempotencyKey::new("k-1").unwrap(),
        );
        let c = encode_cursor(&id);
        assert_eq!(
            cursor_start(Some(&c)).unwrap(),
            ("acct \"1\"".to_owned(), "k-1".to_owned())
        );
        assert!(matches!(
            cursor_start(Some("zz")),
            Err(OperatorError::BadCursor)
        ));
        assert!(matches!(
            cursor_start(Some(&hex::encode("[1,2]"))),
            Err(OperatorError::BadCursor)
        ));
        assert_eq!(cursor_start(None).unwrap(), (String::new(), String::new()));
    }
}
