//! [`Split`]: business writes in an sqlx database, keys in another key store (Redis, the
//! memory store), for teams whose key store is not their business database.
//!
//! # What it gives up, and what it keeps
//!
//! The claim, a phase's writes and its recovery point can no longer commit as one unit, so the
//! order is chosen to never run a side effect without a record of it:
//!
//! - the claim commits in the key store first, before the handler runs (like the plain layer);
//! - [`Tx::checkpoint`](crate::Tx::checkpoint) records the recovery point **before** the
//!   business commit (the intent): a crash in between resumes at a step whose writes may be
//!   missing, so a resumed phase re-does its writes idempotently (keyed by the ids its step
//!   carries, `INSERT ... ON CONFLICT DO NOTHING`);
//! - [`Tx::commit`](crate::Tx::commit) and [`Tx::commit_as`](crate::Tx::commit_as) commit the
//!   business writes **before** storing the response: a crash in between leaves the record in
//!   flight at its last step, and the retry re-runs the last phase (idempotently) and stores
//!   the response then. `commit_as` first records its step as the intent, so a single-phase
//!   handler that mints an id is resumed with the same id, never a second row.
//!
//! Duplicates while the first runs get the layer's in-flight answer (`409`, or the wait mode),
//! not the transactional wait.

use crate::store::SqlStore;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Maintenance, RecordKey, StoreError,
    StoredResponse, UnixMillis,
};
use sqlx::{Database, Pool, Transaction};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Keys in `keys`, business writes in `pool`: what this gives up and keeps is in the
/// [crate docs](crate) and on [`SqlStore::atomic`].
pub struct Split<DB: Database> {
    keys: Arc<dyn Maintenance>,
    pool: Pool<DB>,
}

impl<DB: Database> Clone for Split<DB> {
    fn clone(&self) -> Self {
        Self {
            keys: Arc::clone(&self.keys),
            pool: self.pool.clone(),
        }
    }
}

impl<DB: Database> fmt::Debug for Split<DB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Split").finish_non_exhaustive()
    }
}

impl<DB: Database> Split<DB> {
    /// Keys in `keys` (which also serves the reaper and the completer through the `Split`),
    /// business transactions on `pool`.
    pub fn new(keys: Arc<dyn Maintenance>, pool: Pool<DB>) -> Self {
        Self { keys, pool }
    }

    /// The business database's pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }
}

/// Every key store operation is the key store's.
impl<DB: Database> oncely_core::StoreWrapper for Split<DB> {
    type Inner = dyn Maintenance;
    fn inner(&self) -> Result<&dyn Maintenance, StoreError> {
        Ok(&*self.keys)
    }
}

#[async_trait]
impl<DB: Database> SqlStore for Split<DB> {
    type Database = DB;

    fn atomic(&self) -> bool {
        false
    }

    async fn begin(&self) -> Result<Transaction<'static, DB>, StoreError> {
        self.pool.begin().await.map_err(StoreError::unavailable)
    }

    async fn answer_without_lock(
        &self,
        _req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        Ok(None)
    }

    async fn claim_in(
        &self,
        _conn: &mut DB::Connection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.keys.claim(req.clone()).await
    }

    async fn renew_in(
        &self,
        _conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.keys.renew(id, token, lease).await
    }

    async fn checkpoint_in(
        &self,
        _conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        _request: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        // The claim stored the request in the key store already (the claimer defers it only
        // on atomic stores).
        self.keys.checkpoint(id, token, recovery_point, lease).await
    }

    async fn complete_in(
        &self,
        _conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.keys
            .complete(id, token, response.clone(), retention)
            .await
    }
}
