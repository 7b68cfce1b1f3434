//! What a person may do to records on Redis: [`Operator`] for [`RedisStore`]. Each change is
//! one Lua script (fenced on the version read, atomic with the record's index entries); a
//! listing reads the maintenance index when the filter names a state it holds, and walks the
//! keyspace with `SCAN` otherwise, a bounded step per page.

use crate::decode;
use crate::index::IndexReader;
use crate::keys::{self, IndexKind};
use crate::scripts::{Lua, SCRIPTS};
use crate::store::{RedisStore, millis};
use crate::walk::ScanSteps;
use async_trait::async_trait;
use oncely_core::store::operator::{cursor_start, encode_cursor, page_size};
use oncely_core::{
    Change, Operator, OperatorError, Record, RecordFilter, RecordKey, RecordPage, RecordState,
    RecordVersion, StoreError, StoredResponse, UnixMillis, check_change,
};
use std::collections::BTreeMap;
use std::time::Duration;

/// How many index entries one read asks of one index key.
const INDEX_PAGE: usize = 1000;

/// The indexes that hold every record a filter can pass, or `None` when some of them may be
/// in no index (complete records: a `SCAN` then). Only in-flight records keep a request, so a
/// route filter needs only the in-flight indexes too.
fn indexes_for(filter: &RecordFilter) -> Option<&'static [IndexKind]> {
    if filter.marked {
        Some(&[IndexKind::Marked])
    } else if filter.abandoned {
        Some(&[IndexKind::Lease])
    } else if filter.in_flight || filter.route.is_some() {
        Some(&[IndexKind::Lease, IndexKind::Marked])
    } else {
        None
    }
}

/// Whether `rec` rightly has an entry in `kind` (else the entry is repaired).
fn belongs(kind: IndexKind, rec: &Record) -> bool {
    match kind {
        IndexKind::Lease => {
            matches!(rec.state, RecordState::InFlight { .. }) && !rec.redrives.is_marked()
        }
        IndexKind::Marked => rec.is_marked(),
        IndexKind::Retention => true,
    }
}

/// The first `limit` record keys in `(scope, key)` order after a cursor, fed one Redis key at
/// a time (memory: `limit` keys, whatever is fed; a key fed twice is kept once).
struct FirstKeys<'a> {
    namespace: &'a str,
    after: (String, String),
    scope: Option<&'a str>,
    limit: usize,
    kept: BTreeMap<(String, String), Vec<u8>>,
}

impl<'a> FirstKeys<'a> {
    fn new(
        namespace: &'a str,
        after: (String, String),
        scope: Option<&'a str>,
        limit: usize,
    ) -> Self {
        Self {
            namespace,
            after,
            scope,
            limit,
            kept: BTreeMap::new(),
        }
    }

    /// Keeps the Redis key `name` if it is a record key of the namespace (and scope) after
    /// the cursor and among the first `limit` so far.
    fn offer(&mut self, name: Vec<u8>) {
        let Some(id) = keys::parse_record_key(self.namespace, &name) else {
            return;
        };
        if self.scope.is_some_and(|s| s != id.scope.as_str()) {
            return;
        }
        let at = (id.scope.as_str().to_owned(), id.key.as_str().to_owned());
        if at <= self.after {
            return;
        }
        if self.kept.len() == self.limit
            && self
                .kept
                .last_key_value()
                .is_some_and(|(last, _)| at >= *last)
        {
            return;
        }
        self.kept.insert(at, name);
        if self.kept.len() > self.limit {
            self.kept.pop_last();
        }
    }

    /// The keys kept, in `(scope, key)` order.
    fn into_sorted(self) -> Vec<((String, String), Vec<u8>)> {
        self.kept.into_iter().collect()
    }
}

impl RedisStore {
    /// Feeds every entry of the `kind` index (for the abandoned filter, those with a lease end
    /// up to now) to `first`: one `ZRANGE` per index key (per hash slot on a cluster) and
    /// page of 1000 entries.
    async fn feed_index(
        &self,
        kind: IndexKind,
        max: Option<UnixMillis>,
        first: &mut FirstKeys<'_>,
    ) -> Result<(), StoreError> {
        let mut reader = IndexReader::open(self, kind, max, INDEX_PAGE).await?;
        loop {
            let batch = reader.next(INDEX_PAGE).await?;
            if batch.is_empty() {
                return Ok(());
            }
            for (_, name) in batch {
                first.offer(name);
            }
        }
    }

    /// Feeds every key of the namespace (of the scope, when the filter has one) to `first`:
    /// `SCAN ... MATCH` on every primary, to its end.
    async fn feed_scan(
        &self,
        filter: &RecordFilter,
        first: &mut FirstKeys<'_>,
    ) -> Result<(), StoreError> {
        let pattern = match &filter.scope {
            Some(scope) => keys::scope_scan_pattern(&self.namespace, scope.as_str()),
            None => keys::scan_pattern(&self.namespace),
        };
        let mut steps = ScanSteps::open(self, pattern).await?;
        while let Some((_, found)) = steps.next().await? {
            for name in found {
                first.offer(name);
            }
        }
        Ok(())
    }

