//! The key store's operations on a connection the caller holds, so that they run inside the
//! caller's own transaction: the claim, the fencing write, the recovery point and the stored
//! response then commit (or roll back) together with the business writes. This is what
//! `oncely-sqlx`'s transactional handlers are built on.
//!
//! None of these functions commits, and none retries: inside a transaction a failed statement
//! aborts the whole transaction, so a serialization failure is returned (as
//! [`StoreError::Unavailable`]) for the caller to run the transaction again.

use crate::error::map;
use crate::sql;
use crate::store::{PostgresStore, complete_query, record_from_row};
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, Decision, FencingToken, RecordKey, RecordState,
    StoreError, StoredRequest, StoredResponse, UnixMillis, decide,
};
use sqlx::postgres::{PgConnection, PgQueryResult};
use std::time::Duration;

/// `55P03 lock_not_available`: a statement waited longer than `lock_timeout` for a lock.
fn is_lock_timeout(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("55P03"))
}

fn fenced_unless_written(result: PgQueryResult) -> Result<(), StoreError> {
    if result.rows_affected() == 0 {
        Err(StoreError::Fenced)
    } else {
        Ok(())
    }
}

impl PostgresStore {
    /// How long a statement of a claim or phase transaction waits for a lock: 4 seconds, the
    /// session's `lock_timeout` on connections made by [`PostgresStore::connect`] (or declared
    /// with [`PostgresStore::with_pool_lock_timeout`]), else set with `SET LOCAL lock_timeout`
    /// in the same message as `BEGIN` (no round trip, but about 10 µs of server time). It is
    /// shorter than the layer's store timeout (5 seconds) on purpose: a duplicate waiting for the
    /// first request's transaction then always ends as `409 idempotency_request_in_flight`,
    /// never as a `503` store timeout.
    pub const TX_LOCK_TIMEOUT: Duration = Duration::from_secs(4);

