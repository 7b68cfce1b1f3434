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
/// [`SqliteStore`](oncely_sqlite::SqliteStore) (feature `sqlite`),
/// [`PostgresStore`](oncely_postgres::PostgresStore) (feature `postgres`) and
/// [`MySqlStore`](oncely_mysql::MySqlStore) (feature `mysql`, MySQL 8 and MariaDB 10.6+); the
/// transactional machinery of this crate is written once over this trait.
///
/// No method commits: the caller's transaction decides. Every owner write is conditional on the
/// fencing token and returns [`StoreError::Fenced`] when the token is stale or the record is no
/// longer in flight.
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

    /// Begins the transaction a claim or a phase runs in (SQLite: `BEGIN IMMEDIATE`, which
    /// takes the write lock at once; PostgreSQL: `BEGIN`, `READ COMMITTED` unless the server's
    /// default says otherwise; MySQL: `BEGIN` at the session's level, `REPEATABLE READ` unless
    /// configured otherwise, with a 4-second `innodb_lock_wait_timeout` and the savepoint that
    /// marks the transaction).
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
    /// to its worker thread (`SqliteStore::claim_tx`); PostgreSQL's runs the store's own
    /// `begin_tx` and `claim_in` directly (it never answers without the lock).
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

    /// The fencing write: renews the lease to now plus `lease` on `conn` (inside the caller's
    /// transaction), if the record is still in flight with `token`.
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

    /// What a later phase runs first, on its new transaction ([`Between::begin`](crate::Between::begin)).
    /// Whatever it does, the phase's closing write ([`SqlStore::checkpoint_in`] or
    /// [`SqlStore::complete_in`]) carries the fencing token, so a phase of a request that lost
    /// its claim never commits.
    ///
    /// Default: [`SqlStore::renew_in`], a conditional renewal that also fails fast when the
    /// claim was lost (SQLite, whose phase holds the one write lock from its `BEGIN IMMEDIATE`
    /// anyway, and split stores, whose renewal commits at once in the key store). PostgreSQL
    /// and MySQL: nothing, so that the phase takes no row lock on the record for its whole
    /// duration, which would make the layer's heartbeat wait for the phase to end while the
    /// lease lapsed.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] or [`StoreError::Unavailable`].
    async fn open_phase(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.renew_in(conn, id, token, lease).await.map(drop)
    }

    /// Records a recovery point (and renews the lease). `request`, if given, is the encoded
    /// [`StoredRequest`](oncely_core::StoredRequest) of the request, stored with it unless the
    /// record has one: on an [`atomic`](SqlStore::atomic) store the claimer leaves it out of
    /// the claim (nobody can read the record before its transaction commits, and a
    /// single-phase request clears it again at completion) and hands it to the first
    /// checkpoint, from which on the completer may need it. A non-atomic store stores it at
    /// the claim and is always given `None`.
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
        request: Option<&[u8]>,
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

    /// Whether the transaction [`SqlStore::begin`] opened for `id` is still open on `conn`
    /// (asked only where [`SqlStore::checks_still_open`] says so):
    /// `false` when it ended behind the phase's back (the handler ran `COMMIT` or `ROLLBACK`
    /// through the [`Tx`](crate::Tx), or the database rolled it back by itself), so that what
    /// the phase writes next would not commit with its business writes. Asked before a phase
    /// records its recovery point or its response. `hot` is true for the commit of the
    /// transaction that carries the claim (a single-phase handler's only commit).
    ///
    /// Default: `true`. SQLite keeps the default: every transaction of the store opens with the
    /// savepoint `oncely_tx` (`BEGIN IMMEDIATE; SAVEPOINT oncely_tx`, or the claim's own
    /// hand-over), and the phase's own write releases it in the same statement, so the check
    /// rides in that write, on the hot path too, at no extra hop (see
    /// [`SqlStore::ended_behind`]). PostgreSQL: one `SELECT transaction_timestamp() <> statement_timestamp()` (is this
    /// statement part of a transaction that began earlier?), a round trip, so it is skipped (`true`) when `hot` (sqlx keeps the
    /// server's transaction status private, and no statement of the hot path can carry the
    /// check) except after a fenced completion, where it tells a handler's own `ROLLBACK` from
    /// a takeover. MySQL: the same, with the transaction's savepoint
    /// (`MySqlStore::transaction_is_open`, a round trip).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`].
    async fn still_open(
        &self,
        conn: &mut <Self::Database as Database>::Connection,
        id: &RecordKey,
        hot: bool,
    ) -> Result<bool, StoreError> {
        let _ = (conn, id, hot);
        Ok(true)
    }

    /// Whether a phase calls [`SqlStore::still_open`] for this `hot`: when `false`, the phase
    /// skips the call (and its boxed future) and takes the transaction as open. Default:
    /// `true`, so a store that overrides `still_open` is always asked. SQLite: `false` (its
    /// check rides in the phase's own write); PostgreSQL and MySQL: `!hot` (their `still_open`
    /// answers `true` without asking when `hot`).
    fn checks_still_open(&self, hot: bool) -> bool {
        let _ = hot;
        true
    }

    /// Rolls back the transaction of a phase that the handler dropped unfinished (an error, or
    /// an early return), and says whether it had ended behind the phase's back: the handler ran
    /// `COMMIT` or `ROLLBACK` through its `Tx`, so what it wrote may have committed (with the
    /// claim, in the first phase). Default: rolls back and says `false` (not checked). SQLite:
    /// the rollback itself fails with "no transaction is active", at no extra hop. PostgreSQL:
    /// [`SqlStore::still_open`] first, one round trip on this path only. MySQL: the errors of
    /// the last statement, then the savepoint (`MySqlStore::ended_by_its_owner`), up to two
    /// round trips on this path only, so that a transaction the server rolled back as a
    /// deadlock's victim is not taken for one the handler ended.
    async fn rollback_abandoned(
        &self,
        tx: Transaction<'static, Self::Database>,
        id: &RecordKey,
    ) -> bool {
        let _ = id;
        let _ = tx.rollback().await;
        false
    }

    /// Whether `error`, from [`SqlStore::checkpoint_in`] or [`SqlStore::complete_in`], says
    /// that the transaction ended behind the phase's back (a store whose writes carry the
    /// check themselves). Default: `false`. SQLite: its phase writes release the savepoint
    /// the transaction opened with, in the same statement.
    fn ended_behind(&self, error: &StoreError) -> bool {
        let _ = error;
        false
    }
}