    /// Runs an operator change's script on `id` (waited for like a completion) and turns its
    /// answer into the record afterwards, or the reason it was refused ([`check_change`] on the
    /// record as the script found it, at the script's "now").
    async fn change(
        &self,
        lua: &'static Lua,
        id: &RecordKey,
        seen: RecordVersion,
        change: Change,
        extra: Vec<Vec<u8>>,
    ) -> Result<Record, OperatorError> {
        let mut args = vec![
            self.now_arg().into_bytes(),
            seen.token.0.to_string().into_bytes(),
            seen.state.as_bytes().to_vec(),
        ];
        args.extend(extra);
        let v = self.eval(lua, self.key_of(id), args, true).await?;
        let (refused_at, fields) = decode::change_reply(v)?;
        let rec = decode::record(&fields, Some(id))?;
        match refused_at {
            None => rec.ok_or_else(|| {
                StoreError::Corrupt("redis: a changed record is missing".into()).into()
            }),
            Some(now) => {
                check_change(rec.as_ref(), seen, change, now)?;
                Err(StoreError::Corrupt(format!(
                    "redis: the {change:?} script refused a change the rule allows"
                ))
                .into())
            }
        }
    }
}

/// What a person may do to records on Redis and Redis Cluster.
///
/// Every change is one Lua script on the record's key and its slot's index keys (so valid on a
/// cluster): it checks the version read (token and state) and the rule of
/// [`check_change`] in the same atomic step as the write, raises the token by one, and rewrites
/// the record's maintenance index entries from its fields as it leaves them (a released or
/// resolved record leaves the lease and marked indexes; a retried one moves from the marked
/// index to the lease index, where the completer's next pass finds it). It is waited for like a
/// completion (`wait_replicas`). A refusal is explained from the record as the script found it.
#[async_trait]
impl Operator for RedisStore {
    /// Lists up to `limit` (at most 1000) records that pass `filter`, in `(scope, key)` order.
    ///
    /// **Cost on Redis.** Redis keeps no index by `(scope, key)`, so every page finds its
    /// records again from the start and keeps the first `limit` names after the cursor (memory:
    /// `limit` names), then reads those records (`HGETALL`, at most `limit`) and checks the
    /// filters on them. Where the names come from:
    ///
    /// - `marked`, `abandoned`, `in_flight` or `route` set (only in-flight records keep a
    ///   request): the maintenance index ([`RedisStore`], "The maintenance index"): the marked
    ///   index, the lease index (up to now, for `abandoned`), or both. A page reads every entry
    ///   of those indexes (on one endpoint one key per kind; on a cluster one per kind and hash
    ///   slot, 16,384 `ZRANGE`s pipelined per primary, then 1000 entries per round trip): its
    ///   cost follows the records in flight, not the records held. Like the jobs' lists, it
    ///   starts the walk of the namespace when one is due (records written before the index).
    /// - Otherwise (only `scope`, `older_than`, or nothing): complete records are in no index,
    ///   so a page is a `SCAN` of every key of every primary, `MATCH`ing the namespace (or the
    ///   scope's key prefix, which spares the client the other scopes' names but not the
    ///   server's walk over them): about one round trip per 1000 keys held, **per page**: at a
    ///   million keys, a thousand round trips for each page. A page still reads at most
    ///   `limit` records, so memory and reads are bounded; only the walk grows with the keys.
    ///   Prefer a state filter on a large Redis.
    ///
    /// A record that changes state during the listing may be listed twice or not at all, as on
    /// every store. The cursor is the last `(scope, key)` read ([`encode_cursor`]).
    ///
    /// # Errors
    ///
    /// [`OperatorError::BadCursor`]; [`OperatorError::Store`] ([`StoreError::Unavailable`],
    /// [`StoreError::Corrupt`]).
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        let limit = page_size(limit);
        let after = cursor_start(cursor)?;
        let now = self.now().await?;
        let scope = filter.scope.as_ref().map(|s| s.as_str());
        let mut first = FirstKeys::new(&self.namespace, after, scope, limit);
        let kinds = indexes_for(filter);
        match kinds {
            Some(kinds) => {
                self.walk_if_due().await?;
                let max = filter.abandoned.then_some(now);
                for kind in kinds {
                    self.feed_index(*kind, max, &mut first).await?;
                }
            }
            None => self.feed_scan(filter, &mut first).await?,
        }
        let names = first.into_sorted();
        let next = (names.len() >= limit)
            .then(|| names.last())
            .flatten()
            .and_then(|(_, name)| keys::parse_record_key(&self.namespace, name))
            .map(|id| encode_cursor(&id));
        let read = self
            .fetch(names.into_iter().map(|(_, name)| name).collect())
            .await?;
        let mut records = Vec::with_capacity(read.len());
        let mut stale = Vec::new();
        for (name, rec) in read {
            let Some(rec) = rec else {
                if kinds.is_some() {
                    stale.extend(String::from_utf8(name).ok());
                }
                continue;
            };
            if let Some(kinds) = kinds
                && !kinds.iter().any(|k| belongs(*k, &rec))
            {
                stale.extend(String::from_utf8(name).ok());
                continue;
            }
            if filter.matches(&rec, now) {
                records.push(rec);
            }
        }
        self.reindex(stale).await?;
        Ok(RecordPage::new(records, next))
    }

    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError> {
        self.change(
            &SCRIPTS.op_release,
            id,
            seen,
            Change::Release { force },
            vec![if force { b"1" } else { b"0" }.to_vec()],
        )
        .await
    }

    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError> {
        let headers = response.encode_headers();
        self.change(
            &SCRIPTS.op_resolve,
            id,
            seen,
            Change::Resolve { force },
            vec![
                if force { b"1" } else { b"0" }.to_vec(),
                response.status.to_string().into_bytes(),
                headers,
                response.body,
                if response.body_retained { b"1" } else { b"0" }.to_vec(),
                millis(retention).to_string().into_bytes(),
            ],
        )
        .await
    }

    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError> {
        self.change(
            &SCRIPTS.op_retry,
            id,
            seen,
            Change::Retry,
            vec![attempts.to_string().into_bytes()],
        )
        .await
    }
}
