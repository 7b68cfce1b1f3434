//! Transactional mode: a [`Phase`] is one SQLite transaction that carries an atomic phase of
//! the request that owns a key, so that the handler's business writes, the recovery point and
//! (in the last phase) the stored response commit together.
//!
//! ```no_run
//! # async fn demo(
//! #     store: oncely_sqlite::SqliteStore,
//! #     id: oncely_core::RecordKey,
//! #     token: oncely_core::FencingToken,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use oncely_core::StoredResponse;
//! use std::time::Duration;
//!
//! // The request owns `id` with `token` (from a claim). One phase:
//! let mut phase = store.begin_phase(&id, token, Duration::from_secs(30)).await?;
//! sqlx::query("INSERT INTO payments (id, amount) VALUES (?1, ?2)")
//!     .bind("pay_1")
//!     .bind(100_i64)
//!     .execute(&mut **phase.tx())
//!     .await?;
//! let response = StoredResponse::new(
//!     201,
//!     vec![("content-type".into(), b"application/json".to_vec())],
//!     br#"{"id":"pay_1"}"#.to_vec(),
//! );
//! // The payment row and the stored response commit as one unit (case S8).
//! phase.complete(response, Duration::from_secs(72 * 3600)).await?;
//! # Ok(())
//! # }
//! ```
//!
//! # What SQLite makes of it
//!
//! A phase's transaction starts with `BEGIN IMMEDIATE`, so it holds SQLite's single write lock
//! from its first statement (the fencing write) to its commit: no takeover can interleave, and
//! also **no other write to the database file** can run meanwhile. Other claims, heartbeats and
//! business writes wait for it, for at most [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT) (5 seconds),
//! and then fail with [`StoreError::Unavailable`] (`503`). Keep phases short: do outside calls
//! (a card processor, an e-mail provider) *between* phases, never inside one. Replays and
//! in-flight answers are plain reads and are not blocked (WAL mode).
//!
//! A heartbeat `renew` for the phase's own key waits for the phase too; the phase renewed the
//! lease when it began, so a phase shorter than its lease needs no heartbeat.

use crate::error::map_sqlx;
use crate::sql;
use crate::store::{SqliteStore, SqliteStoreError};
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{Clock, FencingToken, RecordKey, StoreError, StoredResponse, UnixMillis};
use sqlx::{Sqlite, SqlitePool, Transaction};
use std::sync::Arc;
use std::time::Duration;

impl SqliteStore {
    /// Begins a database transaction that carries one atomic phase of the request owned by
    /// `token`.
    ///
    /// The transaction starts with `BEGIN IMMEDIATE` (taking SQLite's write lock, waiting up to
    /// [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT)); its first statement is the conditional fencing
    /// write, which renews the lease to now plus `lease` (never less than 1 millisecond)
    /// `WHERE scope AND key AND token = token AND state = 'in_flight'`. The write lock is then
    /// held until the phase ends, so a takeover cannot interleave.
    ///
    /// Dropping the [`Phase`] without calling one of its finishing methods rolls the transaction
    /// back and leaves the claim in flight (a retry takes over after the lease).
    ///
    /// # Errors
    ///
    /// - [`StoreError::Fenced`]: `token` is stale or the record is no longer in flight; nothing
    ///   was written.
    /// - [`StoreError::Unavailable`]: the write lock was not free within the busy timeout, or
    ///   the database failed.
    pub async fn begin_phase(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Phase, StoreError> {
        let mut tx = self
            .pool()
            .begin_with(sql::BEGIN_IMMEDIATE)
            .await
            .map_err(map_sqlx)?;
        let clock = self.clock().clone();
        let lease_expires_at = clock.now_millis().saturating_add(lease_millis(lease));
        let rows = sqlx::query(sql::RENEW)
            .bind(lease_expires_at)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        if rows != 1 {
            // Dropping `tx` rolls the (empty) transaction back.
            return Err(StoreError::Fenced);
        }
        sqlx::query(sql::SAVEPOINT_PHASE)
            .execute(&mut *tx)
            .await
            .map_err(map_sqlx)?;
        Ok(Phase {
            tx,
            id: id.clone(),
            token,
            lease,
            lease_expires_at,
            clock,
            pool: self.pool().clone(),
        })
    }
}

/// One atomic phase of an owned request: an open SQLite transaction whose first statement was
/// the fencing write. Made by [`SqliteStore::begin_phase`].
///
/// Finish it with exactly one of [`Phase::checkpoint`], [`Phase::complete`] or
/// [`Phase::rollback_and_release`]. Dropping it instead rolls the transaction back (sqlx does)
/// and leaves the claim in flight.
///
/// Do not run `COMMIT`, `ROLLBACK` or `RELEASE` on the phase's transaction yourself; if the
/// transaction ends early (that, or SQLite rolling it back after an error), the finishing
/// method notices and records nothing ([`SqliteStoreError::PhaseTransactionLost`]).
pub struct Phase {
    tx: Transaction<'static, Sqlite>,
    id: RecordKey,
    token: FencingToken,
    lease: Duration,
    lease_expires_at: UnixMillis,
    clock: Arc<dyn Clock>,
    pool: SqlitePool,
}

impl std::fmt::Debug for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phase")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("lease_expires_at", &self.lease_expires_at)
            .finish_non_exhaustive()
    }
}

