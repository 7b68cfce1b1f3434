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

use crate::error::TxError;
use crate::store::SqlStore;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Maintenance, RecordKey, StoreError,
    StoredResponse,
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

/// A database whose business writes a [`Split`] store commits: how to tell, before the `COMMIT`,
/// that the transaction would commit nothing. A split store's phases write nothing of the key
/// store in the business transaction, so no statement of theirs would fail in an aborted one;
/// and PostgreSQL answers the `COMMIT` of a transaction that a failed statement aborted with
/// `ROLLBACK` and no error (sqlx does not read the command tag), so without this check a
/// handler that ignored a failed statement would have its response stored as a success for
/// writes that never happened, and replayed to every retry.
///
/// Implemented for `sqlx::Postgres` (feature `postgres`: one round trip, the check
/// [`SqlStore::checkpoint_in`] runs on `PostgresStore`, which also refuses a transaction the
/// handler ended itself) and `sqlx::Sqlite` (feature `sqlite`: nothing to ask, since SQLite
/// has no aborted state: a failed statement leaves the transaction open, and the `COMMIT` of a
/// transaction that ended fails with "no transaction is active").
#[async_trait]
pub trait CommitCheck: Database {
    /// Checks the transaction on `conn` just before its `COMMIT`.
    ///
    /// # Errors
    ///
    /// [`TxError::Database`] when a failed statement aborted it; [`TxError::TransactionEnded`]
    /// when it ended behind the phase's back.
    async fn check_before_commit(conn: &mut Self::Connection) -> Result<(), TxError>;
}

#[cfg(feature = "postgres")]
#[async_trait]
impl CommitCheck for sqlx::Postgres {
    async fn check_before_commit(conn: &mut sqlx::PgConnection) -> Result<(), TxError> {
        crate::store::postgres::ensure_open(conn).await
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl CommitCheck for sqlx::Sqlite {
    async fn check_before_commit(_conn: &mut sqlx::SqliteConnection) -> Result<(), TxError> {
        Ok(())
    }
}

#[async_trait]
impl<DB: CommitCheck> SqlStore for Split<DB> {
    type Database = DB;

    fn atomic(&self) -> bool {
        false
    }

    /// The business transaction first, then the claim in the key store, committed at once.
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, DB>>), StoreError> {
        let tx = self.pool.begin().await.map_err(StoreError::unavailable)?;
        match self.keys.claim(req.clone()).await? {
            outcome @ ClaimOutcome::Claimed(_) => Ok((outcome, Some(tx))),
            // Nothing was written: dropping `tx` rolls the empty transaction back.
            other => Ok((other, None)),
        }
    }

    async fn begin_phase(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Transaction<'static, DB>, StoreError> {
        let tx = self.pool.begin().await.map_err(StoreError::unavailable)?;
        self.keys.renew(id, token, lease).await?;
        Ok(tx)
    }

    async fn checkpoint_in(
        &self,
        _conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        _request: Option<&[u8]>,
    ) -> Result<(), TxError> {
        // The claim stored the request in the key store already (the claimer defers it only
        // on atomic stores).
        Ok(self
            .keys
            .checkpoint(id, token, recovery_point, lease)
            .await?)
    }

    async fn complete_in(
        &self,
        _conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        _hot: bool,
    ) -> Result<(), TxError> {
        Ok(self
            .keys
            .complete(id, token, response.clone(), retention)
            .await?)
    }

    async fn commit(&self, mut tx: Transaction<'static, DB>) -> Result<(), TxError> {
        DB::check_before_commit(&mut tx).await?;
        tx.commit().await.map_err(TxError::from)
    }
}
