//! The walk of the whole namespace, the maintenance index's backstop (see [`RedisStore`], "The
//! maintenance index"): it finds the records that have no index entry (written before the index
//! existed, or by an older version during a rolling upgrade) and writes their entries.

use crate::clock::ClockSource;
use crate::conn::{Conn, Primary};
use crate::keys;
use crate::scripts::SCRIPTS;
use crate::store::{RedisStore, millis};
use oncely_core::StoreError;

/// How many keys one `SCAN` step asks for (per primary).
const SCAN_COUNT: usize = 1000;

/// What one walk of the namespace did ([`RedisStore::rebuild_index`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct IndexWalk {
    /// Record keys the walk visited (`SCAN` may return a key twice, so about the number of
    /// records held).
    pub records: u64,
    /// Records whose index entries it wrote again: the ones in flight (and, under
    /// [`ClockSource::Application`], every record).
    pub indexed: u64,
}

/// The keys of every `SCAN ... MATCH <pattern> COUNT 1000` step of every primary (the one
/// server, or each primary of the cluster as `CLUSTER SLOTS` said when it opened), from the
/// start of each to its end, a step at a time. `SCAN` may hand out a key twice.
pub(crate) struct ScanSteps<'a> {
    store: &'a RedisStore,
    conn: Conn,
    pattern: String,
    primaries: Vec<Primary>,
    /// The primary being walked, and its `SCAN` cursor.
    at: usize,
    cursor: u64,
}

impl<'a> ScanSteps<'a> {
    /// Reads the primaries.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`].
    pub(crate) async fn open(store: &'a RedisStore, pattern: String) -> Result<Self, StoreError> {
        let mut conn = store.conn.clone();
        let primaries = store.run(conn.primaries()).await?;
        Ok(Self {
            store,
            conn,
            pattern,
            primaries,
            at: 0,
            cursor: 0,
        })
    }

    /// The next step's primary and keys; `None` after the last primary's last step.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when a round trip fails or times out.
    pub(crate) async fn next(&mut self) -> Result<Option<(Primary, Vec<Vec<u8>>)>, StoreError> {
        let Some(&primary) = self.primaries.get(self.at) else {
            return Ok(None);
        };
        let mut scan = redis::cmd("SCAN");
        scan.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let (next, found): (u64, Vec<Vec<u8>>) =
            self.store.run(self.conn.query_on(primary, &scan)).await?;
        if next == 0 {
            self.at += 1;
        }
        self.cursor = next;
        Ok(Some((primary, found)))
    }
}

impl RedisStore {
    /// Walks every record key of the namespace with `SCAN` on every primary and writes the
    /// index entries of each record that needs one, from its fields as they are then (one
    /// script per record, atomic with the record): the records in flight, and under
    /// [`ClockSource::Application`] every record (for the retention index). Entries that are
    /// already right are written again unchanged.
    ///
    /// The maintenance passes call this by themselves at most once per
    /// [`RedisConfig::index_walk_every`](crate::RedisConfig::index_walk_every) across every
    /// process sharing the namespace (the first pass after that long starts it), and on the
    /// first pass ever on a namespace; an operator may call it after an upgrade rather than
    /// wait. It is the only maintenance that reads every record.
    ///
    /// Cost: about one round trip per 1000 keys per primary, plus one pipelined `HMGET` per
    /// step and one script per record it indexes; memory: one step's keys.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when a round trip fails or times out (a later walk starts
    /// again from the beginning; the entries written so far stay).
    pub async fn rebuild_index(&self) -> Result<IndexWalk, StoreError> {
        let pattern = keys::scan_pattern(&self.namespace);
        let every_record = matches!(self.clock, ClockSource::Application(_));
        let mut walk = IndexWalk::default();
        let mut steps = ScanSteps::open(self, pattern).await?;
        let mut conn = self.conn.clone();
        while let Some((primary, found)) = steps.next().await? {
            // The pattern may match another namespace's index keys: only record keys.
            let found: Vec<String> = found
                .into_iter()
                .filter(|k| keys::parse_record_key(&self.namespace, k).is_some())
                .filter_map(|k| String::from_utf8(k).ok())
                .collect();
            walk.records += found.len() as u64;
            let due = if every_record || found.is_empty() {
                found
            } else {
                let mut pipe = redis::pipe();
                for k in &found {
                    pipe.cmd("HGET").arg(k).arg("state");
                }
                let states: Vec<Option<Vec<u8>>> =
                    self.run(conn.pipeline_on(primary, &pipe)).await?;
                found
                    .into_iter()
                    .zip(states)
                    .filter(|(_, state)| state.as_deref() == Some(b"in_flight"))
                    .map(|(k, _)| k)
                    .collect()
            };
            walk.indexed += due.len() as u64;
            self.reindex(due).await?;
        }
        Ok(walk)
    }

    /// Walks the namespace ([`RedisStore::rebuild_index`]) when no walk started within
    /// [`RedisConfig::index_walk_every`](crate::RedisConfig::index_walk_every): the first
    /// process to set the walk key (`SET <namespace>:index:walk 1 NX PX <every>`) walks, every
    /// other one skips; `PTTL` on that key says when the next walk is due. A failed walk
    /// deletes the key, so the next pass tries again.
    pub(crate) async fn walk_if_due(&self) -> Result<(), StoreError> {
        let Some(every) = self.walk_every else {
            return Ok(());
        };
        let key = keys::walk_key(&self.namespace);
        let mut conn = self.conn.clone();
        let set = redis::cmd("SET")
            .arg(&key)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(millis(every).max(1))
            .clone();
        let started: Option<String> = self
            .run(async move { set.query_async(&mut conn).await })
            .await?;
        if started.is_none() {
            return Ok(());
        }
        match self.rebuild_index().await {
            Ok(walk) => {
                tracing::info!(
                    records = walk.records,
                    indexed = walk.indexed,
                    "redis key store: walked the namespace for records without index entries"
                );
                Ok(())
            }
            Err(e) => {
                let mut conn = self.conn.clone();
                let _: Result<i64, _> = self
                    .run(async move { redis::cmd("DEL").arg(key).query_async(&mut conn).await })
                    .await;
                Err(e)
            }
        }
    }

    /// Writes the index entries of each record at `keys` again from its fields (or removes
    /// them, for a record that is gone): one script per record, concurrently.
    pub(crate) async fn reindex(&self, keys: Vec<String>) -> Result<(), StoreError> {
        let now = self.now_arg().into_bytes();
        futures::future::try_join_all(
            keys.into_iter()
                .map(|k| self.eval(&SCRIPTS.reindex, k, vec![now.clone()], false)),
        )
        .await?;
        Ok(())
    }
}
