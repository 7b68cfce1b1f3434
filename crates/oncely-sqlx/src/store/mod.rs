//! [`SqlStore`]: a key store whose table lives in the business database, so that its
//! operations can run inside the handler's own transaction; its implementations for
//! [`SqliteStore`](oncely_sqlite::SqliteStore), [`PostgresStore`](oncely_postgres::PostgresStore)
//! and [`MySqlStore`](oncely_mysql::MySqlStore).

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

use crate::error::TxError;
use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, RecordKey, StoreError, StoredResponse,
};
use sqlx::{Database, Transaction};
use std::time::Duration;

/// A [`KeyStore`] on an sqlx database whose operations can also run inside a transaction the
/// caller holds. Implemented for [`SqliteStore`](oncely_sqlite::SqliteStore) (feature
/// `sqlite`), [`PostgresStore`](oncely_postgres::PostgresStore) (feature `postgres`),
/// [`MySqlStore`](oncely_mysql::MySqlStore) (feature `mysql`, MySQL 8 and MariaDB 10.6+) and
/// [`Split`](crate::Split); the
/// transactional machinery of this crate ([`Tx`](crate::Tx), [`Between`](crate::Between),
/// [`TransactionalClaimer`](crate::TransactionalClaimer)) is written once over this trait.
///
/// A request's life, in these operations: [`claim_tx`](SqlStore::claim_tx) opens the first
/// phase's transaction with the claim in it; each phase ends with
/// [`checkpoint_in`](SqlStore::checkpoint_in) or [`complete_in`](SqlStore::complete_in) and
/// then [`commit`](SqlStore::commit), or is dropped ([`rollback_abandoned`](SqlStore::rollback_abandoned));
/// a later phase begins with [`begin_phase`](SqlStore::begin_phase).
///
/// Every owner write is conditional on the fencing token and fails with [`TxError::Fenced`]
/// when the token is stale or the record is no longer in flight. A phase write also refuses a
/// transaction that ended behind the phase's back ([`TxError::TransactionEnded`]: the handler
/// ran `COMMIT` or `ROLLBACK` through its [`Tx`](crate::Tx)) and one that a failed statement
/// of the handler aborted ([`TxError::Database`]), so that nothing is recorded as done for
/// writes that will not commit (docs/DESIGN.md, "What the layer checks after the handler").
#[async_trait]
pub trait SqlStore: KeyStore + Clone {
    /// The sqlx database (`sqlx::Sqlite`, `sqlx::Postgres`, `sqlx::MySql`).
    type Database: Database;

    /// Whether the store's operations commit with the caller's transaction (`true`, the
    /// default: the key table is in the business database). [`Split`](crate::Split) answers
    /// `false`: its claims and checkpoints commit at once in another store, and completions
    /// are written after the business commit.
    fn atomic(&self) -> bool {
        true
    }

    /// The claim of [`TransactionalClaimer`](crate::TransactionalClaimer): answers without a
    /// write transaction when the shared rule ([`oncely_core::decide`]) needs no write, else
    /// begins the first phase's transaction and claims in it. Returns the outcome and, exactly
    /// when it is [`ClaimOutcome::Claimed`], the open transaction holding the claim.
    ///
    /// SQLite (`SqliteStore::claim_tx`): a read that takes no lock, then `BEGIN IMMEDIATE`
    /// (the write lock) and the insert only when there is no record, in two hops to the
    /// connection's worker thread. PostgreSQL (`PostgresStore::claim_tx`) and MySQL
    /// (`MySqlStore::claim_tx`): `BEGIN` and the insert first (a read before it would cost
    /// every first execution a round trip); MySQL begins and claims again when InnoDB rolled
    /// the transaction back as a deadlock's victim.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, Self::Database>>), StoreError>;

    /// Begins a later phase ([`Between::begin`](crate::Between::begin)): a new transaction,
    /// opened by the store's fencing step. Whatever that step does, the phase's closing write
    /// ([`checkpoint_in`](SqlStore::checkpoint_in) or [`complete_in`](SqlStore::complete_in))
    /// carries the fencing token, so a phase of a request that lost its claim never commits.
    ///
    /// SQLite: `BEGIN IMMEDIATE` and a conditional renewal of the lease, which also fails fast
    /// when the claim was lost (the phase holds the one write lock from its start anyway).
    /// Split stores: the renewal, committed at once in the key store. PostgreSQL and MySQL:
    /// `BEGIN` alone, so that the phase takes no row lock on the record for its whole duration, which
    /// would make the layer's heartbeat wait for the phase to end while the lease lapsed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] or [`StoreError::Unavailable`].
    async fn begin_phase(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Transaction<'static, Self::Database>, StoreError>;

    /// Records a recovery point (and renews the lease) in the phase's transaction on `conn`,
    /// after checking that it is still the phase's. `request`, if given, is the encoded
    /// [`StoredRequest`](oncely_core::StoredRequest) of the request, stored with it unless the
    /// record has one: on an [`atomic`](SqlStore::atomic) store the claimer leaves it out of
    /// the claim (nobody can read the record before its transaction commits, and a
    /// single-phase request clears it again at completion) and hands it to the first
    /// checkpoint, from which on the completer may need it. A non-atomic store stores it at
    /// the claim and is always given `None`.
    ///
    /// # Errors
    ///
    /// [`TxError::Fenced`], [`TxError::TransactionEnded`], [`TxError::Database`] (the handler's
    /// failed statement aborted the transaction) or [`TxError::Store`].
    async fn checkpoint_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), TxError>;

