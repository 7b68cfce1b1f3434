//! Listing records: the filter, the page and its cursor.

use super::change::OperatorError;
use crate::clock::duration_millis;
use crate::key::{IdempotencyKey, RecordKey, Scope};
use crate::record::{Record, RecordState, UnixMillis};
use std::time::Duration;

/// The most records one [`Operator::list_records`](super::Operator::list_records) page reads (1,000); a larger limit is
/// lowered to it.
pub const MAX_PAGE: usize = 1000;

/// Which records [`Operator::list_records`](super::Operator::list_records) lists. Every filter set must hold (they combine
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
pub(super) fn on_route(uri: &str, route: &str) -> bool {
    let route = route.trim_end_matches('/');
    let path = uri.split(['?', '#']).next().unwrap_or("");
    match path.strip_prefix(route) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// One page of [`Operator::list_records`](super::Operator::list_records): the records in `(scope, key)` order, and the cursor
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
    /// The opaque cursor of the next page, for [`Operator::list_records`](super::Operator::list_records).
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

/// `limit` as a page size: at least 1, at most [`MAX_PAGE`].
pub fn page_size(limit: usize) -> usize {
    limit.clamp(1, MAX_PAGE)
}

/// The page of `read` (records in `(scope, key)` order, at most `limit` of them, as a store's
/// query returned them): the ones `filter` passes at `now`, and the next cursor when `read` was
/// full (there may be more). The tail of every store's [`Operator::list_records`](super::Operator::list_records).
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