impl Phase {
    /// The transaction, for the handler's business writes:
    /// `sqlx::query(..).execute(&mut **phase.tx())`. Nested `tx.begin()` savepoints are fine.
    pub fn tx(&mut self) -> &mut Transaction<'static, Sqlite> {
        &mut self.tx
    }

    /// The `(scope, key)` this phase belongs to.
    pub fn id(&self) -> &RecordKey {
        &self.id
    }

    /// The fencing token this phase writes with.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// When the lease renewed by [`SqliteStore::begin_phase`] lapses (epoch milliseconds).
    pub fn lease_expires_at(&self) -> UnixMillis {
        self.lease_expires_at
    }

    /// Records `recovery_point` (and renews the lease to now plus the phase's lease) in the same
    /// transaction, and commits: the business writes and the recovery point are one unit.
    ///
    /// # Errors
    ///
    /// - [`StoreError::Fenced`]: the record is no longer in flight with this token; the
    ///   transaction is rolled back, business writes included.
    /// - [`StoreError::Unavailable`]: the commit failed (nothing committed), or the transaction
    ///   had already ended ([`SqliteStoreError::PhaseTransactionLost`]).
    pub async fn checkpoint(mut self, recovery_point: &str) -> Result<(), StoreError> {
        self.seal().await?;
        let until = self
            .clock
            .now_millis()
            .saturating_add(lease_millis(self.lease));
        let rows = sqlx::query(sql::CHECKPOINT)
            .bind(recovery_point)
            .bind(until)
            .bind(self.id.scope.as_str())
            .bind(self.id.key.as_str())
            .bind(self.token.0)
            .execute(&mut *self.tx)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        if rows != 1 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map_sqlx)
    }

    /// Stores the final response (state complete, kept for `retention` from now) in the same
    /// transaction and commits: the business writes and the stored response commit together
    /// (case S8), so a retry after a crash replays instead of re-executing.
    ///
    /// # Errors
    ///
    /// As [`Phase::checkpoint`].
    pub async fn complete(
        mut self,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.seal().await?;
        let now = self.clock.now_millis();
        let rows = sqlx::query(sql::COMPLETE)
            .bind(i64::from(response.status))
            .bind(response.encode_headers())
            .bind(response.body)
            .bind(i64::from(response.body_retained))
            .bind(now)
            .bind(now.saturating_add(duration_millis(retention)))
            .bind(self.id.scope.as_str())
            .bind(self.id.key.as_str())
            .bind(self.token.0)
            .execute(&mut *self.tx)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        if rows != 1 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map_sqlx)
    }

    /// Rolls back the business writes and releases the key: its `5xx` is not stored, and a
    /// retry re-executes as a new request. Both happen in the phase's transaction (rollback to
    /// the savepoint taken after the fencing write, then the release, then commit), so no
    /// takeover can slip in between.
    ///
    /// If the transaction had already ended (see [`Phase`]), the business writes are gone with
    /// it and the key is released by a separate conditional write.
    ///
    /// # Errors
    ///
    /// - [`StoreError::Fenced`]: the record is no longer in flight with this token (the business
    ///   writes are rolled back all the same).
    /// - [`StoreError::Unavailable`]: the release could not be written; the claim stays in flight
    ///   until its lease lapses.
    pub async fn rollback_and_release(mut self) -> Result<(), StoreError> {
        let rolled_back = sqlx::query(sql::ROLLBACK_TO_PHASE)
            .execute(&mut *self.tx)
            .await;
        if rolled_back.is_err() {
            self.discard_lost_transaction().await;
            let Phase {
                tx,
                id,
                token,
                pool,
                ..
            } = self;
            // End the transaction first: the release below needs the write lock it may hold.
            if let Err(e) = tx.rollback().await {
                tracing::debug!(error = %e, "oncely-sqlite: rolling back a lost phase transaction");
            }
            let rows = sqlx::query(sql::RELEASE)
                .bind(id.scope.as_str())
                .bind(id.key.as_str())
                .bind(token.0)
                .execute(&pool)
                .await
                .map_err(map_sqlx)?
                .rows_affected();
            return if rows == 1 {
                Ok(())
            } else {
                Err(StoreError::Fenced)
            };
        }
        let rows = sqlx::query(sql::RELEASE)
            .bind(self.id.scope.as_str())
            .bind(self.id.key.as_str())
            .bind(self.token.0)
            .execute(&mut *self.tx)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        if rows != 1 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map_sqlx)
    }

    /// Checks that the phase's transaction is still the one [`SqliteStore::begin_phase`] opened
    /// (its savepoint still exists) and ends the savepoint, so the finishing write and the
    /// business writes commit together. A handler's explicit `COMMIT`/`ROLLBACK`, or SQLite's
    /// automatic rollback after some errors, would otherwise leave later statements
    /// autocommitting one by one, and the stored response would commit without the business
    /// writes.
    async fn seal(&mut self) -> Result<(), StoreError> {
        match sqlx::query(sql::RELEASE_PHASE).execute(&mut *self.tx).await {
            Ok(_) => Ok(()),
            Err(e) => {
                let lost = e
                    .as_database_error()
                    .is_some_and(|d| d.message().contains("no such savepoint"));
                if lost {
                    self.discard_lost_transaction().await;
                    tracing::warn!(
                        scope = %self.id.scope,
                        key = %self.id.key,
                        "oncely-sqlite: a phase's transaction ended before the phase; nothing recorded"
                    );
                    Err(StoreError::unavailable(
                        SqliteStoreError::PhaseTransactionLost,
                    ))
                } else {
                    Err(map_sqlx(e))
                }
            }
        }
    }

    /// After the transaction ended behind sqlx's back, sqlx still counts it open and would
    /// otherwise fail every later `BEGIN` on this pooled connection. Re-open one (a no-op error
    /// if one is somehow still open) so that sqlx's rollback, when the phase is dropped, ends a
    /// real transaction and its bookkeeping is right again.
    async fn discard_lost_transaction(&mut self) {
        let _ = sqlx::query(sql::BEGIN_RESYNC).execute(&mut *self.tx).await;
    }
}