/// Implements [`SqlStore`] by delegating to the store's inherent `*_in` methods (`$checkpoint`
/// and `$complete` for the phase writes), plus `$extra` items (the transaction guard).
macro_rules! delegate {
    ($store:ty, $db:ty, $checkpoint:ident, $complete:ident $(, $extra:item)*) => {
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
                request: Option<&[u8]>,
            ) -> Result<(), StoreError> {
                <$store>::$checkpoint(self, conn, id, token, recovery_point, lease, request)
                    .await
            }

            async fn complete_in(
                &self,
                conn: &mut <$db as Database>::Connection,
                id: &RecordKey,
                token: FencingToken,
                response: &StoredResponse,
                retention: Duration,
            ) -> Result<(), StoreError> {
                <$store>::$complete(self, conn, id, token, response, retention).await
            }
        }
    };
}

#[cfg(feature = "sqlite")]
delegate!(
    oncely_sqlite::SqliteStore,
    sqlx::Sqlite,
    checkpoint_guarded_in,
    complete_guarded_in,
    // The check rides in the phase's own write (`ended_behind`): nothing to ask first.
    fn checks_still_open(&self, _hot: bool) -> bool {
        false
    },
    fn ended_behind(&self, error: &StoreError) -> bool {
        matches!(
            error,
            StoreError::Unavailable(e)
                if matches!(
                    e.downcast_ref::<oncely_sqlite::SqliteStoreError>(),
                    Some(oncely_sqlite::SqliteStoreError::TransactionEnded)
                )
        )
    },
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, sqlx::Sqlite>>), StoreError> {
        oncely_sqlite::SqliteStore::claim_tx(self, req).await
    },
    async fn rollback_abandoned(
        &self,
        tx: Transaction<'static, sqlx::Sqlite>,
        _id: &RecordKey,
    ) -> bool {
        // The handler's own COMMIT or ROLLBACK left no transaction for sqlx's to end. The
        // connection's count of open transactions then stays at one, and the store closes it
        // at its next acquire (`SqliteStore`'s pool never hands it out again).
        matches!(
            tx.rollback().await,
            Err(sqlx::Error::Database(e)) if e.message().contains("no transaction is active")
        )
    }
);
#[cfg(feature = "postgres")]
delegate!(
    oncely_postgres::PostgresStore,
    sqlx::Postgres,
    checkpoint_in,
    complete_in,
    // The default's steps, with the store's inherent methods: no boxed future for the
    // lock-free answer (always none on PostgreSQL), the begin or the claim.
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, sqlx::Postgres>>), StoreError> {
        let mut tx = self.begin_tx().await?;
        let outcome = oncely_postgres::PostgresStore::claim_in(self, &mut tx, req).await?;
        match outcome {
            ClaimOutcome::Claimed(_) => Ok((outcome, Some(tx))),
            // Nothing was written: dropping `tx` rolls the empty transaction back.
            other => Ok((other, None)),
        }
    },
    fn checks_still_open(&self, hot: bool) -> bool {
        !hot
    },
    // No statement: a renewal at the phase's start would hold the record's row lock until the
    // phase ends, and the heartbeat's renewals would wait for it while the lease lapsed. The
    // phase's closing write is fenced, and `still_open` needs no write of the record.
    async fn open_phase(
        &self,
        _conn: &mut sqlx::PgConnection,
        _id: &RecordKey,
        _token: FencingToken,
        _lease: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    },
    async fn still_open(
        &self,
        conn: &mut sqlx::PgConnection,
        id: &RecordKey,
        hot: bool,
    ) -> Result<bool, StoreError> {
        postgres_guard::still_open(conn, id, hot).await
    },
    async fn rollback_abandoned(
        &self,
        mut tx: Transaction<'static, sqlx::Postgres>,
        id: &RecordKey,
    ) -> bool {
        // An aborted transaction (a statement failed) refuses the check: it is the phase's
        // own, and rolls back.
        let open = postgres_guard::still_open(&mut tx, id, false).await;
        // Queued: it goes out with the pool's release ping, no round trip of its own.
        drop(tx);
        matches!(open, Ok(false))
    }
);

