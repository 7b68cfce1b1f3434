//! The key store's operations on a connection the caller holds, so that they run inside the
//! caller's own transaction: the claim, the fencing write, the recovery point and the stored
//! response then commit (or roll back) together with the business writes. This is what
//! `oncely-sqlx`'s transactional handlers are built on; the [`KeyStore`](oncely_core::KeyStore)
//! methods run the same statements on a pooled connection.
//!
//! None of these functions commits. Run them inside a transaction that holds SQLite's write
//! lock from its start ([`SqliteStore::begin_tx`]): a deferred `BEGIN` would let another
//! writer change the record between this transaction's read and its write.

use crate::error::SqliteStoreError;
use crate::error::map_sqlx;
use crate::row::decode_record;
use crate::sql;
use crate::store::{MAX_CONNECTIONS, SqliteStore};
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, Decision, FencingToken, RecordKey, Redrives,
    StoreError, StoredRequest, StoredResponse, UnixMillis, decide,
};
use oncely_sql::fenced_unless_written;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteConnection;
use sqlx::{Row, SqlSafeStr, Sqlite, Transaction};
use std::time::Duration;

/// How many rounds [`SqliteStore::claim_in`] makes (inside `BEGIN IMMEDIATE` one always
/// suffices; the bound only guards the loop).
const MAX_ROUNDS: usize = 8;

/// How long a claim may wait for SQLite's write lock before [`SqliteStore::claim_tx`] renews
/// the lease it computed before the wait (100 milliseconds).
pub const LEASE_SLACK: Duration = Duration::from_millis(100);

/// The outcome with the transaction when it is a claim; otherwise the outcome alone (the
/// transaction wrote nothing and rolls back on drop).
fn claimed_with(
    outcome: ClaimOutcome,
    tx: Transaction<'static, Sqlite>,
) -> (ClaimOutcome, Option<Transaction<'static, Sqlite>>) {
    match outcome {
        ClaimOutcome::Claimed(_) => (outcome, Some(tx)),
        other => (other, None),
    }
}

/// A pooled connection that may hold a transaction sqlx does not know of: dropped armed, it is
/// closed (SQLite rolls the transaction back) instead of returned to the pool.
struct CloseUnlessDisarmed(Option<PoolConnection<Sqlite>>);

impl CloseUnlessDisarmed {
    fn conn(&mut self) -> &mut PoolConnection<Sqlite> {
        self.0.as_mut().expect("the connection until disarmed")
    }

    /// The connection, known to hold no transaction.
    fn disarm(mut self) -> PoolConnection<Sqlite> {
        self.0.take().expect("the connection until disarmed")
    }

    /// Hands the transaction [`sql::READ_THEN_CLAIM`] opened to sqlx.
    async fn adopt(mut self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let conn = self.0.take().expect("the connection until disarmed");
        // If this fails or is dropped, sqlx's `Transaction` rolls back (it believes one open).
        Transaction::begin(conn, Some(sql::ADOPT_TRANSACTION.into_sql_str()))
            .await
            .map_err(map_sqlx)
    }
}

