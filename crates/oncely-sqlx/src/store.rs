//! [`SqlStore`]: a key store whose table lives in the business database, so that its
//! operations can run inside the handler's own transaction.

use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, RecordKey, StoreError, StoredResponse,
    UnixMillis,
};
use sqlx::{Database, Transaction};
use std::time::Duration;

/// A [`KeyStore`] on an sqlx database whose operations can also run on a connection the
/// caller holds (inside its transaction). Implemented for
/// [`SqliteStore`](oncely_sqlite::SqliteStore) (feature `sqlite`) and
/// [`PostgresStore`](oncely_postgres::PostgresStore) (feature `postgres`); the transactional
/// machinery of this crate is written once over this trait.
///
/// No method commits: the caller's transaction decides. Every owner write is conditional on the
/// fencing token and returns [`StoreError::Fenced`] when the token is stale or the record is no
/// longer in flight.
#[async_trait]
pub trait SqlStore: KeyStore + Clone {
    /// The sqlx database (`sqlx::Sqlite`, `sqlx::Postgres`).
    type Database: Database;

    /// Whether the store's operations commit with the caller's transaction (`true`, the
    /// default: the key table is in the business database). [`Split`](crate::Split) answers
    /// `false`: its claims and checkpoints commit at once in another store, and completions
    /// are written after the business commit.
    fn atomic(&self) -> bool {
        true
    }

    /// Begins the transaction a claim or a phase runs in (SQLite: `BEGIN IMMEDIATE`, which
    /// takes the write lock at once; PostgreSQL: `BEGIN`, `READ COMMITTED` unless the server's
    /// default says otherwise).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection or lock could be had in time.
    async fn begin(&self) -> Result<Transaction<'static, Self::Database>, StoreError>;

    /// Answers from a read that takes no lock when the shared rule needs no write (replay,
    /// mismatch, in flight); `None` when a claim is needed, or when the store prefers to decide
    /// inside the transaction (PostgreSQL, where the read would cost a round trip on every
    /// first execution).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn answer_without_lock(
        &self,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError>;

    /// The claim of [`TransactionalClaimer`](crate::TransactionalClaimer): answers without a
    /// write transaction when the shared rule needs no write, else begins the transaction and
    /// claims in it. Returns the outcome and, exactly when it is [`ClaimOutcome::Claimed`], the
    /// open transaction holding the claim. The default runs
    /// [`answer_without_lock`](SqlStore::answer_without_lock), [`begin`](SqlStore::begin) and
    /// [`claim_in`](SqlStore::claim_in); SQLite's does the same on one connection in two hops
    /// to its worker thread (`SqliteStore::claim_tx`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, Self::Database>>), StoreError> {
        if let Some(answer) = self.answer_without_lock(req).await? {
            return Ok((answer, None));
        }
        let mut tx = self.begin().await?;
        let outcome = self.claim_in(&mut tx, req).await?;
        match outcome {
            ClaimOutcome::Claimed(_) => Ok((outcome, Some(tx))),
            // Nothing was written: dropping `tx` rolls the empty transaction back.
            other => Ok((other, None)),
        }
    }

    /// Claims inside the caller's transaction (see the stores' `claim_in`).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    async fn claim_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError>;

    /// The fencing write that opens a phase: renews the lease to now plus `lease`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] or [`StoreError::Unavailable`].
    async fn renew_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError>;

    /// Records a recovery point (and renews the lease).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] or [`StoreError::Unavailable`].
    async fn checkpoint_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError>;

    /// Stores the final response (the record replays it from the commit on).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] or [`StoreError::Unavailable`].
    async fn complete_in(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError>;
}

/// Implements [`SqlStore`] by delegating to the store's inherent `*_in` methods.
macro_rules! delegate {
    ($store:ty, $db:ty $(, $extra:item)*) => {
        #[async_trait]
        impl SqlStore for $store {
            type Database = $db;
            $($extra)*

            async fn begin(&self) -> Result<Transaction<'static, $db>, StoreError> {
                self.begin_tx().await
            }

            async fn answer_without_lock(
                &self,
                req: &ClaimRequest,
            ) -> Result<Option<ClaimOutcome>, StoreError> {
                self.answer_before_claim(req).await
            }

            async fn claim_in(
                &self,
                conn: &mut <$db as Database>::Connection,
                req: &ClaimRequest,
            ) -> Result<ClaimOutcome, StoreError> {
                <$store>::claim_in(self, conn, req).await
            }

            async fn renew_in(
                &self,
                conn: &mut <$db as Database>::Connection,
                id: &RecordKey,
                token: FencingToken,
                lease: Duration,
            ) -> Result<UnixMillis, StoreError> {
                <$store>::renew_in(self, conn, id, token, lease).await
            }

            async fn checkpoint_in(
                &self,
                conn: &mut <$db as Database>::Connection,
                id: &RecordKey,
                token: FencingToken,
                recovery_point: &str,
                lease: Duration,
            ) -> Result<(), StoreError> {
                <$store>::checkpoint_in(self, conn, id, token, recovery_point, lease).await
            }

            async fn complete_in(
                &self,
                conn: &mut <$db as Database>::Connection,
                id: &RecordKey,
                token: FencingToken,
                response: &StoredResponse,
                retention: Duration,
            ) -> Result<(), StoreError> {
                <$store>::complete_in(self, conn, id, token, response, retention).await
            }
        }
    };
}

#[cfg(feature = "sqlite")]
delegate!(
    oncely_sqlite::SqliteStore,
    sqlx::Sqlite,
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, sqlx::Sqlite>>), StoreError> {
        oncely_sqlite::SqliteStore::claim_tx(self, req).await
    }
);
#[cfg(feature = "postgres")]
delegate!(oncely_postgres::PostgresStore, sqlx::Postgres);