    /// Begins a transaction for a claim or a phase (`BEGIN`, at the server's default isolation,
    /// `READ COMMITTED` unless configured otherwise), whose lock waits are bounded by
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT), or by the pool's shorter session
    /// `lock_timeout` when the store relies on it
    /// ([`relies_on_session_lock_timeout`](Self::relies_on_session_lock_timeout)).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection could be had or the database failed.
    pub async fn begin_tx(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
        if self.pool_lock_timeout_bounded {
            self.pool().begin().await.map_err(map)
        } else {
            self.pool()
                .begin_with("BEGIN; SET LOCAL lock_timeout = '4000ms'")
                .await
                .map_err(map)
        }
    }

    /// Always `None`: on PostgreSQL a claim is decided inside its transaction
    /// ([`PostgresStore::claim_in`] inserts first), because a read before it would cost every
    /// first execution a round trip.
    ///
    /// # Errors
    ///
    /// None today; the signature matches the SQLite store's.
    pub async fn answer_before_claim(
        &self,
        _req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        Ok(None)
    }

    /// Claims `(scope, key)` on `conn` by the shared rule ([`oncely_core::decide`]), without
    /// committing, for a claim that rides inside the caller's transaction.
    ///
    /// The insert comes first (`INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING`): for
    /// a new key that is the whole claim, one statement. When it inserted nothing, a `SELECT`
    /// of its own reads the record, so a replay costs two statements. While the caller's
    /// transaction is open, its uncommitted row holds the key: a concurrent claim of the same
    /// key through `claim_in` waits for it in its own insert, then, under `READ COMMITTED`
    /// (PostgreSQL's default), finds the committed record with its `SELECT`, a statement with
    /// a fresh snapshot (and replays it, or answers in flight), or, if this transaction rolled
    /// back, inserts and executes. Under `REPEATABLE READ` or `SERIALIZABLE` (a server whose
    /// default isolation is one of them), a claim that waited for a committed row fails
    /// instead with a serialization failure, returned as [`StoreError::Unavailable`] (a `503`
    /// from the layer: the client's retry replays). The wait is
    /// bounded by the transaction's `lock_timeout` ([`PostgresStore::TX_LOCK_TIMEOUT`], 4
    /// seconds, when it was begun with [`PostgresStore::begin_tx`]); when it runs out the answer
    /// is [`ClaimOutcome::InFlight`] (and the caller's transaction is aborted: roll it back).
    ///
    /// For an existing record the claim reads it, [`decide`]s, and for a takeover or a claim
    /// anew writes it with the same guarded `UPDATE` as
    /// [`KeyStore::claim`](oncely_core::KeyStore::claim), which takes the row lock until the
    /// caller's transaction ends.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database fails (the caller's transaction is then
    /// aborted); [`StoreError::Corrupt`] when the record cannot be decoded.
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        let request = req.request.as_ref().map(StoredRequest::encode);
        for _ in 0..Self::MAX_CLAIM_ROUNDS {
            match self.claim_round_in(conn, req, request.as_deref()).await {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => {}
                Err(e) if is_lock_timeout(&e) => {
                    // The key is held by an open transaction longer than we may wait: to
                    // the client that is "in flight" (409 with Retry-After), never a 5xx.
                    return Ok(ClaimOutcome::InFlight {
                        lease_expires_at: self.clock().now_millis(),
                    });
                }
                Err(e) => return Err(map(e)),
            }
        }
        Err(crate::PostgresStoreError::ClaimContention {
            scope: req.id.scope.to_string(),
            key: req.id.key.to_string(),
            rounds: Self::MAX_CLAIM_ROUNDS,
        }
        .into())
    }

    async fn claim_round_in(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        request: Option<&[u8]>,
    ) -> Result<Option<ClaimOutcome>, sqlx::Error> {
        let now = self.clock().now_millis();
        let lease_expires_at = now.saturating_add(lease_millis(req.lease));
        let expires_at = now.saturating_add(duration_millis(req.retention));
        // The insert alone, as the floor's (see `sql::INSERT_CLAIM`): a new key's whole claim.
        let inserted: Option<i64> = sqlx::query_scalar(sql::INSERT_CLAIM)
            .bind(req.id.scope.as_str())
            .bind(req.id.key.as_str())
            .bind(i32::from(req.fingerprint.version()))
            .bind(&req.fingerprint.digest()[..])
            .bind(lease_expires_at)
            .bind(request)
            .bind(now)
            .bind(expires_at)
            .fetch_optional(&mut *conn)
            .await?;
        if inserted.is_some() {
            return Ok(Some(ClaimOutcome::Claimed(Claim::new(
                FencingToken(1),
                lease_expires_at,
                ClaimKind::New,
            ))));
        }
        // The record exists (the normal path, case S11). A statement of its own reads it: under
        // READ COMMITTED it sees the latest committed version, also one committed while the
        // insert waited for its inserter's transaction (under REPEATABLE READ that insert has
        // failed instead, see above).
        let Some(row) = sqlx::query(sql::SELECT_RECORD)
            .bind(req.id.scope.as_str())
            .bind(req.id.key.as_str())
            .fetch_optional(&mut *conn)
            .await?
        else {
            // Deleted (reaped) in between: insert again.
            return Ok(None);
        };
        let existing = record_from_row(&row).map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
        let (token, kind, recovery_point) = match decide(Some(&existing), req, now) {
            Decision::Answer(answer) => return Ok(Some(answer)),
            Decision::Claim {
                token,
                kind,
                recovery_point,
            } => (token, kind, recovery_point),
        };
        let (old_lease, old_completed) = match &existing.state {
            RecordState::InFlight {
                lease_expires_at, ..
            } => (Some(*lease_expires_at), None),
            RecordState::Complete { completed_at, .. } => (None, Some(*completed_at)),
            RecordState::Released => (None, None),
            _ => return Err(sqlx::Error::Decode("unknown record state".into())),
        };
        let guarded = |q: &'static str| {
            sqlx::query(q)
                .bind(req.id.scope.as_str())
                .bind(req.id.key.as_str())
                .bind(existing.token.0)
                .bind(existing.state_name())
                .bind(old_lease)
                .bind(old_completed)
                .bind(existing.recovery_point())
                .bind(token.0)
        };
        let updated = if kind == ClaimKind::Takeover {
            guarded(sql::CLAIM_TAKEOVER)
                .bind(lease_expires_at)
                .bind(request)
                .bind(expires_at)
                .execute(&mut *conn)
                .await?
        } else {
            guarded(sql::CLAIM_ANEW)
                .bind(i32::from(req.fingerprint.version()))
                .bind(&req.fingerprint.digest()[..])
                .bind(lease_expires_at)
                .bind(request)
                .bind(now)
                .bind(expires_at)
                .execute(&mut *conn)
                .await?
        };
        if updated.rows_affected() == 0 {
            return Ok(None);
        }
        Ok(Some(ClaimOutcome::Claimed(
            Claim::new(token, lease_expires_at, kind).with_recovery_point(recovery_point),
        )))
    }

    /// The fencing write on `conn`: renews the lease to now plus `lease` (never less than 1
    /// millisecond) if the record is still in flight with `token`, taking the record's row lock
    /// until the caller's transaction ends (a takeover then waits for it). Returns the new lease
    /// expiry (epoch milliseconds).
    ///
    /// # Errors
    ///
    /// [`StoreError::Fenced`] when `token` is stale or the record is no longer in flight
    /// (nothing was written); [`StoreError::Unavailable`] when the database fails.
    pub async fn renew_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let result = sqlx::query(sql::RENEW)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(until)
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result).map(|()| until)
    }

    /// Records `recovery_point` on `conn` and renews the lease to now plus `lease`, if the
    /// record is still in flight with `token`. `request`, if given, is the encoded
    /// [`StoredRequest`] that a claim inside the same transaction left out (nobody could read
    /// it before a commit): it is stored unless the record already has one.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn checkpoint_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let query = if request.is_some() {
            sql::CHECKPOINT_WITH_REQUEST
        } else {
            sql::CHECKPOINT
        };
        let mut q = sqlx::query(query)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .bind(recovery_point)
            .bind(until);
        if let Some(request) = request {
            q = q.bind(request);
        }
        let result = q.execute(conn).await.map_err(map)?;
        fenced_unless_written(result)
    }

    /// Stores the final response on `conn` (state complete, kept for `retention` from now), if
    /// the record is still in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn complete_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock().now_millis();
        let headers = response.encode_headers();
        let result = complete_query(id, token, response, &headers, now, retention)
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result)
    }

    /// Releases the claim on `conn` (the key behaves as absent again), if the record is still
    /// in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStore::renew_in`].
    pub async fn release_in(
        &self,
        conn: &mut PgConnection,
        id: &RecordKey,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        let result = sqlx::query(sql::RELEASE)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0)
            .execute(conn)
            .await
            .map_err(map)?;
        fenced_unless_written(result)
    }
}
