//! [`Split`]: business writes in an sqlx database, keys in another key store (Redis, the
//! memory store), for teams whose key store is not their business database.
//!
//! # What it gives up, and what it keeps
//!
//! The key store and the business database are two systems, so the claim cannot commit with
//! the business writes. What a phase committed is therefore also written, in the phase's own
//! business transaction, to the split store's **progress ledger**: one row per `(scope, key)`
//! in the business database (table `oncely_split_progress`, created by [`Split::connect`]).
//! The ledger is the truth about what committed; the key store is the truth about who owns the
//! key now (docs/DESIGN.md, "Split stores"):
//!
//! - the claim commits in the key store first, before the handler runs (like the plain layer),
//!   then writes its fencing token into the ledger row as the first statement of the handler's
//!   first business transaction, and reads back what the same request committed there: a
//!   takeover resumes at the ledger's recovery point (not at the key store's, which may name a
//!   step whose transaction never committed), and replays the ledger's response if the request
//!   had finished; a row that holds another request on the key (the key store lost or evicted
//!   its record) makes the claim a mismatch;
//! - every phase's commit updates the row only where its token is still the row's, so once a
//!   request that took the key over has committed, the request it took over commits nothing
//!   (the phase rolls back as fenced): the business writes are fenced, not only the key
//!   store's. A taker whose phase rolled back leaves the row as the last commit left it, so
//!   each phase commits once, on the state the previous commit left;
//! - [`Tx::checkpoint`](crate::Tx::checkpoint) writes its step into the row with the writes,
//!   and into the key store before the business commit;
//! - [`Tx::commit`](crate::Tx::commit) writes the response into the row with the writes, and
//!   into the key store after the business commit. A crash or a failing key store in between
//!   leaves the key store's record in flight: the next claim of the key, once its lease lapses,
//!   replays the response from the ledger. The handler never runs twice for one committed
//!   phase, and no phase needs to be written to be re-run.
//!
//! Duplicates while the first runs get the layer's in-flight answer (`409`, or the wait mode),
//! not the transactional wait.

mod ledger;

use crate::error::TxError;
use crate::store::SqlStore;
use async_trait::async_trait;
use ledger::{ClaimRow, Keep};
use oncely_core::{
    ClaimKind, ClaimOutcome, ClaimRequest, Clock, FencingToken, KeyStore, Maintenance, ReapReport,
    RecordKey, StoreError, StoredResponse, SystemClock,
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

impl<DB: SplitDatabase> Split<DB> {
    /// Keys in `keys` (which also serves the reaper and the completer through the `Split`),
    /// business transactions on `pool`; creates the progress ledger's table
    /// (`oncely_split_progress`) and its index in the business database if they do not exist.
    ///
    /// # Errors
    ///
    /// The database's error when the table cannot be created (it needs `CREATE` rights the first
    /// time).
    pub async fn connect(keys: Arc<dyn Maintenance>, pool: Pool<DB>) -> Result<Self, sqlx::Error> {
        DB::create_ledger(&pool).await?;
        Ok(Self { keys, pool })
    }
}

impl<DB: Database> Split<DB> {
    /// The business database's pool.
    pub fn pool(&self) -> &Pool<DB> {
        &self.pool
    }
}

/// Every key store operation is the key store's; the reaper's pass also deletes the ledger's
/// rows past their expiry (as many as `batch`; they are not counted in the report).
#[async_trait]
impl<DB: SplitDatabase> oncely_core::StoreWrapper for Split<DB> {
    type Inner = dyn Maintenance;
    fn inner(&self) -> Result<&dyn Maintenance, StoreError> {
        Ok(&*self.keys)
    }

    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let report = self.keys.reap(batch).await?;
        let now = SystemClock.now_millis();
        match DB::ledger_reap(&self.pool, now, batch).await {
            Ok(n) if n > 0 => tracing::debug!(rows = n, "split store: deleted expired ledger rows"),
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "split store: could not delete expired ledger rows")
            }
        }
        Ok(report)
    }
}