#[cfg(feature = "mysql")]
delegate!(
    oncely_mysql::MySqlStore,
    sqlx::MySql,
    checkpoint_in,
    complete_in,
    // The store's own: begin and claim, run again when the transaction was a deadlock's
    // victim (it never answers without the lock).
    async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, sqlx::MySql>>), StoreError> {
        oncely_mysql::MySqlStore::claim_tx(self, req).await
    },
    fn checks_still_open(&self, hot: bool) -> bool {
        !hot
    },
    // No statement, as on PostgreSQL: a renewal at the phase's start would hold the record's
    // row lock until the phase ends, and the heartbeat's renewals would wait for it.
    async fn open_phase(
        &self,
        _conn: &mut sqlx::MySqlConnection,
        _id: &RecordKey,
        _token: FencingToken,
        _lease: Duration,
    ) -> Result<(), StoreError> {
        Ok(())
    },
    async fn still_open(
        &self,
        conn: &mut sqlx::MySqlConnection,
        _id: &RecordKey,
        hot: bool,
    ) -> Result<bool, StoreError> {
        if hot {
            return Ok(true);
        }
        self.transaction_is_open(conn).await
    },
    async fn rollback_abandoned(
        &self,
        mut tx: Transaction<'static, sqlx::MySql>,
        _id: &RecordKey,
    ) -> bool {
        let ended = self.ended_by_its_owner(&mut tx).await;
        let _ = tx.rollback().await;
        ended
    }
);

/// PostgreSQL: whether the statement runs inside the transaction the phase began. In a
/// transaction block, `transaction_timestamp()` is the time of its first statement (the
/// `BEGIN`, sent and answered before anything else of the phase), and `statement_timestamp()`
/// the time this statement arrived, at least one round trip later; after a `COMMIT` or
/// `ROLLBACK` behind the phase's back the check runs as a transaction of its own, where the two
/// are the same value (PostgreSQL's documentation, "Current Date/Time"), when the check is sent as
/// a simple query. Compared with `<>`,
/// not `<`, so that a system clock stepped back between the two cannot make an open
/// transaction look ended. In a transaction that a failed statement aborted, the
/// check itself fails with `25P02`, which the phase reads as the handler's failure. It reads no
/// table, so it holds no lock and needs no write of the record earlier in the phase.
#[cfg(feature = "postgres")]
mod postgres_guard {
    use oncely_core::{RecordKey, StoreError};
    use sqlx::PgConnection;

    pub(super) async fn still_open(
        conn: &mut PgConnection,
        _id: &RecordKey,
        hot: bool,
    ) -> Result<bool, StoreError> {
        if hot {
            return Ok(true);
        }
        // A simple query (one `Query` message): in the extended protocol the statement's
        // timestamp is taken again at its `Execute` message, after the implicit transaction
        // began at its `Bind`, so the two would differ even outside a transaction block.
        let row = sqlx::raw_sql("SELECT transaction_timestamp() <> statement_timestamp()")
            .fetch_one(conn)
            .await
            .map_err(StoreError::unavailable)?;
        sqlx::Row::try_get::<bool, _>(&row, 0).map_err(StoreError::unavailable)
    }
}
