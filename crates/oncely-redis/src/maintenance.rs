//! Maintenance on Redis: [`Maintenance`] for [`RedisStore`] (the reaper's and the completer's
//! reads and writes).

use crate::clock::ClockSource;
use crate::decode::{self, Fields};
use crate::keys;
use crate::scripts::SCRIPTS;
use crate::store::{RedisStore, millis};
use async_trait::async_trait;
use oncely_core::{
    FencingToken, Maintenance, ReapReport, Record, RecordKey, RecordState, RedriveNote, Redrives,
    StoreError,
};
use std::collections::{BinaryHeap, HashSet};
use std::time::Duration;

/// How many keys one `SCAN` step asks for (per primary).
const SCAN_COUNT: usize = 1000;

impl RedisStore {
    /// Walks every record key of the namespace with `SCAN` on every primary and reads
    /// `fields` of each (one pipelined `HMGET` per `SCAN` step); keeps the `limit` smallest
    /// values `keep` returns, each key once, smallest first.
    ///
    /// Cost: `SCAN` visits each primary's whole database (Redis has no prefix index), about
    /// one round trip per 1000 keys per primary plus one pipelined read per step. Memory is
    /// bounded: one step's keys plus the `limit` kept so far.
    async fn scan_fields<T: Ord + Clone>(
        &self,
        fields: &[&str],
        limit: usize,
        mut keep: impl FnMut(&[Option<Vec<u8>>]) -> Option<T>,
    ) -> Result<Vec<(T, Vec<u8>)>, StoreError> {
        let pattern = keys::scan_pattern(&self.namespace);
        // A max-heap of the `limit` smallest so far, and the keys in it (SCAN may return a
        // key more than once).
        let mut best: BinaryHeap<(T, Vec<u8>)> = BinaryHeap::new();
        let mut in_best: HashSet<Vec<u8>> = HashSet::new();
        let mut conn = self.conn.clone();
        let primaries = self.run(conn.primaries()).await?;
        for primary in primaries {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, found): (u64, Vec<Vec<u8>>) =
                    self.run(conn.query_on(primary, &scan)).await?;
                let found: Vec<Vec<u8>> = found
                    .into_iter()
                    .filter(|k| !in_best.contains(k))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                if !found.is_empty() {
                    let mut pipe = redis::pipe();
                    for k in &found {
                        pipe.cmd("HMGET").arg(k).arg(fields);
                    }
                    let rows: Vec<Vec<Option<Vec<u8>>>> =
                        self.run(conn.pipeline_on(primary, &pipe)).await?;
                    for (k, row) in found.into_iter().zip(rows) {
                        let Some(t) = keep(&row) else { continue };
                        if best.len() == limit {
                            match best.peek() {
                                Some((worst, _)) if t < *worst => {}
                                _ => continue,
                            }
                            if let Some((_, out)) = best.pop() {
                                in_best.remove(&out);
                            }
                        }
                        in_best.insert(k.clone());
                        best.push((t, k));
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(best.into_sorted_vec())
    }

    /// Reads whole records by their Redis keys (pipelined on one endpoint, in parallel on a
    /// cluster, where they live in different slots); keys that no longer exist are left out.
    async fn fetch(&self, names: Vec<Vec<u8>>) -> Result<Vec<Record>, StoreError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Fields> = if self.conn.is_cluster() {
            futures::future::try_join_all(names.iter().map(|k| {
                let mut conn = self.conn.clone();
                self.run(async move { redis::cmd("HGETALL").arg(k).query_async(&mut conn).await })
            }))
            .await?
        } else {
            let mut pipe = redis::pipe();
            for k in &names {
                pipe.cmd("HGETALL").arg(k);
            }
            let mut conn = self.conn.clone();
            self.run(async move { pipe.query_async(&mut conn).await })
                .await?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (k, fields) in names.iter().zip(&rows) {
            // The Redis key names the record (records no longer store scope and key).
            let id = keys::parse_record_key(&self.namespace, k);
            if let Some(rec) = decode::record(fields, id.as_ref())? {
                out.push(rec);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl Maintenance for RedisStore {
    /// Deletes up to `batch` records whose stored retention end is at or before "now", oldest
    /// first.
    ///
    /// **Redis expiry is the primary reaper here**: every write sets the hash's TTL to its
    /// retention end, and Redis never returns an expired key. So:
    ///
    /// - Under [`ClockSource::Server`] the TTL and the stored `expires_at` run on the same
    ///   clock, no record past retention is ever visible, and this returns an empty report at
    ///   once, without touching Redis. (Records deleted by Redis expiry are not counted, so the
    ///   `orphaned` count is not available on this backend with the server clock.)
    /// - Under [`ClockSource::Application`] the TTL is set relative to the application's "now",
    ///   so an application clock running ahead of the server's (a test's manual clock, or skew)
    ///   can see records past retention that Redis still keeps. This walks the namespace with
    ///   `SCAN` on every primary (cost: each primary's whole database, about one round trip per
    ///   1000 keys; memory: one step's keys plus `batch`), then deletes the oldest `batch` of
    ///   them, each with a script that checks the retention end again, so a record claimed
    ///   again meanwhile is kept.
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let ClockSource::Application(clock) = &self.clock else {
            return Ok(ReapReport::default());
        };
        if batch == 0 {
            return Ok(ReapReport::default());
        }
        let now = clock.now_millis();
        let due = self
            .scan_fields(&["expires"], batch, |row| {
                row.first()
                    .and_then(Option::as_deref)
                    .and_then(decode::parse_int)
                    .filter(|at| *at <= now)
            })
            .await?;
        let mut report = ReapReport::default();
        let now_arg = now.to_string().into_bytes();
        for (_, key) in due {
            let key = String::from_utf8(key)
                .map_err(|_| StoreError::Corrupt("redis: a record key is not UTF-8".into()))?;
            let v = self
                .eval(&SCRIPTS.reap_one, key, vec![now_arg.clone()], false)
                .await?;
            let r = decode::reply(v)?;
            if decode::reply_bytes(&r, 0) == Some(b"deleted") {
                report.deleted += 1;
                if decode::reply_bytes(&r, 1) == Some(b"in_flight") {
                    report.orphaned += 1;
                }
            }
        }
        Ok(report)
    }

    /// Lists up to `limit` in-flight records whose lease ended at least `grace` ago, oldest
    /// lease first.
    ///
    /// Cost: one `SCAN` walk of every primary's whole database (about one round trip per 1000
    /// keys, each with a pipelined `HMGET` of the matching keys; memory: one step's keys plus
    /// `limit`), then one `HGETALL` of each chosen record (pipelined on one endpoint, in
    /// parallel on a cluster). A failover during the walk can make it miss records; the next
    /// pass finds them. A per-namespace index (a sorted set of leases) would be cheaper but
    /// would live in a different Cluster slot than the records and could not be updated in the
    /// same atomic script, so it is deliberately not kept. A record that changes between the
    /// walk and the read is re-checked and dropped if it no longer qualifies.
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let now = self.now().await?;
        let cutoff = now.saturating_sub(millis(grace));
        let due = |next: Option<&Option<Vec<u8>>>| match next {
            Some(Some(at)) => decode::parse_int(at).is_some_and(|at| at <= now),
            _ => true,
        };
        let lapsed = self
            .scan_fields(
                &["state", "lease", "marked", "next_attempt"],
                limit,
                |row| match (
                    row.first().and_then(Option::as_deref),
                    row.get(1),
                    row.get(2),
                ) {
                    (Some(b"in_flight"), Some(Some(lease)), Some(None)) if due(row.get(3)) => {
                        decode::parse_int(lease).filter(|at| *at <= cutoff)
                    }
                    _ => None,
                },
            )
            .await?;
        let mut out: Vec<Record> = self
            .fetch(lapsed.into_iter().map(|(_, k)| k).collect())
            .await?
            .into_iter()
            .filter(|rec| {
                matches!(rec.state, RecordState::InFlight { lease_expires_at, .. }
                    if lease_expires_at <= cutoff)
                    && !rec.redrives.is_marked()
                    && rec.redrives.next_attempt_at.is_none_or(|at| at <= now)
            })
            .collect();
        out.sort_by_key(|r| match r.state {
            RecordState::InFlight {
                lease_expires_at, ..
            } => lease_expires_at,
            _ => 0,
        });
        Ok(out)
    }

    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        let (kind, backoff): (&[u8], i64) = match note {
            RedriveNote::Attempt { backoff } => (b"attempt", millis(backoff)),
            RedriveNote::Mark => (b"mark", 0),
            _ => return Err(StoreError::Fenced),
        };
        let r = self
            .write(
                &SCRIPTS.note_redrive,
                id,
                vec![
                    token.0.to_string().into_bytes(),
                    attempts_seen.to_string().into_bytes(),
                    kind.to_vec(),
                    backoff.to_string().into_bytes(),
                ],
                true,
            )
            .await?;
        let opt = |i: usize| match decode::reply_bytes(&r, i) {
            Some(_) => decode::reply_int(&r, i).map(Some),
            None => Ok(None),
        };
        Ok(Redrives::new(
            u32::try_from(decode::reply_int(&r, 1)?)
                .map_err(|_| StoreError::Corrupt("redis: attempts out of range".into()))?,
            opt(2)?,
            opt(3)?,
        ))
    }

    /// Lists up to `limit` in-flight records marked for a person, oldest mark first.
    ///
    /// Cost: one `SCAN` walk of every primary, as [`Maintenance::list_abandoned`] (Redis has no
    /// index to read them from), then one `HGETALL` per listed record.
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let marked = self
            .scan_fields(&["state", "marked"], limit, |row| {
                match (row.first().and_then(Option::as_deref), row.get(1)) {
                    (Some(b"in_flight"), Some(Some(at))) => decode::parse_int(at),
                    _ => None,
                }
            })
            .await?;
        let mut out: Vec<Record> = self
            .fetch(marked.into_iter().map(|(_, k)| k).collect())
            .await?
            .into_iter()
            .filter(Record::is_marked)
            .collect();
        out.sort_by(|x, y| {
            (x.redrives.marked_at, &x.scope, &x.key).cmp(&(y.redrives.marked_at, &y.scope, &y.key))
        });
        Ok(out)
    }
}
