//! The key store's operations on a connection the caller holds, so that they run inside the
//! caller's own transaction: the claim, the renewal, the recovery point and the stored response
//! then commit (or roll back) together with the business writes. This is the one
//! implementation of each operation: the pool-level [`KeyStore`](oncely_core::KeyStore) runs
//! it on a pooled connection (in a transaction of its own for the claim, in autocommit for the
//! one-statement writes), and `oncely-sqlx`'s transactional handlers inside theirs.
//!
//! None of these functions commits, and none retries: a deadlock rolls back the whole
//! transaction, so it is returned (as [`StoreError::Unavailable`]) for the owner of the
//! transaction to run it again ([`MySqlStore::claim_tx`] does, for the transaction it begins).

use crate::error::{
    DEADLOCK, LOCK_WAIT_TIMEOUT, MySqlStoreError, NO_SUCH_SAVEPOINT, map, number, retry_deadlocks,
};
use crate::row::record_from_row;
use crate::sql;
use crate::store::MySqlStore;
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, Decision, FencingToken, RecordKey, RecordState,
    StoreError, StoredRequest, StoredResponse, UnixMillis, decide,
};
use oncely_sql::fenced_unless_written;
use sqlx::mysql::{MySqlArguments, MySqlConnection};
use sqlx::query::Query;
use sqlx::{MySql, Row, Transaction};
use std::time::Duration;

/// Runs an owner write on `conn`: binds the owner guard (scope, key, token: always the last
/// parameters, see `sql::owner_guard!`) after the statement's own values. 0 rows matched means
/// the token is stale or the record left `in_flight`: [`StoreError::Fenced`].
async fn owner_write(
    conn: &mut MySqlConnection,
    write: Query<'_, MySql, MySqlArguments>,
    id: &RecordKey,
    token: FencingToken,
) -> Result<(), StoreError> {
    let result = write
        .bind(id.scope.as_str().as_bytes())
        .bind(id.key.as_str().as_bytes())
        .bind(token.0)
        .execute(conn)
        .await
        .map_err(map)?;
    fenced_unless_written(result.rows_affected())
}

impl MySqlStore {
    /// How long a statement of a claim or phase transaction waits for a row lock: 4 seconds,
    /// set as `innodb_lock_wait_timeout` (whole seconds) in the message that begins the
    /// transaction ([`MySqlStore::begin_tx`]). It is shorter than the layer's store timeout (5
    /// seconds) on purpose: a duplicate waiting for the first request's transaction then ends
    /// as `409 idempotency_request_in_flight`, never as a `503` store timeout.
    pub const TX_LOCK_TIMEOUT: Duration = Duration::from_secs(4);