impl Drop for CloseUnlessDisarmed {
    fn drop(&mut self) {
        if let Some(conn) = self.0.as_mut() {
            conn.close_on_drop();
        }
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

    /// A transactional claim in as few hops to the connection's worker thread as the
    /// hand-written minimum: one connection; first the plain read of the record, then (only if
    /// there is none) `BEGIN IMMEDIATE` and the claim's insert, all sent at once
    /// (one multi-statement query). Returns the outcome and, when it is
    /// [`ClaimOutcome::Claimed`], the open transaction that holds the claim (commit it with the
    /// business writes; dropping it rolls the claim back).
    ///
    /// - The key has a record: its row comes back from the read, which takes no lock (WAL
    ///   readers never wait for the writer), and [`decide`](oncely_core::decide) answers from it
    ///   (replay, mismatch, in flight) without a write transaction ever being opened. When it
    ///   grants a claim instead (a takeover, a released key, past the replay window), the claim
    ///   is made by [`SqliteStore::claim_in`] inside `BEGIN IMMEDIATE` on the same connection.
    /// - The key is absent: the insert runs under the write lock (`BEGIN IMMEDIATE` waits up to
    ///   [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT) for it); if another claim committed the key in
    ///   between, the insert writes nothing and [`SqliteStore::claim_in`] decides on that record
    ///   under the lock.
    ///
    /// "Now" is read before the write lock is waited for; a claim that waited longer than
    /// [`LEASE_SLACK`] renews its lease in the same transaction, so the lease always runs
    /// from when the claim took effect.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection or lock could be had in time or the
    /// database failed (the connection is then closed, never returned to the pool with a
    /// transaction open); [`StoreError::Corrupt`] when the record cannot be decoded.
    pub async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, Sqlite>>), StoreError> {
        let conn = self.acquire_clean().await?;
        // Until sqlx's bookkeeping holds the transaction, a connection that may have one open
        // (an error, or this future dropped mid-way) is closed rather than pooled.
        let mut guard = CloseUnlessDisarmed(Some(conn));
        let now = self.clock().now_millis();
        let lease_expires_at = now.saturating_add(lease_millis(req.lease));
        let expires_at = now.saturating_add(duration_millis(req.retention));
        let request = req.request.as_ref().map(StoredRequest::encode);
        let first = FencingToken(1);
        let row = sqlx::query::<Sqlite>(sql::READ_THEN_CLAIM)
            .bind(req.id.scope.as_str())
            .bind(req.id.key.as_str())
            .bind(i64::from(req.fingerprint.version()))
            .bind(&req.fingerprint.digest()[..])
            .bind(first.0)
            .bind(lease_expires_at)
            .bind(now)
            .bind(expires_at)
            .bind(request.as_deref())
            .fetch_optional(&mut **guard.conn())
            .await
            .map_err(map_sqlx)?;
        match row {
            // The record's row (the read's columns): nothing but the read ran.
            Some(row) if row.len() > 1 => {
                let conn = guard.disarm();
                let existing = decode_record(&row)?;
                match decide(Some(&existing), req, now) {
                    Decision::Answer(answer) => Ok((answer, None)),
                    Decision::Claim { .. } => {
                        let mut tx =
                            Transaction::begin(conn, Some(sql::BEGIN_GUARDED.into_sql_str()))
                                .await
                                .map_err(map_sqlx)?;
                        let outcome = self.claim_in(&mut tx, req).await?;
                        Ok(claimed_with(outcome, tx))
                    }
                }
            }
            // The insert's `RETURNING token`: the key was absent and is claimed.
            Some(_) => {
                let mut tx = guard.adopt().await?;
                let mut claim = Claim::new(first, lease_expires_at, ClaimKind::New);
                let took_effect = self.clock().now_millis();
                if took_effect.saturating_sub(now) > duration_millis(LEASE_SLACK) {
                    claim.lease_expires_at =
                        self.renew_in(&mut tx, &req.id, first, req.lease).await?;
                }
                Ok((ClaimOutcome::Claimed(claim), Some(tx)))
            }
            // The insert wrote nothing: another claim committed the key between the read and
            // the write lock. Decide on its record, under the lock.
            None => {
                let mut tx = guard.adopt().await?;
                let outcome = self.claim_in(&mut tx, req).await?;
                Ok(claimed_with(outcome, tx))
            }
        }
    }

    /// Begins a transaction with `BEGIN IMMEDIATE`: it takes SQLite's single write lock at once
    /// (waiting up to [`BUSY_TIMEOUT`](crate::BUSY_TIMEOUT), 5 seconds), so no other writer can
    /// interleave with the claim or the phase that runs in it. The same statement opens the
    /// savepoint `oncely_tx`, by which `oncely_sqlx` tells whether the transaction ended behind
    /// a phase's back (one hop to the connection's thread for both).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the lock was not free within the busy timeout or the
    /// database failed.
    pub async fn begin_tx(&self) -> Result<Transaction<'static, Sqlite>, StoreError> {
        let conn = self.acquire_clean().await?;
        Transaction::begin(conn, Some(sql::BEGIN_GUARDED.into_sql_str()))
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