    /// Stores the final response in the phase's transaction on `conn` (the record replays it
    /// from the commit on), after checking that it is still the phase's. `hot` is true for
    /// the transaction that carries the claim (a single-phase handler's only commit), where
    /// PostgreSQL and MySQL skip the check's round trip unless the write was fenced (see
    /// [`TxError::TransactionEnded`]).
    ///
    /// # Errors
    ///
    /// As [`checkpoint_in`](SqlStore::checkpoint_in).
    async fn complete_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        hot: bool,
    ) -> Result<(), TxError>;

    /// [`complete_in`](SqlStore::complete_in) on the phase's transaction, then
    /// [`commit`](SqlStore::commit): the last phase's end ([`Tx::commit`](crate::Tx::commit)).
    /// PostgreSQL sends the two in one message, one round trip
    /// (`PostgresStore::complete_and_commit_in`; docs/DESIGN.md, "The completion goes out with
    /// the commit"); the default runs them one after the other.
    ///
    /// # Errors
    ///
    /// As [`complete_in`](SqlStore::complete_in) and [`commit`](SqlStore::commit); nothing
    /// commits on any of them (unless the connection was lost during the commit itself).
    async fn complete_and_commit(
        &self,
        mut tx: Transaction<'static, Self::Database>,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
        hot: bool,
    ) -> Result<(), TxError> {
        self.complete_in(&mut tx, id, token, response, retention, hot)
            .await?;
        self.commit(tx).await
    }

    /// Commits a phase's transaction. A `COMMIT` must never pass for writes that did not
    /// commit: PostgreSQL answers the `COMMIT` of a transaction that a failed statement aborted
    /// with `ROLLBACK` and no error, and sqlx does not read the command tag. On an
    /// [`atomic`](SqlStore::atomic) store the phase's own write ran just before in the same
    /// transaction and would have failed in an aborted one, so the default commits as it is;
    /// a store whose phases write nothing in the transaction ([`Split`](crate::Split)) checks
    /// the transaction first.
    ///
    /// # Errors
    ///
    /// [`TxError::Database`] when the commit failed or the transaction had been aborted;
    /// [`TxError::TransactionEnded`] when it had ended behind the phase's back.
    async fn commit(&self, tx: Transaction<'static, Self::Database>) -> Result<(), TxError> {
        tx.commit().await.map_err(TxError::from)
    }

    /// Rolls back the transaction of a phase that the handler dropped unfinished (an error, or
    /// an early return), and says whether it had ended behind the phase's back: the handler ran
    /// `COMMIT` or `ROLLBACK` through its `Tx`, so what it wrote may have committed (with the
    /// claim, in the first phase). Default: rolls back and says `false` (not checked). SQLite:
    /// the rollback itself fails with "no transaction is active", at no extra hop. PostgreSQL:
    /// a check first, one round trip on this path only. MySQL: the errors of the handler's last
    /// statement, then a check (up to two round trips, on this path only), so that a
    /// transaction the server rolled back as a deadlock's victim is not taken for one the
    /// handler ended.
    async fn rollback_abandoned(
        &self,
        tx: Transaction<'static, Self::Database>,
        id: &RecordKey,
    ) -> bool {
        let _ = id;
        let _ = tx.rollback().await;
        false
    }
}

/// A phase write's [`StoreError`] as the phase answers it: PostgreSQL's "current transaction is
/// aborted, commands ignored until end of transaction block" (SQLSTATE `25P02`: a statement of
/// the handler failed, the handler ignored it and went on) is the handler's failure, not the key
/// store's, so it is [`TxError::Database`] (`500 database_error`, not retryable), never a store
/// outage (`503`, retryable). The error that aborted the transaction is gone by then (only the
/// handler's `?` on its statement keeps it, with its own answer: `503` for a transient one,
/// `422` for a refused value), so the answer cannot say whether a retry would succeed.
pub(crate) fn phase_error(e: StoreError) -> TxError {
    match e {
        StoreError::Unavailable(source) if aborted_by_the_handler(&*source) => {
            match source.downcast::<sqlx::Error>() {
                Ok(db) => TxError::Database(*db),
                Err(source) => StoreError::Unavailable(source).into(),
            }
        }
        other => other.into(),
    }
}

/// Whether a store error is PostgreSQL's SQLSTATE `25P02` (see [`phase_error`]).
fn aborted_by_the_handler(source: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    matches!(
        source.downcast_ref::<sqlx::Error>(),
        Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("25P02")
    )
}