    /// Begins a transaction for a claim or a phase: `SET SESSION innodb_lock_wait_timeout = 4;
    /// BEGIN; SAVEPOINT oncely_tx`, one message, one round trip. The isolation level is the
    /// session's (InnoDB's default `REPEATABLE READ`); lock waits are bounded by
    /// [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT); the savepoint marks the transaction, so that
    /// [`MySqlStore::transaction_is_open`] can tell later whether it is still this one.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when no connection could be had or the database failed.
    pub async fn begin_tx(&self) -> Result<Transaction<'static, MySql>, StoreError> {
        self.pool().begin_with(sql::BEGIN).await.map_err(map)
    }

    /// How long [`claim_tx`](Self::claim_tx) goes on trying to claim a key that another open
    /// transaction holds before it answers [`ClaimOutcome::InFlight`]: 1 second, as
    /// PostgreSQL's `PostgresStore::CLAIM_WAIT`.
    pub const CLAIM_WAIT: Duration = Duration::from_secs(1);

    /// The pause after the first try of [`claim_tx`](Self::claim_tx) that found the key held
    /// (20 milliseconds), doubling up to 200 milliseconds.
    const CLAIM_PAUSE: Duration = Duration::from_millis(20);

    /// Begins a transaction ([`MySqlStore::begin_tx`]) and claims `(scope, key)` in it, as
    /// [`MySqlStore::claim_in`] does. Returns the outcome and, exactly when it is
    /// [`ClaimOutcome::Claimed`], the open transaction that holds the claim: commit it (alone,
    /// as [`KeyStore::claim`](oncely_core::KeyStore::claim) does, or with the business writes);
    /// dropping it rolls the claim back. An answer (replay, in flight, mismatch) comes without
    /// a transaction: nothing was written, and the one that read the record is rolled back.
    ///
    /// A key that another open transaction holds (a duplicate of a request that another
    /// process is running in its first phase) is waited for in short tries, so that a burst of
    /// such duplicates cannot hold a pool's connections (docs/DESIGN.md, "Duplicates while the
    /// first transaction is open"): on MariaDB each try's insert does not wait for the key at
    /// all (`SET STATEMENT innodb_lock_wait_timeout = 0` for that statement only, see
    /// `sql::INSERT_CLAIM_TRY`); a try that finds it held rolls back, gives its connection back
    /// and pauses (20 milliseconds, doubling up to 200) with no connection held; the next try
    /// replays the first request's response once it committed, or claims the key if it rolled
    /// back. After [`CLAIM_WAIT`](Self::CLAIM_WAIT) the answer is [`ClaimOutcome::InFlight`]
    /// (`409` with `Retry-After` from the layer). The handler's statements after the claim keep
    /// the transaction's [`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT) (4 seconds). On MySQL 8,
    /// which cannot bound one statement's lock wait, a try waits up to that bound on its
    /// connection, and the answer after it is the same `409`.
    ///
    /// A transaction that InnoDB rolled back as a deadlock's victim (error 1213, see the type
    /// docs) is begun and claimed again, up to 8 times.
    ///
    /// # Errors
    ///
    /// As [`MySqlStore::claim_in`].
    pub async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<(ClaimOutcome, Option<Transaction<'static, MySql>>), StoreError> {
        let started = std::time::Instant::now();
        let mut pause = Self::CLAIM_PAUSE;
        loop {
            if let Some(done) = retry_deadlocks!(self.claim_tx_once(req).await)? {
                return Ok(done);
            }
            // The key was held: the try's transaction is rolled back and its connection is
            // back in the pool for the pause.
            let left = Self::CLAIM_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok((self.in_flight(), None));
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// One try of [`claim_tx`](Self::claim_tx); `None` when the key was held by another open
    /// transaction.
    async fn claim_tx_once(
        &self,
        req: &ClaimRequest,
    ) -> Result<Option<(ClaimOutcome, Option<Transaction<'static, MySql>>)>, StoreError> {
        let mut tx = self.begin_tx().await?;
        let outcome = self.claim_on(&mut tx, req, sql::INSERT_CLAIM_TRY).await?;
        match outcome {
            Some(outcome @ ClaimOutcome::Claimed(_)) => Ok(Some((outcome, Some(tx)))),
            // Nothing was written. Dropping `tx` rolls it back (releasing the row lock the
            // insert took), sent with the pool's check of the connection as it is returned.
            Some(other) => Ok(Some((other, None))),
            None => Ok(self.answer_unlocked(&mut tx, req).await?.map(|a| (a, None))),
        }
    }

    /// The answer to a claim whose try found the key's row locked, from a consistent read
    /// (InnoDB's non-locking read of the latest committed version: it never waits), when the
    /// shared rule answers without a write: a replay of a completed record, in flight while a
    /// committed lease lives, a mismatch. `None` (try again later) when the record is not
    /// committed yet (another transaction's claim of a new key) or the rule would claim it (a
    /// lapsed lease, a released record: that needs the row's lock). Needed because on MySQL a
    /// claim of an existing key locks its row (`ON DUPLICATE KEY UPDATE` takes the exclusive
    /// lock even when it changes nothing), so concurrent replays of one completed key hold it
    /// in turn: without this read, a burst of replays would find it held try after try and be
    /// answered in flight.
    async fn answer_unlocked(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let row = sqlx::query(sql::SELECT_RECORD)
            .bind(req.id.scope.as_str().as_bytes())
            .bind(req.id.key.as_str().as_bytes())
            .fetch_optional(&mut *conn)
            .await
            .map_err(map)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let existing = record_from_row(&row)?;
        match decide(Some(&existing), req, self.clock().now_millis()) {
            Decision::Answer(answer) => Ok(Some(answer)),
            Decision::Claim { .. } => Ok(None),
        }
    }

    /// The in-flight answer to a claim that found the key held past its wait.
    fn in_flight(&self) -> ClaimOutcome {
        ClaimOutcome::InFlight {
            lease_expires_at: self.clock().now_millis(),
        }
    }

    /// Claims `(scope, key)` on `conn` by the shared rule ([`oncely_core::decide`]), without
    /// committing, for a claim that rides inside the caller's transaction.
    ///
    /// The insert comes first (`INSERT ... ON DUPLICATE KEY UPDATE`, see the type docs): for a
    /// new key that is the whole claim, one statement. When it found the key, a locking read of
    /// its own reads the record, so a replay costs two statements. While the caller's
    /// transaction is open, its uncommitted row holds the key: a concurrent claim of the same
    /// key waits for it in its own insert, then reads the committed record (and replays it, or
    /// answers in flight), or, if this transaction rolled back, inserts and executes. The wait
    /// is bounded by `innodb_lock_wait_timeout` ([`MySqlStore::TX_LOCK_TIMEOUT`], 4 seconds,
    /// when the transaction was begun with [`MySqlStore::begin_tx`]); when it runs out the
    /// answer is [`ClaimOutcome::InFlight`] (roll the caller's transaction back).
    ///
    /// For an existing record the claim, holding the row's lock, [`decide`]s, and for a
    /// takeover or a claim anew writes it with an `UPDATE` guarded by the token it read; the
    /// lock is held until the caller's transaction ends.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database fails (a deadlock, error 1213, has then
    /// rolled the caller's whole transaction back: run it again from its start), or the scope
    /// is longer than [`MySqlStore::MAX_SCOPE_BYTES`] (wrapping
    /// [`MySqlStoreError::ScopeTooLong`], before any statement); [`StoreError::Corrupt`] when
    /// the record cannot be decoded.
    pub async fn claim_in(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        // The key is held by an open transaction longer than we may wait: to the client that is
        // "in flight" (409 with Retry-After), never a 5xx.
        Ok(self
            .claim_on(conn, req, sql::INSERT_CLAIM)
            .await?
            .unwrap_or_else(|| self.in_flight()))
    }

    /// The claim's rounds on `conn` with `insert` as its first statement ([`sql::INSERT_CLAIM`],
    /// or [`sql::INSERT_CLAIM_TRY`]); `None` when that insert's wait for a key another open
    /// transaction holds ran out (error 1205, which rolls back the statement only).
    async fn claim_on(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        insert: &'static str,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let len = req.id.scope.as_str().len();
        if len > Self::MAX_SCOPE_BYTES {
            return Err(MySqlStoreError::ScopeTooLong { len }.into());
        }
        let request = req.request.as_ref().map(StoredRequest::encode);
        for _ in 0..Self::MAX_CLAIM_ROUNDS {
            match self
                .claim_round_in(conn, req, request.as_deref(), insert)
                .await
            {
                Ok(Some(outcome)) => return Ok(Some(outcome)),
                Ok(None) => {}
                Err(e) if number(&e) == Some(LOCK_WAIT_TIMEOUT) => return Ok(None),
                Err(e) => return Err(map(e)),
            }
        }
        Err(MySqlStoreError::ClaimContention {
            scope: req.id.scope.to_string(),
            key: req.id.key.to_string(),
            rounds: Self::MAX_CLAIM_ROUNDS,
        }
        .into())
    }

    async fn claim_round_in(
        &self,
        conn: &mut MySqlConnection,
        req: &ClaimRequest,
        request: Option<&[u8]>,
        insert: &'static str,
    ) -> Result<Option<ClaimOutcome>, sqlx::Error> {
        let now = self.clock().now_millis();
        let lease_expires_at = now.saturating_add(lease_millis(req.lease));
        let expires_at = now.saturating_add(duration_millis(req.retention));
        let scope = req.id.scope.as_str().as_bytes();
        let key = req.id.key.as_str().as_bytes();
        let inserted = sqlx::query(insert)
            .bind(scope)
            .bind(key)
            .bind(i32::from(req.fingerprint.version()))
            .bind(&req.fingerprint.digest()[..])
            .bind(lease_expires_at)
            .bind(request)
            .bind(now)
            .bind(expires_at)
            .execute(&mut *conn)
            .await?;
        // No AUTO_INCREMENT column: 0 is an insert; a duplicate reports its token (see
        // `sql::INSERT_CLAIM`).
        if inserted.last_insert_id() == 0 {
            return Ok(Some(ClaimOutcome::Claimed(Claim::new(
                FencingToken(1),
                lease_expires_at,
                ClaimKind::New,
            ))));
        }
        // The record exists (the normal path, see "Unique violation surfaced as 500" in
        // docs/DESIGN.md), and the insert holds its lock: the locking read sees the latest
        // committed version, also one committed while the insert waited.
        let Some(row) = sqlx::query(sql::SELECT_RECORD_LOCKED)
            .bind(scope)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?
        else {
            // Gone in between (it cannot be while the lock is held): insert again.
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
        if !matches!(
            existing.state,
            RecordState::InFlight { .. } | RecordState::Complete { .. } | RecordState::Released
        ) {
            return Err(sqlx::Error::Decode("unknown record state".into()));
        }
        let updated = if kind == ClaimKind::Takeover {
            sqlx::query(sql::CLAIM_TAKEOVER)
                .bind(token.0)
                .bind(lease_expires_at)
                .bind(request)
                .bind(expires_at)
                .bind(scope)
                .bind(key)
                .bind(existing.token.0)
                .execute(&mut *conn)
                .await?
        } else {
            sqlx::query(sql::CLAIM_ANEW)
                .bind(token.0)
                .bind(i32::from(req.fingerprint.version()))
                .bind(&req.fingerprint.digest()[..])
                .bind(lease_expires_at)
                .bind(request)
                .bind(now)
                .bind(expires_at)
                .bind(scope)
                .bind(key)
                .bind(existing.token.0)
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
        conn: &mut MySqlConnection,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let until = self
            .clock()
            .now_millis()
            .saturating_add(lease_millis(lease));
        let write = sqlx::query(sql::RENEW).bind(until);
        owner_write(conn, write, id, token).await.map(|()| until)
    }

    /// Records `recovery_point` on `conn` and renews the lease to now plus `lease`, if the
    /// record is still in flight with `token`. `request`, if given, is the encoded
    /// [`StoredRequest`] that a claim inside the same transaction left out (nobody could read
    /// it before a commit): it is stored unless the record already has one.
    ///
    /// # Errors
    ///
    /// As [`MySqlStore::renew_in`].
    pub async fn checkpoint_in(
        &self,
        conn: &mut MySqlConnection,
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
        let write = sqlx::query(sql::CHECKPOINT)
            .bind(recovery_point)
            .bind(until)
            .bind(request);
        owner_write(conn, write, id, token).await
    }

    /// Stores the final response on `conn` (state complete, kept for `retention` from now), if
    /// the record is still in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`MySqlStore::renew_in`].
    pub async fn complete_in(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordKey,
        token: FencingToken,
        response: &StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let now = self.clock().now_millis();
        let write = sqlx::query(sql::COMPLETE)
            .bind(now)
            .bind(i32::from(response.status))
            .bind(response.encode_headers())
            .bind(&response.body[..])
            .bind(response.body_retained)
            .bind(now.saturating_add(duration_millis(retention)));
        owner_write(conn, write, id, token).await
    }

    /// Releases the claim on `conn` (the key behaves as absent again), if the record is still
    /// in flight with `token`.
    ///
    /// # Errors
    ///
    /// As [`MySqlStore::renew_in`].
    pub async fn release_in(
        &self,
        conn: &mut MySqlConnection,
        id: &RecordKey,
        token: FencingToken,
    ) -> Result<(), StoreError> {
        owner_write(conn, sqlx::query(sql::RELEASE), id, token).await
    }

    /// Whether the transaction [`MySqlStore::begin_tx`] opened on `conn` is still open: `false`
    /// once it ended behind its owner's back (a `COMMIT` or `ROLLBACK` run through the
    /// connection, or a rollback by the server, such as a deadlock's). One round trip: the
    /// transaction's savepoint `oncely_tx` is released and set again, which fails with error
    /// 1305 when the transaction that set it is over. sqlx keeps the server's "in transaction"
    /// status flag to itself, and MySQL has no system variable for it (MariaDB's
    /// `@@in_transaction` is MariaDB's only), hence the savepoint.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database fails otherwise.
    pub async fn transaction_is_open(
        &self,
        conn: &mut MySqlConnection,
    ) -> Result<bool, StoreError> {
        match sqlx::raw_sql(sql::GUARD).execute(conn).await {
            Ok(_) => Ok(true),
            Err(e) if number(&e) == Some(NO_SUCH_SAVEPOINT) => Ok(false),
            Err(e) => Err(map(e)),
        }
    }

    /// For a transaction [`MySqlStore::begin_tx`] opened, that its owner is about to roll back
    /// unfinished: whether it had ended because of a `COMMIT` or `ROLLBACK` run through the
    /// connection (so what was written meanwhile may have committed), rather than being still
    /// open or rolled back by the server. A deadlock (1213), and a lock wait timeout on a server
    /// that rolls the transaction back for it (`innodb_rollback_on_timeout`), end the
    /// transaction just as a `ROLLBACK` does; they are told apart by the errors of the
    /// statement before (`SHOW ERRORS`, which does not clear them: a handler that returns the
    /// failed statement's error ran nothing after it), so that a deadlock is answered as the
    /// transient failure it is, never as a handler's misuse. Up to two round trips, on this path
    /// only. An error of the check itself answers `false`.
    pub async fn ended_by_its_owner(&self, conn: &mut MySqlConnection) -> bool {
        let server_rollback = match sqlx::raw_sql(sql::LAST_ERRORS).fetch_all(&mut *conn).await {
            Ok(rows) => rows.iter().any(|row| {
                row.try_get::<u32, _>(1).is_ok_and(|code| {
                    matches!(u16::try_from(code), Ok(DEADLOCK | LOCK_WAIT_TIMEOUT))
                })
            }),
            Err(_) => return false,
        };
        !server_rollback && matches!(self.transaction_is_open(conn).await, Ok(false))
    }
}