/// A database whose business writes a [`Split`] store commits: where its progress ledger lives
/// (the statements are sealed), and how to tell, before the `COMMIT`, that the transaction
/// would commit nothing. A split store's phases write nothing of the key
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
pub trait SplitDatabase: Database + ledger::LedgerSql {
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
impl SplitDatabase for sqlx::Postgres {
    async fn check_before_commit(conn: &mut sqlx::PgConnection) -> Result<(), TxError> {
        crate::store::postgres::ensure_open(conn).await
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl SplitDatabase for sqlx::Sqlite {
    async fn check_before_commit(_conn: &mut sqlx::SqliteConnection) -> Result<(), TxError> {
        Ok(())
    }
}

#[async_trait]
impl<DB: SplitDatabase> SqlStore for Split<DB> {
    type Database = DB;

    fn atomic(&self) -> bool {
        false
    }

    /// The claim in the key store, committed at once (a replay or any other answer ends here,
    /// without a business transaction), then a business transaction, the handler's first
    /// phase, whose first statement is the ledger row: the row takes the claim's token (which
    /// fences the business commits of the request's previous owner from this phase's commit
    /// on) and gives back what the same request committed before, if anything; a row of
    /// another request makes the claim a mismatch. A response found there is replayed
    /// (and handed to the key store; the transaction rolls back); a recovery point found there
    /// is where the request resumes.
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, DB>>), StoreError> {
        let claim = match self.keys.claim(req.clone()).await? {
            ClaimOutcome::Claimed(claim) => claim,
            // A replay, a duplicate in flight, a mismatch: nothing to do in the business
            // database.
            other => return Ok((other, None)),
        };
        let waited = std::time::Instant::now();
        let mut tx = match self.pool.begin().await {
            Ok(tx) => tx,
            Err(e) => {
                // No connection (or the database is down): nothing of the request ran, so the
                // key is free again.
                let _ = self.keys.release(&req.id, claim.token).await;
                return Err(StoreError::unavailable(e));
            }
        };
        // A wait for a connection (a small pool, busy) that took a third of the lease or more
        // may have let the lease lapse and another request take the key over: renew it before
        // the ledger write, and answer in flight if the key is another request's now.
        if waited.elapsed() >= req.lease / 3 {
            match self.keys.renew(&req.id, claim.token, req.lease).await {
                Ok(_) => {}
                Err(StoreError::Fenced) => {
                    tracing::info!(scope = %req.id.scope, key = %req.id.key, "split store: the claim's lease lapsed while it waited for a business connection, and another request took the key over");
                    let lease_expires_at = SystemClock
                        .now_millis()
                        .saturating_add(ledger::millis(req.lease));
                    return Ok((ClaimOutcome::InFlight { lease_expires_at }, None));
                }
                Err(e) => {
                    drop(tx);
                    let _ = self.keys.release(&req.id, claim.token).await;
                    return Err(e);
                }
            }
        }
        // A takeover or a first claim keeps what the same request committed; after the replay
        // window the request is a new one and keeps nothing.
        let keep = match claim.kind {
            ClaimKind::Takeover | ClaimKind::New => Keep::SameRequest,
            _ => Keep::Nothing,
        };
        let now = SystemClock.now_millis();
        let row = ClaimRow {
            id: &req.id,
            token: claim.token,
            fingerprint: &req.fingerprint,
            keep,
            now,
            replay_window: req.replay_window,
            expires_at: now
                .saturating_add(ledger::millis(req.lease))
                .saturating_add(ledger::millis(req.retention)),
            retention: req.retention,
        };
        // In the first phase's transaction: if that phase rolls back, the row is again what
        // the last committed phase left, whoever committed it, and the request resumes from
        // there. On PostgreSQL the row stays locked until the phase ends (a takeover waits for
        // the phase it takes over); on SQLite the phase holds the write lock from here.
        let found = match DB::ledger_claim(&mut tx, &row).await {
            Ok(Some(found)) => found,
            Ok(None) => {
                // The ledger holds another request on this key (the key store lost or evicted
                // its record, or released it): a mismatch, as the record would have answered.
                // The key store's record of this claim goes again; the row stays.
                drop(tx);
                tracing::warn!(scope = %req.id.scope, key = %req.id.key, "split store: the key store had no record of this key, but its progress ledger holds another request on it; answering a mismatch");
                let _ = self.keys.release(&req.id, claim.token).await;
                return Ok((ClaimOutcome::Mismatch, None));
            }
            Err(e) => {
                // Nothing of the request ran: the key is free again.
                drop(tx);
                let _ = self.keys.release(&req.id, claim.token).await;
                return Err(store_error(e));
            }
        };
        if let Some((response, completed_at)) = found.response {
            // The request finished: its response committed with its writes, and the key store
            // never got it (a crash, or the key store failing, in between). Nothing to write
            // in the business database: the transaction rolls back.
            drop(tx);
            tracing::info!(scope = %req.id.scope, key = %req.id.key, "split store: the response was committed in the progress ledger but not in the key store; replaying it, and storing it there now");
            if let Err(e) = self
                .keys
                .complete(&req.id, claim.token, response.clone(), req.retention)
                .await
            {
                tracing::warn!(scope = %req.id.scope, key = %req.id.key, error = %e, "split store: could not store the ledger's response in the key store; the next claim replays it from the ledger again");
            }
            return Ok((
                ClaimOutcome::Replay {
                    response,
                    completed_at,
                },
                None,
            ));
        }
        // The ledger says where the request stands, never the key store, whose step may be one
        // whose transaction did not commit.
        Ok((
            ClaimOutcome::Claimed(claim.with_recovery_point(found.recovery_point)),
            Some(tx),
        ))
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

    /// The step into the ledger row (fenced by the token), then into the key store (which
    /// renews the lease), both before the business commit: if the business commit does not
    /// happen, the ledger does not have the step either, and a takeover resumes where the ledger
    /// says.
    async fn checkpoint_in(
        &self,
        conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        _request: Option<&[u8]>,
    ) -> Result<(), TxError> {
        // The end of the renewed lease; the row is kept the claim's retention after it.
        let expires_at = SystemClock
            .now_millis()
            .saturating_add(ledger::millis(lease));
        if !DB::ledger_checkpoint(conn, id, token, recovery_point, expires_at).await? {
            return Err(TxError::Fenced);
        }
        // The claim stored the request in the key store already (the claimer defers it only
        // on atomic stores).
        Ok(self
            .keys
            .checkpoint(id, token, recovery_point, lease)
            .await?)
    }

    /// The response into the ledger row, fenced by the token: it commits with the business
    /// writes. The key store gets it after the commit ([`Tx::commit`](crate::Tx::commit)).
    async fn complete_in(
        &self,
        conn: &mut DB::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        _hot: bool,
    ) -> Result<(), TxError> {
        let now = SystemClock.now_millis();
        let expires_at = now.saturating_add(ledger::millis(retention));
        if !DB::ledger_complete(conn, id, token, response, now, expires_at).await? {
            return Err(TxError::Fenced);
        }
        Ok(())
    }

    async fn commit(&self, mut tx: Transaction<'static, DB>) -> Result<(), TxError> {
        DB::check_before_commit(&mut tx).await?;
        tx.commit().await.map_err(TxError::from)
    }
}

/// A ledger error as a claim answers it.
fn store_error(e: TxError) -> StoreError {
    match e {
        TxError::Store(e) => e,
        TxError::Fenced => StoreError::Fenced,
        other => StoreError::unavailable(other),
    }
}
