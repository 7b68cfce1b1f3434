//! Transactional mode: [`Phase`], one atomic phase of a request whose business writes, recovery
//! point and (in the last phase) stored response commit in one PostgreSQL transaction.

use crate::error::map;
use crate::sql;
use crate::store::complete_query;
use oncely_core::store::lease_millis;
use oncely_core::{Clock, FencingToken, RecordKey, StoreError, StoredResponse};
use sqlx::{PgPool, Postgres, Transaction};
use std::sync::Arc;
use std::time::Duration;

/// One atomic phase of the request that owns `(scope, key)` with a fencing token: a database
/// transaction that starts with the conditional fencing write and so holds the record's row
/// lock until it ends. Made by [`PostgresStore::begin_phase`](crate::PostgresStore::begin_phase).
///
/// The handler does its business writes through [`Phase::tx`], then ends the phase with
/// exactly one of:
///
/// - [`Phase::checkpoint`]: the business writes and the recovery point commit together (a
///   phase of a multi-step request, before an outside call);
/// - [`Phase::complete`]: the business writes and the stored response commit together (case
///   S8: a crash after the commit leaves a record that replays, never one that re-executes);
/// - [`Phase::rollback_and_release`]: the business writes are undone and the key is released,
///   in the same transaction (a transactional handler's `5xx` is not stored; a retry
///   re-executes).
///
/// Dropping a `Phase` without ending it rolls the transaction back (sqlx does this when the
/// connection returns to the pool) and leaves the claim in flight with its last committed
/// recovery point: once the lease lapses, a retry or the completer takes over from there.
///
/// # Guarantees
///
/// - While the phase is open, no takeover can commit: a takeover's conditional `UPDATE` waits
///   for the row lock (bounded by `lock_timeout`, then [`StoreError::Unavailable`]) and, once
///   the phase commits, finds the record changed and re-reads it.
/// - A plain claim of the key during the phase does not wait: it reads the last committed
///   version (in flight, with the lease renewed just before the phase began) and answers "in
///   flight".
/// - A heartbeat `renew` of the same record from another connection waits for the phase to
///   end (it writes the same row): keep a phase shorter than the lease, or expect the heartbeat
///   to report [`StoreError::Unavailable`] after `lock_timeout`.
/// - Under `SERIALIZABLE`, the commit itself can fail with a serialization failure; the
///   phase's writes are then all undone and the error is [`StoreError::Unavailable`]
///   (retryable): the request can safely run the phase again.
///
/// ```no_run
/// # async fn example(store: oncely_postgres::PostgresStore, id: oncely_core::RecordKey,
/// #                  claim: oncely_core::Claim) -> Result<(), oncely_core::StoreError> {
/// use oncely_core::StoredResponse;
/// use std::time::Duration;
/// let mut phase = store.begin_phase(&id, claim.token, Duration::from_secs(30)).await?;
/// sqlx::query("INSERT INTO orders (id, amount) VALUES ($1, $2)")
///     .bind("ord_1").bind(100_i64)
///     .execute(&mut **phase.tx()).await
///     .map_err(oncely_core::StoreError::unavailable)?;
/// let response = StoredResponse::new(201, vec![], br#"{"id":"ord_1"}"#.to_vec());
/// // The order and the stored response commit together.
/// phase.complete(response, Duration::from_secs(72 * 3600)).await?;
/// # Ok(()) }
/// ```
pub struct Phase {
    tx: Transaction<'static, Postgres>,
    id: RecordKey,
    token: FencingToken,
    lease: Duration,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Phase")
            .field("id", &self.id)
            .field("token", &self.token)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Phase {
    pub(crate) async fn begin(
        pool: PgPool,
        clock: Arc<dyn Clock>,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<Self, StoreError> {
        let mut tx = pool.begin().await.map_err(map)?;
        let until = clock.now_millis().saturating_add(lease_millis(lease));
        let fenced = sqlx::query(sql::RENEW)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(until)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        if fenced.rows_affected() == 0 {
            // Dropping `tx` rolls back; nothing was written.
            return Err(StoreError::Fenced);
        }
        sqlx::query(sql::SAVEPOINT)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        Ok(Self {
            tx,
            id: id.clone(),
            token,
            lease,
            clock,
        })
    }

    /// The transaction, for the handler's business writes (`&mut **phase.tx()` is a
    /// `&mut PgConnection`, an [`sqlx::Executor`]).
    pub fn tx(&mut self) -> &mut Transaction<'static, Postgres> {
        &mut self.tx
    }

    /// The record this phase belongs to.
    pub fn id(&self) -> &RecordKey {
        &self.id
    }

    /// The fencing token the phase writes with.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// Records `recovery_point` in the same transaction (and renews the lease to now plus the
    /// phase's lease), then commits: the business writes and the recovery point are one unit.
    /// A retry that takes over after a crash resumes from this point.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] if the record is no longer the caller's (nothing commits);
    /// [`StoreError::Unavailable`] if a statement or the commit fails (nothing commits,
    /// unless the connection was lost during the commit itself, when the outcome is unknown
    /// until the record is read again).
    pub async fn checkpoint(mut self, recovery_point: &str) -> Result<(), StoreError> {
        let until = self
            .clock
            .now_millis()
            .saturating_add(lease_millis(self.lease));
        let result = sqlx::query(sql::CHECKPOINT)
            .bind(self.id.scope.as_str())
            .bind(self.id.key.as_str())
            .bind(self.token.0)
            .bind(recovery_point)
            .bind(until)
            .execute(&mut *self.tx)
            .await
            .map_err(map)?;
        if result.rows_affected() == 0 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map)
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
        let now = self.clock.now_millis();
        let headers = response.encode_headers();
        let result = complete_query(&self.id, self.token, &response, &headers, now, retention)
            .execute(&mut *self.tx)
            .await
            .map_err(map)?;
        if result.rows_affected() == 0 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map)
    }

    /// Rolls back the business writes (to a savepoint taken right after the fencing write, so
    /// the row lock is kept) and releases the key in the same transaction, then commits: no
    /// business write survives, the `5xx` is not stored, and a retry with the same key
    /// re-executes as a new claim. Works even when a business statement left the transaction
    /// aborted.
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] if the record is no longer the caller's;
    /// [`StoreError::Unavailable`] if the database fails. Either way no business write
    /// commits; on `Unavailable` the claim may stay in flight until its lease lapses.
    pub async fn rollback_and_release(mut self) -> Result<(), StoreError> {
        sqlx::query(sql::ROLLBACK_TO_SAVEPOINT)
            .execute(&mut *self.tx)
            .await
            .map_err(map)?;
        let result = sqlx::query(sql::RELEASE)
            .bind(self.id.scope.as_str())
            .bind(self.id.key.as_str())
            .bind(self.token.0)
            .execute(&mut *self.tx)
            .await
            .map_err(map)?;
        if result.rows_affected() == 0 {
            return Err(StoreError::Fenced);
        }
        self.tx.commit().await.map_err(map)
    }
}
