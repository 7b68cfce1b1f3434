//! The key store's operations on a connection the caller holds, so that they run inside the
//! caller's own transaction: the claim, the fencing write, the recovery point and the stored
//! response then commit (or roll back) together with the business writes. This is what
//! `oncely-sqlx`'s transactional handlers are built on; the [`KeyStore`](oncely_core::KeyStore)
//! methods run the same statements on a pooled connection.
//!
//! None of these functions commits. Run them inside a transaction that holds SQLite's write
//! lock from its start ([`SqliteStore::begin_tx`]): a deferred `BEGIN` would let another
//! writer change the record between this transaction's read and its write.

use crate::error::map_sqlx;
use crate::sql;
use crate::store::{SqliteStore, SqliteStoreError};
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, RecordKey, StoreError, StoredResponse, UnixMillis,
};
use sqlx::sqlite::SqliteConnection;
use sqlx::{Sqlite, Transaction};
use std::time::Duration;

/// How many rounds [`SqliteStore::claim_in`] makes (inside `BEGIN IMMEDIATE` one always
/// suffices; the bound only guards the loop).
const MAX_ROUNDS: usize = 8;

fn fenced_unless_one(rows: u64) -> Result<(), StoreError> {
    if rows == 1 {
        Ok(())
    } else {
        Err(StoreError::Fenced)
    }
}

impl SqliteStore {
    /// Answers a claim from a plain read, which takes no lock (WAL readers never wait for the
    /// writer), when the shared rule needs no write: a replay, a mismatch, or a live in-flight
    /// claim. `None` when the claim must be made under the write lock. Replays thus never
    /// queue for SQLite's single write lock.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] or [`StoreError::Corrupt`].
    pub async fn answer_before_claim(
        &self,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        self.answer_from_snapshot(req).await
    }

    /// Begins a transaction with `BEGIN IMMEDIATE`: it takes SQLite's single write lock at once
    /// (waiting up to [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT), 5 seconds), so no other writer can
    /// interleave with the claim or the phase that runs in it.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the lock was not free within the busy timeout or the
    /// database failed.
    pub async fn begin_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        self.pool()
            .begin_with(sql::BEGIN_IMMEDIATE)
            .await
            .map_err(map_sqlx)
    }

    /// Claims `(scope, key)` on `conn` by the shared rule ([`oncely_core::decide`]), without
    /// committing: insert first (the primary key arbitrates), else read the record and answer
    /// or write the claim conditionally. The claim becomes visible to others only when the
    /// caller's transaction commits; a rollback undoes it as if it never happened.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database fails; [`StoreError::Corrupt`] when the
    /// existing record cannot be decoded.
    pub async fn claim_in(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        for _ in 0..MAX_ROUNDS {
            if let Some(outcome) = self.claim_round_in(conn, req).await? {
                return Ok(outcome);
            }
        }
        Err(StoreError::unavailable(SqliteStoreError::ClaimContention(
            MAX_ROUNDS,
        )))
    }

    /// The fencing write on `conn`: renews the lease to now plus `lease` (never less than 1
    /// millisecond) if the record is still in flight with `token`. Returns the new lease expiry
    /// (epoch milliseconds).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight
    /// (nothing was written); [`StoreError::Unavailable`] when the database fails.
    pub async fn renew_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let rows = sqlx::query(sql::RENEW)
            .bind(until)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        fenced_unless_one(rows).map(|()| until)
    }

    /// Records `recovery_point` on `conn` and renews the lease to now plus `lease`, if the
    /// record is still in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::renew_in`].
    pub async fn checkpoint_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let rows = sqlx::query(sql::CHECKPOINT)
            .bind(recovery_point)
            .bind(until)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        fenced_unless_one(rows)
    }

    /// Stores the final response on `conn` (state complete, kept for `retention` from now), if
    /// the record is still in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::renew_in`].
    pub async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock().now_millis();
        let rows = sqlx::query(sql::COMPLETE)
            .bind(i64::from(response.status))
            .bind(response.encode_headers())
            .bind(&response.body[..])
            .bind(i64::from(response.body_retained))
            .bind(now)
            .bind(now.saturating_add(duration_millis(retention)))
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        fenced_unless_one(rows)
    }

    /// Releases the claim on `conn` (the key behaves as absent again), if the record is still
    /// in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::renew_in`].
    pub async fn release_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let rows = sqlx::query(sql::RELEASE)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        fenced_unless_one(rows)
    }
}