    /// One round of the claim on `conn`, which must hold SQLite's write lock (inside `BEGIN
    /// IMMEDIATE`): insert first (the primary key arbitrates), else read, [`decide`] and write
    /// conditionally. Commits nothing.
    pub(crate) async fn claim_round_in(
        &self,
        conn: &mut SqliteConnection,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        // "now" is read after the lock is held, so the decision uses the time it takes effect.
        let now = self.clock().now_millis();
        let lease_expires_at = now.saturating_add(lease_millis(req.lease));
        let expires_at = now.saturating_add(duration_millis(req.retention));
        let request = req.request.as_ref().map(StoredRequest::encode);
        let scope = req.id.scope.as_str();
        let key = req.id.key.as_str();
        let fp_version = i64::from(req.fingerprint.version());
        let fp_digest: &[u8] = req.fingerprint.digest();

        // What `decide(None, ..)` grants for an absent key: a first attempt with token 1.
        let first = FencingToken(1);
        let inserted = sqlx::query(sql::INSERT_CLAIM)
            .bind(scope)
            .bind(key)
            .bind(fp_version)
            .bind(fp_digest)
            .bind(first.0)
            .bind(lease_expires_at)
            .bind(now)
            .bind(expires_at)
            .bind(request.as_deref())
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected();
        if inserted == 1 {
            return Ok(Some(ClaimOutcome::Claimed(Claim::new(
                first,
                lease_expires_at,
                ClaimKind::New,
            ))));
        }

        // The primary key said the record exists: the normal "record exists" path.
        let Some(row) = sqlx::query(sql::SELECT_ONE)
            .bind(scope)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_sqlx)?
        else {
            return Ok(None);
        };
        let existing = decode_record(&row)?;
        match decide(Some(&existing), req, now) {
            Decision::Answer(answer) => Ok(Some(answer)),
            Decision::Claim {
                token,
                kind,
                recovery_point,
            } => {
                // A takeover resumes the same request: it keeps the original claim time and the
                // request that made the claim (the memory store's rule).
                let (created_at, request, redrives) = match kind {
                    ClaimKind::Takeover => (
                        existing.created_at,
                        existing
                            .request
                            .as_ref()
                            .map(StoredRequest::encode)
                            .or(request),
                        existing.redrives,
                    ),
                    // New, AfterReplayWindow (and any later kind): a fresh request.
                    _ => (now, request, Redrives::default()),
                };
                let updated = sqlx::query(sql::UPDATE_CLAIM)
                    .bind(fp_version)
                    .bind(fp_digest)
                    .bind(token.0)
                    .bind(lease_expires_at)
                    .bind(recovery_point.as_deref())
                    .bind(created_at)
                    .bind(expires_at)
                    .bind(request.as_deref())
                    .bind(scope)
                    .bind(key)
                    .bind(existing.token.0)
                    .bind(i64::from(redrives.attempts))
                    .bind(redrives.next_attempt_at)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_sqlx)?
                    .rows_affected();
                if updated != 1 {
                    return Ok(None);
                }
                Ok(Some(ClaimOutcome::Claimed(
                    Claim::new(token, lease_expires_at, kind).with_recovery_point(recovery_point),
                )))
            }
        }
    }

    /// A connection from the pool that holds no transaction in sqlx's bookkeeping. A handler
    /// that ran `ROLLBACK` (or `COMMIT`) through its `Tx` leaves its connection's count of open
    /// transactions at one, because sqlx's rollback on drop then fails ("no transaction is
    /// active"). Such a connection would refuse every later transaction, which would answer
    /// an unrelated request 503. It is closed here, with a warning, and another one is taken.
    /// The count is settled by the time a connection is back in the pool: sqlx pings it on
    /// release, after the queued rollback.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection could be had.
    pub(crate) async fn acquire_clean(
        &self,
    ) -> Result<sqlx::pool::PoolConnection<sqlx::Sqlite>, StoreError> {
        use sqlx::Connection as _;
        for _ in 0..=MAX_CONNECTIONS {
            let mut conn = self.pool().acquire().await.map_err(map_sqlx)?;
            if !conn.is_in_transaction() {
                return Ok(conn);
            }
            tracing::warn!(
                "closing a pooled SQLite connection left inside a transaction (a handler ran COMMIT or ROLLBACK through its Tx, which sqlx could not undo)"
            );
            conn.close_on_drop();
        }
        Err(StoreError::unavailable(std::io::Error::other(
            "every pooled SQLite connection was left inside a transaction",
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
        fenced_unless_written(rows).map(|()| until)
    }

    /// Records `recovery_point` on `conn` and renews the lease to now plus `lease`, if the
    /// record is still in flight with `token`, inside a transaction that
    /// [`SqliteStore::begin_tx`] or [`SqliteStore::claim_tx`] opened, checking in the same
    /// statement that it is still that transaction (its savepoint `oncely_tx` exists; in
    /// process, no extra hop). `request`, if given, is the encoded [`StoredRequest`] that a
    /// claim inside the same transaction left out (nobody could read it before a commit): it
    /// is stored unless the record already has one.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::renew_in`], and [`SqliteStoreError::TransactionEnded`] (as
    /// [`StoreError::Unavailable`]) when the transaction ended behind the phase's back; the
    /// connection is then left inside a fresh empty transaction, so that the caller's
    /// rollback ends it and the pool gets the connection back in order.
    pub async fn checkpoint_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
        request: Option<&[u8]>,
    ) -> Result<(), StoreError> {
        self.checkpoint_with(true, conn, id, token, recovery_point, lease, request)
            .await
    }

    /// The recovery point's write: `in_phase`, inside a transaction the store opened
    /// ([`SqliteStore::checkpoint_in`]); otherwise a statement of its own
    /// ([`KeyStore::checkpoint`](oncely_core::KeyStore::checkpoint)).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn checkpoint_with(
        &self,
        in_phase: bool,
        conn: &mut SqliteConnection,
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
        let statement = match (in_phase, request.is_some()) {
            (true, _) => sql::CHECKPOINT_GUARDED,
            (false, true) => sql::CHECKPOINT_WITH_REQUEST,
            (false, false) => sql::CHECKPOINT,
        };
        let mut query = sqlx::query(statement)
            .bind(recovery_point)
            .bind(until)
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0);
        if in_phase || request.is_some() {
            query = query.bind(request);
        }
        fenced_unless_written(changed(conn, query, in_phase).await?)
    }

    /// Stores the final response on `conn` (state complete, kept for `retention` from now), if
    /// the record is still in flight with `token`, inside a transaction that
    /// [`SqliteStore::begin_tx`] or [`SqliteStore::claim_tx`] opened, checked as
    /// [`SqliteStore::checkpoint_in`] checks it.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::checkpoint_in`].
    pub async fn complete_in(
        &self,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.complete_with(true, conn, id, token, response, retention)
            .await
    }

    /// The response's write, `in_phase` or not, as [`SqliteStore::checkpoint_with`].
    pub(crate) async fn complete_with(
        &self,
        in_phase: bool,
        conn: &mut SqliteConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock().now_millis();
        let statement = if in_phase {
            sql::COMPLETE_GUARDED
        } else {
            sql::COMPLETE
        };
        let headers = response.encode_headers();
        let query = sqlx::query(statement)
            .bind(i64::from(response.status))
            .bind(headers)
            .bind(&response.body[..])
            .bind(i64::from(response.body_retained))
            .bind(now)
            .bind(now.saturating_add(duration_millis(retention)))
            .bind(id.scope.as_str())
            .bind(id.key.as_str())
            .bind(token.0);
        fenced_unless_written(changed(conn, query, in_phase).await?)
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
        fenced_unless_written(rows)
    }
}

/// Runs a phase write and counts the rows it changed. Guarded (the statement begins with the
/// `RELEASE` of the transaction's savepoint and returns the changed row's token), "no such
/// savepoint" means the transaction ended behind the phase's back: then
/// [`SqliteStoreError::TransactionEnded`](crate::SqliteStoreError::TransactionEnded), after
/// opening an empty transaction on `conn` for sqlx's bookkeeping (which still counts its own
/// open) to end.
async fn changed<'q>(
    conn: &mut SqliteConnection,
    query: sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>,
    in_phase: bool,
) -> Result<u64, StoreError> {
    if !in_phase {
        return Ok(query
            .execute(&mut *conn)
            .await
            .map_err(map_sqlx)?
            .rows_affected());
    }
    match query.fetch_optional(&mut *conn).await {
        Ok(row) => Ok(u64::from(row.is_some())),
        Err(e)
            if e.as_database_error()
                .is_some_and(|d| d.message().contains("no such savepoint")) =>
        {
            // An error (ignored) if the handler already began another transaction.
            let _ = sqlx::query("BEGIN").execute(conn).await;
            Err(crate::SqliteStoreError::TransactionEnded.into())
        }
        Err(e) => Err(map_sqlx(e)),
    }
}
