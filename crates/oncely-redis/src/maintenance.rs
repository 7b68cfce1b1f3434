//! Maintenance on Redis: [`Maintenance`] for [`RedisStore`] (the reaper's and the completer's
//! reads and writes), read from the maintenance index (see [`RedisStore`], "The maintenance
//! index"), never from a walk of every record.

use crate::clock::ClockSource;
use crate::decode::{self, Fields};
use crate::index::IndexReader;
use crate::keys::{self, IndexKind};
use crate::scripts::SCRIPTS;
use crate::store::{RedisStore, millis};
use async_trait::async_trait;
use oncely_core::{
    FencingToken, Maintenance, ReapReport, Record, RecordKey, RecordState, RedriveNote, Redrives,
    StoreError,
};
use std::time::Duration;

impl RedisStore {
    /// Reads whole records by their Redis keys (pipelined on one endpoint, in parallel on a
    /// cluster, where they live in different slots): each key with its record, `None` for one
    /// that no longer exists.
    pub(crate) async fn fetch(
        &self,
        names: Vec<Vec<u8>>,
    ) -> Result<Vec<(Vec<u8>, Option<Record>)>, StoreError> {
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
        for (k, fields) in names.into_iter().zip(&rows) {
            // The Redis key names the record (records no longer store scope and key).
            let id = keys::parse_record_key(&self.namespace, &k);
            let rec = decode::record(fields, id.as_ref())?;
            out.push((k, rec));
        }
        Ok(out)
    }

    /// Reads the index of `kind` up to score `max`, lowest first, and the records it names,
    /// until `limit` records passed `keep`. An entry whose record is gone, or no longer matches
    /// it (`keep` says `None`), has its entries written again from the record
    /// ([`RedisStore::reindex`]) once the read is over; `keep` says `Some(false)` for a record
    /// that rightly has the entry but is not wanted now (a backoff that has not ended).
    ///
    /// Cost: the index reads (one `ZRANGE` per index key, see [`IndexReader::open`]) and one
    /// `HGETALL` per entry read, which are the records listed plus the ones skipped.
    async fn read_index(
        &self,
        kind: IndexKind,
        max: Option<i64>,
        limit: usize,
        keep: impl Fn(&Record) -> Option<bool>,
    ) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        if limit == 0 {
            return Ok(out);
        }
        let mut stale = Vec::new();
        let mut index = IndexReader::open(self, kind, max, limit).await?;
        while out.len() < limit {
            let batch = index.next(limit - out.len()).await?;
            if batch.is_empty() {
                break;
            }
            for (key, rec) in self
                .fetch(batch.into_iter().map(|(_, k)| k).collect())
                .await?
            {
                match rec.as_ref().map(&keep) {
                    Some(Some(true)) => out.extend(rec),
                    Some(Some(false)) => {}
                    None | Some(None) => stale.extend(String::from_utf8(key).ok()),
                }
            }
        }
        self.reindex(stale).await?;
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
    ///   can see records past retention that Redis still keeps. Those are in the retention
    ///   index (written only under this clock): this reads its entries due by "now", oldest
    ///   first, and deletes each record with a script that checks the retention end again (a
    ///   record claimed again meanwhile is kept) and removes its index entries. Cost: the index
    ///   reads and one script per due entry; no record that is not due is read.
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let ClockSource::Application(clock) = &self.clock else {
            return Ok(ReapReport::default());
        };
        if batch == 0 {
            return Ok(ReapReport::default());
        }
        self.walk_if_due().await?;
        let now = clock.now_millis();
        let now_arg = now.to_string().into_bytes();
        let mut report = ReapReport::default();
        let mut index = IndexReader::open(self, IndexKind::Retention, Some(now), batch).await?;
        while report.deleted < batch as u64 {
            let due = index.next(batch - report.deleted as usize).await?;
            if due.is_empty() {
                break;
            }
            let replies = futures::future::try_join_all(due.into_iter().map(|(_, key)| {
                let key = String::from_utf8(key)
                    .map_err(|_| StoreError::Corrupt("redis: a record key is not UTF-8".into()));
                let args = vec![now_arg.clone()];
                async move { self.eval(&SCRIPTS.reap_one, key?, args, false).await }
            }))
            .await?;
            for v in replies {
                let r = decode::reply(v)?;
                if decode::reply_bytes(&r, 0) == Some(b"deleted") {
                    report.deleted += 1;
                    if decode::reply_bytes(&r, 1) == Some(b"in_flight") {
                        report.orphaned += 1;
                    }
                }
            }
        }
        Ok(report)
    }

    /// Lists up to `limit` in-flight records whose lease ended at least `grace` ago, oldest
    /// lease first.
    ///
    /// Cost: the lease index's entries up to `now - grace` (one `ZRANGE` on one endpoint, one
    /// per hash slot on a cluster: see "The maintenance index") and one `HGETALL` per entry
    /// read (the records listed, and the ones in a backoff that has not ended); nothing else
    /// is read, however many records Redis holds. A record that changes between the index read
    /// and the record read is re-checked and dropped if it no longer qualifies.
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.walk_if_due().await?;
        let now = self.now().await?;
        let cutoff = now.saturating_sub(millis(grace));
        let mut out = self
            .read_index(IndexKind::Lease, Some(cutoff), limit, |rec| {
                match rec.state {
                    RecordState::InFlight {
                        lease_expires_at, ..
                    } if lease_expires_at <= cutoff && !rec.redrives.is_marked() => {
                        Some(rec.redrives.next_attempt_at.is_none_or(|at| at <= now))
                    }
                    _ => None,
                }
            })
            .await?;
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
    /// Cost: the marked index's entries (one `ZRANGE` on one endpoint, one per hash slot on a
    /// cluster) and one `HGETALL` per listed record.
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.walk_if_due().await?;
        let mut out = self
            .read_index(IndexKind::Marked, None, limit, |rec| {
                rec.is_marked().then_some(true)
            })
            .await?;
        out.sort_by(|x, y| {
            (x.redrives.marked_at, &x.scope, &x.key).cmp(&(y.redrives.marked_at, &y.scope, &y.key))
        });
        Ok(out)
    }
}
